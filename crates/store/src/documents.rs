//! Documents, chunks and the ingest log. One SQL text serves both databases
//! (`$N` placeholders work in SQLite and PostgreSQL alike); the `on_pool!`
//! macro runs it on whichever pool the store holds.

use crate::collections::{Limits, usage_of, usage_query};
use crate::jobs::JobStep;
use crate::standbys::Read;
use crate::{BeginWrite, WriteLocks};
use crate::{Pool, Store, StoreError, now_ms};

/// A chunk to store with its document.
#[derive(Debug, Clone, PartialEq)]
pub struct NewChunk {
    pub position: i32,
    /// The section path of the chunk's first line ("" when none).
    pub section: String,
    pub text: String,
    pub tokens: i32,
    pub embedding: Vec<f32>,
}

/// A document to store (insert or replace by `external_id`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewDocument {
    pub external_id: String,
    pub title: String,
    /// Metadata as a JSON object's text.
    pub metadata: String,
    pub content_hash: String,
    pub chunks: Vec<NewChunk>,
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Created,
    Replaced,
    /// Same content hash, title and metadata: nothing was written.
    Unchanged,
}

/// The result of a committed write: durable once returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteReceipt {
    pub upsert: Upsert,
    pub document_id: i64,
    /// Ids of the chunks now stored for the document, by position.
    pub chunk_ids: Vec<i64>,
    /// Ids of the chunks the write removed (the old version).
    pub removed_chunk_ids: Vec<i64>,
    /// The corpus version after the write (the ingest log's last id).
    pub version: i64,
}

/// A stored document without its chunks' embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentRecord {
    pub id: i64,
    pub collection: String,
    pub external_id: String,
    pub title: String,
    pub metadata: String,
    pub content_hash: String,
    pub updated_ms: i64,
    pub chunks: Vec<ChunkRecord>,
}

/// One line of a collection's document list.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DocumentSummary {
    pub external_id: String,
    pub title: String,
    pub updated_ms: i64,
    pub chunks: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChunkRecord {
    pub id: i64,
    pub position: i32,
    pub section: String,
    pub text: String,
    pub tokens: i32,
}

/// A chunk with everything an index needs.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexChunk {
    pub chunk_id: i64,
    pub document_id: i64,
    pub collection: String,
    pub external_id: String,
    pub position: i32,
    pub title: String,
    pub section: String,
    pub metadata: String,
    pub text: String,
    pub embedding: Vec<f32>,
}

/// A change in the ingest log (its id is the corpus version after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub id: i64,
    pub collection_id: i64,
    /// The document's id ("" for collection changes).
    pub external_id: String,
    /// `upsert`, `delete`, `create_collection` or `drop_collection`.
    pub op: String,
    /// When it was written (ms since the epoch).
    pub at_ms: i64,
}

/// The change log's columns, as [`LogRow`] reads them.
const LOG_SELECT: &str = "SELECT id, collection_id, external_id, op, at_ms FROM ingest_log";
type LogRow = (i64, i64, String, String, i64);

fn log_entry((id, collection_id, external_id, op, at_ms): LogRow) -> LogEntry {
    LogEntry {
        id,
        collection_id,
        external_id,
        op,
        at_ms,
    }
}

