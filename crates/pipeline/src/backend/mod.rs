//! The LLM backends a deployment has, and how a request reaches one:
//!
//! - each backend has an admission [`gate`] sized to its slots, what it
//!   has shown of its speed ([`BackendStats`]), a circuit [`breaker`] and
//!   the recent times to first token;
//! - [`Backends::pick`] routes to the backend with the least expected
//!   wait (queue ahead × observed service time ÷ slots, plus the expected
//!   time to first token for the prompt), weighted;
//! - a request whose first token has not come by the backend's p95 (within
//!   a floor and a cap) may be hedged to a second backend with a free slot,
//!   for at most a configured share of requests ([`HedgePolicy`]);
//! - a health probe per backend opens its breaker as soon as the backend
//!   stops answering, and closes it once a probe succeeds after the
//!   cool-down.

pub mod breaker;
pub mod gate;
pub mod load;
pub mod prefill;
pub mod stats;

use crate::backend::stats::BackendStats;
use breaker::{Breaker, BreakerState};
use gate::{Gate, GateState};
use prefill::Prefills;
use ragtime_core::Generator;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How one backend is set up.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Its address (for spans, logs and metrics).
    pub name: String,
    /// The model name sent to it.
    pub model: String,
    /// Concurrent sequences it serves (its slots).
    pub slots: usize,
    /// Requests that may wait for a slot.
    pub max_queue: usize,
    /// The longest a request waits for a slot (`None`: as long as its
    /// first-token deadline allows).
    pub max_queue_wait: Option<Duration>,
    /// Share of traffic relative to the others at equal expected wait.
    pub weight: f64,
    /// Tokens one sequence may hold (prompt and answer).
    pub context_tokens: usize,
}

/// TTFT samples kept per backend for its p95.
const TTFT_SAMPLES: usize = 256;

pub struct Backend {
    pub spec: BackendSpec,
    pub generator: Arc<dyn Generator>,
    pub gate: Arc<Gate>,
    pub stats: BackendStats,
    pub breaker: Breaker,
    /// The prompts it is reading now (kept for every backend; read only
    /// for one that reports its progress).
    pub prefills: Arc<Prefills>,
    ttft: Mutex<VecDeque<f64>>,
    /// Requests answered without asking it: its breaker was open and no
    /// other backend could take them.
    skipped: AtomicU64,
    /// When it last sent a token, for any request.
    last_token: Mutex<Option<tokio::time::Instant>>,
}

impl Backend {
    pub fn new(spec: BackendSpec, generator: Arc<dyn Generator>, breaker: Breaker) -> Arc<Self> {
        // Before anything was observed, a request is taken to hold a slot
        // for about two seconds (a short answer from a small CPU model).
        let gate = Gate::with_max_wait(
            spec.slots,
            spec.max_queue,
            Duration::from_secs(2),
            spec.max_queue_wait,
        );
        Arc::new(Self {
            spec,
            generator,
            gate,
            stats: BackendStats::default(),
            breaker,
            prefills: Arc::default(),
            ttft: Mutex::new(VecDeque::new()),
            skipped: AtomicU64::new(0),
            last_token: Mutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The time to first token expected for a prompt of `prompt_tokens`,
    /// from what the backend has shown.
    pub fn expected_ttft(&self, prompt_tokens: usize) -> Duration {
        let (base, per) = self.stats.estimates().ttft_line();
        let ms = base + per * prompt_tokens as f64;
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    /// The time to first token expected for a prompt of `prompt_tokens`
    /// sent now. A backend that reports its reading rate reads prompts one
    /// after another: the prompts in flight ahead of this one, then its
    /// own, at that rate. Any other: its learned time to first token,
    /// slowed by [`Backend::contention`].
    pub fn expected_first_token(&self, prompt_tokens: usize) -> Duration {
        match self.stats.estimates().ms_per_read_token {
            Some(ms) => {
                let tokens = self.prefills.backlog() + prompt_tokens as f64;
                Duration::from_secs_f64(ms * tokens / 1000.0)
            }
            None => self.expected_ttft(prompt_tokens).mul_f64(self.contention()),
        }
    }

    /// How much slower than its learned speed the backend prefills a
    /// request admitted now: the sequences running beside it share the
    /// backend's compute (on a CPU server, threads; on a GPU, batch slots),
    /// and another is likely to arrive during its prefill. So a prompt is
    /// sized, and shedding decided, as if the busy slots and one more were
    /// running beside it: 1 + min(busy + 1, slots − 1) / slots (1.5 always
    /// for the local default's two slots; near 1 for an idle wide server).
    pub fn contention(&self) -> f64 {
        let g = self.gate.state();
        let slots = g.slots.max(1);
        let beside = (g.busy + 1).min(slots - 1);
        1.0 + beside as f64 / slots as f64
    }

    /// The wait a request arriving now expects before its first token.
    pub fn expected_wait(&self, prompt_tokens: usize) -> Duration {
        let g = self.gate.state();
        g.wait_behind(g.queued) + self.expected_ttft(prompt_tokens)
    }

    /// A token came from it (any request's).
    pub fn saw_token(&self) {
        *self
            .last_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(tokio::time::Instant::now());
    }

    /// Whether it sent a token, for any request, since `at`: a backend
    /// that streams is alive, however late one request's first token.
    pub fn token_since(&self, at: tokio::time::Instant) -> bool {
        self.last_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| t >= at)
    }

    /// A first token came `after` the call (queueing not included).
    pub fn record_ttft(&self, after: Duration) {
        let mut q = self.ttft.lock().unwrap_or_else(PoisonError::into_inner);
        q.push_back(after.as_secs_f64());
        while q.len() > TTFT_SAMPLES {
            q.pop_front();
        }
    }

    /// p95 of the recent times to first token (from the call), once there
    /// are a few.
    pub fn p95_ttft(&self) -> Option<Duration> {
        let q = self.ttft.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() < 8 {
            return None;
        }
        let mut v: Vec<f64> = q.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        Some(Duration::from_secs_f64(
            ragtime_telemetry::window::percentile(&v, 95.0),
        ))
    }
}

/// When a slow first token is worth a second backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgePolicy {
    pub enabled: bool,
    /// Hedges at most this share of requests.
    pub share: f64,
    /// Hedge no earlier than this after the call…
    pub floor: Duration,
    /// …and no later than this, whatever the p95 says.
    pub cap: Duration,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            share: 0.1,
            floor: Duration::from_millis(200),
            cap: Duration::from_secs(2),
        }
    }
}

