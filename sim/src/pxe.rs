//! The simulated machines' network boot, as their firmware and iPXE do it
//! against shepherd's real network boot service (CONTRACTS.md §6), over a
//! provisioning link in a network namespace the test made:
//!
//! 1. the PXE ROM: DHCP discover and request (vendor class `PXEClient`,
//!    BIOS, a UUID), broadcast, retried after 4, 8, 16 and 32 s as the
//!    PXE specification's ROMs do; then the boot file (`undionly.kpxe`)
//!    over TFTP with `blksize` and `tsize`, checked against its `tsize`;
//! 2. iPXE: DHCP again (user class `iPXE`, retried after 1, 2, 4, 8 and
//!    16 s), which names the boot's script; the script over HTTP, then the
//!    kernel and the initramfs it names, each checked against its
//!    `Content-Length`;
//! 3. the kernel: the boot's data (`shepherd/boot-data`) read from the
//!    initramfs's last newc archive, as the boot image's init reads it.
//!
//! Every machine binds its TFTP and HTTP sockets to the address its lease
//! gave it (the rack's namespace routes the pool's range to itself), so
//! shepherd sees each machine from its own address. What it skips: ARP
//! probing of the leased address (no DHCPDECLINE), PXE's boot server
//! discovery on port 4011 (the service runs full DHCP here), executing
//! anything it fetched, and link-layer behaviour (one UDP socket on the
//! link receives every machine's broadcasts and hands each its own by
//! transaction ID).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dhcproto::v4::{Architecture, DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Encodable as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

/// A PXE ROM's waits for a DHCP answer (PXE 2.1, DHCPDISCOVER).
const ROM_WAITS: [u64; 4] = [4, 8, 16, 32];
/// iPXE's waits for a DHCP answer.
const IPXE_WAITS: [u64; 5] = [1, 2, 4, 8, 16];
/// A TFTP block unanswered this long is sent again (its ACK), 5 times.
const TFTP_WAIT: Duration = Duration::from_secs(2);
/// An HTTP fetch ends within this long.
const HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// What the rack's machines did on the provisioning link.
#[derive(Default, Debug, serde::Serialize)]
pub struct BootCounts {
    /// Network boots started (a power on with the override `Pxe`).
    pub started: AtomicU64,
    /// Boots that ended with the boot's data read.
    pub booted: AtomicU64,
    /// Boots that failed (nothing answered, a file short or refused).
    pub failed: AtomicU64,
    /// DHCP messages sent, and those sent again after a wait unanswered.
    pub dhcp_sent: AtomicU64,
    pub dhcp_resent: AtomicU64,
    /// TFTP and HTTP bytes received.
    pub tftp_bytes: AtomicU64,
    pub http_bytes: AtomicU64,
}

/// The provisioning link as the rack's machines share it: one socket on
/// port 68 of the link, whose answers go to the machine waiting on their
/// transaction ID.
pub struct ProvisioningLink {
    socket: UdpSocket,
    waiting: Mutex<HashMap<u32, mpsc::UnboundedSender<Message>>>,
    pub counts: BootCounts,
}

impl std::fmt::Debug for ProvisioningLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.counts.fmt(f)
    }
}

impl ProvisioningLink {
    /// The link on interface `device` (in the rack's namespace).
    pub fn open(device: &str) -> std::io::Result<Arc<ProvisioningLink>> {
        let socket = shepherd::netboot::udp_socket(68, device)
            .map_err(|e| std::io::Error::other(format!("port 68 on {device}: {e}")))?;
        // A rack's broadcasts arrive at once.
        socket2::SockRef::from(&socket).set_recv_buffer_size(4 << 20)?;
        let link = Arc::new(ProvisioningLink {
            socket,
            waiting: Mutex::new(HashMap::new()),
            counts: BootCounts::default(),
        });
        let weak = Arc::downgrade(&link);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Some(link) = weak.upgrade() else { return };
                let Ok((n, _)) = link.socket.recv_from(&mut buf).await else {
                    continue;
                };
                let Ok(m) = Message::from_bytes(&buf[..n]) else {
                    continue;
                };
                if m.opcode() != Opcode::BootReply {
                    continue;
                }
                if let Some(tx) = link.waiting.lock().unwrap().get(&m.xid()) {
                    let _ = tx.send(m);
                }
            }
        });
        Ok(link)
    }

    /// Sends `m` broadcast and waits for an answer of `want` to its
    /// transaction, sending it again after each of `waits` seconds.
    async fn exchange(&self, m: &Message, want: MessageType, waits: &[u64]) -> Option<Message> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.waiting.lock().unwrap().insert(m.xid(), tx);
        let bytes = m.to_vec().ok()?;
        let to = SocketAddr::from((Ipv4Addr::BROADCAST, 67));
        let mut answer = None;
        'tries: for (i, wait) in waits.iter().enumerate() {
            self.counts.dhcp_sent.fetch_add(1, Ordering::Relaxed);
            if i > 0 {
                self.counts.dhcp_resent.fetch_add(1, Ordering::Relaxed);
            }
            if self.socket.send_to(&bytes, to).await.is_err() {
                continue;
            }
            let until = tokio::time::Instant::now() + Duration::from_secs(*wait);
            while let Ok(Some(got)) = tokio::time::timeout_at(until, rx.recv()).await {
                if kind(&got) == Some(want) && got.chaddr() == m.chaddr() {
                    answer = Some(got);
                    break 'tries;
                }
                if kind(&got) == Some(MessageType::Nak) {
                    break 'tries;
                }
            }
        }
        self.waiting.lock().unwrap().remove(&m.xid());
        answer
    }
}

