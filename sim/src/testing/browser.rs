//! The admin pages in a headless browser (Chromium through chromedriver).

/// Runs `tests/browser/admin_pages.py` (headless Chromium through
/// chromedriver) with `args`: what it saw, as JSON.
pub async fn browse(args: Vec<String>) -> serde_json::Value {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/browser/admin_pages.py"
            ))
            .args(&args)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "admin_pages.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    })
    .await
    .unwrap()
}
