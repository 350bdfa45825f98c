//! Admission to one LLM backend: a gate with as many permits as the
//! backend has slots, and a bounded wait queue served by priority class
//! (a tenant's, set by the admin), earliest deadline first within a class.
//!
//! A request that would wait longer than it can afford is not queued: the
//! expected wait is the queue ahead of it times the observed time a request
//! holds a slot, over the number of slots (Little's law), and if that plus
//! the expected time to first token passes its first-token deadline, it is
//! [`Refusal::Shed`] at once, so the caller answers without the LLM in
//! milliseconds instead of waiting the whole allotment for nothing. Past
//! the hard queue limit it is [`Refusal::Full`], with the time the queue
//! needs to drain.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What a request brings to the gate.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// When its first token must have come.
    pub deadline: Instant,
    /// Higher is served first (0: everyone's default).
    pub priority: u8,
    /// The backend's expected time to first token for this prompt.
    pub expected_ttft: Duration,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Waiting would leave no room for the first token.
    Shed { expected_wait: Duration },
    /// The queue is at its hard limit; it drains in about `drain`.
    Full { drain: Duration },
    /// Queued, but the deadline came first.
    Timeout { waited: Duration },
}

/// A slot on the backend, held until dropped.
pub struct Permit {
    gate: Arc<Gate>,
    since: Instant,
    /// How long the request queued for it.
    pub queued: Duration,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.since.elapsed());
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: &Duration| d.as_millis();
        match self {
            Refusal::Shed { expected_wait } => write!(
                f,
                "shed: an expected wait of {} ms for a slot leaves no time for the first token",
                ms(expected_wait)
            ),
            Refusal::Full { drain } => {
                write!(f, "the queue is full (it drains in about {} ms)", ms(drain))
            }
            Refusal::Timeout { waited } => {
                write!(f, "queued {} ms and no slot came free in time", ms(waited))
            }
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("queued", &self.queued)
            .finish()
    }
}

struct Waiting {
    priority: u8,
    deadline: Instant,
    expected_ttft: Duration,
    seq: u64,
    /// `true`: the slot is yours; `false`: too late for a first token.
    tx: oneshot::Sender<bool>,
}

impl Waiting {
    /// Served first: higher priority, then earlier deadline, then earlier
    /// arrival.
    fn key(&self) -> (u8, std::cmp::Reverse<Instant>, std::cmp::Reverse<u64>) {
        (
            self.priority,
            std::cmp::Reverse(self.deadline),
            std::cmp::Reverse(self.seq),
        )
    }
}

impl PartialEq for Waiting {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Waiting {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key().cmp(&o.key())
    }
}

struct Inner {
    busy: usize,
    queue: BinaryHeap<Waiting>,
    seq: u64,
    /// Seconds a request holds a slot (exponentially weighted), once known.
    service: Option<f64>,
}

/// Counts since start.
#[derive(Debug, Default)]
pub struct GateCounts {
    pub admitted: AtomicU64,
    pub shed: AtomicU64,
    pub full: AtomicU64,
    pub timed_out: AtomicU64,
}

/// What the gate looks like now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateState {
    pub slots: usize,
    pub busy: usize,
    pub queued: usize,
    /// Time a request holds a slot, as observed (or the prior).
    pub service: Duration,
}

impl GateState {
    /// Share of slots in use.
    pub fn utilisation(&self) -> f64 {
        self.busy as f64 / self.slots.max(1) as f64
    }

    /// Requests queued per slot.
    pub fn queue_per_slot(&self) -> f64 {
        self.queued as f64 / self.slots.max(1) as f64
    }

    /// Expected wait for a request with `ahead` requests before it.
    pub fn wait_behind(&self, ahead: usize) -> Duration {
        if self.busy < self.slots && ahead == 0 {
            return Duration::ZERO;
        }
        self.service
            .mul_f64((ahead + 1) as f64 / self.slots.max(1) as f64)
    }
}

/// Weight of the past in the service-time average.
const DECAY: f64 = 0.9;

