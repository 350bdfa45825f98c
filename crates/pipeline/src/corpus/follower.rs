//! Following the store's change log: every replica applies what other
//! processes wrote (another replica's ingests, replacements, deletes and
//! removed collections; `ragtime ingest` beside it) to the collections it
//! has loaded, in the log's order, and moves its corpus version with
//! them. The log is numbered in commit order (see `ragtime_store`'s
//! `WriteLocks`), so reading past the last entry applied never passes one
//! that commits later. The log is trimmed below every live replica's
//! position; a replica that fell behind past the trim reloads from the
//! store.

use super::resident::{Resident, index_items};
use super::snapshots::{Behind, OnDisk};
use super::{CorpusError, lock};
use ragtime_retrieve::CollectionIndex;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::time::{Duration, Instant};

/// The follower's state.
pub(super) struct Follower {
    /// The ingest-log entry the follower has reached.
    pub(super) applied: AtomicI64,
    /// Log entries of this process's own writes the follower has not
    /// reached yet: already in the indexes, so it passes them by.
    pub(super) own: Mutex<HashSet<i64>>,
    /// Whether a follower runs (only then are own writes remembered).
    pub(super) following: AtomicBool,
    /// How far behind the store the follower was at its last look.
    pub(super) lag: Mutex<Lag>,
    /// When the follower last finished a pass (or the indexes were loaded).
    pub(super) last_pass: Mutex<Instant>,
    /// One pass at a time.
    pub(super) pass_lock: tokio::sync::Mutex<()>,
}

impl Follower {
    pub(super) fn new() -> Self {
        Self {
            applied: AtomicI64::new(0),
            own: Mutex::default(),
            following: AtomicBool::new(false),
            lag: Mutex::default(),
            last_pass: Mutex::new(Instant::now()),
            pass_lock: tokio::sync::Mutex::new(()),
        }
    }
}

/// How far the indexes are behind the store's change log.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lag {
    /// Log entries not applied yet.
    pub entries: i64,
    /// Age of the oldest of them (0 when caught up).
    pub seconds: f64,
    /// The log entry the indexes reflect.
    pub applied: i64,
    /// Since the follower last finished a pass (or the indexes loaded): a
    /// follower stuck behind a lock or a store that does not answer shows
    /// here while `entries` and `seconds` still read as at its last look.
    pub since_pass: Duration,
}

/// Log entries one look at the store applies at most.
const FOLLOW_BATCH: i64 = 1000;

impl Resident {
    /// Notes a log entry of this process's own write for the follower.
    pub(super) fn remember(&self, entry: i64) {
        if self
            .follower
            .following
            .load(std::sync::atomic::Ordering::Acquire)
        {
            lock(&self.follower.own).insert(entry);
        }
    }

    /// Applies the store's changes made since the last call by anyone
    /// else — another replica, `ragtime ingest` — to the loaded indexes, in
    /// the log's order, and moves the corpus version with them (so no
    /// cached answer older than an applied change is served). Collections
    /// not loaded need nothing: they load the store as it is. Returns the
    /// log entries passed.
    pub async fn follow(&self) -> Result<usize, CorpusError> {
        use std::sync::atomic::Ordering;
        let _pass = self.follower.pass_lock.lock().await;
        self.follower.following.store(true, Ordering::Release);
        let after = self.follower.applied.load(Ordering::Acquire);
        let entries = self.store.log_since(after, FOLLOW_BATCH).await?;
        // Entries trimmed away leave the first one read past the next id
        // (so do ids a rolled-back write took): only then is the trim
        // point read, after the entries — a trim that removed some the
        // read should have seen has moved it past `after` by then (the
        // trim's removal and its record commit together).
        let gap = entries.first().is_some_and(|e| e.id > after + 1);
        if gap && after + 1 < self.store.log_trimmed_below().await? {
            self.catch_up_after_trim(after).await?;
            return Ok(0);
        }
        for e in &entries {
            // Under the collection's lock: a load or a write of it under
            // way ends first (a load names its collection here before it
            // reads the store, so none misses an entry it did not see).
            let (name, _c) = self.locked_name(e.collection_id).await;
            // Marked before `applied` passes it: the position never
            // passes an entry its snapshot lacks.
            self.behind_snapshot(e.collection_id, e.id);
            if !lock(&self.follower.own).remove(&e.id) {
                self.apply(e, name.as_deref()).await?;
            }
            self.follower.applied.fetch_max(e.id, Ordering::AcqRel);
            self.shared.advance(e.id);
        }
        let applied = self.follower.applied.load(Ordering::Acquire);
        // Own writes whose entries the pass went by without seeing them
        // (their collection was not loaded, or was dropped meanwhile).
        lock(&self.follower.own).retain(|id| *id > applied);
        let mut lag = Lag {
            applied,
            ..Lag::default()
        };
        if entries.len() as i64 == FOLLOW_BATCH {
            // More may wait: how many, and since when.
            if let Some(next) = self.store.log_since(applied, 1).await?.first() {
                let now = ragtime_store::now_ms();
                lag.entries = self.store.corpus_version().await? - applied;
                lag.seconds = (now - next.at_ms).max(0) as f64 / 1000.0;
            }
        }
        *lock(&self.follower.lag) = lag;
        *lock(&self.follower.last_pass) = Instant::now();
        Ok(entries.len())
    }

