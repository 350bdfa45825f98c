//! The prompts a backend is reading now, for a backend that streams its
//! prompt progress: each request called and not yet at its first token
//! holds an entry with the tokens it has left to read, updated from its
//! progress events.
//!
//! Why: a CPU server such as llama.cpp's reads prompts one after another —
//! each step's batch is filled from the first slot with prompt left, so a
//! request admitted while another's prompt is being read gets no progress
//! (not even its 0 % event) until that prompt is nearly done. Its first
//! token comes after everything ahead of it is read, so the time to
//! predict is the backlog's tokens plus its own at the backend's reading
//! rate — not its own prompt at a rate it has not shown yet. With that,
//! admission refuses at once what cannot make its deadline, and a request
//! held up behind a long prompt is cut over as soon as the backlog shows
//! it, not when the deadline has passed.
//!
//! A prompt counts as ahead of another when it has shown progress more
//! recently: the one being read now (the server may also start a later
//! request first when its slot comes earlier in the server's order; the
//! entries follow what the events show, not the order of arrival).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Prompt tokens not yet read.
    left: f64,
    /// Tokens read, as last reported.
    processed: u32,
    /// When it last showed tokens read (or its first event): `None`,
    /// never started.
    last: Option<Instant>,
}

/// Every prompt a backend has been sent and not finished reading.
#[derive(Debug, Default)]
pub struct Prefills {
    entries: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

fn lock(m: &Mutex<HashMap<u64, Entry>>) -> MutexGuard<'_, HashMap<u64, Entry>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Prefills {
    /// A prompt of about `tokens` sent: its entry, removed when dropped
    /// (first token, failure, or the request dropped).
    pub fn enter(self: &Arc<Self>, tokens: f64) -> Reading {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.entries).insert(
            id,
            Entry {
                left: tokens.max(0.0),
                processed: 0,
                last: None,
            },
        );
        Reading {
            prefills: self.clone(),
            id,
        }
    }

    /// Prompt tokens every request in flight still has to have read: what
    /// a prompt sent now waits behind, at most.
    pub fn backlog(&self) -> f64 {
        lock(&self.entries).values().map(|e| e.left).sum()
    }
}

/// One prompt being read (or waiting to be).
#[derive(Debug)]
pub struct Reading {
    prefills: Arc<Prefills>,
    id: u64,
}

impl Reading {
    /// A progress event: `processed` of `total` tokens read, at `now`. A
    /// server reports on every prompt it has started after each step, read
    /// in that step or not; only an event that shows tokens read (or the
    /// first) says this prompt is the one being read.
    pub fn progress(&self, processed: u32, total: u32, now: Instant) {
        if let Some(e) = lock(&self.prefills.entries).get_mut(&self.id) {
            if e.last.is_none() || processed > e.processed {
                e.last = Some(now);
            }
            e.processed = processed;
            e.left = f64::from(total.saturating_sub(processed));
        }
    }

    /// Tokens of other prompts ahead of this one: those that showed
    /// progress more recently than it did (being read while it waits).
    pub fn ahead(&self) -> f64 {
        let g = lock(&self.prefills.entries);
        let mine = g.get(&self.id).and_then(|e| e.last);
        g.iter()
            .filter(|(id, e)| **id != self.id && e.last.is_some() && e.last > mine)
            .map(|(_, e)| e.left)
            .sum()
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        lock(&self.prefills.entries).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_prompt_being_read_is_ahead_of_one_waiting() {
        let p = Arc::new(Prefills::default());
        let t = Instant::now();
        let a = p.enter(1000.0);
        let b = p.enter(600.0);
        assert_eq!(p.backlog(), 1600.0);
        // Neither has shown progress: nobody is known to be ahead.
        assert_eq!(a.ahead(), 0.0);
        assert_eq!(b.ahead(), 0.0);
        a.progress(0, 1000, t);
        a.progress(256, 1000, t + Duration::from_millis(300));
        assert_eq!(b.ahead(), 744.0, "a is being read: b waits for its rest");
        assert_eq!(a.ahead(), 0.0);
        // b starts (the server took it up): now it is the one read, and
        // a's reports without progress do not put it back in front.
        b.progress(0, 600, t + Duration::from_millis(400));
        a.progress(256, 1000, t + Duration::from_millis(450));
        b.progress(256, 600, t + Duration::from_millis(700));
        a.progress(256, 1000, t + Duration::from_millis(710));
        assert_eq!(a.ahead(), 344.0);
        assert_eq!(b.ahead(), 0.0);
        assert_eq!(p.backlog(), 1088.0);
        drop(b);
        assert_eq!(a.ahead(), 0.0);
        assert_eq!(p.backlog(), 744.0);
        drop(a);
        assert_eq!(p.backlog(), 0.0, "a dropped reading leaves the ledger");
    }
}
