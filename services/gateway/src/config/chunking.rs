//! `[chunking]`: how documents are cut into chunks and ranked lexically.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkingConfig {
    /// Tokens per chunk (the embedding window is 256; MiniLM was trained
    /// on 128, and 128 scores better on SciFact than 200).
    pub max_tokens: usize,
    /// Tokens shared by consecutive chunks.
    pub overlap_tokens: usize,
    /// What BM25 ranks documents by (`RAGTIME__CHUNKING__LEXICAL`):
    /// `documents` (whole documents, title and text as fields; better on
    /// collections of short documents, e.g. abstracts), `chunks` (a
    /// document ranks by its best chunk; better on long, many-section
    /// documents such as manuals), or `auto` (per collection: documents
    /// while they average at most 8 chunks, else chunks).
    pub lexical: Lexical,
}

/// [`ChunkingConfig::lexical`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lexical {
    Documents,
    Chunks,
    Auto,
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            overlap_tokens: 24,
            lexical: Lexical::Auto,
        }
    }
}

impl ChunkingConfig {
    /// Chunks must fit the embedding model's `embed_max_tokens`.
    pub(super) fn validate(&self, embed_max_tokens: usize) -> Result<(), ConfigError> {
        if self.max_tokens < 16 || self.max_tokens > embed_max_tokens {
            return Err(invalid(
                "chunking.max_tokens",
                format!("must be between 16 and embed.max_tokens ({embed_max_tokens})"),
            ));
        }
        if self.overlap_tokens * 2 > self.max_tokens {
            return Err(invalid(
                "chunking.overlap_tokens",
                "must be at most half of chunking.max_tokens",
            ));
        }
        Ok(())
    }
}
