//! A console's reader: opens it (SOL or the BMC's SSH), hands its actor
//! what it prints and types what it is given, until stopped or the
//! console ends; then says why.

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::{ConsoleSource, sol, ssh};
use crate::config::IpmiConfig;

/// From the reader: bytes, or its end (with why).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) enum FromReader {
    Bytes { generation: u64, bytes: Vec<u8> },
    Ended { generation: u64, why: String },
    Suite { generation: u64, suite: u8 },
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
            Stream::Ssh(s) => s.write(bytes).await,
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
}

/// Hands the actor what `stream` prints and types what it is given,
/// until stopped or the console ends; `spoke`: called at its first bytes.
async fn pump(
    mut stream: Stream,
    generation: u64,
    me: &Recipient<FromReader>,
    stop: &mut oneshot::Receiver<()>,
    input: &mut mpsc::Receiver<Vec<u8>>,
    mut spoke: impl FnMut(),
) -> Ended {
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
            chunk = stream.read() => match chunk {
                Some(bytes) => {
                    spoke();
                    me.do_send(FromReader::Bytes { generation, bytes });
                }
                None => return Ended::Closed(Box::new(stream)),
            },
        }
    }
}

/// The reader: opens the console and pumps it; says why it ended.
pub(super) async fn read(
    source: ConsoleSource,
    ipmi: IpmiConfig,
    suite: Option<u8>,
    generation: u64,
    me: Recipient<FromReader>,
    mut stop: oneshot::Receiver<()>,
    mut input: mpsc::Receiver<Vec<u8>>,
) {
    let ended = |why: String| FromReader::Ended { generation, why };
    match source {
        ConsoleSource::Sol { target, bmc } => {
            let suites: Vec<u8> = match suite {
                Some(s) => vec![s],
                None => sol::SUITES.to_vec(),
            };
            let mut last = String::new();
            for (i, s) in suites.iter().copied().enumerate() {
                let stream = match sol::activate(&ipmi, &target, &bmc, s) {
                    Ok(st) => Stream::Sol(st),
                    Err(e) => return me.do_send(ended(e)),
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
                let Ended::Closed(closed) =
                    pump(stream, generation, &me, &mut stop, &mut input, tell).await
                else {
                    return;
                };
                let Stream::Sol(stream) = *closed else {
                    return;
                };
                let spoke = stream.spoke;
                last = stream.ended(&bmc).await;
                // A session that never printed may be the suite's fault:
                // the next one is tried.
                if spoke || i + 1 == suites.len() {
                    break;
                }
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
                Err(e) => return me.do_send(ended(e)),
            };
            let Ended::Closed(closed) =
                pump(stream, generation, &me, &mut stop, &mut input, || {}).await
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
