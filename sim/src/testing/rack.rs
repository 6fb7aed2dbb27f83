//! A simulated owned rack (`fleet-sim --provider static`) under one
//! `shepherd run` serving HTTPS, a Metal plan and operating system
//! configured: what the Metal API's benches drive. Its machines answer
//! SSH, or are blank and boot the network through their BMCs.

use std::net::Ipv4Addr;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use super::admin::Admin;
use super::boot::{gpt_image, https_client};
use super::builds::bin;
use super::db::TestDb;
use super::netns::{Netns, RackNetwork};
use super::processes::{FleetSimProcess, ShepherdProcess, loopback_env};
use super::sshd::Sshd;
use std::net::SocketAddr;

pub struct OwnedRack {
    /// When shepherd was started (the fleet was up before).
    pub started: std::time::Instant,
    pub admin: Admin,
    pub shepherd: ShepherdProcess,
    pub fleet: FleetSimProcess,
    pub dir: tempfile::TempDir,
    pub db: TestDb,
    /// The namespaces of a rack booting the network, deleted after the
    /// processes in them stopped.
    pub net: Option<RackNetwork>,
}

/// Where a rack's processes run.
enum Floor<'a> {
    /// shepherd and the fleet on the host's loopback.
    Host,
    /// shepherd in one namespace, the rack booting the network in another.
    Network(RackNetwork),
    /// shepherd and the fleet in one namespace of the caller's (a NIC on
    /// a switch: shepherd's services are reached on it).
    Inside(&'a Netns),
}

/// What [`OwnedRack::deprovision_all`] asked again.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Deprovisioned {
    /// Answered 503: the BMDB busy.
    pub busy: usize,
    /// Answered 409: the machine's BMC not read yet.
    pub bmc_unread: usize,
}

impl OwnedRack {
    /// The Metal API's plan and operating system the rack offers.
    pub const PLAN: &str = "c3.small.x86";
    pub const OPERATING_SYSTEM: &str = "debian_12";

    /// `n` machines from `first`, reached over SSH, whose agents call
    /// every `interval`, in the metro `sv`; the operating system an image
    /// of `image_len` bytes; `env`: further overrides of shepherd's
    /// configuration.
    pub async fn start(
        n: usize,
        first: Ipv4Addr,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
    ) -> OwnedRack {
        Self::start_on(
            Floor::Host,
            n,
            first,
            interval,
            image_len,
            env,
            &[],
            &|_| {},
        )
        .await
    }

    /// As [`OwnedRack::start`], with shepherd's configuration (the
    /// fleet's, a plan and an operating system added) edited by `edit`
    /// first: a `[network]` of switches, hosts' cabling.
    pub async fn start_edited(
        n: usize,
        first: Ipv4Addr,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
        edit: &dyn Fn(&mut toml::Table),
    ) -> OwnedRack {
        Self::start_on(Floor::Host, n, first, interval, image_len, env, &[], edit).await
    }

    /// As [`OwnedRack::start`], but blank machines, powered off, that
    /// shepherd boots through their BMCs and its network boot service
    /// (`fleet-sim --boot network`): shepherd in one network namespace,
    /// the rack in another ([`RackNetwork`]; root only). The admin API is
    /// reached through a port forwarded from the host's loopback, the
    /// BMDB through PostgreSQL's unix socket.
    pub async fn start_network(
        n: usize,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
        fleet_args: &[&str],
    ) -> OwnedRack {
        let net = RackNetwork::new();
        Self::start_network_edited(net, n, interval, image_len, env, fleet_args, &|_| {}).await
    }

    /// As [`OwnedRack::start_network`] on `net` (made by the caller, who
    /// may forward ports into shepherd's namespace first: a switch's
    /// sshd), shepherd's configuration edited by `edit`.
    pub async fn start_network_edited(
        net: RackNetwork,
        n: usize,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
        fleet_args: &[&str],
        edit: &dyn Fn(&mut toml::Table),
    ) -> OwnedRack {
        Self::start_on(
            Floor::Network(net),
            n,
            RackNetwork::FIRST_BMC,
            interval,
            image_len,
            env,
            fleet_args,
            edit,
        )
        .await
    }

