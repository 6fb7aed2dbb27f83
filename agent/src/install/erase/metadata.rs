//! The metadata erasure: zeros wherever a next system looks for what the
//! last one left, and a probe afterwards that finds nothing.
//!
//! Where: both ends ([`END_SPAN`]) of every volume (the disk, each
//! partition its tables list, each volume inside those that `layers`
//! finds: an md member's array, a PV's logical volumes), LUKS2's second
//! header wherever its first says (`luks`), and every signature
//! `signatures` finds in a volume past its ends (VMFS 1 and 2 MiB in,
//! bcachefs' copy at 2 MiB, Promise's 1.5 MiB before the end). Then every
//! byte written is read back, and every volume is probed again with the
//! same rules: a signature left fails the erasure, naming it and its
//! offset.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::signatures;
use super::{Counters, END_SPAN, ErasedDisk, check_zero, drop_cache, layers, luks, partitions};
use crate::install::disk::Disk;

/// How deep volumes nest (a partition, its md array, a PV on it, its LVs).
const MAX_DEPTH: usize = 4;
/// The most volumes one disk is read for.
const MAX_VOLUMES: usize = 4096;
/// A found signature is erased with the blocks of this size around it.
const BLOCK: u64 = 4096;

/// A volume whose signatures an erasure removes: its byte range on the
/// disk, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub start: u64,
    pub end: u64,
    pub what: String,
}

/// The disk, its partitions, and the volumes nested in them, as far as
/// they can be found. Read before anything is erased.
pub fn volumes(file: &File, d: &Disk) -> Vec<Volume> {
    let size = d.size_bytes;
    let mut out = vec![Volume {
        start: 0,
        end: size,
        what: "the disk".into(),
    }];
    for (start, end) in partitions(file, d) {
        let (start, end) = (start.min(size), end.min(size));
        if start < end {
            out.push(Volume {
                start,
                end,
                what: format!("the partition at byte {start}"),
            });
        }
    }
    // Nested volumes, level by level.
    let mut level = 0..out.len();
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for v in &out[level.clone()] {
            for i in layers::inner(file, v.start, v.end.min(size)) {
                let n = Volume {
                    start: i.start,
                    end: i.end.min(size),
                    what: format!("{} in {}", i.what, v.what),
                };
                if n.start < n.end
                    && !out
                        .iter()
                        .chain(&next)
                        .any(|o| (o.start, o.end) == (n.start, n.end))
                {
                    next.push(n);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        let first = out.len();
        out.extend(next);
        out.truncate(MAX_VOLUMES);
        level = first..out.len();
    }
    out
}

/// Byte ranges `[start, end)` to zero for `volumes`: each one's ends, its
/// LUKS2 second headers, and the blocks holding any signature found in
/// it. Sorted, merged.
pub fn regions(file: &File, volumes: &[Volume]) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for vol in volumes {
        let (start, end) = (vol.start, vol.end);
        v.push((start, (start + END_SPAN).min(end)));
        v.push((end.saturating_sub(END_SPAN).max(start), end));
        v.extend(luks::second_headers(file, start, end));
        for f in signatures::probe(file, start, end) {
            let s = (f.offset - (f.offset - start) % BLOCK).max(start);
            let e = (f.offset + f.len).div_ceil(BLOCK) * BLOCK;
            v.push((s, e.min(end)));
        }
    }
    merge(v)
}

fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in v {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// Zeros `regions`, reads them back, and probes `volumes` again.
pub fn erase(
    file: &File,
    d: &Disk,
    volumes: &[Volume],
    regions: &[(u64, u64)],
    counters: &Counters,
) -> Result<ErasedDisk, String> {
    let zero = vec![0u8; END_SPAN as usize];
    let name = d.path.display();
    for &(s, e) in regions {
        let mut at = s;
        while at < e {
            let n = (e - at).min(END_SPAN);
            file.write_all_at(&zero[..n as usize], at)
                .map_err(|err| format!("erasing {name} at byte {at}: {err}"))?;
            counters.written.fetch_add(n, Ordering::Relaxed);
            at += n;
        }
    }
    file.sync_all()
        .map_err(|e| format!("flushing {name}: {e}"))?;
    drop_cache(file);
    let mut checked = 0;
    for &(s, e) in regions {
        checked += check_zero(file, d, s, e - s, "erased")?;
    }
    check(file, d, volumes, "the metadata erasure")?;
    Ok(ErasedDisk {
        disk: name.to_string(),
        bytes: checked,
        checked,
        how: format!(
            "metadata: {} regions in {} volumes",
            regions.len(),
            volumes.len()
        ),
    })
}

/// Fails naming the first signature `volumes` still hold after `what`.
pub fn check(file: &File, d: &Disk, volumes: &[Volume], what: &str) -> Result<(), String> {
    let left = volumes.iter().find_map(|v| {
        signatures::probe(file, v.start, v.end)
            .into_iter()
            .next()
            .map(|f| (f, v))
    });
    match left {
        None => Ok(()),
        Some((f, v)) => Err(format!(
            "{}: a {} signature is still at byte {} ({}) after {what}: a next system would find it",
            d.path.display(),
            f.name,
            f.offset,
            v.what
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_merge_and_clip() {
        assert_eq!(
            merge(vec![(10, 20), (0, 5), (15, 30), (30, 31), (40, 41)]),
            vec![(0, 5), (10, 31), (40, 41)]
        );
    }
}
