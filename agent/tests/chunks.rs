//! An image checked chunk by chunk against its manifest: a source that
//! sends a wrong chunk (a corrupt cache, a lying peer) costs that chunk
//! fetched again, never a wrong byte on the disk; a manifest that is not
//! the request's stops the installation before anything is written. Real
//! disks (loop devices as root, files otherwise), a real HTTP server on
//! loopback.

use std::sync::atomic::Ordering;

use shepherd_agent::api::ImageManifestRef;
use shepherd_proto::manifest::CHUNK;

mod common;
use common::source::*;
use common::*;

/// A raw GPT image of three chunks and a half.
fn image() -> Vec<u8> {
    gpt_image(3 * CHUNK + CHUNK / 2)
}

fn sha256(b: &[u8]) -> String {
    shepherd_proto::manifest::sha256(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_sent_wrong_is_fetched_again_and_the_disk_holds_the_image() {
    let data = image();
    let len = data.len() as u64;
    // The first response has one byte of the second chunk wrong.
    let bad = CHUNK + 12345;
    let server = serve(
        data.clone(),
        Behaviour::CorruptAt {
            at: bad,
            once: true,
        },
    )
    .await;
    let disk = TestDisk::new(len + MIB);
    let mut req = request(&server.url, &sha256(&data), Some(len));
    req.manifest = Some(server.manifest.clone());
    let installed = run(&req, vec![disk.disk()]).await.unwrap();
    assert_eq!(disk.read(0, len as usize), data, "the disk holds the image");
    assert!(
        installed
            .warnings
            .iter()
            .any(|w| w.contains("1 chunks of the image did not match its manifest")),
        "{:?}",
        installed.warnings
    );
    // Fetched again from the wrong chunk's start, not from the beginning.
    let log = server.log.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|l| l.ends_with(&format!("Range: bytes={CHUNK}-"))),
        "{log:?}"
    );
    assert!(
        server.sent.load(Ordering::SeqCst) < 2 * len,
        "only the rest again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_manifest_the_same_source_costs_the_whole_disk() {
    let data = image();
    let len = data.len() as u64;
    let server = serve(
        data.clone(),
        Behaviour::CorruptAt {
            at: CHUNK + 1,
            once: true,
        },
    )
    .await;
    let disk = TestDisk::new(len + MIB);
    let req = request(&server.url, &sha256(&data), Some(len));
    let e = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(e.contains("digest mismatch") && e.contains("wiped"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_always_sends_a_chunk_wrong_fails_naming_it_and_never_writes_it() {
    let data = image();
    let len = data.len() as u64;
    let bad = 2 * CHUNK + 7;
    let server = serve(
        data.clone(),
        Behaviour::CorruptAt {
            at: bad,
            once: false,
        },
    )
    .await;
    let disk = TestDisk::new(len + MIB);
    let mut req = request(&server.url, &sha256(&data), Some(len));
    req.manifest = Some(server.manifest.clone());
    let e = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(
        e.contains(&format!(
            "chunk 2 (bytes {}..{}) does not match the image's manifest",
            2 * CHUNK,
            3 * CHUNK
        )),
        "{e}"
    );
    // What was written (the chunks before it) was wiped with the tables;
    // nothing of the wrong chunk ever reached the disk.
    assert!(e.contains("wiped"), "{e}");
    let third = disk.read(2 * CHUNK, CHUNK as usize);
    assert!(
        third.iter().all(|b| *b == 0),
        "the wrong chunk was never written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_not_the_requests_stops_it_before_anything_is_written() {
    let data = image();
    let len = data.len() as u64;
    let server = serve(data.clone(), Behaviour::Normal).await;
    let disk = TestDisk::new(len + MIB);
    // The manifest's digest is not what the request says.
    let mut req = request(&server.url, &sha256(&data), Some(len));
    req.manifest = Some(ImageManifestRef {
        url: server.manifest.url.clone(),
        digest: sha256(b"another manifest"),
    });
    let e = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(
        e.contains("the image's manifest from") && e.contains("nothing was written"),
        "{e}"
    );
    // The manifest of another image.
    let other = serve(gpt_image(CHUNK), Behaviour::Normal).await;
    req.manifest = Some(other.manifest.clone());
    let e = run(&req, vec![disk.disk()]).await.unwrap_err();
    assert!(
        e.contains("digest is") && e.contains("nothing was written"),
        "{e}"
    );
    assert!(
        disk.read(0, MIB as usize).iter().all(|b| *b == 0),
        "the disk is untouched"
    );
    // Only the manifest was asked for.
    assert!(
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .all(|l| l.contains("/manifests/")),
        "{:?}",
        server.log.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_still_being_computed_is_waited_for() {
    let data = image();
    let len = data.len() as u64;
    // More 503s in a row than the image's own fetch would take (two).
    let server = serve(data.clone(), Behaviour::ManifestBusy(3)).await;
    let disk = TestDisk::new(len + MIB);
    let mut req = request(&server.url, &sha256(&data), Some(len));
    req.manifest = Some(server.manifest.clone());
    run(&req, vec![disk.disk()]).await.unwrap();
    assert_eq!(disk.read(0, len as usize), data);
    let log = server.log.lock().unwrap().clone();
    assert_eq!(
        log.iter().filter(|l| l.contains("/manifests/")).count(),
        4,
        "{log:?}"
    );
}
