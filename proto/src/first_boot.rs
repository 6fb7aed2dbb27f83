//! First-boot files (`ImageInstallation.nocloud`, `config_drive`) as both
//! sides check them: shepherd before it asks, the agent before it writes.

/// A first-boot file's path inside its volume: relative, `/`-separated,
/// no `.` or `..` parts, at most 255 bytes, printable.
pub fn check_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > 255 {
        return Err(format!(
            "the file name {p:?} is empty or longer than 255 bytes"
        ));
    }
    if p.starts_with('/')
        || p.split('/').any(|c| c.is_empty() || c == "." || c == "..")
        || p.chars().any(|c| c.is_control() || c == '\\')
    {
        return Err(format!(
            "the file name {p:?} is not a relative path of plain names (no leading /, no . or .., no \\)"
        ));
    }
    Ok(())
}