pub struct Gate {
    slots: usize,
    max_queue: usize,
    /// The service time assumed before any request finished.
    prior: Duration,
    inner: Mutex<Inner>,
    pub counts: GateCounts,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    /// A gate for a backend with `slots` concurrent sequences and a queue
    /// of at most `max_queue`; `prior`: the time a request is assumed to
    /// hold a slot until one has been observed.
    pub fn new(slots: usize, max_queue: usize, prior: Duration) -> Arc<Self> {
        Arc::new(Self {
            slots: slots.max(1),
            max_queue,
            prior,
            inner: Mutex::new(Inner {
                busy: 0,
                queue: BinaryHeap::new(),
                seq: 0,
                service: None,
            }),
            counts: GateCounts::default(),
        })
    }

    pub fn state(&self) -> GateState {
        let g = lock(&self.inner);
        self.state_of(&g)
    }

    fn state_of(&self, g: &Inner) -> GateState {
        GateState {
            slots: self.slots,
            busy: g.busy,
            queued: g.queue.iter().filter(|w| !w.tx.is_closed()).count(),
            service: g.service.map_or(self.prior, Duration::from_secs_f64),
        }
    }

    /// A permit now, if a slot is free and nobody waits for one.
    pub fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        let mut g = lock(&self.inner);
        if g.busy < self.slots && g.queue.iter().all(|w| w.tx.is_closed()) {
            g.queue.clear();
            g.busy += 1;
            self.counts.admitted.fetch_add(1, Ordering::Relaxed);
            return Some(self.permit(Duration::ZERO));
        }
        None
    }

    fn permit(self: &Arc<Self>, queued: Duration) -> Permit {
        Permit {
            gate: self.clone(),
            since: Instant::now(),
            queued,
        }
    }

    /// What waiting would cost `ask` now: the expected wait, or why it
    /// would be refused.
    fn decide(&self, g: &Inner, ask: &Ask, now: Instant) -> Result<Duration, Refusal> {
        let state = self.state_of(g);
        let me = (ask.priority, std::cmp::Reverse(ask.deadline));
        let ahead = g
            .queue
            .iter()
            .filter(|w| !w.tx.is_closed() && (w.priority, std::cmp::Reverse(w.deadline)) >= me)
            .count();
        let expected_wait = state.wait_behind(ahead);
        if now + expected_wait + ask.expected_ttft > ask.deadline {
            return Err(Refusal::Shed { expected_wait });
        }
        if state.busy >= state.slots && state.queued >= self.max_queue {
            return Err(Refusal::Full {
                drain: state.wait_behind(state.queued),
            });
        }
        Ok(expected_wait)
    }

    /// What [`Gate::admit`] would decide now, without queueing: the wait
    /// to expect, or the refusal.
    pub fn preview(&self, ask: Ask) -> Result<Duration, Refusal> {
        let g = lock(&self.inner);
        if g.busy < self.slots && g.queue.iter().all(|w| w.tx.is_closed()) {
            return Ok(Duration::ZERO);
        }
        self.decide(&g, &ask, Instant::now())
    }

    /// Waits for a slot, or refuses at once when waiting cannot pay off.
    pub async fn admit(self: &Arc<Self>, ask: Ask) -> Result<Permit, Refusal> {
        if let Some(p) = self.try_admit() {
            return Ok(p);
        }
        let start = Instant::now();
        let mut rx = {
            let mut g = lock(&self.inner);
            if let Err(r) = self.decide(&g, &ask, start) {
                let counter = match r {
                    Refusal::Shed { .. } => &self.counts.shed,
                    _ => &self.counts.full,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return Err(r);
            }
            let (tx, rx) = oneshot::channel();
            g.seq += 1;
            let seq = g.seq;
            g.queue.push(Waiting {
                priority: ask.priority,
                deadline: ask.deadline,
                expected_ttft: ask.expected_ttft,
                seq,
                tx,
            });
            rx
        };
        match tokio::time::timeout_at(ask.deadline, &mut rx).await {
            Ok(Ok(true)) => Ok(self.admitted(start)),
            _ => {
                // A slot handed over just as the deadline passed is ours:
                // give it back properly.
                if rx.try_recv() == Ok(true) {
                    drop(self.admitted(start));
                }
                self.counts.timed_out.fetch_add(1, Ordering::Relaxed);
                Err(Refusal::Timeout {
                    waited: start.elapsed(),
                })
            }
        }
    }

    fn admitted(self: &Arc<Self>, start: Instant) -> Permit {
        self.counts.admitted.fetch_add(1, Ordering::Relaxed);
        self.permit(start.elapsed())
    }

    /// A slot comes free after `held`: it goes to the first live waiter
    /// that can still have its first token in time; those that cannot are
    /// told at once (they answer without the LLM now, not at their
    /// deadline).
    fn release(&self, held: Duration) {
        let mut g = lock(&self.inner);
        let s = held.as_secs_f64();
        g.service = Some(g.service.map_or(s, |old| old * DECAY + s * (1.0 - DECAY)));
        let now = Instant::now();
        while let Some(w) = g.queue.pop() {
            if now + w.expected_ttft > w.deadline {
                let _ = w.tx.send(false);
                continue;
            }
            if w.tx.send(true).is_ok() {
                return;
            }
        }
        g.busy = g.busy.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ask(deadline_ms: u64, priority: u8) -> Ask {
        Ask {
            deadline: Instant::now() + Duration::from_millis(deadline_ms),
            priority,
            expected_ttft: 10 * MS,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_by_priority_then_deadline() {
        let gate = Gate::new(1, 16, 100 * MS);
        let first = gate.try_admit();
        assert!(first.is_some());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, deadline, prio) in [
            ("late", 5_000, 0),
            ("soon", 3_000, 0),
            ("premium", 9_000, 1),
        ] {
            let (g, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = g.admit(ask(deadline, prio)).await;
                order
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(name);
                tokio::time::sleep(10 * MS).await;
                drop(p);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.state().queued, 3);
        drop(first);
        for t in tasks {
            let _ = t.await;
        }
        let got = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
        assert_eq!(got, ["premium", "soon", "late"]);
        assert_eq!(gate.state().busy, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_cannot_pay_off_is_shed_at_once_and_a_full_queue_refused() {
        // Two slots, each held 1 s on average.
        let gate = Gate::new(2, 2, Duration::from_secs(1));
        let (_a, _b) = (gate.try_admit(), gate.try_admit());
        // Nobody ahead: 0.5 s expected wait fits a 600 ms deadline.
        let g = gate.clone();
        let queued = tokio::spawn(async move { g.admit(ask(600, 0)).await.map(|p| p.queued) });
        tokio::task::yield_now().await;
        // One ahead (its deadline is earlier): 1 s expected wait + 10 ms
        // to first token does not fit 900 ms.
        let t0 = Instant::now();
        let shed = gate.admit(ask(900, 0)).await;
        assert_eq!(
            shed.err(),
            Some(Refusal::Shed {
                expected_wait: Duration::from_secs(1)
            })
        );
        assert_eq!(t0.elapsed(), Duration::ZERO, "refused without waiting");
        let g = gate.clone();
        let _second = tokio::spawn(async move { g.admit(ask(60_000, 0)).await.is_ok() });
        tokio::task::yield_now().await;
        let full = gate.admit(ask(60_000, 0)).await;
        assert!(matches!(full, Err(Refusal::Full { .. })), "{full:?}");
        assert_eq!(gate.counts.shed.load(Ordering::Relaxed), 1);
        assert_eq!(gate.counts.full.load(Ordering::Relaxed), 1);
        // The queued request times out at its deadline if no slot frees.
        assert!(matches!(queued.await, Ok(Err(Refusal::Timeout { .. }))));
    }

    #[tokio::test(start_paused = true)]
    async fn service_time_is_learned_from_released_permits() {
        let gate = Gate::new(1, 4, Duration::from_secs(5));
        for _ in 0..30 {
            let p = gate.try_admit();
            tokio::time::sleep(200 * MS).await;
            drop(p);
        }
        let s = gate.state().service;
        assert!((s.as_secs_f64() - 0.2).abs() < 0.01, "{s:?}");
    }
}
