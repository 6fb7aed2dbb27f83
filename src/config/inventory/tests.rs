//! The inventory file's reading and checks, entry by entry.

use super::*;

#[test]
fn a_bad_entry_is_skipped_and_named_by_line_and_host() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("inventory.toml");
    let long = "x".repeat(200);
    std::fs::write(
        &f,
        format!(
            r#"[[machines]]
id = "good-1"
address = "192.0.2.1"

[[machines]]
id = "{long}"
address = "192.0.2.2"

[[machines]]
id = ""
address = "192.0.2.3"

[[machines]]
id = "bad-address"
address = "192.0.2.300"

[[machines]]
id = "good-2"
address = "2001:db8::2"
location = "rack 2"

[[machines]]
id = "good-1"
address = "192.0.2.9"

[[machines]]
id = "typo"
adress = "192.0.2.10"

[[machines]]
id = "by-bmc"
boot = "virtual-media"
bmc = {{ url = "https://10.0.0.5", username = "admin", password = "pw" }}

[[machines]]
id = "by-nothing"
boot = "virtual-media"

[[machines]]
id = "no-way-in"
location = "rack 3"

[[machines]]
id = "by-floppy"
address = "192.0.2.11"
boot = "floppy"
"#
        ),
    )
    .unwrap();
    let read = read_file(&f).unwrap();
    let ids: Vec<&str> = read.hosts.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["good-1", "good-2", "by-bmc"]);
    assert!(read.hosts[2].boots_from_bmc() && read.hosts[2].address.is_none());
    assert!(!read.hosts[0].boots_from_bmc());
    let p = &read.problems;
    assert_eq!(p.len(), 8, "{p:#?}");
    let file = f.display().to_string();
    assert!(
        p[0].starts_with(&format!("{file}:5: machines[1]: id is 200 characters long")),
        "{}",
        p[0]
    );
    assert!(
        p[1].starts_with(&format!("{file}:9: machines[2]: id is empty")),
        "{}",
        p[1]
    );
    assert!(
        p[2].starts_with(&format!(
            "{file}:13: host bad-address: address \"192.0.2.300\" is not an IP address"
        )),
        "{}",
        p[2]
    );
    assert!(
        p[3].starts_with(&format!("{file}:22: host good-1: listed more than once")),
        "{}",
        p[3]
    );
    assert!(
        p[4].starts_with(&format!("{file}:26: host typo: unknown key `adress`")),
        "{}",
        p[4]
    );
    assert!(
        p[5].starts_with(&format!(
            "{file}:35: host by-nothing: boot = \"virtual-media\" needs a bmc"
        )),
        "{}",
        p[5]
    );
    assert!(
        p[6].starts_with(&format!(
            "{file}:39: host no-way-in: address is missing (give an address to log in at, or boot = \"virtual-media\" or \"network\" with a bmc)"
        )),
        "{}",
        p[6]
    );
    assert!(
        p[7].starts_with(&format!(
            "{file}:43: host by-floppy: boot \"floppy\" is not \"ssh\", \"virtual-media\" or \"network\""
        )),
        "{}",
        p[7]
    );
}
