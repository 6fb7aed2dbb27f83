//! The hardware report an agent sends (CONTRACTS.md §4, `cloud.agent.api.Node`),
//! read from the Linux host it runs on: DMI identity, CPUs from
//! /proc/cpuinfo, memory installed from the SMBIOS memory devices (type 17;
//! /proc/meminfo's MemTotal is what the kernel can use, which gives the
//! usable ratio), block devices and network interfaces from /sys (disk
//! serials from the virtio `serial`, the NVMe controller, SCSI's unit
//! serial number page or udev's database), EFI and Secure Boot as
//! [`firmware`](crate::firmware) reads them. What cannot be read is left
//! empty and said in a warning; reading never fails.

use std::collections::BTreeSet;
use std::path::Path;

use crate::api::{
    AgentHardwareReport, BlockDevice, Cpu, NetworkInterface, Node, block_device, cpu,
};

fn read(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path.trim_start_matches('/')))
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_num<T: std::str::FromStr>(root: &Path, path: &str) -> Option<T> {
    read(root, path)?.parse().ok()
}

/// The report of the host whose /proc and /sys are mounted under `root`
/// (`/` for the machine itself).
pub fn report_from(root: &Path) -> AgentHardwareReport {
    let mut warnings = Vec::new();
    let usable = memory(root, &mut warnings);
    let (installed, ratio) = match installed_memory(root) {
        Some(i) if i > 0 && usable > 0 => (i, (usable as f64 / i as f64).min(1.0) as f32),
        _ => {
            warnings.push(
                "memory: no SMBIOS memory devices readable; reporting what the kernel can use"
                    .into(),
            );
            (usable, 1.0)
        }
    };
    let node = Node {
        manufacturer: read(root, "/sys/class/dmi/id/sys_vendor").unwrap_or_default(),
        product: read(root, "/sys/class/dmi/id/product_name").unwrap_or_default(),
        serial_number: read(root, "/sys/class/dmi/id/product_serial").unwrap_or_default(),
        memory_installed_bytes: installed,
        memory_usable_ratio: ratio,
        cpu: cpus(root, &mut warnings),
        block_device: block_devices(root),
        network_interface: nics(root),
        efi_support: crate::firmware::efi(root) as i32,
        bmc_lan: None,
        secure_boot: Some(crate::firmware::secure_boot(root)),
    };
    AgentHardwareReport {
        report: Some(node),
        warning: warnings,
    }
}

/// The report of this machine, with its BMC's LAN channel where the BMC
/// answers in-band.
pub fn report() -> AgentHardwareReport {
    let mut r = report_from(Path::new("/"));
    match crate::bmc_lan::read() {
        Ok(lan) => {
            if let Some(n) = r.report.as_mut() {
                n.bmc_lan = lan;
            }
        }
        Err(e) => r.warning.push(format!("bmc: not read in-band: {e}")),
    }
    r
}

fn memory(root: &Path, warnings: &mut Vec<String>) -> i64 {
    let total = read(root, "/proc/meminfo").and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<i64>().ok())
    });
    match total {
        Some(kb) => kb * 1024,
        None => {
            warnings.push("memory: /proc/meminfo has no MemTotal".into());
            0
        }
    }
}

/// The memory installed: the sum of the SMBIOS memory devices' sizes
/// (type 17 structures, as the kernel exports them raw). None when there
/// are none to read (no DMI, or not root).
fn installed_memory(root: &Path) -> Option<i64> {
    let dir = std::fs::read_dir(root.join("sys/firmware/dmi/entries")).ok()?;
    let mut total: i64 = 0;
    let mut seen = false;
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with("17-") {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("raw")) else {
            continue;
        };
        seen = true;
        total += memory_device_bytes(&raw).unwrap_or(0);
    }
    seen.then_some(total)
}

