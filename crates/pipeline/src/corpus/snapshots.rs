//! Saved collection indexes on local disk: where they live, what they
//! record of the store, and which one a load may trust.
//!
//! `<dir>/<collection id>/<log position>.<saved at>/` holds one snapshot
//! ([`CollectionIndex::save`]) and `snapshot.json`: the store's change-log
//! position it reflects (and that entry's time, so a snapshot of another
//! database with the same ids is refused), its counts, the vector
//! dimension and every file's size and CRC-32. It is written as
//! `<position>.saving-<run>` and renamed once complete and flushed; such a
//! folder is never read, is removed at once if the save fails, and is
//! removed by the next save once its run is over. Before a load its files'
//! sizes and checksums are checked (a native loader may end the process on
//! a truncated file rather than return an error: hnsw_rs did; and it walks
//! a damaged graph's links wherever they point), and a `loading-<run>`
//! marker is left in the folder while it loads: a process that died
//! loading it leaves the marker, and the next start refuses the snapshot
//! instead of dying again.
//! Snapshots are a cache of the store: any that cannot be trusted is
//! removed and the collection loads from the store.
//!
//! The same folder holds this run's workspace, `work-<run>/`: the
//! loaded collections' lexical indexes, on disk and memory-mapped
//! ([`ragtime_retrieve::Workspace`]). A save hard-links their committed
//! files into the snapshot and a load links a snapshot's into the
//! workspace: one copy on disk. A workspace is never read by another run;
//! it is removed when its engine is dropped, and the next start removes a
//! dead run's (its lock free).
//!
//! Whether a save or a load is still under way is told by a lock, not a
//! pid: in a container the server is PID 1 at every start, so a pid cannot
//! tell a crashed run's leftovers from the live one's. The saver holds an
//! exclusive lock on its unfinished folder, the loader on its marker, for
//! as long as it works (the kernel drops it when the process ends, however
//! it ends); a leftover whose lock can be taken is a dead run's. A *run*,
//! one start of the process, names its folders and markers by a random
//! token, so two never share a name.

use super::resident::Resident;
use super::{CorpusError, lock};
use ragtime_retrieve::IndexError;
use ragtime_retrieve::{CollectionIndex, Saved};
use ragtime_store::StoreError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use std::time::Instant;

/// Where and when collections' indexes are saved.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotConfig {
    /// The folder (one per process: not shared between replicas).
    pub dir: PathBuf,
    /// Collections with fewer chunks load from the store (seconds) and
    /// are not saved.
    pub min_chunks: usize,
    /// A collection that changed is saved again after this long.
    pub every: Duration,
}

/// `snapshot.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub format: u32,
    pub collection_id: i64,
    pub collection: String,
    /// The change-log entry the snapshot reflects every change up to.
    pub log_position: i64,
    /// That entry's time (ms since the epoch; 0 for position 0).
    pub log_at_ms: i64,
    pub dim: usize,
    pub chunks: usize,
    pub documents: usize,
    /// When it was written (ms since the epoch).
    pub saved_at_ms: i64,
    /// Every file's path in the folder and size in bytes.
    #[serde(default)]
    pub files: BTreeMap<String, u64>,
    /// Every file's CRC-32, by its path (none in a snapshot an older build
    /// saved: its sizes alone are checked).
    #[serde(default)]
    pub crc32: BTreeMap<String, u32>,
    /// The store's name ([`ragtime_store::Store::identity`]): what tells
    /// that it was saved from this store once its position's entry is
    /// trimmed (its collection did not change since).
    #[serde(default)]
    pub store: String,
}

/// The snapshot format this build reads and writes.
pub const FORMAT: u32 = 4;

const SAVING: &str = ".saving-";
const LOADING: &str = "loading-";
const WORK: &str = "work-";
const MAKING_WORK: &str = ".making-work-";

/// This process's run token (see the module docs).
fn run_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

/// Opens `path` (a file or a folder) and takes its exclusive lock, which
/// the kernel holds for as long as the answer is open.
fn hold(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::File::open(path)?;
    file.try_lock().map_err(std::io::Error::other)?;
    Ok(file)
}

