//! Admission to one LLM backend: a gate with as many permits as the
//! backend has slots, and a bounded wait queue served by priority class
//! (a tenant's, set by the admin), earliest deadline first within a class.
//!
//! A request that would wait longer than it can afford is not queued: the
//! expected wait is the time until the soonest slot comes free (the
//! observed time a request holds a slot, less the time the oldest holder
//! has held it), then the queue ahead of it times that holding time over
//! the number of slots (Little's law), and if that plus
//! the expected time to first token passes its first-token deadline, it is
//! [`Refusal::Shed`] at once, so the caller answers without the LLM in
//! milliseconds instead of waiting the whole allotment for nothing. Past
//! the hard queue limit it is [`Refusal::Full`], with the time the queue
//! needs to drain. With a longest wait (below), a queued request also
//! stops waiting when a slot could no longer give it its first token in
//! time; without one, at its deadline.
//!
//! A request waits for a slot at most the gate's `max_wait`, then gives up
//! (the caller answers without the LLM); one expected to wait more than
//! twice that is shed at once, unless the spread below says otherwise.
//! Whoever will not get the model's answer should learn it within a
//! second or so, not when the first-token allotment runs out; a short
//! wait still keeps a slot that comes free busy. The expected wait is a guess — how long the requests holding
//! slots have left is read from their average, and answers vary in length
//! — and a slot often comes sooner: a request shed on the guess leaves it
//! idle until the next arrival. So with a `max_wait` and fewer requests
//! waiting ahead than slots, the guess counts less twice the spread the
//! holding times have shown (their mean absolute deviation): when a slot
//! may come within the wait by that, the request waits. With as many
//! ahead as slots or more the guess stands (a slot frees at most once in
//! a wait much shorter than a holding time), as it does before any spread
//! has been seen.

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
    /// Waiting cannot pay off: a first token would come too late, or the
    /// slot later than the longest wait.
    Shed { expected_wait: Duration },
    /// The queue is at its hard limit; it drains in about `drain`.
    Full { drain: Duration },
    /// Queued, but the deadline came first.
    Timeout { waited: Duration },
    /// Queued the longest a request may wait for a slot (or until a slot
    /// could no longer give it its first token in time), and none came.
    GaveUp { waited: Duration },
}

/// A slot on the backend, held until dropped.
pub struct Permit {
    gate: Arc<Gate>,
    id: u64,
    since: Instant,
    /// How long the request queued for it.
    pub queued: Duration,
    /// Whether its holding time teaches the gate (not for a slot given
    /// back unused).
    timed: bool,
}

