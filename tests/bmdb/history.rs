use std::time::Duration;

use shepherd::bmdb::machines;
use shepherd::bmdb::{Backoff, HistoryEvent, Process};

use crate::{Fleet, fleet, lease};

#[actix_rt::test]
async fn history_records_every_step_in_order_with_causes() {
    let Fleet {
        db: _db,
        bmdb,
        ids,
        session: s,
    } = fleet(1, None).await;
    let b = Backoff::constant(Duration::from_secs(1));

    let mut w = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    w.fail(&b, "ssh: connection refused").await.unwrap();
    let mut w = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    w.cancel().await.unwrap();
    let mut w = lease(&s, Process::ShepherdAgentStart, ids[0]).await;
    w.finish(async |_| Ok(())).await.unwrap();
    let mut w = lease(&s, Process::ShepherdRecovery, ids[0]).await;
    w.fail(&b, "reboot: 500 Internal Server Error")
        .await
        .unwrap();

    let h = bmdb
        .transact(async |tx| machines::history(tx, ids[0]).await)
        .await
        .unwrap();
    let got: Vec<_> = h
        .iter()
        .map(|e| (e.process, e.event, e.failed_cause.as_deref()))
        .collect();
    use HistoryEvent::*;
    use Process::*;
    assert_eq!(
        got,
        vec![
            (ShepherdAgentStart, Started, None),
            (ShepherdAgentStart, Failed, Some("ssh: connection refused")),
            (ShepherdAgentStart, Started, None),
            (ShepherdAgentStart, Canceled, None),
            (ShepherdAgentStart, Started, None),
            (ShepherdAgentStart, Finished, None),
            (ShepherdRecovery, Started, None),
            (
                ShepherdRecovery,
                Failed,
                Some("reboot: 500 Internal Server Error")
            ),
        ]
    );
    assert!(h.windows(2).all(|p| p[0].timestamp <= p[1].timestamp));

    // History outlives the machine.
    let mid = ids[0];
    bmdb.transact(async |tx| {
        tx.execute("DELETE FROM machines WHERE machine_id = $1", &[&mid])
            .await
    })
    .await
    .unwrap();
    let h = bmdb
        .transact(async |tx| machines::history(tx, mid).await)
        .await
        .unwrap();
    assert_eq!(h.len(), 8);
}