/// Whether a live run holds `path`'s lock. Nothing holds a leftover of a
/// run that ended, however it ended (a pid-named one of an older build
/// included).
fn held(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => true,
        // The lock cannot be asked about: assumed held (nothing is
        // removed that might be in use).
        Err(std::fs::TryLockError::Error(_)) => true,
    }
}

const META: &str = "snapshot.json";

fn collection_dir(root: &Path, collection_id: i64) -> PathBuf {
    root.join(collection_id.to_string())
}

/// The newest complete snapshot of a collection: its folder and record.
pub fn latest(root: &Path, collection_id: i64) -> Option<(PathBuf, SnapshotMeta)> {
    let mut best: Option<(PathBuf, SnapshotMeta)> = None;
    for entry in std::fs::read_dir(collection_dir(root, collection_id)).ok()? {
        let Ok(entry) = entry else { continue };
        if entry.file_name().to_string_lossy().contains(SAVING) {
            continue;
        }
        let path = entry.path();
        let Ok(text) = std::fs::read_to_string(path.join(META)) else {
            continue;
        };
        match serde_json::from_str::<SnapshotMeta>(&text) {
            Ok(meta)
                if meta.format == FORMAT
                    && best.as_ref().is_none_or(|(_, b)| {
                        (meta.log_position, meta.saved_at_ms) > (b.log_position, b.saved_at_ms)
                    }) =>
            {
                best = Some((path, meta));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable snapshot record")
            }
        }
    }
    best
}