/// A type 17 (Memory Device) structure's size in bytes: the Size word at
/// 0x0C (0: no module; 0xFFFF: unknown; bit 15 set: KB, else MB; 0x7FFF:
/// the Extended Size dword at 0x1C, in MB).
fn memory_device_bytes(raw: &[u8]) -> Option<i64> {
    if raw.first() != Some(&17) {
        return None;
    }
    let len = *raw.get(1)? as usize;
    let word = u16::from_le_bytes([*raw.get(0x0C)?, *raw.get(0x0D)?]);
    match word {
        0 | 0xFFFF => Some(0),
        0x7FFF if len >= 0x20 => {
            let ext = u32::from_le_bytes(raw.get(0x1C..0x20)?.try_into().ok()?);
            Some((ext & 0x7FFF_FFFF) as i64 * (1 << 20))
        }
        w if w & 0x8000 != 0 => Some((w & 0x7FFF) as i64 * 1024),
        w => Some(w as i64 * (1 << 20)),
    }
}

/// A disk's serial number: virtio's `serial`, the device's (NVMe
/// controllers, some SCSI), the SCSI unit serial number VPD page (0x80;
/// SATA disks through libata too), else udev's ID_SERIAL_SHORT.
fn disk_serial(root: &Path, name: &str) -> String {
    let d = format!("/sys/block/{name}");
    for p in [format!("{d}/serial"), format!("{d}/device/serial")] {
        if let Some(s) = read(root, &p).filter(|s| !s.is_empty()) {
            return s;
        }
    }
    if let Ok(raw) = std::fs::read(root.join(format!("sys/block/{name}/device/vpd_pg80"))) {
        if raw.len() > 4 && raw[1] == 0x80 {
            let n = u16::from_be_bytes([raw[2], raw[3]]) as usize;
            let s = String::from_utf8_lossy(&raw[4..(4 + n).min(raw.len())])
                .trim_matches(|c: char| c.is_whitespace() || c == '\0')
                .to_string();
            if !s.is_empty() {
                return s;
            }
        }
    }
    udev_property(root, name, "ID_SERIAL_SHORT").unwrap_or_default()
}

/// A property from udev's database entry of block device `name`.
fn udev_property(root: &Path, name: &str, key: &str) -> Option<String> {
    let dev = read(root, &format!("/sys/block/{name}/dev"))?;
    let db = read(root, &format!("/run/udev/data/b{dev}"))?;
    let prefix = format!("E:{key}=");
    db.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// A disk's World Wide Name, as bytes: the `wwid` the kernel shows
/// (`naa.5000c500a1b2c3d4`, `eui.…`), else udev's ID_WWN (`0x…`).
fn disk_wwn(root: &Path, name: &str) -> Vec<u8> {
    let d = format!("/sys/block/{name}");
    let text = read(root, &format!("{d}/wwid"))
        .or_else(|| read(root, &format!("{d}/device/wwid")))
        .or_else(|| udev_property(root, name, "ID_WWN"));
    let Some(t) = text else { return Vec::new() };
    let hex = t
        .strip_prefix("naa.")
        .or_else(|| t.strip_prefix("eui."))
        .or_else(|| t.strip_prefix("0x"))
        .unwrap_or("");
    if hex.is_empty() || hex.len() % 2 != 0 {
        return Vec::new();
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .unwrap_or_default()
}

/// One `CPU` per physical package, with its cores and threads.
fn cpus(root: &Path, warnings: &mut Vec<String>) -> Vec<Cpu> {
    let Some(info) = read(root, "/proc/cpuinfo") else {
        warnings.push("cpu: /proc/cpuinfo is unreadable".into());
        return Vec::new();
    };
    #[derive(Default)]
    struct Package {
        vendor: String,
        model_name: String,
        family: i32,
        model: i32,
        stepping: i32,
        threads: i32,
        cores: BTreeSet<String>,
    }
    let mut packages: std::collections::BTreeMap<String, Package> = Default::default();
    for block in info.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            block
                .lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let package = field("physical id").unwrap_or_else(|| "0".into());
        let p = packages.entry(package).or_default();
        p.threads += 1;
        p.cores
            .insert(field("core id").unwrap_or_else(|| p.threads.to_string()));
        p.vendor = field("vendor_id").unwrap_or_default();
        p.model_name = field("model name").unwrap_or_default();
        p.family = field("cpu family")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        p.model = field("model").and_then(|v| v.parse().ok()).unwrap_or(0);
        p.stepping = field("stepping").and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    packages
        .into_values()
        .map(|p| Cpu {
            architecture: (cfg!(target_arch = "x86_64") || !p.vendor.is_empty()).then_some(
                cpu::Architecture::X8664(cpu::X8664 {
                    family: p.family,
                    model: p.model,
                    stepping: p.stepping,
                }),
            ),
            cores: p.cores.len() as i32,
            hardware_threads: p.threads,
            vendor: p.vendor,
            model: p.model_name,
        })
        .collect()
}

fn block_devices(root: &Path) -> Vec<BlockDevice> {
    let Ok(entries) = std::fs::read_dir(root.join("sys/block")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, BlockDevice)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // Not disks to install on: loop, RAM, device-mapper and RAID
            // devices, optical drives, floppies, network block devices.
            if ["loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                return None;
            }
            let d = format!("/sys/block/{name}");
            let vendor = read(root, &format!("{d}/device/vendor")).unwrap_or_default();
            let protocol = if name.starts_with("nvme") {
                block_device::Protocol::Nvme
            } else if name.starts_with("mmcblk") {
                block_device::Protocol::Mmc
            } else if name.starts_with("sd") && vendor == "ATA" {
                // libata shows SATA disks as SCSI devices of vendor "ATA".
                block_device::Protocol::Ata
            } else if name.starts_with("sd") {
                block_device::Protocol::Scsi
            } else {
                block_device::Protocol::Unknown
            };
            Some((
                name.clone(),
                BlockDevice {
                    vendor,
                    device_model: read(root, &format!("{d}/device/model")).unwrap_or_default(),
                    serial_number: disk_serial(root, &name),
                    wwn: disk_wwn(root, &name),
                    rotational: read(root, &format!("{d}/queue/rotational")).as_deref()
                        == Some("1"),
                    capacity_bytes: read_num::<i64>(root, &format!("{d}/size")).unwrap_or(0) * 512,
                    logical_block_size_bytes: read_num(
                        root,
                        &format!("{d}/queue/logical_block_size"),
                    )
                    .unwrap_or(0),
                    physical_block_size_bytes: read_num(
                        root,
                        &format!("{d}/queue/physical_block_size"),
                    )
                    .unwrap_or(0),
                    protocol: protocol as i32,
                    ..Default::default()
                },
            ))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, d)| d).collect()
}

