//! Which switch port each NIC is cabled to, from the LLDP frames the
//! switch sends on it (IEEE 802.1AB), as Ironic's inspector learns it: a
//! raw socket bound to LLDP's ethertype on the interface, the nearest-
//! bridge multicast address joined, the first frame's chassis ID, port ID,
//! system name and port description. Switches send every 30 s by default
//! (and at once on a change), so a listen is bounded by the caller.

use std::time::{Duration, Instant};

/// LLDP's ethertype.
const ETHERTYPE: u16 = 0x88cc;
/// The nearest-bridge group address switches send LLDP to.
const NEAREST_BRIDGE: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];

/// What a switch says of the port a NIC is on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbour {
    pub chassis_id: String,
    pub chassis_id_subtype: u8,
    pub port_id: String,
    pub port_id_subtype: u8,
    pub system_name: String,
    pub port_description: String,
}

/// An ID TLV's value: a MAC address (subtype `mac`) as `aa:bb:…`, a
/// network address as bytes in hex, anything else as text.
fn id_text(subtype: u8, mac: u8, value: &[u8]) -> String {
    if subtype == mac && value.len() == 6 {
        return value
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
    }
    match std::str::from_utf8(value) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => value.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// A whole Ethernet frame read as LLDP: None if it is not one, or lacks
/// the chassis or port ID.
pub fn parse(frame: &[u8]) -> Option<Neighbour> {
    if frame.len() < 14 || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE {
        return None;
    }
    let mut n = Neighbour::default();
    let (mut chassis, mut port) = (false, false);
    let mut rest = &frame[14..];
    while rest.len() >= 2 {
        let head = u16::from_be_bytes([rest[0], rest[1]]);
        let (kind, len) = ((head >> 9) as u8, usize::from(head & 0x1ff));
        let value = rest.get(2..2 + len)?;
        rest = &rest[2 + len..];
        match kind {
            0 => break,
            1 if !value.is_empty() => {
                n.chassis_id_subtype = value[0];
                n.chassis_id = id_text(value[0], 4, &value[1..]);
                chassis = true;
            }
            2 if !value.is_empty() => {
                n.port_id_subtype = value[0];
                n.port_id = id_text(value[0], 3, &value[1..]);
                port = true;
            }
            4 => n.port_description = String::from_utf8_lossy(value).into_owned(),
            5 => n.system_name = String::from_utf8_lossy(value).into_owned(),
            _ => {}
        }
    }
    (chassis && port).then_some(n)
}

/// Listens on interface `name` for an LLDP frame, up to `within`: the
/// first neighbour heard, None if none spoke. Needs CAP_NET_RAW.
pub fn listen(name: &str, within: Duration) -> std::io::Result<Option<Neighbour>> {
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::other(format!("{name:?} is not an interface name")))?;
    // SAFETY: plain libc calls on a socket this function owns and closes;
    // every structure passed is initialised and sized as the call expects.
    unsafe {
        let index = libc::if_nametoindex(c_name.as_ptr());
        if index == 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(ETHERTYPE.to_be()),
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let close = |e: std::io::Error| {
            libc::close(fd);
            Err(e)
        };
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETHERTYPE.to_be();
        sll.sll_ifindex = index as i32;
        if libc::bind(
            fd,
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        ) < 0
        {
            return close(std::io::Error::last_os_error());
        }
        let mut mr: libc::packet_mreq = std::mem::zeroed();
        mr.mr_ifindex = index as i32;
        mr.mr_type = libc::PACKET_MR_MULTICAST as u16;
        mr.mr_alen = 6;
        mr.mr_address[..6].copy_from_slice(&NEAREST_BRIDGE);
        if libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mr as *const libc::packet_mreq as *const libc::c_void,
            std::mem::size_of::<libc::packet_mreq>() as u32,
        ) < 0
        {
            return close(std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 1600];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                libc::close(fd);
                return Ok(None);
            }
            let tv = libc::timeval {
                tv_sec: left.as_secs() as libc::time_t,
                tv_usec: libc::suseconds_t::from(left.subsec_micros().max(1)),
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            let n = libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0);
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::Interrupted => continue,
                    _ => return close(e),
                }
            }
            if let Some(neighbour) = parse(&buf[..n as usize]) {
                libc::close(fd);
                return Ok(Some(neighbour));
            }
        }
    }
}

