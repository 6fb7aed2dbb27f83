//! Machines installing one image fetch its chunks from each other
//! (`installations.peers`, on by default): eight `fleet-sim` machines,
//! their agents' real chunk servers and the image server on loopback,
//! asked together. Every disk holds the image; the image server sends it
//! about once, the rest travelling between the machines, as the agents'
//! progress reports say.

use std::net::Ipv4Addr;

use serde_json::json;

use super::rig::Rig;

#[actix_rt::test]
async fn eight_machines_installing_one_image_fetch_it_from_each_other() {
    // About 27 MiB compressed: seven chunks.
    let mut rig = Rig::with(8, Ipv4Addr::new(127, 0, 64, 1), 48 << 20, &[]).await;
    let machines = rig.machines().await;
    for (id, _) in &machines {
        let (status, body) = rig
            .post_install(
                &format!("/api/v1/machines/{id}/install"),
                json!({"image": {"served": "debian.img.zst"}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (mut from_peers, mut from_server, mut total) = (0u64, 0u64, 0u64);
    for (id, ip) in &machines {
        let d = rig.wait_state(*id, &["installed", "install-failed"]).await;
        let inst = &d["installation"];
        assert_eq!(d["machine"]["state"], "installed", "{inst:#}");
        let p = &inst["progress"];
        let fetched = p["bytes_fetched"].as_u64().unwrap();
        let peers = p["bytes_from_peers"].as_u64().unwrap();
        total = p["bytes_total"].as_u64().unwrap();
        assert_eq!(fetched, total, "{p:#}");
        assert_eq!(p["chunks_refused"], 0, "{p:#}");
        from_peers += peers;
        from_server += fetched - peers;
        assert!(rig.disk_holds_image(ip), "{ip}: the disk holds the image");
    }
    eprintln!(
        "8 machines, an image of {total} bytes: {from_server} from the image server ({:.1} images), {from_peers} from each other",
        from_server as f64 / total as f64
    );
    assert!(
        from_peers >= 4 * total,
        "most of the image travelled between the machines: {from_peers} of {}",
        8 * total
    );
    assert!(
        from_server <= 3 * total,
        "the image server sent {from_server} bytes, more than three images of {total}"
    );
    // The image server refused nobody.
    let log = std::fs::read_to_string(&rig.shepherd.log).unwrap();
    assert!(
        !log.contains("image download refused"),
        "{}",
        rig.shepherd.log_tail()
    );
}
