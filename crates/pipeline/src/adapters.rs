//! The CPU-bound stage crates behind the stage traits. Their work runs on
//! tokio's blocking pool ([`run_blocking`]) and stops at its next check once
//! the stage's cancel flag is set (deadline passed or stage dropped).

use crate::run_blocking;
use async_trait::async_trait;
use ragtime_core::{Cancel, Chunk, DocHit, Filter, Hit, Reranker, Retriever, StageError};
use ragtime_rerank::CrossEncoder;
use ragtime_retrieve::{Boosts, CollectionIndex, LexicalUnit};
use std::sync::Arc;

/// A collection's HNSW and BM25 indexes as the pipeline's [`Retriever`].
/// What the lexical side ranks documents by is the second field.
pub struct IndexRetriever(pub Arc<CollectionIndex>, pub LexicalUnit);

#[async_trait]
impl Retriever for IndexRetriever {
    async fn dense(
        &self,
        vector: Arc<Vec<f32>>,
        k: usize,
        filter: &Filter,
        cancel: Cancel,
    ) -> Result<Vec<Hit>, StageError> {
        let (index, filter) = (self.0.clone(), filter.clone());
        run_blocking(cancel, move |c| {
            let allowed = index
                .allowed_within(&filter, c)
                .ok_or(StageError::Cancelled)?;
            Ok(index.dense_search(&vector, k, &allowed, c).0)
        })
        .await
    }

    async fn lexical_documents(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        let (index, filter, query) = (self.0.clone(), filter.clone(), query.to_owned());
        let unit = self.1;
        run_blocking(cancel, move |c| {
            let allowed = index
                .allowed_within(&filter, c)
                .ok_or(StageError::Cancelled)?;
            let vector = vector.as_deref().map(Vec::as_slice);
            match index.lexical_unit(unit) {
                LexicalUnit::Documents | LexicalUnit::Auto => index.document_search(
                    &query,
                    k,
                    &allowed,
                    Boosts::DOCUMENTS,
                    vector,
                    per_document,
                    c,
                ),
                LexicalUnit::Chunks => {
                    index.chunk_document_search(&query, k, &allowed, vector, per_document, c)
                }
            }
            .map_err(|e| StageError::Backend(e.to_string()))
        })
        .await
    }

    fn chunk(&self, id: i64) -> Option<Arc<Chunk>> {
        self.0.chunk(id)
    }
}

/// The ONNX cross-encoder as the pipeline's [`Reranker`].
pub struct CrossEncoderReranker(pub Arc<CrossEncoder>);

#[async_trait]
impl Reranker for CrossEncoderReranker {
    async fn score(
        &self,
        query: &str,
        passages: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<f32>, StageError> {
        let (model, query) = (self.0.clone(), query.to_owned());
        run_blocking(cancel, move |c| model.score(&query, &passages, c)).await
    }
}
