//! Simulated IPMI BMCs for a rack (`fleet-sim --boot network --ipmi-every
//! N`): IPMI 2.0 over LAN (RMCP+, UDP) as ipmitool's `lanplus` interface
//! speaks it, one socket at each BMC's address:
//!
//! - the channel's authentication capabilities, asked before a session;
//! - a session opened with RAKP, in cipher suite 3 (HMAC-SHA1,
//!   HMAC-SHA1-96, AES-CBC-128) or 17 (HMAC-SHA256, HMAC-SHA256-128,
//!   AES-CBC-128), the password as the key (no BMC key, Kg);
//! - in it, the commands shepherd sends through ipmitool: the session's
//!   privilege, chassis status, chassis control (on, off, cycle, reset),
//!   the boot options' boot flags (a one-time PXE boot, EFI or not),
//!   the FRU's product area, and the session's close.
//!
//! Long on purpose (about 640 lines): one protocol's server, whose
//! session setup, sealing and commands share the BMC's state; split, each
//! part would reach into the others'.
//!
//! What it skips: IPMI 1.5 sessions, Serial-over-LAN, users beyond one
//! administrator, sensors and SDRs, and idle sessions' expiry (a BMC keeps
//! its 64 newest). Each packet is answered after the rack's BMC latency
//! divided by ten (a command is about six packets), one at a time per BMC.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aes::cipher::{BlockModeDecrypt, BlockModeEncrypt, KeyIvInit, block_padding::NoPadding};
use tokio::net::UdpSocket;

use super::{BootFrom, OnPowerOff, OnPowerOn};

/// A BMC keeps at most this many sessions; the oldest goes first.
const SESSIONS: usize = 64;

/// The simulated BMCs of a rack's IPMI machines.
pub struct IpmiSim {
    pub port: u16,
    pub user: String,
    pub password: String,
    addresses: std::collections::HashSet<IpAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for IpmiSim {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A system's chassis as its BMC keeps it.
#[derive(Default)]
struct Chassis {
    on: bool,
    /// The boot flags' device, if valid, and whether they persist.
    boot: Option<(u8, bool)>,
    efi: bool,
    /// Power ons counted, so that one a later control overtook is dropped.
    controls: u64,
}

struct Shared {
    user: String,
    password: String,
    latency: Duration,
    restart_delay: Duration,
    chassis: Mutex<HashMap<IpAddr, Chassis>>,
    on_power_on: OnPowerOn,
    on_power_off: OnPowerOff,
}

impl IpmiSim {
    /// A BMC on UDP `port` of each of `addresses`, its systems off;
    /// `latency` the rack's per request (a tenth of it per packet).
    pub fn start(
        addresses: &[IpAddr],
        port: u16,
        latency: Duration,
        restart_delay: Duration,
        on_power_on: OnPowerOn,
        on_power_off: OnPowerOff,
    ) -> std::io::Result<IpmiSim> {
        // IPMI passwords are 20 bytes at most.
        let password = format!("{:020x}", rand::random::<u128>())[..20].to_string();
        let shared = Arc::new(Shared {
            user: "admin".into(),
            password: password.clone(),
            latency: latency / 10,
            restart_delay,
            chassis: Mutex::new(addresses.iter().map(|a| (*a, Chassis::default())).collect()),
            on_power_on,
            on_power_off,
        });
        let mut tasks = Vec::new();
        for a in addresses {
            let std_socket = std::net::UdpSocket::bind(SocketAddr::new(*a, port))?;
            std_socket.set_nonblocking(true)?;
            let socket = UdpSocket::from_std(std_socket)?;
            let bmc = Bmc {
                ip: *a,
                shared: shared.clone(),
                sessions: Vec::new(),
                guid: *uuid::Uuid::new_v4().as_bytes(),
            };
            tasks.push(actix_rt::spawn(bmc.serve(socket)));
        }
        Ok(IpmiSim {
            port,
            user: "admin".into(),
            password,
            addresses: addresses.iter().copied().collect(),
            tasks,
        })
    }

    /// Whether the machine at `ip` has one of these BMCs.
    pub fn serves(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip)
    }

    /// The BMC URL of the machine at `ip`.
    pub fn url(&self, ip: IpAddr) -> String {
        format!("ipmi://{}", SocketAddr::new(ip, self.port))
    }
}

/// The two cipher suites served.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Suite {
    /// 3: RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128.
    Sha1,
    /// 17: RAKP-HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128.
    Sha256,
}

