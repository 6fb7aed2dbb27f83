//! LUKS2's second header, which a metadata erasure's spans at the ends of
//! a disk or partition miss when its metadata area is 1 MiB or more: the
//! header is kept twice, the second copy where the first one's area ends
//! (its `hdr_size`, 16 KiB to 4 MiB), and cryptsetup opens either.
//! libblkid looks for the second copy at each allowed size; so does this.

use std::fs::File;

use crate::install::partitions::read_at;

/// The first header's magic, and the second's.
const FIRST: &[u8; 6] = b"LUKS\xba\xbe";
const SECOND: &[u8; 6] = b"SKUL\xba\xbe";
/// The metadata area's sizes LUKS2 allows: where a second header may be.
const AREAS: [u64; 9] = [
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];

/// The byte ranges of the LUKS2 headers' second copies in the volume from
/// `start` to `end` (a disk, or a partition): where the first header says
/// its area ends, and wherever a second header's magic is at an allowed
/// size. Each range is the copy's whole area, clipped to the volume.
pub fn second_headers(file: &File, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut area = |size: u64| {
        let (s, e) = (start + size, (start + 2 * size).min(end));
        if s < e && !out.contains(&(s, e)) {
            out.push((s, e));
        }
    };
    if let Ok(h) = read_at(file, 16, start)
        && h.starts_with(FIRST)
        && u16::from_be_bytes([h[6], h[7]]) == 2
    {
        let size = u64::from_be_bytes(h[8..16].try_into().unwrap());
        if AREAS.contains(&size) {
            area(size);
        }
    }
    for size in AREAS {
        if start + size + 8 <= end
            && let Ok(h) = read_at(file, 8, start + size)
            && h.starts_with(SECOND)
        {
            area(size);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), bytes).unwrap();
        let f = File::open(t.path()).unwrap();
        (t, f)
    }

    /// A LUKS2 volume's two headers, as `cryptsetup luksFormat
    /// --luks2-metadata-size` lays them out, at `start` of `disk`.
    fn luks2(disk: &mut [u8], start: usize, area: u64) {
        let put = |disk: &mut [u8], at: usize, magic: &[u8; 6]| {
            disk[at..at + 6].copy_from_slice(magic);
            disk[at + 6..at + 8].copy_from_slice(&2u16.to_be_bytes());
            disk[at + 8..at + 16].copy_from_slice(&area.to_be_bytes());
        };
        put(disk, start, FIRST);
        put(disk, start + area as usize, SECOND);
    }

    #[test]
    fn the_second_header_is_found_at_the_first_ones_area_or_by_its_magic() {
        let mut disk = vec![0u8; 16 << 20];
        luks2(&mut disk, 0, 4 << 20);
        let (_t, f) = file_of(&disk);
        assert_eq!(second_headers(&f, 0, 16 << 20), vec![(4 << 20, 8 << 20)]);
        // The first header gone (erased before): the second is still found.
        disk[..16].fill(0);
        let (_t, f) = file_of(&disk);
        assert_eq!(second_headers(&f, 0, 16 << 20), vec![(4 << 20, 8 << 20)]);
        // In a partition from 2 MiB, with a 1 MiB area.
        let mut disk = vec![0u8; 16 << 20];
        luks2(&mut disk, 2 << 20, 1 << 20);
        let (_t, f) = file_of(&disk);
        assert_eq!(
            second_headers(&f, 2 << 20, 16 << 20),
            vec![(3 << 20, 4 << 20)]
        );
        // Nothing LUKS: nothing.
        let (_t, f) = file_of(&vec![0u8; 16 << 20]);
        assert!(second_headers(&f, 0, 16 << 20).is_empty());
    }
}
