//! One actor per machine console being read (`Console`; `consoles.rs`
//! holds them by machine). A capture is a boot's console: begun when
//! shepherd asks the BMC for the boot, its tail written to the BMDB every
//! `console.write_every`, ended when the boot's outcome is known (or after
//! `console.capture_for`). The reader runs in a task of its own and hands
//! the actor what it reads; a console the BMC closes is opened again after
//! `console.reopen_after` while a capture needs it.

use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::reader::{self, FromReader};
use super::viewers::{ToViewer, Viewers};
use super::{ConsoleSource, Tail};
use crate::bmdb::{Bmdb, BmdbError};
use crate::config::{ConsoleSettings, IpmiConfig};

/// Lines of a console's tail quoted in a failure's cause.
pub const LINES_IN_A_CAUSE: usize = 5;

/// What the console printed last, shown to someone coming on it.
const BACKLOG_BYTES: usize = 4096;

/// The capture running now.
struct Running {
    capture_id: Uuid,
    deadline: Instant,
}

/// The reader task's handles: dropping `stop` ends it; `input` types.
struct Reader {
    _stop: oneshot::Sender<()>,
    input: mpsc::Sender<Vec<u8>>,
}

pub(super) struct Console {
    machine_id: Uuid,
    source: ConsoleSource,
    settings: ConsoleSettings,
    ipmi: IpmiConfig,
    bmdb: Bmdb,
    /// The SOL cipher suite that worked.
    suite: Option<u8>,
    tail: Tail,
    capture: Option<Running>,
    /// Bytes seen at the last write (None: nothing written yet).
    written: Option<(u64, Option<String>)>,
    /// Why the console could not be read, the last time.
    error: Option<String>,
    reader: Option<Reader>,
    /// Which reader a message is from: one stopped says nothing more.
    generation: u64,
    /// The people on it now (over shepherd's SSH).
    viewers: Viewers,
    /// Readers in a row that ended without a byte.
    silent_opens: u32,
    /// Viewers were told the console was interrupted, and not yet that it
    /// is back.
    interrupted: bool,
    /// The last reader lost its BMC: the next takes back the payload.
    reclaim: bool,
}

impl Actor for Console {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.settings.write_every, |me, ctx| me.tick(ctx));
    }
}

#[derive(Message)]
#[rtype(result = "Result<Uuid, BmdbError>")]
pub(super) struct StartCapture {
    pub(super) cause: String,
}

#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub(super) struct EndCapture {
    pub(super) capture_id: Uuid,
}

#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub(super) struct LastLines(pub(super) usize);

/// Lets capture `capture_id` run on by itself for `for_` at most.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct KeepFor {
    pub(super) capture_id: Uuid,
    pub(super) for_: Duration,
}

impl Console {
    pub(super) fn new(
        machine_id: Uuid,
        source: ConsoleSource,
        settings: ConsoleSettings,
        ipmi: IpmiConfig,
        bmdb: Bmdb,
    ) -> Console {
        let tail = Tail::new(settings.tail_bytes);
        Console {
            machine_id,
            source,
            settings,
            ipmi,
            bmdb,
            suite: None,
            tail,
            capture: None,
            written: None,
            error: None,
            reader: None,
            generation: 0,
            viewers: Viewers::default(),
            silent_opens: 0,
            interrupted: false,
            reclaim: false,
        }
    }

    fn start_reader(&mut self, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let (stop_tx, stop_rx) = oneshot::channel();
        let (input_tx, input_rx) = mpsc::channel(64);
        self.reader = Some(Reader {
            _stop: stop_tx,
            input: input_tx,
        });
        let me = ctx.address();
        let source = self.source.clone();
        let ipmi = self.ipmi.clone();
        let suite = self.suite;
        actix_rt::spawn(reader::read(
            source,
            ipmi,
            suite,
            generation,
            me.recipient(),
            stop_rx,
            input_rx,
            std::mem::take(&mut self.reclaim),
        ));
    }

    /// A capture runs, or someone is on the console.
    fn needs_reader(&self) -> bool {
        self.capture.is_some() || !self.viewers.is_empty()
    }

    fn stop_reader(&mut self) {
        self.reader = None;
        self.generation += 1;
        self.interrupted = false;
    }

