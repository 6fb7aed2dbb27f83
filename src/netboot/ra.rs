//! IPv6 router solicitations on the provisioning interface, answered with
//! a router advertisement that says "no router here" (router lifetime 0,
//! no prefixes, no flags: nothing for a host to configure).
//!
//! iPXE configures every protocol it knows before it boots (`ifconf`:
//! DHCPv4 and IPv6 router discovery together) and, on a network without an
//! IPv6 router, waits about fifteen seconds for one: measured here, the
//! longest step of a network boot under QEMU. One answer ends that wait.
//! Off with `netboot.answer_router_solicitations = false` (a network whose
//! switches guard against advertisements from hosts, or with a router of
//! its own, gains nothing from it).

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

/// ICMPv6 types (RFC 4861).
const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;

/// The advertisement: type, code, checksum (the kernel's), hop limit,
/// flags, router lifetime 0, reachable time, retransmission timer.
pub fn advertisement() -> [u8; 16] {
    let mut p = [0u8; 16];
    p[0] = ROUTER_ADVERTISEMENT;
    p
}

/// A raw ICMPv6 socket on `interface`, in the all-routers group, sending
/// with hop limit 255 (RFC 4861 drops anything less). Read and written as
/// a datagram socket: on Linux a raw socket's `recvfrom` and `sendto` take
/// the same addresses.
pub fn socket(interface: &str) -> std::io::Result<tokio::net::UdpSocket> {
    let index = nix::net::if_::if_nametoindex(interface).map_err(std::io::Error::from)?;
    let s = socket2::Socket::new(
        socket2::Domain::IPV6,
        socket2::Type::RAW,
        Some(socket2::Protocol::ICMPV6),
    )?;
    s.bind_device(Some(interface.as_bytes()))?;
    s.join_multicast_v6(&"ff02::2".parse::<Ipv6Addr>().expect("an address"), index)?;
    s.set_multicast_hops_v6(255)?;
    s.set_unicast_hops_v6(255)?;
    s.set_multicast_if_v6(index)?;
    s.set_nonblocking(true)?;
    let std: std::net::UdpSocket = s.into();
    tokio::net::UdpSocket::from_std(std)
}

/// Answers solicitations until the socket fails; each answer counted.
pub async fn serve(sock: tokio::net::UdpSocket, answered: impl Fn()) {
    let mut buf = [0u8; 1500];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "IPv6 router solicitations: socket");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        if n < 8 || buf[0] != ROUTER_SOLICITATION || buf[1] != 0 {
            continue;
        }
        // To the solicitor (on its link), else to all nodes.
        let to = match from {
            SocketAddr::V6(a) if !a.ip().is_unspecified() => SocketAddr::V6(a),
            SocketAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(
                "ff02::1".parse().expect("an address"),
                0,
                0,
                a.scope_id(),
            )),
            SocketAddr::V4(_) => continue,
        };
        match sock.send_to(&advertisement(), to).await {
            Ok(_) => {
                answered();
                tracing::debug!(%to, "router solicitation answered: no router here");
            }
            Err(e) => tracing::debug!(%to, error = %e, "router advertisement not sent"),
        }
    }
}