impl Suite {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        let alg = match self {
            Suite::Sha1 => ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Suite::Sha256 => ring::hmac::HMAC_SHA256,
        };
        ring::hmac::sign(&ring::hmac::Key::new(alg, key), data)
            .as_ref()
            .to_vec()
    }

    /// The integrity check value's length (RAKP 4 and every packet).
    fn icv_len(self) -> usize {
        match self {
            Suite::Sha1 => 12,
            Suite::Sha256 => 16,
        }
    }
}

struct Session {
    /// The console's ID (in what the BMC sends) and the BMC's (in what it
    /// receives), as on the wire.
    console_id: [u8; 4],
    bmc_id: [u8; 4],
    suite: Suite,
    rm: [u8; 16],
    rc: [u8; 16],
    role: u8,
    name: Vec<u8>,
    /// Set once RAKP 3 checked: the integrity and the encryption keys.
    keys: Option<(Vec<u8>, [u8; 16])>,
    out_seq: u32,
}

struct Bmc {
    ip: IpAddr,
    shared: Arc<Shared>,
    sessions: Vec<Session>,
    guid: [u8; 16],
}

/// An IPMI request message's header fields, for its response.
struct Request<'a> {
    netfn: u8,
    rs_lun: u8,
    rq_addr: u8,
    rq_seq_lun: u8,
    rs_addr: u8,
    cmd: u8,
    data: &'a [u8],
}

fn checksum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x)).wrapping_neg()
}

fn request(m: &[u8]) -> Option<Request<'_>> {
    if m.len() < 7 || checksum(&m[..3]) != 0 || checksum(&m[3..]) != 0 {
        return None;
    }
    Some(Request {
        rs_addr: m[0],
        netfn: m[1] >> 2,
        rs_lun: m[1] & 3,
        rq_addr: m[3],
        rq_seq_lun: m[4],
        cmd: m[5],
        data: &m[6..m.len() - 1],
    })
}

/// The response to `r`: completion code `cc`, then `data`.
fn response(r: &Request<'_>, cc: u8, data: &[u8]) -> Vec<u8> {
    let mut m = vec![r.rq_addr, ((r.netfn + 1) << 2) | (r.rq_seq_lun & 3)];
    m.push(checksum(&m));
    m.extend([r.rs_addr, (r.rq_seq_lun & 0xfc) | r.rs_lun, r.cmd, cc]);
    m.extend(data);
    m.push(checksum(&m[3..]));
    m
}

/// An RMCP+ packet outside a session (open session and RAKP answers).
fn plain(payload_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![6, 0, 0xff, 7, 0x06, payload_type, 0, 0, 0, 0, 0, 0, 0, 0];
    p.extend((payload.len() as u16).to_le_bytes());
    p.extend(payload);
    p
}