/// Saves `index` as the collection's snapshot at `meta`'s log position,
/// then removes its older snapshots and unfinished saves. Blocking.
pub fn save(
    root: &Path,
    index: &CollectionIndex,
    mut meta: SnapshotMeta,
) -> Result<SnapshotMeta, ragtime_retrieve::IndexError> {
    let parent = collection_dir(root, meta.collection_id);
    std::fs::create_dir_all(&parent)?;
    let tmp = parent.join(format!("{}{SAVING}{}", meta.log_position, run_token()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir(&tmp)?;
    // Locked while it is written: another run's clean-up leaves it alone.
    let written = match hold(&tmp) {
        Ok(_lock) => write(&parent, &tmp, index, &mut meta),
        Err(e) => Err(e.into()),
    };
    let target = match written {
        Ok(target) => target,
        Err(e) => {
            // Whatever step failed, nothing half-written stays.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    for entry in std::fs::read_dir(&parent)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let stale = match name.split_once(SAVING) {
            // Another live run's save under way is left alone.
            Some(_) => !held(&entry.path()),
            None => entry.path() != target,
        };
        if stale {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(meta)
}

/// Writes the snapshot into `tmp`, flushes it and renames it into place;
/// answers where it now is.
fn write(
    parent: &Path,
    tmp: &Path,
    index: &CollectionIndex,
    meta: &mut SnapshotMeta,
) -> Result<PathBuf, ragtime_retrieve::IndexError> {
    let Saved {
        chunks,
        documents,
        files,
        crc32,
    } = index.save(tmp)?;
    meta.chunks = chunks;
    meta.documents = documents;
    meta.files = files;
    meta.crc32 = crc32;
    let record = serde_json::to_vec_pretty(&meta).map_err(std::io::Error::other)?;
    let file = tmp.join(META);
    std::fs::write(&file, record)?;
    std::fs::File::open(&file)?.sync_all()?;
    std::fs::File::open(tmp)?.sync_all()?;
    // A new name each time: the snapshot in use is not touched until the
    // new one is in place.
    let target = parent.join(format!("{}.{}", meta.log_position, meta.saved_at_ms));
    std::fs::rename(tmp, &target)?;
    if let Err(e) = std::fs::File::open(parent).and_then(|d| d.sync_all()) {
        // Renamed but not known to be durable: not kept.
        let _ = std::fs::remove_dir_all(&target);
        return Err(e.into());
    }
    Ok(target)
}

/// Checks that a snapshot's files are all there at their recorded sizes
/// and checksums, and that no run died loading it. Blocking: it reads
/// every file.
pub fn check(dir: &Path, meta: &SnapshotMeta) -> Result<(), String> {
    if meta.files.is_empty() {
        return Err("its record lists no files".into());
    }
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(LOADING) && !held(&entry.path()) {
            return Err("a process died loading it".into());
        }
    }
    ragtime_retrieve::verify_files(dir, &meta.files, &meta.crc32)
}

/// Marks a snapshot as being loaded by this run until dropped (a marker
/// file, locked while the load runs).
pub struct Loading {
    marker: PathBuf,
    /// Held open, so locked, until the marker is removed.
    _lock: std::fs::File,
}

impl Loading {
    pub fn begin(dir: &Path) -> Result<Self, String> {
        // Locked under a name no check reads, then renamed into place (the
        // lock goes with the file): the marker never reads as a dead run's.
        let marker = dir.join(format!("{LOADING}{}", run_token()));
        let making = dir.join(format!(".making-{}", run_token()));
        std::fs::write(&making, b"").map_err(|e| e.to_string())?;
        let lock = hold(&making).map_err(|e| format!("locking {}: {e}", making.display()))?;
        std::fs::rename(&making, &marker).map_err(|e| e.to_string())?;
        Ok(Self {
            marker,
            _lock: lock,
        })
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        // Removed while still locked: no moment where it reads as dead.
        let _ = std::fs::remove_file(&self.marker);
    }
}

/// This run's workspace under `root`, and its lock (held for as long as
/// the run serves from it); dead runs' workspaces are removed first.
pub fn workspace(root: &Path) -> std::io::Result<(ragtime_retrieve::Workspace, std::fs::File)> {
    std::fs::create_dir_all(root)?;
    for entry in std::fs::read_dir(root)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if (name.starts_with(WORK) || name.starts_with(MAKING_WORK))
            && !held(&entry.path())
            && let Err(e) = std::fs::remove_dir_all(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a dead run's indexes");
        }
    }
    // Named afresh for each engine: two in one process (tests) never share.
    // Made and locked under a name no clean-up takes, then renamed into
    // place (the lock goes with it): another start never sees it unlocked.
    let token = uuid::Uuid::new_v4().simple().to_string();
    let making = root.join(format!("{MAKING_WORK}{token}"));
    std::fs::create_dir(&making)?;
    let lock = hold(&making)?;
    let dir = root.join(format!("{WORK}{token}"));
    std::fs::rename(&making, &dir)?;
    let workspace = ragtime_retrieve::Workspace::new(&dir)?;
    Ok((workspace, lock))
}

/// The file under the snapshot folder that keeps its replica name.
const REPLICA: &str = "replica";

/// The replica name this snapshot folder keeps (made at its first use),
/// and the lock on it, held for the run's life: a restart reports its
/// change-log position under the name it left with, so the position on
/// record holds the log for it while it is away. Fails when another live
/// run holds it.
pub fn replica_name(root: &Path) -> std::io::Result<(String, std::fs::File)> {
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(root)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(root.join(REPLICA))?;
    file.try_lock().map_err(std::io::Error::other)?;
    let mut kept = String::new();
    file.read_to_string(&mut kept)?;
    let kept = kept.trim();
    if kept.starts_with("replica_") && kept.len() <= 64 {
        return Ok((kept.to_owned(), file));
    }
    let name = format!("replica_{}", uuid::Uuid::new_v4().simple());
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(name.as_bytes())?;
    file.sync_all()?;
    Ok((name, file))
}

/// Removes a collection's snapshots.
pub fn remove(root: &Path, collection_id: i64) {
    let dir = collection_dir(root, collection_id);
    if dir.exists()
        && let Err(e) = std::fs::remove_dir_all(&dir)
    {
        tracing::warn!(path = %dir.display(), error = %e, "could not remove a snapshot");
    }
}

/// Removes the snapshots of collections not in `keep` (dropped while this
/// process was not running).
pub fn retain(root: &Path, keep: &std::collections::HashSet<i64>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let id = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i64>().ok());
        if id.is_some_and(|id| !keep.contains(&id)) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Where snapshots go and what the corpus knows of them.
#[derive(Default)]
pub(super) struct Snapshots {
    /// Where loaded collections' indexes are saved (none: never).
    pub(super) config: Option<SnapshotConfig>,
    /// What was last saved or loaded of each collection, by its store id.
    pub(super) saved: Mutex<HashMap<i64, SavedState>>,
    /// Each collection's snapshot on disk, by its store id, as the change
    /// log sees it: the log is kept from the lowest position of those
    /// behind their collection (a start replays what came after it).
    pub(super) positions: Mutex<HashMap<i64, OnDisk>>,
    /// Collections loaded from a snapshot since start.
    pub(super) loads: AtomicUsize,
}

/// A collection's snapshot on disk, for the change log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OnDisk {
    /// The change-log position it reflects.
    pub(super) at: i64,
    /// Whether its collection has entries past `at`.
    pub(super) behind: Behind,
}

/// Whether a collection changed after its snapshot's position: only then
/// does the snapshot need the log kept from there. A collection that does
/// not change never holds the log back (a trim records which entries of
/// it went: [`ragtime_store::Store::collection_log_trimmed_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Behind {
    /// Not known yet (found on disk at start): counted as behind.
    Unknown,
    No,
    Yes,
}

