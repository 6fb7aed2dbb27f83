//! Booting a system from a URL through Redfish virtual media
//! (CONTRACTS.md §5), as Ironic and Metal3 drive it: find a virtual CD
//! (the system's `VirtualMedia`, else its manager's), insert the image
//! (`Inserted` and `WriteProtected` asked for, and asked again without them
//! when the BMC refuses them, as some do), a one-time boot override to
//! `Cd`, then power on or restart with the best reset the system offers,
//! and watch it come on. Ending the boot ejects the media and clears the
//! override, so the next boot is from the disk. A network boot
//! (CONTRACTS.md §6) is the same without the CD: a one-time `Pxe`
//! override, then the reset.
//!
//! Each step is one message to the BMC's actor, run as one atomic
//! sequence: one request in flight per BMC, and no other call between
//! insert and reset.

use std::time::{Duration, Instant};

use actix::prelude::*;
use awc::http::Method;
use serde_json::{Value, json};

use super::client::{BmcClient, BmcError, BmcErrorKind, Conn};
use super::system::{SystemInfo, members};

/// How a boot from virtual media was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaBoot {
    /// The virtual CD used (`@odata.id`).
    pub media: String,
    /// The reset that started it (`On`, `ForceRestart`, ...).
    pub reset: String,
    /// The BMC refused `Inserted`/`WriteProtected`; the image was inserted
    /// without them.
    pub plain_insert: bool,
    /// Media found inserted before, and ejected first.
    pub ejected_before: Option<String>,
}

/// Boots the system from `image_url` through a virtual CD: insert, a
/// one-time boot override to `Cd`, power on or restart; Ok once the
/// system reports `On` (within `power_timeout`).
#[derive(Message)]
#[rtype(result = "Result<MediaBoot, BmcError>")]
pub struct BootFromMedia {
    pub system: Option<String>,
    pub image_url: String,
    pub power_timeout: Duration,
    /// `UserName` and `Password` for the image's URL, given to the BMC with
    /// the insert (None: an open URL).
    pub credentials: Option<(String, String)>,
}

/// Ejects whatever the system's virtual CD holds and clears the boot
/// override: the next boot is from the disk. Ok(true) if media was
/// inserted.
#[derive(Message)]
#[rtype(result = "Result<bool, BmcError>")]
pub struct EndMediaBoot {
    pub system: Option<String>,
}

/// Ends a boot from media and restarts the system from its disk (as
/// [`EndMediaBoot`], then the best restart, watched until `On`): how an
/// installed machine is brought up in its installed system, so that BMCs
/// that apply media and override changes only at a power cycle apply them.
/// Ok(the reset used).
#[derive(Message)]
#[rtype(result = "Result<String, BmcError>")]
pub struct BootFromDisk {
    pub system: Option<String>,
    pub power_timeout: Duration,
    /// Whether there is virtual media to eject (false for a machine that
    /// boots the network: only the override is cleared).
    pub eject: bool,
    /// Secure Boot for this boot (a tenant's plan), else the host's
    /// `bmc.secure_boot`, else as it is.
    pub secure_boot: Option<bool>,
}

/// Boots the system from the network: a one-time boot override to `Pxe`
/// (in the system's boot mode, when it reports one), then power on or
/// restart; Ok (the reset used) once it reports `On`.
#[derive(Message)]
#[rtype(result = "Result<String, BmcError>")]
pub struct BootFromNetwork {
    pub system: Option<String>,
    pub power_timeout: Duration,
}

/// Clears the boot override (a network boot's end): the next boot is
/// from the disk.
#[derive(Message)]
#[rtype(result = "Result<(), BmcError>")]
pub struct ClearBootOverride {
    pub system: Option<String>,
}

/// What a virtual CD holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualCd {
    pub path: String,
    /// `Image`, empty when nothing is inserted.
    pub image: String,
    pub inserted: bool,
    insert_target: String,
    eject_target: String,
}

