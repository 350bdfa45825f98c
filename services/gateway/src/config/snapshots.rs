//! `[snapshots]`: loaded collections' indexes saved on local disk.

use serde::{Deserialize, Serialize};

/// Collections' indexes saved in `data_dir/indexes` (`[snapshots]`), so
/// a start reads them instead of rebuilding the HNSW graph from the store
/// (then replays the store's changes made after the save).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotsConfig {
    pub enabled: bool,
    /// Collections with fewer chunks load from the store and are not saved.
    pub min_chunks: usize,
    /// A loaded collection that changed is saved again after this many
    /// seconds (a save holds up ingests while it writes).
    pub every_s: u64,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_chunks: 10_000,
            every_s: 300,
        }
    }
}