    /// The name collection `id` is loaded under, if any, with its lock
    /// held. Looked up again once the lock is held: a load that named it
    /// meanwhile has ended by then (it holds the lock while it loads).
    async fn locked_name(&self, id: i64) -> (Option<String>, Option<super::CollectionGuard<'_>>) {
        let mut name = lock(&self.loaded_ids).get(&id).cloned();
        loop {
            let guard = match &name {
                Some(n) => Some(self.shared.lock_collection(n).await),
                None => None,
            };
            let now = lock(&self.loaded_ids).get(&id).cloned();
            if now == name {
                return (name, guard);
            }
            name = now;
        }
    }

    /// Entries after `after`, not applied yet, were trimmed from the log
    /// (this replica fell behind every other for longer than they are
    /// kept): every loaded collection is dropped, to load the store as it
    /// is now at its next request, and the follower goes on from the log's
    /// end.
    async fn catch_up_after_trim(&self, after: i64) -> Result<(), CorpusError> {
        use std::sync::atomic::Ordering;
        let version = self.store.corpus_version().await?;
        let names: Vec<String> = lock(&self.loaded_ids).values().cloned().collect();
        tracing::warn!(
            applied = after,
            collections = names.len(),
            "changes this replica had not applied were trimmed from the log: its collections reload from the store"
        );
        for name in names {
            let _c = self.shared.lock_collection(&name).await;
            self.indexes.remove(&name);
            lock(&self.loaded_ids).retain(|_, n| *n != name);
        }
        lock(&self.follower.own).clear();
        self.follower.applied.fetch_max(version, Ordering::AcqRel);
        self.shared.advance(version);
        Ok(())
    }

    /// The change-log position this replica needs kept: what its follower
    /// has applied, or an older position one of its snapshots on disk
    /// would replay from, of a collection that changed after it.
    pub fn position(&self) -> i64 {
        let applied = self
            .follower
            .applied
            .load(std::sync::atomic::Ordering::Acquire);
        lock(&self.snapshots.positions)
            .values()
            .filter_map(OnDisk::holds)
            .fold(applied, i64::min)
    }

    /// Log entry `entry` of collection `coll_id`: its snapshot, if older,
    /// is behind it.
    fn behind_snapshot(&self, coll_id: i64, entry: i64) {
        if let Some(d) = lock(&self.snapshots.positions).get_mut(&coll_id)
            && entry > d.at
        {
            d.behind = Behind::Yes;
        }
    }

    /// This process wrote to collection `name`: its snapshot is behind.
    pub(super) fn changed_since_snapshot(&self, name: &str) {
        let id = lock(&self.loaded_ids)
            .iter()
            .find_map(|(id, n)| (n == name).then_some(*id));
        if let Some(id) = id {
            self.behind_snapshot(id, i64::MAX);
        }
    }

