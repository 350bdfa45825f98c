//! Writes: a document's way in (chunked and embedded by
//! [`Corpus::prepare`] outside any lock, then written by [`Corpus::commit`]
//! under its collection's lock: the store's transaction first, then the
//! indexes), deletes, and collections made and removed, within the
//! tenant's quotas. Every write moves the corpus version, so no cached
//! answer from before it is served.

use super::engine::Change;
use super::{Corpus, CorpusError, Ingested, Quotas};
use crate::blocking::CancelOnDrop;
use ragtime_core::{Cancel, Chunk, IngestDoc, Tenant};
use ragtime_store::{
    Created, Dropped, JobStep, Limits, NewChunk, NewDocument, StoreError, Upsert, WriteReceipt,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// A document on its way in: its chunks and their vectors, unless its
/// content is what the store already holds.
struct PendingDoc {
    doc: IngestDoc,
    metadata: String,
    hash: String,
    unchanged: bool,
    pieces: Vec<ragtime_embed::TextChunk>,
    vectors: Vec<Vec<f32>>,
}

impl PendingDoc {
    /// The document as the store takes it (its vectors moved out).
    fn new_document(&mut self) -> NewDocument {
        let vectors = std::mem::take(&mut self.vectors);
        let chunks = self.pieces.iter().zip(vectors).enumerate();
        NewDocument {
            external_id: self.doc.id.clone(),
            title: self.doc.title.clone(),
            metadata: self.metadata.clone(),
            content_hash: self.hash.clone(),
            chunks: chunks
                .map(|(i, (c, embedding))| NewChunk {
                    position: i as i32,
                    section: self.doc.section_at(c.anchor).to_owned(),
                    text: c.text.clone(),
                    tokens: c.tokens as i32,
                    embedding,
                })
                .collect(),
        }
    }
}

/// The limits a write by `owner` runs under.
fn limits(owner: &str, q: Quotas) -> Limits<'_> {
    Limits {
        owner,
        max_collections: q.max_collections,
        max_documents: q.max_documents,
        max_chunks: q.max_chunks,
    }
}

/// A written document's chunks, with their vectors, as the indexes take them.
fn index_entries(
    doc: IngestDoc,
    receipt: &WriteReceipt,
    new: NewDocument,
) -> Vec<(Chunk, Vec<f32>)> {
    let meta = Arc::new(Value::Object(doc.metadata));
    receipt
        .chunk_ids
        .iter()
        .zip(new.chunks)
        .map(|(id, c)| {
            let chunk = Chunk {
                chunk_id: *id,
                document_id: receipt.document_id,
                external_id: doc.id.clone(),
                position: c.position,
                title: doc.title.clone(),
                section: c.section,
                metadata: meta.clone(),
                text: c.text,
            };
            (chunk, c.embedding)
        })
        .collect()
}

/// Documents chunked and embedded by [`Corpus::prepare`], not yet written.
pub struct Prepared {
    collection: String,
    coll_id: i64,
    pending: Vec<PendingDoc>,
    job: Option<JobStep>,
}

impl Prepared {
    /// Counts these documents as `step` of a job, in their transaction.
    pub fn for_job(mut self, step: JobStep) -> Self {
        self.job = Some(step);
        self
    }
}

/// The chunking rules' version, part of the content hash: a document
/// stored under older rules is chunked and embedded again on its next
/// ingest.
const CHUNKING: &str = "s2";