impl OnDisk {
    pub(super) fn new(at: i64, behind: Behind) -> Self {
        Self { at, behind }
    }

    /// The position the log must be kept from for it, if any.
    pub(super) fn holds(&self) -> Option<i64> {
        (self.behind != Behind::No).then_some(self.at)
    }
}

/// A loaded collection's indexes as its snapshot holds them.
pub(super) struct SavedState {
    /// The loaded index the snapshot was written from or read into.
    index: std::sync::Weak<CollectionIndex>,
    /// Its version then.
    version: u64,
    at: Instant,
}

/// Change-log entries of one collection replayed over its snapshot at
/// most; past this, loading from the store is as quick.
const REPLAY_MAX: i64 = 2000;

/// Entries written this long before a snapshot's position are replayed
/// too (see [`ragtime_store::Store::collection_log_recent`]).
const REPLAY_MARGIN_MS: i64 = 30_000;

/// Why a snapshot was not used.
enum SnapshotFault {
    /// It cannot be trusted: removed, the collection loads from the store.
    Untrusted(String),
    /// The store could not be read: the snapshot is kept.
    Store(StoreError),
}

impl From<StoreError> for SnapshotFault {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl Resident {
    /// Collections loaded from a snapshot since start.
    pub fn snapshot_loads(&self) -> usize {
        self.snapshots
            .loads
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The collection's indexes from its snapshot, brought up to the store
    /// by replaying its change-log entries after it; `None` (and the
    /// snapshot removed when it cannot be trusted) to load from the store.
    pub(super) async fn load_snapshot(
        &self,
        name: &str,
        coll_id: i64,
    ) -> Result<Option<Arc<CollectionIndex>>, CorpusError> {
        let Some(cfg) = self.snapshots.config.as_ref() else {
            return Ok(None);
        };
        let Some((dir, meta)) = latest(&cfg.dir, coll_id) else {
            return Ok(None);
        };
        let started = Instant::now();
        // A snapshot opens only for the collection it was saved for (one
        // copied or restored into another's folder is not that one's).
        let opened = if meta.collection_id == coll_id {
            self.open_snapshot(&dir, &meta).await
        } else {
            Err(SnapshotFault::Untrusted(format!(
                "saved for collection {}, not {coll_id}",
                meta.collection_id
            )))
        };
        match opened {
            Ok(Some((idx, replayed))) => {
                self.snapshots
                    .loads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    collection = %name,
                    chunks = idx.len(),
                    log_position = meta.log_position,
                    replayed,
                    took_ms = started.elapsed().as_millis() as u64,
                    "indexes loaded from their snapshot"
                );
                Ok(Some(idx))
            }
            Ok(None) => Ok(None),
            Err(SnapshotFault::Untrusted(why)) => {
                tracing::warn!(collection = %name, path = %dir.display(), %why, "snapshot not used; loading from the store");
                remove(&cfg.dir, coll_id);
                lock(&self.snapshots.positions).remove(&coll_id);
                Ok(None)
            }
            Err(SnapshotFault::Store(e)) => Err(e.into()),
        }
    }

