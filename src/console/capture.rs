//! One actor per machine console being read (`Console`), and the actors
//! by machine (`Consoles`). A capture is a boot's console: begun when
//! shepherd asks the BMC for the boot, its tail written to the BMDB every
//! `console.write_every`, ended when the boot's outcome is known (or after
//! `console.capture_for`). The reader runs in a task of its own and hands
//! the actor what it reads; a console the BMC closes is opened again after
//! `console.reopen_after` while a capture needs it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{ConsoleSource, Tail, sol, ssh};
use crate::bmdb::{Bmdb, BmdbError};
use crate::config::{ConsoleSettings, IpmiConfig};

/// Lines of a console's tail quoted in a failure's cause.
pub const LINES_IN_A_CAUSE: usize = 5;

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
        let addr = Console {
            machine_id,
            source: source.clone(),
            settings: self.settings.clone(),
            ipmi: self.ipmi.clone(),
            bmdb: self.bmdb.clone(),
            suite: None,
            tail: Tail::new(self.settings.tail_bytes),
            capture: None,
            written: None,
            error: None,
            reader: None,
            generation: 0,
        }
        .start();
        actors.insert(machine_id, (source.clone(), addr.clone()));
        addr
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

/// A capture under way; ended by [`Capture::end`] (or, dropped, at once
/// without waiting).
pub struct Capture {
    addr: Option<Addr<Console>>,
    capture_id: Uuid,
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

    /// Ends the capture: `cause`, with what the console printed last (for
    /// a failure's cause), or saying it printed nothing.
    pub async fn told(self, cause: String) -> String {
        let lines = self.end().await;
        if lines.is_empty() {
            format!("{cause}; its console printed nothing")
        } else {
            format!("{cause}; its console's last lines: {}", lines.join(" | "))
        }
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

/// The capture running now.
struct Running {
    capture_id: Uuid,
    deadline: Instant,
}

/// The reader task's handles: dropping `stop` ends it.
struct Reader {
    _stop: oneshot::Sender<()>,
    _input: mpsc::Sender<Vec<u8>>,
}

pub struct Console {
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
}

impl Actor for Console {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.settings.write_every, |me, ctx| me.tick(ctx));
    }
}

#[derive(Message)]
#[rtype(result = "Result<Uuid, BmdbError>")]
struct StartCapture {
    cause: String,
}

#[derive(Message)]
#[rtype(result = "Vec<String>")]
struct EndCapture {
    capture_id: Uuid,
}

#[derive(Message)]
#[rtype(result = "Vec<String>")]
struct LastLines(usize);

/// Lets capture `capture_id` run on by itself for `for_` at most.
#[derive(Message)]
#[rtype(result = "()")]
struct KeepFor {
    capture_id: Uuid,
    for_: Duration,
}

/// From the reader: bytes, or its end (with why).
#[derive(Message)]
#[rtype(result = "()")]
enum FromReader {
    Bytes { generation: u64, bytes: Vec<u8> },
    Ended { generation: u64, why: String },
    Suite { generation: u64, suite: u8 },
}

impl Console {
    fn start_reader(&mut self, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let (stop_tx, stop_rx) = oneshot::channel();
        let (input_tx, input_rx) = mpsc::channel(64);
        self.reader = Some(Reader {
            _stop: stop_tx,
            _input: input_tx,
        });
        let me = ctx.address();
        let source = self.source.clone();
        let ipmi = self.ipmi.clone();
        let suite = self.suite;
        actix_rt::spawn(read(source, ipmi, suite, generation, me, stop_rx, input_rx));
    }

    fn stop_reader(&mut self) {
        self.reader = None;
        self.generation += 1;
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
            self.stop_reader();
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
                self.tail.push(&bytes);
            }
            FromReader::Suite { generation, suite } if generation == self.generation => {
                self.suite = Some(suite);
            }
            FromReader::Ended { generation, why } if generation == self.generation => {
                self.reader = None;
                if self.capture.is_none() {
                    return;
                }
                tracing::info!(machine_id = %self.machine_id, source = %self.source.describe(), %why, "the console's reader ended: opened again after console.reopen_after");
                self.error = Some(why);
                ctx.run_later(self.settings.reopen_after, |me, ctx| {
                    if me.capture.is_some() && me.reader.is_none() {
                        me.start_reader(ctx);
                    }
                });
            }
            _ => {}
        }
    }
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
    me: &Addr<Console>,
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
async fn read(
    source: ConsoleSource,
    ipmi: IpmiConfig,
    suite: Option<u8>,
    generation: u64,
    me: Addr<Console>,
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
