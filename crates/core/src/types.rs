//! The domain's nouns: chunks and what retrieval returns, chat messages and
//! what a generator streams, citations and cached answers.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// A document as a client sends it (or a parsed file gives it).
#[derive(Debug, Clone, PartialEq)]
pub struct IngestDoc {
    pub id: String,
    pub title: String,
    pub text: String,
    pub metadata: serde_json::Map<String, Value>,
    /// Where each section of `text` begins (a heading's line), in order;
    /// empty for text without structure.
    pub sections: Vec<Section>,
}

/// A section of a document's text: the byte offset where its heading's
/// line begins, and its path, the headings above it and its own,
/// outermost first, joined by [`SECTION_SEP`] ("Type layout › Size").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub start: usize,
    pub path: String,
}

/// Separates the parts of a section path, and a title from its section.
pub const SECTION_SEP: &str = " \u{203a} ";

impl IngestDoc {
    /// The path of the section that holds byte `at` of the text (empty
    /// before the first heading).
    pub fn section_at(&self, at: usize) -> &str {
        let i = self.sections.partition_point(|s| s.start <= at);
        i.checked_sub(1)
            .map_or("", |i| self.sections[i].path.as_str())
    }
}

/// One chunk of a document, as the indexes, the prompt and the results see
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub chunk_id: i64,
    pub document_id: i64,
    /// The document's id as the client gave it.
    pub external_id: String,
    pub position: i32,
    pub title: String,
    /// The section path of the chunk's first line (empty when its
    /// document has no headings).
    pub section: String,
    pub metadata: Arc<Value>,
    pub text: String,
}

/// How many bytes at the start of `next` repeat the end of `text`: a
/// chunk shares a few tokens with the one before it, and what reads a
/// document's chunks in order (its BM25 text, a quote that goes on into
/// the next chunk) leaves them out once. 0 when no tail of `text`'s last
/// 4 KiB begins `next`.
pub fn overlap_len(text: &str, next: &str) -> usize {
    // The overlap starts somewhere in the tail of `text`; find where the
    // tail equals the start of `next`, longest first.
    let probe_len = next.len().min(8);
    let probe_len = (0..=probe_len)
        .rev()
        .find(|&i| next.is_char_boundary(i))
        .unwrap_or(0);
    if probe_len == 0 {
        return 0;
    }
    let probe = &next[..probe_len];
    let from = text.len().saturating_sub(4096);
    let mut at = (from..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    while let Some(p) = text[at..].find(probe) {
        let start = at + p;
        let tail = &text[start..];
        if next.starts_with(tail) {
            return tail.len();
        }
        at = start + text[start..].chars().next().map_or(1, char::len_utf8);
    }
    0
}

/// Where a piece of a document stands, as a reader (and the embedding
/// model) is told: "title › section", either alone when the other is
/// empty.
pub fn heading_of(title: &str, section: &str) -> String {
    match (title.is_empty(), section.is_empty()) {
        (_, true) => title.to_owned(),
        (true, false) => section.to_owned(),
        (false, false) => format!("{title}{SECTION_SEP}{section}"),
    }
}

impl Chunk {
    /// Where the chunk stands ([`heading_of`] its title and section).
    pub fn heading(&self) -> String {
        heading_of(&self.title, &self.section)
    }
}

/// A scored retrieval hit (higher is better).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub chunk_id: i64,
    pub score: f32,
}

/// A scored document (the store's id; higher is better) with its chunks,
/// best first.
#[derive(Debug, Clone, PartialEq)]
pub struct DocHit {
    pub document_id: i64,
    pub score: f32,
    pub chunks: Vec<Hit>,
}

/// A retrieved chunk with its score.
#[derive(Debug, Clone)]
pub struct Passage {
    pub chunk: Arc<Chunk>,
    pub score: f32,
}

/// A passage an answer rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Citation {
    pub document_id: String,
    pub chunk_id: i64,
    pub title: String,
    /// The passage's section path ("" when its document has none).
    pub section: String,
    pub snippet: String,
}

/// The grounding check's verdict on a generated answer: how many of its
/// checkable sentences the cited passages support, and the ones they do
/// not (each with the term no source contains, when that is why).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grounding {
    pub sentences: usize,
    pub supported: usize,
    pub unsupported: Vec<String>,
}

impl Grounding {
    /// Share of checked sentences supported (1 when nothing was checkable).
    pub fn share(&self) -> f64 {
        if self.sentences == 0 {
            1.0
        } else {
            self.supported as f64 / self.sentences as f64
        }
    }

    /// Whether the answer as a whole stands on its sources: at least half
    /// its sentences supported.
    pub fn grounded(&self) -> bool {
        self.share() >= 0.5
    }
}

/// What the response cache keeps of a full answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAnswer {
    pub text: String,
    pub citations: Vec<Citation>,
}

/// What a cached answer depends on besides the question.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub tenant: String,
    pub collection: String,
    /// The filter in a canonical text form.
    pub filter: String,
    /// The corpus version the answer was built from.
    pub version: u64,
}

impl Scope {
    pub fn new(tenant: &str, collection: &str, filter: &str, version: u64) -> Self {
        Self {
            tenant: tenant.to_owned(),
            collection: collection.to_owned(),
            filter: filter.to_owned(),
            version,
        }
    }
}

/// One chat message (`role`: system, user or assistant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.into(),
        }
    }
}

/// What the pipeline asks a generator for.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// OpenAI's `frequency_penalty` (-2 to 2): repeated tokens made less
    /// likely, in proportion to how often they came.
    pub frequency_penalty: Option<f64>,
    /// DRY sampling's strength (llama.cpp's `dry_multiplier`; "don't
    /// repeat yourself", Weidmann 2024): a token that would extend a
    /// sequence already in the text is made less likely the longer that
    /// sequence. Sent only to a backend known to take it.
    pub dry_multiplier: Option<f64>,
    /// How many of the latest tokens DRY looks back over (llama.cpp's
    /// `dry_penalty_last_n`). The window holds the prompt too: a window
    /// over the whole context penalizes quoting the passages.
    pub dry_last_n: Option<u32>,
    /// W3C trace context to propagate to the backend.
    pub traceparent: Option<String>,
}

/// Token counts a generator reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// One event of a streamed generation.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// Generated text.
    Delta(String),
    /// Why the generator stopped (`stop`, `length`, …).
    Finish(String),
    /// Token counts (most backends send them last).
    Usage(Usage),
    /// How far the backend has read the prompt, before the first token
    /// (llama.cpp's `prompt_progress`): `processed` of `total` tokens,
    /// those it had cached included.
    Progress { processed: u32, total: u32 },
}
