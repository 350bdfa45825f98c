//! Cooperative cancellation for CPU-bound work running off the async threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A flag plus an optional deadline, shared between the pipeline and the
/// blocking work it started. Work checks [`Cancel::is_cancelled`] between
/// units (a batch, a graph layer) and stops early when it turns true.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_deadline(deadline: Instant) -> Self {
        Self {
            flag: Arc::default(),
            deadline: Some(deadline),
        }
    }

    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once cancelled or once the deadline has passed.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn flag_and_deadline_both_cancel() {
        let c = Cancel::new();
        let seen_by_worker = c.clone();
        assert!(!seen_by_worker.is_cancelled());
        c.cancel();
        assert!(seen_by_worker.is_cancelled());

        let past = Cancel::with_deadline(Instant::now());
        assert!(past.is_cancelled());
        let future = Cancel::with_deadline(Instant::now() + Duration::from_secs(60));
        assert!(!future.is_cancelled());
    }
}
