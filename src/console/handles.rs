//! What callers hold of a console: someone's place on it
//! ([`ConsoleLink`]) and a capture under way ([`Capture`]); each speaks to
//! the machine's `Console` actor (`capture.rs`), and dropped, leaves it.

use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use super::capture::{Console, Detach, EndCapture, KeepFor, LastLines, Type};

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
