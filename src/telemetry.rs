//! Logging: tracing with a filter from `log.level` (or `RUST_LOG`), as text
//! or JSON lines on stderr. Under systemd, when stderr is the journal's
//! stream, each line starts with its syslog priority (`<4>` for a warning,
//! sd-daemon(3)), so `journalctl -p warning` finds shepherd's warnings.

use std::io::Write;

use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. A second call is a no-op (library use).
pub fn init(cfg: &LogConfig) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| EnvFilter::new(&cfg.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(Stderr {
            journal: stderr_is_journal(),
        });
    let _ = match cfg.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Whether stderr is the stream systemd connected to the journal: the
/// device and inode `JOURNAL_STREAM` names (systemd.exec(5)).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        let (d, i) = v.split_once(':')?;
        Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// stderr, each event's line prefixed with its syslog priority when it
/// goes to the journal.
struct Stderr {
    journal: bool,
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter { prefix: None }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> EventWriter {
        let prefix = self.journal.then(|| match *meta.level() {
            Level::ERROR => "<3>",
            Level::WARN => "<4>",
            Level::INFO => "<6>",
            Level::DEBUG | Level::TRACE => "<7>",
        });
        EventWriter { prefix }
    }
}

/// One event's writer: the prefix goes out with its first bytes.
struct EventWriter {
    prefix: Option<&'static str>,
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        if let Some(p) = self.prefix.take() {
            err.write_all(p.as_bytes())?;
        }
        err.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// This process's peak resident set size in MB (`VmHWM`), 0 if unknown.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Raises this process's open-files limit as far as it may go: the soft
/// limit to the hard one, and the hard one (when the process may, as
/// root) to the kernel's `nr_open`, up to 2^20. Every agent holds a
/// connection and every simulated machine a listener: the usual soft limit
/// of 1,024 is a few hundred machines. Returns the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(hard)
        .min(1 << 20);
    if ceiling > hard && setrlimit(Resource::RLIMIT_NOFILE, ceiling, ceiling).is_ok() {
        return ceiling;
    }
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}
