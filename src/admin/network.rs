//! The network as operators see it: a machine's switch ports (in its
//! detail), the switches (`GET /api/v1/switches`).

use serde::Serialize;
use utoipa::ToSchema;

use super::scrape::labels;
use super::text::rfc3339;
use crate::bmdb::switches::{PortView, SwitchView};

/// A switch port a machine's NIC (or BMC) is cabled to.
#[derive(Serialize, ToSchema)]
pub struct PortBody {
    pub switch: String,
    pub port: String,
    /// `nic` or `bmc`.
    pub role: String,
    pub mac: Option<String>,
    /// Why it is where shepherd wants it: `provisioning`, `idle`,
    /// `tenant` or `bmc`.
    pub purpose: Option<String>,
    /// The untagged VLAN and the tagged ones shepherd wants.
    pub vlan: Option<i32>,
    pub tagged: Vec<i32>,
    /// What the switch answered when last read back (absent: never read).
    pub seen_vlan: Option<i32>,
    pub seen_tagged: Option<Vec<i32>>,
    pub seen_at: Option<String>,
    /// Whether the switch holds what shepherd wants.
    pub settled: bool,
    /// When shepherd last changed it (read back).
    pub changed_at: Option<String>,
    /// The last change that failed, naming the switch and why.
    pub error: Option<String>,
}

impl From<&PortView> for PortBody {
    fn from(p: &PortView) -> Self {
        PortBody {
            switch: p.switch.clone(),
            port: p.port.clone(),
            role: p.role.clone(),
            mac: p.mac.clone(),
            purpose: p.purpose.clone(),
            vlan: p.want_native,
            tagged: p.want_tagged.clone(),
            seen_vlan: p.seen_native,
            seen_tagged: p.seen_tagged.clone(),
            seen_at: p.seen_at.map(rfc3339),
            settled: p.purpose.is_some()
                && p.seen_native == p.want_native
                && p.seen_tagged.as_ref() == Some(&p.want_tagged),
            changed_at: p.changed_at.map(rfc3339),
            error: p.error.clone(),
        }
    }
}

/// A switch shepherd changes.
#[derive(Serialize, ToSchema)]
pub struct SwitchBody {
    pub name: String,
    /// Ports cabled to machines, and of them those not yet read back as
    /// wanted.
    pub ports: i64,
    pub ports_pending: i64,
    /// Ports changed by shepherd, all time.
    pub changes: i64,
    /// When a session last read it back; when one last failed, and why.
    pub reached_at: Option<String>,
    pub failed_at: Option<String>,
    pub error: Option<String>,
    /// Failures in a row (0: answering).
    pub failures: i32,
    /// Its ports cabled to other switches, each with the VLANs it was
    /// last read back carrying (tagged).
    pub uplinks: Vec<UplinkBody>,
}

/// A switch's uplink (a trunk to another switch).
#[derive(Serialize, ToSchema)]
pub struct UplinkBody {
    pub port: String,
    /// None: not read back yet.
    pub vlans: Option<Vec<i32>>,
}

impl From<&SwitchView> for SwitchBody {
    fn from(s: &SwitchView) -> Self {
        SwitchBody {
            name: s.name.clone(),
            ports: s.ports,
            ports_pending: s.ports_pending,
            changes: s.changes,
            reached_at: s.reached_at.map(rfc3339),
            failed_at: s.failed_at.map(rfc3339),
            error: s.error.clone(),
            failures: s.failures,
            uplinks: s
                .uplinks
                .iter()
                .map(|(port, vlans)| UplinkBody {
                    port: port.clone(),
                    vlans: vlans.clone(),
                })
                .collect(),
        }
    }
}

/// `GET /api/v1/switches`.
#[derive(Serialize, ToSchema)]
pub struct SwitchList {
    pub switches: Vec<SwitchBody>,
}

