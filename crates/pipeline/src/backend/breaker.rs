//! A circuit breaker per backend: after `failures` consecutive failures
//! (or one failed health probe) it opens and the router sends nothing there
//! for the cool-down; then one request (or probe) is let through half-open,
//! and its success closes it again.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    /// `unreachable`: opened by a failed health probe, not by requests.
    Open {
        until: Instant,
        unreachable: bool,
    },
    HalfOpen {
        probing: bool,
    },
}

/// What the breaker shows (`/readyz`, `/metrics`, `/admin/stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub const fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

pub struct Breaker {
    failures: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

impl Breaker {
    pub fn new(failures: u32, cooldown: Duration) -> Self {
        Self {
            failures: failures.max(1),
            cooldown,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a request may go to the backend now. Open past its
    /// cool-down turns half-open and lets exactly one through.
    pub fn allow(&self) -> bool {
        let mut s = self.lock();
        match *s {
            State::Closed { .. } => true,
            State::Open { until, .. } if Instant::now() >= until => {
                *s = State::HalfOpen { probing: true };
                true
            }
            State::Open { .. } => false,
            State::HalfOpen { probing: false } => {
                *s = State::HalfOpen { probing: true };
                true
            }
            State::HalfOpen { probing: true } => false,
        }
    }

    /// Whether requests would be let through (no state change).
    pub fn is_available(&self) -> bool {
        match *self.lock() {
            State::Closed { .. } | State::HalfOpen { probing: false } => true,
            State::Open { until, .. } => Instant::now() >= until,
            State::HalfOpen { probing: true } => false,
        }
    }

    pub fn success(&self) {
        *self.lock() = State::Closed { failures: 0 };
    }

    /// A request failed (an error or a timeout on the backend's side).
    pub fn failure(&self) {
        let mut s = self.lock();
        *s = match *s {
            State::Closed { failures } if failures + 1 < self.failures => State::Closed {
                failures: failures + 1,
            },
            _ => State::Open {
                until: Instant::now() + self.cooldown,
                unreachable: false,
            },
        };
    }

    /// The backend is known to be down (a failed health probe): open now.
    pub fn trip(&self) {
        *self.lock() = State::Open {
            until: Instant::now() + self.cooldown,
            unreachable: true,
        };
    }

    /// A health probe got through. That closes a breaker the probes opened
    /// (the server is back: a restart, or the end of its start-up) at once,
    /// and a half-open one; one opened by failing requests keeps its
    /// cool-down, since a server can answer probes and still fail requests.
    pub fn probed_ok(&self) {
        let mut s = self.lock();
        let close = match *s {
            State::Open { unreachable, until } => unreachable || Instant::now() >= until,
            State::HalfOpen { .. } => true,
            State::Closed { .. } => false,
        };
        if close {
            *s = State::Closed { failures: 0 };
        }
    }

    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until, .. } if Instant::now() >= until => BreakerState::HalfOpen,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_open_it_and_a_half_open_success_closes_it() {
        let b = Breaker::new(3, Duration::from_secs(5));
        b.failure();
        b.failure();
        b.success();
        b.failure();
        b.failure();
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "failures must be consecutive"
        );
        b.failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.allow(), "one probe after the cool-down");
        assert!(!b.allow(), "only one");
        b.failure();
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "a failed probe opens it again"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(b.allow());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        b.trip();
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "a failed health probe opens it at once"
        );
        b.probed_ok();
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "and a probe that gets through closes it at once"
        );
        for _ in 0..3 {
            b.failure();
        }
        b.probed_ok();
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "failing requests keep their cool-down"
        );
    }
}