    /// Writes the capture's tail if it grew (or its error changed);
    /// `ended`: and ends it.
    fn write(&mut self, ended: bool) -> impl Future<Output = ()> + 'static + use<> {
        let Some(c) = &self.capture else {
            return futures::future::Either::Left(std::future::ready(()));
        };
        let now = (self.tail.seen(), self.error.clone());
        if !ended && self.written.as_ref() == Some(&now) {
            return futures::future::Either::Left(std::future::ready(()));
        }
        self.written = Some(now);
        let (bmdb, id, bytes, seen, error) = (
            self.bmdb.clone(),
            c.capture_id,
            self.tail.bytes(),
            self.tail.seen(),
            self.error.clone(),
        );
        let machine_id = self.machine_id;
        futures::future::Either::Right(async move {
            let r = bmdb
                .transact(async |tx| {
                    crate::bmdb::console::write(tx, id, &bytes, seen, error.as_deref(), ended).await
                })
                .await;
            if let Err(e) = r {
                tracing::debug!(%machine_id, capture = %id, error = %e, "the console's tail was not written (the next write carries it)");
            }
        })
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let Some(c) = &self.capture else {
            return;
        };
        if Instant::now() >= c.deadline {
            tracing::info!(machine_id = %self.machine_id, capture = %c.capture_id, "the console's capture ran for console.capture_for: ended");
            let id = c.capture_id;
            let end = self.end(id);
            ctx.spawn(end.into_actor(self).map(|_, _, _| ()));
            return;
        }
        let w = self.write(false);
        ctx.spawn(w.into_actor(self));
    }

    /// Ends capture `id` if it is the one running: the reader stopped,
    /// the tail written; what it printed last.
    fn end(&mut self, id: Uuid) -> impl Future<Output = Vec<String>> + 'static + use<> {
        let running = self.capture.as_ref().is_some_and(|c| c.capture_id == id);
        let lines = self.tail.last_lines(LINES_IN_A_CAUSE);
        let write = running.then(|| self.write(true));
        if running {
            self.capture = None;
            if self.viewers.is_empty() {
                self.stop_reader();
            }
        }
        async move {
            if let Some(w) = write {
                w.await;
            }
            if running { lines } else { Vec::new() }
        }
    }
}

impl Handler<StartCapture> for Console {
    type Result = ResponseActFuture<Self, Result<Uuid, BmdbError>>;

    fn handle(&mut self, msg: StartCapture, _: &mut Context<Self>) -> Self::Result {
        // One capture at a time: a new boot ends the last one's.
        let previous = self.capture.as_ref().map(|c| c.capture_id);
        let ended = previous.map(|id| self.end(id));
        let capture_id = Uuid::new_v4();
        let (bmdb, machine_id, source, kept) = (
            self.bmdb.clone(),
            self.machine_id,
            self.source.describe(),
            self.settings.kept,
        );
        Box::pin(
            async move {
                if let Some(e) = ended {
                    e.await;
                }
                bmdb.transact(async |tx| {
                    crate::bmdb::console::begin(
                        tx, capture_id, machine_id, &msg.cause, &source, kept,
                    )
                    .await
                })
                .await
            }
            .into_actor(self)
            .map(move |r, me, ctx| {
                r?;
                me.tail = Tail::new(me.settings.tail_bytes);
                me.written = None;
                me.error = None;
                me.capture = Some(Running {
                    capture_id,
                    deadline: Instant::now() + me.settings.capture_for,
                });
                if me.reader.is_none() {
                    me.start_reader(ctx);
                }
                Ok(capture_id)
            }),
        )
    }
}

impl Handler<EndCapture> for Console {
    type Result = ResponseFuture<Vec<String>>;

    fn handle(&mut self, msg: EndCapture, _: &mut Context<Self>) -> Self::Result {
        Box::pin(self.end(msg.capture_id))
    }
}

/// Someone comes on the console: shown what it prints from now on.
#[derive(Message)]
#[rtype(result = "Attached")]
pub(super) struct Attach {
    pub(super) session: Uuid,
    pub(super) who: String,
    pub(super) out: mpsc::Sender<ToViewer>,
}

/// Someone on the console, as they come.
#[derive(Debug)]
pub struct Attached {
    pub keyboard: super::viewers::Keyboard,
    /// What it printed last, to start from.
    pub backlog: Vec<u8>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Detach {
    pub(super) session: Uuid,
}

/// Keystrokes from someone on the console: typed if they hold its
/// keyboard, dropped otherwise.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Type {
    pub(super) session: Uuid,
    pub(super) bytes: Vec<u8>,
}

