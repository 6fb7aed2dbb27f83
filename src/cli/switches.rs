//! `shepherd switches`: each switch shepherd changes, whether it answers,
//! its ports and the changes made on it.

use shepherd::bmdb::Bmdb;
use shepherd::config::Config;

pub async fn run(mut cfg: Config) -> anyhow::Result<()> {
    cfg.bmdb.pool_size = 2;
    let bmdb = Bmdb::open(&cfg.bmdb).await?;
    let switches = bmdb
        .snapshot(async |tx| shepherd::bmdb::switches::switches(tx).await)
        .await?;
    let t = |s: std::time::SystemTime| humantime::format_rfc3339_seconds(s).to_string();
    if switches.is_empty() && cfg.network.switches.is_empty() {
        println!("no switches (network.switches is empty)");
        return Ok(());
    }
    for c in &cfg.network.switches {
        if !switches.iter().any(|s| s.name == c.name) {
            println!("{}: configured, never reached ({})", c.name, c.address);
        }
    }
    for s in &switches {
        let state = match (s.failures, s.reached_at) {
            (0, Some(at)) => format!("answering (last read back {})", t(at)),
            (0, None) => "never reached".to_string(),
            (n, _) => format!(
                "FAILING ({n} sessions in a row; last {}): {}",
                s.failed_at.map(t).unwrap_or_default(),
                s.error.as_deref().unwrap_or("")
            ),
        };
        println!(
            "{}: {state}; {} ports, {} not yet where wanted; {} changes made",
            s.name, s.ports, s.ports_pending, s.changes
        );
        for (port, vlans) in &s.uplinks {
            let carries = match vlans {
                Some(v) => v.iter().map(i32::to_string).collect::<Vec<_>>().join(","),
                None => "not read back yet".into(),
            };
            println!("  uplink {port}: {carries}");
        }
    }
    Ok(())
}
