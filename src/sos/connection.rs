//! One SSH connection to the console server: its login, the console it
//! opens, and what goes each way. A connection's handler runs in russh's
//! tasks and holds nothing of the actor system's but the console's link:
//! it asks the door (`DoorRequest`, answered on shepherd's side) to log
//! in, to open the console, and to keep the audit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use russh::keys::PublicKey;
use russh::server::{Auth, ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, Pty};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::console::{ConsoleLink, ToViewer, VIEWER_BACKLOG};

/// Ctrl-]: leaves the console (as telnet's escape; `~.` is OpenSSH's own).
pub const ESCAPE: u8 = 0x1d;

/// Who logged in, and the machine they may reach.
#[derive(Debug, Clone)]
pub struct Grant {
    pub machine_id: Uuid,
    pub provider_id: Option<String>,
    /// `operator NAME` or `tenant project PROJECT key LABEL`.
    pub who: String,
    pub fingerprint: String,
    /// A tenant: shown nothing of the BMC (its address, its errors).
    pub tenant: bool,
}

/// Why a console was not opened for a connection: told to whoever asked
/// (never a BMC's address or its words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("machine {0} is not provided: no BMC reads its console")]
    NotProvided(Uuid),
    #[error("machine {0} has no console shepherd reads (its BMC names none)")]
    NoConsole(Uuid),
    #[error("machine {0}: its console could not be looked up")]
    LookupFailed(Uuid),
    #[error("shepherd could not record this connection (its database): try again")]
    NotRecorded,
    #[error("the console's actor is gone: {0}")]
    Console(String),
    #[error("shepherd is stopping")]
    Stopping,
}

/// A console, opened for one connection.
pub struct Opened {
    pub link: ConsoleLink,
    /// Whether this connection holds the keyboard, or who does.
    pub keyboard: crate::console::Keyboard,
    /// What the console printed last.
    pub backlog: Vec<u8>,
    /// How it is read, for operators.
    pub source: String,
}

/// What a connection asks of shepherd's side.
pub enum DoorRequest {
    /// May `user` log in with `key`, and reach what?
    Login {
        user: String,
        key: PublicKey,
        peer: Option<String>,
        reply: oneshot::Sender<Option<Grant>>,
    },
    /// Opens the granted machine's console for connection `session`.
    Open {
        grant: Grant,
        session: Uuid,
        peer: Option<String>,
        out: mpsc::Sender<ToViewer>,
        reply: oneshot::Sender<Result<Opened, Refused>>,
    },
    /// The connection holds the keyboard now.
    Wrote { session: Uuid },
    /// The connection left the console.
    Ended {
        session: Uuid,
        typed: u64,
        shown: u64,
        reason: String,
    },
}

/// The console a connection is on.
struct OnConsole {
    channel: ChannelId,
    link: ConsoleLink,
    keyboard: Arc<AtomicBool>,
    typed: u64,
    shown: Arc<AtomicU64>,
    /// Told once that its keys go nowhere.
    told_read_only: bool,
    /// Who holds the keyboard, as it was when this connection came.
    writer: String,
}

/// One connection's handler.
pub struct Connection {
    door: mpsc::Sender<DoorRequest>,
    peer: Option<SocketAddr>,
    session: Uuid,
    grant: Option<Grant>,
    /// The session channel accepted (one per connection).
    channel: Option<ChannelId>,
    on: Option<OnConsole>,
}

impl Connection {
    pub fn new(door: mpsc::Sender<DoorRequest>, peer: Option<SocketAddr>) -> Connection {
        Connection {
            door,
            peer,
            session: Uuid::new_v4(),
            grant: None,
            channel: None,
            on: None,
        }
    }

    fn peer(&self) -> Option<String> {
        self.peer.map(|p| p.to_string())
    }

