//! What the network boot service answers: each DHCP request (proxy or
//! full DHCP, a boot file for a machine with a boot issued, a discovery
//! boot for an unknown MAC) and each TFTP name (an iPXE binary, the signed
//! chain's files). The sockets and the actor that own these are in
//! `mod.rs`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use dhcproto::v4::MessageType;

use super::dhcp::{self, Asker, BootFile, Lease, Request};
use super::metrics::NetbootMetrics;
use super::{files, http, tftp};
use crate::bmdb::Bmdb;
use crate::bmdb::netboot::MacLookup;
use crate::config::{NetbootConfig, NetbootMode};

/// What the DHCP and TFTP tasks share.
pub(super) struct Shared {
    pub(super) cfg: NetbootConfig,
    pub(super) bmdb: Bmdb,
    pub(super) server: Ipv4Addr,
    pub(super) netmask: Ipv4Addr,
    pub(super) http_base: String,
    pub(super) metrics: NetbootMetrics,
    /// What the HTTP side serves, for the same files over TFTP.
    pub(super) served: http::Served,
    /// Packets handled at once; more are dropped (counted) until one ends.
    pub(super) inflight: Arc<tokio::sync::Semaphore>,
    pub(super) discovery: std::cell::RefCell<DiscoveryWindow>,
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

/// Which port a packet came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Port {
    /// 67: DHCP broadcasts.
    Dhcp,
    /// 4011: PXE's requests to the proxy (boot server).
    Proxy,
}

/// Where an answer goes: the relay, the client's address, or broadcast.
pub(super) fn destination(req: &Request, peer: SocketAddr, port: Port) -> SocketAddr {
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
pub(super) struct DiscoveryWindow {
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

pub(super) async fn handle(
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

/// The file a TFTP request names: an iPXE binary, the network GRUB's
/// shared configuration, or a file of a boot being served (its name in
/// the metrics, and its bytes).
pub(super) async fn tftp_file(
    shared: &Shared,
    name: String,
) -> Result<(String, Vec<u8>), tftp::Refusal> {
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
