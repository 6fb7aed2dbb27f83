//! What an installation request holds and how shepherd checks it before
//! any agent sees it: the image (`check_image`), the erasure
//! (`check_erasure`, the protocol crate's), and the first-boot data,
//! summarised as digests and filled per machine.

use shepherd_proto::api::{ImageInstallation, image_installation};
use uuid::Uuid;

pub use shepherd_proto::names::{check_erasure, erase_mode_name_of as erase_mode_name};

/// The first-boot data of `image` as shown: the volume and each file's
/// name, size and SHA-256 (never its bytes: user-data holds secrets).
pub fn first_boot_summary(image: &ImageInstallation) -> Option<String> {
    use sha2::Digest as _;
    let (volume, files) = match image.first_boot.as_ref()? {
        image_installation::FirstBoot::Nocloud(f) => ("nocloud", f),
        image_installation::FirstBoot::ConfigDrive(f) => ("config-drive", f),
    };
    let mut names: Vec<&String> = files.files.keys().collect();
    names.sort();
    let each: Vec<String> = names
        .iter()
        .map(|n| {
            let b = &files.files[*n];
            format!(
                "{n} {} B sha256:{}",
                b.len(),
                hex::encode(sha2::Sha256::digest(b))
            )
        })
        .collect();
    let on = if files.disk.is_some() {
        " (on another disk)"
    } else {
        ""
    };
    Some(format!("{volume}{on}: {}", each.join(", ")))
}

/// `url` is an http:// or https:// URL with a host; the error names `field`.
fn check_url(field: &str, url: &str) -> Result<(), String> {
    let url = url.trim();
    if url.is_empty() {
        return Err(format!("{field}: required"));
    }
    match url.parse::<http::Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => Ok(()),
        _ => Err(format!(
            "{field}: {url:?} is not an http:// or https:// URL"
        )),
    }
}

/// Checks what shepherd can check of an image request before any agent
/// sees it; the error names the field.
pub fn check_image(image: &ImageInstallation) -> Result<(), String> {
    check_url("image.url", &image.url)?;
    shepherd_proto::digest::parse_digest(&image.digest)
        .map_err(|e| format!("image.digest: {e}"))?;
    if let Some(m) = &image.manifest {
        check_url("image.manifest.url", &m.url)?;
        match shepherd_proto::digest::parse_digest(&m.digest) {
            Ok(d) if d.algorithm == shepherd_proto::digest::Algorithm::Sha256 => {}
            Ok(_) => return Err("image.manifest.digest: sha256:<hex> only".into()),
            Err(e) => return Err(format!("image.manifest.digest: {e}")),
        }
    }
    if let Some(swarm) = &image.swarm {
        if image.manifest.is_none() {
            return Err(
                "image.swarm: needs image.manifest (a chunk from a peer is checked against it)"
                    .into(),
            );
        }
        check_url("image.swarm.url", &swarm.url)?;
    }
    if image.size_bytes.is_some_and(|s| s < 0) {
        return Err("image.size_bytes: negative".into());
    }
    if image.deadline_seconds < 0 {
        return Err("image.deadline_seconds: negative".into());
    }
    if let Some(fb) = &image.first_boot {
        let files = match fb {
            image_installation::FirstBoot::Nocloud(f)
            | image_installation::FirstBoot::ConfigDrive(f) => f,
        };
        if files.files.is_empty() {
            return Err("image.first_boot: no files".into());
        }
        let mut total = 0;
        for (name, content) in &files.files {
            check_first_boot_path(name).map_err(|e| format!("image.first_boot: {e}"))?;
            total += name.len() + content.len();
        }
        if total > MAX_FIRST_BOOT {
            return Err(format!(
                "image.first_boot: {total} bytes; at most {MAX_FIRST_BOOT}"
            ));
        }
    }
    if let Some(h) = &image.disk {
        shepherd_proto::names::check_disk_hints("image.disk", h)?;
    }
    Ok(())
}

/// The most first-boot data an installation carries, all files together
/// (the volume the agent writes is 16 MiB at least).
pub const MAX_FIRST_BOOT: usize = 1 << 20;

/// A first-boot file's path inside its volume (shared with the agent).
pub use shepherd_proto::first_boot::check_path as check_first_boot_path;

