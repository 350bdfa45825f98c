//! The retrieval engine: the store, the embedding service and the indexes
//! together. Ingestion writes the store first (the write is acknowledged
//! only once committed) and then the in-memory indexes, which are rebuilt
//! from the store on start, so a crash loses nothing acknowledged and
//! leaves no half-indexed document.

use ragtime_core::{Cancel, StageError};
use ragtime_embed::{Chunker, EmbedService};
use ragtime_retrieve::{ChunkEntry, CollectionIndex, IndexError, Indexes};
use ragtime_store::{NewChunk, NewDocument, Store, StoreError, Upsert};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RagError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Index(#[from] IndexError),
    #[error("embedding: {0}")]
    Embed(StageError),
    #[error("unknown collection {0:?}")]
    UnknownCollection(String),
}

/// A document as a client sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestDoc {
    pub id: String,
    pub title: String,
    pub text: String,
    pub metadata: Map<String, Value>,
}

/// What happened to one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ingested {
    pub id: String,
    pub status: Upsert,
    pub chunks: usize,
}

/// Chunking settings (they are part of the content hash, so changing them
/// re-embeds documents on their next ingest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub max_tokens: usize,
    pub overlap: usize,
}

pub struct Rag {
    pub store: Store,
    pub embedder: Arc<EmbedService>,
    pub indexes: Indexes,
    chunker: Chunker,
    params: ChunkParams,
    /// One writer at a time per process: store and index change together.
    write_lock: tokio::sync::Mutex<()>,
    /// The corpus version the indexes reflect (the ingest log's last id):
    /// cached answers are only reused within one version.
    version: std::sync::atomic::AtomicI64,
}

/// FNV-1a, 64 bit: stable across versions and platforms.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The text embedded for a chunk: its document's title, then the chunk.
fn embed_text(title: &str, chunk: &str) -> String {
    if title.is_empty() {
        chunk.to_owned()
    } else {
        format!("{title}\n{chunk}")
    }
}

