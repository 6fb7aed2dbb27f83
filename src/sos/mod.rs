//! Serial over SSH, as Equinix Metal's SOS was: `ssh -p PORT NAME@host`
//! puts someone on a machine's serial console, read through its BMC by the
//! machine's `Console` actor (`console`), the same reader a boot's capture
//! uses, so a capture and any number of people share one SOL session.
//!
//! - **Who**: an operator, by a key in `console.operator_keys` (its comment
//!   their name), reaches any machine, named by its ID or its provider's
//!   ID; a tenant, as `DEVICE_ID@`, reaches its own device's machine with
//!   a key of the device's project (`bmdb::console_sessions`).
//! - **The keyboard**: the first on a console holds it; the others read
//!   until it is free, when the one waiting longest takes it. Ctrl-]
//!   leaves.
//! - **Audit**: every connection, from its login to its end, with who,
//!   the key's fingerprint, whether they typed, and what went each way
//!   (`console_session`, on the machine page).
//! - **Secrets**: a tenant is shown nothing of the BMC; no one is shown a
//!   password or a key.
//!
//! `connection.rs`: one connection's handler (in russh's tasks); here,
//! the door that answers it on shepherd's side, and the server's start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::PublicKey;
use russh::server::Server as _;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::bmdb::Bmdb;
use crate::bmdb::console_sessions::{self, Login};
use crate::config::ConsoleSettings;
use crate::console::Consoles;
use crate::provider::SharedProvider;

mod connection;
pub use connection::{DoorRequest, ESCAPE, Grant, Opened, Refused};

