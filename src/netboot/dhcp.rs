//! DHCP for network boot: what a request is (a PXE ROM, iPXE, UEFI HTTP
//! boot, or a plain client) and the answer it gets. Decoding and encoding
//! are dhcproto's (made for DHCP servers, maintained by the authors of the
//! `dora` DHCP server); what to answer is here, free of sockets, so that it
//! is tested on bytes.
//!
//! - **proxyDHCP** (`mode = "proxy"`): a PXE client whose MAC has a boot
//!   issued gets an offer with no address (`yiaddr` 0), the boot server
//!   and the boot file, vendor class `PXEClient` and PXE discovery control
//!   8 ("boot the file in this offer, no menu, no discovery"); its request
//!   to port 4011 gets the same as an ack. The site's DHCP server hands out
//!   the address.
//! - **full DHCP** (`mode = "dhcp"`): every client gets an address from
//!   the pool (leases in the BMDB), and a PXE client with a boot its boot
//!   file in the same answer.
//! - The boot file: iPXE (user class `iPXE`) gets the boot's script URL,
//!   not the binary again (no boot loop); a PXE ROM the iPXE binary for
//!   its architecture over TFTP (`undionly.kpxe` for BIOS, `snponly.efi`
//!   for x86-64 UEFI); UEFI HTTP boot (`HTTPClient`) the EFI binary's URL.

use std::net::Ipv4Addr;

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode,
};
use dhcproto::{Decodable as _, Encodable as _};

use crate::mac::MacAddr;

/// The largest DHCP packet read; anything longer is dropped.
pub const MAX_PACKET: usize = 1500;

/// Why a packet got no answer before its MAC was looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Not a DHCP message (too short, too long, no magic, bad options).
    Malformed,
    /// A reply, or a request without a message type, or not Ethernet.
    NotARequest,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Malformed => "malformed",
            Dropped::NotARequest => "not_a_request",
        }
    }
}

/// Who asks, as the request's options say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A firmware's PXE client (option 60 `PXEClient…`), of architecture
    /// option 93 (0 BIOS; 7 and 9 x86-64 UEFI).
    Pxe { arch: u16 },
    /// iPXE itself (option 77 `iPXE`): it gets the script.
    Ipxe { arch: u16 },
    /// UEFI HTTP boot (option 60 `HTTPClient…`), architecture 16 for x86-64.
    Http { arch: u16 },
    /// Anything else (an operating system's DHCP client).
    Plain,
}

impl Asker {
    /// The client's architecture (DHCP option 93), for a boot client.
    pub fn arch(self) -> Option<u16> {
        match self {
            Asker::Pxe { arch } | Asker::Ipxe { arch } | Asker::Http { arch } => Some(arch),
            Asker::Plain => None,
        }
    }
}

/// A request, read.
#[derive(Debug, Clone)]
pub struct Request {
    pub msg: Message,
    pub mac: MacAddr,
    pub kind: MessageType,
    pub asker: Asker,
    pub requested: Option<Ipv4Addr>,
    pub server_id: Option<Ipv4Addr>,
}

fn arch_of(msg: &Message, vendor: &[u8]) -> u16 {
    if let Some(DhcpOption::ClientSystemArchitecture(a)) =
        msg.opts().get(OptionCode::ClientSystemArchitecture)
    {
        return u16::from(*a);
    }
    // `PXEClient:Arch:00007:UNDI:003016`: the architecture in the class.
    std::str::from_utf8(vendor)
        .ok()
        .and_then(|v| v.split(':').skip_while(|p| *p != "Arch").nth(1))
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// Whether option 77 names iPXE: RFC 3004's form (length-prefixed
/// classes) or iPXE's own (the bare string).
fn is_ipxe(user_class: &[u8]) -> bool {
    if user_class == b"iPXE" {
        return true;
    }
    let mut rest = user_class;
    while let Some((&n, tail)) = rest.split_first() {
        let n = n as usize;
        if n == 0 || tail.len() < n {
            return false;
        }
        if &tail[..n] == b"iPXE" {
            return true;
        }
        rest = &tail[n..];
    }
    false
}

/// Reads a packet as a client's request. Never panics: dhcproto's
/// decoder is run behind `catch_unwind` too, since a malformed option
/// must cost one packet, not the service.
pub fn read(bytes: &[u8]) -> Result<Request, Dropped> {
    if bytes.len() < 240 || bytes.len() > MAX_PACKET || bytes[236..240] != [99, 130, 83, 99] {
        return Err(Dropped::Malformed);
    }
    let msg = std::panic::catch_unwind(|| Message::from_bytes(bytes))
        .map_err(|_| Dropped::Malformed)?
        .map_err(|_| Dropped::Malformed)?;
    if msg.opcode() != Opcode::BootRequest {
        return Err(Dropped::NotARequest);
    }
    // `chaddr()` slices by the packet's own `hlen`: checked first.
    if msg.hlen() != 6 {
        return Err(Dropped::NotARequest);
    }
    let mac = MacAddr::from_chaddr(u8::from(msg.htype()), msg.hlen(), msg.chaddr())
        .ok_or(Dropped::NotARequest)?;
    let kind = msg.opts().msg_type().ok_or(Dropped::NotARequest)?;
    let vendor: Vec<u8> = match msg.opts().get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(v)) => v.clone(),
        _ => Vec::new(),
    };
    let ipxe = matches!(msg.opts().get(OptionCode::UserClass), Some(DhcpOption::UserClass(u)) if is_ipxe(u));
    let arch = arch_of(&msg, &vendor);
    let asker = if ipxe {
        Asker::Ipxe { arch }
    } else if vendor.starts_with(b"PXEClient") {
        Asker::Pxe { arch }
    } else if vendor.starts_with(b"HTTPClient") {
        Asker::Http { arch }
    } else {
        Asker::Plain
    };
    let requested = match msg.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    };
    let server_id = match msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(a)) => Some(*a),
        _ => None,
    };
    Ok(Request {
        msg,
        mac,
        kind,
        asker,
        requested,
        server_id,
    })
}

