//! `shepherd machines install`: an operating system installed on one
//! machine, or rolled out over a selection.

use shepherd::bmdb::Bmdb;
use shepherd::bmdb::machines::{self, MachineState};

use super::parse::{parse_heartbeat, parse_provider_status, parse_state};
use shepherd::config::Config;

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Machine IDs (one: a single installation; several: a rollout in this
    /// order).
    ids: Vec<uuid::Uuid>,
    /// A rollout over the machines in this state…
    #[arg(long, value_parser = parse_state)]
    state: Option<MachineState>,
    /// …whose provider reports this status…
    #[arg(long, value_parser = parse_provider_status)]
    provider_status: Option<shepherd::bmdb::ProviderStatus>,
    /// …whose agent is heartbeating, silent or no-agent…
    #[arg(long, value_parser = parse_heartbeat)]
    heartbeat: Option<machines::Heartbeat>,
    /// …matching this (ID prefix, part of a provider ID, address prefix).
    #[arg(long)]
    search: Option<String>,
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
    #[arg(long, default_value_t = 1)]
    max_parallel: i32,
    #[arg(long, default_value_t = 0)]
    max_failures: i32,
    #[arg(long)]
    reason: Option<String>,
}

/// The image an `install` asks for, checked.
pub async fn image_of(
    cfg: &Config,
    bmdb: &Bmdb,
    a: &InstallArgs,
) -> anyhow::Result<shepherd_proto::api::ImageInstallation> {
    use shepherd_proto::api::{DiskHints, ImageInstallation};
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
            let endpoint = shepherd::supervisor::images_endpoint(
                cfg,
                cfg.bmaas
                    .endpoint
                    .as_deref()
                    .or(cfg.initializer.agent_endpoint.as_deref()),
            );
            let catalog = shepherd::images::ImageCatalog::new(dir, &endpoint, ca.certificate);
            let served = catalog
                .resolve(name)
                .map_err(|e| anyhow::anyhow!("--served: {e}"))?;
            image.url = served.url;
            image.digest = served.digest;
            image.size_bytes = Some(served.size_bytes as i64);
            image.ca_certificate = served.ca_certificate;
        }
    }
    let any_hint = a.disk_serial.is_some()
        || a.disk_wwn.is_some()
        || a.disk_model.is_some()
        || a.disk_by_path.is_some()
        || a.disk_min_bytes.is_some()
        || a.disk_max_bytes.is_some()
        || a.disk_rotational.is_some();
    if any_hint {
        image.disk = Some(DiskHints {
            serial: a.disk_serial.clone().unwrap_or_default(),
            wwn: a.disk_wwn.clone().unwrap_or_default(),
            model: a.disk_model.clone().unwrap_or_default(),
            by_path: a.disk_by_path.clone().unwrap_or_default(),
            min_size_bytes: a.disk_min_bytes,
            max_size_bytes: a.disk_max_bytes,
            rotational: a.disk_rotational,
        });
    }
    shepherd::bmdb::installations::check_image(&image).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(image)
}

pub async fn run(mut cfg: Config, a: InstallArgs) -> anyhow::Result<()> {
    use shepherd::bmdb::installations::{self, Asked, Asker};
    use shepherd::bmdb::rollouts;
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let image = image_of(&cfg, &bmdb, &a).await?;
    let by_filter = a.state.is_some()
        || a.provider_status.is_some()
        || a.heartbeat.is_some()
        || a.search.is_some();
    if by_filter && !a.ids.is_empty() {
        anyhow::bail!("give machine IDs or filters, not both");
    }
    if a.ids.len() == 1 {
        let id = a.ids[0];
        let reason = a.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let asker = Asker {
            actor: "cli",
            action_id: uuid::Uuid::new_v4(),
            rollout_id: None,
            reason,
        };
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
    if a.ids.is_empty() && !by_filter {
        anyhow::bail!(
            "name the machines: IDs, or filters (--state, --provider-status, --heartbeat, --search)"
        );
    }
    if !(1..=10_000).contains(&a.max_parallel) {
        anyhow::bail!("--max-parallel must be within 1 and 10000");
    }
    if a.max_failures < 0 {
        anyhow::bail!("--max-failures must not be negative");
    }
    let filter = machines::FleetFilter {
        state: a.state,
        provider_status: a.provider_status,
        heartbeat: a.heartbeat,
        stale_after: cfg.recoverer.heartbeat_stale_after,
        search: a.search.clone(),
    };
    let selection = if a.ids.is_empty() {
        let mut parts = Vec::new();
        if let Some(s) = a.state {
            parts.push(format!("state={s}"));
        }
        if let Some(s) = a.provider_status {
            parts.push(format!("provider_status={s}"));
        }
        if let Some(h) = a.heartbeat {
            parts.push(format!("heartbeat={}", h.as_str()));
        }
        if let Some(q) = &a.search {
            parts.push(format!("q={q}"));
        }
        parts.join(" ")
    } else {
        format!("{} machines by ID", a.ids.len())
    };
    let id = uuid::Uuid::new_v4();
    let r = bmdb
        .transact(async |tx| {
            let ids: Vec<uuid::Uuid> = if a.ids.is_empty() {
                machines::fleet_page(tx, &filter, 100_000, 0)
                    .await?
                    .0
                    .into_iter()
                    .map(|m| m.machine_id)
                    .collect()
            } else {
                let mut seen = std::collections::HashSet::new();
                a.ids.iter().copied().filter(|i| seen.insert(*i)).collect()
            };
            rollouts::create(
                tx,
                &rollouts::NewRollout {
                    id,
                    image: &image,
                    max_parallel: a.max_parallel,
                    max_failures: a.max_failures,
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
