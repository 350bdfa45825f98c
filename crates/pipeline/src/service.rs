//! [`Pipeline`]: every request's owner. Handlers hand it what they parsed;
//! it resolves the collection, picks the budgets (tenant, experiment),
//! runs the request's steps under one deadline, and records the outcome in
//! metrics, on the request's span and in the experiment's arm.

use crate::PipelineError;
use crate::backend::Backends;
use crate::backend::load::Levels;
use crate::budget::RequestBudget;
use crate::budget::runtime::Budgets;
use crate::chat::{
    self, AnswerMode, CHAT_PLAN, ChatAnswer, ChatDeps, ChatEvent, ChatInput, OnUngrounded,
};
use crate::corpus::{CollectionInfo, Corpus, CorpusError, IngestDoc, Ingested, Quotas};
use crate::embeddings::{self, Embedded};
use crate::jobs::internal;
use crate::rerank::RerankParams;
use crate::search::{self, Mode, SearchDeps, SearchOutcome, SearchRequest};
use ragtime_core::{
    Filter, Message, PartialReason, Reranker, ResponseCache, Retriever, Scope, StageError, Tenant,
};
use ragtime_store::{Created, Dropped, StoreError};
use ragtime_telemetry::metrics::Metrics;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

/// What the pipeline needs to know of the deployment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The model name clients see (`GET /v1/models`, answers' `model`).
    pub model: String,
    /// Passages in a chat prompt unless the request says otherwise.
    pub top_k: usize,
    /// Stored messages of a conversation put back into its prompt.
    pub history_messages: usize,
    pub rerank: RerankParams,
    pub answer: AnswerSettings,
    /// Put each chat's question and answer on its trace's root span
    /// (`input.value`, `output.value`, at most [`CAPTURED_BYTES`] each).
    pub capture_content: bool,
    /// Ingests (document writes and uploads) running at once; one more is
    /// refused as busy (0: no limit).
    pub max_concurrent_ingests: usize,
    /// Ingest jobs held (queued or running) by this replica; one more is
    /// refused as busy (0: no limit).
    pub max_jobs: usize,
    /// Of those, one tenant's at most (0: no limit).
    pub max_jobs_per_tenant: usize,
    /// The documents' text those jobs hold together at most (0: no limit).
    pub max_queued_job_bytes: usize,
}

/// The most of a question or an answer put on a span.
pub const CAPTURED_BYTES: usize = 4096;

