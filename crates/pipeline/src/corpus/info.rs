//! What collections hold, for listing and statistics: the store's kept
//! counts and the loaded indexes' memory.

use super::{Corpus, CorpusError, IndexBytes};
use ragtime_store::CollectionRecord;

/// A collection as `GET /v1/collections` shows it.
#[derive(Debug, Clone)]
pub struct CollectionInfo {
    pub record: CollectionRecord,
    /// What its indexes take, when they are loaded.
    pub index_bytes: Option<IndexBytes>,
}

impl Corpus {
    /// What every collection holds together, how many are loaded and the
    /// memory their indexes take (from the stored counts and the loaded
    /// indexes, without listing collections).
    pub async fn totals(&self) -> Result<(ragtime_store::Usage, usize, IndexBytes), CorpusError> {
        let usage = self.store.total_usage().await?;
        let status = self.engine.status();
        Ok((usage, status.loaded, status.bytes))
    }

    /// One collection by its stored name, with its index memory.
    pub async fn collection_info(&self, name: &str) -> Result<Option<CollectionInfo>, CorpusError> {
        Ok(self
            .store
            .collection(name)
            .await?
            .map(|record| CollectionInfo {
                index_bytes: self.engine.index_bytes(name),
                record,
            }))
    }

    /// An owner's collections (every one for `None`) with their index memory.
    pub async fn collections(
        &self,
        owner: Option<&str>,
    ) -> Result<Vec<CollectionInfo>, CorpusError> {
        let records = self.store.list_collections(owner).await?;
        Ok(records
            .into_iter()
            .map(|record| CollectionInfo {
                index_bytes: self.engine.index_bytes(&record.name),
                record,
            })
            .collect())
    }
}