/// Why the console server could not start.
#[derive(Debug, thiserror::Error)]
pub enum SosError {
    #[error("console.host_key_file: {0}")]
    HostKey(#[from] crate::ssh::SshError),
    #[error("console.listen {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The console server, while it runs: stopped when dropped.
pub struct ConsoleServer {
    pub addr: SocketAddr,
    stop: russh::server::RunningServerHandle,
    keeper: actix_rt::task::JoinHandle<()>,
}

impl Drop for ConsoleServer {
    fn drop(&mut self) {
        self.keeper.abort();
        self.stop.shutdown("shepherd is stopping".into());
    }
}

/// Starts the console server on `console.listen` (None when unset).
pub async fn serve(
    settings: &ConsoleSettings,
    consoles: Consoles,
    provider: SharedProvider,
    bmdb: Bmdb,
) -> Result<Option<ConsoleServer>, SosError> {
    let Some(listen) = settings.listen else {
        return Ok(None);
    };
    let identity = crate::ssh::SshIdentity::load_or_generate(&settings.host_key_file)?;
    let config = Arc::new(russh::server::Config {
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        keys: vec![identity.private_key().clone()],
        auth_rejection_time: Duration::from_secs(1),
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        ..Default::default()
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SosError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| SosError::Bind {
        addr: listen,
        source,
    })?;
    let (tx, mut rx) = mpsc::channel::<DoorRequest>(64);
    let door = Rc::new(Door {
        consoles,
        provider,
        bmdb,
        operator_keys: settings.operator_keys.clone(),
        open: Default::default(),
        keep_alive: settings.keep_alive,
    });
    let keeper = actix_rt::spawn(door.clone().keep_alive());
    actix_rt::spawn(async move {
        while let Some(r) = rx.recv().await {
            actix_rt::spawn(door.clone().answer(r));
        }
    });
    let (handle, stop) = tokio::sync::oneshot::channel();
    actix_rt::spawn(async move {
        let mut server = Listener { door: tx };
        let running = server.run_on_socket(config, &listener);
        let _ = handle.send(running.handle());
        if let Err(e) = running.await {
            tracing::error!(error = %e, "the console server stopped");
        }
    });
    let stop = stop.await.map_err(|_| SosError::Bind {
        addr: listen,
        source: std::io::Error::other("the console server did not start"),
    })?;
    tracing::info!(%addr, host_key = %identity.public_key(), "serving machines' consoles over SSH");
    Ok(Some(ConsoleServer { addr, stop, keeper }))
}

/// russh's server: a handler per connection, each with the door's line.
struct Listener {
    door: mpsc::Sender<DoorRequest>,
}

impl russh::server::Server for Listener {
    type Handler = connection::Connection;

    fn new_client(&mut self, peer: Option<SocketAddr>) -> connection::Connection {
        connection::Connection::new(self.door.clone(), peer)
    }

    fn handle_session_error(&mut self, error: russh::Error) {
        tracing::debug!(%error, "a console connection ended with an error");
    }
}

/// What answers connections on shepherd's side.
struct Door {
    consoles: Consoles,
    provider: SharedProvider,
    bmdb: Bmdb,
    operator_keys: Option<PathBuf>,
    /// The connections open here, kept alive in the BMDB…
    open: std::cell::RefCell<std::collections::HashSet<Uuid>>,
    /// …this often (`console.keep_alive`); a connection without a word
    /// for four times this is ended (its shepherd stopped).
    keep_alive: Duration,
}

impl Door {
    /// Keeps this server's connections alive and ends those of stopped
    /// shepherds: at the start, then every `keep_alive`.
    async fn keep_alive(self: Rc<Self>) {
        loop {
            let open: Vec<Uuid> = self.open.borrow().iter().copied().collect();
            let r = self
                .bmdb
                .transact(async |tx| {
                    console_sessions::keep(tx, &open).await?;
                    console_sessions::sweep(tx, self.keep_alive * 4).await
                })
                .await;
            match r {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    connections = n,
                    "ended console connections whose shepherd stopped"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "the console connections could not be kept alive")
                }
            }
            tokio::time::sleep(self.keep_alive).await;
        }
    }
}

impl Door {
    async fn answer(self: Rc<Self>, r: DoorRequest) {
        match r {
            DoorRequest::Login {
                user,
                key,
                peer,
                reply,
            } => {
                let grant = self.login(&user, &key, peer.as_deref()).await;
                let _ = reply.send(grant);
            }
            DoorRequest::Open {
                grant,
                session,
                peer,
                out,
                reply,
            } => {
                let _ = reply.send(self.open(grant, session, peer, out).await);
            }
            DoorRequest::Wrote { session } => {
                let r = self
                    .bmdb
                    .transact(async |tx| console_sessions::wrote(tx, session).await)
                    .await;
                if let Err(e) = r {
                    tracing::warn!(%session, error = %e, "the console connection's keyboard was not recorded");
                }
            }
            DoorRequest::Ended {
                session,
                typed,
                shown,
                reason,
            } => {
                tracing::info!(%session, %reason, typed, shown, "left a machine's console");
                self.open.borrow_mut().remove(&session);
                let r = self
                    .bmdb
                    .transact(async |tx| {
                        console_sessions::end(tx, session, typed, shown, &reason).await
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(%session, error = %e, "the console connection's end was not recorded");
                }
            }
        }
    }

    /// Who `user` with `key` is, and what they reach; None: refused (logged).
    async fn login(&self, user: &str, key: &PublicKey, peer: Option<&str>) -> Option<Grant> {
        let fingerprint = crate::ssh::fingerprint(key);
        let operator = self
            .operator_keys
            .as_deref()
            .and_then(|path| operator_named(path, key));
        let found = match &operator {
            Some(name) => self
                .bmdb
                .transact(async |tx| console_sessions::machine_named(tx, user).await)
                .await
                .map(|m| {
                    m.map(|(machine_id, provider_id)| Grant {
                        machine_id,
                        provider_id,
                        who: format!("operator {name}"),
                        fingerprint: fingerprint.clone(),
                        tenant: false,
                    })
                }),
            None => self
                .bmdb
                .transact(async |tx| console_sessions::tenant_grant(tx, user, &fingerprint).await)
                .await
                .map(|g| {
                    g.map(|g| Grant {
                        machine_id: g.machine_id,
                        provider_id: g.provider_id,
                        who: format!("tenant project {} key {}", g.project_id, g.label),
                        fingerprint: fingerprint.clone(),
                        tenant: true,
                    })
                }),
        };
        match found {
            Ok(Some(g)) => {
                tracing::info!(user, who = %g.who, machine_id = %g.machine_id, peer, "console login");
                Some(g)
            }
            Ok(None) => {
                tracing::warn!(user, %fingerprint, peer, operator = operator.is_some(), "console login refused: no machine of that name for an operator's key, or no device of that ID whose project has this key");
                None
            }
            Err(e) => {
                tracing::warn!(user, error = %e, "console login refused: the BMDB did not answer");
                None
            }
        }
    }

    async fn open(
        &self,
        grant: Grant,
        session: Uuid,
        peer: Option<String>,
        out: mpsc::Sender<crate::console::ToViewer>,
    ) -> Result<Opened, Refused> {
        let m = grant.machine_id;
        let Some(provider_id) = &grant.provider_id else {
            return Err(Refused::NotProvided(m));
        };
        let source = match self.provider.console(provider_id).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(Refused::NoConsole(m)),
            Err(e) => {
                tracing::warn!(machine_id = %m, error = %e, "looking up a console failed");
                return Err(Refused::LookupFailed(m));
            }
        };
        let login = Login {
            session_id: session,
            machine_id: m,
            who: grant.who.clone(),
            key_fingerprint: grant.fingerprint.clone(),
            peer,
        };
        self.bmdb
            .transact(async |tx| console_sessions::begin(tx, &login).await)
            .await
            .map_err(|e| {
                tracing::warn!(machine_id = %m, error = %e, "a console connection was not recorded: refused");
                Refused::NotRecorded
            })?;
        // Kept alive from now on; a connection that does not open is
        // swept once it is no longer kept.
        self.open.borrow_mut().insert(session);
        let (link, attached) = match self
            .consoles
            .attach(m, &source, session, &grant.who, out)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                self.open.borrow_mut().remove(&session);
                return Err(Refused::Console(e.to_string()));
            }
        };
        tracing::info!(machine_id = %m, who = %grant.who, %session, keyboard = attached.keyboard.is_theirs(), "on a machine's console");
        Ok(Opened {
            link,
            keyboard: attached.keyboard,
            backlog: attached.backlog,
            source: source.describe(),
        })
    }
}

/// The operator whose key in the authorized_keys file at `path` is `key`:
/// its comment (or `unnamed`). The file is read at each login, so a key
/// added or taken out counts at once; an unreadable file lets no operator
/// in (logged).
fn operator_named(path: &Path, key: &PublicKey) -> Option<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "console.operator_keys could not be read: no operator logs in");
            return None;
        }
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| PublicKey::from_openssh(l).ok())
        .find(|k| k.key_data() == key.key_data())
        .map(|k| match k.comment().to_string().trim() {
            "" => "unnamed".to_string(),
            c => c.to_string(),
        })
}
