//! Saved collection indexes on local disk: where they live, what they
//! record of the store, and which one a load may trust.
//!
//! `<dir>/<collection id>/<log position>.<saved at>/` holds one snapshot
//! ([`CollectionIndex::save`]) and `snapshot.json`: the store's change-log
//! position it reflects (and that entry's time, so a snapshot of another
//! database with the same ids is refused), its counts, the vector
//! dimension and every file's size. It is written as
//! `<position>.saving-<run>` and renamed once complete and flushed; such a
//! folder is never read, is removed at once if the save fails, and is
//! removed by the next save once its run is over. Before a load its files'
//! sizes are checked (hnsw_rs exits the process on a truncated file rather
//! than returning an error), and a `loading-<run>` marker is left in the
//! folder while it loads: a process that died loading it leaves the
//! marker, and the next start refuses the snapshot instead of dying again.
//! Snapshots are a cache of the store: any that cannot be trusted is
//! removed and the collection loads from the store.
//!
//! Whether a save or a load is still under way is told by a lock, not a
//! pid: in a container the server is PID 1 at every start, so a pid cannot
//! tell a crashed run's leftovers from the live one's. The saver holds an
//! exclusive lock on its unfinished folder, the loader on its marker, for
//! as long as it works (the kernel drops it when the process ends, however
//! it ends); a leftover whose lock can be taken is a dead run's. A *run*,
//! one start of the process, names its folders and markers by a random
//! token, so two never share a name.

use ragtime_retrieve::{CollectionIndex, Saved};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
}

/// The snapshot format this build reads and writes.
pub const FORMAT: u32 = 2;

const SAVING: &str = ".saving-";
const LOADING: &str = "loading-";

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
    } = index.save(tmp)?;
    meta.chunks = chunks;
    meta.documents = documents;
    meta.files = files;
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
/// and that no run died loading it.
pub fn check(dir: &Path, meta: &SnapshotMeta) -> Result<(), String> {
    if meta.files.is_empty() {
        return Err("its record lists no files".into());
    }
    for (file, size) in &meta.files {
        match std::fs::metadata(dir.join(file)) {
            Ok(m) if m.len() == *size => {}
            Ok(m) => {
                return Err(format!(
                    "{file} has {} bytes, its record says {size}",
                    m.len()
                ));
            }
            Err(e) => return Err(format!("{file}: {e}")),
        }
    }
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(LOADING) && !held(&entry.path()) {
            return Err("a process died loading it".into());
        }
    }
    Ok(())
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
        let marker = dir.join(format!("{LOADING}{}", run_token()));
        std::fs::write(&marker, b"").map_err(|e| e.to_string())?;
        let lock = hold(&marker).map_err(|e| format!("locking {}: {e}", marker.display()))?;
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