impl Rag {
    pub fn new(store: Store, embedder: Arc<EmbedService>, params: ChunkParams) -> Self {
        let chunker = embedder.model().chunker(params.max_tokens, params.overlap);
        let indexes = Indexes::new(embedder.dim(), ragtime_retrieve::DenseParams::default());
        Self {
            store,
            embedder,
            indexes,
            chunker,
            params,
            write_lock: tokio::sync::Mutex::new(()),
            version: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The corpus version the indexes reflect; it changes with every
    /// ingest or delete that changed something.
    pub fn version(&self) -> i64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    fn advance(&self, version: i64) {
        self.version
            .fetch_max(version, std::sync::atomic::Ordering::AcqRel);
    }

    /// Rebuilds every index from the store. Returns the chunks indexed.
    pub async fn rebuild(&self) -> Result<usize, RagError> {
        let _w = self.write_lock.lock().await;
        let version = self.store.corpus_version().await?;
        let chunks = self.store.index_chunks().await?;
        let n = chunks.len();
        let mut by_collection: HashMap<String, Vec<(ChunkEntry, Vec<f32>)>> = HashMap::new();
        for c in chunks {
            let metadata =
                Arc::new(serde_json::from_str(&c.metadata).unwrap_or(Value::Object(Map::new())));
            by_collection.entry(c.collection).or_default().push((
                ChunkEntry {
                    chunk_id: c.chunk_id,
                    document_id: c.document_id,
                    external_id: c.external_id,
                    position: c.position,
                    title: c.title,
                    metadata,
                    text: c.text,
                },
                c.embedding,
            ));
        }
        for (name, items) in by_collection {
            let idx = self.indexes.get_or_create(&name)?;
            tokio::task::block_in_place(|| idx.add(items))?;
        }
        self.advance(version);
        Ok(n)
    }

    /// The index of an existing collection (404 material when missing).
    pub async fn collection(&self, name: &str) -> Result<Arc<CollectionIndex>, RagError> {
        if let Some(idx) = self.indexes.get(name) {
            return Ok(idx);
        }
        match self.store.collection_id(name).await? {
            Some(_) => Ok(self.indexes.get_or_create(name)?),
            None => Err(RagError::UnknownCollection(name.to_owned())),
        }
    }

    /// Ingests documents into `collection` (created if missing). All
    /// chunks of the request are embedded together (full batches), then
    /// every changed document is committed to the store in one transaction
    /// before any of them is indexed. Identical content is neither
    /// re-embedded nor rewritten.
    pub async fn ingest(
        &self,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<Vec<Ingested>, RagError> {
        let _w = self.write_lock.lock().await;
        let coll_id = self.store.ensure_collection(collection).await?;
        let index = self.indexes.get_or_create(collection)?;
        // 1. Skip unchanged documents; chunk the rest.
        let mut pending = Vec::with_capacity(docs.len());
        for doc in docs {
            let metadata = Value::Object(doc.metadata.clone()).to_string();
            let hash = format!(
                "{:016x}-{}-{}",
                fnv1a(&[
                    doc.title.as_bytes(),
                    doc.text.as_bytes(),
                    metadata.as_bytes()
                ]),
                self.params.max_tokens,
                self.params.overlap
            );
            let unchanged =
                self.store.content_hash(coll_id, &doc.id).await?.as_deref() == Some(hash.as_str());
            let pieces = if unchanged {
                Vec::new()
            } else {
                tokio::task::block_in_place(|| self.chunker.chunk(&doc.text))
            };
            pending.push((doc, metadata, hash, unchanged, pieces));
        }
        // 2. One embedding call for every new chunk (batched by the service).
        let texts: Vec<String> = pending
            .iter()
            .flat_map(|(d, _, _, _, pieces)| pieces.iter().map(|p| embed_text(&d.title, &p.text)))
            .collect();
        let mut vectors = self
            .embedder
            .embed(texts, Cancel::new())
            .await
            .map_err(RagError::Embed)?
            .into_iter();
        // 3. Commit every changed document at once.
        let mut new_docs = Vec::new();
        for (doc, metadata, hash, unchanged, pieces) in &pending {
            if *unchanged {
                continue;
            }
            new_docs.push(NewDocument {
                external_id: doc.id.clone(),
                title: doc.title.clone(),
                metadata: metadata.clone(),
                content_hash: hash.clone(),
                chunks: pieces
                    .iter()
                    .enumerate()
                    .map(|(i, p)| NewChunk {
                        position: i as i32,
                        text: p.text.clone(),
                        tokens: p.tokens as i32,
                        embedding: vectors.next().unwrap_or_default(),
                    })
                    .collect(),
            });
        }
        let receipts = self.store.upsert_documents(coll_id, &new_docs).await?;
        let versions: Vec<i64> = receipts.iter().map(|r| r.version).collect();
        // 4. Durable from here on; the indexes follow the store.
        let mut removed = Vec::new();
        let mut items = Vec::new();
        let mut receipts = receipts.into_iter().zip(new_docs);
        let mut out = Vec::with_capacity(pending.len());
        for (doc, _, _, unchanged, _) in pending {
            if unchanged {
                let n = self
                    .store
                    .get_document(coll_id, &doc.id)
                    .await?
                    .map_or(0, |d| d.chunks.len());
                out.push(Ingested {
                    id: doc.id,
                    status: Upsert::Unchanged,
                    chunks: n,
                });
                continue;
            }
            let Some((receipt, new)) = receipts.next() else {
                break;
            };
            removed.extend_from_slice(&receipt.removed_chunk_ids);
            let meta = Arc::new(Value::Object(doc.metadata));
            for (id, c) in receipt.chunk_ids.iter().zip(new.chunks) {
                items.push((
                    ChunkEntry {
                        chunk_id: *id,
                        document_id: receipt.document_id,
                        external_id: doc.id.clone(),
                        position: c.position,
                        title: doc.title.clone(),
                        metadata: meta.clone(),
                        text: c.text,
                    },
                    c.embedding,
                ));
            }
            out.push(Ingested {
                id: doc.id,
                status: receipt.upsert,
                chunks: receipt.chunk_ids.len(),
            });
        }
        // A document listed twice replaces its own first version.
        let gone: std::collections::HashSet<i64> = removed.iter().copied().collect();
        items.retain(|(c, _)| !gone.contains(&c.chunk_id));
        tokio::task::block_in_place(|| {
            index.remove(&removed)?;
            index.add(items)
        })?;
        if let Some(v) = versions.into_iter().max() {
            self.advance(v);
        }
        Ok(out)
    }

    /// Deletes a document; `false` if there was none.
    pub async fn delete(&self, collection: &str, id: &str) -> Result<bool, RagError> {
        let _w = self.write_lock.lock().await;
        let Some(coll_id) = self.store.collection_id(collection).await? else {
            return Err(RagError::UnknownCollection(collection.to_owned()));
        };
        let Some(receipt) = self.store.delete_document(coll_id, id).await? else {
            return Ok(false);
        };
        if let Some(index) = self.indexes.get(collection) {
            index.remove(&receipt.removed_chunk_ids)?;
        }
        self.advance(receipt.version);
        Ok(true)
    }
}