/// Reads the media state of the system's virtual CD.
#[derive(Message)]
#[rtype(result = "Result<VirtualCd, BmcError>")]
pub struct GetVirtualCd {
    pub system: Option<String>,
}

sequence!(BootFromMedia => MediaBoot, |c, msg| boot_from_media(&mut c, &msg).await);

sequence!(BootFromDisk => String, |c, msg| {
    if msg.eject {
        end_media_boot(&mut c, &msg.system).await?;
    } else {
        let info = c.get_system(&msg.system).await?;
        clear_override(&mut c, &info).await?;
    }
    let info = c.get_system(&msg.system).await?;
    secure_then_power(&mut c, &msg.system, &info, msg.secure_boot, None, msg.power_timeout).await
});

sequence!(BootFromNetwork => String, |c, msg| {
    let info = c.get_system(&msg.system).await?;
    let before = c.secure_boot_now(&info).await;
    boot_once_from(&mut c, &info, "Pxe").await?;
    secure_then_power(&mut c, &msg.system, &info, None, before, msg.power_timeout).await
});

sequence!(ClearBootOverride => (), |c, msg| {
    let info = c.get_system(&msg.system).await?;
    clear_override(&mut c, &info).await
});

sequence!(EndMediaBoot => bool, |c, msg| end_media_boot(&mut c, &msg.system).await);

sequence!(GetVirtualCd => VirtualCd, |c, msg| {
    let info = c.get_system(&msg.system).await?;
    virtual_cd(&mut c, &info).await
});