impl Permit {
    /// Gives the slot back without having used it: its holding time says
    /// nothing of how long requests hold a slot.
    pub fn unused(mut self) {
        self.timed = false;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let held = self.timed.then(|| self.since.elapsed());
        self.gate.release(self.id, held);
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: &Duration| d.as_millis();
        match self {
            Refusal::Shed { expected_wait } => write!(
                f,
                "shed: waiting cannot pay off (a slot expected in {} ms)",
                ms(expected_wait)
            ),
            Refusal::Full { drain } => {
                write!(f, "the queue is full (it drains in about {} ms)", ms(drain))
            }
            Refusal::Timeout { waited } => {
                write!(f, "queued {} ms and no slot came free in time", ms(waited))
            }
            Refusal::GaveUp { waited } => write!(
                f,
                "waited {} ms for a slot and none came free in time",
                ms(waited)
            ),
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
    /// When it stops waiting for a slot.
    give_up: Instant,
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
    /// How far holding times stray from that average (seconds,
    /// exponentially weighted mean absolute deviation; 0 until known).
    spread: f64,
    /// Since when each permit held now has been held.
    holders: std::collections::HashMap<u64, Instant>,
    next_permit: u64,
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
    /// How far observed holding times stray from `service` (mean absolute
    /// deviation; zero until two were observed).
    pub spread: Duration,
    /// With every slot busy: the time until the soonest one is expected
    /// to come free (the holding time less the longest-held permit's age,
    /// at least a tenth of the holding time).
    pub next_free: Option<Duration>,
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

    /// Expected wait for a request with `ahead` requests before it: the
    /// soonest slot to come free, then one holding time over the slots for
    /// each request ahead.
    pub fn wait_behind(&self, ahead: usize) -> Duration {
        if self.busy < self.slots && ahead == 0 {
            return Duration::ZERO;
        }
        let slots = self.slots.max(1) as f64;
        let first = self
            .next_free
            .unwrap_or_else(|| self.service.mul_f64(1.0 / slots));
        first + self.service.mul_f64(ahead as f64 / slots)
    }
}

/// Weight of the past in the service-time average.
const DECAY: f64 = 0.9;

pub struct Gate {
    slots: usize,
    max_queue: usize,
    /// The longest a request waits for a slot (`None`: until its deadline
    /// leaves no room for a first token).
    max_wait: Option<Duration>,
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
        Self::with_max_wait(slots, max_queue, prior, None)
    }

    /// The same, with requests waiting at most `max_wait` for a slot.
    pub fn with_max_wait(
        slots: usize,
        max_queue: usize,
        prior: Duration,
        max_wait: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            slots: slots.max(1),
            max_queue,
            max_wait,
            prior,
            inner: Mutex::new(Inner {
                busy: 0,
                queue: BinaryHeap::new(),
                seq: 0,
                service: None,
                spread: 0.0,
                holders: std::collections::HashMap::new(),
                next_permit: 0,
            }),
            counts: GateCounts::default(),
        })
    }

    pub fn state(&self) -> GateState {
        let g = lock(&self.inner);
        self.state_of(&g)
    }

    fn state_of(&self, g: &Inner) -> GateState {
        let service = g.service.map_or(self.prior, Duration::from_secs_f64);
        let next_free = (g.busy >= self.slots)
            .then(|| g.holders.values().min())
            .flatten()
            .map(|oldest| {
                service
                    .saturating_sub(oldest.elapsed())
                    .max(service.mul_f64(0.1))
            });
        GateState {
            slots: self.slots,
            busy: g.busy,
            queued: g.queue.iter().filter(|w| !w.tx.is_closed()).count(),
            service,
            spread: Duration::from_secs_f64(g.spread),
            next_free,
        }
    }

    /// A permit now, if a slot is free and nobody waits for one.
    pub fn try_admit(self: &Arc<Self>) -> Option<Permit> {
        let mut g = lock(&self.inner);
        if g.busy < self.slots && g.queue.iter().all(|w| w.tx.is_closed()) {
            g.queue.clear();
            g.busy += 1;
            self.counts.admitted.fetch_add(1, Ordering::Relaxed);
            return Some(self.permit(&mut g, Duration::ZERO));
        }
        None
    }

    fn permit(self: &Arc<Self>, g: &mut Inner, queued: Duration) -> Permit {
        let (id, since) = (g.next_permit, Instant::now());
        g.next_permit += 1;
        g.holders.insert(id, since);
        Permit {
            gate: self.clone(),
            id,
            since,
            queued,
            timed: true,
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
        // With a longest wait and fewer waiters ahead than slots, a slot
        // may come within the wait sooner than the guess says: how long a
        // holder has left is a guess from the average holding time, and
        // holding times stray from it (answers vary in length). Shedding
        // on the guess left a slot that came early idle until the next
        // arrival (docs/benchmarks.md, "Under load"). So the guess counts
        // less twice the spread the holding times have shown: within the
        // wait, it waits (at most `max_wait`), and only a first token
        // that could not fit with a slot by then sheds it. Before any
        // spread is seen the guess stands.
        let early = expected_wait.saturating_sub(state.spread * 2);
        let may_come = self
            .max_wait
            .is_some_and(|m| ahead < state.slots && early <= m);
        let counted = if may_come { early } else { expected_wait };
        if now + counted + ask.expected_ttft > ask.deadline
            || (!may_come && self.max_wait.is_some_and(|m| expected_wait > m * 2))
        {
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
        // With a longest wait, it waits until then or until a slot could
        // no longer give its first token its time, whichever comes first:
        // either way it never reached the model, the backend was busy.
        // Without one, until its deadline (then it is late).
        let give_up = self.max_wait.map_or(ask.deadline, |m| {
            let room = ask
                .deadline
                .checked_sub(ask.expected_ttft)
                .unwrap_or(start)
                .max(start);
            room.min(start + m)
        });
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
                give_up,
                expected_ttft: ask.expected_ttft,
                seq,
                tx,
            });
            rx
        };
        match tokio::time::timeout_at(give_up, &mut rx).await {
            Ok(Ok(true)) => Ok(self.admitted(start)),
            _ => {
                // A slot handed over just as the deadline passed is ours:
                // give it back properly.
                if rx.try_recv() == Ok(true) {
                    drop(self.admitted(start));
                }
                self.counts.timed_out.fetch_add(1, Ordering::Relaxed);
                let waited = start.elapsed();
                Err(if self.max_wait.is_some() {
                    Refusal::GaveUp { waited }
                } else {
                    Refusal::Timeout { waited }
                })
            }
        }
    }

    fn admitted(self: &Arc<Self>, start: Instant) -> Permit {
        self.counts.admitted.fetch_add(1, Ordering::Relaxed);
        let mut g = lock(&self.inner);
        self.permit(&mut g, start.elapsed())
    }

    /// A slot comes free after `held`: it goes to the first live waiter
    /// that can still have its first token in time; those that cannot are
    /// told at once (they answer without the LLM now, not at their
    /// deadline).
    fn release(&self, id: u64, held: Option<Duration>) {
        let mut g = lock(&self.inner);
        g.holders.remove(&id);
        if let Some(held) = held {
            let s = held.as_secs_f64();
            if let Some(mean) = g.service {
                g.spread = g.spread * DECAY + (s - mean).abs() * (1.0 - DECAY);
            }
            g.service = Some(g.service.map_or(s, |old| old * DECAY + s * (1.0 - DECAY)));
        }
        let now = Instant::now();
        while let Some(w) = g.queue.pop() {
            if now + w.expected_ttft > w.deadline || now >= w.give_up {
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
        // Both held half of the 1 s a request holds a slot: the first frees
        // in about 0.5 s.
        tokio::time::sleep(500 * MS).await;
        assert_eq!(gate.state().next_free, Some(500 * MS));
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

    /// With a longest wait, a request expected to wait more than twice as
    /// long is shed at once however long its deadline, and one queued
    /// gives up when the wait runs out, not at its deadline.
    #[tokio::test(start_paused = true)]
    async fn no_request_waits_longer_than_the_longest_wait() {
        let gate = Gate::with_max_wait(2, 8, Duration::from_secs(1), Some(400 * MS));
        let (_a, _b) = (gate.try_admit(), gate.try_admit());
        tokio::time::sleep(500 * MS).await;
        // Nobody ahead: 0.5 s expected, within twice 400 ms.
        let t0 = Instant::now();
        let g = gate.clone();
        let queued = tokio::spawn(async move { g.admit(ask(60_000, 0)).await.map(|p| p.queued) });
        tokio::task::yield_now().await;
        assert_eq!(gate.state().queued, 1);
        // One ahead: 1 s expected, past twice 400 ms: shed, deadline or
        // not.
        let shed = gate.admit(ask(60_000, 0)).await;
        assert_eq!(
            shed.err(),
            Some(Refusal::Shed {
                expected_wait: Duration::from_secs(1)
            })
        );
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // No slot frees: it gives up after 400 ms, not 60 s.
        assert_eq!(
            queued.await.ok(),
            Some(Err(Refusal::GaveUp { waited: 400 * MS }))
        );
        assert_eq!(t0.elapsed(), 400 * MS);
        assert_eq!(gate.state().queued, 0);
    }

    /// Holds a slot for each of `times` in turn: what the gate learns its
    /// holding time (and that time's spread) from.
    async fn hold_for(gate: &Arc<Gate>, times: impl IntoIterator<Item = Duration>) {
        for t in times {
            let p = gate.try_admit();
            assert!(p.is_some());
            tokio::time::sleep(t).await;
            drop(p);
        }
    }

    /// Holding times of 2 s and 6 s in turn: 4 s on average, 2 s astray.
    fn varied() -> impl Iterator<Item = Duration> {
        [2, 6].into_iter().cycle().take(40).map(Duration::from_secs)
    }

    /// A slot that comes sooner than the average holding time predicts
    /// finds the request that arrived just before waiting for it when the
    /// holding times have shown they stray that far; when they have not
    /// (every one 4 s), the same request is shed on the guess. Only a
    /// first token that would not fit even with a slot at once sheds it.
    #[tokio::test(start_paused = true)]
    async fn a_slot_that_comes_early_finds_a_waiter() {
        let steady = Gate::with_max_wait(2, 8, Duration::from_secs(4), Some(400 * MS));
        hold_for(&steady, std::iter::repeat_n(Duration::from_secs(4), 40)).await;
        let gate = Gate::with_max_wait(2, 8, Duration::from_secs(4), Some(400 * MS));
        hold_for(&gate, varied()).await;
        assert_eq!(steady.state().spread, Duration::ZERO);
        assert!(
            gate.state().spread > Duration::from_millis(1500),
            "{:?}",
            gate.state()
        );
        let _steady_held = (steady.try_admit(), steady.try_admit());
        let (a, _b) = (gate.try_admit(), gate.try_admit());
        tokio::time::sleep(500 * MS).await;
        // The soonest slot is expected in about 3.5 s, far past the wait.
        assert!(matches!(
            steady.admit(ask(1_000, 0)).await,
            Err(Refusal::Shed { .. })
        ));
        // A first token expected in 2 s misses a 1 s deadline even now.
        let hopeless = Ask {
            expected_ttft: Duration::from_secs(2),
            ..ask(1_000, 0)
        };
        assert!(matches!(
            gate.admit(hopeless).await,
            Err(Refusal::Shed { .. })
        ));
        // One that fits with a slot soon waits, and gets the slot that
        // came early.
        let g = gate.clone();
        let waiter = tokio::spawn(async move { g.admit(ask(1_000, 0)).await.map(|p| p.queued) });
        tokio::time::sleep(150 * MS).await;
        drop(a);
        assert_eq!(waiter.await.ok(), Some(Ok(150 * MS)));
        assert_eq!(gate.counts.shed.load(Ordering::Relaxed), 1);
    }

    /// With a slot that may come, a request still stops waiting as soon as
    /// a slot could no longer give it its first token in time (before its
    /// deadline and before the longest wait); a full queue still refuses
    /// the next one, though fewer wait ahead of it than there are slots;
    /// and one with as many ahead as slots is shed on the guess.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_stops_when_a_slot_could_no_longer_serve_it() {
        let gate = Gate::with_max_wait(2, 1, Duration::from_secs(4), Some(400 * MS));
        hold_for(&gate, varied()).await;
        let (_a, _b) = (gate.try_admit(), gate.try_admit());
        // Held 3.5 s of about 4: the soonest slot is due in about 0.5 s.
        tokio::time::sleep(3500 * MS).await;
        // First token due within 300 ms, expected to take 100 ms: a slot
        // after 200 ms is of no use to it.
        let tight = Ask {
            expected_ttft: 100 * MS,
            ..ask(300, 0)
        };
        let t0 = Instant::now();
        let g = gate.clone();
        let waiter = tokio::spawn(async move { g.admit(tight).await.map(|p| p.queued) });
        tokio::task::yield_now().await;
        assert_eq!(gate.state().queued, 1);
        assert!(matches!(
            gate.admit(ask(60_000, 0)).await,
            Err(Refusal::Full { .. })
        ));
        assert_eq!(
            waiter.await.ok(),
            Some(Err(Refusal::GaveUp { waited: 200 * MS }))
        );
        assert_eq!(t0.elapsed(), 200 * MS);
        // Two waiting (a queue of two now), the third sheds at once.
        let gate = Gate::with_max_wait(2, 8, Duration::from_secs(4), Some(400 * MS));
        hold_for(&gate, varied()).await;
        let (_a, _b) = (gate.try_admit(), gate.try_admit());
        // Held 3.5 s of about 4: the soonest slot is due in about 0.5 s.
        tokio::time::sleep(3500 * MS).await;
        let mut queued = Vec::new();
        for _ in 0..2 {
            let g = gate.clone();
            queued.push(tokio::spawn(async move {
                g.admit(ask(60_000, 0)).await.is_ok()
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.state().queued, 2);
        assert!(matches!(
            gate.admit(ask(60_000, 0)).await,
            Err(Refusal::Shed { .. })
        ));
        for q in queued {
            assert_eq!(q.await.ok(), Some(false), "gave up after 400 ms");
        }
    }

    /// The soonest slot to come free is the longest-held one's: the
    /// holding time less its age, never less than a tenth of it.
    #[tokio::test(start_paused = true)]
    async fn the_wait_is_for_the_slot_held_longest() {
        let gate = Gate::new(2, 8, Duration::from_secs(4));
        let a = gate.try_admit();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let b = gate.try_admit();
        assert_eq!(gate.state().next_free, Some(Duration::from_secs(1)));
        assert_eq!(gate.state().wait_behind(0), Duration::from_secs(1));
        // Two ahead: then two more holding times over the two slots.
        assert_eq!(gate.state().wait_behind(2), Duration::from_secs(5));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(gate.state().next_free, Some(400 * MS), "overdue");
        drop(a);
        assert_eq!(gate.state().next_free, None, "a slot is free");
        let c = gate.try_admit();
        // b has held 2 s of the holding time now observed (a's 5 s).
        assert_eq!(gate.state().next_free, Some(Duration::from_secs(3)));
        drop((b, c));
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
        // A slot given back unused teaches nothing: no 0 s holding time
        // pulls the average down or widens the spread.
        let before = gate.state();
        if let Some(p) = gate.try_admit() {
            p.unused();
        }
        let after = gate.state();
        assert_eq!(
            (after.service, after.spread),
            (before.service, before.spread)
        );
        assert_eq!(after.busy, 0, "the slot is free again");
    }
}
