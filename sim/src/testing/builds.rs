//! The workspace's binaries for a test or a benchmark: built by the
//! running one's profile (`bin`, with the agent's test fault modes), the
//! agent as it ships (`shipped_agent`), and stripped copies to upload.

/// A binary of the workspace, built by the profile of the running test or
/// benchmark: `shepherd`, `takeover-agent` (with its test fault modes),
/// `fleet-sim`, `equinix-sim`, `shepherd-demo`. `cargo test --workspace`
/// (scripts/test) builds them all before any test runs; a test or
/// benchmark run alone builds them here once, if one is missing.
pub fn bin(name: &str) -> std::path::PathBuf {
    let dir = profile_dir();
    let path = dir.join(name);
    // A benchmark builds them once in any case: `cargo bench` rebuilds
    // only its own package's binaries, and a benchmark must not measure
    // a fleet-sim or an agent older than the code.
    if !path.exists() || !cfg!(debug_assertions) {
        static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        BUILT.get_or_init(|| build_bins(&dir));
    }
    assert!(
        path.exists(),
        "{} is missing: cargo build --workspace --bins --features shepherd-agent/faults",
        path.display()
    );
    path
}

/// The agent as it ships (`scripts/package`): `takeover-agent` built with
/// the `agent` profile (sized for bytes, no test fault modes) in the
/// running benchmark's target directory, then stripped. What a takeover's
/// figures should carry: its upload is most of a takeover's bytes.
/// `SHEPHERD_BENCH_AGENT=PATH` names another agent instead (to set two
/// builds side by side), copied and stripped the same way.
pub fn shipped_agent() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("SHEPHERD_BENCH_AGENT") {
                return stripped_copy(std::path::Path::new(&path));
            }
            let dir = profile_dir();
            let target = dir.parent().expect("a target directory");
            cargo_build(
                target,
                &["--profile", "agent", "-p", "shepherd-agent"],
                &["--bin", "takeover-agent"],
                "the agent as it ships (profile agent)",
            );
            stripped_copy(&target.join("agent").join("takeover-agent"))
        })
        .clone()
}

/// Builds the workspace's binaries into `dir` (a target directory's
/// profile directory) with the agent's test fault modes.
fn build_bins(dir: &std::path::Path) {
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        // Benchmarks: the bench profile writes to release/ as well.
        Some("release") if !cfg!(debug_assertions) => "bench",
        Some(other) => other,
        None => "dev",
    };
    cargo_build(
        dir.parent().expect("a target directory"),
        &[
            "--workspace",
            "--bins",
            "--features",
            "shepherd-agent/faults",
        ],
        &["--profile", profile],
        &format!("the workspace's binaries ({profile})"),
    );
}

/// The running test's or benchmark's profile directory (`target/debug`,
/// `target/release`).
fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let mut dir = exe.parent().expect("a directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// `cargo build` of this workspace into `target`, saying so first.
fn cargo_build(target: &std::path::Path, what: &[&str], how: &[&str], says: &str) {
    eprintln!("building {says} into {}", target.display());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet"])
        .args(what)
        .args(how)
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(target)
        .status()
        .expect("cargo");
    assert!(status.success(), "building {says} failed");
}

/// A stripped copy of `binary` in the temporary directory (an unstripped
/// copy where `strip` is missing): the agent as one would ship it, for the
/// benches that upload it thousands of times.
pub fn stripped_copy(binary: &std::path::Path) -> std::path::PathBuf {
    let name = binary.file_name().unwrap().to_string_lossy();
    let out = std::env::temp_dir().join(format!("shepherd-bench-{name}-{}", std::process::id()));
    let stripped = std::process::Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(binary, &out).unwrap();
    }
    out
}