/// The first-boot data as this machine's agent gets it: the placeholders
/// `{{machine_id}}`, `{{provider_id}}`, `{{generation}}` and
/// `{{instance_id}}` filled in the meta files (NoCloud's `meta-data` and
/// `network-config`; the config drive's `meta_data.json` and
/// `network_data.json`; never in user-data, which may be a template of its
/// own), and the instance ID set to `<machine>-g<generation>`: it changes
/// with every installation, so cloud-init runs again on each.
pub fn fill_first_boot(
    image: &mut ImageInstallation,
    machine_id: Uuid,
    provider_id: Option<&str>,
    generation: i32,
) {
    let instance_id = format!("{machine_id}-g{generation}");
    let fill = |b: &[u8]| -> Vec<u8> {
        String::from_utf8_lossy(b)
            .replace("{{machine_id}}", &machine_id.to_string())
            .replace("{{provider_id}}", provider_id.unwrap_or(""))
            .replace("{{generation}}", &generation.to_string())
            .replace("{{instance_id}}", &instance_id)
            .into_bytes()
    };
    match image.first_boot.as_mut() {
        Some(image_installation::FirstBoot::Nocloud(f)) => {
            for name in ["meta-data", "network-config"] {
                if let Some(b) = f.files.get_mut(name) {
                    *b = fill(b);
                }
            }
            let meta = f.files.entry("meta-data".into()).or_default();
            // JSON is YAML too: a JSON object gets the key instead of a line.
            if let Ok(serde_json::Value::Object(mut o)) = serde_json::from_slice(meta) {
                o.insert("instance-id".into(), instance_id.clone().into());
                *meta = serde_json::to_vec_pretty(&o).unwrap_or_default();
                return;
            }
            let text = String::from_utf8_lossy(meta);
            let mut lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("instance-id:"))
                .collect();
            let id = format!("instance-id: {instance_id}");
            lines.insert(0, &id);
            *meta = (lines.join("\n") + "\n").into_bytes();
        }
        Some(image_installation::FirstBoot::ConfigDrive(f)) => {
            for name in [
                "openstack/latest/meta_data.json",
                "openstack/latest/network_data.json",
            ] {
                if let Some(b) = f.files.get_mut(name) {
                    *b = fill(b);
                }
            }
            let meta = f
                .files
                .entry("openstack/latest/meta_data.json".into())
                .or_insert_with(|| b"{}".to_vec());
            let mut v: serde_json::Value =
                serde_json::from_slice(meta).unwrap_or_else(|_| serde_json::json!({}));
            if let Some(o) = v.as_object_mut() {
                o.insert("uuid".into(), instance_id.clone().into());
            }
            *meta = serde_json::to_vec_pretty(&v).unwrap_or_default();
        }
        None => {}
    }
}

#[cfg(test)]
mod first_boot_tests {
    use super::*;
    use shepherd_proto::api::FirstBootFiles;
    use shepherd_proto::api::image_installation::FirstBoot;

    fn with(fb: FirstBoot) -> ImageInstallation {
        ImageInstallation {
            first_boot: Some(fb),
            ..Default::default()
        }
    }

    fn files(list: &[(&str, &str)]) -> FirstBootFiles {
        FirstBootFiles {
            files: list
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
            disk: None,
        }
    }

    #[test]
    fn first_boot_templates_are_filled_per_machine_and_generation() {
        let m = Uuid::from_u128(7);
        let mut i = with(FirstBoot::Nocloud(files(&[
            (
                "meta-data",
                "instance-id: mine\nlocal-hostname: web-{{provider_id}}\n",
            ),
            ("user-data", "#cloud-config\n# {{provider_id}} stays\n"),
        ])));
        fill_first_boot(&mut i, m, Some("rack1-u12"), 3);
        let Some(FirstBoot::Nocloud(f)) = &i.first_boot else {
            panic!()
        };
        let meta = String::from_utf8(f.files["meta-data"].clone()).unwrap();
        assert_eq!(
            meta,
            format!("instance-id: {m}-g3\nlocal-hostname: web-rack1-u12\n")
        );
        assert_eq!(
            f.files["user-data"],
            b"#cloud-config\n# {{provider_id}} stays\n"
        );
        // JSON meta-data keeps being JSON.
        let mut i = with(FirstBoot::Nocloud(files(&[(
            "meta-data",
            "{\"local-hostname\": \"h\"}",
        )])));
        fill_first_boot(&mut i, m, None, 1);
        let Some(FirstBoot::Nocloud(f)) = &i.first_boot else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_slice(&f.files["meta-data"]).unwrap();
        assert_eq!(v["instance-id"], format!("{m}-g1"));
        assert_eq!(v["local-hostname"], "h");
        // A config drive's meta_data.json gets its uuid, made if absent.
        let mut i = with(FirstBoot::ConfigDrive(files(&[(
            "openstack/latest/user_data",
            "#cloud-config\n",
        )])));
        fill_first_boot(&mut i, m, None, 2);
        let Some(FirstBoot::ConfigDrive(f)) = &i.first_boot else {
            panic!()
        };
        let v: serde_json::Value =
            serde_json::from_slice(&f.files["openstack/latest/meta_data.json"]).unwrap();
        assert_eq!(v["uuid"], format!("{m}-g2"));
        // Shown as digests only.
        let s = first_boot_summary(&i).unwrap();
        assert!(
            s.starts_with("config-drive: openstack/latest/meta_data.json "),
            "{s}"
        );
        assert!(!s.contains("cloud-config"), "{s}");
    }

    #[test]
    fn first_boot_paths_must_be_plain_relative_names() {
        for good in ["user-data", "openstack/latest/meta_data.json"] {
            assert!(check_first_boot_path(good).is_ok(), "{good}");
        }
        for bad in ["", "/etc/passwd", "../x", "a//b", "a/./b", "a\\b"] {
            assert!(check_first_boot_path(bad).is_err(), "{bad:?}");
        }
    }
}