/// How busy the backends are, together.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Share of all slots in use.
    pub utilisation: f64,
    /// Requests waiting per slot.
    pub queue_per_slot: f64,
}

/// One backend's state, as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackendStatus {
    pub name: String,
    pub breaker: BreakerState,
    pub slots: usize,
    pub busy: usize,
    pub queued: usize,
    pub service_ms: f64,
    /// How far holding times stray from `service_ms` (mean absolute
    /// deviation).
    pub service_spread_ms: f64,
    pub ttft_p95_ms: Option<f64>,
    /// What it has shown of its speed: time to first token ≈
    /// `ttft_base_ms` + `ms_per_prompt_token` × prompt tokens.
    pub ttft_base_ms: f64,
    pub ms_per_prompt_token: f64,
    pub ms_per_output_token: f64,
    /// Its reading rate from its own progress reports (none from a
    /// backend that does not report progress).
    pub ms_per_read_token: Option<f64>,
    /// Prompt tokens in flight not yet read.
    pub prompt_backlog: f64,
    /// Tokens one sequence may hold.
    pub context_tokens: usize,
    pub admitted: u64,
    pub shed: u64,
    pub full: u64,
    pub timed_out: u64,
    /// Requests answered without the model while its breaker was open.
    pub skipped: u64,
}

pub struct Backends {
    pub list: Vec<Arc<Backend>>,
    pub hedge: HedgePolicy,
    requests: AtomicU64,
    hedges: AtomicU64,
}

impl Backends {
    pub fn new(list: Vec<Arc<Backend>>, hedge: HedgePolicy) -> Self {
        Self {
            list,
            hedge,
            requests: AtomicU64::new(0),
            hedges: AtomicU64::new(0),
        }
    }

