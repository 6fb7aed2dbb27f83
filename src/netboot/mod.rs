//! The network boot service (CONTRACTS.md §6): proxyDHCP (or a full DHCP
//! server on an isolated provisioning network), TFTP for the iPXE
//! binaries, and HTTP for each boot's iPXE script, kernel and initramfs,
//! all on the provisioning interface only.
//!
//! A PXE client is answered only when its MAC is a machine's
//! (`machine_boot_mac`, from the inventory's `mac`/`macs`) and that
//! machine has a boot issued (the Enroller issued it and had the BMC boot
//! the machine from the network). Everything else gets no boot answer, so
//! a machine booting its disk, or one that is not ours, is never diverted;
//! but with `discover = true` an unknown MAC (and a discovered machine not
//! accepted yet) gets a discovery boot, rate-limited, and enlists as a
//! `discovered` machine (`bmdb::discovery`).
//!
//! - `answer.rs`: what each DHCP request and TFTP name gets.
//! - [`dhcp`]: what a request is and what it gets, on bytes.
//! - [`files`]: what one boot's network boot reads, by name.
//! - [`tftp`]: read-only TFTP of the iPXE binaries and the signed chain.
//! - [`http`]: the same boot files over HTTP, the ISO among them.
//! - `metrics.rs`: what `/metrics` counts of them.
//!
//! `NetbootService` is the actor the Supervisor starts when `[netboot]`
//! is configured; it owns the sockets' tasks and the HTTP server, and
//! stops them when it stops.

mod answer;
pub mod dhcp;
pub mod files;
pub mod http;
mod metrics;
pub mod ra;
pub mod tftp;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::UdpSocket;

use crate::bmdb::Bmdb;
use crate::config::NetbootConfig;
use crate::images::BootServing;
use answer::{Port, Shared};
pub use metrics::NetbootMetrics;

/// The provisioning interface that cannot be used: it names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceError {
    #[error("listing interfaces: {0}")]
    Listing(String),
    #[error("there is no interface {0}")]
    Missing(String),
    #[error("interface {0} has no IPv4 address")]
    NoIpv4(String),
}

/// The provisioning interface's IPv4 address and netmask.
pub fn interface_address(name: &str) -> Result<(Ipv4Addr, Ipv4Addr), InterfaceError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| InterfaceError::Listing(e.to_string()))?;
    let mut seen = false;
    for a in addrs {
        if a.interface_name != name {
            continue;
        }
        seen = true;
        let Some(ip) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) else {
            continue;
        };
        let mask = a
            .netmask
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|m| m.ip())
            .unwrap_or(Ipv4Addr::new(255, 255, 255, 0));
        return Ok((ip.ip(), mask));
    }
    Err(if seen {
        InterfaceError::NoIpv4(name.to_string())
    } else {
        InterfaceError::Missing(name.to_string())
    })
}

/// A UDP socket on `port` of every address, bound to `device`, that may
/// broadcast (a DHCP server's or client's).
pub fn udp_socket(port: u16, device: &str) -> std::io::Result<UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.set_reuse_address(true)?;
    s.set_broadcast(true)?;
    s.bind_device(Some(device.as_bytes()))?;
    s.set_nonblocking(true)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)).into())?;
    UdpSocket::from_std(s.into())
}

/// The network boot service.
pub struct NetbootService {
    shared: Rc<Shared>,
    dhcp: Rc<UdpSocket>,
    proxy: Rc<UdpSocket>,
    tftp: Rc<UdpSocket>,
    /// IPv6 router solicitations (None: not answered).
    ra: Option<UdpSocket>,
    http: Option<actix_web::dev::ServerHandle>,
}

/// Where the service listens, once started (for the logs and tests).
#[derive(Debug, Clone)]
pub struct Listening {
    pub server: Ipv4Addr,
    pub http_base: String,
}

