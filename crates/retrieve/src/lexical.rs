//! BM25 over chunks' titles, section paths and texts with tantivy (English
//! stemming).

use crate::collection::Allowed;
use crate::{Chunk, Hit, IndexError};
use ragtime_core::Cancel;
use std::sync::{Mutex, PoisonError};
use tantivy::collector::{Collector, FilterCollector, SegmentCollector, TopDocs};
use tantivy::indexer::IndexWriterOptions;
use tantivy::query::QueryParser;
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term, doc};

/// Weight of a match in the chunk's section path against one in its title
/// or text. Section words belong to every chunk of a section, so at full
/// weight they outrank the chunk that states the answer (answers
/// benchmark: 0.83 of answers in the top 5 at 1.0, 0.89 at 0.3).
const SECTION_BOOST: f32 = 0.3;

/// Memory an index write may buffer before it flushes a segment.
const WRITE_BUDGET_BYTES: usize = 32_000_000;

/// The tantivy index and its reader, made at the collection's first write:
/// an empty collection holds none (an in-RAM index with its reader costs
/// memory whether or not it holds anything).
struct Built {
    index: Index,
    reader: IndexReader,
}

pub struct Lexical {
    schema: Schema,
    built: std::sync::OnceLock<Built>,
    /// One write at a time. There is no writer between writes: a tantivy
    /// `IndexWriter` keeps an indexing thread, a segment updater and merge
    /// threads alive, six threads per collection for as long as it is open,
    /// so an idle collection would cost threads for ever. A write opens one
    /// (one indexing, one merge thread), commits, waits for its merges and
    /// closes it; the reader holds no threads (manual reload).
    writing: Mutex<()>,
    chunk_id: Field,
    title: Field,
    section: Field,
    text: Field,
}

impl Lexical {
    pub fn new() -> Result<Self, IndexError> {
        let mut schema = Schema::builder();
        let stemmed = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer("en_stem")
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let chunk_id = schema.add_u64_field("chunk_id", INDEXED | STORED | FAST);
        let title = schema.add_text_field("title", stemmed.clone());
        let section = schema.add_text_field("section", stemmed.clone());
        let text = schema.add_text_field("text", stemmed);
        Ok(Self {
            schema: schema.build(),
            built: std::sync::OnceLock::new(),
            writing: Mutex::new(()),
            chunk_id,
            title,
            section,
            text,
        })
    }

    /// Opens a writer, lets `f` fill it, commits, waits for the merges the
    /// commit started, closes it and makes the change searchable.
    fn write(
        &self,
        f: impl FnOnce(&mut IndexWriter) -> tantivy::Result<()>,
    ) -> Result<(), IndexError> {
        let _one = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let built = match self.built.get() {
            Some(b) => b,
            None => {
                let index = Index::create_in_ram(self.schema.clone());
                let reader = index
                    .reader_builder()
                    .reload_policy(ReloadPolicy::Manual)
                    .try_into()?;
                self.built.get_or_init(|| Built { index, reader })
            }
        };
        let options = IndexWriterOptions::builder()
            .num_worker_threads(1)
            .num_merge_threads(1)
            .memory_budget_per_thread(WRITE_BUDGET_BYTES)
            .build();
        let mut w: IndexWriter = built.index.writer_with_options(options)?;
        f(&mut w)?;
        w.commit()?;
        w.wait_merging_threads()?;
        built.reader.reload()?;
        Ok(())
    }

    /// The bytes the index's segments take (0 before the first write).
    pub fn memory_bytes(&self) -> usize {
        self.built.get().map_or(0, |b| {
            b.reader
                .searcher()
                .space_usage()
                .map_or(0, |u| u.total().get_bytes() as usize)
        })
    }

