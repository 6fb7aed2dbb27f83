//! The loops over the fleet and what runs them: `[provisioner]`,
//! `[recoverer]`, `[updater]` and `[supervisor]`. The checks of
//! `[provisioner]`, `[updater]` and `[supervisor]` are in
//! `Config::validate`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, LeaseSettings, RecovererLease};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProvisionerConfig {
    /// Time between reconciliation rounds.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Machines to manage at most (0: no limit).
    pub max_machines: u32,
    /// Machines created per round at most.
    pub chunk_size: u32,
    /// Time between two machine creations.
    #[serde(with = "humantime_serde")]
    pub creation_interval: Duration,
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        ProvisionerConfig {
            interval: Duration::from_secs(60),
            max_machines: 50,
            chunk_size: 20,
            creation_interval: Duration::from_secs(5),
        }
    }
}

/// The Recoverer: reboots machines whose agent went quiet.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecovererConfig {
    pub enabled: bool,
    /// Recoveries at once, how often to look when idle (and to watch the
    /// brake), the backoff.
    #[serde(flatten)]
    pub lease: LeaseSettings<RecovererLease>,
    /// An agent with no heartbeat this long after it started is quiet.
    #[serde(with = "humantime_serde")]
    pub silent_after_start: Duration,
    /// An agent whose last heartbeat is older than this is quiet.
    #[serde(with = "humantime_serde")]
    pub heartbeat_stale_after: Duration,
    /// Beyond the threshold, how long the agent's callback endpoint must
    /// have been served without a break before its silence counts (the
    /// agents' longest wait between attempts plus a call's timeout).
    #[serde(with = "humantime_serde")]
    pub callback_grace: Duration,
    /// How long an agent restarted over SSH has to call before the machine
    /// is power-cycled instead.
    #[serde(with = "humantime_serde")]
    pub agent_restart_wait: Duration,
    /// After a power cycle, how long the agent has to come back by itself
    /// (its systemd unit) before the machine is taken over again.
    #[serde(with = "humantime_serde")]
    pub agent_return_wait: Duration,
    /// Agents whose callback endpoint no shepherd has served for this long
    /// (their shepherd is gone with its endpoint) are re-homed: restarted
    /// over SSH with this shepherd's endpoint, never power-cycled.
    #[serde(with = "humantime_serde")]
    pub rehome_after: Duration,
    /// The brake: power actions for silence stop while more machines than
    /// the larger of this count...
    pub brake_max_silent: u32,
    /// ...and this share of the fleet are silent, or that many power
    /// actions for silence were taken within `brake_window`.
    pub brake_max_silent_share: f64,
    #[serde(with = "humantime_serde")]
    pub brake_window: Duration,
    /// How long an operator's release of the brake lasts unless given.
    #[serde(with = "humantime_serde")]
    pub brake_release: Duration,
    /// How long a rebooted machine may take to come back.
    #[serde(with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// Time between looks at a rebooting machine.
    #[serde(with = "humantime_serde")]
    pub reboot_poll: Duration,
    /// A machine never seen going down counts as back after this long.
    #[serde(with = "humantime_serde")]
    pub reboot_settle: Duration,
}

impl Default for RecovererConfig {
    fn default() -> Self {
        RecovererConfig {
            enabled: true,
            lease: LeaseSettings::default(),
            silent_after_start: Duration::from_secs(30 * 60),
            heartbeat_stale_after: Duration::from_secs(10 * 60),
            callback_grace: Duration::from_secs(60),
            agent_restart_wait: Duration::from_secs(2 * 60),
            agent_return_wait: Duration::from_secs(3 * 60),
            rehome_after: Duration::from_secs(5 * 60),
            brake_max_silent: 3,
            brake_max_silent_share: 0.1,
            brake_window: Duration::from_secs(10 * 60),
            brake_release: Duration::from_secs(60 * 60),
            reboot_timeout: Duration::from_secs(10 * 60),
            reboot_poll: Duration::from_secs(5),
            reboot_settle: Duration::from_secs(60),
        }
    }
}

impl RecovererConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.lease.validate()?;
        for (k, d) in [
            ("recoverer.silent_after_start", self.silent_after_start),
            (
                "recoverer.heartbeat_stale_after",
                self.heartbeat_stale_after,
            ),
            ("recoverer.reboot_timeout", self.reboot_timeout),
            ("recoverer.reboot_poll", self.reboot_poll),
            ("recoverer.agent_restart_wait", self.agent_restart_wait),
            ("recoverer.agent_return_wait", self.agent_return_wait),
            ("recoverer.brake_window", self.brake_window),
            ("recoverer.brake_release", self.brake_release),
        ] {
            ConfigError::positive(k, d)?;
        }
        ConfigError::within(
            "recoverer.brake_max_silent_share",
            self.brake_max_silent_share,
            0.0..=1.0,
        )
    }
}

/// The Updater: refreshes provider records in the BMDB.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdaterConfig {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How often a Redfish BMC's firmware is read again (sooner when its
    /// system's BIOS version changes).
    #[serde(with = "humantime_serde")]
    pub firmware_interval: Duration,
}

impl Default for UpdaterConfig {
    fn default() -> Self {
        UpdaterConfig {
            enabled: true,
            interval: Duration::from_secs(60),
            firmware_interval: Duration::from_secs(3600),
        }
    }
}

impl UpdaterConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::positive("updater.interval", self.interval)?;
        ConfigError::positive("updater.firmware_interval", self.firmware_interval)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// On SIGINT/SIGTERM, how long running takeovers may finish.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Wait before restarting a failed part; first wait before reopening a
    /// lost session (attempts then double up to 2 s, or this if longer).
    #[serde(with = "humantime_serde")]
    pub restart_backoff: Duration,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            drain_timeout: Duration::from_secs(30),
            restart_backoff: Duration::from_secs(1),
        }
    }
}
