//! IPMI 2.0 over LAN (RMCP+), for BMCs named `ipmi://host[:port]`
//! (CONTRACTS.md §6): power state, on, off, a restart (off, then on), a
//! one-time boot device (PXE or disk, with the EFI flag for UEFI
//! machines) and the FRU's product and serial as the BMC's facts.
//!
//! Driven through Debian's `ipmitool`, as Ironic and Metal3 do: a Rust
//! IPMI stack would need RMCP+ session setup, RAKP and cipher suites of
//! its own, and no maintained crate offers them. The password reaches
//! `ipmitool` on its standard input (`-f /dev/stdin`), never on its
//! command line or in its environment, so `ps` shows no secret; what
//! `ipmitool` prints is never the password.
//!
//! One command in flight per BMC (the `IpmiClient` actor handles one
//! message at a time), a cap over all of them (`ipmi.max_concurrent`).
//! Cipher suite 17 (SHA-256) is asked for first; a BMC that refuses it is
//! asked with 3 (SHA-1), and remembered.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::io::AsyncWriteExt as _;

use crate::bmc::{BmcError, BmcErrorKind, ByUrl};
use crate::bmdb::hardware::SystemFacts;
use crate::config::{BmcConfig, IpmiConfig};

/// Power as `chassis power status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    On,
    Off,
}

impl Power {
    /// As Redfish spells it, for the facts and the Recoverer.
    pub fn as_str(self) -> &'static str {
        match self {
            Power::On => "On",
            Power::Off => "Off",
        }
    }
}

/// Where the next boot goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootDevice {
    Pxe,
    Disk,
}

/// Reads the power state and (at most hourly) the FRU.
#[derive(Message)]
#[rtype(result = "Result<SystemFacts, BmcError>")]
pub struct ReadFacts;

/// Sets the next boot's device (once; `efi`: the EFI flag).
#[derive(Message)]
#[rtype(result = "Result<(), BmcError>")]
pub struct SetBootDevice {
    pub device: BootDevice,
    pub efi: bool,
}

/// Switches the machine on, or off then on when it is on (many BMCs,
/// and VirtualBMC, apply a boot device only at a real power-on; `cycle`
/// is optional in the standard). Ok: what was done.
#[derive(Message)]
#[rtype(result = "Result<String, BmcError>")]
pub struct Restart {
    pub power_timeout: Duration,
}

/// Switches the machine on or off (a hard power-off), and waits until the
/// BMC says so. Ok: what was done.
#[derive(Message)]
#[rtype(result = "Result<String, BmcError>")]
pub struct SetPower {
    pub on: bool,
    pub power_timeout: Duration,
}

/// One IPMI BMC.
pub struct IpmiClient {
    /// Moved into each command's future and back (with the suite it
    /// learned).
    conn: Option<Conn>,
    /// The FRU's facts, and when they were read (None: not yet, or the BMC
    /// has no FRU).
    fru: Option<(Instant, SystemFacts)>,
}

/// How often the FRU is read again.
const FRU_TTL: Duration = Duration::from_secs(3600);

/// The suites asked for, best first.
const SUITES: [u8; 2] = [17, 3];