fn kind(m: &Message) -> Option<MessageType> {
    match m.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(k)) => Some(*k),
        _ => None,
    }
}

/// A lease's answer: the address, the server's, and the boot file.
struct Leased {
    address: Ipv4Addr,
    server: Ipv4Addr,
    file: String,
}

/// A BIOS PXE client's (or, `ipxe`, iPXE's) message of `kind`.
fn message(xid: u32, mac: [u8; 6], kind: MessageType, ipxe: bool) -> Message {
    let any = Ipv4Addr::UNSPECIFIED;
    let mut m = Message::new_with_id(xid, any, any, any, any, &mac);
    m.set_flags(Flags::default().set_broadcast());
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(kind));
    o.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
    ));
    o.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(0)));
    o.insert(DhcpOption::ClientNetworkInterface(1, 2, 1));
    let mut uuid = vec![0u8];
    uuid.extend_from_slice(&[0x5e; 10]);
    uuid.extend_from_slice(&mac);
    o.insert(DhcpOption::ClientMachineIdentifier(uuid));
    o.insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::TFTPServerName,
        OptionCode::BootfileName,
        OptionCode::VendorExtensions,
        OptionCode::ClassIdentifier,
    ]));
    if ipxe {
        o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    }
    m
}

/// Discover, then request what was offered: the lease and its boot file.
async fn lease(link: &ProvisioningLink, mac: [u8; 6], ipxe: bool) -> Result<Leased, String> {
    let waits: &[u64] = if ipxe { &IPXE_WAITS } else { &ROM_WAITS };
    let who = if ipxe { "iPXE" } else { "the PXE ROM" };
    let discover = message(rand::random(), mac, MessageType::Discover, ipxe);
    let offer = link
        .exchange(&discover, MessageType::Offer, waits)
        .await
        .ok_or_else(|| format!("{who}: no DHCP offer"))?;
    let server = match offer.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(s)) => *s,
        _ => offer.siaddr(),
    };
    let mut request = message(rand::random(), mac, MessageType::Request, ipxe);
    request
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(offer.yiaddr()));
    request
        .opts_mut()
        .insert(DhcpOption::ServerIdentifier(server));
    let ack = link
        .exchange(&request, MessageType::Ack, waits)
        .await
        .ok_or_else(|| format!("{who}: no DHCP acknowledgement of {}", offer.yiaddr()))?;
    let file = match ack.opts().get(OptionCode::BootfileName) {
        Some(DhcpOption::BootfileName(f)) => String::from_utf8_lossy(f).into_owned(),
        _ => String::from_utf8_lossy(ack.fname().unwrap_or_default()).into_owned(),
    };
    let file = file.trim_end_matches('\0').to_string();
    if file.is_empty() {
        return Err(format!("{who}: the DHCP answer names no boot file"));
    }
    let next = if ack.siaddr().is_unspecified() {
        server
    } else {
        ack.siaddr()
    };
    Ok(Leased {
        address: ack.yiaddr(),
        server: next,
        file,
    })
}

