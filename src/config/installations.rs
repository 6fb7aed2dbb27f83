//! `[installations]`: operating system installations, their rollouts and
//! the image server (the images agents fetch, the boot image BMCs fetch).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, endpoint_host};

/// Operating system installations: rollouts, and the image server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstallationsConfig {
    /// How often running rollouts are moved on.
    #[serde(with = "humantime_serde")]
    pub rollout_interval: Duration,
    /// An installation or erasure on which nothing moved for this long (no
    /// agent took it, or its agent's progress stood still or stopped
    /// coming, while the callback was served) is failed with the cause.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// shepherd serves the images in this directory (HTTP Range, over TLS
    /// with a certificate of the callback CA, which agents are given).
    /// Unset: no image server; installations name their image's URL.
    pub images_dir: Option<PathBuf>,
    pub images_listen: std::net::SocketAddr,
    /// `host:port` agents fetch served images from. Unset: the host of
    /// `bmaas.endpoint` and the port of `images_listen`.
    pub images_endpoint: Option<String>,
    /// `host:port` BMCs fetch each boot's copy of the boot image from (a
    /// BMC's management network is often not its machine's). Unset:
    /// `images_endpoint`'s.
    pub boot_endpoint: Option<String>,
    /// The boot image (`scripts/boot-image`, its `.slot` beside it) the
    /// image server serves per boot. Unset: `shepherd-boot.iso` beside the
    /// shepherd binary, if there is one.
    pub boot_image: Option<PathBuf>,
    /// Whether machines installing one served image fetch its chunks from
    /// each other (each checked against the image's manifest), the image
    /// server answering what no machine holds. Off: every machine fetches
    /// the whole image from the image server.
    pub peers: bool,
    /// The TCP port every agent's chunk server listens on (a room whose
    /// firewall opens one port between machines). 0: one each agent
    /// chooses.
    pub peer_port: u16,
}

impl Default for InstallationsConfig {
    fn default() -> Self {
        InstallationsConfig {
            rollout_interval: Duration::from_secs(5),
            deadline: Duration::from_secs(60 * 60),
            images_dir: None,
            images_listen: ([127, 0, 0, 1], 7831).into(),
            images_endpoint: None,
            boot_endpoint: None,
            boot_image: None,
            peers: true,
            peer_port: 0,
        }
    }
}

impl InstallationsConfig {
    /// Where agents fetch served images: `images_endpoint`, else the
    /// agents' callback host (`callback`, an endpoint) with the image
    /// server's port, else the image server's own address.
    pub fn images_endpoint(&self, callback: Option<&str>) -> String {
        if let Some(e) = &self.images_endpoint {
            return e.clone();
        }
        let port = self.images_listen.port();
        match callback.and_then(endpoint_host) {
            Some(h) if h.contains(':') => format!("[{h}]:{port}"),
            Some(h) => format!("{h}:{port}"),
            None => self.images_listen.to_string(),
        }
    }

    pub(super) fn validate(&mut self) -> Result<(), ConfigError> {
        ConfigError::positive("installations.rollout_interval", self.rollout_interval)?;
        if self.deadline < Duration::from_secs(60) {
            return Err(ConfigError::key(
                "installations.deadline",
                "must be at least 1m (an agent reports progress every few seconds while it works)",
            ));
        }
        if self
            .images_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            self.images_dir = None;
        }
        if self
            .boot_image
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            self.boot_image = None;
        }
        if let Some(e) = &self.images_endpoint {
            if e.trim().is_empty() {
                self.images_endpoint = None;
            } else if endpoint_host(e).is_none() {
                return Err(ConfigError::key(
                    "installations.images_endpoint",
                    "must be host:port (where agents fetch served images)",
                ));
            }
        }
        if let Some(e) = &self.boot_endpoint {
            if e.trim().is_empty() {
                self.boot_endpoint = None;
            } else if endpoint_host(e).is_none() {
                return Err(ConfigError::key(
                    "installations.boot_endpoint",
                    "must be host:port (where BMCs fetch boot images)",
                ));
            }
        }
        Ok(())
    }
}
