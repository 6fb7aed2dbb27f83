//! The volumes inside a volume, where a metadata erasure can find them: an
//! md member's array data (where its superblock says, in every format) and
//! an LVM physical volume's logical volumes (where its metadata text puts
//! their extents). What is inside them has signatures of its own (a
//! filesystem, a LUKS header, another PV), which the next system finds
//! again once it assembles the same array or volume group; so each is
//! erased at both ends and probed, like a partition.
//!
//! Lenient on purpose: checksums are not checked, what cannot be read or
//! parsed yields nothing, and nothing here fails an erasure.

use std::fs::File;

use super::signatures::{md_0_90, md_1_0};
use crate::install::partitions::{read_at, u32_at, u64_at};

/// A volume inside another: its byte range on the disk, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inner {
    pub start: u64,
    pub end: u64,
    pub what: String,
}

/// md's magic, little-endian as every 1.x superblock (and 0.90's on x86).
const MD_MAGIC: u32 = 0xa92b_4efc;
/// The most metadata text read from an LVM metadata area.
const MAX_TEXT: u64 = 16 << 20;
/// How deep the metadata text may nest its sections.
const MAX_DEPTH: usize = 16;

/// The volumes inside `[start, end)`: an md member's data, a PV's LVs.
pub fn inner(file: &File, start: u64, end: u64) -> Vec<Inner> {
    let mut out = md(file, start, end);
    out.extend(lvm(file, start, end));
    out.retain(|i| i.start < i.end && (i.start, i.end) != (start, end));
    out
}

/// An md member's array data: from 1.x's `data_offset` for `data_size`
/// sectors (1.1 at the start, 1.2 4 KiB in, 1.0 at the end), or 0.90's
/// `size` KiB from the start.
fn md(file: &File, start: u64, end: u64) -> Vec<Inner> {
    let len = end.saturating_sub(start);
    let mut out = Vec::new();
    let one = [("1.1", Some(0)), ("1.2", Some(4096)), ("1.0", md_1_0(len))];
    for (version, at) in one {
        let Some(at) = at else { continue };
        let Ok(sb) = read_at(file, 256, start + at) else {
            continue;
        };
        if u32_at(&sb, 0) != MD_MAGIC || u32_at(&sb, 4) != 1 || u64_at(&sb, 144) != at / 512 {
            continue;
        }
        let (offset, size) = (u64_at(&sb, 128), u64_at(&sb, 136));
        let Some(s) = offset.checked_mul(512).and_then(|o| o.checked_add(start)) else {
            continue;
        };
        let e = size
            .checked_mul(512)
            .and_then(|n| n.checked_add(s))
            .map_or(end, |e| e.min(end));
        out.push(Inner {
            start: s,
            end: e,
            what: format!("md {version} array data"),
        });
    }
    if let Some(at) = md_0_90(len)
        && let Ok(sb) = read_at(file, 36, start + at)
        && u32_at(&sb, 0) == MD_MAGIC
        && u32_at(&sb, 4) == 0
    {
        let kib = u64::from(u32_at(&sb, 32));
        out.push(Inner {
            start,
            end: (start + kib * 1024).min(end),
            what: "md 0.90 array data".into(),
        });
    }
    out
}

/// An LVM physical volume's logical volumes' extents on it: its label (in
/// one of the first four sectors) names its metadata areas, whose text
/// puts each segment's stripes on physical volumes by extent.
fn lvm(file: &File, start: u64, end: u64) -> Vec<Inner> {
    let Some((uuid, areas)) = (0..4).find_map(|s| label(file, start, s)) else {
        return Vec::new();
    };
    let mut out: Vec<Inner> = Vec::new();
    for (offset, size) in areas {
        let Some(text) = metadata_text(file, start + offset, size) else {
            continue;
        };
        for (lv, s, n) in extents(&text, &uuid) {
            let (Some(s), Some(e)) = (start.checked_add(s), start.checked_add(s + n)) else {
                continue;
            };
            let i = Inner {
                start: s,
                end: e.min(end),
                what: format!("LVM logical volume {lv}"),
            };
            if !out.contains(&i) {
                out.push(i);
            }
        }
    }
    out
}