impl NetbootService {
    /// Binds the DHCP, proxy and TFTP ports on the provisioning interface
    /// and starts the HTTP server. Err names the key at fault.
    pub fn new(
        cfg: &NetbootConfig,
        bmdb: Bmdb,
        boot: BootServing,
        ca_der: Vec<u8>,
        metrics: NetbootMetrics,
        timeout: Duration,
    ) -> Result<(NetbootService, Listening), crate::ConfigError> {
        use crate::ConfigError;
        let (found, netmask) = interface_address(&cfg.interface)
            .map_err(|e| ConfigError::key("netboot.interface", e))?;
        let server = cfg.address.unwrap_or(found);
        let port = |key: &'static str, p: u16| {
            udp_socket(p, &cfg.interface).map_err(|e| {
                ConfigError::key(
                    format!("netboot.{key}"),
                    format!("UDP port {p} on {}: {e} (binding to an interface needs root or CAP_NET_RAW; ports below 1024 CAP_NET_BIND_SERVICE)", cfg.interface),
                )
            })
        };
        let dhcp = port("dhcp_port", cfg.dhcp_port)?;
        let proxy = port("proxy_port", cfg.proxy_port)?;
        let tftp = port("tftp_port", cfg.tftp_port)?;
        let ra = if cfg.answer_router_solicitations {
            match ra::socket(&cfg.interface) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(interface = %cfg.interface, error = %e, "IPv6 router solicitations are not answered (iPXE then waits about 15 s for a router)");
                    None
                }
            }
        } else {
            None
        };
        let http_port = cfg.http_listen.port();
        let http_base = format!("http://{server}:{http_port}");
        if cfg.uefi_chain() == crate::config::UefiChain::Shim
            && boot
                .image
                .netboot
                .as_ref()
                .is_some_and(|n| n.signed.is_none())
        {
            tracing::warn!(image = %boot.image.path.display(), "netboot.uefi = \"shim\" but the boot image has no signed chain beside it (scripts/boot-image writes .shimx64.efi and .grubnetx64.efi): UEFI machines get iPXE, which a firmware with Secure Boot on refuses");
        }
        let served = http::Served {
            bmdb: bmdb.clone(),
            boot,
            ca_der: Arc::new(ca_der),
            base: http_base.clone(),
            tftp_root: cfg.tftp_root.clone(),
            metrics: metrics.clone(),
            timeout,
            server,
        };
        let http = http::start(served.clone(), cfg.http_listen).map_err(|e| {
            ConfigError::key("netboot.http_listen", format!("{}: {e}", cfg.http_listen))
        })?;
        for f in tftp::SERVED {
            if !cfg.tftp_root.join(f).is_file() && f != "ipxe.pxe" {
                tracing::warn!(file = %cfg.tftp_root.join(f).display(), "an iPXE binary is missing (Debian's ipxe package has it): machines that need it cannot boot");
            }
        }
        let listening = Listening {
            server,
            http_base: http_base.clone(),
        };
        Ok((
            NetbootService {
                shared: Rc::new(Shared {
                    cfg: cfg.clone(),
                    bmdb,
                    server,
                    netmask,
                    http_base,
                    metrics,
                    served,
                    inflight: Arc::new(tokio::sync::Semaphore::new(64)),
                    discovery: Default::default(),
                }),
                dhcp: Rc::new(dhcp),
                proxy: Rc::new(proxy),
                tftp: Rc::new(tftp),
                ra,
                http: Some(http),
            },
            listening,
        ))
    }
}

impl Actor for NetbootService {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let s = &self.shared;
        tracing::info!(
            interface = %s.cfg.interface,
            server = %s.server,
            mode = ?s.cfg.mode,
            http = %s.http_base,
            "network boot service started"
        );
        ctx.spawn(dhcp_loop(self.shared.clone(), self.dhcp.clone(), Port::Dhcp).into_actor(self));
        ctx.spawn(dhcp_loop(self.shared.clone(), self.proxy.clone(), Port::Proxy).into_actor(self));
        ctx.spawn(tftp_loop(self.shared.clone(), self.tftp.clone()).into_actor(self));
        if let Some(sock) = self.ra.take() {
            let metrics = self.shared.metrics.clone();
            ctx.spawn(ra::serve(sock, move || metrics.router_answered()).into_actor(self));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(h) = self.http.take() {
            actix_rt::spawn(async move { h.stop(true).await });
        }
        tracing::info!("network boot service stopped");
    }
}

/// Stops the service: its sockets close, its HTTP server stops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for NetbootService {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

async fn dhcp_loop(shared: Rc<Shared>, sock: Rc<UdpSocket>, port: Port) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, ?port, "DHCP socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let req = match dhcp::read(&buf[..n]) {
            Ok(r) => r,
            Err(d) => {
                shared.metrics.ignored(d.as_str());
                tracing::debug!(%peer, reason = d.as_str(), "DHCP packet dropped");
                continue;
            }
        };
        let Ok(permit) = shared.inflight.clone().try_acquire_owned() else {
            shared.metrics.ignored("busy");
            continue;
        };
        let (shared, sock) = (shared.clone(), sock.clone());
        actix_rt::spawn(async move {
            let _permit = permit;
            if let Some((bytes, to)) = answer::handle(&shared, &req, peer, port).await
                && let Err(e) = sock.send_to(&bytes, to).await
            {
                tracing::warn!(mac = %req.mac, %to, error = %e, "DHCP answer not sent");
            }
        });
    }
}

async fn tftp_loop(shared: Rc<Shared>, sock: Rc<UdpSocket>) {
    let mut buf = vec![0u8; 2048];
    let local = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    loop {
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "TFTP socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = shared.inflight.clone().try_acquire_owned() else {
            continue;
        };
        let packet = buf[..n].to_vec();
        let shared = shared.clone();
        actix_rt::spawn(async move {
            let _permit = permit;
            let device = Some(shared.cfg.interface.as_str());
            let resolve = |name: String| answer::tftp_file(&shared, name);
            if let Some((ended, file)) =
                tftp::serve_request(&packet, peer, local, device, resolve).await
            {
                shared.metrics.tftp(&file, ended.as_str());
            }
        });
    }
}
