//! Traits implemented by the pipeline's stages. They are synchronous where the
//! work is CPU-bound; the pipeline runs them off the async threads.

use crate::{Cancel, StageError};

/// Turns texts into L2-normalised vectors.
pub trait Embedder: Send + Sync {
    /// Dimension of the vectors produced.
    fn dim(&self) -> usize;
    /// Embeds a batch. Implementations check `cancel` between units of work
    /// and return [`StageError::Cancelled`] once it is set.
    fn embed(&self, texts: &[String], cancel: &Cancel) -> Result<Vec<Vec<f32>>, StageError>;
}
