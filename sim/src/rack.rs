//! A rack booted through its BMCs and the network (`fleet-sim --provider
//! static --boot network`): blank owned machines, powered off, each with
//! a simulated Redfish BMC (slowed as real ones are) on an address of the
//! rack's network namespace, and a provisioning NIC on a link whose other
//! end is shepherd's network boot service. A power on through the BMC with
//! the override `Pxe` runs the machine's network boot ([`crate::pxe`]) and
//! then the live agent the boot's data enrolls; a power on from the disk
//! boots nothing of ours (blank, or the installed system).
//!
//! It must run inside a network namespace (it checks): its BMCs and its
//! link have private addresses, which the host's own namespace must not.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::bmc::ipmi::IpmiSim;
use crate::bmc::{BmcSim, BootFrom, RackBmcs};
use crate::machine::MachineSim;
use crate::pxe::ProvisioningLink;

/// How the rack's machines reach shepherd.
#[derive(Debug, Clone)]
pub struct NetworkBoot {
    /// The rack's end of the provisioning link (the machines' NICs).
    pub interface: String,
    /// shepherd's end, its `netboot.interface`.
    pub server_interface: String,
    /// shepherd's address on the link: its network boot, callback and
    /// image servers.
    pub server: Ipv4Addr,
    /// The addresses shepherd's DHCP leases (the rack's namespace routes
    /// them to itself).
    pub pool: (Ipv4Addr, Ipv4Addr),
    /// Added to every BMC request.
    pub bmc_latency: Duration,
    /// The boot image's kernel and initramfs, bytes.
    pub kernel_bytes: usize,
    pub initrd_bytes: usize,
    /// Every this many machines, one has an IPMI BMC (the last of each
    /// group), the others Redfish; 0: none.
    pub ipmi_every: usize,
}

/// Whether this process runs in a named network namespace (one `ip netns
/// add` made, under /var/run/netns), not the host's own.
pub fn in_own_namespace() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(me) = std::fs::metadata("/proc/self/ns/net") else {
        return false;
    };
    std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .any(|m| m.ino() == me.ino() && m.dev() == me.dev())
}

/// The MAC of the machine whose BMC is at `ip`: its first NIC's, as its
/// hardware report gives it (`machine::simulated_hardware`).
pub fn boot_mac(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => v6.octets()[12..].try_into().unwrap(),
    };
    [0x02, 0x5e, o[2], o[3], 0x00, 0x00]
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A running rack: its machines, their BMCs, their link.
pub struct Rack {
    pub machines: MachineSim,
    /// The Redfish BMCs, and the IPMI ones (`NetworkBoot::ipmi_every`).
    pub bmcs: BmcSim,
    pub ipmi: IpmiSim,
    pub link: Arc<ProvisioningLink>,
    pub boot: NetworkBoot,
    /// The boot image and the iPXE binaries shepherd serves.
    pub boot_image: PathBuf,
    pub tftp_root: PathBuf,
}

/// Deterministic filler bytes standing in for a binary.
fn stand_in(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 24) as u8)
        .collect()
}

