//! The house's rules (ARCHITECTURE.md, "The house"), checked on the
//! source and on cargo's resolution: the service's modules import only
//! modules of a lower layer (so there is no circle among them); the files
//! of one module (its `mod.rs` included) form no circle; nothing in the
//! service reaches the simulated floor (`shepherd-sim`) or the agent's
//! program (`shepherd-agent`), and `bmdb` only `config`, `backoff`,
//! `mac` and `fault`; the service links no simulator and no disk writer; what ships
//! has no test fault mode; the agent's crate links nothing of the
//! service. And ARCHITECTURE.md shows these layers, and every name it
//! writes in backquotes (a path, a Rust item, a table, a key, a metric, a
//! command) exists.
//!
//!     cargo test --test house -- --nocapture
//!
//! prints the layers and every import between modules it found
//! (`SHEPHERD_HOUSE_ROOT=DIR` reads another checkout's tree instead).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The service's modules, bottom up. A module may import only modules of
/// a strictly lower layer. (`main.rs` and `cli/`, the binary, may import
/// any.)
const LAYERS: &[&[&str]] = &[
    &["secret", "backoff", "tls", "mac", "fault"],
    &["config"],
    &["bmc", "bmdb", "equinix", "ssh", "telemetry"],
    &[
        "redfish",
        "ipmi",
        "callback",
        "control",
        "takeover",
        "baselines",
        "console",
    ],
    &["provider", "images"],
    &[
        "brake_watch",
        "deadlines",
        "devices",
        "enroller",
        "fleet_tally",
        "initializer",
        "netboot",
        "plan_labels",
        "provisioner",
        "recoverer",
        "rollouts",
        "servicer",
        "sos",
        "switches",
        "updater",
    ],
    &["status"],
    &["admin"],
    &["metal"],
    &["supervisor"],
];

/// What the agent's crate must never depend on, at any depth: the service,
/// its actor system, its database client, its HTTP server and client.
const NOT_FOR_THE_AGENT: &[&str] = &[
    "shepherd",
    "actix",
    "actix-rt",
    "actix-web",
    "awc",
    "tokio-postgres",
    "postgres-types",
    "bb8",
    "refinery",
    "config",
    "prometheus-client",
    "russh",
];

