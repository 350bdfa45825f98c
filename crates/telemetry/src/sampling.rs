//! Which traces leave the process: a share of the healthy ones, every
//! degraded one.
//!
//! The decision has two halves. At a trace's first span, [`HeadSampler`]
//! marks it *sampled* when its caller's `traceparent` says so, or — for a
//! trace that starts here — for a `ratio` share of them (every 1/ratio-th
//! new trace, counted: an exact share at any volume, where a random draw
//! over trace ids wanders by ±3 points at a few hundred requests). Spans of
//! traces not chosen are still recorded. When the last of a trace's local
//! roots ends (one per request: a caller may send several requests under
//! one trace id), [`TailProcessor`] exports the held spans of an unsampled
//! trace anyway if any of its requests degraded — partial, a stage
//! overran, shed, refused for load or failed — and drops them otherwise.
//! Spans of sampled traces pass straight through; only unsampled ones
//! wait, in a buffer bounded in spans and in bytes: when it is full the
//! oldest held traces are given up (counted) to make room, and a span that
//! still does not fit is dropped and counted. Every step is a lookup by
//! trace id or a look at the oldest held trace: no span ending scans the
//! buffer.
//!
//! No crate does this: the OpenTelemetry SDK samples at the head only, and
//! tail sampling elsewhere lives in the Collector, a separate process that
//! must see every span of every trace.

use opentelemetry::trace::{SpanContext, SpanId, Status, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    SamplingDecision, SamplingResult, ShouldSample, Span, SpanData, SpanProcessor,
};
use prometheus_client::metrics::counter::Counter;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How traces are chosen for export.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Share of healthy traces that start here to export, 0 to 1.
    pub ratio: f64,
    /// Spans of unsampled traces held until their root ends.
    pub buffer_spans: usize,
    /// The same bound in bytes (estimated from the spans' names,
    /// attributes and events).
    pub buffer_bytes: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            ratio: 1.0,
            buffer_spans: 20_000,
            buffer_bytes: 64 << 20,
        }
    }
}

/// What the sampler did, for `/metrics` (process-wide, like the exporter).
#[derive(Debug, Default)]
pub struct SamplingCounters {
    /// Spans handed to the exporter.
    pub exported_spans: Counter,
    /// Spans lost because the buffer was full.
    pub dropped_spans: Counter,
    /// Traces not chosen at the head but exported because they degraded.
    pub kept_degraded: Counter,
    /// Traces neither chosen nor degraded, not exported.
    pub sampled_out: Counter,
}

/// The process's sampling counters.
pub fn counters() -> &'static SamplingCounters {
    static C: LazyLock<SamplingCounters> = LazyLock::new(SamplingCounters::default);
    &C
}

/// The head half: parent-based, then a counted share of new traces.
/// Never drops a span: the unsampled ones are recorded for the tail half.
#[derive(Debug, Clone)]
pub struct HeadSampler {
    /// Fixed point: the ratio in millionths; `seen` counts new traces.
    per_million: u64,
    seen: Arc<AtomicU64>,
}

impl HeadSampler {
    pub fn new(ratio: f64) -> Self {
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            1.0
        };
        Self {
            per_million: (ratio * 1e6).round() as u64,
            seen: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether the next new trace is one of the share: the n-th is chosen
    /// when ⌊n·r⌋ moves, so exactly ⌊N·r⌋ of the first N are.
    fn choose(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        (n + 1) * self.per_million / 1_000_000 > n * self.per_million / 1_000_000
    }
}

impl ShouldSample for HeadSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        _trace_id: TraceId,
        _name: &str,
        _span_kind: &opentelemetry::trace::SpanKind,
        _attributes: &[KeyValue],
        _links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let parent = parent_context
            .filter(|cx| cx.has_active_span())
            .map(|cx| cx.span().span_context().clone());
        let sampled = match &parent {
            Some(p) if p.is_valid() => p.is_sampled(),
            _ => self.choose(),
        };
        SamplingResult {
            decision: if sampled {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::RecordOnly
            },
            attributes: Vec::new(),
            trace_state: parent.map_or_else(TraceState::default, |p| p.trace_state().clone()),
        }
    }
}

