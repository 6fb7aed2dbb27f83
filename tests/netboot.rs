//! The network boot service from outside (CONTRACTS.md §6): the real
//! `shepherd` binary runs inside a network namespace this test makes, on
//! one end of a veth pair; clients run in a second namespace on the other
//! end. Nothing has an address in the host's own namespace; the BMDB is
//! reached through PostgreSQL's unix socket.
//!
//! The clients are outside implementations: busybox `udhcpc` sending PXE
//! options (as Tinkerbell's smee tests itself), Debian's `tftp` (tftp-hpa),
//! busybox `tftp` and curl's TFTP (with `blksize` and `tsize`), curl for
//! the iPXE script and files; a DHCP client written here (with dhcproto)
//! reads each answer's fields. Malformed packets are sent too: each is
//! dropped and counted, and the service keeps answering.
//!
//! Needs root (network namespaces) and the Debian packages busybox,
//! tftp-hpa and iproute2 (scripts/test installs them); skipped, saying
//! so, without root.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use dhcproto::v4::{Architecture, DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Encodable as _};
use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::{
    Netns, ShepherdProcess, Sshd, TestDb, boot_data_file, boot_image_stand_in, is_root,
};

const SHEPHERD: &str = env!("CARGO_BIN_EXE_shepherd");
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The machine's provisioning NIC, as the inventory lists it.
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0x00, 0x01];
const MAC_TEXT: &str = "52:54:00:AA:00:01";
const ADMIN_TOKEN: &str = "netboot-test-admin-token-0123456789";

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `f` on a thread that has entered namespace `ns` (sockets it makes
/// live there).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// The test bed: the two namespaces, shepherd in the first.
struct Bed {
    server: Netns,
    client: Netns,
    shepherd: ShepherdProcess,
    bmdb: Bmdb,
    _db: TestDb,
    dir: tempfile::TempDir,
    http: u16,
    admin: u16,
    /// The stand-in iPXE binaries TFTP serves.
    undionly: Vec<u8>,
    snponly: Vec<u8>,
    kernel: Vec<u8>,
    initrd: Vec<u8>,
    /// The stand-in signed chain beside the boot image.
    shim: Vec<u8>,
    grub: Vec<u8>,
}

fn random_bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 24) as u8)
        .collect()
}

impl Bed {
    async fn start(mode: &str) -> Option<Bed> {
        Bed::start_with(mode, "").await
    }