/// This checkout, or the one `SHEPHERD_HOUSE_ROOT` names (to read
/// another revision's tree against today's rules).
fn root() -> PathBuf {
    std::env::var_os("SHEPHERD_HOUSE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Source without comments, string and character literals (so a path in a
/// doc comment or a message is not an import).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (b[i] == b'r' || (b[i] == b'b' && b.get(i + 1) == Some(&b'r')))
            && (i == 0 || !ident(b[i - 1]))
            && {
                let s = if b[i] == b'b' { i + 2 } else { i + 1 };
                let hashes = b[s..].iter().take_while(|&&c| c == b'#').count();
                b.get(s + hashes) == Some(&b'"')
            }
        {
            let s = if b[i] == b'b' { i + 2 } else { i + 1 };
            let hashes = b[s..].iter().take_while(|&&c| c == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = s + hashes + 1;
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p + close.len());
            out.push_str("\"\"");
            i = end;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            let lit = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 3 + p)
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 2 + ch)
            };
            match lit {
                Some(end) => {
                    out.push_str("'c'");
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The first path segments after `prefix::` (and inside `prefix::{…}`
/// groups): the modules a file reaches through `prefix`.
fn reached(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let pat = format!("{prefix}::");
    let b = code.as_bytes();
    let mut at = 0;
    while let Some(p) = code[at..].find(&pat) {
        let start = at + p;
        at = start + pat.len();
        if start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
            continue;
        }
        if b.get(at) == Some(&b'{') {
            // A group: the first segment of each of its top-level items.
            let (mut depth, mut expecting, mut name) = (0, false, String::new());
            for &c in &b[at..] {
                let is_ident = c.is_ascii_alphanumeric() || c == b'_';
                if depth == 1 && expecting && is_ident {
                    name.push(c as char);
                    continue;
                }
                if !name.is_empty() {
                    found.insert(std::mem::take(&mut name));
                    expecting = false;
                }
                match c {
                    b'{' => {
                        depth += 1;
                        expecting = depth == 1;
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => expecting = true,
                    _ => {}
                }
            }
        } else {
            let name: String = code[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

/// `src/admin/pages.rs` → ["admin", "pages"]; `src/admin/mod.rs` → ["admin"].
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") || parts == ["lib"] {
        parts.pop();
    }
    parts
}

struct SourceFile {
    /// Relative to the checkout: `src/admin/mod.rs`.
    path: String,
    module: Vec<String>,
    code: String,
}

fn service_files() -> Vec<SourceFile> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| SourceFile {
            path: f.strip_prefix(root()).unwrap().display().to_string(),
            module: module_path(&src, &f),
            code: code_only(&std::fs::read_to_string(&f).unwrap()),
        })
        .collect()
}

/// What the crate root re-exports (`pub use bmdb::{Bmdb, BmdbError};`):
/// name → the module it comes from.
fn root_reexports() -> BTreeMap<String, String> {
    let lib = code_only(&std::fs::read_to_string(root().join("src/lib.rs")).unwrap());
    let mut names = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        for item in items.trim_matches(['{', '}', ' ', '\n']).split(',') {
            let name = item.rsplit(" as ").next().unwrap().trim();
            if !name.is_empty() {
                names.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    names
}

/// The modules (top level, or siblings under one parent) a file imports.
fn imports(f: &SourceFile) -> (BTreeSet<String>, BTreeSet<String>) {
    static REEXPORTS: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();
    let reexports = REEXPORTS.get_or_init(root_reexports);
    let top: BTreeSet<String> = reached(&f.code, "crate")
        .into_iter()
        .map(|n| reexports.get(&n).cloned().unwrap_or(n))
        .collect();
    // `super::` from `a/b.rs` is `a`; from `a/mod.rs` (module [a]) it is the
    // crate root, i.e. a top-level module.
    let supers = reached(&f.code, "super");
    let mut siblings = BTreeSet::new();
    let mut top = top;
    match f.module.len() {
        0 => {}
        1 => top.extend(supers),
        _ => siblings.extend(supers),
    }
    (top, siblings)
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

#[test]
fn the_service_imports_only_lower_layers() {
    let files = service_files();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for f in &files {
        let Some(module) = f.module.first() else {
            continue; // lib.rs declares the modules
        };
        if ["main", "cli"].contains(&module.as_str()) {
            continue;
        }
        let Some(layer) = layer_of(module) else {
            wrong.push(format!(
                "{} is not in a layer: add `{module}` to LAYERS here and to ARCHITECTURE.md",
                f.path
            ));
            continue;
        };
        for to in imports(f).0 {
            if &to == module || to == "self" {
                continue;
            }
            edges.entry(module.clone()).or_default().insert(to.clone());
            match layer_of(&to) {
                Some(l) if l < layer => {}
                _ => wrong.push(format!(
                    "{} ({module}, layer {layer}) imports {to} ({})",
                    f.path,
                    layer_of(&to).map_or("not a layer".to_string(), |l| format!("layer {l}"))
                )),
            }
        }
    }
    println!("layers, bottom up:");
    for (i, l) in LAYERS.iter().enumerate() {
        println!("  {i}: {}", l.join(", "));
    }
    println!("imports:");
    for (from, to) in &edges {
        println!(
            "  {from} -> {}",
            to.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// The names `mod.rs` re-exports from its files (`pub use session::{Session,
/// …}`): name → the file it comes from. A file reaching `super::Session`
/// reaches `session.rs`, not `mod.rs`.
fn reexports_of(mod_code: &str, files: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for stmt in mod_code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        if !files.contains(module.trim()) {
            continue;
        }
        for item in items.trim_matches(['{', '}', ' ', '\n']).split(',') {
            let name = item.rsplit(" as ").next().unwrap().trim();
            if !name.is_empty() && name != "self" {
                names.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    names
}

/// The files of `mod.rs`'s own code it reaches (`conn::PgConn`,
/// `self::conn::…`), leaving out its declarations and its re-exports
/// (`pub use`: a facade, not a use).
fn reached_from_mod(mod_code: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let own: String = mod_code
        .split_inclusive(';')
        .filter(|stmt| {
            let t = stmt.trim_start();
            !(t.starts_with("pub use ")
                || t.starts_with("pub mod ")
                || t.starts_with("mod ")
                || t.starts_with("pub(crate) mod ")
                || t.starts_with("#[doc(hidden)]\npub mod "))
        })
        .collect();
    let b = own.as_bytes();
    let mut found = BTreeSet::new();
    for f in files {
        let pat = format!("{f}::");
        let mut at = 0;
        while let Some(p) = own[at..].find(&pat) {
            let start = at + p;
            at = start + pat.len();
            let before = &own[..start];
            let bare = start == 0
                || !(b[start - 1].is_ascii_alphanumeric()
                    || b[start - 1] == b'_'
                    || b[start - 1] == b':');
            if bare || before.ends_with("self::") {
                found.insert(f.clone());
            }
        }
    }
    found
}

/// Each module's files (`mod.rs` included) and the files each reaches:
/// parent → (file → files).
fn file_graphs() -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let files = service_files();
    let mut by_parent: BTreeMap<Vec<String>, Vec<&SourceFile>> = BTreeMap::new();
    for f in &files {
        let is_mod = f.path.ends_with("/mod.rs");
        let parent = if is_mod {
            f.module.clone()
        } else if f.module.len() >= 2 {
            f.module[..f.module.len() - 1].to_vec()
        } else {
            continue;
        };
        by_parent.entry(parent).or_default().push(f);
    }
    let mut graphs = BTreeMap::new();
    for (parent, members) in by_parent {
        let names: BTreeSet<String> = members
            .iter()
            .filter(|f| !f.path.ends_with("/mod.rs"))
            .map(|f| f.module.last().unwrap().clone())
            .collect();
        let mod_file = members.iter().find(|f| f.path.ends_with("/mod.rs"));
        let reexports = mod_file
            .map(|m| reexports_of(&m.code, &names))
            .unwrap_or_default();
        let resolve = |n: String| -> String {
            if names.contains(&n) {
                n
            } else {
                reexports.get(&n).cloned().unwrap_or_else(|| "mod".into())
            }
        };
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &members {
            if f.path.ends_with("/mod.rs") {
                g.insert("mod".into(), reached_from_mod(&f.code, &names));
                continue;
            }
            let me = f.module.last().unwrap().clone();
            // `super::x` and `crate::<parent>::x` both name the parent;
            // `super::super::x` names the parent's parent, outside.
            let code = f.code.replace("super::super", "grandparent");
            let mut reach = reached(&code, "super");
            reach.extend(reached(&code, &format!("crate::{}", parent.join("::"))));
            let to: BTreeSet<String> = reach
                .into_iter()
                .map(&resolve)
                .filter(|t| *t != me && (t != "mod" || mod_file.is_some()))
                .collect();
            g.insert(me, to);
        }
        graphs.insert(parent, g);
    }
    graphs
}

/// The layer table of ARCHITECTURE.md ("The house"): each row's modules.
fn documented_layers() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut layers = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        // `| N | modules | must not import |`
        if cells.len() < 4 || cells[1].parse::<usize>().is_err() {
            continue;
        }
        let names: Vec<String> = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        layers.push(names);
    }
    layers
}

#[test]
fn the_layers_here_are_the_layers_architecture_md_shows() {
    let here: Vec<Vec<String>> = LAYERS
        .iter()
        .map(|l| l.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(
        documented_layers(),
        here,
        "ARCHITECTURE.md's layer table and LAYERS in tests/house.rs differ"
    );
}

/// Every path ARCHITECTURE.md names in backquotes (`src/control/`,
/// `src/bmdb/boot.rs`, `scripts/vm-bmc`) exists; a bare file name
/// (`registry.rs`) names a file somewhere in the tree.
#[test]
fn every_path_architecture_md_names_exists() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let tops = [
        "src/",
        "proto/",
        "agent/",
        "sim/",
        "tests/",
        "benches/",
        "scripts/",
        "config/",
        "migrations/",
        "examples/",
        "docs/",
        ".ci/",
    ];
    let mut files: BTreeSet<String> = BTreeSet::new();
    let mut all = Vec::new();
    for dir in [
        "src", "proto", "agent", "sim", "tests", "benches", "examples",
    ] {
        rust_files(&root.join(dir), &mut all);
    }
    for f in &all {
        files.insert(f.file_name().unwrap().to_string_lossy().into_owned());
    }
    for dir in [
        "migrations",
        "scripts",
        "config",
        "proto",
        "tests/sdk",
        "tests/browser",
    ] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            for e in rd.flatten() {
                files.insert(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let mut missing = Vec::new();
    let mut named = 0;
    for quoted in text.split('`').skip(1).step_by(2) {
        let q = quoted.trim();
        if q.contains(' ') || q.contains('*') || q.contains('{') || q.contains('<') {
            continue;
        }
        if tops.iter().any(|t| q.starts_with(t)) {
            named += 1;
            if !root.join(q).exists() {
                missing.push(q.to_string());
            }
        } else if q.ends_with(".rs") && !q.contains("::") {
            named += 1;
            let name = q.rsplit('/').next().unwrap();
            if !files.contains(name) {
                missing.push(q.to_string());
            }
        }
    }
    assert!(named > 50, "only {named} paths found in ARCHITECTURE.md");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

// Every name ARCHITECTURE.md writes in backquotes exists, each by its kind:
// a path (`src/control/leases.rs`), a Rust item (`bmdb::Session::lease`,
// `Supervisor`), a SQL name (`work`, `machine_summary`), a configuration
// key (`netboot.uefi`), a metric (`shepherd_loop_up`), a package or
// binary (`fleet-sim`), a command (`shepherd machines install`). What no
// rule can check (`cargo tree`, `"erase"`, `0600`) is skipped by a rule
// of its own, and `--nocapture` lists it.

/// Declaration keywords: `fn name`, `struct Name`, `macro_rules! name`.
const DECLARING: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "trait",
    "type",
    "const",
    "static",
    "mod",
    "union",
    "macro_rules",
];

/// What a path ends with (a span with none and no `/` is not a path).
const EXTENSIONS: &[&str] = &[
    ".rs", ".sql", ".toml", ".md", ".proto", ".sh", ".py", ".yml", ".yaml", ".json", ".service",
];

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_lower_ident(s: &str) -> bool {
    is_ident(s) && !s.chars().any(|c| c.is_ascii_uppercase())
}

fn ok_if(ok: bool, why: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why.to_string()) }
}

/// The names a file's code (comments and strings out) declares: after a
/// declaring keyword; an enum variant (a line `Name,`, `Name(…`,
/// `Name {…`); what a `pub use` brings in.
fn declarations(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        if !ident(b[i]) || (i > 0 && ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        let word = &code[start..i];
        if !DECLARING.contains(&word) {
            continue;
        }
        let mut j = i;
        if word == "macro_rules" && b.get(j) == Some(&b'!') {
            j += 1;
        }
        let space = j;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t' || b[j] == b'\n') {
            j += 1;
        }
        let name = j;
        while j < b.len() && ident(b[j]) {
            j += 1;
        }
        if name > space && j > name {
            names.insert(code[name..j].to_string());
        }
    }
    for line in code.lines() {
        let t = line.trim_start();
        if !t.starts_with(|c: char| c.is_ascii_uppercase()) {
            continue;
        }
        let end = t
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(t.len());
        let rest = &t[end..];
        if rest.is_empty() || rest.starts_with([',', '(', '{']) || rest.starts_with(" {") {
            names.insert(t[..end].to_string());
        }
    }
    for prefix in ["pub use ", "pub(crate) use "] {
        for (at, _) in code.match_indices(prefix) {
            if at > 0 && ident(b[at - 1]) {
                continue;
            }
            let from = at + prefix.len();
            let to = code[from..].find(';').map_or(code.len(), |e| from + e);
            let rest = &code[from..to];
            let r = rest.as_bytes();
            let mut k = 0;
            while k < r.len() {
                if !ident(r[k]) || (k > 0 && ident(r[k - 1])) {
                    k += 1;
                    continue;
                }
                let start = k;
                while k < r.len() && ident(r[k]) {
                    k += 1;
                }
                // `a::b::{C, d}`: C and d, not the modules on the way.
                if !rest[k..].starts_with("::") {
                    names.insert(rest[start..k].to_string());
                }
            }
        }
    }
    names
}

/// The next word after `words[i]`, past `IF NOT EXISTS` and `ONLY`.
fn sql_word_after<'a>(words: &[&'a str], i: usize) -> &'a str {
    let mut j = i + 1;
    while j < words.len() && ["IF", "NOT", "EXISTS", "ONLY"].contains(&words[j]) {
        j += 1;
    }
    words.get(j).copied().unwrap_or("")
}

/// The schema's names (tables, views, indexes, types, triggers,
/// functions, columns) and each table's columns, from the migrations.
fn sql_schema(sql: &str) -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    let text: Vec<&str> = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect();
    let text = text.join("\n");
    let mut names = BTreeSet::new();
    let mut columns: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for stmt in text.split(';') {
        let words: Vec<&str> = stmt
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        for (i, w) in words.iter().enumerate() {
            let named = [
                "TABLE", "VIEW", "INDEX", "TYPE", "TRIGGER", "FUNCTION", "COLUMN",
            ];
            if named.contains(w) && (i == 0 || words[i - 1] != "DROP") {
                let name = sql_word_after(&words, i);
                if is_lower_ident(name) {
                    names.insert(name.to_string());
                }
            }
        }
        if words.len() >= 3 && words[0] == "CREATE" && words[1] == "TABLE" {
            // One column a line, each line's first word.
            let table = sql_word_after(&words, 1).to_string();
            let cols = columns.entry(table).or_default();
            for line in stmt.trim().lines().skip(1) {
                if let Some(first) = line.split_whitespace().next() {
                    let c = first.trim_matches('"');
                    if is_lower_ident(c) {
                        cols.insert(c.to_string());
                    }
                }
            }
        }
        if words.len() >= 3 && words[0] == "ALTER" && words[1] == "TABLE" {
            let table = sql_word_after(&words, 1).to_string();
            for (i, w) in words.iter().enumerate().skip(1) {
                if *w == "COLUMN" && words[i - 1] == "ADD" {
                    let c = sql_word_after(&words, i);
                    if is_lower_ident(c) {
                        columns
                            .entry(table.clone())
                            .or_default()
                            .insert(c.to_string());
                    }
                }
            }
        }
    }
    for cols in columns.values() {
        names.extend(cols.iter().cloned());
    }
    (names, columns)
}

/// config/shepherd.toml's sections and keys, commented out or not:
/// `netboot`, `uefi`, `netboot.uefi`.
fn config_keys(lines: &[String]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut section = String::new();
    for l in lines {
        if l.starts_with('[') {
            section = l.trim_matches(['[', ']', ' ']).to_string();
            keys.insert(section.clone());
        } else if let Some((k, _)) = l.split_once('=') {
            let k = k.trim();
            if is_lower_ident(k) {
                keys.insert(k.to_string());
                if !section.is_empty() {
                    keys.insert(format!("{section}.{k}"));
                }
            }
        }
    }
    keys
}

/// Each backquoted span of a Markdown text with its line, fenced blocks
/// left out; `None` for a backquote left open on its line.
fn md_spans(text: &str) -> Vec<(usize, Option<String>)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        let mut closed = parts.len();
        if parts.len().is_multiple_of(2) {
            out.push((i + 1, None));
            closed -= 1;
        }
        for part in parts.iter().take(closed).skip(1).step_by(2) {
            out.push((i + 1, Some(part.to_string())));
        }
    }
    out
}

/// Why a span is no name to check, if it is none.
fn skip_reason(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("empty");
    }
    if s.contains(char::is_whitespace) && !s.starts_with("shepherd ") {
        return Some("words: a command line or prose");
    }
    if s.contains(['"', '\'', '=']) || s == "true" || s == "false" {
        return Some("a literal value");
    }
    if s.starts_with('-') {
        return Some("an option");
    }
    if s.starts_with('/') {
        return Some("an absolute path, or a URL's");
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        return Some("a number or an address");
    }
    if s.contains('*') || s.contains('…') {
        return Some("a pattern");
    }
    if s.starts_with('.') && !s.contains('/') {
        return Some("a file name's extension");
    }
    None
}