    pub fn add<'a>(&self, chunks: impl Iterator<Item = &'a Chunk>) -> Result<(), IndexError> {
        self.write(|w| {
            for c in chunks {
                w.add_document(doc!(
                    self.chunk_id => c.chunk_id as u64,
                    // Where the chunk stands: its title and section path.
                    self.title => c.title.as_str(),
                    self.section => c.section.as_str(),
                    self.text => c.text.as_str(),
                ))?;
            }
            Ok(())
        })
    }

    pub fn remove(&self, ids: &[i64]) -> Result<(), IndexError> {
        if self.built.get().is_none() {
            return Ok(());
        }
        self.write(|w| {
            for id in ids {
                w.delete_term(Term::from_field_u64(self.chunk_id, *id as u64));
            }
            Ok(())
        })
    }

    /// The `k` best chunks for `query` among the allowed ones. Once
    /// `cancel` fires (its deadline passes) it stops collecting — checked
    /// before each index segment and every few thousand matches — and
    /// returns the best of what it had.
    pub fn search(
        &self,
        query: &str,
        k: usize,
        allowed: &Allowed,
        cancel: &Cancel,
    ) -> Result<Vec<Hit>, IndexError> {
        let Some(built) = self.built.get() else {
            return Ok(Vec::new());
        };
        if k == 0 || query.trim().is_empty() || cancel.is_cancelled() {
            return Ok(Vec::new());
        }
        let mut parser =
            QueryParser::for_index(&built.index, vec![self.title, self.section, self.text]);
        parser.set_field_boost(self.section, SECTION_BOOST);
        // Lenient: user text is not query syntax; what cannot parse is dropped.
        let (q, _errors) = parser.parse_query_lenient(query);
        let searcher = built.reader.searcher();
        let top = TopDocs::with_limit(k);
        let docs = match allowed {
            Allowed::All => searcher.search(&q, &Stoppable::new(top.order_by_score(), cancel))?,
            Allowed::Only(set) => {
                let set = set.clone();
                let only = FilterCollector::new(
                    "chunk_id".to_owned(),
                    move |id: u64| set.binary_search(&(id as usize)).is_ok(),
                    top.order_by_score(),
                );
                searcher.search(&q, &Stoppable::new(only, cancel))?
            }
        };
        let mut hits = Vec::with_capacity(docs.len());
        for (score, addr) in docs {
            let d: TantivyDocument = searcher.doc(addr)?;
            if let Some(id) = d.get_first(self.chunk_id).and_then(|v| v.as_u64()) {
                hits.push(Hit {
                    chunk_id: id as i64,
                    score,
                });
            }
        }
        Ok(hits)
    }
}

/// A collector that stops taking documents once its request is cancelled.
/// tantivy has no way to abort a search; this one skips the rest of the
/// work it controls (every segment not yet begun, and the collection of
/// matches in the current one).
struct Stoppable<C> {
    inner: C,
    cancel: Cancel,
}

impl<C> Stoppable<C> {
    fn new(inner: C, cancel: &Cancel) -> Self {
        Self {
            inner,
            cancel: cancel.clone(),
        }
    }
}

/// Matches collected between two looks at the cancel flag.
const CHECK_EVERY: u32 = 4096;

impl<C: Collector> Collector for Stoppable<C> {
    type Fruit = C::Fruit;
    type Child = StoppableSegment<C::Child>;

    fn for_segment(
        &self,
        ord: tantivy::SegmentOrdinal,
        reader: &tantivy::SegmentReader,
    ) -> tantivy::Result<Self::Child> {
        Ok(StoppableSegment {
            inner: self.inner.for_segment(ord, reader)?,
            cancel: self.cancel.clone(),
            seen: 0,
            stopped: self.cancel.is_cancelled(),
        })
    }

    fn requires_scoring(&self) -> bool {
        self.inner.requires_scoring()
    }

    fn merge_fruits(
        &self,
        fruits: Vec<<Self::Child as SegmentCollector>::Fruit>,
    ) -> tantivy::Result<Self::Fruit> {
        self.inner.merge_fruits(fruits)
    }
}

struct StoppableSegment<S> {
    inner: S,
    cancel: Cancel,
    seen: u32,
    stopped: bool,
}

impl<S: SegmentCollector> SegmentCollector for StoppableSegment<S> {
    type Fruit = S::Fruit;

    fn collect(&mut self, doc: tantivy::DocId, score: tantivy::Score) {
        if self.stopped {
            return;
        }
        self.seen += 1;
        if self.seen.is_multiple_of(CHECK_EVERY) && self.cancel.is_cancelled() {
            self.stopped = true;
            return;
        }
        self.inner.collect(doc, score);
    }

    fn harvest(self) -> S::Fruit {
        self.inner.harvest()
    }
}
