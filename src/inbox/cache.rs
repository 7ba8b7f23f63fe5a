//! A bounded in-process cache of committed responses, so a replay is answered without a trip to
//! the database.
//!
//! It is safe with several instances because a committed response never changes: whichever
//! instance claimed the event, the stored bytes are the same. The fingerprint check still
//! applies to a cached entry (a different payload under the id is still 422). An entry is used
//! only while its event is inside its source's retention window, so an event the scheduled
//! purge forgets is forgotten here too; one removed early (`hookbox purge --older-than` with a
//! shorter window) may still be answered as a replay from here, which is harmless: the provider
//! gets the answer it got the first time.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use super::StoredResponse;

/// Entries kept at most; the oldest goes first.
pub const CAPACITY: usize = 20_000;

struct Entry {
    source: String,
    event_id: String,
    fingerprint: [u8; 32],
    response: StoredResponse,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    order: VecDeque<u64>,
}

/// What the cache knows of an event.
#[derive(Debug, PartialEq, Eq)]
pub enum Cached {
    /// Stored with this payload: replay this.
    Replay(StoredResponse),
    /// Stored with another payload.
    Mismatch,
}

/// Committed responses by (source, event id).
pub struct ReplayCache {
    inner: Mutex<Inner>,
    hasher: std::collections::hash_map::RandomState,
    capacity: usize,
}

impl Default for ReplayCache {
    fn default() -> Self {
        ReplayCache::with_capacity(CAPACITY)
    }
}

impl ReplayCache {
    /// A cache of at most `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        ReplayCache {
            inner: Mutex::default(),
            hasher: Default::default(),
            capacity: capacity.max(1),
        }
    }

    fn key(&self, source: &str, event_id: &str) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        source.hash(&mut hasher);
        event_id.hash(&mut hasher);
        hasher.finish()
    }

    /// The committed answer for the event, if cached and still inside `window`.
    pub fn get(
        &self,
        source: &str,
        event_id: &str,
        fingerprint: &[u8; 32],
        window: Duration,
    ) -> Option<Cached> {
        let key = self.key(source, event_id);
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let entry = inner.entries.get(&key)?;
        if entry.source != source || entry.event_id != event_id {
            return None;
        }
        let age = crate::db::now().signed_duration_since(entry.response.received_at);
        if age.to_std().is_ok_and(|age| age >= window) {
            return None;
        }
        if &entry.fingerprint == fingerprint {
            Some(Cached::Replay(entry.response.clone()))
        } else {
            Some(Cached::Mismatch)
        }
    }

    /// Remembers a committed answer.
    pub fn put(
        &self,
        source: &str,
        event_id: &str,
        fingerprint: [u8; 32],
        response: StoredResponse,
    ) {
        let key = self.key(source, event_id);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let entry = Entry {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            fingerprint,
            response,
        };
        if inner.entries.insert(key, entry).is_none() {
            inner.order.push_back(key);
        }
        while inner.entries.len() > self.capacity {
            match inner.order.pop_front() {
                Some(oldest) => {
                    inner.entries.remove(&oldest);
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn response(age: chrono::Duration) -> StoredResponse {
        StoredResponse {
            status: 200,
            content_type: "application/json".to_owned(),
            body: actix_web::web::Bytes::from_static(b"{}"),
            received_at: Utc::now() - age,
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_cached_answer_is_a_replay_only_for_the_same_payload() {
        let cache = ReplayCache::default();
        cache.put(
            "stripe",
            "evt_1",
            [1; 32],
            response(chrono::Duration::zero()),
        );
        assert!(matches!(
            cache.get("stripe", "evt_1", &[1; 32], HOUR),
            Some(Cached::Replay(_))
        ));
        assert_eq!(
            cache.get("stripe", "evt_1", &[2; 32], HOUR),
            Some(Cached::Mismatch)
        );
        assert_eq!(cache.get("github", "evt_1", &[1; 32], HOUR), None);
        assert_eq!(cache.get("stripe", "evt_2", &[1; 32], HOUR), None);
    }

    #[test]
    fn an_entry_past_its_window_is_not_used() {
        let cache = ReplayCache::default();
        cache.put(
            "stripe",
            "old",
            [1; 32],
            response(chrono::Duration::hours(2)),
        );
        assert_eq!(cache.get("stripe", "old", &[1; 32], HOUR), None);
        assert!(cache.get("stripe", "old", &[1; 32], 3 * HOUR).is_some());
    }

    #[test]
    fn the_oldest_entries_go_first_past_the_capacity() {
        let cache = ReplayCache::with_capacity(2);
        for id in ["a", "b", "c"] {
            cache.put("s", id, [0; 32], response(chrono::Duration::zero()));
        }
        assert_eq!(cache.get("s", "a", &[0; 32], HOUR), None);
        assert!(cache.get("s", "b", &[0; 32], HOUR).is_some());
        assert!(cache.get("s", "c", &[0; 32], HOUR).is_some());
    }
}