    /// Looks in the store whether the collections of snapshots found on
    /// disk changed after them (entries up to the follower's position;
    /// later ones it marks as it passes them).
    async fn settle_snapshots(&self) -> Result<(), CorpusError> {
        let applied = self
            .follower
            .applied
            .load(std::sync::atomic::Ordering::Acquire);
        let unknown: Vec<(i64, i64)> = lock(&self.snapshots.positions)
            .iter()
            .filter(|(_, d)| d.behind == Behind::Unknown)
            .map(|(id, d)| (*id, d.at))
            .collect();
        for (id, at) in unknown {
            let next = self.store.collection_log_since(id, at, 1).await?;
            let behind = if next.first().is_some_and(|e| e.id <= applied) {
                Behind::Yes
            } else {
                Behind::No
            };
            // Unless the follower (or a save) settled it meanwhile.
            if let Some(d) = lock(&self.snapshots.positions).get_mut(&id)
                && *d == OnDisk::new(at, Behind::Unknown)
            {
                d.behind = behind;
            }
        }
        Ok(())
    }

    /// Reports this replica's [`Resident::position`] under its
    /// [`Resident::replica`] name, then trims the log below every live
    /// replica's (those not heard from for `stale` are forgotten). Returns
    /// the entries removed.
    pub async fn keep_log_trimmed(&self, stale: Duration) -> Result<u64, CorpusError> {
        self.settle_snapshots().await?;
        self.store
            .report_position(&self.replica, self.position())
            .await?;
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        Ok(self
            .store
            .trim_log(ragtime_store::now_ms() - stale_ms)
            .await?)
    }

    /// Whether a follower runs (it has started a pass).
    pub fn following(&self) -> bool {
        self.follower
            .following
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// How far behind the store the indexes were at the follower's last
    /// look, and how long ago that was.
    pub fn lag(&self) -> Lag {
        Lag {
            since_pass: lock(&self.follower.last_pass).elapsed(),
            ..*lock(&self.follower.lag)
        }
    }

    /// One log entry into the loaded indexes (the caller holds the write
    /// lock). A document's change is applied as the store holds it now, so
    /// applying an entry that a load already reflects changes nothing.
    async fn apply(
        &self,
        e: &ragtime_store::LogEntry,
        name: Option<&str>,
    ) -> Result<(), CorpusError> {
        if e.op == "drop_collection" {
            self.forget_snapshot(e.collection_id);
        }
        let Some(name) = name else {
            return Ok(());
        };
        let Some(index) = self.indexes.get(name) else {
            lock(&self.loaded_ids).remove(&e.collection_id);
            return Ok(());
        };
        match e.op.as_str() {
            "drop_collection" => {
                self.indexes.remove(name);
                lock(&self.loaded_ids).remove(&e.collection_id);
            }
            "upsert" | "delete" => match self.apply_document(&index, e).await {
                Err(CorpusError::Index(err)) => {
                    tracing::warn!(error = %err, collection = %name, "applying a change failed: the collection reloads from the store");
                    self.indexes.remove(name);
                    lock(&self.loaded_ids).remove(&e.collection_id);
                }
                r => r?,
            },
            _ => {}
        }
        Ok(())
    }

    /// Puts a document's changed chunks in `index` as the store holds them
    /// now (so applying an entry twice changes nothing the second time).
    pub(super) async fn apply_document(
        &self,
        index: &CollectionIndex,
        e: &ragtime_store::LogEntry,
    ) -> Result<(), CorpusError> {
        let stored = self
            .store
            .document_index_chunks(e.collection_id, &e.external_id)
            .await?;
        let old: std::collections::HashSet<i64> =
            index.chunks_of(&e.external_id).into_iter().collect();
        let new: std::collections::HashSet<i64> = stored.iter().map(|c| c.chunk_id).collect();
        if old == new {
            return Ok(());
        }
        let gone: Vec<i64> = old.difference(&new).copied().collect();
        let mut items = index_items(stored);
        items.retain(|(c, _)| !old.contains(&c.chunk_id));
        tokio::task::block_in_place(|| {
            index.remove(&gone)?;
            index.add(items)
        })?;
        Ok(())
    }
}