    /// Reads a snapshot and replays what came after it; `Ok(None)` when too
    /// much did (the snapshot stays for the next save to replace).
    async fn open_snapshot(
        &self,
        dir: &std::path::Path,
        meta: &SnapshotMeta,
    ) -> Result<Option<(Arc<CollectionIndex>, usize)>, SnapshotFault> {
        let untrusted = SnapshotFault::Untrusted;
        if meta.dim != self.indexes.dim() {
            return Err(untrusted(format!(
                "saved with {}-dimensional vectors, the embedder makes {}",
                meta.dim,
                self.indexes.dim()
            )));
        }
        let version = self.store.corpus_version().await?;
        let entry = self.store.log_entry(meta.log_position).await?;
        let same_store = match entry {
            Some(e) => e.at_ms == meta.log_at_ms,
            None if meta.log_position == 0 => true,
            // Trimmed since: its collection did not change after it.
            None => {
                !meta.store.is_empty()
                    && meta.log_position < self.store.log_trimmed_below().await?
                    && meta.store == self.store.identity().await?
            }
        };
        if !same_store || meta.log_position > version {
            return Err(untrusted(format!(
                "log position {} is not this store's",
                meta.log_position
            )));
        }
        let mut after = self
            .store
            .collection_log_since(meta.collection_id, meta.log_position, REPLAY_MAX + 1)
            .await?;
        if after.len() as i64 > REPLAY_MAX {
            return Ok(None);
        }
        let recent = self
            .store
            .collection_log_recent(
                meta.collection_id,
                meta.log_position,
                meta.log_at_ms - REPLAY_MARGIN_MS,
                REPLAY_MAX,
            )
            .await?;
        after.splice(0..0, recent);
        // Read after the entries (a trim removes entries and records this
        // in one transaction): past the position, some may be missing.
        // Other collections' entries trimmed do not matter.
        let trimmed_to = self
            .store
            .collection_log_trimmed_to(meta.collection_id)
            .await?;
        if trimmed_to > meta.log_position {
            return Err(untrusted(format!(
                "the collection's change-log entries after position {} were trimmed (up to {trimmed_to})",
                meta.log_position
            )));
        }
        let (dir, dim, params) = (dir.to_owned(), self.indexes.dim(), self.indexes.params());
        let folder = self.indexes.folder();
        let record = meta.clone();
        // On a blocking thread (the check reads every file): a panic in
        // the graph's loader is then an error here, not the process's end.
        let idx = tokio::task::spawn_blocking(move || {
            let checked = Instant::now();
            check(&dir, &record)?;
            tracing::info!(
                path = %dir.display(),
                took_ms = checked.elapsed().as_millis() as u64,
                "snapshot files checked"
            );
            // Left behind if the process dies loading (a native loader
            // may end it on a damaged file): the next start then refuses
            // the snapshot.
            let loading = Loading::begin(&dir)?;
            let idx = CollectionIndex::load(&dir, dim, params, folder).map_err(|e| e.to_string());
            drop(loading);
            idx
        })
        .await
        .map_err(|e| untrusted(format!("loading panicked: {e}")))?
        .map_err(untrusted)?;
        if idx.len() != meta.chunks || idx.documents() != meta.documents {
            return Err(untrusted(format!(
                "holds {} chunks of {} documents, its record says {} of {}",
                idx.len(),
                idx.documents(),
                meta.chunks,
                meta.documents
            )));
        }
        let idx = Arc::new(idx);
        self.mark_saved(meta.collection_id, &idx, idx.version());
        let replays = after.iter().any(|e| e.id > meta.log_position);
        let behind = if replays {
            Behind::Yes
        } else {
            Behind::Unknown
        };
        lock(&self.snapshots.positions)
            .insert(meta.collection_id, OnDisk::new(meta.log_position, behind));
        for e in &after {
            if e.op == "upsert" || e.op == "delete" {
                match self.apply_document(&idx, e).await {
                    Ok(()) => {}
                    Err(CorpusError::Store(e)) => return Err(SnapshotFault::Store(e)),
                    Err(e) => return Err(untrusted(e.to_string())),
                }
            }
        }
        Ok(Some((idx, after.len())))
    }

