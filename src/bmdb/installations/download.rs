//! The image server's gate: which agent may download which served image.

use uuid::Uuid;

use crate::bmdb::{BmdbError, Tx};

/// Whether an agent may download a served image (the image server's
/// gate): the agent is known by the key it proved in TLS, and its
/// machine's installation request, not yet answered, names the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadGrant {
    Allowed {
        machine_id: Uuid,
        generation: i32,
    },
    /// No machine's agent holds this key.
    UnknownAgent,
    /// The agent is known, but its machine was not asked to install this
    /// image (or its request was answered already).
    NotAsked {
        machine_id: Uuid,
    },
}

const DOWNLOADER: &str = "SELECT a.machine_id, i.generation, i.image_url, r.generation \
     FROM machine_agent_started a \
     LEFT JOIN machine_installation i USING (machine_id) \
     LEFT JOIN machine_os_installation_report r USING (machine_id) \
     WHERE a.agent_public_key = $1";

/// Whether the agent holding `key` may download the served image `name`
/// (see [`DownloadGrant`]): its machine's pending request's URL has the
/// path `/images/<name>`.
pub async fn download_grant(
    tx: &mut Tx<'_>,
    key: &[u8],
    name: &str,
) -> Result<DownloadGrant, BmdbError> {
    let rows = tx.query(DOWNLOADER, &[&key]).await?;
    let mut grant = DownloadGrant::UnknownAgent;
    for r in rows {
        let machine_id: Uuid = r.get(0);
        let asked: Option<i32> = r.get(1);
        let url: Option<String> = r.get(2);
        let answered: Option<i32> = r.get(3);
        let pending = asked.filter(|g| answered.is_none_or(|a| a < *g));
        let names = url.as_deref().is_some_and(|u| served_name(u) == Some(name));
        match pending {
            Some(generation) if names => {
                return Ok(DownloadGrant::Allowed {
                    machine_id,
                    generation,
                });
            }
            _ => grant = DownloadGrant::NotAsked { machine_id },
        }
    }
    Ok(grant)
}

/// The image name of a URL whose path is `/images/<name>` (how the image
/// server's catalog makes them), with no query.
pub fn served_name(url: &str) -> Option<&str> {
    let after_scheme = url.split_once("://")?.1;
    let path = &after_scheme[after_scheme.find('/')?..];
    let name = path.strip_prefix("/images/")?;
    (!name.is_empty() && !name.contains(['/', '?', '#'])).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::served_name;

    #[test]
    fn served_names_are_the_last_segment_of_an_images_path() {
        assert_eq!(
            served_name("https://10.0.2.100:7831/images/a.img"),
            Some("a.img")
        );
        assert_eq!(
            served_name("https://[::1]:7831/images/a+b.raw.zst"),
            Some("a+b.raw.zst")
        );
        for not in [
            "https://h/images/",
            "https://h/images/a/b.img",
            "https://h/other/a.img",
            "https://h/images/a.img?x=1",
            "https://h/x/images/a.img",
            "images/a.img",
            "https://h",
        ] {
            assert_eq!(served_name(not), None, "{not}");
        }
    }
}
