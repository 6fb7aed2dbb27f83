//! A console's reader: opens it (SOL or the BMC's SSH), hands its actor
//! what it prints and types what it is given, until stopped or the
//! console ends; then says why.
//!
//! A SOL console's BMC is pinged (`super::ping`) every
//! [`PING_EVERY`] while the console is silent: after [`LOST_AFTER`]
//! pings in a row without an answer the session is given up (ipmitool's
//! own keepalives take a minute and a half to), the actor told at once,
//! and the next reader waits for the BMC to answer before it activates
//! the console again; so viewers hear within seconds that the BMC went
//! away, and again when the console is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot, watch};

use super::ping;
use super::{ConsoleSource, sol, ssh};
use crate::config::IpmiConfig;

/// How often a silent SOL console's BMC is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(2);
/// How long a ping waits for its answer.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// Pings in a row without an answer before the BMC counts as gone.
pub const LOST_AFTER: u32 = 3;

/// From the reader: bytes, or its end (with why).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) enum FromReader {
    Bytes {
        generation: u64,
        bytes: Vec<u8>,
    },
    /// The console is open (SOL: ipmitool said the session is
    /// operational).
    Opened {
        generation: u64,
    },
    /// The BMC does not answer (the console cannot be opened until it
    /// does; the reader waits for it).
    Unanswered {
        generation: u64,
        why: String,
    },
    /// `lost`: the BMC stopped answering (the next reader may take back
    /// the payload the session held).
    Ended {
        generation: u64,
        why: String,
        lost: bool,
    },
    Suite {
        generation: u64,
        suite: u8,
    },
}

/// An open console, either way it is read.
enum Stream {
    Sol(sol::SolStream),
    Ssh(ssh::SshStream),
}