    /// `netboot`: more of the `[netboot]` section.
    async fn start_with(mode: &str, netboot: &str) -> Option<Bed> {
        if !is_root() {
            eprintln!("SKIPPED: the network boot tests need root (network namespaces)");
            return None;
        }
        let db = TestDb::new().await;
        let Some(url) = db.socket_url() else {
            eprintln!("SKIPPED: no PostgreSQL unix socket for the shepherd in the namespace");
            return None;
        };
        let bmdb = db.bmdb().await;
        let server = Netns::new("s");
        let client = Netns::new("c");
        ok(Command::new("ip").args([
            "-n", &server.0, "link", "add", "vs", "type", "veth", "peer", "name", "vc", "netns",
            &client.0,
        ]));
        ok(&mut server.cmd(&["ip", "addr", "add", "10.77.0.1/24", "dev", "vs"]));
        ok(&mut server.cmd(&["ip", "link", "set", "vs", "up"]));
        ok(&mut client.cmd(&["ip", "addr", "add", "10.77.0.50/24", "dev", "vc"]));
        ok(&mut client.cmd(&["ip", "link", "set", "vc", "up"]));

        let dir = tempfile::tempdir().unwrap();
        let (iso, _) = boot_image_stand_in(dir.path());
        let kernel = random_bytes(300_001, 7);
        let initrd = random_bytes(500_003, 9);
        std::fs::write(dir.path().join("shepherd-boot.iso.vmlinuz"), &kernel).unwrap();
        std::fs::write(dir.path().join("shepherd-boot.iso.initrd"), &initrd).unwrap();
        let shim = random_bytes(951_233, 11);
        let grub = random_bytes(1_602_917, 13);
        std::fs::write(dir.path().join("shepherd-boot.iso.shimx64.efi"), &shim).unwrap();
        std::fs::write(dir.path().join("shepherd-boot.iso.grubnetx64.efi"), &grub).unwrap();
        let tftp_root = dir.path().join("ipxe");
        std::fs::create_dir(&tftp_root).unwrap();
        let undionly = random_bytes(74_213, 1);
        let snponly = random_bytes(173_792, 2);
        std::fs::write(tftp_root.join("undionly.kpxe"), &undionly).unwrap();
        std::fs::write(tftp_root.join("snponly.efi"), &snponly).unwrap();
        std::fs::write(tftp_root.join("secret.txt"), b"not served").unwrap();

        let http = Sshd::free_port();
        let admin = Sshd::free_port();
        let callback = Sshd::free_port();
        let mut config = format!(
            "[provider]\nkind = \"static\"\n\
             [[provider.inventory.machines]]\nid = \"pxe-1\"\nboot = \"network\"\nmac = \"{MAC_TEXT}\"\n\
             bmc = {{ url = \"ipmi://127.0.0.1:9\", username = \"admin\", password = \"pw\" }}\n\
             [enroller]\nenabled = false\n\
             [admin]\ntokens = {{ ops = \"{ADMIN_TOKEN}\" }}\n\
             [netboot]\ninterface = \"vs\"\nmode = \"{mode}\"\ntftp_root = \"{}\"\nhttp_listen = \"0.0.0.0:{http}\"\n{netboot}",
            tftp_root.display()
        );
        if mode == "dhcp" {
            config.push_str(
                "range = \"10.77.0.100-10.77.0.101\"\nrouter = \"10.77.0.1\"\ndns = [\"10.77.0.1\"]\nlease = \"10m\"\n",
            );
        }
        let cfg = dir.path().join("shepherd.toml");
        std::fs::write(&cfg, config).unwrap();
        let log = dir.path().join("shepherd.log");
        let env: Vec<(&str, String)> = vec![
            ("SHEPHERD__BMDB__URL", url),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "2s".into()),
            ("SHEPHERD__ADMIN__LISTEN", format!("127.0.0.1:{admin}")),
            ("SHEPHERD__BMAAS__LISTEN", format!("127.0.0.1:{callback}")),
            ("SHEPHERD__BMAAS__ENDPOINT", format!("10.77.0.1:{callback}")),
            ("SHEPHERD__PROVISIONER__INTERVAL", "1s".into()),
            (
                "SHEPHERD__INSTALLATIONS__BOOT_IMAGE",
                iso.display().to_string(),
            ),
            (
                "SHEPHERD__SSH__KEY_FILE",
                dir.path().join("id_ed25519").display().to_string(),
            ),
            ("SHEPHERD__LOG__LEVEL", "info,tokio_postgres=warn".into()),
            (
                "SHEPHERD__INITIALIZER__AGENT_BINARY",
                shepherd_sim::bin("takeover-agent").display().to_string(),
            ),
        ];
        let shepherd = ShepherdProcess::start_by(server.cmd(&[SHEPHERD]), &cfg, log, &env);
        let mut bed = Bed {
            server,
            client,
            shepherd,
            bmdb,
            _db: db,
            dir,
            http,
            admin,
            undionly,
            snponly,
            kernel,
            initrd,
            shim,
            grub,
        };
        bed.wait_for_machine().await;
        Some(bed)
    }

    fn log_tail(&self) -> String {
        self.shepherd.log_tail()
    }

    fn assert_running(&mut self) {
        self.shepherd.assert_running();
    }

    /// The inventory's machine, recorded with its MAC by the Provisioner.
    async fn wait_for_machine(&mut self) -> uuid::Uuid {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self
                .bmdb
                .transact(async |tx| {
                    Ok(tx
                        .query_opt(
                            "SELECT m.machine_id FROM machine_boot_mac m \
                               JOIN machine_bmc_boot b USING (machine_id) \
                              WHERE m.mac = '52:54:00:aa:00:01' AND b.via = 'network'",
                            &[],
                        )
                        .await?
                        .map(|r| r.get::<_, uuid::Uuid>(0)))
                })
                .await
                .unwrap();
            if let Some(id) = found {
                return id;
            }
            self.assert_running();
            assert!(Instant::now() < deadline, "{}", self.log_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn issue_boot(&mut self) -> uuid::Uuid {
        let mid = self.wait_for_machine().await;
        let issued = self
            .bmdb
            .transact(async |tx| {
                shepherd::bmdb::boot::issue(tx, mid, Duration::from_secs(600)).await
            })
            .await
            .unwrap();
        issued.boot_id
    }

    /// The service's `/metrics`, read from inside its namespace.
    fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin);
        let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
        String::from_utf8(ok(&mut self.server.cmd(&["curl", "-sf", "-H", &auth, &url])).stdout)
            .unwrap()
    }

    fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = self.metrics();
        let want = format!("{name}{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&want))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0.0)
    }

    /// The DHCP service answers at all (its sockets are up): waits for a
    /// boot-less plain request to be counted.
    async fn wait_for_service(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.assert_running();
            let up = run(&mut self.server.cmd(&[
                "curl",
                "-sf",
                &format!("http://127.0.0.1:{}/boot/x.ipxe", self.http),
            ]));
            // The netboot HTTP server answers 404 for an unknown boot.
            if up.status.code() == Some(22) {
                return;
            }
            assert!(Instant::now() < deadline, "{}", self.log_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Bed {
    /// shepherd first, then its namespace.
    fn drop(&mut self) {
        self.shepherd.kill();
    }
}

/// How a test's own DHCP client poses.
#[derive(Clone, Copy)]
struct Pose {
    kind: MessageType,
    arch: u16,
    ipxe: bool,
    http: bool,
    mac: [u8; 6],
}

impl Pose {
    /// UEFI HTTP boot (`HTTPClient`, x86-64).
    fn http() -> Pose {
        Pose {
            http: true,
            ..Pose::pxe(16)
        }
    }

    fn pxe(arch: u16) -> Pose {
        Pose {
            kind: MessageType::Discover,
            arch,
            ipxe: false,
            http: false,
            mac: MAC,
        }
    }
}

/// A client's message of `kind` from `mac`, answers asked by broadcast.
fn message(xid: u32, mac: &[u8; 6], kind: MessageType) -> Message {
    let any = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(xid, any, any, any, any, mac);
    m.set_flags(Flags::default().set_broadcast());
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    m
}

fn request(p: Pose) -> (u32, Vec<u8>) {
    let xid: u32 = rand::random();
    let mut m = message(xid, &p.mac, p.kind);
    let o = m.opts_mut();
    let class = if p.http { "HTTPClient" } else { "PXEClient" };
    o.insert(DhcpOption::ClassIdentifier(
        format!("{class}:Arch:{:05}:UNDI:003016", p.arch).into_bytes(),
    ));
    o.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(
        p.arch,
    )));
    o.insert(DhcpOption::ClientNetworkInterface(1, 3, 16));
    let mut uuid = vec![0u8];
    uuid.extend_from_slice(&[0x5e; 16]);
    o.insert(DhcpOption::ClientMachineIdentifier(uuid));
    if p.ipxe {
        o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    }
    (xid, m.to_vec().unwrap())
}

/// Sends `packets` from the client namespace to `to`, then waits up to
/// `wait` for an answer to `xid` (on port 68). The answer, if any.
fn exchange(
    ns: &str,
    to: SocketAddr,
    packets: Vec<Vec<u8>>,
    xid: u32,
    wait: Duration,
) -> Option<Message> {
    in_netns(ns, move || {
        let s = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_broadcast(true).unwrap();
        s.bind_device(Some(b"vc")).unwrap();
        s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 68)).into())
            .unwrap();
        let s: std::net::UdpSocket = s.into();
        for p in &packets {
            s.send_to(p, to).unwrap();
        }
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            s.set_read_timeout(Some(deadline - Instant::now() + Duration::from_millis(1)))
                .unwrap();
            let Ok((n, _)) = s.recv_from(&mut buf) else {
                return None;
            };
            let Ok(m) = Message::from_bytes(&buf[..n]) else {
                continue;
            };
            if m.opcode() == Opcode::BootReply && m.xid() == xid {
                return Some(m);
            }
        }
        None
    })
}

