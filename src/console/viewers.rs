//! The people on a console at once: each is shown what it prints; one at
//! a time holds its keyboard (the first to come), the others read until it
//! is free, then the one waiting longest takes it.

use std::collections::BTreeMap;
use std::time::Instant;

use tokio::sync::mpsc;
use uuid::Uuid;

/// What a viewer is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToViewer {
    /// What the console printed.
    Printed(Vec<u8>),
    /// The keyboard is this viewer's now (the one who held it left).
    Keyboard,
    /// The console's reader ended (the BMC closed it, or stopped
    /// answering); it is opened again.
    Interrupted(String),
    /// The console is open again after an interruption.
    Resumed,
}

/// How many messages a viewer may lag behind before it misses output.
pub const VIEWER_BACKLOG: usize = 256;

struct Viewer {
    who: String,
    since: Instant,
    out: mpsc::Sender<ToViewer>,
    /// Output dropped because the viewer lagged: told once it catches up.
    missed: u64,
}

/// A console's viewers, and who holds its keyboard.
#[derive(Default)]
pub(super) struct Viewers {
    by_session: BTreeMap<Uuid, Viewer>,
    writer: Option<Uuid>,
}

/// Who holds a console's keyboard, as a viewer comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keyboard {
    /// The one who came: the first on the console.
    Theirs,
    /// Another viewer (who), until they leave.
    HeldBy(String),
}

impl Keyboard {
    pub fn is_theirs(&self) -> bool {
        *self == Keyboard::Theirs
    }
}

impl Viewers {
    pub(super) fn is_empty(&self) -> bool {
        self.by_session.is_empty()
    }

    /// Adds a viewer; whether it holds the keyboard, else who does.
    pub(super) fn add(
        &mut self,
        session: Uuid,
        who: &str,
        out: mpsc::Sender<ToViewer>,
    ) -> Keyboard {
        self.by_session.insert(
            session,
            Viewer {
                who: who.to_string(),
                since: Instant::now(),
                out,
                missed: 0,
            },
        );
        match self.writer.and_then(|w| self.by_session.get(&w)) {
            Some(w) => Keyboard::HeldBy(w.who.clone()),
            None => {
                self.writer = Some(session);
                Keyboard::Theirs
            }
        }
    }

    /// Removes a viewer; if it held the keyboard, the one waiting longest
    /// takes it (told so), and is returned.
    pub(super) fn remove(&mut self, session: Uuid) -> Option<Uuid> {
        self.by_session.remove(&session);
        if self.writer != Some(session) {
            return None;
        }
        let next = self
            .by_session
            .iter()
            .min_by_key(|(_, v)| v.since)
            .map(|(id, _)| *id);
        self.writer = next;
        if let Some(v) = next.and_then(|n| self.by_session.get(&n)) {
            let _ = v.out.try_send(ToViewer::Keyboard);
        }
        next
    }

    pub(super) fn is_writer(&self, session: Uuid) -> bool {
        self.writer == Some(session)
    }

    /// Sends every viewer `msg`; one whose queue is full misses it (and is
    /// told how much it missed when it has room again); one gone is
    /// forgotten.
    pub(super) fn send(&mut self, msg: &ToViewer) {
        let mut gone = Vec::new();
        for (id, v) in self.by_session.iter_mut() {
            if v.missed > 0 {
                let note = format!(
                    "\r\n[shepherd: {} bytes not shown: this connection lagged]\r\n",
                    v.missed
                );
                if v.out.try_send(ToViewer::Printed(note.into_bytes())).is_ok() {
                    v.missed = 0;
                }
            }
            match v.out.try_send(msg.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(m)) => {
                    if let ToViewer::Printed(b) = m {
                        v.missed += b.len() as u64;
                    }
                }
                Err(mpsc::error::TrySendError::Closed(_)) => gone.push(*id),
            }
        }
        for id in gone {
            self.remove(id);
        }
    }
}