impl Stream {
    async fn read(&mut self) -> Option<Vec<u8>> {
        match self {
            Stream::Sol(s) => s.read().await,
            Stream::Ssh(s) => s.read().await,
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        let r = match self {
            Stream::Sol(s) => s.write(bytes).await.map_err(|e| e.to_string()),
            Stream::Ssh(s) => s.write(bytes).await.map_err(|e| e.to_string()),
        };
        if let Err(e) = r {
            tracing::debug!(error = %e, "a keystroke to the console was lost");
        }
    }
}

/// How a stream's reading ended.
enum Ended {
    /// Told to stop: the stream is closed.
    Stopped,
    /// The console ended: the stream, to say why.
    Closed(Box<Stream>),
    /// Its BMC stopped answering: the stream was ended; why.
    Lost(String),
}

/// Pings the BMC at `target` every [`PING_EVERY`] while nothing came from
/// its console meanwhile (`heard`, cleared at each ping); sends the count
/// of pings in a row that went unanswered and the last one's error. Ends
/// when its receiver is gone.
async fn watch_bmc(
    target: (String, u16),
    heard: Arc<AtomicBool>,
    misses: watch::Sender<(u32, String)>,
) {
    let mut n = 0u32;
    loop {
        tokio::time::sleep(PING_EVERY).await;
        if misses.is_closed() {
            return;
        }
        if heard.swap(false, Ordering::Relaxed) {
            n = 0;
            continue;
        }
        match ping::ping(&target, PING_TIMEOUT).await {
            Ok(()) => n = 0,
            Err(e) => {
                n += 1;
                if misses.send((n, e.to_string())).is_err() {
                    return;
                }
            }
        }
    }
}

/// Hands the actor what `stream` prints and types what it is given,
/// until stopped or the console ends; `spoke`: called at its first bytes.
/// A SOL stream's BMC is watched (`watch_bmc`): the stream is ended when
/// it stops answering.
async fn pump(
    mut stream: Stream,
    generation: u64,
    me: &Recipient<FromReader>,
    stop: &mut oneshot::Receiver<()>,
    input: &mut mpsc::Receiver<Vec<u8>>,
    bmc: Option<&(String, u16)>,
    mut spoke: impl FnMut(),
) -> Ended {
    let heard = Arc::new(AtomicBool::new(false));
    let (misses_tx, mut misses) = watch::channel((0u32, String::new()));
    if let Some(target) = bmc {
        tokio::spawn(watch_bmc(target.clone(), heard.clone(), misses_tx));
    }
    loop {
        tokio::select! {
            _ = &mut *stop => {
                match stream {
                    Stream::Sol(s) => s.close().await,
                    Stream::Ssh(s) => s.close().await,
                }
                return Ended::Stopped;
            }
            Some(k) = input.recv() => stream.write(&k).await,
            Ok(()) = misses.changed() => {
                let (n, why) = misses.borrow_and_update().clone();
                if n >= LOST_AFTER {
                    if let Stream::Sol(s) = stream {
                        s.kill().await;
                    }
                    return Ended::Lost(format!(
                        "its BMC stopped answering: {n} pings in a row over {} s went unanswered ({why})",
                        n * PING_EVERY.as_secs() as u32
                    ));
                }
            }
            chunk = stream.read() => match chunk {
                Some(bytes) => {
                    heard.store(true, Ordering::Relaxed);
                    if let Stream::Sol(s) = &mut stream
                        && s.opened()
                    {
                        me.do_send(FromReader::Opened { generation });
                    }
                    if !bytes.is_empty() {
                        spoke();
                        me.do_send(FromReader::Bytes { generation, bytes });
                    }
                }
                None => return Ended::Closed(Box::new(stream)),
            },
        }
    }
}

/// Waits until the BMC at `target` answers a ping, telling the actor once
/// while it does not; false when told to stop meanwhile.
async fn until_answered(
    target: &(String, u16),
    generation: u64,
    me: &Recipient<FromReader>,
    stop: &mut oneshot::Receiver<()>,
) -> bool {
    let mut told = false;
    loop {
        let e = match ping::ping(target, PING_TIMEOUT).await {
            Ok(()) => return true,
            Err(e) => e,
        };
        if !told {
            told = true;
            me.do_send(FromReader::Unanswered {
                generation,
                why: format!("its BMC does not answer ({e}): the console is opened when it does"),
            });
        }
        tokio::select! {
            _ = &mut *stop => return false,
            _ = tokio::time::sleep(PING_EVERY) => {}
        }
    }
}

/// The reader: opens the console and pumps it; says why it ended.
/// `reclaim`: the last reader lost its BMC, so a payload found active is
/// the one its session held, and is deactivated first.
#[allow(clippy::too_many_arguments)]
pub(super) async fn read(
    source: ConsoleSource,
    ipmi: IpmiConfig,
    suite: Option<u8>,
    generation: u64,
    me: Recipient<FromReader>,
    mut stop: oneshot::Receiver<()>,
    mut input: mpsc::Receiver<Vec<u8>>,
    mut reclaim: bool,
) {
    let ended = |why: String| FromReader::Ended {
        generation,
        why,
        lost: false,
    };
    match source {
        ConsoleSource::Sol { target, bmc } => {
            if !until_answered(&target, generation, &me, &mut stop).await {
                return;
            }
            let suites: Vec<u8> = match suite {
                Some(s) => vec![s],
                None => sol::SUITES.to_vec(),
            };
            let mut last = String::new();
            let mut i = 0;
            while let Some(s) = suites.get(i).copied() {
                let stream = match sol::activate(&ipmi, &target, &bmc, s) {
                    Ok(st) => Stream::Sol(st),
                    Err(e) => return me.do_send(ended(e.to_string())),
                };
                let mut told = suite.is_some();
                let tell = || {
                    if !told {
                        told = true;
                        me.do_send(FromReader::Suite {
                            generation,
                            suite: s,
                        });
                    }
                };
                let closed = match pump(
                    stream,
                    generation,
                    &me,
                    &mut stop,
                    &mut input,
                    Some(&target),
                    tell,
                )
                .await
                {
                    Ended::Closed(closed) => closed,
                    Ended::Stopped => return,
                    Ended::Lost(why) => {
                        return me.do_send(FromReader::Ended {
                            generation,
                            why,
                            lost: true,
                        });
                    }
                };
                let Stream::Sol(stream) = *closed else {
                    return;
                };
                let spoke = stream.spoke;
                last = stream.ended(&bmc).await;
                // The payload our lost session held: deactivated, then
                // this suite is tried again.
                if reclaim && !spoke && last.contains("already active") {
                    reclaim = false;
                    match sol::deactivate(&ipmi, &target, &bmc, s).await {
                        Ok(()) => {
                            tracing::info!(bmc = %format!("{}:{}", target.0, target.1), "the SOL payload our lost session held was deactivated");
                            continue;
                        }
                        Err(e) => last = format!("{last}; deactivating it: {e}"),
                    }
                }
                // A session that never printed may be the suite's fault:
                // the next one is tried.
                if spoke || i + 1 == suites.len() {
                    break;
                }
                i += 1;
            }
            me.do_send(ended(last));
        }
        ConsoleSource::Ssh {
            address,
            username,
            command,
            key_file,
            host_key,
        } => {
            let stream = match ssh::open(
                &address,
                &username,
                &command,
                &key_file,
                host_key.as_deref(),
            )
            .await
            {
                Ok(s) => Stream::Ssh(s),
                Err(e) => return me.do_send(ended(e.to_string())),
            };
            me.do_send(FromReader::Opened { generation });
            let Ended::Closed(closed) =
                pump(stream, generation, &me, &mut stop, &mut input, None, || {}).await
            else {
                return;
            };
            let Stream::Ssh(mut stream) = *closed else {
                return;
            };
            let why = stream.end.take().unwrap_or_default();
            stream.close().await;
            me.do_send(ended(why));
        }
    }
}
