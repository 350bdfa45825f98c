//! The stages the pipeline is written against. Every method is async and
//! takes the stage's [`Cancel`] (its flag and deadline): implementations
//! that do CPU work run it off the async threads and stop at their next
//! check once it is set; the pipeline drops the future at the deadline
//! either way. Tests drive the pipeline with fakes of these traits on
//! paused time.

use crate::{
    CachedAnswer, Cancel, Chunk, DocHit, Filter, FusionParams, GenEvent, GenRequest, Hit, Scope,
    StageError,
};
use async_trait::async_trait;
use futures_core::stream::BoxStream;
use std::sync::Arc;

/// Turns texts into unit vectors.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// Dimension of the vectors produced.
    fn dim(&self) -> usize;
    /// A query's vector (implementations may cache it).
    async fn embed_query(&self, text: &str, cancel: Cancel) -> Result<Arc<Vec<f32>>, StageError>;
    /// Texts embedded as queries are (the embeddings API).
    async fn embed_texts(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError>;
    /// Passages for the index (implementations may trade a little precision
    /// for throughput here).
    async fn embed_passages(
        &self,
        texts: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<Vec<f32>>, StageError>;
}

/// One collection's dense and lexical indexes.
#[async_trait]
pub trait Retriever: Send + Sync {
    /// The `k` chunks nearest to a unit `vector` among those `filter` allows.
    async fn dense(
        &self,
        vector: Arc<Vec<f32>>,
        k: usize,
        filter: &Filter,
        cancel: Cancel,
    ) -> Result<Vec<Hit>, StageError>;
    /// The `k` best documents for `query` by BM25 over whole documents
    /// (title and body as separate fields) among those `filter` allows,
    /// each with its best chunk and then those of its chunks that match
    /// the query's words, `per_document` at most, best first: by
    /// similarity to `vector` and their own BM25 score, or by that score
    /// alone without a vector.
    async fn lexical_documents(
        &self,
        query: &str,
        k: usize,
        filter: &Filter,
        vector: Option<Arc<Vec<f32>>>,
        per_document: usize,
        cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError>;
    /// Documents the lexical side ranks in a hybrid search whose sides
    /// are asked for `k` candidates each (the pipeline never asks for
    /// fewer than it shows): `k` unless a ranking costs by its depth and
    /// a shallower one was measured to lose nothing that matters (the
    /// database engine's).
    fn hybrid_lexical_depth(&self, k: usize) -> usize {
        k
    }
    /// Whether this retriever picks a document's passages apart from
    /// ranking it: the pipeline then asks [`Retriever::lexical_documents`]
    /// for none (`per_document` 0) and asks [`Retriever::passages`] for
    /// those of the documents it shows (the lexical side's top, then the
    /// fused top's). An engine that must read every chunk of a ranked
    /// document to score them (the database) reads a top 10's instead of
    /// a top 100's; one that holds them at hand picks them with the
    /// ranking.
    fn passages_apart(&self) -> bool {
        false
    }
    /// The passages of `documents` (ids the lexical side returned), picked
    /// as [`Retriever::lexical_documents`] picks a document's (a scale
    /// that spans documents may come from those read so far), each
    /// document with its chunks and a score of 0, in the order asked; a
    /// document gone since is left out. Only called where
    /// [`Retriever::passages_apart`] holds.
    async fn passages(
        &self,
        _query: &str,
        _documents: &[i64],
        _vector: Option<Arc<Vec<f32>>>,
        _per_document: usize,
        _cancel: Cancel,
    ) -> Result<Vec<DocHit>, StageError> {
        Err(StageError::Backend(
            "this retriever picks passages with its documents".into(),
        ))
    }
    /// A chunk by id, while it is indexed.
    fn chunk(&self, id: i64) -> Option<Arc<Chunk>>;
    /// How this retriever's two rankings fuse best, where that differs
    /// from the pipeline's default: the weights of a convex fusion are
    /// fitted to the scale of each side's scores, and an engine whose
    /// lexical scores come from another ranking fits its own.
    fn fusion(&self) -> Option<FusionParams> {
        None
    }
}

/// Scores (query, passage) pairs; scores compare within one query only.
#[async_trait]
pub trait Reranker: Send + Sync {
    async fn score(
        &self,
        query: &str,
        passages: Vec<String>,
        cancel: Cancel,
    ) -> Result<Vec<f32>, StageError>;
}

/// The events of one generation; dropping the stream cancels it.
pub type TokenStream = BoxStream<'static, Result<GenEvent, StageError>>;

/// An LLM that streams a chat completion.
#[async_trait]
pub trait Generator: Send + Sync {
    /// Where it runs (a base URL), for spans and logs.
    fn address(&self) -> &str;
    /// Starts a generation; returns once the backend accepted it.
    async fn generate(&self, request: GenRequest) -> Result<TokenStream, StageError>;
    /// Whether the backend answers at all (a cheap health probe).
    async fn ping(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Answers kept for reuse by paraphrased questions of the same scope.
#[async_trait]
pub trait ResponseCache: Send + Sync {
    /// The best verified answer for `query` (with its unit `vector`), if
    /// any; stops looking (a miss) once `cancel` is set.
    async fn lookup(
        &self,
        scope: &Scope,
        query: &str,
        vector: &[f32],
        cancel: Cancel,
    ) -> Option<CachedAnswer>;
    /// Keeps a full answer; the same question in the same scope replaces it.
    fn insert(&self, scope: Scope, query: &str, vector: Vec<f32>, answer: CachedAnswer);
}