/// busybox udhcpc in the client namespace, posing as a BIOS PXE ROM
/// (vendor class, architecture, interface, UUID): what it said.
fn udhcpc_as_pxe_rom(bed: &Bed, script: &Path) -> String {
    let out = bed.client.udhcpc_as_pxe_rom("vc", script, 2);
    String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout)
}

fn broadcast() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::BROADCAST, 67))
}

fn ask(bed: &Bed, pose: Pose) -> Option<Message> {
    let (xid, p) = request(pose);
    exchange(
        &bed.client.0,
        broadcast(),
        vec![p],
        xid,
        Duration::from_secs(2),
    )
}

fn file_of(m: &Message) -> String {
    match m.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(f)) => String::from_utf8_lossy(f).to_string(),
        _ => String::new(),
    }
}

#[actix_rt::test]
async fn proxy_dhcp_answers_only_a_pxe_client_whose_machine_has_a_boot() {
    let Some(mut bed) = Bed::start("proxy").await else {
        return;
    };
    bed.wait_for_service().await;

    // No boot issued: the machine's own MAC gets no answer (it boots its
    // disk), an unknown MAC neither.
    assert!(ask(&bed, Pose::pxe(0)).is_none(), "{}", bed.log_tail());
    let stranger = Pose {
        mac: [0x52, 0x54, 0, 0xbb, 0, 2],
        ..Pose::pxe(0)
    };
    assert!(ask(&bed, stranger).is_none());
    assert_eq!(
        bed.metric("shepherd_netboot_dhcp_ignored_total", "reason=\"no_boot\""),
        1.0
    );
    assert_eq!(
        bed.metric(
            "shepherd_netboot_dhcp_ignored_total",
            "reason=\"unknown_mac\""
        ),
        1.0
    );

    let boot = bed.issue_boot().await;
    // A BIOS PXE ROM: no address, the boot server, undionly.kpxe, told to
    // boot it without a menu, its UUID echoed.
    let m = ask(&bed, Pose::pxe(0)).expect("a proxy offer");
    assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(m.siaddr(), SERVER_IP);
    assert_eq!(file_of(&m), "undionly.kpxe");
    // The legacy field too (dhcproto keeps its NUL end).
    let fname = m
        .fname()
        .map(|f| f.split(|b| *b == 0).next().unwrap_or_default().to_vec());
    assert_eq!(fname, Some(b"undionly.kpxe".to_vec()));
    assert!(
        matches!(m.opts().get(OptionCode::ServerIdentifier), Some(DhcpOption::ServerIdentifier(a)) if *a == SERVER_IP)
    );
    assert!(
        matches!(m.opts().get(OptionCode::ClassIdentifier), Some(DhcpOption::ClassIdentifier(v)) if v == b"PXEClient")
    );
    assert!(
        matches!(m.opts().get(OptionCode::VendorExtensions), Some(DhcpOption::VendorExtensions(v)) if v == &[6, 1, 8, 255])
    );
    assert!(m.opts().get(OptionCode::ClientMachineIdentifier).is_some());
    assert!(
        m.opts().get(OptionCode::SubnetMask).is_none(),
        "a proxy offers no address"
    );

    // In proxy mode (`uefi` unset: iPXE), an EFI PXE client asks the proxy
    // on 4011 and gets snponly.efi.
    let m = ask_4011(&bed, Pose::pxe(7)).expect("an ack from port 4011");
    assert_eq!(m.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(file_of(&m), "snponly.efi");

    // iPXE itself gets its boot's script, not the binary again.
    let m = ask(
        &bed,
        Pose {
            ipxe: true,
            ..Pose::pxe(0)
        },
    )
    .expect("an offer to iPXE");
    let script_url = format!("http://10.77.0.1:{}/boot/{boot}.ipxe", bed.http);
    assert_eq!(file_of(&m), script_url);
    // UEFI HTTP boot gets the boot's ISO, as an HTTPClient.
    let m = ask(&bed, Pose::http()).expect("an offer to UEFI HTTP boot");
    assert_eq!(
        file_of(&m),
        format!("http://10.77.0.1:{}/boot/{boot}.iso", bed.http)
    );
    assert!(
        matches!(m.opts().get(OptionCode::ClassIdentifier), Some(DhcpOption::ClassIdentifier(v)) if v == b"HTTPClient")
    );
    // An architecture shepherd has no binary for (ARM64, 11): no answer.
    assert!(ask(&bed, Pose::pxe(11)).is_none());

    // busybox udhcpc, posing as a PXE ROM, takes the proxy's offer (it
    // selects 0.0.0.0 from the proxy; no ACK follows, as no address was
    // offered).
    let script = bed.dir.path().join("udhcpc.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    ok(Command::new("chmod").args(["755", script.to_str().unwrap()]));
    // udhcpc uses the interface's own MAC: the veth's, not the
    // inventory's, so it is a stranger and gets nothing...
    let said = udhcpc_as_pxe_rom(&bed, &script);
    assert!(
        !said.contains("select for 0.0.0.0, server 10.77.0.1"),
        "{said}"
    );
    // ...until the veth carries the machine's MAC.
    ok(&mut bed
        .client
        .cmd(&["ip", "link", "set", "vc", "address", MAC_TEXT]));
    let said = udhcpc_as_pxe_rom(&bed, &script);
    assert!(
        said.contains("select for 0.0.0.0, server 10.77.0.1"),
        "udhcpc saw no proxy offer: {said}\n{}",
        bed.log_tail()
    );

    // The script, the kernel and the initramfs with the boot's data, over
    // HTTP, from the client's side.
    let script = ok(&mut bed.client.cmd(&["curl", "-sf", &script_url])).stdout;
    let script = String::from_utf8(script).unwrap();
    assert!(script.starts_with("#!ipxe\n"), "{script}");
    let kernel_url = format!("http://10.77.0.1:{}/boot/{boot}/vmlinuz", bed.http);
    let initrd_url = format!("http://10.77.0.1:{}/boot/{boot}/initrd", bed.http);
    assert!(
        script.contains(&format!("kernel {kernel_url} initrd=initrd console=")),
        "{script}"
    );
    assert!(
        script.contains(&format!("initrd --name initrd {initrd_url}")),
        "{script}"
    );
    let kernel = ok(&mut bed.client.cmd(&["curl", "-sf", &kernel_url])).stdout;
    assert!(kernel == bed.kernel, "the kernel as served");
    let initrd = ok(&mut bed.client.cmd(&["curl", "-sf", &initrd_url])).stdout;
    let base = bed.initrd.len();
    assert_eq!(
        &initrd[..base],
        &bed.initrd[..],
        "the initramfs, then the boot's data"
    );
    let tail = &initrd[base.div_ceil(4) * 4..];
    let data = boot_data_file(tail);
    use prost::Message as _;
    let data = shepherd_proto::boot::BootData::decode(data.as_slice()).unwrap();
    assert_eq!(data.machine_id, bed.wait_for_machine().await.to_string());
    assert_eq!(data.credential.len(), 32);

    // Once the boot is used (its agent called back), nothing is answered
    // and nothing is served: the machine boots its disk.
    use_boot(&bed, boot).await;
    assert!(ask(&bed, Pose::pxe(0)).is_none());
    assert!(
        ask(
            &bed,
            Pose {
                ipxe: true,
                ..Pose::pxe(0)
            }
        )
        .is_none()
    );
    let gone = run(&mut bed.client.cmd(&["curl", "-sf", &script_url]));
    assert_eq!(gone.status.code(), Some(22), "a used boot's script is gone");
    assert!(
        bed.metric(
            "shepherd_netboot_dhcp_answers_total",
            "message=\"offer\",path=\"bios-pxe\""
        ) >= 2.0
    );
    bed.assert_running();
}

#[actix_rt::test]
async fn tftp_serves_the_ipxe_binaries_to_outside_clients_and_nothing_else() {
    let Some(mut bed) = Bed::start("proxy").await else {
        return;
    };
    bed.wait_for_service().await;
    let out = |name: &str| bed.dir.path().join(name);
    // tftp-hpa: no options, 512-byte blocks.
    let hpa = out("hpa.kpxe");
    ok(&mut bed.client.cmd(&[
        "tftp",
        "-m",
        "binary",
        "10.77.0.1",
        "-c",
        "get",
        "undionly.kpxe",
        hpa.to_str().unwrap(),
    ]));
    assert!(
        std::fs::read(&hpa).unwrap() == bed.undionly,
        "tftp-hpa's copy"
    );
    // busybox: tsize and blksize 1468.
    let bb = out("bb.efi");
    ok(&mut bed.client.cmd(&[
        "busybox",
        "tftp",
        "-g",
        "-b",
        "1468",
        "-r",
        "snponly.efi",
        "-l",
        bb.to_str().unwrap(),
        "10.77.0.1",
    ]));
    assert!(std::fs::read(&bb).unwrap() == bed.snponly, "busybox's copy");
    // curl: tsize, blksize 1024, timeout; the leading slash some ROMs send.
    let c = out("curl.kpxe");
    ok(&mut bed.client.cmd(&[
        "curl",
        "-sf",
        "--tftp-blksize",
        "1024",
        "tftp://10.77.0.1//undionly.kpxe",
        "-o",
        c.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&c).unwrap() == bed.undionly, "curl's copy");
    // Anything else in the directory, or outside it, is refused.
    for name in ["secret.txt", "../shepherd.toml", "ipxe.efi"] {
        let r = run(&mut bed.client.cmd(&[
            "curl",
            "-s",
            &format!("tftp://10.77.0.1/{name}"),
            "-o",
            "/dev/null",
        ]));
        assert_eq!(r.status.code(), Some(68), "{name}: curl's 'file not found'");
    }
    // A write is refused too.
    let w = run(&mut bed.client.cmd(&[
        "busybox",
        "tftp",
        "-p",
        "-l",
        hpa.to_str().unwrap(),
        "-r",
        "undionly.kpxe",
        "10.77.0.1",
    ]));
    assert!(!w.status.success(), "a write was accepted");
    assert!(std::fs::read(bed.dir.path().join("ipxe/undionly.kpxe")).unwrap() == bed.undionly);
    assert_eq!(
        bed.metric(
            "shepherd_netboot_tftp_transfers_total",
            "file=\"undionly.kpxe\",result=\"complete\""
        ),
        2.0
    );
    assert_eq!(
        bed.metric(
            "shepherd_netboot_tftp_transfers_total",
            "file=\"snponly.efi\",result=\"complete\""
        ),
        1.0
    );
    bed.assert_running();
}

#[actix_rt::test]
async fn malformed_dhcp_and_tftp_packets_are_dropped_and_the_service_keeps_answering() {
    let Some(mut bed) = Bed::start("proxy").await else {
        return;
    };
    bed.wait_for_service().await;
    bed.issue_boot().await;
    let (_, good) = request(Pose::pxe(0));
    let mut bad: Vec<Vec<u8>> = vec![
        Vec::new(),
        good[..100].to_vec(),
        good[..239].to_vec(),
        vec![0xff; 4000],
        random_bytes(600, 3),
    ];
    let mut long_hlen = good.clone();
    long_hlen[2] = 200;
    bad.push(long_hlen);
    let mut reply = good.clone();
    reply[0] = 2;
    bad.push(reply);
    // Options whose lengths run past the end, a client interface option of
    // the wrong length, an architecture of one byte.
    for opts in [
        &[53u8, 1, 1, 60, 200, b'P'][..],
        &[
            53, 1, 1, 60, 9, b'P', b'X', b'E', b'C', b'l', b'i', b'e', b'n', b't', 94, 1, 1, 255,
        ][..],
        &[53, 1, 1, 93, 1, 0, 255][..],
        &[53, 1, 1][..],
    ] {
        let mut p = good[..240].to_vec();
        p.extend_from_slice(opts);
        bad.push(p);
    }
    let n = bad.len();
    // Then a good request in the same burst: still answered.
    let (xid, fine) = request(Pose::pxe(0));
    bad.push(fine);
    let m = exchange(
        &bed.client.0,
        SocketAddr::from((SERVER_IP, 67)),
        bad.clone(),
        xid,
        Duration::from_secs(3),
    );
    assert!(
        m.is_some(),
        "no answer after the malformed packets:\n{}",
        bed.log_tail()
    );
    // To 4011 too.
    let _ = exchange(
        &bed.client.0,
        SocketAddr::from((SERVER_IP, 4011)),
        bad[..n].to_vec(),
        0,
        Duration::from_millis(200),
    );
    let dropped = bed.metric(
        "shepherd_netboot_dhcp_ignored_total",
        "reason=\"malformed\"",
    ) + bed.metric(
        "shepherd_netboot_dhcp_ignored_total",
        "reason=\"not_a_request\"",
    );
    assert!(
        dropped >= 2.0 * 6.0,
        "dropped {dropped} of {n} twice:\n{}",
        bed.metrics()
    );

    // TFTP: garbage, a write, an unterminated request, an unknown opcode,
    // an ACK to nothing.
    let garbage: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0, 1],
        vec![0, 2, b'x', 0, b'o', b'c', b't', b'e', b't', 0],
        vec![0, 1, b'u', b'n', b'd', b'i'],
        vec![0, 9, 0, 0],
        vec![0, 4, 0, 1],
        vec![0, 1]
            .into_iter()
            .chain(std::iter::repeat_n(b'a', 3000))
            .collect(),
    ];
    in_netns(&bed.client.0.clone(), move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for g in &garbage {
            s.send_to(g, "10.77.0.1:69").unwrap();
        }
    });
    let c = bed.dir.path().join("after.kpxe");
    ok(&mut bed.client.cmd(&[
        "curl",
        "-sf",
        "tftp://10.77.0.1/undionly.kpxe",
        "-o",
        c.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&c).unwrap() == bed.undionly);
    bed.assert_running();
}

#[actix_rt::test]
async fn full_dhcp_leases_addresses_from_its_range_and_never_one_twice() {
    let Some(mut bed) = Bed::start("dhcp").await else {
        return;
    };
    bed.wait_for_service().await;
    let boot = bed.issue_boot().await;
    // The machine's PXE ROM: an address and the boot in one offer.
    let m = ask(&bed, Pose::pxe(0)).expect("an offer");
    assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
    // Each MAC starts looking at a place of its own in the pool.
    let first = m.yiaddr();
    let pool = [Ipv4Addr::new(10, 77, 0, 100), Ipv4Addr::new(10, 77, 0, 101)];
    assert!(pool.contains(&first), "{first}");
    let second = if first == pool[0] { pool[1] } else { pool[0] };
    assert_eq!(file_of(&m), "undionly.kpxe");
    assert!(
        matches!(m.opts().get(OptionCode::SubnetMask), Some(DhcpOption::SubnetMask(a)) if *a == Ipv4Addr::new(255, 255, 255, 0))
    );
    assert!(
        matches!(m.opts().get(OptionCode::Router), Some(DhcpOption::Router(r)) if r == &vec![SERVER_IP])
    );
    // Its request for it: acked, the same address.
    let mut req = message(7, &MAC, MessageType::Request);
    req.opts_mut().insert(DhcpOption::RequestedIpAddress(first));
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(SERVER_IP));
    req.opts_mut()
        .insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    req.opts_mut().insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
    ));
    let ack = exchange(
        &bed.client.0,
        broadcast(),
        vec![req.to_vec().unwrap()],
        7,
        Duration::from_secs(2),
    )
    .expect("an ack");
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(ack.yiaddr(), first);
    assert_eq!(
        file_of(&ack),
        format!("http://10.77.0.1:{}/boot/{boot}.ipxe", bed.http)
    );
    // A plain client (an operating system) gets the other address, no boot.
    let other = [0x52, 0x54, 0, 0xcc, 0, 3];
    let plain = message(8, &other, MessageType::Discover);
    let offer = exchange(
        &bed.client.0,
        broadcast(),
        vec![plain.to_vec().unwrap()],
        8,
        Duration::from_secs(2),
    )
    .expect("an offer to a plain client");
    assert_eq!(offer.yiaddr(), second);
    assert!(offer.opts().get(OptionCode::BootfileName).is_none());
    // It asks for the machine's address: refused.
    let mut steal = message(9, &other, MessageType::Request);
    steal
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(first));
    let nak = exchange(
        &bed.client.0,
        broadcast(),
        vec![steal.to_vec().unwrap()],
        9,
        Duration::from_secs(2),
    )
    .expect("a nak");
    assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
    // The pool (two addresses) is full: a third client gets nothing.
    let third = [0x52, 0x54, 0, 0xdd, 0, 4];
    let t = message(10, &third, MessageType::Discover);
    assert!(
        exchange(
            &bed.client.0,
            broadcast(),
            vec![t.to_vec().unwrap()],
            10,
            Duration::from_secs(2)
        )
        .is_none()
    );
    // The leases are the BMDB's: one row per address, each one MAC's.
    let rows: Vec<(String, String, bool)> = bed
        .bmdb
        .transact(async |tx| {
            Ok(tx
                .query(
                    "SELECT host(address), mac::text, granted FROM netboot_lease ORDER BY address",
                    &[],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect())
        })
        .await
        .unwrap();
    let mut want = vec![
        (first.to_string(), "52:54:00:aa:00:01".to_string(), true),
        (second.to_string(), "52:54:00:cc:00:03".to_string(), false),
    ];
    want.sort();
    assert_eq!(rows, want);
    // busybox udhcpc as the machine's operating system: leased its address.
    ok(&mut bed
        .client
        .cmd(&["ip", "link", "set", "vc", "address", MAC_TEXT]));
    let script = bed.dir.path().join("lease.sh");
    let seen = bed.dir.path().join("lease.env");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip $router\" > {}\nexit 0\n",
            seen.display()
        ),
    )
    .unwrap();
    ok(Command::new("chmod").args(["755", script.to_str().unwrap()]));
    ok(&mut bed.client.cmd(&[
        "busybox",
        "udhcpc",
        "-f",
        "-n",
        "-q",
        "-i",
        "vc",
        "-t",
        "3",
        "-T",
        "1",
        "-s",
        script.to_str().unwrap(),
    ]));
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap().trim(),
        format!("{first} 10.77.0.1")
    );
    bed.assert_running();
}

