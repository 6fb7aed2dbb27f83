//! `shepherd machines install`: an operating system installed on one
//! machine, or rolled out over a selection.

use shepherd::bmdb::Bmdb;
use shepherd::bmdb::machines;

use shepherd::config::Config;

#[derive(clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    targets: Targets,
    /// The image's http:// or https:// URL (with --digest)…
    #[arg(long)]
    url: Option<String>,
    /// sha256:HEX or sha512:HEX of the bytes at --url.
    #[arg(long)]
    digest: Option<String>,
    /// …or the name of an image in installations.images_dir, served by
    /// the running shepherds.
    #[arg(long)]
    served: Option<String>,
    /// The image's length in bytes (as served), when known.
    #[arg(long)]
    size: Option<i64>,
    /// Disk hints: the one disk matching all of them is written.
    #[command(flatten)]
    disk: DiskHintArgs,
    /// The disk the running system boots from may be written.
    #[arg(long)]
    allow_boot_disk: bool,
    /// Reboot into the installed system once the report is in.
    #[arg(long)]
    reboot: bool,
    /// Make the installed disk the first EFI boot entry (its EFI system
    /// partition's \EFI\BOOT\BOOTX64.EFI).
    #[arg(long)]
    set_efi_boot_entry: bool,
    /// How long each agent may take (default 2h).
    #[arg(long, value_parser = humantime::parse_duration)]
    deadline: Option<std::time::Duration>,
    /// First boot (cloud-init): this file as the user-data.
    #[arg(long, value_name = "FILE")]
    user_data: Option<std::path::PathBuf>,
    /// First boot: the SSH public keys (one per line) cloud-init installs.
    #[arg(long, value_name = "FILE")]
    ssh_authorized_keys: Option<std::path::PathBuf>,
    /// First boot: the host name (`{{provider_id}}` and `{{machine_id}}`
    /// are filled per machine).
    #[arg(long)]
    hostname: Option<String>,
    /// First boot: this file as the network configuration (NoCloud's
    /// network-config; with --config-drive, network_data.json).
    #[arg(long, value_name = "FILE")]
    network_config: Option<std::path::PathBuf>,
    /// Write the first-boot data as an OpenStack config drive (config-2)
    /// instead of a NoCloud seed (cidata).
    #[arg(long)]
    config_drive: bool,
    #[arg(long)]
    reason: Option<String>,
}

/// Disk hints, as `--disk-*` flags.
#[derive(clap::Args)]
pub struct DiskHintArgs {
    #[arg(long)]
    disk_serial: Option<String>,
    #[arg(long)]
    disk_wwn: Option<String>,
    #[arg(long)]
    disk_model: Option<String>,
    #[arg(long)]
    disk_by_path: Option<String>,
    /// Disk at least / at most this many bytes.
    #[arg(long)]
    disk_min_bytes: Option<i64>,
    #[arg(long)]
    disk_max_bytes: Option<i64>,
    /// Only a rotational (true) or a solid-state (false) disk.
    #[arg(long)]
    disk_rotational: Option<bool>,
}

impl DiskHintArgs {
    /// The hints given, if any.
    fn hints(&self) -> Option<shepherd_proto::api::DiskHints> {
        let h = shepherd_proto::api::DiskHints {
            serial: self.disk_serial.clone().unwrap_or_default(),
            wwn: self.disk_wwn.clone().unwrap_or_default(),
            model: self.disk_model.clone().unwrap_or_default(),
            by_path: self.disk_by_path.clone().unwrap_or_default(),
            min_size_bytes: self.disk_min_bytes,
            max_size_bytes: self.disk_max_bytes,
            rotational: self.disk_rotational,
        };
        (h != Default::default()).then_some(h)
    }
}

/// Who asks from the command line: `cli`, a request ID of its own, the
/// reason given (if not blank).
fn cli_asker(reason: Option<&str>) -> shepherd::bmdb::installations::Asker<'_> {
    shepherd::bmdb::installations::Asker {
        actor: "cli",
        action_id: uuid::Uuid::new_v4(),
        rollout_id: None,
        reason: reason.map(str::trim).filter(|r| !r.is_empty()),
    }
}

