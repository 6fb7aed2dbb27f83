//! Files written whole or not at all: the agent's state and key (readable
//! by it alone), shepherd's secrets, and the fleet CA it publishes.

/// Writes `contents` to `path` readable by its owner only (0600), whole or
/// not at all: through a temporary file beside it, synced, then renamed.
/// Missing directories are made 0700.
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    write_whole(path, contents, 0o600)
}

/// Writes `contents` to `path` with `mode`, whole or not at all: through
/// a temporary file beside it, synced, then renamed (a reader sees the old
/// file or the new, never a part).
pub fn write_whole(path: &std::path::Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
