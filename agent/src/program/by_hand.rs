//! `takeover-agent --install`: an image installed by hand, as an
//! installation request would, with one JSON line of what it took.

use std::time::Duration;

/// `takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE]
/// [--manifest URL SHA256] [--swarm URL]`:
/// installs an image by hand, as an installation request would, onto DISK
/// (a block device, or a file standing for one), and prints one JSON line:
/// the outcome, the seconds it took, the seconds to the first byte on the
/// disk, the bytes fetched and written, and the process's peak resident
/// memory. For an operator at a machine's console, and for the
/// installation benchmark. The key shepherd's image server asks for is
/// FILE's first 32 bytes (the resident agent's state file, or a bare
/// ed25519 seed); without `--key`, the resident's own state file beside
/// this executable, if there is one. `--manifest` checks every chunk
/// against the image's manifest (shepherd's image server serves it at
/// `/manifests/NAME`); `--swarm` (with it) fetches chunks from the other
/// machines installing the image too (`/swarms/NAME`), and serves them
/// on after the image is written until they stop asking.
pub fn install_by_hand(args: Vec<String>) -> i32 {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let mut key_file = None;
    let mut manifest = None;
    let mut swarm = None;
    let mut positional = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--manifest" => match (it.next(), it.next()) {
                (Some(url), Some(digest)) => {
                    manifest = Some(crate::api::ImageManifestRef { url, digest })
                }
                _ => {
                    eprintln!("takeover-agent: --manifest needs a URL and a sha256:<hex>");
                    return 2;
                }
            },
            "--swarm" => match it.next() {
                Some(url) => swarm = Some(crate::api::ImageSwarmRef { url, port: 0 }),
                None => {
                    eprintln!("takeover-agent: --swarm needs a URL");
                    return 2;
                }
            },
            "--key" => match it.next() {
                Some(f) => key_file = Some(std::path::PathBuf::from(f)),
                None => {
                    eprintln!("takeover-agent: --key needs a file");
                    return 2;
                }
            },
            s if s.starts_with("--") => {
                eprintln!("takeover-agent: unknown option {s} for --install");
                return 2;
            }
            _ => positional.push(a),
        }
    }
    let [url, digest, disk, rest @ ..] = positional.as_slice() else {
        eprintln!(
            "usage: takeover-agent --install URL DIGEST DISK [CA.der] [--key FILE] [--manifest URL SHA256] [--swarm URL]"
        );
        return 2;
    };
    let ca = match rest.first() {
        Some(p) => match std::fs::read(p) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("takeover-agent: {p}: {e}");
                return 2;
            }
        },
        None => Vec::new(),
    };
    let own_state = std::env::current_exe()
        .ok()
        .map(|exe| {
            let mut p = exe.into_os_string();
            p.push(".state");
            std::path::PathBuf::from(p)
        })
        .filter(|p| p.exists());
    let agent_key = match key_file.as_ref().or(own_state.as_ref()) {
        None => None,
        Some(f) => match std::fs::read(f) {
            Ok(b) if b.len() >= 32 => Some(crate::install::fetch::AgentKey(
                b[..32].try_into().expect("32 bytes"),
            )),
            Ok(_) => {
                eprintln!(
                    "takeover-agent: {}: shorter than a key (32 bytes)",
                    f.display()
                );
                return 2;
            }
            Err(e) => {
                eprintln!("takeover-agent: {}: {e}", f.display());
                return 2;
            }
        },
    };
    let path = std::path::Path::new(disk);
    let target = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => crate::install::disk::Disk::file(path, m.len()),
        _ => crate::install::disk::Disk::probe(path),
    };
    let target = match target {
        Ok(d) => d,
        Err(e) => {
            eprintln!("takeover-agent: {disk}: {e}");
            return 2;
        }
    };
    let req = crate::api::ImageInstallation {
        url: url.clone(),
        digest: digest.clone(),
        ca_certificate: ca,
        allow_boot_disk: true,
        manifest,
        swarm,
        ..Default::default()
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("takeover-agent: {e}");
            return 1;
        }
    };
    let counters = Arc::new(crate::install::Counters::default());
    let started = std::time::Instant::now();
    let first = Arc::new(std::sync::Mutex::new(None::<f64>));
    let watch = {
        let (c, first) = (counters.clone(), first.clone());
        std::thread::spawn(move || {
            while c.written.load(Ordering::Relaxed) == 0 && started.elapsed().as_secs() < 3600 {
                std::thread::sleep(Duration::from_millis(2));
            }
            *first.lock().unwrap() = Some(started.elapsed().as_secs_f64());
        })
    };
    let log = |l: std::fmt::Arguments<'_>| eprintln!("takeover-agent: {l}");
    let r = rt.block_on(crate::install::install(
        &req,
        vec![target],
        counters.clone(),
        &crate::install::Limits {
            agent_key,
            ..Default::default()
        },
        &log,
    ));
    let seconds = started.elapsed().as_secs_f64();
    // The other machines of the image's swarm served until they stop
    // asking.
    rt.block_on(crate::install::swarm::settled());
    if r.is_err() {
        counters.written.store(1, Ordering::Relaxed);
    }
    let _ = watch.join();
    let peak_kb: u64 = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let first = first.lock().unwrap().unwrap_or(seconds);
    match r {
        Ok(i) => {
            println!(
                "{{\"ok\":true,\"seconds\":{seconds:.3},\"first_byte_seconds\":{first:.3},\"fetched\":{},\"written\":{},\"from_peers\":{},\"chunks_refused\":{},\"peak_rss_kb\":{peak_kb},\"digest\":\"{}\"}}",
                i.fetched,
                i.written,
                counters.from_peers.load(Ordering::Relaxed),
                counters.refused.load(Ordering::Relaxed),
                i.digest
            );
            0
        }
        Err(f) => {
            println!(
                "{{\"ok\":false,\"seconds\":{seconds:.3},\"peak_rss_kb\":{peak_kb},\"error\":{:?}}}",
                f.error
            );
            1
        }
    }
}