/// The machine page's "Network" section: each port, what shepherd wants
/// there and what the switch answered.
pub fn machine_section(ports: &[PortView]) -> maud::Markup {
    maud::html! {
        @if !ports.is_empty() {
            h2 { "Network" }
            table #ports {
                tr { th { "switch port" } th { "for" } th { "wanted" } th { "on the switch" } th { "changed" } th { "last failure" } }
                @for p in ports {
                    @let b = PortBody::from(p);
                    tr data-port={ (b.switch) ":" (b.port) } .pending[!b.settled] {
                        td { (b.switch) " " (b.port) @if let Some(m) = &b.mac { br; small.muted { (m) } } }
                        td { (b.role) ": " (b.purpose.as_deref().unwrap_or("left as it is")) }
                        td { (vlans(b.vlan, Some(&b.tagged))) }
                        td {
                            @match &b.seen_at {
                                Some(at) => { (vlans(b.seen_vlan, b.seen_tagged.as_ref())) br; small.muted { "read " (at) } },
                                None => "not read yet",
                            }
                        }
                        td { (b.changed_at.as_deref().unwrap_or("never")) }
                        td { (b.error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

fn vlans(native: Option<i32>, tagged: Option<&Vec<i32>>) -> String {
    let tagged: Vec<String> = tagged
        .into_iter()
        .flatten()
        .map(|t| t.to_string())
        .collect();
    match (native, tagged.is_empty()) {
        (Some(n), true) => format!("VLAN {n}"),
        (Some(n), false) => format!("VLAN {n}, tagged {}", tagged.join(",")),
        (None, false) => format!("tagged {}", tagged.join(",")),
        (None, true) => "none".into(),
    }
}

/// A port on one line, for the command line: `leaf1 p3 nic tenant: VLAN
/// 1000 (on the switch: VLAN 1000, read …; changed …)`.
pub fn port_line(b: &PortBody) -> String {
    let mut line = format!(
        "{} {} {} {}: {}",
        b.switch,
        b.port,
        b.role,
        b.purpose.as_deref().unwrap_or("left as it is"),
        vlans(b.vlan, Some(&b.tagged))
    );
    match &b.seen_at {
        Some(at) => line.push_str(&format!(
            " (on the switch: {}, read {at}",
            vlans(b.seen_vlan, b.seen_tagged.as_ref())
        )),
        None => line.push_str(" (not read yet"),
    }
    if let Some(c) = &b.changed_at {
        line.push_str(&format!("; changed {c}"));
    }
    line.push(')');
    if let Some(e) = &b.error {
        line.push_str(&format!(" last failure: {e}"));
    }
    line
}

/// The switches' series, from the BMDB (every shepherd serves the same).
pub fn switch_samples(
    p: &mut super::scrape::Scrape,
    switches: &[crate::bmdb::switches::SwitchView],
) {
    let up = |s: &crate::bmdb::switches::SwitchView| s.failures == 0 && s.reached_at.is_some();
    p.gauges(
        "shepherd_switch_up",
        "Whether shepherd's last session with each switch held (0: it failed, or none held yet; the cause is in /api/v1/switches)",
        switches.iter().map(|s| (labels(&[("switch", &s.name)]), i64::from(up(s)))),
    );
    let count = |f: &dyn Fn(&crate::bmdb::switches::SwitchView) -> bool| {
        switches.iter().filter(|s| f(s)).count() as i64
    };
    p.gauges(
        "shepherd_switches",
        "Switches by how shepherd's last session with each went: answering, failing (the cause is in /api/v1/switches), unreached (never reached yet)",
        [
            ("answering", count(&up)),
            ("failing", count(&|s| s.failures > 0)),
            ("unreached", count(&|s| s.failures == 0 && s.reached_at.is_none())),
        ]
        .map(|(state, n)| (labels(&[("state", state)]), n)),
    );
    p.gauge(
        "shepherd_switch_ports_pending",
        "Switch ports not yet read back where shepherd wants them, on every switch",
        switches.iter().map(|s| s.ports_pending).sum(),
    );
    p.gauges(
        "shepherd_switch_ports",
        "Switch ports cabled to machines, by whether the switch was read back holding what shepherd wants (settled) or not yet (pending)",
        switches.iter().flat_map(|s| {
            [
                ("settled", s.ports - s.ports_pending),
                ("pending", s.ports_pending),
            ]
            .map(|(state, n)| (labels(&[("switch", &s.name), ("state", state)]), n))
        }),
    );
    p.counters(
        "shepherd_switch_port_changes",
        "Port changes shepherd made on each switch and read back (all shepherds, all time)",
        switches
            .iter()
            .map(|s| (labels(&[("switch", &s.name)]), s.changes.max(0) as u64)),
    );
    p.counters(
        "shepherd_switch_sessions",
        "Sessions shepherd held with each switch to change or read back ports, failed ones too (all shepherds, all time)",
        switches
            .iter()
            .map(|s| (labels(&[("switch", &s.name)]), s.sessions.max(0) as u64)),
    );
    p.seconds_counters(
        "shepherd_switch_session",
        "Seconds those sessions took, from connecting to the last read back (all shepherds, all time)",
        switches
            .iter()
            .map(|s| (labels(&[("switch", &s.name)]), s.session_seconds.max(0.0))),
    );
}
