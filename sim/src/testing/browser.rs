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

/// Saves what a browser shows at `url` to `png` (`width` × `height`), by
/// `tests/browser/admin_pages.py screenshot`: for people to look at.
pub fn screenshot(url: &str, png: &std::path::Path, width: u32, height: u32) {
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/browser/admin_pages.py"
        ))
        .args(["screenshot", url])
        .arg(png)
        .args([width.to_string(), height.to_string()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "screenshot of {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The body `url` answers a GET with, as text (a page, 4 MiB at most).
pub async fn page(url: &str) -> String {
    let body = awc::Client::default()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body()
        .limit(4 << 20)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    String::from_utf8_lossy(&body).into_owned()
}
