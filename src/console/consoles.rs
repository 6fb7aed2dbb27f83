//! What callers hold of the consoles: [`Consoles`], the `Console` actors
//! (`capture.rs`) by machine, someone's place on one ([`ConsoleLink`]) and
//! a capture under way ([`Capture`]); each speaks to the machine's actor,
//! and dropped, leaves it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::ConsoleSource;
use super::capture::{
    Attach, Attached, Console, Detach, EndCapture, KeepFor, LastLines, StartCapture, Type,
};
use super::viewers::ToViewer;
use crate::bmdb::Bmdb;
use crate::config::{ConsoleSettings, IpmiConfig};

/// Each machine's console actor, with the source it reads.
type ByMachine = Rc<RefCell<HashMap<Uuid, (ConsoleSource, Addr<Console>)>>>;

/// The consoles shepherd reads, one actor per machine.
#[derive(Clone)]
pub struct Consoles {
    settings: ConsoleSettings,
    ipmi: IpmiConfig,
    bmdb: Bmdb,
    actors: ByMachine,
}

impl Consoles {
    pub fn new(settings: ConsoleSettings, ipmi: IpmiConfig, bmdb: Bmdb) -> Consoles {
        Consoles {
            settings,
            ipmi,
            bmdb,
            actors: Rc::default(),
        }
    }

    fn actor(&self, machine_id: Uuid, source: &ConsoleSource) -> Addr<Console> {
        let mut actors = self.actors.borrow_mut();
        if let Some((s, addr)) = actors.get(&machine_id)
            && s == source
            && addr.connected()
        {
            return addr.clone();
        }
        let addr = Console::new(
            machine_id,
            source.clone(),
            self.settings.clone(),
            self.ipmi.clone(),
            self.bmdb.clone(),
        )
        .start();
        actors.insert(machine_id, (source.clone(), addr.clone()));
        addr
    }

    /// Puts `who` (connection `session`) on `machine_id`'s console read
    /// from `source`: what it prints goes to `out`. Their link, and
    /// whether they hold its keyboard.
    pub async fn attach(
        &self,
        machine_id: Uuid,
        source: &ConsoleSource,
        session: Uuid,
        who: &str,
        out: mpsc::Sender<ToViewer>,
    ) -> Result<(ConsoleLink, Attached), actix::MailboxError> {
        let addr = self.actor(machine_id, source);
        let attached = addr
            .send(Attach {
                session,
                who: who.to_string(),
                out,
            })
            .await?;
        Ok((ConsoleLink { addr, session }, attached))
    }

    /// Begins capturing `machine_id`'s console from `source`, for `cause`
    /// (`enrollment`, `recovery`, …). None when captures are off or the
    /// BMDB could not record it (logged: a boot goes ahead without).
    pub async fn capture(
        &self,
        machine_id: Uuid,
        source: &ConsoleSource,
        cause: &str,
    ) -> Option<Capture> {
        if !self.settings.capture {
            return None;
        }
        let addr = self.actor(machine_id, source);
        match addr
            .send(StartCapture {
                cause: cause.to_string(),
            })
            .await
        {
            Ok(Ok(capture_id)) => Some(Capture {
                addr: Some(addr),
                capture_id,
            }),
            Ok(Err(e)) => {
                tracing::warn!(%machine_id, error = %e, "the console's capture was not recorded: the boot goes ahead without it");
                None
            }
            Err(e) => {
                tracing::warn!(%machine_id, error = %e, "the console's actor is gone");
                None
            }
        }
    }
}

/// `cause`, with what the console printed last when a capture ran (for a
/// failure's cause; the capture ended), or saying it printed nothing.
pub async fn told(capture: Option<Capture>, cause: String) -> String {
    let Some(c) = capture else {
        return cause;
    };
    let lines = c.end().await;
    if lines.is_empty() {
        format!("{cause}; its console printed nothing")
    } else {
        format!("{cause}; its console's last lines: {}", lines.join(" | "))
    }
}

/// Someone's place on a machine's console: what they type goes through
/// [`ConsoleLink::type_keys`]; dropped, they leave it.
pub struct ConsoleLink {
    pub(super) addr: Addr<Console>,
    pub(super) session: Uuid,
}

impl ConsoleLink {
    /// Types `bytes` on the console if this link holds its keyboard.
    pub fn type_keys(&self, bytes: Vec<u8>) {
        self.addr.do_send(Type {
            session: self.session,
            bytes,
        });
    }
}

impl Drop for ConsoleLink {
    fn drop(&mut self) {
        self.addr.do_send(Detach {
            session: self.session,
        });
    }
}

/// A capture under way; ended by [`Capture::end`] (or, dropped, at once
/// without waiting).
pub struct Capture {
    pub(super) addr: Option<Addr<Console>>,
    pub(super) capture_id: Uuid,
}

impl Capture {
    /// Ends the capture, its tail written: its last lines, for a cause.
    pub async fn end(mut self) -> Vec<String> {
        let Some(addr) = self.addr.take() else {
            return Vec::new();
        };
        addr.send(EndCapture {
            capture_id: self.capture_id,
        })
        .await
        .unwrap_or_default()
    }

    /// Lets the capture run on by itself, for `for_` at most (never past
    /// `console.capture_for`), or until the machine's next capture: for a
    /// boot whose outcome this lease does not see.
    pub fn keep_for(mut self, for_: Duration) {
        if let Some(addr) = self.addr.take() {
            addr.do_send(KeepFor {
                capture_id: self.capture_id,
                for_,
            });
        }
    }

    /// What the console printed so far: its last `n` lines.
    pub async fn last_lines(&self, n: usize) -> Vec<String> {
        match &self.addr {
            Some(a) => a.send(LastLines(n)).await.unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(addr) = self.addr.take() {
            addr.do_send(EndCapture {
                capture_id: self.capture_id,
            });
        }
    }
}
