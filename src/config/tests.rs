//! The loader: defaults, environment overrides, keys named in errors,
//! the inventory's and the network boot's checks, secrets never echoed.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_validate() {
    let cfg = Config::load_with_env(None, env(&[])).unwrap();
    assert_eq!(cfg.bmdb.pool_size, 16);
    assert!(cfg.bmdb.url.is_none());
}

#[test]
fn env_overrides_nested_keys() {
    let cfg = Config::load_with_env(
        None,
        env(&[
            ("SHEPHERD__BMDB__URL", "postgres://u:pw@127.0.0.1/x"),
            ("SHEPHERD__BMDB__POOL_SIZE", "3"),
            ("SHEPHERD__BMDB__EMBEDDED__FSYNC", "false"),
            ("SHEPHERD__BMDB__SESSION_INTERVAL", "4s"),
        ]),
    )
    .unwrap();
    assert_eq!(cfg.bmdb.pool_size, 3);
    assert!(!cfg.bmdb.embedded.fsync);
    assert_eq!(cfg.bmdb.session_interval, Duration::from_secs(4));
    let shown = cfg.to_redacted_toml();
    assert!(shown.contains("u:<redacted>@127.0.0.1"), "{shown}");
    assert!(!shown.contains("pw@"), "{shown}");
}

#[test]
fn ill_typed_and_unknown_keys_are_named() {
    let e = Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZE", "many")])).unwrap_err();
    assert_eq!(e.key_name(), Some("bmdb.pool_size"), "{e}");
    let e = Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZ", "1")])).unwrap_err();
    assert!(e.to_string().contains("pool_siz"), "{e}");
    let e = Config::load_with_env(None, env(&[("SHEPHERD__BMDB__POOL_SIZE", "0")])).unwrap_err();
    assert_eq!(e.key_name(), Some("bmdb.pool_size"));
}

#[test]
fn an_inventory_host_with_no_way_in_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("shepherd.toml");
    let load = |hosts: &str| {
        std::fs::write(&f, format!("[provider.inventory]\nmachines = [{hosts}]\n")).unwrap();
        Config::load_with_env(Some(&f), Vec::new())
    };
    let e = load(r#"{ id = "a", address = "192.0.2.1" }, { id = "rack1-u12", location = "r1" }"#)
        .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[1].address"),
        "{e}"
    );
    assert!(
        e.to_string().contains("host rack1-u12: address is missing"),
        "{e}"
    );
    let e = load(r#"{ id = "rack1-u13", boot = "virtual-media" }"#).unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[0].bmc"),
        "{e}"
    );
    assert!(e.to_string().contains("rack1-u13"), "{e}");
    let e = load(r#"{ id = "x", address = "192.0.2.1", boot = "pxe" }"#).unwrap_err();
    assert!(e.to_string().contains("pxe"), "{e}");
    let ok = load(
        r#"{ id = "rack1-u14", boot = "virtual-media", bmc = { url = "https://10.0.0.5", username = "admin", password = "pw" } }"#,
    )
    .unwrap();
    let m = &ok.provider.inventory.machines[0];
    assert!(m.boots_from_bmc() && m.address.is_none());
}