/// `take_over()` → `take_over`, `in_hand!` → `in_hand`, `Work<T>` → `Work`.
fn normalize(s: &str) -> String {
    let mut s = s.strip_suffix("()").unwrap_or(s);
    s = s.strip_suffix('!').unwrap_or(s);
    if s.ends_with('>')
        && let Some(i) = s.find('<')
    {
        s = &s[..i];
    }
    s.to_string()
}

/// `check-config` → `CheckConfig`.
fn camel(kebab: &str) -> String {
    let mut out = String::new();
    for part in kebab.split('-') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.push_str(chars.as_str());
        }
    }
    out
}

/// The file of module `seg` under `dir` (`seg.rs` or `seg/mod.rs`), and
/// the directory of its own modules.
fn module_file(dir: &Path, seg: &str) -> Option<(PathBuf, PathBuf)> {
    let flat = dir.join(format!("{seg}.rs"));
    let nested = dir.join(seg).join("mod.rs");
    let file = if flat.is_file() {
        flat
    } else if nested.is_file() {
        nested
    } else {
        return None;
    };
    Some((file, dir.join(seg)))
}

/// The tree as the names' check reads it.
struct Tree {
    root: PathBuf,
    /// Every Rust file of the four crates, and the names it declares.
    decls: BTreeMap<PathBuf, BTreeSet<String>>,
    /// Their code, comments and strings out.
    code: BTreeMap<PathBuf, String>,
    /// Their text as written (for string literals), and lower-cased.
    sources: String,
    sources_lower: String,
    /// The service's text as written (metric names).
    service: String,
    protos: String,
    sql: String,
    sql_names: BTreeSet<String>,
    sql_columns: BTreeMap<String, BTreeSet<String>>,
    /// config/shepherd.toml's lines, trimmed, a comment's `#` off.
    toml_lines: Vec<String>,
    config_keys: BTreeSet<String>,
    /// The workspace's Cargo.toml files.
    manifests: String,
}