/// What one run of `ipmitool` printed.
struct Output {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl IpmiClient {
    pub fn new(
        host: &str,
        bmc: BmcConfig,
        cfg: IpmiConfig,
        limit: Arc<tokio::sync::Semaphore>,
    ) -> Result<IpmiClient, BmcErrorKind> {
        let target = bmc
            .ipmi_target()
            .ok_or_else(|| BmcErrorKind::Config(format!("{} is not an ipmi:// URL", bmc.url)))?;
        Ok(IpmiClient {
            conn: Some(Conn {
                host: host.to_string(),
                bmc,
                target,
                cfg,
                limit,
                suite: None,
            }),
            fru: None,
        })
    }
}

impl Actor for IpmiClient {
    type Context = Context<Self>;
}

/// What `ipmitool`'s own words mean; the last line of its error output
/// is the one an operator reads.
fn explain(out: &Output) -> BmcErrorKind {
    let said = out
        .stderr
        .lines()
        .chain(out.stdout.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>();
    let last = said.last().copied().unwrap_or("no output").to_string();
    let all = said.join("; ");
    if all.contains("no response from RAKP")
        || all.contains("Unable to establish IPMI v2") && all.contains("no response")
    {
        BmcErrorKind::Unreachable(format!(
            "no answer to the session's setup (unknown user, or nothing at the port): {last}"
        ))
    } else if all.contains("Unable to establish IPMI v2") {
        BmcErrorKind::Credentials(format!(
            "no RMCP+ session (wrong password or user, or cipher suites 17 and 3 both refused): {last}"
        ))
    } else if all.contains("Node busy")
        || all.contains("Unspecified error")
        || all.contains("timeout")
    {
        BmcErrorKind::Unreachable(last)
    } else {
        BmcErrorKind::Protocol(all)
    }
}

/// A suite refused outright (the BMC answered with other algorithms).
fn suite_refused(out: &Output) -> bool {
    out.stderr.contains("is not what we requested")
        || out.stderr.contains("Invalid cipher suite")
        || out.stderr.contains("not supported")
}

async fn ipmitool(
    cfg: &IpmiConfig,
    target: &(String, u16),
    bmc: &BmcConfig,
    suite: u8,
    args: &[&str],
) -> Result<Output, BmcErrorKind> {
    let mut cmd = tokio::process::Command::new(&cfg.ipmitool);
    cmd.args(["-I", "lanplus", "-H", &target.0, "-p"])
        .arg(target.1.to_string())
        .args(["-U", &bmc.username, "-C"])
        .arg(suite.to_string())
        // Two tries, one second apart then two: an unreachable BMC fails
        // in about six seconds, not twenty.
        .args(["-R", "2", "-N", "1", "-f", "/dev/stdin"])
        .args(args)
        .env_remove("IPMI_PASSWORD")
        .env_remove("IPMITOOL_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        BmcErrorKind::Config(format!(
            "cannot run {} ({e}; Debian's ipmitool package has it, or set ipmi.ipmitool)",
            cfg.ipmitool.display()
        ))
    })?;
    if let Some(mut stdin) = child.stdin.take() {
        let mut pw = bmc.password.expose().as_bytes().to_vec();
        pw.push(b'\n');
        let _ = stdin.write_all(&pw).await;
        drop(stdin);
    }
    let out = tokio::time::timeout(cfg.timeout, child.wait_with_output())
        .await
        .map_err(|_| {
            BmcErrorKind::Unreachable(format!(
                "ipmitool did not finish within {}",
                humantime::format_duration(cfg.timeout)
            ))
        })?
        .map_err(|e| BmcErrorKind::Unreachable(format!("ipmitool: {e}")))?;
    let clean = |b: &[u8]| {
        let s = String::from_utf8_lossy(b).to_string();
        // Never echo a secret, should a tool ever print it.
        let pw = bmc.password.expose();
        if pw.is_empty() {
            s
        } else {
            s.replace(pw, "[redacted]")
        }
    };
    Ok(Output {
        ok: out.status.success(),
        stdout: clean(&out.stdout),
        stderr: clean(&out.stderr),
    })
}

/// The connection's parts, moved into a call's future.
struct Conn {
    host: String,
    bmc: BmcConfig,
    target: (String, u16),
    cfg: IpmiConfig,
    limit: Arc<tokio::sync::Semaphore>,
    /// The cipher suite that worked (None: not known yet).
    suite: Option<u8>,
}

impl Conn {
    fn err(&self, kind: BmcErrorKind) -> BmcError {
        BmcError {
            host: self.host.clone(),
            bmc: self.bmc.url.clone(),
            kind,
        }
    }

    /// One command, in the suite that works (found on first use).
    async fn run(&mut self, args: &[&str]) -> Result<String, BmcError> {
        let _permit = self.limit.clone().acquire_owned().await;
        let suites: Vec<u8> = match self.suite {
            Some(s) => vec![s],
            None => SUITES.to_vec(),
        };
        let mut last = None;
        for suite in suites {
            let t = Instant::now();
            let out = ipmitool(&self.cfg, &self.target, &self.bmc, suite, args)
                .await
                .map_err(|kind| self.err(kind))?;
            // A BMC that answered at once but set up no session may lack
            // suite 17 without saying so; one that did not answer is not
            // asked again.
            let answered = t.elapsed() < Duration::from_secs(2);
            if out.ok {
                if self.suite.is_none() {
                    tracing::info!(host = %self.host, bmc = %self.bmc.url, suite, "IPMI session set up");
                }
                self.suite = Some(suite);
                return Ok(out.stdout);
            }
            let refused = suite_refused(&out)
                || (self.suite.is_none()
                    && suite == 17
                    && answered
                    && out.stderr.contains("Unable to establish IPMI v2"));
            last = Some(out);
            if !refused {
                break;
            }
        }
        let out = last.expect("at least one suite tried");
        Err(self.err(explain(&out)).with_command(args))
    }