/// `name` from the TFTP server `server`, from the address `from`, with
/// `blksize` and `tsize` as PXE ROMs ask: its bytes, checked against the
/// `tsize` the server gave.
async fn tftp_get(from: Ipv4Addr, server: Ipv4Addr, name: &str) -> Result<Vec<u8>, String> {
    let sock = UdpSocket::bind(SocketAddrV4::new(from, 0))
        .await
        .map_err(|e| format!("TFTP from {from}: {e}"))?;
    let mut rrq = vec![0, 1];
    for part in [name, "octet", "blksize", "1428", "tsize", "0"] {
        rrq.extend_from_slice(part.as_bytes());
        rrq.push(0);
    }
    let fail = |why: String| format!("TFTP {name} from {server}: {why}");
    let mut to = SocketAddr::from((server, 69));
    let mut last = rrq;
    let (mut data, mut block, mut blksize, mut tsize) = (Vec::new(), 0u16, 512usize, None);
    let mut buf = vec![0u8; 65536];
    loop {
        let mut tries = 0;
        let (n, peer) = loop {
            sock.send_to(&last, to)
                .await
                .map_err(|e| fail(e.to_string()))?;
            match tokio::time::timeout(TFTP_WAIT, sock.recv_from(&mut buf)).await {
                Ok(Ok(x)) => break x,
                Ok(Err(e)) => return Err(fail(e.to_string())),
                Err(_) if tries < 5 => tries += 1,
                Err(_) => return Err(fail("no answer".into())),
            }
        };
        to = peer;
        let p = &buf[..n];
        match u16::from_be_bytes([p[0], p.get(1).copied().unwrap_or(0)]) {
            // OACK: the options taken.
            6 => {
                let fields: Vec<&[u8]> = p[2..].split(|b| *b == 0).collect();
                for pair in fields.chunks(2) {
                    if let [k, v] = pair {
                        let v: Option<usize> =
                            std::str::from_utf8(v).ok().and_then(|v| v.parse().ok());
                        match (&k.to_ascii_lowercase()[..], v) {
                            (b"blksize", Some(v)) => blksize = v,
                            (b"tsize", Some(v)) => tsize = Some(v),
                            _ => {}
                        }
                    }
                }
                last = vec![0, 4, 0, 0];
            }
            3 if p.len() >= 4 => {
                let got = u16::from_be_bytes([p[2], p[3]]);
                if got == block.wrapping_add(1) {
                    block = got;
                    data.extend_from_slice(&p[4..]);
                    last = vec![0, 4, p[2], p[3]];
                    if p.len() - 4 < blksize {
                        sock.send_to(&last, to)
                            .await
                            .map_err(|e| fail(e.to_string()))?;
                        break;
                    }
                }
            }
            5 => {
                let msg = String::from_utf8_lossy(&p[4.min(p.len())..]);
                return Err(fail(format!("refused: {}", msg.trim_end_matches('\0'))));
            }
            _ => return Err(fail("an unexpected packet".into())),
        }
    }
    match tsize {
        Some(t) if t != data.len() => Err(fail(format!(
            "{} bytes received, tsize said {t}",
            data.len()
        ))),
        _ => Ok(data),
    }
}

/// `GET url` over HTTP/1.1 from the address `from`, as iPXE fetches: the
/// body, which must be as long as its `Content-Length`.
async fn http_get(from: Ipv4Addr, url: &str) -> Result<Vec<u8>, String> {
    let fail = |why: String| format!("GET {url}: {why}");
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| fail("not an http:// URL".into()))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr: SocketAddr = host.parse().map_err(|e| fail(format!("{host}: {e}")))?;
    let fetch = async {
        let sock = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
        sock.bind(SocketAddr::from((from, 0)))
            .map_err(|e| format!("binding {from}: {e}"))?;
        let mut stream = sock.connect(addr).await.map_err(|e| e.to_string())?;
        let req = format!(
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: iPXE/1.21.1\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        stream
            .read_to_end(&mut all)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(all)
    };
    let all = tokio::time::timeout(HTTP_TIMEOUT, fetch)
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(fail)?;
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| fail("no header end".into()))?;
    let head = String::from_utf8_lossy(&all[..end]);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(fail(format!("answered {status}")));
    }
    let body = all[end + 4..].to_vec();
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    match length {
        Some(n) if n == body.len() => Ok(body),
        Some(n) => Err(fail(format!("{} bytes of {n}", body.len()))),
        None => Err(fail("no Content-Length".into())),
    }
}

/// The URLs of iPXE's `kernel` and `initrd` commands in `script`.
fn script_urls(script: &str) -> Option<(String, String)> {
    let url = |cmd: &str| {
        script.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == cmd).then(|| words.find(|w| w.starts_with("http://")))?
        })
    };
    Some((url("kernel")?.to_string(), url("initrd")?.to_string()))
}