impl Tree {
    fn load(root: &Path) -> Tree {
        let mut files = Vec::new();
        for dir in ["src", "proto/src", "agent/src", "sim/src"] {
            rust_files(&root.join(dir), &mut files);
        }
        let mut decls = BTreeMap::new();
        let mut code = BTreeMap::new();
        let mut sources = String::new();
        let mut service = String::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let c = code_only(&text);
            decls.insert(f.clone(), declarations(&c));
            if f.starts_with(root.join("src")) {
                service.push_str(&text);
            }
            sources.push_str(&text);
            code.insert(f, c);
        }
        let texts = |dir: &str, ext: &str| -> String {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == ext))
                .collect();
            paths.sort();
            let all: Vec<String> = paths
                .iter()
                .map(|p| std::fs::read_to_string(p).unwrap())
                .collect();
            all.join("\n")
        };
        let protos = texts("proto", "proto");
        let sql = texts("migrations", "sql");
        let (sql_names, sql_columns) = sql_schema(&sql);
        let toml_lines: Vec<String> = std::fs::read_to_string(root.join("config/shepherd.toml"))
            .unwrap()
            .lines()
            .map(|l| l.trim().trim_start_matches('#').trim().to_string())
            .collect();
        let config_keys = config_keys(&toml_lines);
        let manifests: Vec<String> = [
            "Cargo.toml",
            "proto/Cargo.toml",
            "agent/Cargo.toml",
            "sim/Cargo.toml",
        ]
        .iter()
        .filter_map(|m| std::fs::read_to_string(root.join(m)).ok())
        .collect();
        let sources_lower = sources.to_lowercase();
        Tree {
            root: root.to_path_buf(),
            decls,
            code,
            sources,
            sources_lower,
            service,
            protos,
            sql,
            sql_names,
            sql_columns,
            toml_lines,
            config_keys,
            manifests: manifests.join("\n"),
        }
    }

    fn rel(&self, f: &Path) -> String {
        f.strip_prefix(&self.root)
            .unwrap_or(f)
            .display()
            .to_string()
    }

    /// The files that declare `name`.
    fn declared_anywhere(&self, name: &str) -> Vec<&PathBuf> {
        self.decls
            .iter()
            .filter(|(_, d)| d.contains(name))
            .map(|(f, _)| f)
            .collect()
    }

    /// A `message`, `enum`, `service` or `rpc` of the .proto files.
    fn proto_declares(&self, name: &str) -> bool {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        ["message", "enum", "service", "rpc"].iter().any(|kw| {
            let pat = format!("{kw} {name}");
            self.protos.match_indices(&pat).any(|(at, _)| {
                let before = self.protos[..at].chars().next_back();
                let after = self.protos[at + pat.len()..].chars().next();
                before.is_none_or(|c| !ident(c)) && after.is_none_or(|c| !ident(c))
            })
        })
    }

    /// What kind of name `s` is, and whether it exists.
    fn check(&self, s: &str) -> (&'static str, Result<(), String>) {
        if let Some(args) = s.strip_prefix("shepherd ") {
            return ("command", self.check_command(args));
        }
        if s.starts_with('[') {
            let found = self.toml_lines.iter().any(|l| l == s)
                || self.manifests.lines().any(|l| l.trim() == s);
            let why = "no such section in config/shepherd.toml or a Cargo.toml";
            return ("config", ok_if(found, why));
        }
        if !s.contains("::") && (s.contains('/') || EXTENSIONS.iter().any(|e| s.ends_with(e))) {
            let found = self.root.join(s).exists();
            return ("path", ok_if(found, "no such file or directory"));
        }
        if s.contains("::") {
            return ("rust", self.check_rust_path(s));
        }
        if s.contains('.') && s.split('.').all(is_lower_ident) {
            let parts: Vec<&str> = s.split('.').collect();
            if parts.len() == 2
                && let Some(cols) = self.sql_columns.get(parts[0])
            {
                let why = "no such column of that table in migrations/";
                return ("sql", ok_if(cols.contains(parts[1]), why));
            }
            let why = "no such key in config/shepherd.toml";
            return ("config", ok_if(self.config_keys.contains(s), why));
        }
        if s.starts_with("shepherd_") && is_lower_ident(s) {
            let quoted = |n: &str| self.service.contains(&format!("\"{n}\""));
            // Counters get `_total`, and series registered with a unit its
            // name (`Unit::Seconds`: `_seconds`) when encoded.
            let found = quoted(s)
                || ["_total", "_seconds", "_bytes"]
                    .iter()
                    .any(|x| s.strip_suffix(x).is_some_and(quoted));
            return ("metric", ok_if(found, "no metric of that name in src/"));
        }
        if s.contains('-') && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            let found = self.manifests.contains(&format!("name = \"{s}\""))
                || self
                    .sources_lower
                    .contains(&format!("\"{}\"", s.to_lowercase()))
                || self.sql.contains(&format!("'{s}'"))
                || !self.declared_anywhere(&camel(s)).is_empty();
            let why = "no package, binary, string or variant of that name";
            return ("name", ok_if(found, why));
        }
        if is_ident(s) && s.starts_with(|c: char| c.is_ascii_uppercase()) {
            let upper = s.len() > 1 && !s.chars().any(|c| c.is_ascii_lowercase());
            let found = !self.declared_anywhere(s).is_empty()
                || self.proto_declares(s)
                || self.sql.contains(&format!("'{s}'"))
                || (upper && self.sources.contains(&format!("\"{s}\"")));
            return ("rust", ok_if(found, "declared in no .rs or .proto file"));
        }
        if is_lower_ident(s) {
            if module_file(&self.root.join("src"), s).is_some() {
                return ("rust", Ok(()));
            }
            if self.manifests.contains(&format!("name = \"{s}\"")) {
                return ("name", Ok(()));
            }
            if self.sql_names.contains(s) || self.sql.contains(&format!("'{s}'")) {
                return ("sql", Ok(()));
            }
            if self.config_keys.contains(s) {
                return ("config", Ok(()));
            }
            let why = "no module, SQL name, configuration key or Rust item of that name";
            return ("rust", ok_if(!self.declared_anywhere(s).is_empty(), why));
        }
        let why = "not a name this test knows how to check: write it so that it can be";
        ("unknown", Err(why.to_string()))
    }

    /// `shepherd machines install`: each word a command of src/main.rs
    /// or src/cli/ (`Machines(…)`, `Install(…)`), up to the first that
    /// is not one (`ID`, `--config`).
    fn check_command(&self, args: &str) -> Result<(), String> {
        let main = self.root.join("src/main.rs");
        let cli_dir = self.root.join("src/cli");
        let mut commands = BTreeSet::new();
        for (f, d) in &self.decls {
            if *f == main || f.starts_with(&cli_dir) {
                commands.extend(d.iter().cloned());
            }
        }
        let mut checked = 0;
        for w in args.split_whitespace() {
            if !w.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
                break;
            }
            if !commands.contains(&camel(w)) {
                return Err(format!("no command `{w}` in src/main.rs or src/cli/"));
            }
            checked += 1;
        }
        ok_if(checked > 0, "names no command")
    }

    /// `bmdb::Session::lease`, `shepherd_proto::takeover::check_reply`,
    /// `Outcome::GiveBack`: the modules as files, then the first item
    /// declared in the last module's file and the last one in it or in
    /// its module's files; a path that starts with a type
    /// (`Registration::lease`), the member beside the type.
    fn check_rust_path(&self, s: &str) -> Result<(), String> {
        let mut segs: Vec<&str> = s.split("::").collect();
        let krate = match segs[0] {
            "crate" | "shepherd" => Some("src"),
            "shepherd_proto" => Some("proto/src"),
            "shepherd_agent" => Some("agent/src"),
            "shepherd_sim" => Some("sim/src"),
            _ => None,
        };
        if krate.is_some() {
            segs.remove(0);
        }
        if segs.is_empty() || !segs.iter().copied().all(is_ident) {
            return Err("not a Rust path".to_string());
        }
        let mut dir = self.root.join(krate.unwrap_or("src"));
        let mut file = dir.join("lib.rs");
        let mut consumed = 0;
        while consumed < segs.len() {
            match module_file(&dir, segs[consumed]) {
                Some((f, d)) => {
                    file = f;
                    dir = d;
                    consumed += 1;
                }
                None => break,
            }
        }
        if consumed == segs.len() {
            return Ok(());
        }
        let first = segs[consumed];
        let last = segs[segs.len() - 1];
        if consumed == 0 && krate.is_none() {
            if !first.starts_with(|c: char| c.is_ascii_uppercase()) {
                return Err(format!("no module src/{first}.rs or src/{first}/mod.rs"));
            }
            let owners = self.declared_anywhere(first);
            if owners.is_empty() {
                return Err(format!("`{first}` is declared nowhere"));
            }
            let beside = owners.iter().any(|o| {
                self.decls
                    .iter()
                    .any(|(f, d)| f.parent() == o.parent() && d.contains(last))
            });
            return ok_if(beside, &format!("`{last}` is declared beside no `{first}`"));
        }
        let declared_here = self.decls.get(&file).is_some_and(|d| d.contains(first));
        if !declared_here {
            return Err(format!("`{first}` is not declared in {}", self.rel(&file)));
        }
        if consumed + 1 == segs.len() {
            return Ok(());
        }
        let in_module = self
            .decls
            .iter()
            .any(|(f, d)| (*f == file || f.starts_with(&dir)) && d.contains(last));
        // `shepherd_proto::api::TakeoverInit`: generated from a .proto.
        let generated = self
            .code
            .get(&file)
            .is_some_and(|c| c.contains(&format!("mod {first} {{")))
            && self.proto_declares(last);
        let why = format!(
            "`{last}` is not declared in {} or its module's files",
            self.rel(&file)
        );
        ok_if(in_module || generated, &why)
    }
}

