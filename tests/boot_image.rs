//! Each boot's copy of the boot image, from the image server as a BMC
//! fetches it (TLS, no client certificate, whole or in ranges): the base
//! image with the boot's slot replaced by an archive GNU cpio reads, whose
//! `BootData` names the machine, the callback, the CA and the boot's
//! credential; and nothing once the boot is used, expired or unknown.

use std::path::Path;
use std::time::Duration;

use prost::Message;
use shepherd::bmdb::Bmdb;
use shepherd::bmdb::boot;
use shepherd::callback::tls::new_ca;
use shepherd::images::{BootImage, BootServing, ImageCatalog};
use shepherd_proto::boot::BootData;
use shepherd_sim::testing::TestDb;
use uuid::Uuid;

const SLOT_AT: u64 = shepherd_sim::testing::BOOT_SLOT_AT;
const SLOT_LEN: u64 = shepherd_sim::testing::BOOT_SLOT_LEN;

fn base_image(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    shepherd_sim::testing::boot_image_stand_in(dir)
}

async fn machine(bmdb: &Bmdb) -> Uuid {
    shepherd_sim::testing::machine(bmdb, None).await
}

/// GET (or HEAD) `url` as a BMC does: trusting the CA, no certificate.
async fn fetch(
    ca_der: &[u8],
    url: &str,
    range: Option<&str>,
    head: bool,
) -> (u16, Vec<u8>, Option<String>) {
    shepherd_sim::testing::fetch_as_bmc(ca_der, url, range, head).await
}

/// The file the slot's archive holds, as GNU cpio extracts it.
fn boot_data_of(slot: &[u8]) -> BootData {
    BootData::decode(shepherd_sim::testing::boot_data_file(slot).as_slice()).unwrap()
}

#[actix_rt::test]
async fn a_boots_copy_carries_its_data_in_the_slot_whole_or_in_ranges_until_used() {
    let root = tempfile::tempdir().unwrap();
    let images = root.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let (iso, base) = base_image(root.path());
    let db = TestDb::new().await;
    let bmdb = db.bmdb().await;
    let (a, b) = (machine(&bmdb).await, machine(&bmdb).await);
    let issued = bmdb
        .transact(async |tx| boot::issue(tx, a, Duration::from_secs(600)).await)
        .await
        .unwrap();
    let (ca_der, ca_key) = new_ca().unwrap();
    let catalog = ImageCatalog::new(images, "127.0.0.1:7831", ca_der.clone()).with_boot_image(
        BootServing {
            image: BootImage::open(&iso).unwrap(),
            callback_endpoint: "10.0.2.100:7830".into(),
        },
        None,
    );
    let server = shepherd_sim::testing::image_server(&catalog, &bmdb, &ca_der, &ca_key);
    let port = server.addr.port();
    let url_of = |boot: Uuid| {
        catalog
            .boot_url(boot)
            .replace("127.0.0.1:7831", &format!("127.0.0.1:{port}"))
    };
    let url = url_of(issued.boot_id);
    assert!(
        url.ends_with(&format!("/boot/{}.iso", issued.boot_id)),
        "{url}"
    );

    // Whole: the base outside the slot, this boot's data inside it.
    let (status, whole, _) = fetch(&ca_der, &url, None, false).await;
    assert_eq!(status, 200);
    assert_eq!(whole.len(), base.len());
    let (s, e) = (SLOT_AT as usize, (SLOT_AT + SLOT_LEN) as usize);
    assert!(
        whole[..s] == base[..s] && whole[e..] == base[e..],
        "outside the slot"
    );
    let data = boot_data_of(&whole[s..e]);
    assert_eq!(data.machine_id, a.to_string());
    assert_eq!(data.bmaas_endpoint, "10.0.2.100:7830");
    assert_eq!(data.ca_certificate, ca_der);
    assert_eq!(data.credential, issued.credential);

    // In ranges, across the slot's edges, as a BMC streams it: the same.
    let cuts = [
        0u64,
        700_000,
        SLOT_AT - 5,
        SLOT_AT + 9000,
        SLOT_AT + SLOT_LEN + 3,
        2_500_000,
    ];
    let mut joined = Vec::new();
    for w in cuts.windows(2) {
        let (status, part, _) = fetch(
            &ca_der,
            &url,
            Some(&format!("bytes={}-{}", w[0], w[1] - 1)),
            false,
        )
        .await;
        assert_eq!(status, 206);
        joined.extend_from_slice(&part);
    }
    let (status, tail, _) = fetch(&ca_der, &url, Some("bytes=2500000-"), false).await;
    assert_eq!(status, 206);
    joined.extend_from_slice(&tail);
    assert!(joined == whole, "the ranges make the whole");
    let (status, _, len) = fetch(&ca_der, &url, None, true).await;
    assert_eq!(
        (status, len.as_deref()),
        (200, Some(&*base.len().to_string()))
    );
    let (status, _, _) = fetch(&ca_der, &url, Some("bytes=99999999-"), false).await;
    assert_eq!(status, 416);

    // Another machine's boot is its own.
    let theirs = bmdb
        .transact(async |tx| boot::issue(tx, b, Duration::from_secs(600)).await)
        .await
        .unwrap();
    let (_, other, _) = fetch(&ca_der, &url_of(theirs.boot_id), None, false).await;
    let other = boot_data_of(&other[s..e]);
    assert_eq!(other.machine_id, b.to_string());
    assert_ne!(other.credential, data.credential);

    // Used: no more. Expired, voided or unknown: none either.
    bmdb.transact(async |tx| boot::enroll(tx, a, &issued.credential, &[7u8; 32], "x:1").await)
        .await
        .unwrap();
    assert_eq!(fetch(&ca_der, &url, None, false).await.0, 404);
    let short = bmdb
        .transact(async |tx| boot::issue(tx, a, Duration::from_millis(100)).await)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fetch(&ca_der, &url_of(short.boot_id), None, false).await.0,
        404
    );
    bmdb.transact(async |tx| boot::issue(tx, b, Duration::from_secs(600)).await)
        .await
        .unwrap();
    assert_eq!(
        fetch(&ca_der, &url_of(theirs.boot_id), None, false).await.0,
        404,
        "voided"
    );
    assert_eq!(
        fetch(&ca_der, &url_of(Uuid::new_v4()), None, false).await.0,
        404
    );
    server.stop().await;
}

#[test]
fn a_slot_file_that_is_not_the_images_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (iso, _) = base_image(root.path());
    std::fs::write(
        root.path().join("shepherd-boot.iso.slot"),
        "offset 4096\nlength 16384\n",
    )
    .unwrap();
    let e = BootImage::open(&iso).unwrap_err().to_string();
    assert!(e.contains("no placeholder at byte 4096"), "{e}");
    std::fs::write(
        root.path().join("shepherd-boot.iso.slot"),
        "offset 99999999\nlength 16384\n",
    )
    .unwrap();
    let e = BootImage::open(&iso).unwrap_err().to_string();
    assert!(e.contains("not inside"), "{e}");
    std::fs::remove_file(root.path().join("shepherd-boot.iso.slot")).unwrap();
    let e = BootImage::open(&iso).unwrap_err().to_string();
    assert!(e.contains("scripts/boot-image"), "{e}");
}