/// What a machine with a boot is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootFile {
    /// A file over TFTP (an iPXE binary, or a boot's shim).
    Tftp(String),
    /// A URL (iPXE's script; UEFI HTTP boot's ISO).
    Url(String),
}

impl BootFile {
    pub fn name(&self) -> &str {
        match self {
            BootFile::Tftp(f) => f,
            BootFile::Url(u) => u,
        }
    }

    /// How the machine boots, for the metrics: `bios-pxe`, `uefi-pxe`
    /// (iPXE), `uefi-shim` (the signed chain), `uefi-http` (the ISO),
    /// `ipxe-script`.
    pub fn path(&self, asker: Asker) -> &'static str {
        let shim = matches!(self, BootFile::Tftp(f) if f.ends_with(SHIM));
        match (asker, shim) {
            (Asker::Ipxe { .. }, _) => "ipxe-script",
            (Asker::Http { .. }, _) => "uefi-http",
            (Asker::Pxe { arch: 0 }, _) => "bios-pxe",
            (_, true) => "uefi-shim",
            (_, false) => "uefi-pxe",
        }
    }
}

/// The iPXE binary for a PXE ROM of architecture `arch` (RFC 4578), None
/// for one shepherd has none for.
pub fn ipxe_binary(arch: u16) -> Option<&'static str> {
    match arch {
        0 => Some("undionly.kpxe"),
        7 | 9 | 16 => Some("snponly.efi"),
        _ => None,
    }
}

/// The signed chain's first stage, as its TFTP name ends.
const SHIM: &str = "/shimx64.efi";

/// The boot file for `asker` on boot `boot_id`; `http` is the network
/// boot HTTP server's base (`http://10.0.0.1:8067`); `signed`: x86-64
/// UEFI firmware PXE gets the signed chain (shim over TFTP) instead of
/// iPXE. UEFI HTTP boot always gets the boot's ISO, which the firmware
/// boots as a RAM disk through the ISO's own signed chain (nothing of it
/// depends on the DHCP answer's next server).
pub fn boot_file(asker: Asker, boot_id: uuid::Uuid, http: &str, signed: bool) -> Option<BootFile> {
    use super::files::BootPart;
    match asker {
        Asker::Ipxe { .. } => Some(BootFile::Url(format!(
            "{http}/{}",
            BootPart::Script.path(boot_id)
        ))),
        Asker::Pxe { arch: 7 | 9 } if signed => Some(BootFile::Tftp(BootPart::Shim.path(boot_id))),
        Asker::Pxe { arch } => ipxe_binary(arch).map(|f| BootFile::Tftp(f.to_string())),
        Asker::Http { arch: 16 } => Some(BootFile::Url(format!(
            "{http}/{}",
            BootPart::Iso.path(boot_id)
        ))),
        Asker::Http { .. } | Asker::Plain => None,
    }
}

/// An address lease in `mode = "dhcp"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub netmask: Ipv4Addr,
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub seconds: u32,
}

