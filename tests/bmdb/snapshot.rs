//! `Bmdb::snapshot`: a read of several statements sees one moment.

use shepherd::bmdb::Provider;
use shepherd::bmdb::machines;

use crate::{count, fleet, provided_machines};

const MACHINES: &str = "SELECT count(*) FROM machines";

#[actix_rt::test]
async fn a_snapshot_does_not_see_what_is_committed_while_it_reads() {
    let f = fleet(1, None).await;
    let bmdb = &f.bmdb;
    let (first, second, summaries) = bmdb
        .snapshot(async |tx| {
            let first: i64 = tx.query_one(MACHINES, &[]).await?.get(0);
            // Another transaction, on another connection, commits a
            // machine between this snapshot's statements.
            provided_machines(bmdb, Provider::Equinix, 1).await;
            let second: i64 = tx.query_one(MACHINES, &[]).await?.get(0);
            let summaries = machines::fleet_counts(tx).await?;
            Ok((first, second, summaries))
        })
        .await
        .unwrap();
    assert_eq!((first, second), (1, 1), "the snapshot saw the new machine");
    let seen: i64 = summaries.iter().map(|(_, n)| *n).sum();
    assert_eq!(seen, 1, "{summaries:?}");
    // The same reads in a plain transaction see each statement's moment.
    let (first, second) = bmdb
        .transact(async |tx| {
            let first: i64 = tx.query_one(MACHINES, &[]).await?.get(0);
            provided_machines(bmdb, Provider::Equinix, 1).await;
            let second: i64 = tx.query_one(MACHINES, &[]).await?.get(0);
            Ok((first, second))
        })
        .await
        .unwrap();
    assert_eq!((first, second), (2, 3));
    assert_eq!(count(bmdb, MACHINES).await, 3);
}