    async fn power(&mut self) -> Result<Power, BmcError> {
        let out = self.run(&["chassis", "power", "status"]).await?;
        if out.contains("is on") {
            Ok(Power::On)
        } else if out.contains("is off") {
            Ok(Power::Off)
        } else {
            Err(self.err(BmcErrorKind::Protocol(format!(
                "chassis power status said {:?}",
                out.trim()
            ))))
        }
    }

    async fn wait_for(
        &mut self,
        want: Power,
        started: Instant,
        timeout: Duration,
    ) -> Result<(), BmcError> {
        loop {
            match self.power().await {
                Ok(p) if p == want => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind.is_transient() => {}
                Err(e) => return Err(e),
            }
            if started.elapsed() >= timeout {
                return Err(self.err(BmcErrorKind::Protocol(format!(
                    "the machine was not {} {} after the power command",
                    want.as_str(),
                    humantime::format_duration(timeout)
                ))));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl BmcError {
    fn with_command(mut self, args: &[&str]) -> BmcError {
        if let BmcErrorKind::Protocol(m) = &self.kind {
            self.kind = BmcErrorKind::Protocol(format!("`{}`: {m}", args.join(" ")));
        }
        self
    }
}

/// The FRU's product facts (`fru print 0`), None when it has none.
fn fru_facts(text: &str) -> SystemFacts {
    let field = |names: &[&str]| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            let (k, v) = (k.trim(), v.trim());
            (names.contains(&k) && !v.is_empty()).then(|| v.to_string())
        })
    };
    SystemFacts {
        manufacturer: field(&["Product Manufacturer"]).or_else(|| field(&["Board Mfg"])),
        model: field(&["Product Name"]).or_else(|| field(&["Board Product"])),
        serial_number: field(&["Product Serial"])
            .or_else(|| field(&["Chassis Serial"]))
            .or_else(|| field(&["Board Serial"])),
        ..SystemFacts::default()
    }
}

impl IpmiClient {
    /// `f` on the connection, as one sequence (no other command to this
    /// BMC in between); `then` turns its answer into the message's.
    fn atomic<T: 'static, R: 'static, F>(
        &mut self,
        f: impl FnOnce(Conn) -> F,
        then: impl FnOnce(&mut Self, T) -> R + 'static,
    ) -> AtomicResponse<Self, R>
    where
        F: std::future::Future<Output = (Conn, T)> + 'static,
    {
        let conn = self.conn.take().expect("one command at a time");
        AtomicResponse::new(Box::pin(f(conn).into_actor(self).map(
            move |(conn, answer), act, _| {
                act.conn = Some(conn);
                then(act, answer)
            },
        )))
    }
}

impl Handler<ReadFacts> for IpmiClient {
    type Result = AtomicResponse<Self, Result<SystemFacts, BmcError>>;

    fn handle(&mut self, _: ReadFacts, _: &mut Context<Self>) -> Self::Result {
        let fru = self.fru.clone().filter(|(at, _)| at.elapsed() < FRU_TTL);
        self.atomic(
            |mut c| async move {
                let power = c.power().await;
                let fru = match (&power, fru) {
                    (Ok(_), Some(known)) => Some(known),
                    (Ok(_), None) => {
                        // A BMC without a FRU answers an error: no facts,
                        // asked again in an hour.
                        let f = c
                            .run(&["fru", "print", "0"])
                            .await
                            .map(|t| fru_facts(&t))
                            .unwrap_or_default();
                        Some((Instant::now(), f))
                    }
                    (Err(_), _) => None,
                };
                (c, (power, fru))
            },
            |act, (power, fru)| {
                if fru.is_some() {
                    act.fru = fru.clone();
                }
                let power = power?;
                let mut facts = fru.map(|(_, f)| f).unwrap_or_default();
                facts.power_state = Some(power.as_str().to_string());
                Ok(facts)
            },
        )
    }
}

impl Handler<SetBootDevice> for IpmiClient {
    type Result = AtomicResponse<Self, Result<(), BmcError>>;