/// The PV's UUID (without dashes) and its metadata areas (offset, size
/// from the PV's start), from a label in `sector`.
fn label(file: &File, start: u64, sector: u64) -> Option<(String, Vec<(u64, u64)>)> {
    let b = read_at(file, 512, start + sector * 512).ok()?;
    if &b[..8] != b"LABELONE" || &b[24..32] != b"LVM2 001" || u64_at(&b, 8) != sector {
        return None;
    }
    let pv = u32_at(&b, 20) as usize;
    if pv > 512 - 40 {
        return None;
    }
    let uuid = String::from_utf8_lossy(&b[pv..pv + 32]).into_owned();
    // The data areas, then the metadata areas: (offset, size) pairs, each
    // list ended by a zero offset.
    let mut at = pv + 40;
    let mut lists = [Vec::new(), Vec::new()];
    for list in &mut lists {
        while at + 16 <= 512 {
            let (o, n) = (u64_at(&b, at), u64_at(&b, at + 8));
            at += 16;
            if o == 0 {
                break;
            }
            list.push((o, n));
        }
    }
    let [_, metadata] = lists;
    Some((uuid, metadata))
}

/// The committed metadata text of the area at `at` (its header's first
/// location, which may wrap past the area's end to just after the header).
fn metadata_text(file: &File, at: u64, size: u64) -> Option<String> {
    let h = read_at(file, 512, at).ok()?;
    if &h[4..20] != b" LVM2 x[5A%r0N*>" {
        return None;
    }
    let (offset, len) = (u64_at(&h, 40), u64_at(&h, 48));
    if len == 0 || len > MAX_TEXT.min(size) || offset >= size {
        return None;
    }
    let first = len.min(size - offset);
    let mut text = read_at(file, first as usize, at + offset).ok()?;
    if first < len {
        text.extend(read_at(file, (len - first) as usize, at + 512).ok()?);
    }
    while text.last() == Some(&0) {
        text.pop();
    }
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// A metadata text's values.
#[derive(Debug)]
enum Value {
    Num(u64),
    Str(String),
    List(Vec<Value>),
    Section(Vec<(String, Value)>),
}

impl Value {
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Section(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn num(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            Value::Num(n) => Some(*n),
            _ => None,
        }
    }

    fn sections(&self) -> impl Iterator<Item = (&str, &Value)> {
        let items: &[(String, Value)] = match self {
            Value::Section(items) => items,
            _ => &[],
        };
        items
            .iter()
            .filter(|(_, v)| matches!(v, Value::Section(_)))
            .map(|(k, v)| (k.as_str(), v))
    }
}

/// Each logical volume's extents on the PV `uuid`: (its name, the byte
/// offset on the PV, the length).
fn extents(text: &str, uuid: &str) -> Vec<(String, u64, u64)> {
    let root = Value::Section(
        Parser {
            b: text.as_bytes(),
            i: 0,
        }
        .body(0),
    );
    let mut out = Vec::new();
    for (vg_name, vg) in root.sections() {
        let Some(extent) = vg.num("extent_size").and_then(|n| n.checked_mul(512)) else {
            continue;
        };
        let Some((pv, pe_start)) = vg.get("physical_volumes").and_then(|pvs| {
            pvs.sections().find_map(|(name, pv)| match pv.get("id") {
                Some(Value::Str(id)) if id.replace('-', "") == uuid => {
                    Some((name, pv.num("pe_start")? * 512))
                }
                _ => None,
            })
        }) else {
            continue;
        };
        let Some(lvs) = vg.get("logical_volumes") else {
            continue;
        };
        for (lv_name, lv) in lvs.sections() {
            for (_, seg) in lv.sections() {
                let (Some(count), Some(Value::List(stripes))) =
                    (seg.num("extent_count"), seg.get("stripes"))
                else {
                    continue;
                };
                let per = count / seg.num("stripe_count").unwrap_or(1).max(1);
                for pair in stripes.chunks(2) {
                    if let [Value::Str(name), Value::Num(pe)] = pair
                        && name == pv
                        && let Some(s) =
                            pe.checked_mul(extent).and_then(|o| o.checked_add(pe_start))
                        && let Some(n) = per.checked_mul(extent)
                    {
                        out.push((format!("{vg_name}/{lv_name}"), s, n));
                    }
                }
            }
        }
    }
    out
}

/// LVM's metadata text (the `dm_config` syntax): `key = value`, `name {
/// … }`, lists in brackets, strings in quotes, comments from `#`.
struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&mut self) -> Option<u8> {
        loop {
            match self.b.get(self.i)? {
                c if c.is_ascii_whitespace() => self.i += 1,
                b'#' => {
                    while self.b.get(self.i).is_some_and(|c| *c != b'\n') {
                        self.i += 1;
                    }
                }
                c => return Some(*c),
            }
        }
    }

    fn word(&mut self) -> String {
        let s = self.i;
        while self
            .b
            .get(self.i)
            .is_some_and(|c| !c.is_ascii_whitespace() && !b"={}[],\"#".contains(c))
        {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.b[s..self.i]).into_owned()
    }

    fn body(&mut self, depth: usize) -> Vec<(String, Value)> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == b'}' {
                self.i += 1;
                break;
            }
            let key = self.word();
            if key.is_empty() {
                // Nothing this grammar knows: skip it.
                self.i += 1;
                continue;
            }
            match self.peek() {
                Some(b'{') if depth < MAX_DEPTH => {
                    self.i += 1;
                    let v = Value::Section(self.body(depth + 1));
                    items.push((key, v));
                }
                Some(b'=') => {
                    self.i += 1;
                    let v = self.value(depth);
                    items.push((key, v));
                }
                _ => break,
            }
        }
        items
    }

    fn value(&mut self, depth: usize) -> Value {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let mut s = Vec::new();
                while let Some(&c) = self.b.get(self.i) {
                    self.i += 1;
                    match c {
                        b'"' => break,
                        b'\\' => {
                            if let Some(&n) = self.b.get(self.i) {
                                s.push(n);
                                self.i += 1;
                            }
                        }
                        c => s.push(c),
                    }
                }
                Value::Str(String::from_utf8_lossy(&s).into_owned())
            }
            Some(b'[') if depth < MAX_DEPTH => {
                self.i += 1;
                let mut items = Vec::new();
                while let Some(c) = self.peek() {
                    match c {
                        b']' => {
                            self.i += 1;
                            break;
                        }
                        b',' => self.i += 1,
                        _ => {
                            let at = self.i;
                            items.push(self.value(depth + 1));
                            if self.i == at {
                                self.i += 1;
                            }
                        }
                    }
                }
                Value::List(items)
            }
            _ => {
                let w = self.word();
                w.parse().map(Value::Num).unwrap_or(Value::Str(w))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text `vgcreate` and `lvcreate` write (comments as a backup
    /// file has them), with a linear LV and a two-stripe LV.
    const TEXT: &str = r#"vg0 {
id = "Xw1Oqc-3cVd-ZRg6-2z8n-pQ2n-JbLZ-1fYlUV"
seqno = 3
extent_size = 8192	# 4 Megabytes
physical_volumes {
pv0 {
id = "AoOgMR-NlEv-rn9F-GduC-Zs1i-Z1li-z8lwaP"
device = "/dev/loop0"
pe_start = 2048
pe_count = 15
}
pv1 {
id = "BoOgMR-NlEv-rn9F-GduC-Zs1i-Z1li-z8lwaP"
pe_start = 2048
pe_count = 15
}
}
logical_volumes {
data {
id = "x"
segment_count = 1
segment1 {
start_extent = 0
extent_count = 2
type = "striped"
stripe_count = 1	# linear
stripes = [
"pv0", 3
]
}
}
wide {
segment1 {
extent_count = 4
type = "striped"
stripe_count = 2
stripe_size = 128
stripes = ["pv0", 5, "pv1", 0]
}
}
}
}
contents = "Text Format Volume Group"
"#;

    #[test]
    fn a_pvs_extents_are_read_from_the_metadata_text() {
        let mib = 1u64 << 20;
        assert_eq!(
            extents(TEXT, "AoOgMRNlEvrn9FGduCZs1iZ1liz8lwaP"),
            vec![
                ("vg0/data".to_string(), mib + 3 * 4 * mib, 8 * mib),
                ("vg0/wide".to_string(), mib + 5 * 4 * mib, 8 * mib),
            ]
        );
        assert!(extents(TEXT, "nobody").is_empty());
        assert!(extents("garbage { = [ \"", "x").is_empty());
    }
}