/// A request check's message with its fields named as the flags that
/// set them (`disk.min_size_bytes` is `--disk-min-bytes`).
fn as_flags(message: &str) -> String {
    [
        ("disk.min_size_bytes", "--disk-min-bytes"),
        ("disk.max_size_bytes", "--disk-max-bytes"),
        ("disk: min_size_bytes", "--disk-min-bytes"),
        ("max_size_bytes", "--disk-max-bytes"),
        ("deadline:", "--deadline:"),
        ("mode:", "--mode:"),
    ]
    .iter()
    .fold(message.to_string(), |m, (field, flag)| {
        m.replacen(field, flag, 1)
    })
}

/// Which machines: one ID, several (a rollout in that order), or the
/// filters of `list` (a rollout).
#[derive(clap::Args)]
pub struct Targets {
    /// Machine IDs (one: that machine alone; several: a rollout in this
    /// order).
    ids: Vec<uuid::Uuid>,
    /// Or a rollout over the machines these filters choose.
    #[command(flatten)]
    filter: super::parse::FilterArgs,
    /// A rollout's machines at once.
    #[arg(long, default_value_t = 1)]
    max_parallel: i32,
    /// A rollout's failures tolerated; one more stops it.
    #[arg(long, default_value_t = 0)]
    max_failures: i32,
}

impl Targets {
    fn by_filter(&self) -> bool {
        self.filter.any()
    }

    /// The one machine named, if that is what was asked; errors for
    /// IDs and filters together, or neither.
    fn single(&self) -> anyhow::Result<Option<uuid::Uuid>> {
        if self.by_filter() && !self.ids.is_empty() {
            anyhow::bail!("give machine IDs or filters, not both");
        }
        if self.ids.is_empty() && !self.by_filter() {
            anyhow::bail!(
                "name the machines: IDs, or filters (--state, --provider-status, --heartbeat, --search, --location, --project, --bmc, --boot, --plan)"
            );
        }
        Ok((self.ids.len() == 1).then(|| self.ids[0]))
    }
}

/// Starts a rollout of `image` (or of `erasure`) over the machines
/// `t` names, and says so.
async fn start_rollout(
    cfg: &Config,
    bmdb: &Bmdb,
    t: &Targets,
    image: &shepherd_proto::api::ImageInstallation,
    erasure: Option<&shepherd_proto::api::DiskErasure>,
) -> anyhow::Result<()> {
    use shepherd::bmdb::rollouts;
    if !(1..=10_000).contains(&t.max_parallel) {
        anyhow::bail!("--max-parallel must be within 1 and 10000");
    }
    if t.max_failures < 0 {
        anyhow::bail!("--max-failures must not be negative");
    }
    let filter = t.filter.fleet(cfg.recoverer.heartbeat_stale_after);
    let selection = if t.ids.is_empty() {
        t.filter.described()
    } else {
        format!("{} machines by ID", t.ids.len())
    };
    let id = uuid::Uuid::new_v4();
    let r = bmdb
        .transact(async |tx| {
            let ids: Vec<uuid::Uuid> = if t.ids.is_empty() {
                machines::fleet_page(tx, &filter, 100_000, 0)
                    .await?
                    .0
                    .into_iter()
                    .map(|m| m.machine_id)
                    .collect()
            } else {
                let mut seen = std::collections::HashSet::new();
                t.ids.iter().copied().filter(|i| seen.insert(*i)).collect()
            };
            rollouts::create(
                tx,
                &rollouts::NewRollout {
                    id,
                    image,
                    erasure,
                    baseline: None,
                    max_parallel: t.max_parallel,
                    max_failures: t.max_failures,
                    selection: &selection,
                    machines: &ids,
                    created_by: "cli",
                },
            )
            .await
        })
        .await?;
    println!(
        "rollout {}: {} machines ({selection}), {} at once, stops after {} failures: {}",
        r.id,
        r.counts.waiting,
        r.max_parallel,
        r.max_failures + 1,
        r.image_url
    );
    println!(
        "running shepherds move it on; `shepherd rollouts show {}` follows it",
        r.id
    );
    Ok(())
}