fn nics(root: &Path) -> Vec<NetworkInterface> {
    let Ok(entries) = std::fs::read_dir(root.join("sys/class/net")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, NetworkInterface)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let d = format!("/sys/class/net/{name}");
            // Physical ones only: they have a device.
            if !root.join(d.trim_start_matches('/')).join("device").exists() {
                return None;
            }
            let mac: Vec<u8> = read(root, &format!("{d}/address"))
                .unwrap_or_default()
                .split(':')
                .filter_map(|h| u8::from_str_radix(h, 16).ok())
                .collect();
            let driver =
                std::fs::read_link(root.join(d.trim_start_matches('/')).join("device/driver"))
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_default();
            let mbps: i64 = read_num(root, &format!("{d}/speed")).unwrap_or(0).max(0);
            let lldp = crate::lldp::learned(&name);
            Some((
                name,
                NetworkInterface {
                    mac,
                    driver,
                    supported_speed_bytes: Vec::new(),
                    // Some drivers (virtio among them) report "unknown":
                    // then the carrier tells.
                    link_up: match read(root, &format!("{d}/operstate")).as_deref() {
                        Some("up") => true,
                        Some("unknown") => {
                            read(root, &format!("{d}/carrier")).as_deref() == Some("1")
                        }
                        _ => false,
                    },
                    current_speed_bytes: mbps * 1_000_000 / 8,
                    lldp,
                },
            ))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, n)| n).collect()
}

