//! Images that travel between machines, on shaped links: 1, 10 and 50
//! machines, each a real agent process (`takeover-agent --install
//! --manifest … [--swarm …]`) in a network namespace of its own, install
//! one image from shepherd's image server in another namespace, all
//! behind a bridge in a third. `tc` shapes every link, the server's
//! narrower than the machines' (the server's link is the limit, as in a
//! real room). With and without the swarm, it prints the time to every
//! machine installed (against one machine alone) and what the server
//! sent: its link's counters, and the agents' own reports. Goal, with
//! the swarm: 50 machines in at most twice the time of one, the server
//! sending at most three times the image.
//!
//!     cargo bench --bench swarm
//!
//! Needs root (namespaces, tc) and PostgreSQL (the image server's grants
//! and the swarm's members are the BMDB's). SHEPHERD_BENCH_SWARM_MIB
//! (default 32) sizes the image, SHEPHERD_BENCH_SWARM_MACHINES (default
//! `1,10,50`) the runs, SHEPHERD_BENCH_SERVER_MBIT (default 200) and
//! SHEPHERD_BENCH_MACHINE_MBIT (default 1000) the links.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use shepherd::callback::{CertFiles, ServerIdentity};
use shepherd::images::{DownloadGate, ImageCatalog, ImageServer};
use shepherd_sim::testing::TestDb;

const MIB: u64 = 1 << 20;
const SERVER_IP: &str = "10.77.0.1";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of the bench's namespaces.
#[derive(Clone)]
struct Names(String);

impl Names {
    fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.0)
    }

    /// Bytes the server's link sent so far.
    fn server_sent(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns("srv"), "cat"])
            .arg("/sys/class/net/srv0/statistics/tx_bytes")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

/// The namespaces of one bench: a switch (a bridge), the server, the
/// machines; deleted on drop.
struct Room {
    names: Names,
    machines: usize,
}

impl Room {
    fn ns(&self, name: &str) -> String {
        self.names.ns(name)
    }

    /// A token bucket of `mbit` on `dev` in namespace `ns` (its egress).
    fn shape(&self, ns: &str, dev: &str, mbit: u64) {
        let rate = format!("{mbit}mbit");
        run(&[
            "tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst",
            "1mb", "latency", "200ms",
        ]);
    }

    /// A link from namespace `name` (`dev`, at `ip`) to the switch, shaped
    /// to `mbit` both ways.
    fn attach(&self, name: &str, dev: &str, ip: &str, mbit: u64) {
        let (ns, sw) = (self.ns(name), self.ns("sw"));
        let port = format!("p-{name}");
        run(&["ip", "netns", "add", &ns]);
        run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        run(&[
            "ip", "-n", &ns, "link", "add", dev, "type", "veth", "peer", "name", &port, "netns",
            &sw,
        ]);
        run(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip}/16"),
            "dev",
            dev,
        ]);
        run(&["ip", "-n", &ns, "link", "set", dev, "up"]);
        run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0"]);
        run(&["ip", "-n", &sw, "link", "set", &port, "up"]);
        self.shape(&ns, dev, mbit);
        self.shape(&sw, &port, mbit);
    }

    fn new(machines: usize, server_mbit: u64, machine_mbit: u64) -> Room {
        let room = Room {
            names: Names(format!("shsw{}", std::process::id())),
            machines,
        };
        let sw = room.ns("sw");
        run(&["ip", "netns", "add", &sw]);
        run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        room.attach("srv", "srv0", SERVER_IP, server_mbit);
        for i in 0..machines {
            room.attach(&format!("m{i}"), "eth0", &machine_ip(i), machine_mbit);
        }
        room
    }

    /// A listening socket in the server's namespace.
    fn listen(&self) -> std::net::TcpListener {
        let path = format!("/var/run/netns/{}", self.ns("srv"));
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            std::net::TcpListener::bind((SERVER_IP, 0)).unwrap()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let mut names = vec![self.ns("srv"), self.ns("sw")];
        names.extend((0..self.machines).map(|i| self.ns(&format!("m{i}"))));
        for n in names {
            let _ = Command::new("ip").args(["netns", "del", &n]).status();
        }
    }
}

fn machine_ip(i: usize) -> String {
    format!("10.77.{}.{}", 1 + i / 200, 1 + i % 200)
}

/// A file of `mib` MiB that does not compress (the agent writes it as
/// it comes).
fn make_image(path: &Path, mib: u64) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut data = vec![0u8; (mib * MIB) as usize];
    for w in data.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, data).unwrap();
}

/// One run's figures.
struct Figures {
    /// Seconds to every machine installed (the slowest agent's).
    seconds: f64,
    /// Bytes on the server's link.
    wire: u64,
    /// Bytes the agents say came from the server, and from each other.
    from_server: u64,
    from_peers: u64,
    /// CPU seconds the agents used, all together.
    cpu: f64,
}

/// CPU seconds of this process's waited-for children so far.
fn children_cpu() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    secs(u.user_time()) + secs(u.system_time())
}

#[derive(Clone)]
struct Agents {
    dir: PathBuf,
    ca: PathBuf,
    served: shepherd::images::ServedImage,
}

