//! Domain types and stage traits for ragtime.
//!
//! Nothing here depends on an async runtime, a web framework or a database:
//! stages implement these traits, the pipeline drives them under a budget.

pub mod budget;
pub mod cancel;
pub mod error;
pub mod filter;
pub mod fusion;
pub mod stage;
pub mod tenant;
pub mod types;

pub use budget::{BudgetReport, Outcome, PartialReason, PromptReport, Stage, StageReport};
pub use cancel::Cancel;
pub use error::StageError;
pub use filter::{Filter, FilterError};
pub use fusion::{Fusion, FusionParams, fuse};
pub use stage::{Embedder, Generator, Reranker, ResponseCache, Retriever, TokenStream};
pub use tenant::{Tenant, valid_collection, valid_conversation_id, valid_tenant};
pub use types::{
    CachedAnswer, Chunk, Citation, DocHit, GenEvent, GenRequest, Grounding, Hit, IngestDoc,
    Message, Passage, SECTION_SEP, Scope, Section, Usage, heading_of, overlap_len,
};
