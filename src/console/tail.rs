//! What a console printed, its last bytes: a ring of at most `cap` bytes,
//! and how many were seen in all.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct Tail {
    bytes: VecDeque<u8>,
    cap: usize,
    seen: u64,
}

impl Tail {
    pub fn new(cap: usize) -> Tail {
        Tail {
            bytes: VecDeque::with_capacity(cap.min(64 * 1024)),
            cap: cap.max(1),
            seen: 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.seen += chunk.len() as u64;
        let chunk = if chunk.len() > self.cap {
            &chunk[chunk.len() - self.cap..]
        } else {
            chunk
        };
        let over = (self.bytes.len() + chunk.len()).saturating_sub(self.cap);
        self.bytes.drain(..over);
        self.bytes.extend(chunk);
    }

    /// Bytes seen since the tail began (more than it keeps, once full).
    pub fn seen(&self) -> u64 {
        self.seen
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.iter().copied().collect()
    }

    /// The kept bytes as text, for people: see [`text`].
    pub fn text(&self) -> String {
        text(&self.bytes())
    }

    /// The last `n` lines of [`Tail::text`] that hold something.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        last_lines(&self.text(), n)
    }
}

/// A console's bytes as text: UTF-8 (what is not, replaced), carriage
/// returns and terminal escapes (colours, cursor moves, titles) removed,
/// other control characters but newline and tab dropped.
pub fn text(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.peek() {
                // CSI: ESC [ parameters, then a final byte in @..~.
                Some('[') => {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: ESC ] … BEL or ESC \.
                Some(']') => {
                    chars.next();
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                // Another two-byte escape.
                _ => {
                    chars.next();
                }
            },
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The last `n` lines of `text` that hold more than blanks.
pub fn last_lines(text: &str, n: usize) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .rev()
        .take(n)
        .map(String::from)
        .collect();
    lines.reverse();
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_bytes_and_counts_all() {
        let mut t = Tail::new(8);
        t.push(b"abcdef");
        t.push(b"ghij");
        assert_eq!(t.bytes(), b"cdefghij");
        assert_eq!(t.seen(), 10);
        t.push(b"0123456789");
        assert_eq!(t.bytes(), b"23456789");
        assert_eq!(t.seen(), 20);
    }

    #[test]
    fn text_drops_escapes_and_carriage_returns() {
        let raw = b"\x1b[2J\x1b[1;1HBooting from Hard Disk...\r\n\x1b[0;31mNo bootable device.\x1b[0m\r\n\x1b]0;title\x07\r\n";
        assert_eq!(
            text(raw),
            "Booting from Hard Disk...\nNo bootable device.\n\n"
        );
        assert_eq!(
            last_lines(&text(raw), 1),
            vec!["No bootable device.".to_string()]
        );
    }
}