pub use shepherd_proto::summary::{
    CpuSummary, DiskSummary, HardwareSummary, NicSummary, bytes, summarize,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EfiSupport, secure_boot};

    fn put(root: &Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A type 17 structure of `size` (the Size word) and extended size.
    fn dimm(size: u16, extended: u32) -> Vec<u8> {
        let mut b = vec![0u8; 0x28];
        b[0] = 17;
        b[1] = 0x28;
        b[0x0C..0x0E].copy_from_slice(&size.to_le_bytes());
        b[0x1C..0x20].copy_from_slice(&extended.to_le_bytes());
        b
    }

    fn put_bytes(root: &Path, path: &str, bytes: &[u8]) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    #[test]
    fn memory_serials_wwns_and_firmware_as_a_real_machine_shows_them() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        put(r, "/proc/meminfo", "MemTotal:       1000000 kB\n");
        // Two 16 GiB modules (one in MB, one by extended size), an empty slot.
        put_bytes(r, "/sys/firmware/dmi/entries/17-0/raw", &dimm(16384, 0));
        put_bytes(
            r,
            "/sys/firmware/dmi/entries/17-1/raw",
            &dimm(0x7FFF, 16384),
        );
        put_bytes(r, "/sys/firmware/dmi/entries/17-2/raw", &dimm(0, 0));
        // A legacy BIOS that does not support UEFI.
        let mut bios = vec![0u8; 0x18];
        bios[1] = 0x18;
        put_bytes(r, "/sys/firmware/dmi/entries/0-0/raw", &bios);
        // virtio: serial beside the queue.
        put(r, "/sys/block/vda/size", "100\n");
        put(r, "/sys/block/vda/serial", "VIRT-123\n");
        // SATA through libata: vendor ATA, serial in VPD page 0x80, a WWN.
        put(r, "/sys/block/sda/size", "100\n");
        put(r, "/sys/block/sda/device/vendor", "ATA     \n");
        let mut pg80 = vec![0, 0x80, 0, 8];
        pg80.extend_from_slice(b"  S3Z1NB");
        put_bytes(r, "/sys/block/sda/device/vpd_pg80", &pg80);
        put(r, "/sys/block/sda/device/wwid", "naa.5000c500a1b2c3d4\n");
        // SAS without VPD: udev's database.
        put(r, "/sys/block/sdb/size", "100\n");
        put(r, "/sys/block/sdb/device/vendor", "SEAGATE\n");
        put(r, "/sys/block/sdb/dev", "8:16\n");
        put(
            r,
            "/run/udev/data/b8:16",
            "S:disk/by-id/x\nE:ID_SERIAL_SHORT=ZA1B2C3\nE:ID_WWN=0x5000c500deadbeef\n",
        );
        // A virtio NIC reports operstate "unknown" and its carrier.
        put(r, "/sys/class/net/ens3/address", "52:54:00:12:34:56\n");
        put(r, "/sys/class/net/ens3/operstate", "unknown\n");
        put(r, "/sys/class/net/ens3/carrier", "1\n");
        std::fs::create_dir_all(r.join("sys/class/net/ens3/device")).unwrap();

        let report = report_from(r);
        let n = report.report.unwrap();
        assert_eq!(n.memory_installed_bytes, 32 << 30);
        let ratio = 1_000_000.0 * 1024.0 / (32u64 << 30) as f64;
        assert!(
            (n.memory_usable_ratio as f64 - ratio).abs() < 1e-6,
            "{}",
            n.memory_usable_ratio
        );
        assert_eq!(n.efi_support, EfiSupport::Unsupported as i32);
        let disk = |i: usize| &n.block_device[i];
        assert_eq!(disk(0).serial_number, "S3Z1NB", "sda: VPD page 0x80");
        assert_eq!(disk(0).protocol, block_device::Protocol::Ata as i32);
        assert_eq!(
            disk(0).wwn,
            vec![0x50, 0x00, 0xc5, 0x00, 0xa1, 0xb2, 0xc3, 0xd4]
        );
        assert_eq!(disk(1).serial_number, "ZA1B2C3", "sdb: udev");
        assert_eq!(disk(1).protocol, block_device::Protocol::Scsi as i32);
        assert_eq!(
            disk(1).wwn,
            vec![0x50, 0x00, 0xc5, 0x00, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(disk(2).serial_number, "VIRT-123", "vda: virtio's serial");
        assert!(n.network_interface[0].link_up, "carrier up");

        // A BIOS that supports UEFI, booted legacy: supported, not enabled.
        bios[0x13] = 0x08;
        put_bytes(r, "/sys/firmware/dmi/entries/0-0/raw", &bios);
        let n = report_from(r).report.unwrap();
        assert_eq!(n.efi_support, EfiSupport::Supported as i32);
        // No EFI variables: Secure Boot not known.
        let sb = n.secure_boot.unwrap();
        assert_eq!(sb.state, secure_boot::State::Unknown as i32);
        assert_eq!(sb.lockdown, "");
    }

    #[test]
    fn a_host_is_read_from_proc_and_sys() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        put(r, "/sys/class/dmi/id/sys_vendor", "Acme\n");
        put(r, "/sys/class/dmi/id/product_name", "Box 9000\n");
        put(
            r,
            "/proc/meminfo",
            "MemTotal:       65536 kB\nMemFree: 1 kB\n",
        );
        let cpu = |p: u32, c: u32| {
            format!(
                "processor\t: {}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Xeon\nstepping\t: 4\nphysical id\t: {p}\ncore id\t\t: {c}\n",
                p * 10 + c
            )
        };
        put(
            r,
            "/proc/cpuinfo",
            &[
                cpu(0, 0),
                cpu(0, 0),
                cpu(0, 1),
                cpu(0, 1),
                cpu(1, 0),
                cpu(1, 0),
            ]
            .join("\n"),
        );
        put(r, "/sys/block/nvme0n1/size", "2000000\n");
        put(r, "/sys/block/nvme0n1/queue/rotational", "0\n");
        put(r, "/sys/block/nvme0n1/queue/logical_block_size", "512\n");
        put(r, "/sys/block/nvme0n1/device/model", "Fast SSD\n");
        put(r, "/sys/block/loop0/size", "8\n");
        put(r, "/sys/class/net/eth0/address", "02:00:00:00:00:01\n");
        put(r, "/sys/class/net/eth0/operstate", "up\n");
        put(r, "/sys/class/net/eth0/speed", "10000\n");
        std::fs::create_dir_all(r.join("sys/class/net/eth0/device")).unwrap();
        put(r, "/sys/class/net/lo/address", "00:00:00:00:00:00\n");
        std::fs::create_dir_all(r.join("sys/firmware/efi")).unwrap();

        let report = report_from(r);
        let n = report.report.clone().unwrap();
        assert_eq!(
            (n.manufacturer.as_str(), n.product.as_str()),
            ("Acme", "Box 9000")
        );
        assert_eq!(
            n.memory_installed_bytes,
            65536 * 1024,
            "no SMBIOS: MemTotal"
        );
        assert!(report.warning.iter().any(|w| w.contains("SMBIOS")));
        assert_eq!(n.cpu.len(), 2, "two packages");
        assert_eq!((n.cpu[0].cores, n.cpu[0].hardware_threads), (2, 4));
        assert_eq!((n.cpu[1].cores, n.cpu[1].hardware_threads), (1, 2));
        assert_eq!(n.block_device.len(), 1, "loop devices are not disks");
        assert_eq!(n.block_device[0].capacity_bytes, 2_000_000 * 512);
        assert_eq!(
            n.block_device[0].protocol,
            block_device::Protocol::Nvme as i32
        );
        assert_eq!(n.network_interface.len(), 1, "lo has no device");
        assert_eq!(n.network_interface[0].mac, vec![2, 0, 0, 0, 0, 1]);
        assert_eq!(n.network_interface[0].current_speed_bytes, 1_250_000_000);
        assert_eq!(n.efi_support, EfiSupport::Enabled as i32);

        use prost::Message;
        let summary = summarize(&report.encode_to_vec()).unwrap();
        assert_eq!(summary.memory_bytes, 64 << 20);
        assert_eq!(summary.cpus[0].threads, 4);
        assert_eq!(summary.disks[0].protocol, "NVME");
        assert_eq!(summary.nics[0].mac, "02:00:00:00:00:01");
        assert_eq!(summary.efi, "ENABLED");
        let text = summary.to_string();
        assert!(text.contains("memory 64 MiB"), "{text}");
        assert!(
            text.contains("nic   02:00:00:00:00:01  link up 10 Gbit/s"),
            "{text}"
        );
        assert!(summarize(b"\xff\xff").is_err());
    }

    #[test]
    fn this_machine_reads_without_failing() {
        let n = report().report.unwrap();
        assert!(n.memory_installed_bytes > 0);
        assert!(!n.cpu.is_empty());
    }
}
