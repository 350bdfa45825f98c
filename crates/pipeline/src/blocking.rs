//! CPU-bound work off the async threads, stopped when its stage gives up.

use ragtime_core::{Cancel, StageError};

/// Cancels the flag when dropped — the future that holds it went away (a
/// stage's deadline passed, a client left) — unless disarmed because the
/// work already finished.
pub(crate) struct CancelOnDrop {
    cancel: Cancel,
    armed: bool,
}

impl CancelOnDrop {
    pub(crate) fn new(cancel: Cancel) -> Self {
        Self {
            cancel,
            armed: true,
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.cancel.cancel();
        }
    }
}

/// Runs `work` on tokio's blocking pool. The work gets the cancel flag and
/// must check it between units of work; the flag is set when the stage's
/// deadline passes or when the future awaiting this call is dropped.
pub async fn run_blocking<T, F>(cancel: Cancel, work: F) -> Result<T, StageError>
where
    F: FnOnce(&Cancel) -> Result<T, StageError> + Send + 'static,
    T: Send + 'static,
{
    let mut guard = CancelOnDrop::new(cancel.clone());
    let res = tokio::task::spawn_blocking(move || {
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        work(&cancel)
    })
    .await;
    guard.armed = false;
    res.map_err(|e| StageError::Backend(format!("blocking task failed: {e}")))?
}
