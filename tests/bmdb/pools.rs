//! A handle with a pool of its own (`Bmdb::with_own_pool`, the admin
//! server's): it answers while the fleet's pool is held whole.

use std::time::Duration;

use shepherd::bmdb::Bmdb;
use shepherd_sim::testing::TestDb;

/// A handle whose pool is one connection, waited for half a second.
pub(crate) async fn one_connection(db: &TestDb) -> Bmdb {
    let config: tokio_postgres::Config = db.url().parse().unwrap();
    Bmdb::connect(
        config,
        1,
        Duration::from_secs(5),
        Duration::from_millis(500),
        TestDb::options(shepherd::config::Isolation::ReadCommitted),
    )
    .await
    .unwrap()
}

#[actix_rt::test]
async fn a_handle_with_its_own_pool_answers_while_the_shared_pool_is_held() {
    let db = TestDb::new().await;
    let fleet = one_connection(&db).await;
    let admin = fleet.with_own_pool(2);
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let fleet = fleet.clone();
        actix_rt::spawn(async move {
            let mut signals = Some((held_tx, release_rx));
            fleet
                .transact(async |tx| {
                    tx.query_one("SELECT 1", &[]).await?;
                    if let Some((held, release)) = signals.take() {
                        let _ = held.send(());
                        let _ = release.await;
                    }
                    Ok(())
                })
                .await
        })
    };
    held_rx.await.unwrap();

    // The fleet's one connection is taken: its handle waits, then fails
    // naming the pool.
    let err = fleet.ping().await.unwrap_err().to_string();
    assert!(
        err.contains("no free connection") && err.contains("all 1 in use"),
        "{err}"
    );
    // The admin server's handle answers from its own.
    let n: i64 = admin
        .transact(async |tx| Ok(tx.query_one("SELECT 41::int8 + 1", &[]).await?.get(0)))
        .await
        .unwrap();
    assert_eq!(n, 42);

    release_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();
    fleet.ping().await.unwrap();
    // Both handles count their transactions together.
    assert!(fleet.counters().committed >= 3, "{:?}", fleet.counters());
    assert_eq!(fleet.counters(), admin.counters());
}