/// f32 little-endian bytes.
pub fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn decode_vector(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

const INSERT_CHUNK: &str = "INSERT INTO chunks (document_id, position, section, text, tokens, embedding) \
     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id";
const INSERT_CHUNK_DENSE: &str = "INSERT INTO chunks (document_id, position, section, text, tokens, embedding, dense) \
     VALUES ($1, $2, $3, $4, $5, $6, $7::halfvec) RETURNING id";

type DocRow = (i64, String, String, String, String, i64);
/// A chunk as a document read returns it: id, position, section, text, tokens.
type ReadChunkRow = (i64, i32, String, String, i32);
type IndexRow = (
    i64,
    i64,
    String,
    String,
    i32,
    String,
    String,
    String,
    String,
    Vec<u8>,
);

const INDEX_SELECT: &str = "SELECT c.id, d.id, col.name, d.external_id, c.position, d.title, c.section, d.metadata, c.text, c.embedding \
     FROM chunks c JOIN documents d ON d.id = c.document_id JOIN collections col ON col.id = d.collection_id";

fn to_index(r: IndexRow) -> IndexChunk {
    IndexChunk {
        chunk_id: r.0,
        document_id: r.1,
        collection: r.2,
        external_id: r.3,
        position: r.4,
        title: r.5,
        section: r.6,
        metadata: r.7,
        text: r.8,
        embedding: decode_vector(&r.9),
    }
}

impl Store {
    /// The id of collection `name`, if it exists.
    pub async fn collection_id(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let q = "SELECT id FROM collections WHERE name = $1";
        Ok(on_pool!(self, p => sqlx::query_scalar(q).bind(name).fetch_optional(p).await?))
    }

    /// Creates collection `name` if missing; returns its id.
    pub async fn ensure_collection(&self, name: &str) -> Result<i64, StoreError> {
        Ok(self.create_collection(name, "", None).await?.id())
    }

    /// The stored content hash of a document, to skip re-embedding
    /// identical content.
    pub async fn content_hash(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Option<String>, StoreError> {
        let q = "SELECT content_hash FROM documents WHERE collection_id = $1 AND external_id = $2";
        Ok(
            on_pool!(self, p => sqlx::query_scalar(q).bind(collection_id).bind(external_id).fetch_optional(p).await?),
        )
    }

    /// The corpus version: the id of the last ingest-log entry (0 if none).
    pub async fn corpus_version(&self) -> Result<i64, StoreError> {
        fail::fail_point!("store::corpus_version", |_| Err(
            sqlx::Error::PoolClosed.into()
        ));
        let q = "SELECT COALESCE(MAX(id), 0) FROM ingest_log";
        Ok(on_pool!(self, p => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await?))
    }

    /// Inserts or replaces a document and its chunks in one transaction.
    /// When it returns, the write is committed (durable).
    pub async fn upsert_document(
        &self,
        collection_id: i64,
        doc: &NewDocument,
    ) -> Result<WriteReceipt, StoreError> {
        let mut r = self
            .upsert_documents(collection_id, std::slice::from_ref(doc), None, None)
            .await?;
        r.pop()
            .ok_or_else(|| StoreError::Url("upsert returned nothing".into()))
    }

    /// Inserts or replaces documents in one transaction (one commit, one
    /// fsync). When it returns, every write is committed (durable). With
    /// `limits`, a write that would leave the owner over a quota is rolled
    /// back whole ([`StoreError::QuotaExceeded`]).
    pub async fn upsert_documents(
        &self,
        collection_id: i64,
        docs: &[NewDocument],
        limits: Option<Limits<'_>>,
        job: Option<&JobStep>,
    ) -> Result<Vec<WriteReceipt>, StoreError> {
        // With the database engine: its document words, and its vectors.
        let document_words = self.document_text_sql();
        let in_database = document_words.is_some();
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            if let Some(limits) = &limits {
                tx.lock_owner(limits.owner).await?;
            }
            if !lock_collection_row!(tx, collection_id) {
                tx.rollback().await?;
                return Err(StoreError::CollectionGone(collection_id));
            }
            let mut receipts = Vec::with_capacity(docs.len());
            // Change-log entries (receipt, document, chunks), written last.
            let mut log: Vec<(usize, &str, usize)> = Vec::new();
            let mut wrote = false;
            // What the collection's counters move by.
            let (mut more_docs, mut more_chunks) = (0i64, 0i64);
            for doc in docs {
                let existing: Option<(i64, String, String, String)> = sqlx::query_as(
                    "SELECT id, content_hash, title, metadata FROM documents WHERE collection_id = $1 AND external_id = $2",
                )
                .bind(collection_id)
                .bind(&doc.external_id)
                .fetch_optional(&mut *tx)
                .await?;
                let (upsert, document_id, removed) = match existing {
                    Some((id, hash, title, meta)) if hash == doc.content_hash && title == doc.title && meta == doc.metadata => {
                        let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM chunks WHERE document_id = $1 ORDER BY position")
                            .bind(id)
                            .fetch_all(&mut *tx)
                            .await?;
                        receipts.push(WriteReceipt { upsert: Upsert::Unchanged, document_id: id, chunk_ids: ids, removed_chunk_ids: vec![], version: 0 });
                        continue;
                    }
                    Some((id, _, _, _)) => {
                        let removed: Vec<i64> = sqlx::query_scalar("SELECT id FROM chunks WHERE document_id = $1 ORDER BY position")
                            .bind(id)
                            .fetch_all(&mut *tx)
                            .await?;
                        sqlx::query("DELETE FROM chunks WHERE document_id = $1").bind(id).execute(&mut *tx).await?;
                        sqlx::query("UPDATE documents SET title = $1, metadata = $2, content_hash = $3, updated_ms = $4 WHERE id = $5")
                            .bind(&doc.title)
                            .bind(&doc.metadata)
                            .bind(&doc.content_hash)
                            .bind(now_ms())
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                        (Upsert::Replaced, id, removed)
                    }
                    None => {
                        let id: i64 = sqlx::query_scalar(
                            "INSERT INTO documents (collection_id, external_id, title, metadata, content_hash, updated_ms) \
                             VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                        )
                        .bind(collection_id)
                        .bind(&doc.external_id)
                        .bind(&doc.title)
                        .bind(&doc.metadata)
                        .bind(&doc.content_hash)
                        .bind(now_ms())
                        .fetch_one(&mut *tx)
                        .await?;
                        more_docs += 1;
                        (Upsert::Created, id, vec![])
                    }
                };
                more_chunks += doc.chunks.len() as i64 - removed.len() as i64;
                let mut chunk_ids = Vec::with_capacity(doc.chunks.len());
                // With the database engine, the vector in its own column too.
                let insert = if in_database { INSERT_CHUNK_DENSE } else { INSERT_CHUNK };
                for c in &doc.chunks {
                    let mut q = sqlx::query_scalar(insert)
                        .bind(document_id)
                        .bind(c.position)
                        .bind(&c.section)
                        .bind(&c.text)
                        .bind(c.tokens)
                        .bind(encode_vector(&c.embedding));
                    if in_database {
                        q = q.bind(crate::search::vector_text(&c.embedding));
                    }
                    let id: i64 = q.fetch_one(&mut *tx).await?;
                    chunk_ids.push(id);
                }
                if let Some(words) = document_words {
                    sqlx::query(words).bind(document_id).execute(&mut *tx).await?;
                }
                wrote = true;
                log.push((receipts.len(), &doc.external_id, chunk_ids.len()));
                receipts.push(WriteReceipt { upsert, document_id, chunk_ids, removed_chunk_ids: removed, version: 0 });
            }
            if wrote {
                sqlx::query("UPDATE collections SET documents = documents + $1, chunks = chunks + $2 WHERE id = $3")
                    .bind(more_docs)
                    .bind(more_chunks)
                    .bind(collection_id)
                    .execute(&mut *tx)
                    .await?;
                if let Some(limits) = limits
                    && (more_docs > 0 || more_chunks > 0)
                {
                    let row = sqlx::query_as(&usage_query()).bind(limits.owner).fetch_one(&mut *tx).await?;
                    if let Err(e) = limits.check_contents(usage_of(row)) {
                        tx.rollback().await?;
                        return Err(e);
                    }
                }
            }
            if let Some(step) = job {
                let count = |u: Upsert| receipts.iter().filter(|r| r.upsert == u).count() as i64;
                let (created, replaced) = (count(Upsert::Created), count(Upsert::Replaced));
                let written: usize = receipts
                    .iter()
                    .filter(|r| r.upsert != Upsert::Unchanged)
                    .map(|r| r.chunk_ids.len())
                    .sum();
                sqlx::query(crate::jobs::ADD_STEP)
                    .bind(step.documents)
                    .bind(step.chunks)
                    .bind(created)
                    .bind(replaced)
                    .bind(step.documents - created - replaced)
                    .bind(now_ms())
                    .bind(written as i64)
                    .bind(&step.id)
                    .execute(&mut *tx)
                    .await?;
            }
            if wrote {
                tx.lock_log().await?;
                for (i, external_id, chunks) in log {
                    receipts[i].version = sqlx::query_scalar(
                        "INSERT INTO ingest_log (collection_id, external_id, op, chunks, at_ms) VALUES ($1, $2, 'upsert', $3, $4) RETURNING id",
                    )
                    .bind(collection_id)
                    .bind(external_id)
                    .bind(i32::try_from(chunks).unwrap_or(i32::MAX))
                    .bind(now_ms())
                    .fetch_one(&mut *tx)
                    .await?;
                }
            }
            if wrote || job.is_some() {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            // Committed: what follows cannot fail the write.
            if wrote {
                self.note_write().await;
            }
            let version = match self.corpus_version().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "corpus version not read after a commit");
                    receipts.iter().map(|r| r.version).max().unwrap_or(0)
                }
            };
            for r in receipts.iter_mut().filter(|r| r.upsert == Upsert::Unchanged) {
                r.version = version;
            }
            Ok(receipts)
        })
    }

    /// Deletes a document and its chunks. `None` if there was no such
    /// document; [`StoreError::CollectionGone`] if there is no such
    /// collection (any more).
    pub async fn delete_document(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Option<WriteReceipt>, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            if !lock_collection_row!(tx, collection_id) {
                tx.rollback().await?;
                return Err(StoreError::CollectionGone(collection_id));
            }
            let id: Option<i64> = sqlx::query_scalar("SELECT id FROM documents WHERE collection_id = $1 AND external_id = $2")
                .bind(collection_id)
                .bind(external_id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(id) = id else {
                tx.rollback().await?;
                return Ok(None);
            };
            let removed: Vec<i64> = sqlx::query_scalar("SELECT id FROM chunks WHERE document_id = $1 ORDER BY position")
                .bind(id)
                .fetch_all(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM chunks WHERE document_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM documents WHERE id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("UPDATE collections SET documents = documents - 1, chunks = chunks - $1 WHERE id = $2")
                .bind(removed.len() as i64)
                .bind(collection_id)
                .execute(&mut *tx)
                .await?;
            tx.lock_log().await?;
            let version: i64 = sqlx::query_scalar(
                "INSERT INTO ingest_log (collection_id, external_id, op, chunks, at_ms) VALUES ($1, $2, 'delete', $3, $4) RETURNING id",
            )
            .bind(collection_id)
            .bind(external_id)
            .bind(i32::try_from(removed.len()).unwrap_or(i32::MAX))
            .bind(now_ms())
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            self.note_write().await;
            Ok(Some(WriteReceipt { upsert: Upsert::Replaced, document_id: id, chunk_ids: vec![], removed_chunk_ids: removed, version }))
        })
    }

    /// A document with its chunks (without embeddings).
    pub async fn get_document(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Option<DocumentRecord>, StoreError> {
        fail::fail_point!("store::get_document", |_| Err(
            sqlx::Error::PoolClosed.into()
        ));
        let q = "SELECT d.id, col.name, d.title, d.metadata, d.content_hash, d.updated_ms FROM documents d \
                 JOIN collections col ON col.id = d.collection_id WHERE d.collection_id = $1 AND d.external_id = $2";
        let q2 = "SELECT id, position, section, text, tokens FROM chunks WHERE document_id = $1 ORDER BY position";
        let found: Option<(DocRow, Vec<ReadChunkRow>)> = on_read_pool!(self, Read::Document, p => {
            let row: Option<DocRow> = sqlx::query_as(q)
                .bind(collection_id)
                .bind(external_id)
                .fetch_optional(p)
                .await?;
            match row {
                None => Ok(None),
                Some(row) => {
                    let chunks = sqlx::query_as(q2).bind(row.0).fetch_all(p).await?;
                    Ok(Some((row, chunks)))
                }
            }
        })?;
        let Some(((id, collection, title, metadata, content_hash, updated_ms), chunks)) = found
        else {
            return Ok(None);
        };
        Ok(Some(DocumentRecord {
            id,
            collection,
            external_id: external_id.to_owned(),
            title,
            metadata,
            content_hash,
            updated_ms,
            chunks: chunks
                .into_iter()
                .map(|(id, position, section, text, tokens)| ChunkRecord {
                    id,
                    position,
                    section,
                    text,
                    tokens,
                })
                .collect(),
        }))
    }

    /// A collection's documents in id order, the first `limit` after
    /// `after` (keyset paging: a page is the same however many documents
    /// were added before the cursor).
    pub async fn list_documents(
        &self,
        collection_id: i64,
        after: &str,
        limit: i64,
    ) -> Result<Vec<DocumentSummary>, StoreError> {
        let q = "SELECT d.external_id, d.title, d.updated_ms, \
                 (SELECT COUNT(*) FROM chunks c WHERE c.document_id = d.id) AS chunks \
                 FROM documents d WHERE d.collection_id = $1 AND d.external_id > $2 \
                 ORDER BY d.external_id LIMIT $3";
        on_read_pool!(self, Read::Document, p => {
            Ok(sqlx::query_as(q).bind(collection_id).bind(after).bind(limit).fetch_all(p).await?)
        })
    }

    /// One document's chunks as stored now, with their embeddings (none if
    /// it is gone), for applying a change to a loaded index.
    pub async fn document_index_chunks(
        &self,
        collection_id: i64,
        external_id: &str,
    ) -> Result<Vec<IndexChunk>, StoreError> {
        let q = format!(
            "{INDEX_SELECT} WHERE d.collection_id = $1 AND d.external_id = $2 ORDER BY c.position"
        );
        let rows: Vec<IndexRow> = on_pool!(self, p => sqlx::query_as(&q).bind(collection_id).bind(external_id).fetch_all(p).await?);
        Ok(rows.into_iter().map(to_index).collect())
    }

    /// Ingest-log entries after `after`, oldest first, at most `limit`.
    pub async fn log_since(&self, after: i64, limit: i64) -> Result<Vec<LogEntry>, StoreError> {
        let q = format!("{LOG_SELECT} WHERE id > $1 ORDER BY id LIMIT $2");
        let rows: Vec<LogRow> =
            on_pool!(self, p => sqlx::query_as(&q).bind(after).bind(limit).fetch_all(p).await?);
        Ok(rows.into_iter().map(log_entry).collect())
    }

    /// One collection's ingest-log entries after `after`, oldest first, at
    /// most `limit` (what a saved snapshot of it has not seen).
    pub async fn collection_log_since(
        &self,
        collection_id: i64,
        after: i64,
        limit: i64,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let q = format!("{LOG_SELECT} WHERE collection_id = $1 AND id > $2 ORDER BY id LIMIT $3");
        let rows: Vec<LogRow> = on_pool!(self, p => sqlx::query_as(&q).bind(collection_id).bind(after).bind(limit).fetch_all(p).await?);
        Ok(rows.into_iter().map(log_entry).collect())
    }

    /// One collection's ingest-log entries up to `upto` written at or after
    /// `since_ms`, oldest first, at most `limit`: on PostgreSQL an entry's
    /// id is taken when its transaction writes it and seen when it
    /// commits, so one with a lower id can appear after a higher one was
    /// read; a snapshot's replay takes these again (applying an entry
    /// twice changes nothing).
    pub async fn collection_log_recent(
        &self,
        collection_id: i64,
        upto: i64,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<LogEntry>, StoreError> {
        let q = format!(
            "{LOG_SELECT} WHERE collection_id = $1 AND id <= $2 AND at_ms >= $3 ORDER BY id LIMIT $4"
        );
        let rows: Vec<LogRow> = on_pool!(self, p => sqlx::query_as(&q).bind(collection_id).bind(upto).bind(since_ms).bind(limit).fetch_all(p).await?);
        Ok(rows.into_iter().map(log_entry).collect())
    }

    /// Records that replica `replica`'s indexes and saved snapshots hold
    /// every change-log entry up to `position` (the log is kept from the
    /// lowest live replica's position on).
    pub async fn report_position(&self, replica: &str, position: i64) -> Result<(), StoreError> {
        let q = "INSERT INTO replicas (id, position, seen_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET position = excluded.position, seen_ms = excluded.seen_ms";
        on_pool!(self, p => sqlx::query(q).bind(replica).bind(position).bind(now_ms()).execute(p).await.map(drop)?);
        Ok(())
    }

    /// Removes a replica's record (it stops; the log no longer waits for it).
    pub async fn forget_replica(&self, replica: &str) -> Result<(), StoreError> {
        let q = "DELETE FROM replicas WHERE id = $1";
        on_pool!(self, p => sqlx::query(q).bind(replica).execute(p).await.map(drop)?);
        Ok(())
    }

    /// Trims the change log: replicas not heard from since `stale_before_ms`
    /// are forgotten, and entries below the lowest remaining position are
    /// removed (the log then starts there: [`Store::log_trimmed_below`];
    /// each collection records the last of its own removed,
    /// [`Store::collection_log_trimmed_to`]) — removed collections' entries
    /// with the rest, once every replica has passed them. Nothing is
    /// trimmed while no replica has reported.
    /// Returns the entries removed.
    pub async fn trim_log(&self, stale_before_ms: i64) -> Result<u64, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin_write().await?;
            sqlx::query("DELETE FROM replicas WHERE seen_ms < $1")
                .bind(stale_before_ms)
                .execute(&mut *tx)
                .await?;
            let lowest: Option<i64> = sqlx::query_scalar("SELECT MIN(position) FROM replicas")
                .fetch_one(&mut *tx)
                .await?;
            let mut removed = 0;
            if let Some(lowest) = lowest {
                sqlx::query(
                    "UPDATE collections SET log_trimmed_to = \
                     (SELECT MAX(l.id) FROM ingest_log l WHERE l.collection_id = collections.id AND l.id < $1) \
                     WHERE EXISTS (SELECT 1 FROM ingest_log l WHERE l.collection_id = collections.id AND l.id < $1)",
                )
                .bind(lowest)
                .execute(&mut *tx)
                .await?;
                removed = sqlx::query("DELETE FROM ingest_log WHERE id < $1")
                    .bind(lowest)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query("UPDATE ingest_log_trim SET below = $1 WHERE id = 1 AND below < $1")
                    .bind(lowest)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(removed)
        })
    }

    /// The last of the collection's change-log entries a trim removed (0
    /// when none was): a snapshot of it at a position at or past this
    /// misses none of its changes.
    pub async fn collection_log_trimmed_to(&self, collection_id: i64) -> Result<i64, StoreError> {
        let q = "SELECT log_trimmed_to FROM collections WHERE id = $1";
        Ok(
            on_pool!(self, p => sqlx::query_scalar::<_, i64>(q).bind(collection_id).fetch_optional(p).await?)
                .unwrap_or(0),
        )
    }

    /// This store's random name, made with its schema: what tells its
    /// saved snapshots from another store's with the same ids.
    pub async fn identity(&self) -> Result<String, StoreError> {
        let q = "SELECT token FROM store_identity WHERE id = 1";
        Ok(on_pool!(self, p => sqlx::query_scalar::<_, String>(q).fetch_one(p).await?))
    }

    /// The first change-log entry kept: every entry below it was trimmed.
    pub async fn log_trimmed_below(&self) -> Result<i64, StoreError> {
        let q = "SELECT below FROM ingest_log_trim WHERE id = 1";
        Ok(
            on_pool!(self, p => sqlx::query_scalar::<_, i64>(q).fetch_optional(p).await?)
                .unwrap_or(0),
        )
    }

    /// One ingest-log entry.
    pub async fn log_entry(&self, id: i64) -> Result<Option<LogEntry>, StoreError> {
        let q = format!("{LOG_SELECT} WHERE id = $1");
        let row: Option<LogRow> =
            on_pool!(self, p => sqlx::query_as(&q).bind(id).fetch_optional(p).await?);
        Ok(row.map(log_entry))
    }

    /// One collection's chunks with their embeddings, for loading its indexes.
    pub async fn index_chunks_in(&self, collection_id: i64) -> Result<Vec<IndexChunk>, StoreError> {
        let q = format!("{INDEX_SELECT} WHERE d.collection_id = $1 ORDER BY c.id");
        let rows: Vec<IndexRow> =
            on_pool!(self, p => sqlx::query_as(&q).bind(collection_id).fetch_all(p).await?);
        Ok(rows.into_iter().map(to_index).collect())
    }

    /// [`Store::index_chunks_in`], `batch` chunks at a time: one query
    /// (one consistent view of the store) whose rows are handed to `each`
    /// as they arrive, so loading a large collection holds one batch of
    /// rows, not all of them (1M chunks of 1 KB with 384 floats each are
    /// 2.5 GB).
    pub async fn index_chunks_in_batches<E: From<StoreError>>(
        &self,
        collection_id: i64,
        batch: usize,
        mut each: impl FnMut(Vec<IndexChunk>) -> Result<(), E>,
    ) -> Result<(), E> {
        use futures::TryStreamExt;
        let q = format!("{INDEX_SELECT} WHERE d.collection_id = $1 ORDER BY c.id");
        let batch = batch.max(1);
        let mut buf = Vec::with_capacity(batch);
        on_pool!(self, p => {
            let mut rows = sqlx::query_as::<_, IndexRow>(&q).bind(collection_id).fetch(p);
            while let Some(row) = rows.try_next().await.map_err(StoreError::from)? {
                buf.push(to_index(row));
                if buf.len() == batch {
                    each(std::mem::replace(&mut buf, Vec::with_capacity(batch)))?;
                }
            }
        });
        if !buf.is_empty() {
            each(buf)?;
        }
        Ok(())
    }

    /// Every stored chunk with its embedding, for rebuilding indexes.
    pub async fn index_chunks(&self) -> Result<Vec<IndexChunk>, StoreError> {
        let q = format!("{INDEX_SELECT} ORDER BY c.id");
        let rows: Vec<IndexRow> = on_pool!(self, p => sqlx::query_as(&q).fetch_all(p).await?);
        Ok(rows.into_iter().map(to_index).collect())
    }
}