#[test]
fn a_network_boot_host_and_the_netboot_section_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("shepherd.toml");
    let load = |text: &str| {
        std::fs::write(&f, text).unwrap();
        Config::load_with_env(Some(&f), Vec::new())
    };
    let ipmi = r#"bmc = { url = "ipmi://10.0.0.7", username = "admin", password = "pw" }"#;
    let e = load(&format!(
        "[provider.inventory]\nmachines = [{{ id = \"r2-u3\", boot = \"network\", {ipmi} }}]\n"
    ))
    .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[0].mac"),
        "{e}"
    );
    assert!(e.to_string().contains("r2-u3"), "{e}");
    let e = load(&format!(
        "[provider.inventory]\nmachines = [{{ id = \"r2-u3\", boot = \"virtual-media\", {ipmi} }}]\n"
    ))
    .unwrap_err();
    assert!(e.to_string().contains("IPMI has no virtual media"), "{e}");
    let e = load(&format!(
        "[provider.inventory]\nmachines = [\n{{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", {ipmi} }},\n{{ id = \"b\", boot = \"network\", macs = [\"52-54-00-12-34-56\"], {ipmi} }}]\n"
    ))
    .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[1].mac"),
        "{e}"
    );
    assert!(e.to_string().contains("host a's too"), "{e}");
    let e = load(
        "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7:x\", username = \"admin\", password = \"pw\" } }]\n",
    )
    .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[0].bmc.url"),
        "{e}"
    );
    let e = load(
        "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7\", username = \"admin\", password = \"this-is-longer-than-twenty\" } }]\n",
    )
    .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[0].bmc.password"),
        "{e}"
    );
    assert!(!e.to_string().contains("this-is-longer"), "{e}");
    let ok = load(&format!(
        "[provider.inventory]\nmachines = [{{ id = \"a\", boot = \"network\", mac = \"52:54:00:AB:34:56\", firmware = \"bios\", {ipmi} }}]\n"
    ))
    .unwrap();
    let m = &ok.provider.inventory.machines[0];
    assert_eq!(m.boot_macs()[0].to_string(), "52:54:00:ab:34:56");
    assert_eq!(
        m.bmc.as_ref().unwrap().ipmi_target(),
        Some(("10.0.0.7".to_string(), 623))
    );
    assert!(ok.netboot.is_none());
    // Secure Boot asked of an IPMI BMC: refused at load, naming the
    // host; a Redfish BMC takes it.
    let e = load(
        "[provider.inventory]\nmachines = [{ id = \"rack1-u7\", boot = \"network\", mac = \"52:54:00:12:34:56\", bmc = { url = \"ipmi://10.0.0.7\", username = \"admin\", password = \"pw\", secure_boot = true } }]\n",
    )
    .unwrap_err();
    assert_eq!(
        e.key_name(),
        Some("provider.inventory.machines[0].bmc.secure_boot"),
        "{e}"
    );
    assert!(e.to_string().contains("host rack1-u7"), "{e}");
    let ok = load(
        "[provider.inventory]\nmachines = [{ id = \"a\", boot = \"virtual-media\", bmc = { url = \"https://10.0.0.7\", username = \"admin\", password = \"pw\", secure_boot = false } }]\n",
    )
    .unwrap();
    assert_eq!(
        ok.provider.inventory.machines[0]
            .bmc
            .as_ref()
            .unwrap()
            .secure_boot,
        Some(false)
    );

    let e = load("[netboot]\nmode = \"proxy\"\n").unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.interface"), "{e}");
    let e = load("[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\n").unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.range"), "{e}");
    let e =
        load("[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\nrange = \"10.0.0.9-10.0.0.1\"\n")
            .unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.range"), "{e}");
    let ok = load("[netboot]\ninterface = \"br0\"\n").unwrap();
    let n = ok.netboot.unwrap();
    assert_eq!(
        (n.mode, n.dhcp_port, n.tftp_port, n.discover),
        (NetbootMode::Proxy, 67, 69, false)
    );
    // What UEFI firmware PXE loads: iPXE in proxy mode, the signed
    // chain when shepherd is the DHCP server (the next server GRUB
    // reads), or as set.
    assert_eq!(n.uefi_chain(), UefiChain::Ipxe);
    let dhcp =
        load("[netboot]\ninterface = \"br0\"\nmode = \"dhcp\"\nrange = \"10.0.0.1-10.0.0.9\"\n")
            .unwrap()
            .netboot
            .unwrap();
    assert_eq!(dhcp.uefi_chain(), UefiChain::Shim);
    let set = load("[netboot]\ninterface = \"br0\"\nuefi = \"shim\"\n")
        .unwrap()
        .netboot
        .unwrap();
    assert_eq!(set.uefi_chain(), UefiChain::Shim);
    let e = load("[netboot]\ninterface = \"br0\"\nuefi = \"grub\"\n").unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.uefi"), "{e}");
    let e = load("[netboot]\ninterface = \"br0\"\ndiscover = true\ndiscover_per_minute = 0\n")
        .unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.discover_per_minute"), "{e}");
    let e = load("[netboot]\ninterface = \"br0\"\ndiscover_ttl = \"5s\"\n").unwrap_err();
    assert_eq!(e.key_name(), Some("netboot.discover_ttl"), "{e}");
}

#[test]
fn a_mistyped_secret_is_not_echoed() {
    assert_eq!(
        clean_serde_message(r#"invalid type: string "hunter2", expected u32"#),
        "invalid type: string \"…\", expected u32"
    );
}

#[test]
fn a_baseline_is_checked_and_its_wrong_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("shepherd.toml");
    let load = |baseline: &str| {
        std::fs::write(
            &f,
            format!(
                "[installations]\nimages_dir = \"/srv/images\"\n\n[[metal.plans]]\nslug = \"small\"\n\n\
                 [[baselines]]\nname = \"r650\"\nmanufacturer = \"Dell Inc.\"\n{baseline}\n"
            ),
        )
        .unwrap();
        Config::load_with_env(Some(&f), Vec::new())
    };
    let good = load(
        "plan = \"small\"\ncomponents = [{ component = \"nic:NIC.Slot.1\", version = \"22.5\", image = \"nic.bin\" }]\n\
         bios = { ProcVirtualization = \"Enabled\", NumLock = true, SerialPort = 1 }\n\
         raid = [{ raid_type = \"RAID1\", drives = 2 }]",
    )
    .unwrap();
    let b = &good.baselines[0];
    assert_eq!(b.bios["NumLock"], serde_json::json!(true));
    assert_eq!(b.raid.as_ref().unwrap()[0].drives, 2);
    assert_eq!(b.selection(), "plan=small manufacturer=Dell Inc.");
    for (baseline, key) in [
        ("", "baselines[0].components"),
        ("plan = \"large\"\nraid = []", "baselines[0].plan"),
        (
            "raid = [{ raid_type = \"RAID7\", drives = 2 }]",
            "baselines[0].raid[0].raid_type",
        ),
        (
            "raid = [{ raid_type = \"RAID5\", drives = 2 }]",
            "baselines[0].raid[0].drives",
        ),
        (
            "components = [{ component = \"cpld\", version = \"1\", image = \"c.bin\" }]",
            "baselines[0].components[0].component",
        ),
        (
            "components = [{ component = \"bios\", version = \"1\", image = \"../bios.bin\" }]",
            "baselines[0].components[0].image",
        ),
        ("bios = { Boot = [1, 2] }", "baselines[0].bios.Boot"),
        ("model = \" \"\nraid = []", "baselines[0].model"),
    ] {
        let e = load(baseline).unwrap_err();
        assert_eq!(e.key_name(), Some(key), "{baseline}: {e}");
    }
}
