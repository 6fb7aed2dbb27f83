//! The operator's guide (`docs/`, an mdBook) and README.md, checked
//! against themselves and the code: every chapter in the summary, every
//! link to a chapter and a heading resolving, every command of the
//! `shepherd` binary and every machine state listed, the life cycle's
//! transitions and diagram as the code declares them, and a README that
//! stays short and names the test command.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use shepherd::bmdb::lifecycle::{self, MachineState};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn guide() -> PathBuf {
    root().join("docs/src")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The chapters: every Markdown file under docs/src.
fn chapters() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(guide()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            out.insert(name, read(&e.path()));
        }
    }
    out
}

/// The id mdBook gives a heading: its text, lowercase, spaces as `-`,
/// nothing but letters, digits, `-` and `_` kept.
fn heading_id(text: &str) -> String {
    // Code spans and link syntax are not part of the text.
    let text = text.replace('`', "");
    let mut plain = String::new();
    let mut in_target = false;
    let mut prev = ' ';
    for c in text.chars() {
        if c == '(' && prev == ']' {
            in_target = true;
        } else if in_target && c == ')' {
            in_target = false;
        } else if !in_target && c != '[' && c != ']' {
            plain.push(c);
        }
        prev = c;
    }
    plain
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The heading ids of a chapter (outside code blocks).
fn headings(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence && line.starts_with('#') {
            ids.insert(heading_id(line.trim_start_matches('#')));
        }
    }
    ids
}

/// The targets of a text's inline links `[..](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence || line.starts_with("    ") {
            continue;
        }
        // Not inside code spans.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn the_summary_lists_every_chapter_and_only_chapters_that_exist() {
    let summary = read(&guide().join("SUMMARY.md"));
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let files: BTreeSet<String> = chapters()
        .into_keys()
        .filter(|n| n != "SUMMARY.md")
        .collect();
    assert_eq!(
        listed, files,
        "docs/src/SUMMARY.md and the chapter files differ"
    );
    let book = read(&root().join("docs/book.toml"));
    assert!(book.contains("src = \"src\""), "{book}");
}

#[test]
fn every_link_of_the_guide_and_the_readme_resolves() {
    let chapters = chapters();
    let ids: BTreeMap<&String, BTreeSet<String>> =
        chapters.iter().map(|(n, t)| (n, headings(t))).collect();
    let mut broken = Vec::new();
    let mut leaving = Vec::new();
    let mut checked = 0;
    let mut check = |from: &str, base: &Path, target: &str| {
        if target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with("mailto:")
        {
            return;
        }
        checked += 1;
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target, None),
        };
        let path = if file.is_empty() {
            base.join(from)
        } else {
            base.join(file)
        };
        if !path.exists() {
            broken.push(format!("{from}: {target} (no {})", path.display()));
            return;
        }
        if let Some(a) = anchor {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let known = if path.parent() == Some(&guide()) {
                ids.get(&name).cloned().unwrap_or_default()
            } else {
                headings(&read(&path))
            };
            if !known.contains(a) {
                broken.push(format!("{from}: {target} (no heading #{a} in {name})"));
            }
        }
    };
    for (name, text) in &chapters {
        for t in links(text) {
            // The guide is its own site: nothing outside docs/src.
            if !t.starts_with("http") && t.contains("../") {
                leaving.push(format!("{name}: {t} leaves the guide"));
                continue;
            }
            check(name, &guide(), &t);
        }
    }
    let readme = read(&root().join("README.md"));
    for t in links(&readme) {
        if t.starts_with("../") {
            // Beside the checkout (CONTRACTS.md): not part of it.
            continue;
        }
        check("README.md", &root(), &t);
    }
    assert!(checked > 40, "only {checked} links found");
    broken.extend(leaving);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every leaf command of `shepherd`, from its own help (`run`,
/// `machines list`, …).
fn commands(bin: &Path, path: &[String], out: &mut Vec<String>) {
    let o = Command::new(bin)
        .args(path)
        .arg("--help")
        .output()
        .expect("the shepherd binary runs");
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut subs = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap_or("");
            if !name.is_empty() && name != "help" {
                subs.push(name.to_string());
            }
        }
    }
    if subs.is_empty() {
        out.push(path.join(" "));
    }
    for s in subs {
        let mut p = path.to_vec();
        p.push(s);
        commands(bin, &p, out);
    }
}

#[test]
fn the_command_reference_lists_every_command_of_the_binary() {
    let bin = shepherd_sim::testing::bin("shepherd");
    let mut all = Vec::new();
    commands(&bin, &[], &mut all);
    assert!(all.len() >= 15, "{all:?}");
    assert!(all.iter().any(|c| c == "machines deprovision"), "{all:?}");
    let reference = read(&guide().join("commands.md"));
    let missing: Vec<&String> = all
        .iter()
        .filter(|c| !reference.contains(&format!("`shepherd {c}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/commands.md lists no `shepherd COMMAND` for {missing:?}"
    );
}

#[test]
fn the_life_cycle_chapter_shows_every_state_and_the_declared_transitions() {
    let chapter = read(&guide().join("lifecycle.md"));
    let states = &chapter[chapter.find("## States").expect("a States section")..];
    for s in MachineState::ALL {
        assert!(
            states.contains(&format!("| `{s}` |")),
            "docs/src/lifecycle.md's States table has no row for {s}"
        );
    }
    for (what, text) in [
        ("table of actions", lifecycle::markdown_table()),
        ("transitions", lifecycle::transitions_table()),
        ("state diagram", lifecycle::state_diagram()),
    ] {
        assert!(
            chapter.contains(&text),
            "docs/src/lifecycle.md does not show the code's {what}; it should read:\n{text}"
        );
    }
}

#[test]
fn the_readme_is_short_and_names_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < 200,
        "README.md has {lines} lines: the rest belongs in the guide"
    );
    assert!(
        readme.contains("scripts/demo"),
        "the command that runs shepherd"
    );
    assert!(
        readme.contains("./scripts/test"),
        "the test command CI runs"
    );
    assert!(
        readme.contains("docs/src/introduction.md"),
        "where to go next"
    );
}