impl Agents {
    /// `n` machines install the image at once, with the swarm or not.
    fn install(&self, room: &Names, n: usize, swarm: bool) -> Figures {
        let before = room.server_sent();
        let cpu = children_cpu();
        let mut children = Vec::new();
        for i in 0..n {
            let target = self.dir.join(format!("target-{i}.img"));
            std::fs::File::create(&target)
                .unwrap()
                .set_len(self.served.size_bytes + MIB)
                .unwrap();
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &room.ns(&format!("m{i}"))])
                .arg(shepherd_sim::bin("takeover-agent"))
                .args(["--install", &self.served.url, &self.served.digest])
                .arg(&target)
                .arg(&self.ca)
                .arg("--key")
                .arg(self.dir.join(format!("agent-{i}.key")))
                .args([
                    "--manifest",
                    &self.served.manifest_url,
                    &self.served.manifest_digest,
                ]);
            if swarm {
                cmd.args(["--swarm", self.served.swarm_url.as_deref().unwrap()]);
            }
            children.push(
                cmd.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
        let mut f = Figures {
            seconds: 0.0,
            wire: 0,
            from_server: 0,
            from_peers: 0,
            cpu: 0.0,
        };
        for c in children {
            let v = shepherd_sim::testing::installed_by_hand(&c.wait_with_output().unwrap());
            assert_eq!(
                format!(
                    "sha256:{}",
                    v["digest"].as_str().unwrap().trim_start_matches("sha256:")
                ),
                self.served.digest
            );
            let (fetched, peers) = (
                v["fetched"].as_u64().unwrap(),
                v["from_peers"].as_u64().unwrap(),
            );
            f.seconds = f.seconds.max(v["seconds"].as_f64().unwrap());
            f.from_server += fetched - peers;
            f.from_peers += peers;
        }
        f.wire = room.server_sent() - before;
        f.cpu = children_cpu() - cpu;
        f
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("swarm: bench");
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("swarm: needs root (network namespaces and tc); skipped");
        return;
    }
    let mib = env_u64("SHEPHERD_BENCH_SWARM_MIB", 32);
    let (server_mbit, machine_mbit) = (
        env_u64("SHEPHERD_BENCH_SERVER_MBIT", 200),
        env_u64("SHEPHERD_BENCH_MACHINE_MBIT", 1000),
    );
    let runs: Vec<usize> = std::env::var("SHEPHERD_BENCH_SWARM_MACHINES")
        .unwrap_or_else(|_| "1,10,50".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let most = runs.iter().copied().max().unwrap_or(1);
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let images = work.path().join("images");
    std::fs::create_dir(&images).unwrap();
    make_image(&images.join("disk.img"), mib);
    let room = Room::new(most, server_mbit, machine_mbit);
    let identity = ServerIdentity::load_or_generate(
        &CertFiles::in_dir(&work.path().join("tls")),
        &[SERVER_IP.to_string()],
    )
    .unwrap();
    let ca = work.path().join("ca.der");
    std::fs::write(&ca, &identity.ca_der).unwrap();
    let seeds: Vec<[u8; 32]> = (0..most).map(|_| rand::random()).collect();
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(work.path().join(format!("agent-{i}.key")), s).unwrap();
    }
    let listener = room.listen();
    let port = listener.local_addr().unwrap().port();
    let system = actix_rt::System::new();
    system.block_on(async move {
        let db = TestDb::new().await;
        let bmdb = db.bmdb().await;
        for s in &seeds {
            shepherd_sim::testing::asked_machine(&bmdb, *s, "disk.img").await;
        }
        let catalog = ImageCatalog::new(
            images.clone(),
            &format!("{SERVER_IP}:{port}"),
            identity.ca_der.clone(),
        );
        let server = ImageServer::start_on(
            &catalog,
            DownloadGate {
                bmdb: bmdb.clone(),
                timeout: Duration::from_secs(5),
            },
            listener,
            identity.web_server_config().unwrap(),
            2,
        )
        .unwrap();
        let served = catalog.resolve("disk.img").unwrap();
        let image = served.size_bytes;
        let agents = Agents {
            dir: work.path().to_path_buf(),
            ca,
            served,
        };
        let started = Instant::now();
        let mut rows = Vec::new();
        for swarm in [false, true] {
            let mut alone = None;
            for &n in &runs {
                bmdb.transact(async |tx| tx.execute("DELETE FROM image_swarm_member", &[]).await)
                    .await
                    .unwrap();
                let (agents, names) = (agents.clone(), room.names.clone());
                let f = tokio::task::spawn_blocking(move || agents.install(&names, n, swarm))
                    .await
                    .unwrap();
                let one = *alone.get_or_insert(f.seconds);
                eprintln!(
                    "{n} machines, swarm {}: {:.1} s, the server's link {:.1} MiB",
                    if swarm { "on" } else { "off" },
                    f.seconds,
                    f.wire as f64 / MIB as f64
                );
                rows.push((n, swarm, f, one));
            }
        }
        println!();
        println!(
            "Images that travel between machines: a {} MiB image, the server's link {server_mbit} Mbit/s, each machine's {machine_mbit} Mbit/s ({:.0} s in all)",
            image / MIB,
            started.elapsed().as_secs_f64()
        );
        println!();
        println!(
            "| machines | swarm | every machine installed | × one machine | server's link | × the image | from the server (agents) | between machines | agents' CPU |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for (n, swarm, f, one) in rows {
            println!(
                "| {n} | {} | {:.1} s | {:.2} | {:.1} MiB | {:.2} | {:.1} MiB | {:.1} MiB | {:.1} s |",
                if swarm { "on" } else { "off" },
                f.seconds,
                f.seconds / one,
                f.wire as f64 / MIB as f64,
                f.wire as f64 / image as f64,
                f.from_server as f64 / MIB as f64,
                f.from_peers as f64 / MIB as f64,
                f.cpu,
            );
        }
        server.stop().await;
    });
}