    /// Opens the console on `channel` (a shell or a command asked: either
    /// is the console).
    async fn open(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        if self.channel != Some(channel) || self.on.is_some() {
            return session.channel_failure(channel);
        }
        let Some(grant) = self.grant.clone() else {
            return session.channel_failure(channel);
        };
        let (out, mut rx) = mpsc::channel(VIEWER_BACKLOG);
        let (reply, answer) = oneshot::channel();
        let asked = self
            .door
            .send(DoorRequest::Open {
                grant: grant.clone(),
                session: self.session,
                peer: self.peer(),
                out,
                reply,
            })
            .await;
        let opened = match asked {
            Ok(()) => answer.await.unwrap_or(Err(Refused::Stopping)),
            Err(_) => Err(Refused::Stopping),
        };
        session.channel_success(channel)?;
        let opened = match opened {
            Ok(o) => o,
            Err(e) => {
                session.data(channel, format!("shepherd: {e}\r\n").into_bytes())?;
                session.exit_status_request(channel, 1)?;
                session.eof(channel)?;
                return session.close(channel);
            }
        };
        let via = if grant.tenant {
            String::new()
        } else {
            format!(" ({})", opened.source)
        };
        let (held, writer) = match &opened.keyboard {
            crate::console::Keyboard::Theirs => {
                ("the keyboard is yours".to_string(), String::new())
            }
            crate::console::Keyboard::HeldBy(w) => {
                let w = if grant.tenant {
                    "another connection"
                } else {
                    w
                };
                (format!("read-only: {w} holds the keyboard"), w.to_string())
            }
        };
        let banner = format!(
            "[shepherd: the serial console of {}{via}; {held}; Ctrl-] leaves]\r\n",
            grant.machine_id
        );
        session.data(channel, banner.into_bytes())?;
        let shown = Arc::new(AtomicU64::new(opened.backlog.len() as u64));
        if !opened.backlog.is_empty() {
            session.data(channel, opened.backlog)?;
        }
        let keyboard = Arc::new(AtomicBool::new(opened.keyboard.is_theirs()));
        if opened.keyboard.is_theirs() {
            let _ = self.door.try_send(DoorRequest::Wrote {
                session: self.session,
            });
        }
        let (handle, door, id) = (session.handle(), self.door.clone(), self.session);
        let (k, s, tenant) = (keyboard.clone(), shown.clone(), grant.tenant);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let bytes = match m {
                    ToViewer::Printed(b) => {
                        s.fetch_add(b.len() as u64, Ordering::Relaxed);
                        b
                    }
                    ToViewer::Keyboard => {
                        k.store(true, Ordering::Relaxed);
                        let _ = door.try_send(DoorRequest::Wrote { session: id });
                        b"\r\n[shepherd: the keyboard is yours now]\r\n".to_vec()
                    }
                    ToViewer::Interrupted(why) => {
                        let why = if tenant {
                            "its BMC closed it or does not answer".into()
                        } else {
                            why
                        };
                        format!("\r\n[shepherd: the console was interrupted ({why}); it is opened again as soon as it can be]\r\n")
                            .into_bytes()
                    }
                    ToViewer::Resumed => b"\r\n[shepherd: the console is back]\r\n".to_vec(),
                };
                if handle.data(channel, bytes).await.is_err() {
                    break;
                }
            }
        });
        self.on = Some(OnConsole {
            channel,
            link: opened.link,
            keyboard,
            typed: 0,
            shown,
            told_read_only: false,
            writer,
        });
        Ok(())
    }

    /// Leaves the console (`reason`: why): the audit ended, the channel
    /// closed.
    fn leave(&mut self, reason: &str, session: Option<&mut Session>) {
        let Some(on) = self.on.take() else {
            return;
        };
        let _ = self.door.try_send(DoorRequest::Ended {
            session: self.session,
            typed: on.typed,
            shown: on.shown.load(Ordering::Relaxed),
            reason: reason.to_string(),
        });
        if let Some(s) = session {
            let _ = s.data(on.channel, b"\r\n[shepherd: left the console]\r\n".to_vec());
            let _ = s.exit_status_request(on.channel, 0);
            let _ = s.eof(on.channel);
            let _ = s.close(on.channel);
        }
        drop(on.link);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.leave("disconnected", None);
    }
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey(&mut self, user: &str, key: &PublicKey) -> Result<Auth, Self::Error> {
        let (reply, answer) = oneshot::channel();
        let asked = self
            .door
            .send(DoorRequest::Login {
                user: user.to_string(),
                key: key.clone(),
                peer: self.peer(),
                reply,
            })
            .await;
        let grant = match asked {
            Ok(()) => answer.await.ok().flatten(),
            Err(_) => None,
        };
        Ok(match grant {
            Some(g) => {
                self.grant = Some(g);
                Auth::Accept
            }
            None => Auth::reject(),
        })
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.channel.is_some() {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        }
        self.channel = Some(channel.id());
        reply.accept().await;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _: &str,
        _: u32,
        _: u32,
        _: u32,
        _: u32,
        _: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.open(channel, session).await
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.open(channel, session).await
    }

    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(on) = self.on.as_mut().filter(|o| o.channel == channel) else {
            return Ok(());
        };
        let (keys, leaving) = match data.iter().position(|b| *b == ESCAPE) {
            Some(i) => (&data[..i], true),
            None => (data, false),
        };
        if !keys.is_empty() {
            if on.keyboard.load(Ordering::Relaxed) {
                on.typed += keys.len() as u64;
                on.link.type_keys(keys.to_vec());
            } else if !on.told_read_only {
                on.told_read_only = true;
                let note = format!(
                    "\r\n[shepherd: your keys go nowhere: {} holds the keyboard; Ctrl-] leaves]\r\n",
                    on.writer
                );
                session.data(channel, note.into_bytes())?;
            }
        }
        if leaving {
            self.leave("left", Some(session));
        }
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.on.as_ref().is_some_and(|o| o.channel == channel) {
            self.leave("disconnected", None);
        }
        Ok(())
    }
}