#[test]
fn every_item_architecture_md_names_exists() {
    let tree = Tree::load(&root());
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    let mut skipped = Vec::new();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (line, span) in md_spans(&text) {
        let Some(raw) = span else {
            missing.push(format!("ARCHITECTURE.md:{line}: a backquote left open"));
            continue;
        };
        let s = raw.trim();
        if let Some(why) = skip_reason(s) {
            skipped.push(format!("`{s}` ({why})"));
            continue;
        }
        let (kind, found) = tree.check(&normalize(s));
        *kinds.entry(kind).or_default() += 1;
        if let Err(why) = found {
            missing.push(format!("ARCHITECTURE.md:{line}: `{raw}`: {why}"));
        }
    }
    let checked: usize = kinds
        .iter()
        .filter(|(k, _)| **k != "unknown")
        .map(|(_, n)| n)
        .sum();
    let by_kind: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "ARCHITECTURE.md: {checked} names in backquotes checked ({}), {} skipped:",
        by_kind.join(", "),
        skipped.len()
    );
    for s in &skipped {
        println!("  {s}");
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        missing.join("\n")
    );
    assert!(checked > 100, "only {checked} names checked");
    let rust = kinds.get("rust").copied().unwrap_or(0);
    assert!(rust > 40, "only {rust} Rust items checked");
}

