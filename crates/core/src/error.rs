use thiserror::Error;

/// What a stage reports when it cannot produce a result.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum StageError {
    /// The work noticed its cancel flag or deadline and stopped.
    #[error("cancelled")]
    Cancelled,
    /// The input cannot be processed (empty text, too long, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The backend (model, index, LLM server) failed.
    #[error("{0}")]
    Backend(String),
    /// The stage's queue is full: try again shortly.
    #[error("busy: {0}")]
    Busy(String),
    /// The work saw it could not finish before its deadline and stopped
    /// early (the reason says what it saw); a timeout, not a failure.
    #[error("{0}")]
    Late(String),
}