    /// No backend could be asked (every breaker open): counted on each
    /// whose breaker kept the request away.
    pub fn note_skipped(&self) {
        for b in self.list.iter().filter(|b| !b.breaker.is_available()) {
            b.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The backend a request of `prompt_tokens` goes to: the least expected
    /// wait (weighted) among those whose breaker lets requests through,
    /// leaving out `exclude`.
    pub fn pick(&self, prompt_tokens: usize, exclude: &[&str]) -> Option<Arc<Backend>> {
        self.list
            .iter()
            .filter(|b| b.breaker.is_available() && !exclude.contains(&b.name()))
            .min_by(|a, b| {
                let cost = |x: &Backend| {
                    x.expected_wait(prompt_tokens).as_secs_f64() / x.spec.weight.max(1e-3)
                };
                cost(a).total_cmp(&cost(b))
            })
            .cloned()
    }

    /// A health check of backend `name` got through (as a probe would).
    pub fn reachable(&self, name: &str) {
        if let Some(b) = self.list.iter().find(|b| b.name() == name) {
            b.breaker.probed_ok();
        }
    }

    /// Counts a request that reached the LLM stages.
    pub fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// When to hedge a request on `primary` (none with a single backend or
    /// hedging off): its p95 time to first token within the floor and cap.
    pub fn hedge_after(&self, primary: &Backend) -> Option<Duration> {
        let h = self.hedge;
        if !h.enabled || self.list.len() < 2 {
            return None;
        }
        Some(primary.p95_ttft().unwrap_or(h.cap).clamp(h.floor, h.cap))
    }

    /// A second backend with a free slot, and its permit, if the share of
    /// hedged requests allows one more.
    pub fn hedge_target(&self, primary: &Backend) -> Option<(Arc<Backend>, gate::Permit)> {
        let requests = self.requests.load(Ordering::Relaxed) as f64;
        let hedges = self.hedges.load(Ordering::Relaxed) as f64;
        if hedges + 1.0 > self.hedge.share * requests.max(1.0) {
            return None;
        }
        let other = self
            .list
            .iter()
            .filter(|b| b.name() != primary.name() && b.breaker.is_available())
            .find_map(|b| b.gate.try_admit().map(|p| (b.clone(), p)))?;
        if !other.0.breaker.allow() {
            return None;
        }
        self.hedges.fetch_add(1, Ordering::Relaxed);
        Some(other)
    }

    /// (requests that reached the LLM stages, hedged ones).
    pub fn hedge_counts(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.hedges.load(Ordering::Relaxed),
        )
    }

    /// How busy the available backends are, together.
    pub fn load(&self) -> Load {
        let states: Vec<GateState> = self
            .list
            .iter()
            .filter(|b| b.breaker.is_available())
            .map(|b| b.gate.state())
            .collect();
        let slots: usize = states.iter().map(|s| s.slots).sum();
        if slots == 0 {
            return Load {
                utilisation: 1.0,
                queue_per_slot: f64::INFINITY,
            };
        }
        Load {
            utilisation: states.iter().map(|s| s.busy).sum::<usize>() as f64 / slots as f64,
            queue_per_slot: states.iter().map(|s| s.queued).sum::<usize>() as f64 / slots as f64,
        }
    }

    /// Whether every available backend's queue is at its hard limit (a new
    /// request is refused with 503 before its answer starts), and how long
    /// the shortest queue needs to drain.
    pub fn saturated(&self) -> Option<Duration> {
        let mut drain: Option<Duration> = None;
        for b in self.list.iter().filter(|b| b.breaker.is_available()) {
            let s = b.gate.state();
            if s.queued < b.spec.max_queue || s.busy < s.slots {
                return None;
            }
            let d = s.wait_behind(s.queued);
            drain = Some(drain.map_or(d, |x| x.min(d)));
        }
        drain
    }

    pub fn status(&self) -> Vec<BackendStatus> {
        self.list
            .iter()
            .map(|b| {
                let g = b.gate.state();
                let c = &b.gate.counts;
                let e = b.stats.estimates();
                BackendStatus {
                    ttft_base_ms: e.ttft_base_ms,
                    ms_per_prompt_token: e.ms_per_prompt_token,
                    ms_per_output_token: e.ms_per_output_token,
                    ms_per_read_token: e.ms_per_read_token,
                    prompt_backlog: b.prefills.backlog(),
                    context_tokens: b.spec.context_tokens,
                    name: b.name().to_owned(),
                    breaker: b.breaker.state(),
                    slots: g.slots,
                    busy: g.busy,
                    queued: g.queued,
                    service_ms: g.service.as_secs_f64() * 1000.0,
                    service_spread_ms: g.spread.as_secs_f64() * 1000.0,
                    ttft_p95_ms: b.p95_ttft().map(|d| d.as_secs_f64() * 1000.0),
                    admitted: c.admitted.load(Ordering::Relaxed),
                    shed: c.shed.load(Ordering::Relaxed),
                    full: c.full.load(Ordering::Relaxed),
                    timed_out: c.timed_out.load(Ordering::Relaxed),
                    skipped: b.skipped.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Probes every backend every `every` until `self` is dropped: a probe
    /// that cannot connect or is refused opens its breaker at once; one that
    /// gets through closes a breaker the probes opened at once (and one
    /// opened by failing requests after its cool-down). A probe that is only
    /// slow says nothing: a busy server answers slowly, and a hung one is
    /// caught by its requests' own failures.
    pub fn probe(self: &Arc<Self>, every: Duration) {
        let me = Arc::downgrade(self);
        let patience = every.max(Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // A backend that has not answered yet is starting (the local
            // server loads its model): not a warning until it was up once.
            let mut was_up = Vec::new();
            loop {
                tick.tick().await;
                let Some(bs) = me.upgrade() else {
                    return;
                };
                was_up.resize(bs.list.len(), false);
                for (b, was_up) in bs.list.iter().zip(was_up.iter_mut()) {
                    let Ok(answer) = tokio::time::timeout(patience, b.generator.ping()).await
                    else {
                        continue;
                    };
                    let up = answer.is_ok();
                    match (up, b.breaker.state()) {
                        (false, BreakerState::Open) => {}
                        (false, _) if !*was_up => {
                            tracing::info!(backend = b.name(), "llm backend not answering yet");
                            b.breaker.trip();
                        }
                        (false, _) => {
                            tracing::warn!(backend = b.name(), "llm backend down: breaker open");
                            b.breaker.trip();
                        }
                        (true, BreakerState::Closed) => {}
                        (true, _) => {
                            b.breaker.probed_ok();
                            if b.breaker.state() == BreakerState::Closed {
                                let msg = if *was_up {
                                    "llm backend back: breaker closed"
                                } else {
                                    "llm backend up"
                                };
                                tracing::info!(backend = b.name(), "{msg}");
                            }
                        }
                    }
                    *was_up |= up;
                }
            }
        });
    }
}