/// Whether a finished span says its request degraded: partial, a stage
/// overran, shed or refused for load, failed.
pub fn degraded(span: &SpanData) -> bool {
    if matches!(span.status, Status::Error { .. }) {
        return true;
    }
    if span.events.iter().any(|e| e.name == "budget.overrun") {
        return true;
    }
    span.attributes
        .iter()
        .any(|kv| match (kv.key.as_str(), &kv.value) {
            ("ragtime.partial", Value::Bool(b)) => *b,
            ("http.response.status_code", Value::I64(s)) => *s >= 500 || *s == 429,
            _ => false,
        })
}

/// About how many bytes a span holds (its text and attribute values;
/// numbers count 8). Cheap: a walk over what the span carries.
fn span_bytes(span: &SpanData) -> usize {
    fn value(v: &Value) -> usize {
        match v {
            Value::String(s) => s.as_str().len(),
            Value::Array(a) => match a {
                opentelemetry::Array::String(v) => v.iter().map(|s| s.as_str().len()).sum(),
                opentelemetry::Array::Bool(v) => v.len(),
                opentelemetry::Array::I64(v) => 8 * v.len(),
                opentelemetry::Array::F64(v) => 8 * v.len(),
                _ => 8,
            },
            _ => 8,
        }
    }
    let attrs = |kvs: &[KeyValue]| -> usize {
        kvs.iter()
            .map(|kv| 16 + kv.key.as_str().len() + value(&kv.value))
            .sum()
    };
    let events: usize = span
        .events
        .iter()
        .map(|e| 32 + e.name.len() + attrs(&e.attributes))
        .sum();
    std::mem::size_of::<SpanData>() + span.name.len() + attrs(&span.attributes) + events
}

/// An unsampled trace's spans, held until its last local root ends.
struct Held {
    since: Instant,
    spans: Vec<SpanData>,
    bytes: usize,
    /// Local roots (requests) started and not ended yet.
    open_roots: usize,
    /// Whether any span of it so far says its request degraded.
    degraded: bool,
}

impl Held {
    fn new() -> Self {
        Self {
            since: Instant::now(),
            spans: Vec::new(),
            bytes: 0,
            open_roots: 0,
            degraded: false,
        }
    }
}

#[derive(Default)]
struct Buffer {
    traces: HashMap<TraceId, Held>,
    /// Held traces by when their first span came, oldest first (an entry
    /// whose trace has gone, or came again later, is skipped).
    arrivals: VecDeque<(Instant, TraceId)>,
    spans: usize,
    bytes: usize,
    /// Recent decisions, for spans that end after their root (a task the
    /// request spawned): trace → exported.
    decided: HashMap<TraceId, bool>,
    order: VecDeque<TraceId>,
}

const DECISIONS_KEPT: usize = 4096;

impl Buffer {
    fn decide(&mut self, trace: TraceId, export: bool) {
        if self.decided.insert(trace, export).is_none() {
            self.order.push_back(trace);
            if self.order.len() > DECISIONS_KEPT
                && let Some(old) = self.order.pop_front()
            {
                self.decided.remove(&old);
            }
        }
    }

    /// The trace's held entry, made (and queued by age) if new.
    fn held(&mut self, trace: TraceId) -> &mut Held {
        if !self.traces.contains_key(&trace) && self.arrivals.len() > 2 * self.traces.len() + 1024 {
            // Mostly entries of traces decided since, behind an old one
            // still open: pruned now and then (amortised, not per span).
            let traces = &self.traces;
            self.arrivals
                .retain(|(since, t)| traces.get(t).is_some_and(|h| h.since == *since));
        }
        let arrivals = &mut self.arrivals;
        self.traces.entry(trace).or_insert_with(|| {
            let h = Held::new();
            arrivals.push_back((h.since, trace));
            h
        })
    }

    /// Takes a trace out of the buffer.
    fn take(&mut self, trace: TraceId) -> Option<Held> {
        let h = self.traces.remove(&trace)?;
        self.spans -= h.spans.len();
        self.bytes -= h.bytes;
        Some(h)
    }

