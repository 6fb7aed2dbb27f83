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
//! - [`dhcp`]: what a request is and what it gets, on bytes.
//! - [`tftp`]: read-only TFTP of the iPXE binaries.
//! - [`http`]: the script, the kernel, the initramfs with the boot's data.
//! - `metrics.rs`: what `/metrics` counts of them.
//!
//! `NetbootService` is the actor the Supervisor starts when `[netboot]`
//! is configured; it owns the sockets' tasks and the HTTP server, and
//! stops them when it stops.

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
use dhcproto::v4::MessageType;
use tokio::net::UdpSocket;

use crate::bmdb::Bmdb;
use crate::bmdb::netboot::MacLookup;
use crate::config::{NetbootConfig, NetbootMode};
use crate::images::BootServing;
use dhcp::{Asker, BootFile, Lease, Request};
pub use metrics::NetbootMetrics;

/// The provisioning interface's IPv4 address and netmask.
pub fn interface_address(name: &str) -> Result<(Ipv4Addr, Ipv4Addr), String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("listing interfaces: {e}"))?;
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
        format!("interface {name} has no IPv4 address")
    } else {
        format!("there is no interface {name}")
    })
}

/// A UDP socket on `port` of every address, bound to `device`, that may
/// broadcast.
fn udp_socket(port: u16, device: &str) -> std::io::Result<UdpSocket> {
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

/// What the DHCP and TFTP tasks share.
struct Shared {
    cfg: NetbootConfig,
    bmdb: Bmdb,
    server: Ipv4Addr,
    netmask: Ipv4Addr,
    http_base: String,
    metrics: NetbootMetrics,
    /// What the HTTP side serves, for the same files over TFTP.
    served: http::Served,
    /// Packets handled at once; more are dropped (counted) until one ends.
    inflight: Arc<tokio::sync::Semaphore>,
    discovery: std::cell::RefCell<DiscoveryWindow>,
}

impl Shared {
    /// Whether x86-64 UEFI machines' firmware PXE gets the signed chain:
    /// asked for (`netboot.uefi`) and in the boot image.
    fn signed_chain(&self) -> bool {
        self.cfg.uefi_chain() == crate::config::UefiChain::Shim
            && self
                .served
                .boot
                .image
                .netboot
                .as_ref()
                .is_some_and(|n| n.signed.is_some())
    }
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

/// Which port a packet came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// 67: DHCP broadcasts.
    Dhcp,
    /// 4011: PXE's requests to the proxy (boot server).
    Proxy,
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
            if let Some((bytes, to)) = handle(&shared, &req, peer, port).await {
                if let Err(e) = sock.send_to(&bytes, to).await {
                    tracing::warn!(mac = %req.mac, %to, error = %e, "DHCP answer not sent");
                }
            }
        });
    }
}

/// Where an answer goes: the relay, the client's address, or broadcast.
fn destination(req: &Request, peer: SocketAddr, port: Port) -> SocketAddr {
    let giaddr = req.msg.giaddr();
    if !giaddr.is_unspecified() {
        return SocketAddr::V4(SocketAddrV4::new(giaddr, 67));
    }
    if port == Port::Proxy {
        return peer;
    }
    let ciaddr = req.msg.ciaddr();
    if !ciaddr.is_unspecified() && !dhcp::must_broadcast(req) {
        return SocketAddr::V4(SocketAddrV4::new(ciaddr, 68));
    }
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, 68))
}

/// A BMDB call within two seconds (a PXE ROM waits about four for an
/// answer); Err: counted and not answered.
async fn ask<T>(
    shared: &Shared,
    f: impl AsyncFnMut(&mut crate::bmdb::Tx<'_>) -> Result<T, crate::bmdb::BmdbError>,
) -> Option<T> {
    match tokio::time::timeout(Duration::from_secs(2), shared.bmdb.transact(f)).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            shared.metrics.ignored("bmdb_unavailable");
            tracing::warn!(error = %e, "network boot: the BMDB cannot answer; the client is not answered");
            None
        }
        Err(_) => {
            shared.metrics.ignored("bmdb_unavailable");
            tracing::warn!(
                "network boot: the BMDB did not answer in 2 s; the client is not answered"
            );
            None
        }
    }
}