    fn handle(&mut self, msg: SetBootDevice, _: &mut Context<Self>) -> Self::Result {
        self.atomic(
            |mut c| async move {
                let device = match msg.device {
                    BootDevice::Pxe => "pxe",
                    BootDevice::Disk => "disk",
                };
                let mut args = vec!["chassis", "bootdev", device];
                if msg.efi {
                    args.push("options=efiboot");
                }
                let r = c.run(&args).await.map(|_| ());
                (c, r)
            },
            |_, r| r,
        )
    }
}

impl Handler<Restart> for IpmiClient {
    type Result = AtomicResponse<Self, Result<String, BmcError>>;

    fn handle(&mut self, msg: Restart, _: &mut Context<Self>) -> Self::Result {
        self.atomic(
            |mut c| async move {
                let r = async {
                    let started = Instant::now();
                    let was = c.power().await?;
                    let mut done = Vec::new();
                    if was == Power::On {
                        c.run(&["chassis", "power", "off"]).await?;
                        c.wait_for(Power::Off, started, msg.power_timeout).await?;
                        done.push("power off");
                    }
                    c.run(&["chassis", "power", "on"]).await?;
                    c.wait_for(Power::On, started, msg.power_timeout).await?;
                    done.push("power on");
                    Ok(done.join(", then "))
                }
                .await;
                (c, r)
            },
            |_, r| r,
        )
    }
}

impl Handler<SetPower> for IpmiClient {
    type Result = AtomicResponse<Self, Result<String, BmcError>>;

    fn handle(&mut self, msg: SetPower, _: &mut Context<Self>) -> Self::Result {
        self.atomic(
            |mut c| async move {
                let r = async {
                    let started = Instant::now();
                    let want = if msg.on { Power::On } else { Power::Off };
                    if c.power().await? == want {
                        return Ok(format!("already {}", if msg.on { "on" } else { "off" }));
                    }
                    let word = if msg.on { "on" } else { "off" };
                    c.run(&["chassis", "power", word]).await?;
                    c.wait_for(want, started, msg.power_timeout).await?;
                    Ok(format!("power {word}"))
                }
                .await;
                (c, r)
            },
            |_, r| r,
        )
    }
}

/// The IPMI clients, by BMC URL (as `redfish::Bmcs` keeps Redfish's).
pub struct Ipmis {
    cfg: IpmiConfig,
    limit: Arc<tokio::sync::Semaphore>,
    clients: ByUrl<IpmiClient>,
}

impl Ipmis {
    pub fn new(cfg: &IpmiConfig) -> Ipmis {
        Ipmis {
            cfg: cfg.clone(),
            limit: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent as usize)),
            clients: ByUrl::default(),
        }
    }

    /// `msg` to `host`'s BMC; its answer.
    pub async fn ask<M, T>(&self, host: &str, bmc: &BmcConfig, msg: M) -> Result<T, BmcError>
    where
        M: Message<Result = Result<T, BmcError>> + Send + 'static,
        T: Send + 'static,
        IpmiClient: Handler<M>,
    {
        let make = || IpmiClient::new(host, bmc.clone(), self.cfg.clone(), self.limit.clone());
        self.clients.ask(host, bmc, make, msg).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fru_s_product_and_serial_are_the_facts() {
        let f = fru_facts(
            "FRU Device Description : Builtin FRU Device (ID 0)\n Board Mfg : ACME\n Product Manufacturer  : ACME Corp\n Product Name          : R640\n Product Serial        : SN123\n",
        );
        assert_eq!(f.manufacturer.as_deref(), Some("ACME Corp"));
        assert_eq!(f.model.as_deref(), Some("R640"));
        assert_eq!(f.serial_number.as_deref(), Some("SN123"));
        assert_eq!(
            fru_facts(" Device not present (Invalid command)\n"),
            SystemFacts::default()
        );
    }

    #[test]
    fn ipmitool_s_failures_read_as_their_cause() {
        let out = |stderr: &str| Output {
            ok: false,
            stdout: String::new(),
            stderr: stderr.to_string(),
        };
        assert!(matches!(
            explain(&out("Error: Unable to establish IPMI v2 / RMCP+ session")),
            BmcErrorKind::Credentials(_)
        ));
        assert!(matches!(
            explain(&out(
                "> Error: no response from RAKP 1 message\nError: Unable to establish IPMI v2 / RMCP+ session"
            )),
            BmcErrorKind::Unreachable(_)
        ));
        assert!(suite_refused(&out(
            "Authentication algorithm 0x01 is not what we requested 0x03\n\nError: Unable to establish IPMI v2 / RMCP+ session"
        )));
    }
}
