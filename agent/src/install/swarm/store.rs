//! The chunks an agent holds for the other members of its swarm: each
//! verified against the manifest before it is kept, the oldest dropped
//! past a bound (members ask for chunks in order, so the one behind
//! wants the newest). A member asking for a chunk not yet here is held
//! until it arrives, up to a bound: a child asks its parent for what the
//! parent is fetching now.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

/// What the fetch has brought so far.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Chunks below this were fetched (and kept, unless dropped since).
    next: u64,
    /// No more will come.
    ended: bool,
}

#[derive(Debug)]
pub struct ChunkStore {
    /// The manifest's SHA-256, hex: the name members ask under.
    pub manifest: String,
    count: u64,
    cap: usize,
    held: Mutex<Held>,
    progress: watch::Sender<Progress>,
    /// Chunks served to other members (how long a member serves on).
    pub served_chunks: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    chunks: BTreeMap<u64, Bytes>,
    bytes: usize,
}

impl ChunkStore {
    /// A store for the `count` chunks of the manifest `manifest` (hex),
    /// keeping at most `cap` bytes (and always the newest chunk).
    pub fn new(manifest: String, count: u64, cap: usize) -> ChunkStore {
        ChunkStore {
            manifest,
            count,
            cap,
            held: Mutex::default(),
            progress: watch::Sender::new(Progress::default()),
            served_chunks: AtomicU64::new(0),
        }
    }

    /// Keeps chunk `i`, checked; drops the oldest past the bound.
    pub fn put(&self, i: u64, chunk: Bytes) {
        {
            let mut h = self.held.lock().unwrap();
            h.bytes += chunk.len();
            if let Some(old) = h.chunks.insert(i, chunk) {
                h.bytes -= old.len();
            }
            while h.bytes > self.cap && h.chunks.len() > 1 {
                let Some((_, dropped)) = h.chunks.pop_first() else {
                    break;
                };
                h.bytes -= dropped.len();
            }
        }
        self.progress.send_modify(|p| p.next = p.next.max(i + 1));
    }

    /// No more chunks will come (the fetch ended, well or not).
    pub fn end(&self) {
        self.progress.send_modify(|p| p.ended = true);
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.held.lock().unwrap().bytes
    }

    /// Chunk `i`, waiting up to `wait` for it while the fetch is still to
    /// bring it; None if it is not held (dropped, never to come, or not
    /// come in time).
    pub async fn get(&self, i: u64, wait: Duration) -> Option<Bytes> {
        if i >= self.count {
            return None;
        }
        let mut rx = self.progress.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|p| p.next > i || p.ended)).await;
        let chunk = self.held.lock().unwrap().chunks.get(&i).cloned();
        if chunk.is_some() {
            self.served_chunks.fetch_add(1, Ordering::Relaxed);
        }
        chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_chunks_go_past_the_bound_and_a_coming_one_is_waited_for() {
        let store = std::sync::Arc::new(ChunkStore::new("m".into(), 5, 10));
        store.put(0, Bytes::from_static(b"aaaa"));
        store.put(1, Bytes::from_static(b"bbbb"));
        store.put(2, Bytes::from_static(b"cccc"));
        // 12 bytes > 10: chunk 0 went.
        assert_eq!(store.held_bytes(), 8);
        assert_eq!(store.get(0, Duration::ZERO).await, None);
        assert_eq!(
            store.get(2, Duration::ZERO).await.as_deref(),
            Some(&b"cccc"[..])
        );
        // Chunk 3 arrives while asked for.
        let s = store.clone();
        let asked = tokio::spawn(async move { s.get(3, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.put(3, Bytes::from_static(b"dddd"));
        assert_eq!(asked.await.unwrap().as_deref(), Some(&b"dddd"[..]));
        // One never to come: the end answers at once.
        store.end();
        assert_eq!(store.get(4, Duration::from_secs(10)).await, None);
        // Past the image: nothing.
        assert_eq!(store.get(9, Duration::from_secs(10)).await, None);
        assert_eq!(store.served_chunks.load(Ordering::Relaxed), 2);
    }
}
