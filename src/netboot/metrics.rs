//! The network boot service's counters: DHCP answers by message and boot
//! path, packets not answered by reason, TFTP transfers, HTTP requests.

use dhcproto::v4::MessageType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AnswerLabel {
    message: &'static str,
    path: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TftpLabel {
    file: String,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HttpLabel {
    what: &'static str,
    result: &'static str,
}

/// The service's counters.
#[derive(Clone, Default)]
pub struct NetbootMetrics {
    answers: Family<AnswerLabel, Counter>,
    ignored: Family<ReasonLabel, Counter>,
    tftp: Family<TftpLabel, Counter>,
    http: Family<HttpLabel, Counter>,
    routers: Counter,
    discovery: Family<KindLabel, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

impl NetbootMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "shepherd_netboot_dhcp_answers",
            "DHCP answers sent by the network boot service, by message (offer, ack, nak) and boot path (bios-pxe, uefi-pxe, uefi-shim, uefi-http, ipxe-script; none: an address only)",
            self.answers.clone(),
        );
        registry.register(
            "shepherd_netboot_dhcp_ignored",
            "DHCP packets the network boot service did not answer, by reason (malformed, not_a_request, not_pxe, unknown_mac, no_boot, unsupported_arch, other_server, pool_full, bmdb_unavailable, discovery_rate)",
            self.ignored.clone(),
        );
        registry.register(
            "shepherd_netboot_tftp_transfers",
            "TFTP transfers by file (an iPXE binary, or a boot's shim, grub, grub-config, kernel, initrd) and result (complete, aborted, timed_out, failed)",
            self.tftp.clone(),
        );
        registry.register(
            "shepherd_netboot_router_solicitations_answered",
            "IPv6 router solicitations answered with \"no router here\" (iPXE's IPv6 configuration then ends at once)",
            self.routers.clone(),
        );
        registry.register(
            "shepherd_netboot_discovery_boots",
            "Discovery boots handed out (netboot.discover), by kind (enlisted: an unknown MAC became a discovered machine; again: a discovered machine booted the network again)",
            self.discovery.clone(),
        );
        registry.register(
            "shepherd_netboot_http_requests",
            "Network boot HTTP requests (GET and HEAD) by what (script, kernel, initrd, shim, grub, grub-config, iso, ipxe) and result (served, refused, unavailable, failed)",
            self.http.clone(),
        );
    }

    pub(super) fn answered(&self, message: MessageType, path: &'static str) {
        let message = match message {
            MessageType::Offer => "offer",
            MessageType::Ack => "ack",
            MessageType::Nak => "nak",
            _ => "other",
        };
        self.answers
            .get_or_create(&AnswerLabel { message, path })
            .inc();
    }

    pub(super) fn ignored(&self, reason: &'static str) {
        self.ignored.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(super) fn tftp(&self, file: &str, result: &'static str) {
        let file = if super::tftp::SERVED.contains(&file)
            || super::files::BootPart::ALL
                .iter()
                .any(|p| p.as_str() == file)
        {
            file
        } else {
            "other"
        };
        self.tftp
            .get_or_create(&TftpLabel {
                file: file.to_string(),
                result,
            })
            .inc();
    }

    pub(super) fn discovered(&self, new: bool) {
        let kind = if new { "enlisted" } else { "again" };
        self.discovery.get_or_create(&KindLabel { kind }).inc();
    }

    pub(super) fn router_answered(&self) {
        self.routers.inc();
    }

    pub(crate) fn http(&self, what: &'static str, result: &'static str) {
        self.http.get_or_create(&HttpLabel { what, result }).inc();
    }

    /// The count of DHCP answers (all labels), for tests and the pages.
    pub fn answers_total(&self) -> u64 {
        let mut n = 0;
        for message in ["offer", "ack", "nak", "other"] {
            for path in [
                "bios-pxe",
                "uefi-pxe",
                "uefi-shim",
                "uefi-http",
                "ipxe-script",
                "none",
            ] {
                n += self
                    .answers
                    .get_or_create(&AnswerLabel { message, path })
                    .get();
            }
        }
        n
    }
}
