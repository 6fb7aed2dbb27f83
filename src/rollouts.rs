//! The `RolloutDriver`: on a timer, moves every running rollout on
//! (`bmdb::rollouts::advance`), each in a transaction of its own under the
//! session. Any number of shepherds may run one: a rollout held by
//! another's transaction is skipped this round.

use actix::prelude::*;

use crate::bmdb::Session;
use crate::bmdb::rollouts;
use crate::control::SetSession;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutStatus {
    pub rounds: u64,
    pub failed_rounds: u64,
    /// Machines asked to install, over all rounds.
    pub started: u64,
}

#[derive(Message)]
#[rtype(result = "RolloutStatus")]
pub struct GetRolloutStatus;

/// Runs a round now (an operator just created or canceled a rollout).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Nudge;

pub struct RolloutDriver {
    interval: std::time::Duration,
    session: Option<Session>,
    in_round: bool,
    status: RolloutStatus,
}

impl RolloutDriver {
    pub fn new(interval: std::time::Duration) -> Self {
        RolloutDriver {
            interval,
            session: None,
            in_round: false,
            status: RolloutStatus::default(),
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.in_round {
            return;
        }
        let Some(session) = self.session.clone() else {
            return;
        };
        self.in_round = true;
        ctx.spawn(drive(session).into_actor(self).map(|r, act, _| {
            act.in_round = false;
            act.status.rounds += 1;
            match r {
                Ok(n) => act.status.started += n,
                Err(e) if act.session.is_none() => {
                    tracing::debug!(error = %e, "rollout round stopped")
                }
                Err(e) => {
                    act.status.failed_rounds += 1;
                    tracing::warn!(error = %e, "rollout round failed");
                }
            }
        }));
    }
}

async fn drive(session: Session) -> Result<u64, String> {
    let ids = session
        .transact(async |tx| rollouts::running(tx).await)
        .await
        .map_err(|e| format!("listing running rollouts: {e}"))?;
    let mut started = 0;
    for id in ids {
        let a = session
            .transact(async |tx| rollouts::advance(tx, id).await)
            .await
            .map_err(|e| format!("rollout {id}: {e}"))?;
        for (machine_id, ok) in &a.ended {
            if *ok {
                tracing::info!(rollout = %id, %machine_id, "rollout: machine installed");
            } else {
                tracing::warn!(rollout = %id, %machine_id, "rollout: machine's installation failed");
            }
        }
        for machine_id in &a.started {
            tracing::info!(rollout = %id, %machine_id, "rollout: machine asked to install");
        }
        if let Some(state) = &a.finished {
            tracing::info!(rollout = %id, %state, "rollout ended");
        }
        started += a.started.len() as u64;
    }
    Ok(started)
}

impl Actor for RolloutDriver {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.interval, |act, ctx| act.round(ctx));
    }
}

impl Handler<SetSession> for RolloutDriver {
    type Result = ();

    fn handle(&mut self, msg: SetSession, ctx: &mut Context<Self>) {
        self.session = msg.0;
        self.round(ctx);
    }
}

impl Handler<Nudge> for RolloutDriver {
    type Result = ();

    fn handle(&mut self, _: Nudge, ctx: &mut Context<Self>) {
        self.round(ctx);
    }
}

impl Handler<GetRolloutStatus> for RolloutDriver {
    type Result = MessageResult<GetRolloutStatus>;

    fn handle(&mut self, _: GetRolloutStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status.clone())
    }
}