/// The answer to `req` from `server`: `kind` (offer, ack, nak), with an
/// address (`lease`: full DHCP) or none (proxyDHCP), and the boot file.
pub fn answer(
    req: &Request,
    server: Ipv4Addr,
    kind: MessageType,
    lease: Option<&Lease>,
    boot: Option<&BootFile>,
) -> Vec<u8> {
    let r = &req.msg;
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_htype(HType::Eth)
        .set_xid(r.xid())
        .set_secs(0)
        .set_flags(r.flags())
        .set_chaddr(&r.chaddr()[..6])
        .set_giaddr(r.giaddr())
        .set_ciaddr(if kind == MessageType::Nak {
            Ipv4Addr::UNSPECIFIED
        } else {
            r.ciaddr()
        });
    m.set_yiaddr(
        lease
            .filter(|_| kind != MessageType::Nak)
            .map(|l| l.address)
            .unwrap_or(Ipv4Addr::UNSPECIFIED),
    );
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(kind));
    o.insert(DhcpOption::ServerIdentifier(server));
    if kind == MessageType::Nak {
        return m.to_vec().unwrap_or_default();
    }
    if let Some(l) = lease {
        o.insert(DhcpOption::SubnetMask(l.netmask));
        o.insert(DhcpOption::AddressLeaseTime(l.seconds));
        o.insert(DhcpOption::Renewal(l.seconds / 2));
        o.insert(DhcpOption::Rebinding(l.seconds / 8 * 7));
        if let Some(r) = l.router {
            o.insert(DhcpOption::Router(vec![r]));
        }
        if !l.dns.is_empty() {
            o.insert(DhcpOption::DomainNameServer(l.dns.clone()));
        }
    }
    if let Some(file) = boot {
        let http = matches!(req.asker, Asker::Http { .. });
        o.insert(DhcpOption::ClassIdentifier(if http {
            b"HTTPClient".to_vec()
        } else {
            b"PXEClient".to_vec()
        }));
        o.insert(DhcpOption::BootfileName(file.name().as_bytes().to_vec()));
        if let BootFile::Tftp(_) = file {
            o.insert(DhcpOption::TFTPServerName(server.to_string().into_bytes()));
        }
        if !http {
            // PXE discovery control (sub-option 6) = 8: boot the file named
            // here; no menu, no boot server discovery.
            o.insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
        }
        // The client's UUID, echoed as the PXE specification asks.
        if let Some(DhcpOption::ClientMachineIdentifier(u)) =
            r.opts().get(OptionCode::ClientMachineIdentifier)
        {
            o.insert(DhcpOption::ClientMachineIdentifier(u.clone()));
        }
        m.set_siaddr(server);
        if file.name().len() < 128 {
            m.set_fname_str(file.name());
        }
    }
    m.to_vec().unwrap_or_default()
}

/// The flags of a reply a client without an address must get by
/// broadcast.
pub fn must_broadcast(req: &Request) -> bool {
    req.msg.flags().broadcast() || req.msg.ciaddr().is_unspecified()
}

/// A broadcast flag set, for tests that pose as clients.
pub fn broadcast_flags() -> Flags {
    Flags::default().set_broadcast()
}