/// `text` cut to at most `max` bytes, at a character boundary.
fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How chat answers are made when the request does not say (`[chat]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnswerSettings {
    pub mode: AnswerMode,
    pub on_ungrounded: OnUngrounded,
    /// Sampling temperature sent when the client sends none.
    pub temperature: f64,
    /// `frequency_penalty` sent when the client sends none (small models
    /// loop without one).
    pub frequency_penalty: f64,
    /// DRY sampling's strength sent to a backend that has it (0: off).
    pub dry_multiplier: f64,
    /// The tokens DRY looks back over (the prompt's tail and the answer).
    pub dry_last_n: u32,
    /// `max_tokens` when the client sets none.
    pub max_tokens: u32,
}

impl Default for AnswerSettings {
    fn default() -> Self {
        Self {
            mode: AnswerMode::Generate,
            on_ungrounded: OnUngrounded::Annotate,
            temperature: 0.0,
            frequency_penalty: 0.5,
            // Measured on the answers benchmark (docs/answers.md): with
            // frequency_penalty 0.5, SmolLM2's loops fell from 17 of 40
            // answers to 6, and it was right more often (8 → 11).
            dry_multiplier: 0.8,
            // Measured likewise: DRY over the whole context (llama.cpp's
            // default) sees every passage in the prompt; SmolLM2 was cut
            // for looping 8 and 9 times in 40 in two runs and 0–2 in four
            // later ones, over the latest 128 tokens 1–2, with as many
            // right answers (docs/answers.md).
            dry_last_n: 128,
            max_tokens: crate::chat::DEFAULT_MAX_TOKENS,
        }
    }
}

/// How long a finished turn's conversation write may take. It runs after
/// the answer is sent, off the response path; the conversation's next turn
/// waits for it (at most this long) so its history is complete.
pub(crate) const TURN_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The stages and shared state every request runs with.
/// What a pipeline serves with (readiness and statistics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineStatus {
    /// The embedding model's dimension.
    pub dim: usize,
    /// Whether a cross-encoder reranks.
    pub reranker: bool,
    /// The retrieval engine's state.
    pub engine: crate::corpus::EngineStatus,
}

/// The front door: every request goes through its methods; its parts are
/// the crate's own (the job runner and the recording beside it use them).
pub struct Pipeline {
    pub(crate) corpus: Corpus,
    reranker: Option<Arc<dyn Reranker>>,
    /// The LLM backends, their admission gates and breakers.
    backends: Arc<Backends>,
    /// How requests shrink as the backends fill up.
    levels: Levels,
    cache: Option<Arc<dyn ResponseCache>>,
    pub(crate) budgets: Arc<Budgets>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Settings,
    /// Conversations with a turn being stored: the next turn's history
    /// waits for it.
    pub(crate) writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// A permit per running ingest or job ([`Settings::max_concurrent_ingests`]).
    pub(crate) ingests: Arc<tokio::sync::Semaphore>,
    /// A permit per upload being read and checked, or ingested at once
    /// (as many).
    uploads: Arc<tokio::sync::Semaphore>,
    pub(crate) jobs: crate::jobs::Jobs,
}

/// A running ingest's place among `limits.max_concurrent_ingests`.
pub struct IngestSlot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// Aborts a chat's task when dropped before [`AbortOnDrop::disarm`]: a
/// client that goes away stops its generation at once.
pub struct AbortOnDrop(Option<tokio::task::AbortHandle>);

impl AbortOnDrop {
    pub(crate) fn new<T>(task: tokio::task::JoinHandle<T>) -> Self {
        Self(Some(task.abort_handle()))
    }

    /// The answer is delivered: let the task finish its bookkeeping.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// A search as a client asks for it.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    pub collection: String,
    pub query: String,
    pub top_k: usize,
    pub mode: Mode,
    pub filter: Filter,
    pub rerank: bool,
    pub budget_ms: Option<u64>,
}

/// A chat turn as a client asks for it.
#[derive(Debug, Clone, Default)]
pub struct ChatQuery {
    pub collection: String,
    /// The user's last turn.
    pub query: String,
    /// Earlier turns the client sent (used without a stored conversation).
    pub earlier: Vec<Message>,
    pub conversation_id: Option<String>,
    pub top_k: Option<usize>,
    pub filter: Filter,
    /// The filter in a canonical text form (part of the cache scope).
    pub filter_key: String,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub budget_ms: Option<u64>,
    pub traceparent: Option<String>,
    /// The request's own answer mode, if it names one.
    pub answer: Option<AnswerMode>,
    pub stream: bool,
}

/// A chat turn under way: its events end with [`ChatEvent::Done`].
pub struct ChatStarted {
    pub conversation_id: String,
    pub model: String,
    pub events: mpsc::Receiver<ChatEvent>,
    /// Aborts the turn when dropped, until disarmed.
    pub task: AbortOnDrop,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        corpus: Corpus,
        reranker: Option<Arc<dyn Reranker>>,
        backends: Arc<Backends>,
        levels: Levels,
        cache: Option<Arc<dyn ResponseCache>>,
        budgets: Arc<Budgets>,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        let permits = match settings.max_concurrent_ingests {
            0 => tokio::sync::Semaphore::MAX_PERMITS,
            n => n,
        };
        let ingests = Arc::new(tokio::sync::Semaphore::new(permits));
        let uploads = Arc::new(tokio::sync::Semaphore::new(permits));
        Self {
            corpus,
            reranker,
            backends,
            levels,
            cache,
            budgets,
            metrics,
            settings,
            writing: Mutex::default(),
            ingests,
            uploads,
            jobs: crate::jobs::Jobs::default(),
        }
    }

    /// An existing collection of `tenant` (`collection` as the caller
    /// named it), and how long loading its indexes took if this call did.
    pub async fn retriever(
        &self,
        tenant: &Tenant,
        collection: &str,
    ) -> Result<(Arc<dyn Retriever>, Option<Duration>), PipelineError> {
        self.corpus
            .retriever(&tenant.collection(collection))
            .await
            .map_err(|e| Self::corpus_error(e, collection))
    }

    pub(crate) fn corpus_error(e: CorpusError, collection: &str) -> PipelineError {
        match e {
            CorpusError::UnknownCollection(_) => {
                PipelineError::UnknownCollection(collection.to_owned())
            }
            CorpusError::Store(StoreError::QuotaExceeded { limit, value }) => {
                PipelineError::QuotaExceeded { limit, value }
            }
            CorpusError::Embed(StageError::Busy(_)) => PipelineError::Busy {
                what: "the embedding queue",
                retry_after: Duration::from_secs(5),
            },
            CorpusError::Store(StoreError::SearchesBusy) => PipelineError::Busy {
                what: "the database engine's pool of search connections",
                retry_after: Duration::from_secs(1),
            },
            other => PipelineError::Internal(other.to_string()),
        }
    }

    /// Creates a collection of `tenant`; `false` if it existed already.
    pub async fn create_collection(
        &self,
        tenant: &Tenant,
        name: &str,
        description: &str,
    ) -> Result<bool, PipelineError> {
        let created = self
            .corpus
            .create_collection(&tenant.collection(name), description)
            .await
            .map_err(|e| Self::corpus_error(e, name))?;
        Ok(matches!(created, Created::New(_)))
    }

    /// Removes a collection of `tenant` with everything in it.
    pub async fn drop_collection(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<Dropped, PipelineError> {
        self.corpus
            .drop_collection(&tenant.collection(name))
            .await
            .map_err(|e| Self::corpus_error(e, name))?
            .ok_or_else(|| PipelineError::UnknownCollection(name.to_owned()))
    }

    /// `tenant`'s collections (named as the tenant names them), or every
    /// tenant's for `None` (stored names).
    pub async fn collections(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<CollectionInfo>, PipelineError> {
        let owner = tenant.map(Tenant::collection_prefix);
        let mut all = self
            .corpus
            .collections(owner.as_deref())
            .await
            .map_err(|e| PipelineError::Internal(e.to_string()))?;
        if let Some(prefix) = owner {
            for c in &mut all {
                c.record.name = c.record.name[prefix.len()..].to_owned();
            }
        }
        Ok(all)
    }

    /// One collection of `tenant` (named as the tenant names it).
    pub async fn collection(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<Option<CollectionInfo>, PipelineError> {
        let info = self
            .corpus
            .collection_info(&tenant.collection(name))
            .await
            .map_err(|e| PipelineError::Internal(e.to_string()))?;
        Ok(info.map(|mut c| {
            name.clone_into(&mut c.record.name);
            c
        }))
    }

    /// The quotas `tenant` writes under, and whether they are its own.
    pub async fn quotas(&self, tenant: &Tenant) -> Result<(Quotas, bool), PipelineError> {
        self.corpus
            .quotas_of(tenant)
            .await
            .map_err(|e| PipelineError::Internal(e.to_string()))
    }

    /// One of `limits.max_concurrent_ingests` uploads, taken before an
    /// ingest's body is read (so a flood of uploads is refused before it
    /// takes memory) and held until it is ingested or handed to a job;
    /// busy if none is free.
    pub fn ingest_slot(&self) -> Result<IngestSlot, PipelineError> {
        self.uploads
            .clone()
            .try_acquire_owned()
            .map(IngestSlot)
            .map_err(|_| Self::no_ingest_slot())
    }

    fn no_ingest_slot() -> PipelineError {
        PipelineError::Busy {
            what: "every ingest slot (limits.max_concurrent_ingests)",
            retry_after: Duration::from_secs(2),
        }
    }

    /// Ingests documents into a collection of `tenant` (created if
    /// missing); every document is committed when this returns. Returns
    /// what happened to each, and the corpus version after.
    ///
    /// Chunking and embedding stop if the caller goes away; the commit —
    /// the store's transaction and then the indexes — runs to its end on a
    /// task of its own, so a client that disconnects after the store has
    /// committed never leaves a durable but unindexed document.
    pub async fn ingest(
        self: &Arc<Self>,
        slot: IngestSlot,
        tenant: &Tenant,
        collection: &str,
        docs: Vec<IngestDoc>,
    ) -> Result<(Vec<Ingested>, i64), PipelineError> {
        // Held until the commit ends (on its own task, below); running
        // jobs may hold every one.
        let permit = (
            slot,
            self.ingests
                .clone()
                .try_acquire_owned()
                .map_err(|_| Self::no_ingest_slot())?,
        );
        let prepared = self
            .corpus
            .prepare(&tenant.collection(collection), docs)
            .await
            .map_err(|e| Self::corpus_error(e, collection))?;
        let me = self.clone();
        let done = tokio::spawn(async move {
            let _permit = permit;
            me.corpus.commit(prepared).await
        })
        .await
        .map_err(|e| PipelineError::Internal(format!("ingest task: {e}")))?
        .map_err(|e| Self::corpus_error(e, collection))?;
        // Committed: what follows is bookkeeping, and cannot turn a
        // durable write into a failure. The store unreadable now, the
        // version is the one this replica reached by it.
        let version = match self.corpus.store.corpus_version().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "corpus version not read after a committed ingest");
                self.corpus.version()
            }
        };
        Ok((done, version))
    }

    /// What the pipeline serves with, for readiness and statistics.
    pub fn status(&self) -> PipelineStatus {
        PipelineStatus {
            dim: self.corpus.embedder.dim(),
            reranker: self.reranker.is_some(),
            engine: self.corpus.status(),
        }
    }

    /// What every collection holds together, how many are loaded and what
    /// their indexes take.
    pub async fn collection_totals(
        &self,
    ) -> Result<(ragtime_store::Usage, usize, crate::corpus::IndexBytes), PipelineError> {
        self.corpus
            .totals()
            .await
            .map_err(|e| PipelineError::Internal(e.to_string()))
    }

    /// The corpus, for what maintains it beside the requests (following
    /// other writers, saving and dropping indexes) and for benchmarks.
    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    /// The metrics the pipeline records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A stored document of `tenant`'s `collection`, with its chunks;
    /// `None` if there is no such document.
    pub async fn document(
        &self,
        tenant: &Tenant,
        collection: &str,
        id: &str,
    ) -> Result<Option<ragtime_store::DocumentRecord>, PipelineError> {
        let coll = self.stored_collection(tenant, collection).await?;
        let store = &self.corpus.store;
        store.get_document(coll, id).await.map_err(internal)
    }

    /// A page of a collection's documents: the first `limit` after the id
    /// `after`, in id order.
    pub async fn documents(
        &self,
        tenant: &Tenant,
        collection: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ragtime_store::DocumentSummary>, PipelineError> {
        let coll = self.stored_collection(tenant, collection).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let store = &self.corpus.store;
        store
            .list_documents(coll, after, limit)
            .await
            .map_err(internal)
    }

    /// The store's id of `tenant`'s collection `collection`: 404 when it
    /// has none of that name.
    async fn stored_collection(
        &self,
        tenant: &Tenant,
        collection: &str,
    ) -> Result<i64, PipelineError> {
        let stored = tenant.collection(collection);
        let coll = self.corpus.store.collection_id(&stored).await;
        coll.map_err(internal)?
            .ok_or_else(|| PipelineError::UnknownCollection(collection.to_owned()))
    }

    /// Deletes a document; `false` if there was none.
    pub async fn delete(
        &self,
        tenant: &Tenant,
        collection: &str,
        id: &str,
    ) -> Result<bool, PipelineError> {
        self.corpus
            .delete(&tenant.collection(collection), id)
            .await
            .map_err(|e| Self::corpus_error(e, collection))
    }

    /// A search for `tenant`, under a budget that started when the request
    /// `arrived`.
    pub async fn search(
        &self,
        tenant: &Tenant,
        q: SearchQuery,
        arrived: Instant,
    ) -> Result<SearchOutcome, PipelineError> {
        let (retriever, loaded) = self.retriever(tenant, &q.collection).await?;
        let reranker = match (q.rerank, &self.reranker) {
            (false, _) => None,
            (true, Some(r)) => Some((r.as_ref(), self.settings.rerank)),
            (true, None) => {
                return Err(PipelineError::invalid(
                    "rerank",
                    "no reranker is configured (set RAGTIME__RERANK__MODEL_DIR)",
                ));
            }
        };
        let (profile, arm) = self.budgets.assign(tenant.name());
        let budget =
            RequestBudget::start_at(&profile, search::plan(q.rerank), q.budget_ms, arrived);
        if let Some(took) = loaded {
            budget.index_loaded(took);
        }
        let deps = SearchDeps {
            embedder: self.corpus.embedder.as_ref(),
            retriever: retriever.as_ref(),
            reranker,
        };
        let req = SearchRequest {
            query: q.query,
            top_k: q.top_k,
            mode: q.mode,
            filter: q.filter,
        };
        let out = search::run(&budget, &deps, &req).await;
        let reason = out
            .report
            .first_degraded()
            .map(|s| PartialReason::Stage(s.stage));
        let _ = self.record(&out.report, reason, arm);
        Ok(out)
    }

    pub async fn embeddings(
        &self,
        tenant: &Tenant,
        texts: Vec<String>,
        budget_ms: Option<u64>,
        arrived: Instant,
    ) -> Result<Embedded, PipelineError> {
        let profile = embeddings::profile(&self.budgets.assign(tenant.name()).0, budget_ms);
        let done = embeddings::run(&profile, self.corpus.embedder.as_ref(), texts, arrived).await;
        let report = match &done {
            Ok(Embedded { report, .. }) => Some(report),
            Err(PipelineError::BudgetExceeded { report, .. }) => Some(&**report),
            Err(_) => None,
        };
        if let Some(report) = report {
            let degraded = done.is_err() || report.first_overran().is_some();
            let trace = ragtime_telemetry::exported_trace_id(&tracing::Span::current(), degraded);
            self.metrics.record_report(report, trace.as_deref());
        }
        done
    }

    /// Starts a chat turn that `arrived` then: checks what can be refused
    /// (unknown collection, a conversation of another collection, every
    /// backend's queue full), then runs it on its own task.
    pub async fn chat(
        self: &Arc<Self>,
        tenant: &Tenant,
        q: ChatQuery,
        arrived: Instant,
    ) -> Result<ChatStarted, PipelineError> {
        let (retriever, loaded) = self.retriever(tenant, &q.collection).await?;
        if let Some(drain) = self.backends.saturated() {
            self.metrics.shed("all", "full");
            return Err(PipelineError::Overloaded { retry_after: drain });
        }
        let stored = tenant.collection(&q.collection);
        let (conversation_id, history) = self
            .history(
                tenant,
                &stored,
                q.conversation_id.clone(),
                q.earlier.clone(),
            )
            .await?;
        let (profile, arm) = self.budgets.assign(tenant.name());
        let budget = RequestBudget::start_at(&profile, &CHAT_PLAN, q.budget_ms, arrived);
        if let Some(took) = loaded {
            budget.index_loaded(took);
        }
        let input = self.chat_input(tenant, q, history);
        let (tx, events) = mpsc::channel(64);
        let me = self.clone();
        let conversation = tenant.conversation(&conversation_id);
        let work = async move {
            let answer = {
                let _llm = me.metrics.llm_in_flight();
                me.run_chat(&budget, retriever.as_ref(), &input, &tx).await
            };
            me.record_chat(&answer, arm);
            if me.settings.capture_content {
                let span = tracing::Span::current();
                span.record("input.value", bounded(&input.query, CAPTURED_BYTES));
                span.record("output.value", bounded(&answer.text, CAPTURED_BYTES));
            }
            // The next turn of this conversation reads its history only
            // once this one is stored: take the lock before the answer ends.
            let lock = me.writing_lock(&conversation);
            let guard = lock.clone().lock_owned().await;
            let text = answer.text.clone();
            let _ = tx.send(ChatEvent::Done(Box::new(answer))).await;
            drop(tx);
            if !text.trim().is_empty() {
                me.store_turn(&conversation, &stored, &input.query, &text)
                    .await;
            }
            drop(guard);
            me.done_writing(&conversation, lock);
        };
        let handle = tokio::spawn(work.instrument(tracing::Span::current()));
        Ok(ChatStarted {
            conversation_id,
            model: self.settings.model.clone(),
            events,
            task: AbortOnDrop(Some(handle.abort_handle())),
        })
    }

    /// What a chat turn runs on: the query, with the settings' defaults
    /// where it names none.
    fn chat_input(&self, tenant: &Tenant, q: ChatQuery, history: Vec<Message>) -> ChatInput {
        let answer = &self.settings.answer;
        ChatInput {
            scope: Scope {
                tenant: tenant.name().to_owned(),
                collection: q.collection,
                filter: q.filter_key,
                version: u64::try_from(self.corpus.version()).unwrap_or(0),
            },
            query: q.query,
            history,
            top_k: q.top_k.unwrap_or(self.settings.top_k),
            filter: q.filter,
            max_tokens: q.max_tokens.or(Some(answer.max_tokens)),
            temperature: q.temperature.or(Some(answer.temperature)),
            top_p: q.top_p,
            frequency_penalty: q.frequency_penalty.or(Some(answer.frequency_penalty)),
            dry_multiplier: Some(answer.dry_multiplier),
            dry_last_n: Some(answer.dry_last_n),
            traceparent: q.traceparent,
            priority: self.budgets.priority(tenant.name()),
            answer: q.answer.unwrap_or(answer.mode),
            on_ungrounded: answer.on_ungrounded,
            stream: q.stream,
        }
    }

    async fn run_chat(
        &self,
        budget: &RequestBudget,
        retriever: &dyn Retriever,
        input: &ChatInput,
        tx: &mpsc::Sender<ChatEvent>,
    ) -> ChatAnswer {
        let deps = ChatDeps {
            embedder: self.corpus.embedder.as_ref(),
            retriever,
            reranker: self.reranker.as_deref().map(|r| (r, self.settings.rerank)),
            backends: &self.backends,
            levels: &self.levels,
            cache: self.cache.as_deref(),
        };
        chat::run(budget, &deps, input, tx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_text_is_cut_at_a_character_boundary() {
        assert_eq!(bounded("héllo", 2), "h");
        assert_eq!(bounded("héllo", 3), "hé");
        assert_eq!(bounded("héllo", 99), "héllo");
    }
}
