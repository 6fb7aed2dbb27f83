//! The agent's LLDP listener against a real lldpd on a switch port.

use super::*;

/// The agent learns which switch port its NIC is on from the LLDP frames
/// a real lldpd sends on the switch's side of the port, as a vendor's
/// switch names it.
#[actix_rt::test]
async fn the_agent_hears_which_switch_port_its_nic_is_on() {
    if !is_root() {
        eprintln!("SKIPPED: the switch test needs root (network namespaces)");
        return;
    }
    let sw = OvsSwitch::start("leaf7");
    let nic = sw.nic(nic_ip(1), PROVISIONING);
    let _lldpd = sw.lldp(&nic, "Ethernet12");
    let heard = nic.inside(|| shepherd_agent::lldp::listen("eth0", Duration::from_secs(20)));
    let n = heard.unwrap().expect("no LLDP frame heard in 20 s");
    assert_eq!(n.system_name, "leaf7", "{n:?}");
    assert_eq!(n.port_id, "Ethernet12", "{n:?}");
    assert_eq!(n.port_description, "leaf7:Ethernet12", "{n:?}");
    let summary = shepherd_proto::summary::LldpSummary {
        chassis_id: n.chassis_id.clone(),
        port_id: n.port_id.clone(),
        system_name: n.system_name.clone(),
        port_description: n.port_description.clone(),
    };
    // The cabling check takes it as leaf7's Ethernet12, and no other.
    assert!(summary.names("leaf7", "Ethernet12"));
    assert!(!summary.names("leaf7", "Ethernet13"));
    assert!(!summary.names("leaf8", "Ethernet12"));
}