/// Architecture 0 as dhcproto names it, for tests.
pub fn bios() -> Architecture {
    Architecture::Intelx86PC
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opts: Vec<DhcpOption>) -> Vec<u8> {
        let mut m = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &[0x52, 0x54, 0, 0x12, 0x34, 0x56],
        );
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        for o in opts {
            m.opts_mut().insert(o);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn a_pxe_rom_ipxe_and_a_plain_client_are_told_apart() {
        let pxe = read(&request(vec![
            DhcpOption::ClassIdentifier(b"PXEClient:Arch:00000:UNDI:002001".to_vec()),
            DhcpOption::ClientSystemArchitecture(Architecture::Intelx86PC),
        ]))
        .unwrap();
        assert_eq!(pxe.asker, Asker::Pxe { arch: 0 });
        assert_eq!(pxe.mac.to_string(), "52:54:00:12:34:56");
        let efi = read(&request(vec![DhcpOption::ClassIdentifier(
            b"PXEClient:Arch:00007:UNDI:003016".to_vec(),
        )]))
        .unwrap();
        assert_eq!(efi.asker, Asker::Pxe { arch: 7 });
        let ipxe = read(&request(vec![
            DhcpOption::ClassIdentifier(b"PXEClient:Arch:00000:UNDI:002001".to_vec()),
            DhcpOption::UserClass(b"iPXE".to_vec()),
        ]))
        .unwrap();
        assert_eq!(ipxe.asker, Asker::Ipxe { arch: 0 });
        let http = read(&request(vec![DhcpOption::ClassIdentifier(
            b"HTTPClient:Arch:00016:UNDI:003001".to_vec(),
        )]))
        .unwrap();
        assert_eq!(http.asker, Asker::Http { arch: 16 });
        let plain = read(&request(vec![])).unwrap();
        assert_eq!(plain.asker, Asker::Plain);
    }

    #[test]
    fn ipxe_gets_the_script_a_rom_the_binary_for_its_architecture() {
        let b = uuid::Uuid::nil();
        let base = "http://10.0.0.1:8067";
        for signed in [false, true] {
            assert_eq!(
                boot_file(Asker::Ipxe { arch: 7 }, b, base, signed),
                Some(BootFile::Url(format!("{base}/boot/{b}.ipxe")))
            );
            assert_eq!(
                boot_file(Asker::Pxe { arch: 0 }, b, base, signed),
                Some(BootFile::Tftp("undionly.kpxe".into()))
            );
            assert_eq!(boot_file(Asker::Pxe { arch: 11 }, b, base, signed), None);
            assert_eq!(boot_file(Asker::Plain, b, base, signed), None);
        }
        assert_eq!(
            boot_file(Asker::Pxe { arch: 7 }, b, base, false),
            Some(BootFile::Tftp("snponly.efi".into()))
        );
        assert_eq!(
            boot_file(Asker::Http { arch: 16 }, b, base, false),
            Some(BootFile::Url(format!("{base}/boot/{b}.iso")))
        );
    }

    #[test]
    fn uefi_machines_get_the_signed_chain_shim_over_tftp_the_iso_over_http() {
        let b = uuid::Uuid::new_v4();
        let base = "http://10.0.0.1:8067";
        let pxe = boot_file(Asker::Pxe { arch: 7 }, b, base, true).unwrap();
        assert_eq!(pxe, BootFile::Tftp(format!("boot/{b}/shimx64.efi")));
        assert_eq!(pxe.path(Asker::Pxe { arch: 7 }), "uefi-shim");
        let http = boot_file(Asker::Http { arch: 16 }, b, base, true).unwrap();
        assert_eq!(http, BootFile::Url(format!("{base}/boot/{b}.iso")));
        assert_eq!(http.path(Asker::Http { arch: 16 }), "uefi-http");
        assert_eq!(
            BootFile::Tftp("snponly.efi".into()).path(Asker::Pxe { arch: 7 }),
            "uefi-pxe"
        );
    }

    #[test]
    fn a_proxy_offer_has_no_address_and_the_boot_file() {
        let req = read(&request(vec![
            DhcpOption::ClassIdentifier(b"PXEClient:Arch:00000:UNDI:002001".to_vec()),
            DhcpOption::ClientMachineIdentifier(vec![0; 17]),
        ]))
        .unwrap();
        let server = Ipv4Addr::new(10, 0, 0, 1);
        let bytes = answer(
            &req,
            server,
            MessageType::Offer,
            None,
            Some(&BootFile::Tftp("undionly.kpxe".into())),
        );
        let m = Message::from_bytes(&bytes).unwrap();
        assert_eq!(m.opcode(), Opcode::BootReply);
        assert_eq!(m.xid(), req.msg.xid());
        assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(m.siaddr(), server);
        // dhcproto keeps the field's NUL end.
        assert!(m.fname().unwrap().starts_with(b"undionly.kpxe\0"));
        assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
        assert!(matches!(
            m.opts().get(OptionCode::ClassIdentifier),
            Some(DhcpOption::ClassIdentifier(v)) if v == b"PXEClient"
        ));
        assert!(matches!(
            m.opts().get(OptionCode::VendorExtensions),
            Some(DhcpOption::VendorExtensions(v)) if v == &[6, 1, 8, 255]
        ));
        assert!(m.opts().get(OptionCode::ClientMachineIdentifier).is_some());
        assert!(m.opts().get(OptionCode::SubnetMask).is_none());
    }

    #[test]
    fn malformed_packets_are_dropped_not_read() {
        let good = request(vec![DhcpOption::ClassIdentifier(b"PXEClient".to_vec())]);
        assert!(read(&good).is_ok());
        for n in [0, 10, 239, 240, 241, good.len() - 1] {
            let _ = read(&good[..n.min(good.len())]);
        }
        assert_eq!(read(&good[..200]).unwrap_err(), Dropped::Malformed);
        assert_eq!(read(&vec![0u8; 4000]).unwrap_err(), Dropped::Malformed);
        // An option whose length runs past the end; a client network
        // interface option of the wrong length.
        let mut bad = good[..240].to_vec();
        bad.extend_from_slice(&[53, 1, 1, 94, 1, 1, 255]);
        let _ = read(&bad);
        let mut bad = good[..240].to_vec();
        bad.extend_from_slice(&[53, 1, 1, 60, 200, b'P']);
        let _ = read(&bad);
        let mut long_hw = good.clone();
        long_hw[2] = 200; // hlen past chaddr's 16 bytes
        assert_eq!(read(&long_hw).unwrap_err(), Dropped::NotARequest);
        let mut reply = good.clone();
        reply[0] = 2;
        assert_eq!(read(&reply).unwrap_err(), Dropped::NotARequest);
    }
}