    /// As [`OwnedRack::start_edited`], shepherd and the fleet run inside
    /// `ns` (root only; the caller's, alive as long as the rack): the
    /// admin API and the fleet's control reached through ports forwarded
    /// from the host's loopback, the BMDB through PostgreSQL's unix
    /// socket. A NIC on a switch, `ns` is where shepherd's network boot
    /// services answer.
    pub async fn start_inside(
        ns: &Netns,
        n: usize,
        first: Ipv4Addr,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
        edit: &dyn Fn(&mut toml::Table),
    ) -> OwnedRack {
        Self::start_on(
            Floor::Inside(ns),
            n,
            first,
            interval,
            image_len,
            env,
            &[],
            edit,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_on(
        floor: Floor<'_>,
        n: usize,
        first: Ipv4Addr,
        interval: &str,
        image_len: u64,
        env: &[(&'static str, String)],
        fleet_args: &[&str],
        edit: &dyn Fn(&mut toml::Table),
    ) -> OwnedRack {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--agent-interval",
            interval,
            "--provider",
            "static",
            "--location",
            "sv",
        ];
        let free = || Sshd::free_port();
        let fleet = match &floor {
            Floor::Host => FleetSimProcess::start(&bin("fleet-sim"), dir.path(), n, first, &args),
            Floor::Inside(ns) => {
                let exe = bin("fleet-sim");
                let control = SocketAddr::from(([127, 0, 0, 1], free()));
                let mut fleet = FleetSimProcess::start_by(
                    ns.cmd(&[exe.to_str().unwrap()]),
                    control,
                    dir.path(),
                    n,
                    first,
                    &args,
                );
                fleet.control = ns.forward(control);
                fleet
            }
            Floor::Network(net) => {
                args.extend(["--boot", "network"]);
                args.extend(fleet_args);
                let exe = bin("fleet-sim");
                let control = SocketAddr::from((RackNetwork::RACK, free()));
                let mut fleet = FleetSimProcess::start_by(
                    net.rack.cmd(&[exe.to_str().unwrap()]),
                    control,
                    dir.path(),
                    n,
                    first,
                    &args,
                );
                fleet.control = net.server.forward(control);
                fleet
            }
        };
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        gpt_image(&images.join("os.img"), image_len);
        {
            // Its partition holds data a disk can be checked for.
            use std::os::unix::fs::FileExt as _;
            let part: Vec<u8> = (0..8u32 << 20)
                .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
                .collect();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(images.join("os.img"))
                .unwrap();
            f.write_all_at(&part, 1 << 20).unwrap();
        }
        let config = dir.path().join("shepherd.toml");
        let mut text = std::fs::read_to_string(&fleet.config).unwrap();
        text.push_str(&format!(
            "\n[admin.tls]\nenabled = true\n\n[[metal.plans]]\nslug = \"{}\"\ncpus_min = 8\n\n\
             [[metal.operating_systems]]\nslug = \"{}\"\nname = \"Debian 12\"\nimage = \"os.img\"\n",
            Self::PLAN,
            Self::OPERATING_SYSTEM,
        ));
        let mut table: toml::Table = text.parse().unwrap();
        edit(&mut table);
        std::fs::write(&config, toml::to_string(&table).unwrap()).unwrap();
        let url = match &floor {
            Floor::Host => db.url(),
            _ => db.socket_url().expect(
                "shepherd in a namespace reaches PostgreSQL through its unix socket: none found",
            ),
        };
        let (mut all, listen) = loopback_env(url, &images);
        if let Floor::Network(_) = &floor {
            // The agents reach the callback and the image server over the
            // provisioning link (the fleet's configuration names them).
            all.retain(|(k, _)| !k.starts_with("SHEPHERD__BMAAS__"));
            all.retain(|(k, _)| *k != "SHEPHERD__INSTALLATIONS__IMAGES_LISTEN");
            let images = format!("{}:{}", RackNetwork::SERVER, free());
            all.push(("SHEPHERD__INSTALLATIONS__IMAGES_LISTEN", images));
        }
        all.push(("SHEPHERD__LOG__LEVEL", "warn".into()));
        all.extend(env.iter().cloned());
        let started = std::time::Instant::now();
        let log = dir.path().join("shepherd.log");
        let exe = bin("shepherd");
        let inside = match &floor {
            Floor::Host => None,
            Floor::Network(net) => Some(&net.server),
            Floor::Inside(ns) => Some(*ns),
        };
        let shepherd = match inside {
            None => ShepherdProcess::start(&exe, &config, log, &all),
            Some(ns) => {
                ShepherdProcess::start_by(ns.cmd(&[exe.to_str().unwrap()]), &config, log, &all)
            }
        };
        let base = match inside {
            None => format!("https://{listen}"),
            Some(ns) => format!("https://{}", ns.forward(listen.parse().unwrap())),
        };
        // The admin API's certificate is signed by the fleet's CA, which
        // shepherd writes once it started.
        let ca = dir.path().join("fleet/ssh/fleet-ca.pem");
        while !ca.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let der = CertificateDer::from_pem_file(&ca).unwrap();
        let admin = Admin {
            client: https_client(der.as_ref(), Duration::from_secs(60)),
            base,
            config,
            env: all,
        };
        OwnedRack {
            started,
            admin,
            shepherd,
            fleet,
            dir,
            db,
            net: match floor {
                Floor::Network(net) => Some(net),
                _ => None,
            },
        }
    }

    /// Deprovisions every machine (`discard`): each erased and
    /// `available` once its agent answered. Asked again after a second,
    /// as an operator's script would: a 503 (the BMDB busy past
    /// `admin.database_timeout`), and a 409 for a machine whose BMC the
    /// Updater has not read yet (a machine just enrolled). How many of
    /// each were. Each machine's asks carry one request ID: a 503 whose
    /// transaction committed after all (the bound passed as it
    /// committed) is found, not refused as a machine already cleaning.
    pub async fn deprovision_all(&self) -> Deprovisioned {
        let mut asked = Deprovisioned::default();
        for m in self.admin.machines().await {
            let id = m["machine_id"].as_str().unwrap();
            let request_id = uuid::Uuid::new_v4();
            loop {
                let (s, body) = self
                    .admin
                    .call(
                        "POST",
                        &format!("/api/v1/machines/{id}/deprovision"),
                        None,
                        Some(serde_json::json!({"mode": "discard", "request_id": request_id})),
                    )
                    .await;
                let again = match s {
                    503 => &mut asked.busy,
                    409 if body.to_string().contains("BMC has not been read yet") => {
                        &mut asked.bmc_unread
                    }
                    _ => {
                        assert_eq!(s, 200, "{id}: {body}");
                        break;
                    }
                };
                *again += 1;
                assert!(*again < 10_000, "{id}: {body}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        asked
    }

    /// A project and a token for it (the command line, as an operator
    /// makes them).
    pub fn project(&self, name: &str) -> (uuid::Uuid, String) {
        let project: uuid::Uuid = self
            .admin
            .cli(&["projects", "create", name])
            .trim()
            .parse()
            .unwrap();
        let token = self
            .admin
            .cli(&["tokens", "create", "--project", &project.to_string()])
            .lines()
            .last()
            .unwrap()
            .to_string();
        (project, token)
    }
}