impl Bmc {
    async fn serve(mut self, socket: UdpSocket) {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                continue;
            };
            let answer = self.packet(&buf[..n]);
            if let Some(a) = answer {
                if !self.shared.latency.is_zero() {
                    tokio::time::sleep(self.shared.latency).await;
                }
                let _ = socket.send_to(&a, from).await;
            }
        }
    }

    fn packet(&mut self, p: &[u8]) -> Option<Vec<u8>> {
        if p.len() < 14 || p[0] != 6 || p[2] != 0xff || p[3] != 7 {
            return None;
        }
        match p[4] {
            0x00 => self.sessionless(p),
            0x06 if p.len() >= 16 => {
                let len = u16::from_le_bytes([p[14], p[15]]) as usize;
                let payload = p.get(16..16 + len)?;
                match p[5] & 0x3f {
                    0x10 => self.open_session(payload),
                    0x12 => self.rakp1(payload),
                    0x14 => self.rakp3(payload),
                    0x00 => self.in_session(p, len),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// IPMI 1.5 framing without a session: Get Channel Authentication
    /// Capabilities only.
    fn sessionless(&self, p: &[u8]) -> Option<Vec<u8>> {
        let len = *p.get(13)? as usize;
        let r = request(p.get(14..14 + len)?)?;
        if r.netfn != 0x06 || r.cmd != 0x38 {
            return None;
        }
        // Channel 1; IPMI 2.0 extended capabilities; non-null user names.
        let m = response(&r, 0, &[1, 0x80, 0x04, 0x02, 0, 0, 0, 0]);
        let mut out = vec![6, 0, 0xff, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, m.len() as u8];
        out.extend(m);
        Some(out)
    }

    fn open_session(&mut self, q: &[u8]) -> Option<Vec<u8>> {
        if q.len() < 32 {
            return None;
        }
        let (tag, console_id) = (q[0], [q[4], q[5], q[6], q[7]]);
        let (auth, integrity, conf) = (q[12], q[20], q[28]);
        let suite = match (auth, integrity, conf) {
            (1, 1, 1) => Some(Suite::Sha1),
            (3, 4, 1) => Some(Suite::Sha256),
            _ => None,
        };
        let Some(suite) = suite else {
            // No cipher suite matches the proposed algorithms.
            let mut r = vec![tag, 0x11, 0, 0];
            r.extend(console_id);
            return Some(plain(0x11, &r));
        };
        let bmc_id: [u8; 4] = rand::random::<u32>().max(1).to_le_bytes();
        if self.sessions.len() >= SESSIONS {
            self.sessions.remove(0);
        }
        self.sessions.push(Session {
            console_id,
            bmc_id,
            suite,
            rm: [0; 16],
            rc: [0; 16],
            role: 0,
            name: Vec::new(),
            keys: None,
            out_seq: 1,
        });
        let mut r = vec![tag, 0, 4, 0];
        r.extend(console_id);
        r.extend(bmc_id);
        r.extend([0, 0, 0, 8, auth, 0, 0, 0]);
        r.extend([1, 0, 0, 8, integrity, 0, 0, 0]);
        r.extend([2, 0, 0, 8, conf, 0, 0, 0]);
        Some(plain(0x11, &r))
    }

    fn session(&mut self, bmc_id: &[u8]) -> Option<&mut Session> {
        self.sessions.iter_mut().find(|s| s.bmc_id == bmc_id)
    }

    fn rakp1(&mut self, q: &[u8]) -> Option<Vec<u8>> {
        if q.len() < 28 {
            return None;
        }
        let (tag, role, name_len) = (q[0], q[24], q[27] as usize);
        let name = q.get(28..28 + name_len)?.to_vec();
        let (user, password, guid) = (
            self.shared.user.clone(),
            self.shared.password.clone(),
            self.guid,
        );
        let s = self.session(&q[4..8])?;
        let mut r = vec![tag, 0, 0, 0];
        r.extend(s.console_id);
        if name != user.as_bytes() || role & 0x0f > 4 {
            // Unauthorized name, or a role above administrator.
            r[1] = if name != user.as_bytes() { 0x0d } else { 0x09 };
            return Some(plain(0x13, &r));
        }
        s.rm.copy_from_slice(&q[8..24]);
        s.rc = rand::random();
        s.role = role;
        s.name = name;
        let mut h = Vec::new();
        h.extend(s.console_id);
        h.extend(s.bmc_id);
        h.extend(s.rm);
        h.extend(s.rc);
        h.extend(guid);
        h.extend([s.role, s.name.len() as u8]);
        h.extend(&s.name);
        r.extend(s.rc);
        r.extend(guid);
        r.extend(s.suite.hmac(password.as_bytes(), &h));
        Some(plain(0x13, &r))
    }

    fn rakp3(&mut self, q: &[u8]) -> Option<Vec<u8>> {
        if q.len() < 8 {
            return None;
        }
        let (password, guid) = (self.shared.password.clone(), self.guid);
        let s = self.session(&q[4..8])?;
        let mut r = vec![q[0], 0, 0, 0];
        r.extend(s.console_id);
        let mut h = Vec::new();
        h.extend(s.rc);
        h.extend(s.console_id);
        h.extend([s.role, s.name.len() as u8]);
        h.extend(&s.name);
        let kuid = password.as_bytes();
        if q[1] != 0 || q[8..] != s.suite.hmac(kuid, &h)[..] {
            r[1] = 0x0f;
            return Some(plain(0x15, &r));
        }
        let mut sik_data = Vec::new();
        sik_data.extend(s.rm);
        sik_data.extend(s.rc);
        sik_data.extend([s.role, s.name.len() as u8]);
        sik_data.extend(&s.name);
        let sik = s.suite.hmac(kuid, &sik_data);
        // The constants are 20 bytes in either suite (as ipmitool has them).
        let k1 = s.suite.hmac(&sik, &[1u8; 20]);
        let k2 = s.suite.hmac(&sik, &[2u8; 20]);
        let mut aes_key = [0u8; 16];
        aes_key.copy_from_slice(&k2[..16]);
        let mut icv_data = Vec::new();
        icv_data.extend(s.rm);
        icv_data.extend(s.bmc_id);
        icv_data.extend(guid);
        r.extend(&s.suite.hmac(&sik, &icv_data)[..s.suite.icv_len()]);
        s.keys = Some((k1, aes_key));
        Some(plain(0x15, &r))
    }

    /// An IPMI message in an established session: checked, decrypted,
    /// answered in kind.
    fn in_session(&mut self, p: &[u8], len: usize) -> Option<Vec<u8>> {
        let (encrypted, authenticated) = (p[5] & 0x80 != 0, p[5] & 0x40 != 0);
        let i = self.sessions.iter().position(|s| s.bmc_id == p[6..10])?;
        let s = &self.sessions[i];
        let (k1, aes_key) = s.keys.clone()?;
        if !authenticated || !encrypted {
            return None;
        }
        let icv = s.suite.icv_len();
        if p.len() < 16 + len + 2 + icv {
            return None;
        }
        let (covered, code) = p[4..].split_at(p.len() - 4 - icv);
        if s.suite.hmac(&k1, covered)[..icv] != *code {
            return None;
        }
        let payload = &p[16..16 + len];
        if payload.len() < 32 || payload.len() % 16 != 0 {
            return None;
        }
        let mut body = payload[16..].to_vec();
        let iv: [u8; 16] = payload[..16].try_into().ok()?;
        let plain_len = cbc::Decryptor::<aes::Aes128>::new(&aes_key.into(), &iv.into())
            .decrypt_padded::<NoPadding>(&mut body)
            .ok()?
            .len();
        let pad = *body.get(plain_len.checked_sub(1)?)? as usize;
        let message = body.get(..plain_len.checked_sub(1 + pad)?)?.to_vec();
        let r = request(&message)?;
        let (answer, close) = self.command(&r);
        let s = &mut self.sessions[i];
        let sealed = seal(s, &k1, &aes_key, &answer);
        if close {
            self.sessions.remove(i);
        }
        Some(sealed)
    }

    /// The answer to one command, and whether it closes the session.
    fn command(&self, r: &Request<'_>) -> (Vec<u8>, bool) {
        let d = r.data;
        match (r.netfn, r.cmd) {
            // Set Session Privilege Level: administrator at most.
            (0x06, 0x3b) => match d.first().map(|l| l & 0x0f) {
                Some(0) | None => (response(r, 0, &[4]), false),
                Some(l) if l <= 4 => (response(r, 0, &[l]), false),
                Some(_) => (response(r, 0x81, &[]), false),
            },
            // Close Session.
            (0x06, 0x3c) => (response(r, 0, &[]), true),
            // Get Device ID.
            (0x06, 0x01) => (
                response(r, 0, &[0x20, 0x01, 0x01, 0x00, 0x02, 0xbf, 0, 0, 0, 0, 0]),
                false,
            ),
            // Get Chassis Status.
            (0x00, 0x01) => {
                let on = self.with_chassis(|c| c.on);
                (response(r, 0, &[on as u8, 0, 0, 0]), false)
            }
            (0x00, 0x02) => match d.first().map(|c| c & 0x0f) {
                Some(c @ (0..=3 | 5)) => {
                    self.control(c);
                    (response(r, 0, &[]), false)
                }
                _ => (response(r, 0xcc, &[]), false),
            },
            (0x00, 0x08) => (self.set_boot_option(r), false),
            (0x00, 0x09) => (self.boot_option(r), false),
            // Get FRU Inventory Area Info, Read FRU Data: FRU 0 only.
            (0x0a, 0x10) if d.first() == Some(&0) => {
                let n = fru(self.ip).len() as u16;
                (response(r, 0, &[n as u8, (n >> 8) as u8, 0]), false)
            }
            (0x0a, 0x11) if d.len() >= 4 && d[0] == 0 => {
                let fru = fru(self.ip);
                let at = u16::from_le_bytes([d[1], d[2]]) as usize;
                let end = (at + d[3] as usize).min(fru.len());
                let Some(part) = fru.get(at..end) else {
                    return (response(r, 0xc9, &[]), false);
                };
                let mut out = vec![part.len() as u8];
                out.extend(part);
                (response(r, 0, &out), false)
            }
            (0x0a, 0x10 | 0x11) => (response(r, 0xcb, &[]), false),
            _ => (response(r, 0xc1, &[]), false),
        }
    }

    fn with_chassis<R>(&self, f: impl FnOnce(&mut Chassis) -> R) -> R {
        f(self
            .shared
            .chassis
            .lock()
            .unwrap()
            .entry(self.ip)
            .or_default())
    }

    /// Chassis Control: 0 down, 1 up, 2 cycle, 3 hard reset, 5 soft off.
    fn control(&self, c: u8) {
        let ip = self.ip;
        let (was_on, comes_on, controls) = self.with_chassis(|ch| {
            let was_on = ch.on;
            ch.controls += 1;
            let comes_on = match c {
                1 if !was_on => Some(Duration::ZERO),
                2 | 3 if was_on => Some(self.shared.restart_delay),
                _ => None,
            };
            if matches!(c, 0 | 5) || comes_on.is_some_and(|d| !d.is_zero()) {
                ch.on = false;
            }
            (was_on, comes_on, ch.controls)
        });
        if was_on && matches!(c, 0 | 2 | 3 | 5) {
            (self.shared.on_power_off)(ip);
        }
        if let Some(after) = comes_on {
            let shared = self.shared.clone();
            actix_rt::spawn(async move {
                tokio::time::sleep(after).await;
                let from = {
                    let mut all = shared.chassis.lock().unwrap();
                    let Some(ch) = all.get_mut(&ip).filter(|ch| ch.controls == controls) else {
                        return;
                    };
                    ch.on = true;
                    let from = match ch.boot {
                        Some((1, _)) => BootFrom::Network,
                        _ => BootFrom::Disk,
                    };
                    if ch.boot.is_some_and(|(_, persistent)| !persistent) {
                        ch.boot = None;
                    }
                    from
                };
                (shared.on_power_on)(ip, from);
            });
        }
    }

    /// Set System Boot Options: the set-in-progress and acknowledge
    /// parameters taken, the boot flags (5) kept.
    fn set_boot_option(&self, r: &Request<'_>) -> Vec<u8> {
        let d = r.data;
        match d.first().map(|p| p & 0x7f) {
            Some(0 | 3 | 4) => response(r, 0, &[]),
            Some(5) if d.len() >= 6 => {
                self.with_chassis(|ch| {
                    ch.boot = (d[1] & 0x80 != 0).then_some(((d[2] >> 2) & 0x0f, d[1] & 0x40 != 0));
                    ch.efi = d[1] & 0x20 != 0;
                });
                response(r, 0, &[])
            }
            Some(5) => response(r, 0xc7, &[]),
            _ => response(r, 0x80, &[]),
        }
    }

    /// Get System Boot Options: the boot flags (5) and set-in-progress (0).
    fn boot_option(&self, r: &Request<'_>) -> Vec<u8> {
        match r.data.first().map(|p| p & 0x7f) {
            Some(0) => response(r, 0, &[1, 0, 0]),
            Some(5) => {
                let flags = self.with_chassis(|ch| match ch.boot {
                    Some((device, persistent)) => [
                        0x80 | if persistent { 0x40 } else { 0 } | if ch.efi { 0x20 } else { 0 },
                        device << 2,
                        0,
                        0,
                        0,
                    ],
                    None => [0; 5],
                });
                let mut out = vec![1, 5];
                out.extend(flags);
                response(r, 0, &out)
            }
            _ => response(r, 0x80, &[]),
        }
    }
}

/// `answer` sealed for the session: encrypted (AES-CBC-128 behind a
/// random IV, IPMI's own padding) and authenticated (the integrity pad
/// to four bytes, then the HMAC over the session header on).
fn seal(s: &mut Session, k1: &[u8], aes_key: &[u8; 16], answer: &[u8]) -> Vec<u8> {
    let mut body = answer.to_vec();
    let pad = (16 - (body.len() + 1) % 16) % 16;
    body.extend((1..=pad).map(|i| i as u8));
    body.push(pad as u8);
    let iv: [u8; 16] = rand::random();
    let n = body.len();
    cbc::Encryptor::<aes::Aes128>::new(&(*aes_key).into(), &iv.into())
        .encrypt_padded::<NoPadding>(&mut body, n)
        .expect("a whole number of blocks");
    let mut p = vec![6, 0, 0xff, 7, 0x06, 0xc0];
    p.extend(s.console_id);
    p.extend(s.out_seq.to_le_bytes());
    s.out_seq = s.out_seq.wrapping_add(1).max(1);
    p.extend(((16 + body.len()) as u16).to_le_bytes());
    p.extend(iv);
    p.extend(body);
    let covered = p.len() - 4 + 2;
    let ipad = (4 - covered % 4) % 4;
    p.extend(std::iter::repeat_n(0xff, ipad));
    p.extend([ipad as u8, 0x07]);
    let code = s.suite.hmac(k1, &p[4..]);
    p.extend(&code[..s.suite.icv_len()]);
    p
}

/// FRU 0: a common header and a product area (manufacturer, name, part,
/// version, serial), as `ipmitool fru print` reads it.
fn fru(ip: IpAddr) -> Vec<u8> {
    let mut area = vec![0x01, 0, 0x00];
    for f in [
        "Shepherd Simulated Metal".to_string(),
        "s1.small.x86".into(),
        "SIM-1".into(),
        "1".into(),
        format!("SIM-{ip}"),
        String::new(),
        String::new(),
    ] {
        area.push(0xc0 | f.len() as u8);
        area.extend(f.as_bytes());
    }
    area.push(0xc1);
    while (area.len() + 1) % 8 != 0 {
        area.push(0);
    }
    area[1] = ((area.len() + 1) / 8) as u8;
    area.push(checksum(&area));
    let mut header = vec![0x01, 0, 0, 0, 1, 0, 0];
    header.push(checksum(&header));
    header.extend(area);
    header
}