#[test]
fn the_names_check_reads_them_as_written() {
    // Declarations, and what only looks like one.
    let d = declarations(&code_only(
        "pub type InitializerWorker = Worker<Initializer>;\n\
         pub enum Outcome {\n    Finished(R),\n    Failed { cause: String },\n    GiveBack(String),\n}\n\
         pub use leases::{LeaseLoop, wait_until};\n\
         macro_rules! in_hand { () => {} }\n\
         fn run() { loop {} }\n\
         // fn commented() {}\n\
         const S: &str = \"fn quoted\";\n",
    ));
    for n in [
        "InitializerWorker",
        "Outcome",
        "Finished",
        "Failed",
        "GiveBack",
        "LeaseLoop",
        "wait_until",
        "in_hand",
        "run",
        "S",
    ] {
        assert!(d.contains(n), "{n} is declared: {d:?}");
    }
    for n in ["Initializer", "leases", "loop", "commented", "quoted"] {
        assert!(!d.contains(n), "{n} is not declared: {d:?}");
    }
    // The schema: names, and each table's columns; comments are not schema.
    let (names, columns) = sql_schema(
        "CREATE TABLE work (\n    machine_id uuid NOT NULL,\n    \"timestamp\" timestamptz,\n    \
         UNIQUE (machine_id)\n);\n-- CREATE TABLE gone (x int);\n\
         ALTER TABLE work ADD COLUMN detail text;\n\
         CREATE UNIQUE INDEX work_one ON work (machine_id);\n",
    );
    assert!(names.contains("work") && names.contains("work_one") && !names.contains("gone"));
    let work: Vec<&str> = columns["work"].iter().map(String::as_str).collect();
    assert_eq!(work, ["detail", "machine_id", "timestamp"]);
    // Spans: not in a fenced block; one left open is found.
    let spans = md_spans("a `x` b\n```\n`inside`\n```\n`open\n");
    assert_eq!(spans, [(1, Some("x".to_string())), (5, None)]);
    // Skipped by a rule, or checked.
    for s in [
        "cargo tree",
        "\"erase\"",
        "0600",
        "true",
        "/metrics",
        "machine_*",
    ] {
        assert!(skip_reason(s).is_some(), "{s} is skipped");
    }
    for s in [
        "shepherd run",
        "src/control/",
        "bmdb::Work",
        "fleet-sim",
        "netboot.uefi",
    ] {
        assert!(skip_reason(s).is_none(), "{s} is checked");
    }
    assert_eq!(normalize("WorkMailbox<L>"), "WorkMailbox");
    assert_eq!(normalize("take_over()"), "take_over");
    assert_eq!(camel("check-config"), "CheckConfig");
}

