//! `config/shepherd.toml` documents every key and default, and loads to
//! exactly the built-in configuration.

use super::*;

/// config/shepherd.toml documents every default: it must load to exactly
/// the built-in configuration.
#[test]
fn the_shipped_file_matches_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shepherd.toml");
    let from_file = Config::load_with_env(Some(&path), Vec::new()).unwrap();
    let mut defaults = Config::default();
    defaults.validate().unwrap();
    assert_eq!(from_file.to_redacted_toml(), defaults.to_redacted_toml());
}

/// ...and writes every key out (set, or commented out when it has no
/// default), under its section, so an operator finds each one there.
#[test]
fn the_shipped_file_documents_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/shepherd.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut missing = Vec::new();
    let all = toml::Value::try_from(Config::default()).unwrap();
    fn walk(prefix: &str, v: &toml::Value, text: &str, missing: &mut Vec<String>) {
        let toml::Value::Table(t) = v else { return };
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(_) => {
                    if !text.contains(&format!("[{key}]")) {
                        missing.push(format!("[{key}]"));
                    }
                    walk(&key, v, text, missing);
                }
                _ => {
                    if !text
                        .lines()
                        .any(|l| l.trim_start_matches("# ").starts_with(&format!("{k} =")))
                    {
                        missing.push(key);
                    }
                }
            }
        }
    }
    walk("", &all, &text, &mut missing);
    // Keys without a default (Option) are absent from the serialized
    // defaults; check the known ones are shown commented out.
    for k in [
        "url",
        "password",
        "bin_dir",
        "project_id",
        "api_key",
        "known_hosts_file",
        "agent_binary",
        "agent_endpoint",
        "agent_ca_certificate",
        "endpoint",
        "tls_dir",
        "plan",
        "metro",
        "facility",
        "file",
        "tokens",
        "interface",
        "mode",
        "range",
        "router",
        "dns",
        "lease",
        "tftp_root",
        "discover",
        "discover_per_minute",
        "discover_ttl",
        "database_timeout",
        "address",
        "http_listen",
        "dhcp_port",
        "proxy_port",
        "tftp_port",
        "answer_router_solicitations",
    ] {
        if !text
            .lines()
            .any(|l| l.trim_start_matches("# ").starts_with(&format!("{k} =")))
        {
            missing.push(k.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "config/shepherd.toml does not document: {missing:?}"
    );
}
