//! `shepherd migrate`: the BMDB's schema brought up to date.

use shepherd::bmdb::Bmdb;
use shepherd::config::Config;

pub async fn run(mut cfg: Config) -> anyhow::Result<()> {
    cfg.bmdb.migrate_on_start = false;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let report = bmdb.migrate().await?;
    if report.applied.is_empty() {
        println!(
            "BMDB schema is up to date (version {})",
            report.version.unwrap_or(0)
        );
    } else {
        for m in &report.applied {
            println!("applied {m}");
        }
        println!("BMDB schema at version {}", report.version.unwrap_or(0));
    }
    Ok(())
}