/// What was learned, by interface name, and how often it changed.
static LEARNED: std::sync::Mutex<Vec<(String, Neighbour)>> = std::sync::Mutex::new(Vec::new());
static CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The neighbour learned on interface `name`, for the hardware report.
pub fn learned(name: &str) -> Option<shepherd_proto::api::LldpNeighbor> {
    LEARNED
        .lock()
        .unwrap()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, x)| shepherd_proto::api::LldpNeighbor {
            chassis_id: x.chassis_id.clone(),
            port_id: x.port_id.clone(),
            system_name: x.system_name.clone(),
            port_description: x.port_description.clone(),
        })
}

/// How many times something new was learned: the hardware report is sent
/// again when this changes.
pub fn changes() -> u64 {
    CHANGES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The physical interfaces (those with a device) whose link is up.
pub fn physical_interfaces() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            let d = std::path::Path::new("/sys/class/net").join(n);
            d.join("device").exists()
                && std::fs::read_to_string(d.join("carrier")).is_ok_and(|c| c.trim() == "1")
        })
        .collect()
}

/// Listens on each of `interfaces` (a thread each) for up to `within`,
/// keeping what each hears; a failure (no CAP_NET_RAW, an interface gone)
/// is logged and that interface left unlearned.
pub fn learn_in_background(
    interfaces: Vec<String>,
    within: Duration,
    log: impl Fn(String) + Send + Sync + 'static,
) {
    let log = std::sync::Arc::new(log);
    for name in interfaces {
        let log = log.clone();
        std::thread::spawn(move || match listen(&name, within) {
            Ok(Some(n)) => {
                log(format!(
                    "{name}: LLDP says switch {} port {}",
                    if n.system_name.is_empty() {
                        &n.chassis_id
                    } else {
                        &n.system_name
                    },
                    n.port_id
                ));
                let mut all = LEARNED.lock().unwrap();
                all.retain(|(x, _)| *x != name);
                all.push((name, n));
                CHANGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(None) => log(format!(
                "{name}: no LLDP heard within {}",
                humantime::format_duration(within)
            )),
            Err(e) => log(format!("{name}: cannot listen for LLDP: {e}")),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(kind: u8, value: &[u8]) -> Vec<u8> {
        let head = (u16::from(kind) << 9) | value.len() as u16;
        let mut v = head.to_be_bytes().to_vec();
        v.extend_from_slice(value);
        v
    }

    /// As lldpd sends it: chassis, port, TTL first, the rest in any order.
    #[test]
    fn a_switch_s_frame_names_its_port() {
        let mut f = vec![0x01, 0x80, 0xc2, 0, 0, 0x0e, 2, 0, 0, 0, 0, 1, 0x88, 0xcc];
        f.extend(tlv(1, b"\x07leaf1"));
        f.extend(tlv(2, b"\x07Ethernet1"));
        f.extend(tlv(3, &[0, 120]));
        f.extend(tlv(5, b"leaf1"));
        f.extend(tlv(6, b"leaf1 test switch"));
        f.extend(tlv(4, b"leaf1:Ethernet1 to m1"));
        f.extend(tlv(127, &[0, 0x12, 0x0f, 1, 2]));
        f.extend(tlv(0, &[]));
        let n = parse(&f).unwrap();
        assert_eq!(n.chassis_id, "leaf1");
        assert_eq!(n.port_id, "Ethernet1");
        assert_eq!(n.system_name, "leaf1");
        assert_eq!(n.port_description, "leaf1:Ethernet1 to m1");
        // A MAC chassis ID reads as one; a frame cut short, or without the
        // port, is none.
        let mut m = f[..14].to_vec();
        m.extend(tlv(1, &[4, 0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        m.extend(tlv(2, b"\x05swp3"));
        assert_eq!(parse(&m).unwrap().chassis_id, "52:54:00:12:34:56");
        assert_eq!(parse(&m[..m.len() - 2]), None);
        let mut ip = f[..14].to_vec();
        ip[12] = 0x08;
        assert_eq!(parse(&ip), None);
    }
}
