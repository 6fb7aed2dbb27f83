//! The BMC's LAN settings, read in-band: the host's IPMI system interface
//! (the kernel's `ipmi_si` and `ipmi_devintf`, `/dev/ipmi0`), as `ipmitool
//! lan print` reads them. A machine that enlisted itself by booting the
//! network reports where its BMC is, so that an operator accepting it
//! knows which BMC to give.
//!
//! Get Channel Info (NetFn App, 0x42) finds the LAN channel (medium
//! 802.3); Get LAN Configuration Parameters (NetFn Transport, 0x02) reads
//! its IP address (parameter 3), the address's source (4) and its MAC
//! (5). The bytes are decoded by pure functions, tested on what a BMC
//! answers; the device is driven by two ioctls.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use shepherd_proto::api::BmcLan;

const NETFN_APP: u8 = 0x06;
const NETFN_TRANSPORT: u8 = 0x0c;
const CMD_GET_CHANNEL_INFO: u8 = 0x42;
const CMD_GET_LAN_CONFIG: u8 = 0x02;
/// IPMI's channel medium type for 802.3 LAN.
const MEDIUM_LAN: u8 = 0x04;

/// Where the system interface is, as kernels and udev name it.
const DEVICES: [&str; 3] = ["/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0"];

/// A Get Channel Info answer (completion code first): whether the channel
/// is a LAN channel.
pub fn is_lan_channel(resp: &[u8]) -> bool {
    resp.len() >= 3 && resp[0] == 0 && resp[2] & 0x7f == MEDIUM_LAN
}

/// A Get LAN Configuration Parameters answer's data (after the completion
/// code and the parameter revision), if it succeeded.
fn parameter(resp: &[u8]) -> Option<&[u8]> {
    (resp.len() >= 2 && resp[0] == 0).then(|| &resp[2..])
}

/// Parameter 3, the IP address.
pub fn ipv4_address(resp: &[u8]) -> Option<Ipv4Addr> {
    let d = parameter(resp)?;
    (d.len() >= 4).then(|| Ipv4Addr::new(d[0], d[1], d[2], d[3]))
}

/// Parameter 4, the address's source.
pub fn address_source(resp: &[u8]) -> Option<&'static str> {
    let d = parameter(resp)?;
    Some(match d.first()? & 0x0f {
        0 => "unspecified",
        1 => "static",
        2 => "dhcp",
        3 => "bios",
        _ => "other",
    })
}

/// Parameter 5, the MAC address.
pub fn mac_address(resp: &[u8]) -> Option<Vec<u8>> {
    let d = parameter(resp)?;
    (d.len() >= 6).then(|| d[..6].to_vec())
}

/// The BMC's LAN channel, from the answers of one channel's three
/// parameters.
pub fn decode(channel: u8, ip: &[u8], source: &[u8], mac: &[u8]) -> Option<BmcLan> {
    Some(BmcLan {
        channel: u32::from(channel),
        ipv4_address: ipv4_address(ip)?.to_string(),
        address_source: address_source(source).unwrap_or("unspecified").to_string(),
        mac: mac_address(mac).unwrap_or_default(),
    })
}

// The kernel's IPMI device interface (include/uapi/linux/ipmi.h).
#[repr(C)]
struct SystemInterfaceAddr {
    addr_type: libc::c_int,
    channel: libc::c_short,
    lun: libc::c_uchar,
}
const SYSTEM_INTERFACE_ADDR_TYPE: libc::c_int = 0x0c;
const BMC_CHANNEL: libc::c_short = 0x0f;

#[repr(C)]
struct IpmiMsg {
    netfn: libc::c_uchar,
    cmd: libc::c_uchar,
    data_len: libc::c_ushort,
    data: *mut libc::c_uchar,
}

#[repr(C)]
struct IpmiReq {
    addr: *mut libc::c_uchar,
    addr_len: libc::c_uint,
    msgid: libc::c_long,
    msg: IpmiMsg,
}

#[repr(C)]
struct IpmiRecv {
    recv_type: libc::c_int,
    addr: *mut libc::c_uchar,
    addr_len: libc::c_uint,
    msgid: libc::c_long,
    msg: IpmiMsg,
}

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | ((b'i' as u64) << 8) | nr
}
const IPMICTL_RECEIVE_MSG_TRUNC: u64 = ioc(3, 11, std::mem::size_of::<IpmiRecv>());
const IPMICTL_SEND_COMMAND: u64 = ioc(2, 13, std::mem::size_of::<IpmiReq>());
const RESPONSE_RECV_TYPE: libc::c_int = 1;