    /// Saves the snapshot of every loaded collection of at least
    /// `min_chunks` chunks that has none yet, or that changed since its
    /// last one was saved `every` ago. Each save holds its collection's
    /// lock (no write to it lands while it writes; searches and other
    /// collections' writes go on). Returns how many were saved.
    pub async fn save_snapshots(&self) -> Result<usize, CorpusError> {
        let Some(cfg) = &self.snapshots.config else {
            return Ok(0);
        };
        let ids: Vec<(i64, String)> = lock(&self.loaded_ids)
            .iter()
            .map(|(id, name)| (*id, name.clone()))
            .collect();
        let mut n = 0;
        for (coll_id, name) in ids {
            let due = |idx: &Arc<CollectionIndex>| {
                idx.len() >= cfg.min_chunks
                    && match lock(&self.snapshots.saved).get(&coll_id) {
                        None => true,
                        Some(s) if !std::ptr::eq(s.index.as_ptr(), Arc::as_ptr(idx)) => true,
                        Some(s) => s.version != idx.version() && s.at.elapsed() >= cfg.every,
                    }
            };
            if !self.indexes.get(&name).is_some_and(|idx| due(&idx)) {
                continue;
            }
            let _w = self.shared.lock_collection(&name).await;
            // Looked at again under the lock: it may have gone meanwhile.
            let Some(idx) = self.indexes.get(&name).filter(|idx| due(idx)) else {
                continue;
            };
            if lock(&self.loaded_ids).get(&coll_id) != Some(&name) {
                continue;
            }
            // Every change up to the follower's position is in the index
            // (and this process's own later writes, which a load replays
            // again, changing nothing).
            let position = self
                .follower
                .applied
                .load(std::sync::atomic::Ordering::Acquire);
            let version = idx.version();
            let started = Instant::now();
            let read = async {
                let entry = self.store.log_entry(position).await?;
                Ok::<_, StoreError>((entry, self.store.identity().await?))
            };
            let saved = match read.await {
                Ok((entry, store)) => {
                    let meta = SnapshotMeta {
                        format: FORMAT,
                        collection_id: coll_id,
                        collection: name.clone(),
                        log_position: position,
                        log_at_ms: entry.map_or(0, |e| e.at_ms),
                        dim: self.indexes.dim(),
                        chunks: 0,
                        documents: 0,
                        saved_at_ms: ragtime_store::now_ms(),
                        files: Default::default(),
                        crc32: Default::default(),
                        store,
                    };
                    let (root, index) = (cfg.dir.clone(), idx.clone());
                    tokio::task::spawn_blocking(move || save(&root, &index, meta))
                        .await
                        .unwrap_or_else(|e| {
                            Err(IndexError::Snapshot(format!("saving panicked: {e}")))
                        })
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match saved {
                Ok(meta) => {
                    tracing::info!(
                        collection = %name,
                        chunks = meta.chunks,
                        log_position = meta.log_position,
                        took_ms = started.elapsed().as_millis() as u64,
                        "indexes saved"
                    );
                    self.mark_saved(coll_id, &idx, version);
                    // Every change of it up to the position is in it (the
                    // collection's lock is held): the follower marks it
                    // behind at its next entry.
                    lock(&self.snapshots.positions)
                        .insert(coll_id, OnDisk::new(meta.log_position, Behind::No));
                    n += 1;
                }
                Err(e) => {
                    tracing::warn!(collection = %name, error = %e, "saving the indexes failed");
                    // Marked as saved at another version: tried again
                    // after `every`, not at the next look.
                    self.mark_saved(coll_id, &idx, version.wrapping_sub(1));
                }
            }
        }
        Ok(n)
    }

    /// Notes that the collection's snapshot holds `index` at `version` as
    /// of now.
    fn mark_saved(&self, coll_id: i64, index: &Arc<CollectionIndex>, version: u64) {
        lock(&self.snapshots.saved).insert(
            coll_id,
            SavedState {
                index: Arc::downgrade(index),
                version,
                at: Instant::now(),
            },
        );
    }

    /// Removes a dropped collection's snapshot.
    pub(super) fn forget_snapshot(&self, coll_id: i64) {
        lock(&self.snapshots.saved).remove(&coll_id);
        lock(&self.snapshots.positions).remove(&coll_id);
        if let Some(cfg) = &self.snapshots.config {
            remove(&cfg.dir, coll_id);
        }
    }
}