    /// Gives up the oldest held traces until a span of `bytes` of
    /// `trace` fits (never `trace` itself); true if it does. Under a flood of traces whose roots
    /// do not end, the newest requests — most of them short — are the
    /// ones that stay whole. Each queued arrival is looked at once.
    fn make_room(&mut self, caps: (usize, usize), bytes: usize, trace: TraceId) -> bool {
        let fits = |b: &Self| b.spans < caps.0 && b.bytes + bytes <= caps.1;
        while !fits(self) {
            let Some(&(since, oldest)) = self.arrivals.front() else {
                break;
            };
            match self.traces.get(&oldest) {
                // The span's own trace is the oldest: the span is the one
                // that goes.
                Some(h) if h.since == since && oldest == trace => break,
                Some(h) if h.since == since => {
                    if let Some(h) = self.take(oldest) {
                        counters().dropped_spans.inc_by(h.spans.len() as u64);
                    }
                }
                // Decided already, or held anew since.
                _ => {}
            }
            self.arrivals.pop_front();
        }
        fits(self)
    }
}

/// The tail half, in front of the batch exporter.
pub struct TailProcessor<P> {
    next: P,
    /// The buffer's bounds: spans, bytes.
    cap: (usize, usize),
    buffer: Mutex<Buffer>,
}

impl<P: std::fmt::Debug> std::fmt::Debug for TailProcessor<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailProcessor")
            .field("next", &self.next)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

impl<P: SpanProcessor> TailProcessor<P> {
    pub fn new(next: P, buffer_spans: usize, buffer_bytes: usize) -> Self {
        Self {
            next,
            cap: (buffer_spans, buffer_bytes),
            buffer: Mutex::new(Buffer::default()),
        }
    }

    fn export(&self, mut span: SpanData) {
        if !span.span_context.is_sampled() {
            // Exported after all: the exporter sends sampled spans only.
            let c = &span.span_context;
            span.span_context = SpanContext::new(
                c.trace_id(),
                c.span_id(),
                c.trace_flags().with_sampled(true),
                c.is_remote(),
                c.trace_state().clone(),
            );
        }
        counters().exported_spans.inc();
        self.next.on_end(span);
    }
}

fn is_root(span: &SpanData) -> bool {
    span.parent_span_id == SpanId::INVALID || span.parent_span_is_remote
}