/// The first 16 hex digits of the SHA-256 of `parts`, each ended by 0xff
/// (which no UTF-8 text holds), so the parts cannot run into each other.
fn digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0xff]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The text embedded for a chunk: where it stands (its document's title
/// and section path), then the chunk.
fn embed_text(title: &str, section: &str, chunk: &str) -> String {
    let at = ragtime_core::heading_of(title, section);
    if at.is_empty() {
        chunk.to_owned()
    } else {
        format!("{at}\n{chunk}")
    }
}

impl Corpus {
    /// The quotas `tenant` writes under — its own where the admin set them,
    /// the configured ones otherwise — and whether it has its own.
    pub async fn quotas_of(&self, tenant: &Tenant) -> Result<(Quotas, bool), CorpusError> {
        let own = self.store.tenant_quota(tenant.name()).await?;
        let (o, d) = (own.unwrap_or_default(), self.quotas);
        let quotas = Quotas {
            max_collections: o.max_collections.unwrap_or(d.max_collections),
            max_documents: o.max_documents.unwrap_or(d.max_documents),
            max_chunks: o.max_chunks.unwrap_or(d.max_chunks),
        };
        Ok((quotas, own.is_some()))
    }

    /// The owner prefix and quotas a write to stored collection `name` runs
    /// under.
    async fn limits_of(&self, name: &str) -> Result<(String, Quotas), CorpusError> {
        let (tenant, _) = Tenant::of_collection(name);
        Ok((tenant.collection_prefix(), self.quotas_of(&tenant).await?.0))
    }

    /// Creates a collection; `Created::Existing` when it was there already.
    /// Refused past its tenant's `max_collections`.
    pub async fn create_collection(
        &self,
        name: &str,
        description: &str,
    ) -> Result<Created, CorpusError> {
        let (owner, q) = self.limits_of(name).await?;
        let _w = self.shared.lock_collection(name).await;
        let limits = limits(&owner, q);
        Ok(self
            .store
            .create_collection(name, description, Some(limits))
            .await?)
    }

    /// Removes a collection: its documents, chunks and indexes; cached
    /// answers go with the corpus version. `None` if there was none.
    pub async fn drop_collection(&self, name: &str) -> Result<Option<Dropped>, CorpusError> {
        let _w = self.shared.lock_collection(name).await;
        let Some(id) = self.store.collection_id(name).await? else {
            return Ok(None);
        };
        let dropped = self.store.drop_collection(id).await?;
        if let Some(d) = &dropped {
            self.engine.dropped(name, id, d.version);
            self.shared.advance(d.version);
        }
        Ok(dropped)
    }

    /// Ingests documents into `collection` (created if missing):
    /// [`Corpus::prepare`] then [`Corpus::commit`]. Only the commit is serialised
    /// with other writes, so concurrent ingests embed while another commits.
    pub async fn ingest(
        &self,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<Vec<Ingested>, CorpusError> {
        let prepared = self.prepare(collection, docs).await?;
        self.commit(prepared).await
    }

    /// Ingests a sequence of batches in order, preparing (chunking and
    /// embedding) the next batch while the previous one commits, so the
    /// embedding threads rarely wait for the store and the indexes.
    /// `done` sees each batch's outcome as it is committed.
    pub async fn ingest_batches(
        &self,
        collection: &str,
        batches: impl IntoIterator<Item = Vec<IngestDoc>>,
        mut done: impl FnMut(Vec<Ingested>),
    ) -> Result<(), CorpusError> {
        let mut previous: Option<Prepared> = None;
        let coll_id = self.target(collection).await?;
        for batch in batches {
            let next = self.prepare_into(collection, coll_id, batch);
            let next = match previous.take() {
                Some(p) => {
                    let (next, committed) = tokio::join!(next, self.commit(p));
                    done(committed?);
                    next?
                }
                None => next.await?,
            };
            previous = Some(next);
        }
        if let Some(p) = previous {
            done(self.commit(p).await?);
        }
        Ok(())
    }

    /// How many chunks `doc` makes (what a job counts before it starts).
    pub fn count_chunks(&self, doc: &IngestDoc) -> usize {
        let starts: Vec<usize> = doc.sections.iter().map(|s| s.start).collect();
        self.chunker.chunk_sections(&doc.text, &starts).len()
    }

    fn content_hash(&self, doc: &IngestDoc, metadata: &str) -> String {
        let sections: String = doc
            .sections
            .iter()
            .map(|s| format!("{}:{}\n", s.start, s.path))
            .collect();
        format!(
            "{}-{}-{}-{CHUNKING}",
            digest(&[
                doc.title.as_bytes(),
                doc.text.as_bytes(),
                metadata.as_bytes(),
                sections.as_bytes(),
            ]),
            self.params.max_tokens,
            self.params.overlap
        )
    }

    /// Chunks and embeds (all chunks of the request together, in full
    /// batches) every document whose content differs from the stored one.
    /// Writes nothing but the collection's name.
    pub async fn prepare(
        &self,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<Prepared, CorpusError> {
        let coll_id = self.target(collection).await?;
        self.prepare_into(collection, coll_id, docs).await
    }

    /// The id of the collection an ingest writes to, created if missing.
    /// A write that spans several transactions (a job, pipelined batches)
    /// takes it once: if the collection is removed meanwhile, its later
    /// batches fail as [`CorpusError::UnknownCollection`] instead of
    /// making it again.
    pub async fn target(&self, collection: &str) -> Result<i64, CorpusError> {
        // Every write, creating a collection too, happens under the write
        // lock (SQLite allows one writer; a second would see it busy).
        Ok(match self.store.collection_id(collection).await? {
            Some(id) => id,
            None => self.create_collection(collection, "").await?.id(),
        })
    }

    /// [`Corpus::prepare`] for the collection [`Corpus::target`] answered.
    pub async fn prepare_into(
        &self,
        collection: &str,
        coll_id: i64,
        docs: Vec<IngestDoc>,
    ) -> Result<Prepared, CorpusError> {
        let mut pending = Vec::with_capacity(docs.len());
        for doc in docs {
            let metadata = Value::Object(doc.metadata.clone()).to_string();
            let hash = self.content_hash(&doc, &metadata);
            let unchanged =
                self.store.content_hash(coll_id, &doc.id).await?.as_deref() == Some(hash.as_str());
            pending.push(PendingDoc {
                doc,
                metadata,
                hash,
                unchanged,
                pieces: Vec::new(),
                vectors: Vec::new(),
            });
        }
        self.embed_pending(pending.iter_mut().filter(|p| !p.unchanged))
            .await?;
        Ok(Prepared {
            collection: collection.to_owned(),
            coll_id,
            pending,
            job: None,
        })
    }

    async fn embed_pending(
        &self,
        docs: impl Iterator<Item = &mut PendingDoc>,
    ) -> Result<(), CorpusError> {
        let mut docs: Vec<&mut PendingDoc> = docs.collect();
        for p in docs.iter_mut() {
            let starts: Vec<usize> = p.doc.sections.iter().map(|s| s.start).collect();
            p.pieces =
                tokio::task::block_in_place(|| self.chunker.chunk_sections(&p.doc.text, &starts));
        }
        let texts: Vec<String> = docs
            .iter()
            .flat_map(|p| {
                p.pieces
                    .iter()
                    .map(|c| embed_text(&p.doc.title, p.doc.section_at(c.anchor), &c.text))
            })
            .collect();
        // Dropped with this future (the client went away): the embedding
        // workers stop at their next batch instead of finishing it.
        let cancel = Cancel::new();
        let _stop = CancelOnDrop::new(cancel.clone());
        let mut vectors = self
            .embedder
            .embed_passages(texts, cancel)
            .await
            .map_err(CorpusError::Embed)?
            .into_iter();
        for p in docs {
            p.vectors = vectors.by_ref().take(p.pieces.len()).collect();
        }
        Ok(())
    }

    /// Commits prepared documents to the store in one transaction, then to
    /// the indexes (a write is acknowledged once durable). Commits are
    /// serialised; a document found unchanged while preparing is checked
    /// again here, and embedded now if another write changed it since.
    pub async fn commit(&self, prepared: Prepared) -> Result<Vec<Ingested>, CorpusError> {
        let (owner, quotas) = self.limits_of(&prepared.collection).await?;
        let _w = self.shared.lock_collection(&prepared.collection).await;
        let Prepared {
            collection,
            coll_id,
            mut pending,
            job,
        } = prepared;
        // Removed (here or by another replica) since it was prepared, or
        // removed and made again: the write was for a collection that is
        // gone, and neither makes it again nor lands in the new one.
        let gone = || CorpusError::UnknownCollection(collection.clone());
        if self.store.collection_id(&collection).await? != Some(coll_id) {
            return Err(gone());
        }
        self.engine.before_write(&collection, coll_id).await?;
        let mut changed_since = Vec::new();
        for p in pending.iter_mut().filter(|p| p.unchanged) {
            let stored = self.store.content_hash(coll_id, &p.doc.id).await?;
            if stored.as_deref() != Some(p.hash.as_str()) {
                p.unchanged = false;
                changed_since.push(p);
            }
        }
        self.embed_pending(changed_since.into_iter()).await?;
        let new_docs: Vec<NewDocument> = pending
            .iter_mut()
            .filter(|p| !p.unchanged)
            .map(PendingDoc::new_document)
            .collect();
        let receipts = match self
            .store
            .upsert_documents(
                coll_id,
                &new_docs,
                Some(limits(&owner, quotas)),
                job.as_ref(),
            )
            .await
        {
            Err(StoreError::CollectionGone(_)) => {
                // Removed by another replica after the look above: the
                // follower drops its indexes when it passes the removal.
                return Err(gone());
            }
            r => r?,
        };
        // Durable from here on; the indexes follow the store.
        let version = receipts.iter().map(|r| r.version).max();
        let mut out = Vec::with_capacity(pending.len());
        let mut change = Change::default();
        let mut receipts = receipts.into_iter().zip(new_docs);
        for PendingDoc { doc, unchanged, .. } in pending {
            if unchanged {
                // The write is durable: a failed read-back of an unchanged
                // document only makes the engine check it against the
                // store, never fails what committed.
                let stored = match self.store.get_document(coll_id, &doc.id).await {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(error = %e, id = %doc.id, "unchanged document not read back");
                        change.rebuild = true;
                        None
                    }
                };
                let chunks = stored.as_ref().map_or(&[][..], |d| &d.chunks[..]);
                // An unchanged document the engine lacks (an earlier
                // update of it failed) is repaired from the store.
                let ids: Vec<i64> = chunks.iter().map(|c| c.id).collect();
                change.rebuild |= self.engine.lacks_any(&collection, &ids);
                out.push(Ingested {
                    id: doc.id,
                    status: Upsert::Unchanged,
                    chunks: stored.map_or(0, |d| d.chunks.len()),
                });
                continue;
            }
            let Some((receipt, new)) = receipts.next() else {
                break;
            };
            change.removed.extend_from_slice(&receipt.removed_chunk_ids);
            change.entries.push(receipt.version);
            out.push(Ingested {
                id: doc.id.clone(),
                status: receipt.upsert,
                chunks: receipt.chunk_ids.len(),
            });
            change.added.extend(index_entries(doc, &receipt, new));
        }
        self.engine.written(&collection, change);
        if let Some(v) = version {
            self.shared.advance(v);
        }
        Ok(out)
    }

    /// Deletes a document; `false` if there was none.
    pub async fn delete(&self, collection: &str, id: &str) -> Result<bool, CorpusError> {
        let _w = self.shared.lock_collection(collection).await;
        let Some(coll_id) = self.store.collection_id(collection).await? else {
            return Err(CorpusError::UnknownCollection(collection.to_owned()));
        };
        let receipt = match self.store.delete_document(coll_id, id).await {
            // Removed by another replica since the look above.
            Err(StoreError::CollectionGone(_)) => {
                return Err(CorpusError::UnknownCollection(collection.to_owned()));
            }
            r => r?,
        };
        let Some(receipt) = receipt else {
            return Ok(false);
        };
        self.engine.written(
            collection,
            Change {
                removed: receipt.removed_chunk_ids,
                entries: vec![receipt.version],
                ..Change::default()
            },
        );
        self.shared.advance(receipt.version);
        Ok(true)
    }
}