impl Handler<Attach> for Console {
    type Result = MessageResult<Attach>;

    fn handle(&mut self, msg: Attach, ctx: &mut Context<Self>) -> Self::Result {
        let keyboard = self.viewers.add(msg.session, &msg.who, msg.out);
        if self.reader.is_none() {
            self.start_reader(ctx);
        }
        let bytes = self.tail.bytes();
        let backlog = bytes[bytes.len().saturating_sub(BACKLOG_BYTES)..].to_vec();
        MessageResult(Attached { keyboard, backlog })
    }
}

impl Handler<Detach> for Console {
    type Result = ();

    fn handle(&mut self, msg: Detach, _: &mut Context<Self>) {
        self.viewers.remove(msg.session);
        if !self.needs_reader() {
            self.stop_reader();
        }
    }
}

impl Handler<Type> for Console {
    type Result = ();

    fn handle(&mut self, msg: Type, _: &mut Context<Self>) {
        if !self.viewers.is_writer(msg.session) {
            return;
        }
        if let Some(r) = &self.reader
            && r.input.try_send(msg.bytes).is_err()
        {
            tracing::debug!(machine_id = %self.machine_id, "keystrokes dropped: the console is not taking them");
        }
    }
}

impl Handler<KeepFor> for Console {
    type Result = ();

    fn handle(&mut self, msg: KeepFor, _: &mut Context<Self>) {
        if let Some(c) = self
            .capture
            .as_mut()
            .filter(|c| c.capture_id == msg.capture_id)
        {
            c.deadline = c.deadline.min(Instant::now() + msg.for_);
        }
    }
}

impl Handler<LastLines> for Console {
    type Result = Vec<String>;

    fn handle(&mut self, msg: LastLines, _: &mut Context<Self>) -> Vec<String> {
        self.tail.last_lines(msg.0)
    }
}

impl Handler<FromReader> for Console {
    type Result = ();

    fn handle(&mut self, msg: FromReader, ctx: &mut Context<Self>) {
        match msg {
            FromReader::Bytes { generation, bytes } if generation == self.generation => {
                self.silent_opens = 0;
                self.tail.push(&bytes);
                if !self.viewers.is_empty() {
                    self.viewers.send(&ToViewer::Printed(bytes));
                }
            }
            FromReader::Suite { generation, suite } if generation == self.generation => {
                self.suite = Some(suite);
            }
            FromReader::Opened { generation }
                if generation == self.generation && self.interrupted =>
            {
                self.interrupted = false;
                tracing::info!(machine_id = %self.machine_id, source = %self.source.describe(), "the console is back");
                self.viewers.send(&ToViewer::Resumed);
            }
            FromReader::Unanswered { generation, why } if generation == self.generation => {
                tracing::info!(machine_id = %self.machine_id, source = %self.source.describe(), %why, "the console's BMC does not answer");
                if !self.interrupted {
                    self.interrupted = true;
                    self.viewers.send(&ToViewer::Interrupted(why.clone()));
                }
                self.error = Some(why);
            }
            FromReader::Ended {
                generation,
                why,
                lost,
            } if generation == self.generation => {
                self.reader = None;
                self.reclaim = lost;
                if !self.needs_reader() {
                    return;
                }
                // A console that ends again and again without a byte (a BMC
                // without SOL, a payload someone else holds) is asked less
                // and less often: console.reopen_after, doubled each time,
                // up to a minute.
                let wait = (self.settings.reopen_after * 2u32.pow(self.silent_opens.min(4)))
                    .min(Duration::from_secs(60))
                    .max(self.settings.reopen_after);
                self.silent_opens = self.silent_opens.saturating_add(1);
                tracing::info!(machine_id = %self.machine_id, source = %self.source.describe(), %why, after = ?wait, "the console's reader ended: opened again");
                if !self.interrupted {
                    self.interrupted = true;
                    self.viewers.send(&ToViewer::Interrupted(why.clone()));
                }
                self.error = Some(why);
                ctx.run_later(wait, |me, ctx| {
                    if me.needs_reader() && me.reader.is_none() {
                        me.start_reader(ctx);
                    }
                });
            }
            _ => {}
        }
    }
}