/// A machine's row of `machine_discovered`: (machine, firmware, boots,
/// accepted).
async fn discovered(bmdb: &Bmdb, mac: &str) -> Option<(uuid::Uuid, String, i32, bool)> {
    let mac = mac.to_string();
    bmdb.transact(async |tx| {
        Ok(tx
            .query_opt(
                "SELECT machine_id, firmware, boots, accepted_at IS NOT NULL \
                   FROM machine_discovered WHERE mac = $1::text::macaddr",
                &[&mac],
            )
            .await?
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))))
    })
    .await
    .unwrap()
}

impl Bed {
    /// The admin API, from inside shepherd's namespace: (status, body).
    fn api(&self, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.admin);
        let auth = format!("Authorization: Bearer {ADMIN_TOKEN}");
        let mut args = vec![
            "curl",
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "-H",
            &auth,
        ];
        let b = body.map(|b| b.to_string());
        if let Some(b) = &b {
            args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
        }
        args.push(&url);
        let out = String::from_utf8(ok(&mut self.server.cmd(&args)).stdout).unwrap();
        let (body, code) = out.rsplit_once('\n').unwrap();
        (code.trim().parse().unwrap(), body.to_string())
    }
}

#[actix_rt::test]
async fn discovery_enlists_an_unknown_mac_and_accepting_it_makes_it_an_inventory_machine() {
    let Some(mut bed) =
        Bed::start_with("proxy", "discover = true\ndiscover_per_minute = 3\n").await
    else {
        return;
    };
    bed.wait_for_service().await;
    const STRANGER: [u8; 6] = [0x52, 0x54, 0, 0xcc, 0, 7];
    const STRANGER_TEXT: &str = "52:54:00:cc:00:07";
    let stranger = Pose {
        mac: STRANGER,
        ..Pose::pxe(7)
    };

    // An unknown UEFI PXE client gets the iPXE binary (proxy mode's
    // default), and becomes a discovered machine with one discovery boot.
    let m = ask(&bed, stranger).expect("a discovery offer");
    assert_eq!(file_of(&m), "snponly.efi");
    let (id, firmware, boots, accepted) = discovered(&bed.bmdb, STRANGER_TEXT)
        .await
        .expect("enlisted");
    assert_eq!((firmware.as_str(), boots, accepted), ("uefi", 1, false));
    let (status, body) = bed.api("GET", &format!("/api/v1/machines/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["machine"]["state"], "discovered", "{v}");
    assert_eq!(v["tags"]["discovered"]["mac"], STRANGER_TEXT, "{v}");
    assert_eq!(v["tags"]["boot"], "network", "{v}");

    // iPXE, next, gets that boot's script: no second machine, no second
    // boot.
    let m = ask(
        &bed,
        Pose {
            ipxe: true,
            ..stranger
        },
    )
    .expect("an offer to iPXE");
    let boot: uuid::Uuid = bed
        .bmdb
        .transact(async |tx| {
            Ok(shepherd::bmdb::boot::latest(tx, id)
                .await?
                .expect("its boot")
                .boot_id)
        })
        .await
        .unwrap();
    assert_eq!(
        file_of(&m),
        format!("http://10.77.0.1:{}/boot/{boot}.ipxe", bed.http)
    );
    assert_eq!(discovered(&bed.bmdb, STRANGER_TEXT).await.unwrap().2, 1);

    // Its initramfs carries the discovery boot's data; the agent enrolls
    // with it, as a live agent enrolls.
    let initrd_url = format!("http://10.77.0.1:{}/boot/{boot}/initrd", bed.http);
    let initrd = ok(&mut bed.client.cmd(&["curl", "-sf", &initrd_url])).stdout;
    let tail = &initrd[bed.initrd.len().div_ceil(4) * 4..];
    use prost::Message as _;
    let data = shepherd_proto::boot::BootData::decode(boot_data_file(tail).as_slice()).unwrap();
    assert_eq!(data.machine_id, id.to_string());
    let enrolled = bed
        .bmdb
        .transact(async |tx| {
            shepherd::bmdb::boot::enroll(tx, id, &data.credential, &[5; 32], "10.77.0.1:1").await
        })
        .await
        .unwrap();
    assert!(
        matches!(enrolled, shepherd::bmdb::boot::Enrolled::Enrolled { .. }),
        "{enrolled:?}"
    );
    // No control loop works on it: nothing is installed or erased.
    let (status, body) = bed.api(
        "POST",
        &format!("/api/v1/machines/{id}/deprovision"),
        Some(&serde_json::json!({"mode": "metadata"})),
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("is discovered"), "{body}");

    // It boots the network again: a new discovery boot.
    assert!(ask(&bed, stranger).is_some(), "{}", bed.log_tail());
    assert_eq!(discovered(&bed.bmdb, STRANGER_TEXT).await.unwrap().2, 2);

    // The rate: three discovery boots a minute, the fourth unknown MAC
    // waits.
    let other = |last: u8| Pose {
        mac: [0x52, 0x54, 0, 0xcc, 1, last],
        ..Pose::pxe(0)
    };
    assert!(ask(&bed, other(1)).is_some());
    assert!(ask(&bed, other(2)).is_none());
    assert!(discovered(&bed.bmdb, "52:54:00:cc:01:02").await.is_none());
    assert_eq!(
        bed.metric(
            "shepherd_netboot_dhcp_ignored_total",
            "reason=\"discovery_rate\""
        ),
        1.0
    );
    assert_eq!(
        bed.metric(
            "shepherd_netboot_discovery_boots_total",
            "kind=\"enlisted\""
        ),
        2.0
    );
    assert_eq!(
        bed.metric("shepherd_netboot_discovery_boots_total", "kind=\"again\""),
        1.0
    );

    // Accepting: a wrong field is named; the right BMC makes it an
    // inventory machine whose live agent erases its disks first.
    const PASSWORD: &str = "accept-pw-Zq9x";
    let (status, body) = bed.api(
        "POST",
        &format!("/api/v1/machines/{id}/accept"),
        Some(
            &serde_json::json!({"bmc_url": "ftp://127.0.0.1", "bmc_username": "admin",
                                 "bmc_password": PASSWORD}),
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bmc_url"), "{body}");
    let (status, body) = bed.api(
        "POST",
        &format!("/api/v1/machines/{id}/accept"),
        Some(
            &serde_json::json!({"bmc_url": "ipmi://127.0.0.1:9", "bmc_username": "admin",
                                 "bmc_password": PASSWORD, "reason": "rack 9, unit 7"}),
        ),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("discovered-525400cc0007"), "{body}");
    assert!(!body.contains(PASSWORD));
    let (status, body) = bed.api(
        "POST",
        &format!("/api/v1/machines/{id}/accept"),
        Some(
            &serde_json::json!({"bmc_url": "ipmi://127.0.0.1:9", "bmc_username": "admin",
                                 "bmc_password": PASSWORD}),
        ),
    );
    assert_eq!(
        status, 200,
        "accepted again while its erasure waits: {body}"
    );

    // The Provisioner's rounds keep it: the inventory lists it, booted
    // from the network at its MAC.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = bed.api("GET", &format!("/api/v1/machines/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // Its BMC (nothing listens there) is never read: it stays discovered,
    // its erasure waiting, nothing erased.
    assert_eq!(v["machine"]["state"], "discovered", "{v}");
    assert_eq!(v["tags"]["discovered"]["erase_pending"], true, "{v}");
    assert!(v["installation"].is_null(), "{v}");
    assert_eq!(
        v["machine"]["provider_id"], "discovered-525400cc0007",
        "{v}"
    );
    assert_eq!(v["tags"]["boot"], "network", "{v}");
    assert_eq!(v["tags"]["boot_macs"][0], STRANGER_TEXT, "{v}");
    assert_eq!(v["tags"]["discovered"]["accepted_by"], "ops", "{v}");
    let audit = v["operator_actions"].as_array().unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a["action"] == "accept" && a["reason"] == "rack 9, unit 7"),
        "{v}"
    );
    assert!(!body.contains(PASSWORD));
    // Accepted, it is no longer given discovery boots: it has no boot
    // issued, so it boots its disk.
    assert!(ask(&bed, stranger).is_none());
    assert_eq!(discovered(&bed.bmdb, STRANGER_TEXT).await.unwrap().2, 2);
    let log = std::fs::read_to_string(bed.dir.path().join("shepherd.log")).unwrap();
    assert!(!log.contains(PASSWORD), "the BMC password is in the log");
    assert!(!bed.metrics().contains(PASSWORD));
    bed.assert_running();
}

/// What the proxy's port 4011 answers a request posing as `pose`.
fn ask_4011(bed: &Bed, pose: Pose) -> Option<Message> {
    let (xid, p) = request(Pose {
        kind: MessageType::Request,
        ..pose
    });
    exchange(
        &bed.client.0,
        SocketAddr::from((SERVER_IP, 4011)),
        vec![p],
        xid,
        Duration::from_secs(2),
    )
}

/// curl's exit code for a TFTP read of `name` from the client's side (68:
/// not found).
fn tftp_exit(bed: &Bed, name: &str) -> Option<i32> {
    let url = format!("tftp://10.77.0.1/{name}");
    run(&mut bed.client.cmd(&["curl", "-s", &url, "-o", "/dev/null"]))
        .status
        .code()
}

/// The boot used, as its agent's enrollment leaves it.
async fn use_boot(bed: &Bed, boot: uuid::Uuid) {
    bed.bmdb
        .transact(async |tx| {
            tx.execute(
                "UPDATE machine_boot_credential SET used_at = now() WHERE boot_id = $1",
                &[&boot],
            )
            .await?;
            Ok(())
        })
        .await
        .unwrap();
}

/// What `curl` says of `url` from the client's side: the status and the
/// body's length for a `GET`, and the status and `Content-Length` for a
/// `HEAD`.
fn get_and_head(bed: &Bed, url: &str) -> ((u16, usize), (u16, usize)) {
    let get =
        run(&mut bed
            .client
            .cmd(&["curl", "-s", "-o", "/dev/stderr", "-w", "%{http_code}", url]));
    let status = |out: &[u8]| {
        String::from_utf8_lossy(out)
            .trim()
            .parse::<u16>()
            .unwrap_or(0)
    };
    let head = run(&mut bed.client.cmd(&["curl", "-s", "-I", url]));
    let head_text = String::from_utf8_lossy(&head.stdout).to_string();
    let head_status = head_text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head_len = head_text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(usize::MAX);
    (
        (status(&get.stdout), get.stderr.len()),
        (head_status, head_len),
    )
}

#[actix_rt::test]
async fn uefi_machines_get_the_signed_chain_and_every_url_answers_head_as_its_get() {
    let Some(mut bed) = Bed::start_with("proxy", "uefi = \"shim\"\n").await else {
        return;
    };
    bed.wait_for_service().await;
    let boot = bed.issue_boot().await;

    // EDK2's PXE (architecture 7, on 4011) gets the boot's shim over TFTP.
    let m = ask_4011(&bed, Pose::pxe(7)).expect("an ack from port 4011");
    assert_eq!(file_of(&m), format!("boot/{boot}/shimx64.efi"));
    // UEFI HTTP boot gets the boot's ISO (booted as a RAM disk).
    let m = ask(&bed, Pose::http()).expect("an offer to UEFI HTTP boot");
    let iso_url = format!("http://10.77.0.1:{}/boot/{boot}.iso", bed.http);
    assert_eq!(file_of(&m), iso_url);
    // BIOS keeps iPXE.
    assert_eq!(file_of(&ask(&bed, Pose::pxe(0)).unwrap()), "undionly.kpxe");

    // The chain over TFTP, as the firmware, shim and GRUB read it (curl's
    // TFTP with GRUB's 1024-byte blocks).
    let tftp = |name: &str| -> Vec<u8> {
        let out = bed.dir.path().join("tftp.out");
        let _ = std::fs::remove_file(&out);
        ok(&mut bed.client.cmd(&[
            "curl",
            "-sf",
            "--tftp-blksize",
            "1024",
            &format!("tftp://10.77.0.1/{name}"),
            "-o",
            out.to_str().unwrap(),
        ]));
        std::fs::read(&out).unwrap()
    };
    assert!(
        tftp(&format!("boot/{boot}/shimx64.efi")) == bed.shim,
        "shim"
    );
    assert!(
        tftp(&format!("boot/{boot}/grubx64.efi")) == bed.grub,
        "GRUB"
    );
    let shared = String::from_utf8(tftp("grub/grub.cfg")).unwrap();
    assert!(
        shared.contains("source $prefix/mac/${net_default_mac}.cfg"),
        "{shared}"
    );
    // GRUB asks by its MAC (in proxy mode it does not know the boot file's
    // directory), as GRUB spells it: the boot's own configuration.
    let own = String::from_utf8(tftp("grub/mac/52:54:00:aa:00:01.cfg")).unwrap();
    assert_eq!(
        own,
        String::from_utf8(tftp(&format!("boot/{boot}/grub.cfg"))).unwrap()
    );
    assert!(
        own.contains(&format!(
            "linux (tftp,10.77.0.1)/boot/{boot}/vmlinuz console="
        )),
        "{own}"
    );
    assert!(
        own.contains(&format!("initrd (tftp,10.77.0.1)/boot/{boot}/initrd\n")),
        "{own}"
    );
    assert!(
        tftp(&format!("boot/{boot}/vmlinuz")) == bed.kernel,
        "kernel"
    );
    let initrd = tftp(&format!("boot/{boot}/initrd"));
    let base = bed.initrd.len();
    assert!(initrd[..base] == bed.initrd[..], "the initramfs over TFTP");
    use prost::Message as _;
    let data = shepherd_proto::boot::BootData::decode(
        boot_data_file(&initrd[base.div_ceil(4) * 4..]).as_slice(),
    )
    .unwrap();
    assert_eq!(data.machine_id, bed.wait_for_machine().await.to_string());
    // Over TFTP nothing but the chain: no script, no ISO, no other boot.
    for name in [
        format!("boot/{boot}.ipxe"),
        format!("boot/{boot}.iso"),
        format!("boot/{}/shimx64.efi", uuid::Uuid::new_v4()),
        format!("boot/{boot}/../../shepherd.toml"),
        "grub/mac/52:54:00:bb:00:02.cfg".to_string(),
    ] {
        assert_eq!(tftp_exit(&bed, &name), Some(68), "{name}: not found");
    }

    // HEAD and GET agree for every URL the network boot's HTTP serves.
    let base_url = format!("http://10.77.0.1:{}", bed.http);
    let urls: Vec<String> = [
        format!("boot/{boot}.ipxe"),
        format!("boot/{boot}.iso"),
        format!("boot/{boot}/vmlinuz"),
        format!("boot/{boot}/initrd"),
        format!("boot/{boot}/shimx64.efi"),
        format!("boot/{boot}/grubx64.efi"),
        format!("boot/{boot}/grub.cfg"),
        "grub/grub.cfg".to_string(),
        "ipxe/snponly.efi".to_string(),
        "ipxe/undionly.kpxe".to_string(),
    ]
    .iter()
    .map(|p| format!("{base_url}/{p}"))
    .collect();
    for url in &urls {
        let (get, head) = get_and_head(&bed, url);
        assert_eq!(get.0, 200, "GET {url}");
        assert_eq!(get, head, "GET and HEAD of {url}");
    }
    let (get, head) = get_and_head(&bed, &iso_url);
    assert_eq!(
        get.1,
        std::fs::metadata(bed.dir.path().join("shepherd-boot.iso"))
            .unwrap()
            .len() as usize
    );
    assert_eq!(head, get);
    let (get, _) = get_and_head(&bed, &format!("{base_url}/boot/{boot}/shimx64.efi"));
    assert_eq!(get.1, bed.shim.len());
    // What is not served is not served by either.
    for url in [
        format!("{base_url}/boot/{}/shimx64.efi", uuid::Uuid::new_v4()),
        format!("{base_url}/boot/{boot}/mmx64.efi"),
        format!("{base_url}/ipxe/secret.txt"),
    ] {
        let (get, head) = get_and_head(&bed, &url);
        assert_eq!((get.0, head.0), (404, 404), "{url}");
    }

    // Once the boot is used, its chain is gone from both servers.
    use_boot(&bed, boot).await;
    for url in &urls[..7] {
        let (get, head) = get_and_head(&bed, url);
        assert_eq!((get.0, head.0), (404, 404), "a used boot's {url}");
    }
    assert_eq!(
        tftp_exit(&bed, &format!("boot/{boot}/shimx64.efi")),
        Some(68),
        "a used boot's shim over TFTP"
    );
    assert_eq!(
        tftp_exit(&bed, "grub/mac/52:54:00:aa:00:01.cfg"),
        Some(68),
        "no boot served to the MAC"
    );
    assert!(
        bed.metric(
            "shepherd_netboot_tftp_transfers_total",
            "file=\"shim\",result=\"complete\""
        ) >= 1.0
    );
    assert!(
        bed.metric(
            "shepherd_netboot_dhcp_answers_total",
            "message=\"ack\",path=\"uefi-shim\""
        ) >= 1.0
    );
    bed.assert_running();
}