#[test]
fn the_files_of_a_module_form_no_circle() {
    let mut circles = Vec::new();
    println!("files of a module and the files they import (mod: mod.rs's own code):");
    for (parent, g) in &file_graphs() {
        println!("  src/{}/", parent.join("/"));
        for (from, to) in g {
            if !to.is_empty() {
                println!(
                    "    {from} -> {}",
                    to.iter().cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        // Depth-first search for a back edge among the files present.
        fn visit(
            n: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<String>,
            done: &mut BTreeSet<String>,
            circles: &mut Vec<String>,
        ) {
            if let Some(i) = path.iter().position(|p| p == n) {
                circles.push(format!("{} -> {n}", path[i..].join(" -> ")));
                return;
            }
            if !done.insert(n.to_string()) {
                return;
            }
            path.push(n.to_string());
            for m in g
                .get(n)
                .into_iter()
                .flatten()
                .filter(|m| g.contains_key(*m))
            {
                visit(m, g, path, done, circles);
            }
            path.pop();
        }
        let mut found = Vec::new();
        let mut done = BTreeSet::new();
        for n in g.keys() {
            visit(n, g, &mut Vec::new(), &mut done, &mut found);
        }
        for c in found {
            circles.push(format!("src/{}/: {c}", parent.join("/")));
        }
    }
    assert!(
        circles.is_empty(),
        "files importing each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn nothing_in_the_service_reaches_the_simulated_floor_or_the_agent() {
    // The binary's files (main.rs, cli/) included: the demo is the
    // simulated floor's own binary.
    let mut wrong = Vec::new();
    for f in service_files() {
        // A unit test may use the agent's crate (a dev-dependency).
        let code = match f.code.find("#[cfg(test)]") {
            Some(i) => &f.code[..i],
            None => &f.code,
        };
        for other in ["shepherd_sim", "shepherd_agent"] {
            if code.contains(&format!("{other}::")) || code.contains(&format!("use {other}")) {
                wrong.push(format!("{} uses {other}", f.path));
            }
        }
        if f.module.first().is_some_and(|m| m == "bmdb")
            && !reached(code, "crate").is_subset(
                &["backoff", "config", "bmdb", "mac", "fault"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            )
        {
            wrong.push(format!(
                "{} (bmdb) imports {:?}: bmdb depends on config, backoff, mac and fault only",
                f.path,
                reached(code, "crate")
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The crates a normal build of `packages` links (procedural macros, run at
/// build time, left out), and each one's enabled features.
fn normal_tree(packages: &[&str]) -> BTreeMap<String, String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["tree", "--offline", "--locked"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let out = cmd
        .args(["-e", "normal,no-proc-macro", "--prefix", "none"])
        .args(["--format", "{p}|{f}"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (p, f) = l.split_once('|')?;
            Some((p.split_whitespace().next()?.to_string(), f.to_string()))
        })
        .collect()
}

#[test]
fn the_service_links_no_simulator_and_no_disk_writer() {
    // `cargo tree -e normal -p shepherd`: what the service links.
    let crates = normal_tree(&["shepherd"]);
    println!(
        "the service's crates ({}): {:?}",
        crates.len(),
        crates.keys().collect::<Vec<_>>()
    );
    assert!(crates.contains_key("shepherd-proto"), "{crates:?}");
    // The agent's program and its disk writer (zstd and xz decompressors;
    // flate2 is here for SSH's compression, through russh), the simulated
    // floor and its test support.
    let bad: Vec<&str> = [
        "shepherd-agent",
        "shepherd-sim",
        "zstd",
        "zstd-sys",
        "liblzma",
        "liblzma-sys",
    ]
    .into_iter()
    .filter(|c| crates.contains_key(*c))
    .collect();
    assert!(bad.is_empty(), "the service links {bad:?}");
}

#[test]
fn the_agents_fault_modes_are_absent_from_what_ships() {
    // What scripts/package and the container build: shepherd and the agent,
    // their normal dependencies only.
    let shipped = normal_tree(&["shepherd", "shepherd-agent"]);
    let agent = shipped.get("shepherd-agent").expect("the agent is built");
    println!("the shipped agent's features: {agent:?}");
    assert!(!agent.contains("faults"), "features {agent}");
    // The tests' agent has them (else the takeover tests test nothing).
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(r#"shepherd-agent = { path = "agent", features = ["faults"] }"#),
        "the tests' agent is built with its fault modes"
    );
    // And the program reads a mode only in a build with them.
    let program = std::fs::read_to_string(root().join("agent/src/program.rs")).unwrap();
    let modes = [
        "\"garbage\" =>",
        "\"hang\" =>",
        "\"crash\" =>",
        "\"short-key\" =>",
    ];
    for m in modes {
        let at = program
            .find(m)
            .unwrap_or_else(|| panic!("{m} in program.rs"));
        let before = program[..at].trim_end();
        assert!(
            before.ends_with("#[cfg(feature = \"faults\")]"),
            "{m} is not behind the faults feature"
        );
    }
}

#[test]
fn the_agent_crate_is_written_against_no_service_module() {
    let src = root().join("agent/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() >= 5, "agent/src: {files:?}");
    let mut wrong = Vec::new();
    for f in files {
        let code = code_only(&std::fs::read_to_string(&f).unwrap());
        let reach = reached(&code, "shepherd");
        if !reach.is_empty() {
            wrong.push(format!("{}: shepherd::{reach:?}", f.display()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_agent_links_nothing_of_the_service() {
    // Every crate the agent links, at any depth, as cargo resolves it
    // (normal dependencies but procedural macros, which run at build time).
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "shepherd-agent",
            "-e",
            "normal,no-proc-macro",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains("shepherd-agent") && crates.contains("tonic"),
        "{tree}"
    );
    let bad: Vec<&&str> = NOT_FOR_THE_AGENT
        .iter()
        .filter(|c| crates.contains(**c))
        .collect();
    println!("the agent's crates ({}): {crates:?}", crates.len());
    assert!(bad.is_empty(), "the agent depends on {bad:?}");
}

#[test]
fn the_reader_sees_imports_as_the_compiler_does() {
    // The checks above read the source; make sure they read it right.
    let code = code_only(
        "use crate::{a, b::{c, d}, e::f};\n// crate::comment\nlet s = \"crate::string\";\n\
         let r = r#\"crate::raw \"quoted\"\"#; let c = '\"'; fn x<'a>(_: &'a str) {}\n\
         super::g::h(); crate::i::j(); my_crate::k();",
    );
    let top: Vec<String> = reached(&code, "crate").into_iter().collect();
    assert_eq!(top, ["a", "b", "e", "i"]);
    let sup: Vec<String> = reached(&code, "super").into_iter().collect();
    assert_eq!(sup, ["g"]);
}