impl Rack {
    /// `addresses` (the BMCs') on `port`, machines' files under `root`,
    /// the boot files under `dir`.
    pub fn start(
        addresses: Vec<IpAddr>,
        port: u16,
        root: &Path,
        dir: &Path,
        boot: NetworkBoot,
    ) -> std::io::Result<Rack> {
        if !in_own_namespace() {
            return Err(std::io::Error::other(
                "--boot network runs in a network namespace of its own (ip netns exec …): its BMCs and provisioning link have private addresses",
            ));
        }
        if boot.ipmi_every == 1 {
            return Err(std::io::Error::other(
                "every machine with an IPMI BMC leaves none with Redfish: the rack mixes both",
            ));
        }
        let machines = MachineSim::blank(addresses, root)?;
        let link = ProvisioningLink::open(&boot.interface)?;
        // The boot image (a stand-in ISO with its slot, and the kernel and
        // initramfs of its network boot) and iPXE's BIOS binary.
        let boot_dir = dir.join("boot");
        std::fs::create_dir_all(&boot_dir)?;
        let (boot_image, _) = crate::testing::boot_image_stand_in(&boot_dir);
        let beside = |ext: &str| {
            let mut p = boot_image.clone().into_os_string();
            p.push(ext);
            PathBuf::from(p)
        };
        std::fs::write(beside(".vmlinuz"), stand_in(boot.kernel_bytes, 7))?;
        std::fs::write(beside(".initrd"), stand_in(boot.initrd_bytes, 9))?;
        let tftp_root = dir.join("ipxe");
        std::fs::create_dir_all(&tftp_root)?;
        std::fs::write(tftp_root.join("undionly.kpxe"), stand_in(74_213, 1))?;
        std::fs::write(tftp_root.join("snponly.efi"), stand_in(173_792, 2))?;
        std::fs::write(tftp_root.join("ipxe.efi"), stand_in(1_034_240, 3))?;
        let agents = machines.agents.clone();
        let on_link = link.clone();
        let on_power_on = Arc::new(move |ip: IpAddr, from: BootFrom| match from {
            BootFrom::Network => {
                let link = on_link.clone();
                agents.boot_live(
                    ip,
                    async move { crate::pxe::boot(&link, boot_mac(ip)).await },
                );
            }
            BootFrom::Disk => tracing::debug!(machine = %ip, "powered on from its disk"),
        });
        let off_agents = machines.agents.clone();
        let on_power_off: crate::bmc::OnPowerOff = Arc::new(move |ip| off_agents.power_off(ip));
        let speaks_ipmi =
            |i: usize| boot.ipmi_every > 0 && i % boot.ipmi_every == boot.ipmi_every - 1;
        let (ipmi, redfish): (Vec<_>, Vec<_>) = machines
            .addresses
            .iter()
            .enumerate()
            .partition(|(i, _)| speaks_ipmi(*i));
        let addresses =
            |v: Vec<(usize, &IpAddr)>| v.into_iter().map(|(_, a)| *a).collect::<Vec<_>>();
        let restart_delay = Duration::from_secs(1);
        let ipmi = IpmiSim::start(
            &addresses(ipmi),
            port,
            boot.bmc_latency,
            restart_delay,
            on_power_on.clone(),
            on_power_off.clone(),
        )?;
        let bmcs = BmcSim::start_rack(
            &addresses(redfish),
            port,
            restart_delay,
            on_power_off,
            RackBmcs {
                latency: boot.bmc_latency,
                off: true,
                on_power_on,
                in_namespace: true,
            },
        )?;
        Ok(Rack {
            machines,
            bmcs,
            ipmi,
            link,
            boot,
            boot_image,
            tftp_root,
        })
    }

    /// The configuration's inventory and network boot for the rack.
    pub fn config(&self, location: &str) -> String {
        let b = &self.boot;
        let mut text = format!(
            "# Owned machines booted through their BMCs and the network.\n\
             [provider]\nkind = \"static\"\n\n\
             # The Metal API's deleted devices: the simulated disks are files, a\n\
             # discard punches them through.\n[metal]\nerase_mode = \"discard\"\n\n\
             [netboot]\ninterface = \"{iface}\"\nmode = \"dhcp\"\nrange = \"{}-{}\"\nlease = \"1h\"\n\
             tftp_root = \"{tftp}\"\nhttp_listen = \"{server}:8067\"\n\n\
             [installations]\nboot_image = \"{image}\"\n\n\
             [enroller]\nparallelism = 64\ncallback_timeout = \"5m\"\nbackoff_initial = \"10s\"\n",
            b.pool.0,
            b.pool.1,
            iface = b.server_interface,
            tftp = crate::fleet::toml_path(&self.tftp_root),
            server = b.server,
            image = crate::fleet::toml_path(&self.boot_image),
        );
        for (i, ip) in self.machines.addresses.iter().enumerate() {
            let (url, user, password) = if self.ipmi.serves(*ip) {
                (self.ipmi.url(*ip), &self.ipmi.user, &self.ipmi.password)
            } else {
                (self.bmcs.url(*ip), &self.bmcs.user, &self.bmcs.password)
            };
            text.push_str(&format!(
                "\n[[provider.inventory.machines]]\nid = \"node-{:04}\"\nboot = \"network\"\nmac = \"{}\"\n{location}bmc = {{ url = \"{url}\", username = \"{user}\", password = \"{password}\" }}\n",
                i + 1,
                mac_text(boot_mac(*ip)),
            ));
        }
        text
    }
}