/// One command to the BMC: its answer (completion code first).
fn command(
    dev: &std::fs::File,
    msgid: libc::c_long,
    netfn: u8,
    cmd: u8,
    data: &[u8],
    wait: Duration,
) -> std::io::Result<Vec<u8>> {
    let fd = dev.as_raw_fd();
    let mut addr = SystemInterfaceAddr {
        addr_type: SYSTEM_INTERFACE_ADDR_TYPE,
        channel: BMC_CHANNEL,
        lun: 0,
    };
    let mut data = data.to_vec();
    let mut req = IpmiReq {
        addr: (&mut addr as *mut SystemInterfaceAddr).cast(),
        addr_len: std::mem::size_of::<SystemInterfaceAddr>() as libc::c_uint,
        msgid,
        msg: IpmiMsg {
            netfn,
            cmd,
            data_len: data.len() as libc::c_ushort,
            data: data.as_mut_ptr(),
        },
    };
    // SAFETY: `req` and what it points to live across the call; the
    // kernel copies them in.
    if unsafe { libc::ioctl(fd, IPMICTL_SEND_COMMAND as _, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the BMC did not answer in-band",
            ));
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as libc::c_int) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            continue;
        }
        let mut raddr = [0u8; 64];
        let mut buf = [0u8; 64];
        let mut recv = IpmiRecv {
            recv_type: 0,
            addr: raddr.as_mut_ptr(),
            addr_len: raddr.len() as libc::c_uint,
            msgid: 0,
            msg: IpmiMsg {
                netfn: 0,
                cmd: 0,
                data_len: buf.len() as libc::c_ushort,
                data: buf.as_mut_ptr(),
            },
        };
        // SAFETY: the buffers outlive the call; their lengths are given.
        if unsafe { libc::ioctl(fd, IPMICTL_RECEIVE_MSG_TRUNC as _, &mut recv) } < 0 {
            let e = std::io::Error::last_os_error();
            // EMSGSIZE: truncated, which our three parameters never are.
            if e.raw_os_error() != Some(libc::EMSGSIZE) {
                return Err(e);
            }
        }
        if recv.recv_type == RESPONSE_RECV_TYPE && recv.msgid == msgid {
            let len = (recv.msg.data_len as usize).min(buf.len());
            return Ok(buf[..len].to_vec());
        }
    }
}

/// The BMC's LAN channel as the host reads it in-band. Ok(None): no IPMI
/// system interface (no BMC, or the kernel's IPMI drivers not loaded), or
/// no LAN channel; Err: the BMC failed to answer.
pub fn read() -> Result<Option<BmcLan>, String> {
    let Some((path, dev)) = DEVICES.iter().find_map(|p| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .ok()
            .map(|f| (*p, f))
    }) else {
        return Ok(None);
    };
    let wait = Duration::from_secs(3);
    let mut id: libc::c_long = 0;
    let mut ask = |netfn, cmd, data: &[u8]| {
        id += 1;
        command(&dev, id, netfn, cmd, data, wait)
            .map_err(|e| format!("{path}: NetFn {netfn:#04x} command {cmd:#04x}: {e}"))
    };
    // Channels 1 to 11 are the ones a LAN channel may be.
    for channel in 1u8..=11 {
        let Ok(info) = ask(NETFN_APP, CMD_GET_CHANNEL_INFO, &[channel]) else {
            continue;
        };
        if !is_lan_channel(&info) {
            continue;
        }
        let param = |p: u8| [channel, p, 0, 0];
        let ip = ask(NETFN_TRANSPORT, CMD_GET_LAN_CONFIG, &param(3))?;
        let source = ask(NETFN_TRANSPORT, CMD_GET_LAN_CONFIG, &param(4))?;
        let mac = ask(NETFN_TRANSPORT, CMD_GET_LAN_CONFIG, &param(5))?;
        return Ok(decode(channel, &ip, &source, &mac));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bmcs_answers_decode_as_ipmitool_shows_them() {
        // Get Channel Info for channel 1: LAN (802.3), IPMB-1.0 protocol.
        assert!(is_lan_channel(&[
            0x00, 0x01, 0x04, 0x01, 0x82, 0xf2, 0x1b, 0x00, 0x00
        ]));
        // Channel 7 of the same BMC: the system interface (medium 0x0c).
        assert!(!is_lan_channel(&[0x00, 0x07, 0x0c, 0x05, 0x80]));
        // Invalid channel (completion code 0xcc).
        assert!(!is_lan_channel(&[0xcc]));
        let lan = decode(
            1,
            &[0x00, 0x11, 10, 0, 0, 41],
            &[0x00, 0x11, 0x02],
            &[0x00, 0x11, 0x52, 0x54, 0x00, 0x4e, 0x10, 0x04],
        )
        .unwrap();
        assert_eq!(lan.channel, 1);
        assert_eq!(lan.ipv4_address, "10.0.0.41");
        assert_eq!(lan.address_source, "dhcp");
        assert_eq!(lan.mac, vec![0x52, 0x54, 0x00, 0x4e, 0x10, 0x04]);
        // A refused parameter (0x80: not supported) is no address.
        assert!(decode(1, &[0x80], &[0x00, 0x11, 0x01], &[0x80]).is_none());
        // A short answer neither.
        assert!(ipv4_address(&[0x00, 0x11, 10, 0]).is_none());
        assert_eq!(address_source(&[0x00, 0x11, 0x01]), Some("static"));
        assert_eq!(address_source(&[0x00, 0x11, 0x04]), Some("other"));
    }

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // As include/uapi/linux/ipmi.h defines them on 64-bit Linux.
        #[cfg(target_pointer_width = "64")]
        {
            assert_eq!(IPMICTL_SEND_COMMAND, 0x8028_690d);
            assert_eq!(IPMICTL_RECEIVE_MSG_TRUNC, 0xc030_690b);
        }
    }

    #[test]
    fn no_system_interface_is_no_bmc() {
        if DEVICES.iter().all(|p| !std::path::Path::new(p).exists()) {
            assert_eq!(read(), Ok(None));
        }
    }
}