impl<P: SpanProcessor> SpanProcessor for TailProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        use opentelemetry::trace::Span as _;
        let sc = span.span_context();
        // A local root (a request) of an unsampled trace: the trace is
        // decided once every such root has ended.
        let parent = cx
            .has_active_span()
            .then(|| cx.span().span_context().clone());
        let local_root = parent.is_none_or(|p| !p.is_valid() || p.is_remote());
        if local_root && !sc.is_sampled() && sc.is_valid() {
            let trace = sc.trace_id();
            let mut b = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            match b.decided.get(&trace) {
                // Exported already: its new request's spans follow.
                Some(true) => {}
                // Dropped as healthy, and a new request comes under it: held
                // and decided again when that one ends.
                Some(false) => {
                    b.decided.remove(&trace);
                    b.held(trace).open_roots += 1;
                }
                None => b.held(trace).open_roots += 1,
            }
        }
        self.next.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() {
            return self.export(span);
        }
        let trace = span.span_context.trace_id();
        let mut b = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&export) = b.decided.get(&trace) {
            drop(b);
            if export {
                self.export(span);
            }
            return;
        }
        let root = is_root(&span);
        let bad = degraded(&span);
        let last_root = root && {
            let h = b.held(trace);
            h.open_roots = h.open_roots.saturating_sub(1);
            h.degraded |= bad;
            h.open_roots == 0
        };
        if !last_root {
            // Held: a child, or a root whose trace has another request
            // still open. Its verdict is kept even if the span is not.
            b.held(trace).degraded |= bad;
            let bytes = span_bytes(&span);
            if b.make_room(self.cap, bytes, trace) {
                b.spans += 1;
                b.bytes += bytes;
                let h = b.held(trace);
                h.bytes += bytes;
                h.spans.push(span);
            } else {
                counters().dropped_spans.inc();
            }
            return;
        }
        let held = b.take(trace);
        let keep = held.as_ref().is_some_and(|h| h.degraded) || bad;
        b.decide(trace, keep);
        drop(b);
        if keep {
            counters().kept_degraded.inc();
            for s in held.map(|h| h.spans).unwrap_or_default() {
                self.export(s);
            }
            self.export(span);
        } else {
            counters().sampled_out.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.next.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, SpanKind, TraceFlags, Tracer, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// Collects what reaches the exporter.
    #[derive(Debug, Clone, Default)]
    struct Sink(Arc<Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Sink {
        fn on_start(&self, _: &mut Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            assert!(span.span_context.is_sampled(), "only sampled spans go out");
            self.0.lock().expect("sink").push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn provider(ratio: f64, cap: usize) -> (SdkTracerProvider, Sink) {
        let sink = Sink::default();
        let p = SdkTracerProvider::builder()
            .with_sampler(HeadSampler::new(ratio))
            .with_span_processor(TailProcessor::new(sink.clone(), cap, usize::MAX))
            .build();
        (p, sink)
    }

    /// One request: a root with two children; `partial` marks it degraded
    /// on the root, `overrun` with an event on a child.
    fn request(p: &SdkTracerProvider, partial: bool, overrun: bool) -> TraceId {
        let t = p.tracer("t");
        let root = t.start("request");
        let trace = root.span_context().trace_id();
        let cx = Context::current_with_span(root);
        for name in ["embed", "retrieve"] {
            let mut child = t.start_with_context(name, &cx);
            if overrun && name == "retrieve" {
                child.add_event("budget.overrun", vec![]);
            }
            child.end();
        }
        let root = cx.span();
        root.set_attribute(KeyValue::new("ragtime.partial", partial));
        root.end();
        trace
    }

    fn traces(sink: &Sink) -> HashMap<TraceId, usize> {
        let mut m = HashMap::new();
        for s in sink.0.lock().expect("sink").iter() {
            *m.entry(s.span_context.trace_id()).or_default() += 1;
        }
        m
    }

    #[test]
    fn a_tenth_of_healthy_traces_and_every_degraded_one_go_out_whole() {
        let (p, sink) = provider(0.1, 1000);
        let mut degraded = Vec::new();
        for i in 0..200 {
            // Every seventh request degrades, one way or the other.
            let bad = i % 7 == 3;
            let t = request(&p, bad && i % 2 == 0, bad && i % 2 == 1);
            if bad {
                degraded.push(t);
            }
        }
        let out = traces(&sink);
        for t in &degraded {
            assert_eq!(out.get(t), Some(&3), "a degraded trace goes out whole");
        }
        assert!(out.values().all(|&n| n == 3), "no trace goes out in part");
        // 20 of 200 chosen at the head, some of them degraded anyway.
        let chosen_healthy = out.keys().filter(|t| !degraded.contains(t)).count();
        let healthy = 200 - degraded.len();
        let expected = 20 - (0..200).filter(|i| i % 10 == 9 && i % 7 == 3).count();
        assert_eq!(chosen_healthy, expected, "of {healthy} healthy");
    }

    fn trace(n: u128) -> TraceId {
        TraceId::from_bytes(n.to_be_bytes())
    }

    #[test]
    fn a_sampled_caller_is_honoured_and_an_unsampled_one_is_not_overruled() {
        let (p, sink) = provider(0.0, 1000);
        let t = p.tracer("t");
        let remote = |id, flags| {
            Context::new().with_remote_span_context(SpanContext::new(
                trace(id),
                SpanId::from_bytes(1_u64.to_be_bytes()),
                flags,
                true,
                TraceState::default(),
            ))
        };
        for (id, flags) in [(8, TraceFlags::SAMPLED), (7, TraceFlags::default())] {
            let mut s = t
                .span_builder("request")
                .with_kind(SpanKind::Server)
                .start_with_context(&t, &remote(id, flags));
            s.end();
        }
        let out = traces(&sink);
        assert_eq!(out.len(), 1);
        assert!(out.contains_key(&trace(8)));
        // The unsampled caller's trace still goes out when it fails.
        let mut s = t.start_with_context("request", &remote(9, TraceFlags::default()));
        s.set_status(Status::error("boom"));
        s.end();
        assert!(traces(&sink).contains_key(&trace(9)));
    }

    #[test]
    fn a_full_buffer_drops_spans_and_counts_them() {
        let (p, sink) = provider(0.0, 2);
        let before = counters().dropped_spans.get();
        let t = p.tracer("t");
        let root = t.start("request");
        let cx = Context::current_with_span(root);
        for _ in 0..5 {
            t.start_with_context("child", &cx).end();
        }
        let root = cx.span();
        root.set_attribute(KeyValue::new("ragtime.partial", true));
        root.end();
        // Two children were held, three dropped; the root and the two go out.
        assert!(counters().dropped_spans.get() - before >= 3);
        assert_eq!(traces(&sink).values().copied().collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn a_span_that_ends_after_its_root_follows_the_decision() {
        let (p, sink) = provider(0.0, 100);
        let t = p.tracer("t");
        let root = t.start("request");
        let cx = Context::current_with_span(root);
        let mut late = t.start_with_context("verify", &cx);
        let root = cx.span();
        root.set_attribute(KeyValue::new("http.response.status_code", 503_i64));
        root.end();
        late.end();
        assert_eq!(traces(&sink).values().copied().collect::<Vec<_>>(), vec![2]);
    }

    /// A caller that sends two requests under one trace id: the healthy
    /// one ends first, the degraded one after. The trace is decided when
    /// both have ended, and goes out whole.
    #[test]
    fn requests_sharing_a_callers_trace_are_decided_together() {
        let (p, sink) = provider(0.0, 1000);
        let t = p.tracer("t");
        let caller = Context::new().with_remote_span_context(SpanContext::new(
            trace(42),
            SpanId::from_bytes(1_u64.to_be_bytes()),
            TraceFlags::default(),
            true,
            TraceState::default(),
        ));
        let healthy = Context::current_with_span(t.start_with_context("request", &caller));
        let bad = Context::current_with_span(t.start_with_context("request", &caller));
        t.start_with_context("embed", &healthy).end();
        t.start_with_context("embed", &bad).end();
        healthy.span().end();
        assert!(
            traces(&sink).is_empty(),
            "not decided while a request is open"
        );
        let mut child = t.start_with_context("retrieve", &bad);
        child.add_event("budget.overrun", vec![]);
        child.end();
        bad.span().end();
        assert_eq!(
            traces(&sink).get(&trace(42)),
            Some(&5),
            "both requests, whole"
        );
    }

    /// Many traces whose roots never end fill the buffer; degraded
    /// requests arriving among them still go out whole (the oldest held
    /// traces give way), and the byte bound holds as well as the span one.
    #[test]
    fn a_flood_of_long_traces_keeps_degraded_requests_whole() {
        for (spans, bytes) in [(500, usize::MAX), (usize::MAX, 400 * 1024)] {
            let sink = Sink::default();
            let p = SdkTracerProvider::builder()
                .with_sampler(HeadSampler::new(0.0))
                .with_span_processor(TailProcessor::new(sink.clone(), spans, bytes))
                .build();
            let t = p.tracer("t");
            let mut open = Vec::new();
            let mut degraded = Vec::new();
            for i in 0..400 {
                // A long request: its root stays open, its children pile up.
                let root = Context::current_with_span(t.start("stream"));
                for _ in 0..20 {
                    let mut c = t.start_with_context("token", &root);
                    c.set_attribute(KeyValue::new("text", "x".repeat(200)));
                    c.end();
                }
                open.push(root);
                if i % 10 == 0 {
                    degraded.push(request(&p, true, false));
                }
            }
            let out = traces(&sink);
            assert_eq!(out.len(), degraded.len(), "{spans} spans, {bytes} bytes");
            for d in &degraded {
                assert_eq!(out.get(d), Some(&3), "whole: {spans} spans, {bytes} bytes");
            }
        }
    }

    #[test]
    fn the_share_is_exact() {
        for (ratio, n, want) in [
            (0.1, 1000, 100),
            (0.25, 400, 100),
            (1.0, 50, 50),
            (0.0, 50, 0),
        ] {
            let s = HeadSampler::new(ratio);
            let got = (0..n).filter(|_| s.choose()).count();
            assert_eq!(got, want, "ratio {ratio}");
        }
    }
}
