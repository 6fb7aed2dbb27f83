//! Schema migrations (`migrations/`, embedded at build time), applied by
//! refinery under a PostgreSQL advisory lock so that processes starting
//! together migrate one after the other.

use super::{Bmdb, BmdbError};

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// An arbitrary constant naming the "BMDB migrations" advisory lock.
const MIGRATION_LOCK: i64 = 0x5348_4550_4845_5244; // "SHEPHERD"

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this run, as `V<n>__<name>`.
    pub applied: Vec<String>,
    /// The schema version after the run.
    pub version: Option<i32>,
}

impl Bmdb {
    /// Applies pending migrations. A no-op on an up-to-date schema; safe to
    /// run from many processes at once.
    pub async fn migrate(&self) -> Result<MigrationReport, BmdbError> {
        self.migrate_to(None).await
    }

    /// Applies pending migrations up to `version` (all with None).
    pub async fn migrate_to(&self, version: Option<u32>) -> Result<MigrationReport, BmdbError> {
        let mut conn = self.conn().await?;
        let client = conn.client_mut();
        client
            .query("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| {
                BmdbError::Migration(format!(
                    "taking the migration lock: {}",
                    super::error::describe_pg_error(&e)
                ))
            })?;
        let result = embedded::migrations::runner()
            .set_abort_divergent(true)
            .set_abort_missing(true)
            .set_target(match version {
                Some(v) => refinery::Target::Version(v),
                None => refinery::Target::Latest,
            })
            .run_async(client)
            .await;
        let unlock = client
            .query("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        let report = result.map_err(|e| BmdbError::Migration(e.to_string()))?;
        unlock?;
        let applied: Vec<String> = report
            .applied_migrations()
            .iter()
            .map(|m| format!("V{}__{}", m.version(), m.name()))
            .collect();
        let version = {
            let row = client
                .query_opt("SELECT max(version) FROM refinery_schema_history", &[])
                .await?;
            row.and_then(|r| r.get::<_, Option<i32>>(0))
        };
        for m in &applied {
            tracing::info!(migration = %m, "applied BMDB migration");
        }
        Ok(MigrationReport { applied, version })
    }
}