/// Discovery boots handed out in the last minute (`netboot.discover`).
#[derive(Default)]
struct DiscoveryWindow {
    recent: std::collections::VecDeque<std::time::Instant>,
}

impl DiscoveryWindow {
    /// Whether one more discovery boot fits in `per_minute`; counted if so.
    fn admit(&mut self, per_minute: u32) -> bool {
        let now = std::time::Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= per_minute as usize {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

/// A discovery boot for `req`'s MAC (`netboot.discover`): an unknown MAC
/// enlists as a new `discovered` machine, a discovered one not accepted
/// yet gets a new boot. None: off, over the rate, or the BMDB failed.
async fn discovery_boot(
    shared: &Shared,
    req: &Request,
    machine: Option<uuid::Uuid>,
) -> Option<crate::bmdb::netboot::MacBoot> {
    if !shared.cfg.discover {
        return None;
    }
    if !shared
        .discovery
        .borrow_mut()
        .admit(shared.cfg.discover_per_minute)
    {
        shared.metrics.ignored("discovery_rate");
        tracing::warn!(mac = %req.mac, per_minute = shared.cfg.discover_per_minute, "network boot: discovery boots over netboot.discover_per_minute; this client is not answered now");
        return None;
    }
    let (mac, ttl) = (req.mac, shared.cfg.discover_ttl);
    let firmware = crate::bmdb::discovery::firmware_of_arch(req.asker.arch().unwrap_or(0));
    use crate::bmdb::discovery;
    let boot = ask(shared, async |tx| {
        let machine_id = match machine {
            None => match discovery::enlist(tx, mac, firmware).await? {
                Some(m) => m,
                // Enlisted meanwhile (its other packet, or another shepherd).
                None => {
                    return Ok(match crate::bmdb::netboot::lookup(tx, mac).await? {
                        MacLookup::Boot(b) => Some(b),
                        _ => None,
                    });
                }
            },
            Some(m) if discovery::boot_again(tx, m).await? => m,
            Some(_) => return Ok(None),
        };
        let b = crate::bmdb::boot::issue(tx, machine_id, ttl).await?;
        Ok(Some(crate::bmdb::netboot::MacBoot {
            machine_id,
            boot_id: b.boot_id,
        }))
    })
    .await??;
    shared.metrics.discovered(machine.is_none());
    tracing::info!(%mac, machine = %boot.machine_id, boot = %boot.boot_id, firmware, new = machine.is_none(), "network boot: discovery boot (netboot.discover): the machine enlists as discovered");
    Some(boot)
}

/// The boot file `req`'s MAC is answered with, if any (counted when none).
async fn boot_for(shared: &Shared, req: &Request) -> Option<Option<BootFile>> {
    if req.asker == Asker::Plain {
        return Some(None);
    }
    let mac = req.mac;
    let found = ask(shared, async |tx| {
        crate::bmdb::netboot::lookup(tx, mac).await
    })
    .await?;
    let found = match found {
        MacLookup::Unknown => match discovery_boot(shared, req, None).await {
            Some(b) => MacLookup::Boot(b),
            None => MacLookup::Unknown,
        },
        MacLookup::NoBoot {
            machine_id,
            discovered: true,
        } => match discovery_boot(shared, req, Some(machine_id)).await {
            Some(b) => MacLookup::Boot(b),
            None => found,
        },
        other => other,
    };
    match found {
        MacLookup::Boot(b) => match dhcp::boot_file(
            req.asker,
            b.boot_id,
            &shared.http_base,
            shared.signed_chain(),
        ) {
            Some(f) => {
                tracing::info!(mac = %mac, machine = %b.machine_id, boot = %b.boot_id, file = %f.name(), "network boot answered");
                Some(Some(f))
            }
            None => {
                shared.metrics.ignored("unsupported_arch");
                tracing::warn!(mac = %mac, machine = %b.machine_id, asker = ?req.asker, "network boot: no iPXE binary for this client's architecture");
                Some(None)
            }
        },
        MacLookup::NoBoot { machine_id, .. } => {
            shared.metrics.ignored("no_boot");
            tracing::debug!(mac = %mac, machine = %machine_id, "PXE client with no boot issued: not answered (it boots its disk)");
            Some(None)
        }
        MacLookup::Unknown => {
            shared.metrics.ignored("unknown_mac");
            tracing::debug!(mac = %mac, "PXE client of no machine: not answered");
            Some(None)
        }
    }
}

async fn handle(
    shared: &Shared,
    req: &Request,
    peer: SocketAddr,
    port: Port,
) -> Option<(Vec<u8>, SocketAddr)> {
    let to = destination(req, peer, port);
    let path = |b: &Option<BootFile>| b.as_ref().map(|f| f.path(req.asker)).unwrap_or("none");
    let proxy = shared.cfg.mode == NetbootMode::Proxy || port == Port::Proxy;
    if proxy {
        // Only PXE clients, only with a boot; offers to 67's discovers,
        // acks to 4011's requests.
        let kind = match (port, req.kind) {
            (Port::Dhcp, MessageType::Discover) => MessageType::Offer,
            (Port::Proxy, MessageType::Request | MessageType::Inform) => MessageType::Ack,
            _ => {
                shared.metrics.ignored("not_for_proxy");
                return None;
            }
        };
        if req.asker == Asker::Plain {
            shared.metrics.ignored("not_pxe");
            return None;
        }
        let boot = boot_for(shared, req).await??;
        shared.metrics.answered(kind, boot.path(req.asker));
        return Some((
            dhcp::answer(req, shared.server, kind, None, Some(&boot)),
            to,
        ));
    }
    // mode = "dhcp": addresses for everyone, boots for PXE clients.
    let pool = shared.cfg.pool()?;
    let (first, last) = (pool.first, pool.last);
    let mac = req.mac;
    let lease = |address| Lease {
        address,
        netmask: shared.netmask,
        router: shared.cfg.router,
        dns: shared.cfg.dns.clone(),
        seconds: shared.cfg.lease.as_secs().min(u64::from(u32::MAX)) as u32,
    };
    match req.kind {
        MessageType::Discover => {
            let wanted = req.requested;
            let Some(address) = ask(shared, async |tx| {
                crate::bmdb::netboot::offer(tx, mac, first, last, wanted).await
            })
            .await?
            else {
                shared.metrics.ignored("pool_full");
                tracing::warn!(%mac, range = ?shared.cfg.range, "network boot: no free address for this client");
                return None;
            };
            let boot = boot_for(shared, req).await?;
            shared.metrics.answered(MessageType::Offer, path(&boot));
            Some((
                dhcp::answer(
                    req,
                    shared.server,
                    MessageType::Offer,
                    Some(&lease(address)),
                    boot.as_ref(),
                ),
                to,
            ))
        }
        MessageType::Request => {
            if req.server_id.is_some_and(|s| s != shared.server) {
                // The client took another server's offer: ours goes back.
                shared.metrics.ignored("other_server");
                return None;
            }
            let Some(address) = req
                .requested
                .or_else(|| Some(req.msg.ciaddr()).filter(|a| !a.is_unspecified()))
            else {
                shared.metrics.ignored("malformed");
                return None;
            };
            let lease_for = shared.cfg.lease;
            let granted = ask(shared, async |tx| {
                crate::bmdb::netboot::grant(tx, mac, address, first, last, lease_for).await
            })
            .await?;
            match granted {
                Some(a) => {
                    let boot = boot_for(shared, req).await?;
                    shared.metrics.answered(MessageType::Ack, path(&boot));
                    tracing::info!(%mac, address = %a, "network boot: address leased");
                    Some((
                        dhcp::answer(
                            req,
                            shared.server,
                            MessageType::Ack,
                            Some(&lease(a)),
                            boot.as_ref(),
                        ),
                        to,
                    ))
                }
                None => {
                    shared.metrics.answered(MessageType::Nak, "none");
                    tracing::info!(%mac, %address, "network boot: address refused (not in the range or someone else's)");
                    let to = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
                    Some((
                        dhcp::answer(req, shared.server, MessageType::Nak, None, None),
                        to,
                    ))
                }
            }
        }
        MessageType::Release | MessageType::Decline => {
            let address = if req.kind == MessageType::Decline {
                req.requested?
            } else {
                req.msg.ciaddr()
            };
            ask(shared, async |tx| {
                crate::bmdb::netboot::release(tx, mac, address).await
            })
            .await;
            None
        }
        MessageType::Inform => {
            let boot = boot_for(shared, req).await?;
            shared.metrics.answered(MessageType::Ack, path(&boot));
            Some((
                dhcp::answer(req, shared.server, MessageType::Ack, None, boot.as_ref()),
                to,
            ))
        }
        _ => {
            shared.metrics.ignored("not_a_request");
            None
        }
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
            let resolve = |name: String| tftp_file(&shared, name);
            if let Some((ended, file)) =
                tftp::serve_request(&packet, peer, local, device, resolve).await
            {
                shared.metrics.tftp(&file, ended.as_str());
            }
        });
    }
}

/// The file a TFTP request names: an iPXE binary, the network GRUB's
/// shared configuration, or a file of a boot being served (its name in
/// the metrics, and its bytes).
async fn tftp_file(shared: &Shared, name: String) -> Result<(String, Vec<u8>), tftp::Refusal> {
    use files::{BootPart, Named, Unserved};
    let (boot_id, part) = match files::name(&name) {
        Named::Nothing => return tftp::ipxe_binary(&shared.cfg.tftp_root, &name).await,
        Named::MacGrubConfig(mac) => {
            let found = ask(shared, async |tx| {
                crate::bmdb::netboot::lookup(tx, mac).await
            })
            .await
            .ok_or_else(|| tftp::refuse(0, "the BMDB cannot answer now"))?;
            match found {
                MacLookup::Boot(b) => (b.boot_id, BootPart::GrubConfig),
                _ => {
                    return Err(tftp::refuse(
                        1,
                        format!("{mac}: no boot is served to this MAC"),
                    ));
                }
            }
        }
        Named::SharedGrubConfig => {
            return Ok((
                "grub-config".to_string(),
                files::shared_grub_config().into_bytes(),
            ));
        }
        Named::Boot(_, BootPart::Script | BootPart::Iso) => {
            return Err(tftp::refuse(1, format!("{name}: served over HTTP only")));
        }
        Named::Boot(id, part) => (id, part),
    };
    let refused = |why: Unserved| {
        let code = if matches!(why, Unserved::NoSuchBoot | Unserved::NotInImage(_)) {
            1
        } else {
            0
        };
        tftp::refuse(code, why.to_string())
    };
    let s = &shared.served;
    let issued = http::live_boot(s, boot_id).await.map_err(refused)?;
    let source = files::source(
        part,
        &s.boot,
        &issued,
        &s.ca_der,
        |_| String::new(),
        shared.server,
    )
    .map_err(refused)?;
    let data = files::read_whole(source)
        .await
        .map_err(|e| refused(Unserved::Failed(format!("{name}: {e}"))))?;
    tracing::info!(boot = %boot_id, machine = %issued.machine_id, what = part.as_str(), bytes = data.len(), "network boot file sent over TFTP");
    Ok((part.as_str().to_string(), data))
}