/// The first CD or DVD member of the system's `VirtualMedia`, else of its
/// managers'.
async fn virtual_cd(c: &mut Conn, info: &SystemInfo) -> Result<VirtualCd, BmcError> {
    let mut collections: Vec<String> = info.virtual_media.iter().cloned().collect();
    for manager in &info.managed_by {
        let m = c.call(Method::GET, manager, None, manager).await?;
        if let Some(p) = m["VirtualMedia"]["@odata.id"].as_str() {
            collections.push(p.to_string());
        }
    }
    let mut seen = Vec::new();
    for collection in &collections {
        let list = c.call(Method::GET, collection, None, collection).await?;
        for path in members(&list) {
            let media = c.call(Method::GET, &path, None, &path).await?;
            let types: Vec<&str> = media["MediaTypes"]
                .as_array()
                .map(|t| t.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            seen.push(format!("{path} ({})", types.join(", ")));
            if !types.iter().any(|t| matches!(*t, "CD" | "DVD")) {
                continue;
            }
            let action = |name: &str, fallback: &str| {
                media["Actions"][name]["target"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{path}/Actions/{fallback}"))
            };
            return Ok(VirtualCd {
                image: media["Image"].as_str().unwrap_or("").to_string(),
                inserted: media["Inserted"].as_bool().unwrap_or(false),
                insert_target: action("#VirtualMedia.InsertMedia", "VirtualMedia.InsertMedia"),
                eject_target: action("#VirtualMedia.EjectMedia", "VirtualMedia.EjectMedia"),
                path,
            });
        }
    }
    Err(c.err(BmcErrorKind::Config(if collections.is_empty() {
        format!(
            "system {} has no virtual media (no VirtualMedia on the system or its managers {:?})",
            info.path, info.managed_by
        )
    } else {
        format!(
            "system {} has no virtual CD or DVD among its virtual media [{}]",
            info.path,
            seen.join("; ")
        )
    })))
}

/// A refusal a plainer request may get past: 400 (and the 405/415/422
/// some BMCs answer for a property they do not take).
fn refused_as_asked(e: &BmcError) -> bool {
    matches!(e.kind, BmcErrorKind::Http { status, .. } if matches!(status, 400 | 405 | 415 | 422))
}

/// Inserts `image_url` (with `credentials` for it, if any); a BMC that
/// refuses `Inserted`/`WriteProtected` is asked again with the image alone.
/// Ok(true): the plain form. A BMC that refuses both forms with
/// credentials: `MediaAuthRefused` (the caller may ask without them).
async fn insert(
    c: &mut Conn,
    cd: &VirtualCd,
    image_url: &str,
    credentials: Option<&(String, String)>,
) -> Result<bool, BmcError> {
    let mut full = json!({ "Image": image_url, "Inserted": true, "WriteProtected": true });
    let mut plain = json!({ "Image": image_url });
    if let Some((user, password)) = credentials {
        for body in [&mut full, &mut plain] {
            body["UserName"] = json!(user);
            body["Password"] = json!(password);
        }
    }
    // A BMC's message may echo a property's value: never the password.
    let redact = |mut e: BmcError| {
        if let Some((_, password)) = credentials
            && let BmcErrorKind::Http { message, .. } = &mut e.kind
        {
            *message = message.replace(password.as_str(), "[redacted]");
        }
        e
    };
    let what = format!("VirtualMedia.InsertMedia on {}", cd.path);
    match c
        .call(Method::POST, &cd.insert_target, Some(&full), &what)
        .await
        .map_err(redact)
    {
        Ok(_) => Ok(false),
        Err(e) if refused_as_asked(&e) => {
            tracing::info!(bmc = %e.bmc, host = %e.host, error = %e, "InsertMedia refused with Inserted/WriteProtected; asking with the image alone");
            match c
                .call(Method::POST, &cd.insert_target, Some(&plain), &what)
                .await
                .map_err(redact)
            {
                Ok(_) => Ok(true),
                Err(e) if credentials.is_some() && refused_as_asked(&e) => Err(BmcError {
                    kind: BmcErrorKind::MediaAuthRefused(e.kind.to_string()),
                    ..e
                }),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

async fn eject(c: &mut Conn, cd: &VirtualCd) -> Result<(), BmcError> {
    let what = format!("VirtualMedia.EjectMedia on {}", cd.path);
    match c
        .call(Method::POST, &cd.eject_target, Some(&json!({})), &what)
        .await
    {
        Ok(_) => Ok(()),
        // Some BMCs want no body at all.
        Err(e) if refused_as_asked(&e) => c
            .call(Method::POST, &cd.eject_target, None, &what)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    }
}

/// The one-time boot override to `target` (`Cd`, `Pxe`; in the system's
/// boot mode, when it reports one).
async fn boot_once_from(c: &mut Conn, info: &SystemInfo, target: &str) -> Result<(), BmcError> {
    let mut boot = json!({
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideEnabled": "Once",
    });
    if let Some(mode) = &info.boot_mode {
        boot["BootSourceOverrideMode"] = json!(mode);
    }
    let what = format!("the boot override of {} ({target}, once)", info.path);
    c.call(
        Method::PATCH,
        &info.path,
        Some(&json!({ "Boot": boot })),
        &what,
    )
    .await
    .map(|_| ())
}

/// Clears the boot override: the next boot is from the disk. A BMC that
/// refuses `Disabled` is asked for the disk instead.
async fn clear_override(c: &mut Conn, info: &SystemInfo) -> Result<(), BmcError> {
    let what = format!("clearing the boot override of {}", info.path);
    let disabled = json!({ "Boot": { "BootSourceOverrideEnabled": "Disabled" } });
    match c
        .call(Method::PATCH, &info.path, Some(&disabled), &what)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if refused_as_asked(&e) => {
            let disk = json!({ "Boot": { "BootSourceOverrideTarget": "Hdd" } });
            c.call(Method::PATCH, &info.path, Some(&disk), &what)
                .await
                .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// The resets that start a boot, best first: a blank machine has no system
/// to shut down gracefully, so a forced restart comes first.
const BOOT_RESTARTS: [&str; 3] = ["ForceRestart", "PowerCycle", "GracefulRestart"];

/// Secure Boot as asked (`wanted`, else the host's configuration, else
/// `before`: see [`Conn::secure_boot_as_asked`]), then the power on or
/// restart that starts the boot; Ok(what was done, as the history says
/// it: "Secure Boot set on, then ForceRestart").
async fn secure_then_power(
    c: &mut Conn,
    system: &Option<String>,
    info: &SystemInfo,
    wanted: Option<bool>,
    before: Option<bool>,
    timeout: Duration,
) -> Result<String, BmcError> {
    let secure = c.secure_boot_as_asked(info, wanted, before).await?;
    let reset = power_boot(c, system, info, timeout).await?;
    Ok(match secure {
        Some(s) => format!("{s}, then {reset}"),
        None => reset,
    })
}

/// Powers the system on, or restarts it; watches it come on.
async fn power_boot(
    c: &mut Conn,
    system: &Option<String>,
    info: &SystemInfo,
    timeout: Duration,
) -> Result<String, BmcError> {
    let target = info
        .reset_target
        .clone()
        .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", info.path));
    let offers = |t: &str| info.reset_types.is_empty() || info.reset_types.iter().any(|x| x == t);
    let on = if offers("On") { "On" } else { "ForceOn" };
    let started = Instant::now();
    let used = if info.power() == "Off" {
        c.reset(system, Some(target.clone()), on).await?;
        on.to_string()
    } else {
        let mut used = None;
        for restart in BOOT_RESTARTS.iter().filter(|t| offers(t)) {
            match c.reset(system, Some(target.clone()), restart).await {
                Ok(()) => {
                    used = Some(restart.to_string());
                    break;
                }
                Err(e) if info.reset_types.is_empty() && refused_as_asked(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        match used {
            Some(u) => u,
            None => {
                c.reset(system, Some(target.clone()), "ForceOff").await?;
                wait_for_power(c, system, "Off", started, timeout).await?;
                c.reset(system, Some(target.clone()), on).await?;
                format!("ForceOff, then {on}")
            }
        }
    };
    wait_for_power(c, system, "On", started, timeout).await?;
    Ok(used)
}

async fn wait_for_power(
    c: &mut Conn,
    system: &Option<String>,
    want: &str,
    started: Instant,
    timeout: Duration,
) -> Result<(), BmcError> {
    loop {
        let last = match c.get_system(system).await {
            Ok(s) if s.power() == want => return Ok(()),
            Ok(s) => s.power().to_string(),
            // A BMC busy with the reset may not answer for a moment.
            Err(e) if e.kind.is_transient() => e.to_string(),
            Err(e) => return Err(e),
        };
        if started.elapsed() >= timeout {
            return Err(c.err(BmcErrorKind::Protocol(format!(
                "the system was not {want} {} after the reset (last: {})",
                humantime::format_duration(timeout),
                if last.is_empty() {
                    "no power state"
                } else {
                    &last
                }
            ))));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn boot_from_media(c: &mut Conn, msg: &BootFromMedia) -> Result<MediaBoot, BmcError> {
    let info = c.get_system(&msg.system).await?;
    let cd = virtual_cd(c, &info).await?;
    // Whatever is in the drive goes first: many BMCs refuse an insert
    // into a full drive. Media left there is an interrupted boot's, whose
    // override goes with it: the sequence starts again from a clean BMC.
    let ejected_before = if cd.inserted || !cd.image.is_empty() {
        eject(c, &cd).await?;
        clear_override(c, &info).await?;
        Some(cd.image.clone())
    } else {
        None
    };
    let plain_insert = insert(c, &cd, &msg.image_url, msg.credentials.as_ref()).await?;
    let before = c.secure_boot_now(&info).await;
    boot_once_from(c, &info, "Cd").await?;
    let reset = secure_then_power(c, &msg.system, &info, None, before, msg.power_timeout).await?;
    Ok(MediaBoot {
        media: cd.path,
        reset,
        plain_insert,
        ejected_before,
    })
}

async fn end_media_boot(c: &mut Conn, system: &Option<String>) -> Result<bool, BmcError> {
    let info = c.get_system(system).await?;
    let cd = virtual_cd(c, &info).await?;
    let had = cd.inserted || !cd.image.is_empty();
    if had {
        eject(c, &cd).await?;
    }
    clear_override(c, &info).await?;
    Ok(had)
}