/// The file `name` of the last newc archive in `initrd` (the boot's data
/// appended after the image's own archives, as the kernel unpacks them:
/// the last entry of a name wins).
pub fn newc_file(initrd: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut found = None;
    let mut at = 0;
    while let Some(off) = initrd[at..].windows(6).position(|w| w == b"070701") {
        let h = at + off;
        let field = |i: usize| {
            std::str::from_utf8(initrd.get(h + 6 + i * 8..h + 14 + i * 8)?)
                .ok()
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .map(|v| v as usize)
        };
        let (Some(size), Some(namesize)) = (field(6), field(11)) else {
            at = h + 6;
            continue;
        };
        let name_at = h + 110;
        let data_at = (name_at + namesize).div_ceil(4) * 4;
        let entry = initrd
            .get(name_at..name_at + namesize.saturating_sub(1))
            .map(|n| n == name.as_bytes());
        if entry == Some(true) {
            found = initrd.get(data_at..data_at + size).map(<[u8]>::to_vec);
        }
        at = if entry.is_some() && data_at + size <= initrd.len() {
            (data_at + size).div_ceil(4) * 4
        } else {
            h + 6
        };
    }
    found
}

/// One machine's network boot, from power on to the kernel reading the
/// boot's data: that data (an encoded `BootData`).
pub async fn boot(link: &ProvisioningLink, mac: [u8; 6]) -> Result<Vec<u8>, String> {
    let c = &link.counts;
    c.started.fetch_add(1, Ordering::Relaxed);
    let booted = async {
        let rom = lease(link, mac, false).await?;
        if rom.file.starts_with("http://") {
            return Err(format!("the PXE ROM was offered {} (a URL)", rom.file));
        }
        let ipxe = tftp_get(rom.address, rom.server, &rom.file).await?;
        c.tftp_bytes.fetch_add(ipxe.len() as u64, Ordering::Relaxed);
        let chained = lease(link, mac, true).await?;
        let script = http_get(chained.address, &chained.file).await?;
        let script = String::from_utf8_lossy(&script).into_owned();
        let (kernel, initrd) = script_urls(&script)
            .ok_or_else(|| format!("{}: no kernel and initrd in the script", chained.file))?;
        let kernel = http_get(chained.address, &kernel).await?;
        let initrd = http_get(chained.address, &initrd).await?;
        c.http_bytes.fetch_add(
            (script.len() + kernel.len() + initrd.len()) as u64,
            Ordering::Relaxed,
        );
        newc_file(&initrd, "shepherd/boot-data")
            .ok_or_else(|| "the initramfs holds no shepherd/boot-data".to_string())
    }
    .await;
    match &booted {
        Ok(_) => c.booted.fetch_add(1, Ordering::Relaxed),
        Err(_) => c.failed.fetch_add(1, Ordering::Relaxed),
    };
    booted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(out: &mut Vec<u8>, name: &str, data: &[u8]) {
        out.extend_from_slice(
            format!(
                "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
                1, 0o100600, 0, 0, 1, 0, data.len(), 0, 0, 0, 0, name.len() + 1, 0
            )
            .as_bytes(),
        );
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.resize(out.len().div_ceil(4) * 4, 0);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(4) * 4, 0);
    }

    #[test]
    fn the_last_archive_s_file_is_found_past_bytes_that_look_like_headers() {
        let mut initrd = b"random 070701 bytes of the image's own".to_vec();
        initrd.resize(4096, 7);
        entry(&mut initrd, "shepherd/boot-data", b"old");
        entry(&mut initrd, "TRAILER!!!", b"");
        entry(&mut initrd, "shepherd", b"");
        entry(&mut initrd, "shepherd/boot-data", b"the boot's data");
        entry(&mut initrd, "TRAILER!!!", b"");
        initrd.resize(initrd.len() + 512, 0);
        assert_eq!(
            newc_file(&initrd, "shepherd/boot-data").as_deref(),
            Some(&b"the boot's data"[..])
        );
        assert_eq!(newc_file(&initrd, "shepherd/other"), None);
    }

    #[test]
    fn the_script_s_kernel_and_initrd_urls_are_read() {
        let s = "#!ipxe\nkernel http://10.0.0.1:8067/boot/x/vmlinuz initrd=initrd quiet || goto refused\n\
                 initrd --name initrd http://10.0.0.1:8067/boot/x/initrd || goto refused\nboot\n";
        assert_eq!(
            script_urls(s),
            Some((
                "http://10.0.0.1:8067/boot/x/vmlinuz".into(),
                "http://10.0.0.1:8067/boot/x/initrd".into()
            ))
        );
    }
}