/// The image an `install` asks for, checked.
pub async fn image_of(
    cfg: &Config,
    bmdb: &Bmdb,
    a: &InstallArgs,
) -> anyhow::Result<shepherd_proto::api::ImageInstallation> {
    use shepherd_proto::api::ImageInstallation;
    let mut image = ImageInstallation {
        size_bytes: a.size,
        allow_boot_disk: a.allow_boot_disk,
        reboot: a.reboot,
        set_efi_boot_entry: a.set_efi_boot_entry,
        deadline_seconds: a.deadline.map(|d| d.as_secs() as i64).unwrap_or(0),
        ..Default::default()
    };
    match (&a.url, &a.served) {
        (Some(_), Some(_)) => anyhow::bail!("give --url or --served, not both"),
        (None, None) => anyhow::bail!("give --url (with --digest) or --served"),
        (Some(url), None) => {
            image.url = url.clone();
            image.digest = a.digest.clone().unwrap_or_default();
        }
        (None, Some(name)) => {
            let Some(dir) = cfg.installations.images_dir.clone() else {
                anyhow::bail!(
                    "--served needs installations.images_dir (the image server's directory)"
                );
            };
            let ca = bmdb
                .transact(async |tx| {
                    shepherd::bmdb::callback::ca(tx, || {
                        Err("no callback CA yet: start shepherd once first".into())
                    })
                    .await
                })
                .await?;
            let endpoint = cfg.installations.images_endpoint(
                cfg.bmaas
                    .endpoint
                    .as_deref()
                    .or(cfg.initializer.agent_endpoint.as_deref()),
            );
            let catalog = shepherd::images::ImageCatalog::new(dir, &endpoint, ca.certificate)
                .with_peers(cfg.installations.peers)
                .with_peer_port(cfg.installations.peer_port);
            let served = catalog
                .resolve(name)
                .map_err(|e| anyhow::anyhow!("--served: {e}"))?;
            served.apply_to(&mut image);
        }
    }
    image.disk = a.disk.hints();
    image.first_boot = first_boot_of(a)?;
    shepherd::bmdb::installations::check_image(&image).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(image)
}

/// The first-boot data the flags ask for, if any.
fn first_boot_of(
    a: &InstallArgs,
) -> anyhow::Result<Option<shepherd_proto::api::image_installation::FirstBoot>> {
    use shepherd_proto::api::FirstBootFiles;
    use shepherd_proto::api::image_installation::FirstBoot;
    let read = |flag: &str, p: &std::path::Path| -> anyhow::Result<Vec<u8>> {
        std::fs::read(p).map_err(|e| anyhow::anyhow!("--{flag} {}: {e}", p.display()))
    };
    let user_data = a
        .user_data
        .as_deref()
        .map(|p| read("user-data", p))
        .transpose()?;
    let network = a
        .network_config
        .as_deref()
        .map(|p| read("network-config", p))
        .transpose()?;
    let keys: Vec<String> = match a.ssh_authorized_keys.as_deref() {
        Some(p) => String::from_utf8(read("ssh-authorized-keys", p)?)
            .map_err(|_| anyhow::anyhow!("--ssh-authorized-keys {}: not UTF-8", p.display()))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect(),
        None => Vec::new(),
    };
    if a.ssh_authorized_keys.is_some() && keys.is_empty() {
        anyhow::bail!("--ssh-authorized-keys: the file holds no key");
    }
    if user_data.is_none() && network.is_none() && keys.is_empty() && a.hostname.is_none() {
        if a.config_drive {
            anyhow::bail!(
                "--config-drive: give the first-boot data (--user-data, --ssh-authorized-keys, --hostname, --network-config)"
            );
        }
        return Ok(None);
    }
    let mut files = std::collections::HashMap::new();
    if a.config_drive {
        let mut meta = serde_json::Map::new();
        if let Some(h) = &a.hostname {
            meta.insert("hostname".into(), h.clone().into());
            meta.insert("name".into(), h.clone().into());
        }
        if !keys.is_empty() {
            let k: serde_json::Map<String, serde_json::Value> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("key-{i}"), k.clone().into()))
                .collect();
            meta.insert("public_keys".into(), k.into());
        }
        files.insert(
            "openstack/latest/meta_data.json".to_string(),
            serde_json::to_vec_pretty(&meta)?,
        );
        if let Some(u) = user_data {
            files.insert("openstack/latest/user_data".into(), u);
        }
        if let Some(n) = network {
            files.insert("openstack/latest/network_data.json".into(), n);
        }
        return Ok(Some(FirstBoot::ConfigDrive(FirstBootFiles {
            files,
            disk: None,
        })));
    }
    // YAML takes JSON strings: every value quoted, whatever it holds.
    let q = |v: &str| serde_json::Value::from(v).to_string();
    let mut meta = String::new();
    if let Some(h) = &a.hostname {
        meta += &format!("local-hostname: {}\n", q(h));
    }
    if !keys.is_empty() {
        meta += "public-keys:\n";
        for k in &keys {
            meta += &format!("  - {}\n", q(k));
        }
    }
    files.insert("meta-data".to_string(), meta.into_bytes());
    files.insert(
        "user-data".to_string(),
        user_data.unwrap_or_else(|| b"#cloud-config\n{}\n".to_vec()),
    );
    if let Some(n) = network {
        files.insert("network-config".into(), n);
    }
    Ok(Some(FirstBoot::Nocloud(FirstBootFiles {
        files,
        disk: None,
    })))
}

pub async fn run(mut cfg: Config, a: InstallArgs) -> anyhow::Result<()> {
    use shepherd::bmdb::installations::{self, Asked};
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let image = image_of(&cfg, &bmdb, &a).await?;
    if let Some(id) = a.targets.single()? {
        let asker = cli_asker(a.reason.as_deref());
        return match bmdb
            .transact(async |tx| installations::ask(tx, id, &image, &asker).await)
            .await?
        {
            Asked::Done { generation, .. } => {
                println!("install {id}: generation {generation}: {}", image.url);
                Ok(())
            }
            Asked::Refused(why) => anyhow::bail!("install refused: {why}"),
            Asked::NotFound => anyhow::bail!("machine {id} is not in the BMDB"),
        };
    }
    start_rollout(&cfg, &bmdb, &a.targets, &image, None).await
}

#[derive(clap::Args)]
pub struct DeprovisionArgs {
    #[command(flatten)]
    targets: Targets,
    /// metadata (partition tables and signatures; the default), discard,
    /// secure (the disk's own erase, where it advertises one) or overwrite.
    #[arg(long, default_value = "metadata")]
    mode: String,
    /// Only the disks matching every hint given (default: every disk).
    #[command(flatten)]
    disk: DiskHintArgs,
    /// The disk the running system boots from may be erased.
    #[arg(long)]
    allow_boot_disk: bool,
    /// How long the agent may take (default 2h).
    #[arg(long, value_parser = humantime::parse_duration)]
    deadline: Option<std::time::Duration>,
    #[arg(long)]
    reason: Option<String>,
}

/// `shepherd machines deprovision`.
pub async fn deprovision(mut cfg: Config, a: DeprovisionArgs) -> anyhow::Result<()> {
    use shepherd::bmdb::installations::{self, Asked};
    use shepherd_proto::api::DiskErasure;
    use shepherd_proto::names::{check_erasure, parse_erase_mode};
    let mode = parse_erase_mode(&a.mode).map_err(|e| anyhow::anyhow!("--mode: {e}"))?;
    let erasure = DiskErasure {
        mode: mode as i32,
        disk: a.disk.hints(),
        allow_boot_disk: a.allow_boot_disk,
        deadline_seconds: a.deadline.map(|d| d.as_secs() as i64).unwrap_or(0),
    };
    if a.deadline.is_some_and(|d| d.is_zero()) {
        anyhow::bail!("--deadline: must be from 1s to 7d");
    }
    check_erasure(&erasure).map_err(|e| anyhow::anyhow!("{}", as_flags(&e)))?;
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let asker = cli_asker(a.reason.as_deref());
    let Some(id) = a.targets.single()? else {
        return start_rollout(&cfg, &bmdb, &a.targets, &Default::default(), Some(&erasure)).await;
    };
    match bmdb
        .transact(async |tx| installations::deprovision(tx, id, &erasure, &asker).await)
        .await?
    {
        Asked::Done { generation, audit } => {
            println!("deprovision {id}: {}", audit.detail);
            let _ = generation;
            Ok(())
        }
        Asked::Refused(why) => anyhow::bail!("deprovision refused: {why}"),
        Asked::NotFound => anyhow::bail!("machine {id} is not in the BMDB"),
    }
}
