//! The semantic response cache. A finished, full answer is stored with the
//! embedding of its question, under a scope (tenant, collection, filter and
//! corpus version, so an ingest or a delete makes earlier answers
//! unreachable). A new question of the same scope reuses it when their
//! cosine similarity clears a threshold *and* the pair passes the
//! verification step in [`verify`] (negations, numbers, swapped entities).
//! Bounded in entries and age (`moka`).

pub mod verify;

use moka::sync::Cache;
pub use ragtime_core::Scope;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
pub use verify::{Analysed, Veto, analyse, veto};

use async_trait::async_trait;
use ragtime_core::{CachedAnswer, Cancel, ResponseCache};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheOptions {
    pub max_entries: u64,
    pub ttl: Duration,
    /// A cached question at least this similar (cosine), and not vetoed,
    /// is a hit. 0.96 keeps false hits under 1 % on the Quora pairs
    /// (`ragtime-bench cache`).
    pub min_cosine: f32,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            ttl: Duration::from_secs(3600),
            min_cosine: 0.96,
        }
    }
}

struct Entry<T> {
    scope: Scope,
    query: String,
    vector: Vec<f32>,
    analysed: Analysed,
    value: T,
}

/// A cached answer that matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit<T> {
    pub value: T,
    /// The question the answer was cached for.
    pub query: String,
    pub cosine: f32,
}

pub struct SemanticCache<T> {
    entries: Cache<u64, Arc<Entry<T>>>,
    opts: CacheOptions,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn normalise(q: &str) -> String {
    q.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

impl<T: Clone + Send + Sync + 'static> SemanticCache<T> {
    pub fn new(opts: CacheOptions) -> Self {
        Self {
            entries: Cache::builder()
                .max_capacity(opts.max_entries)
                .time_to_live(opts.ttl)
                .build(),
            opts,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn options(&self) -> CacheOptions {
        self.opts
    }

    /// The best verified answer for `query` (with its unit `vector`) in
    /// `scope`, if any.
    pub fn lookup(&self, scope: &Scope, query: &str, vector: &[f32]) -> Option<Hit<T>> {
        self.lookup_until(scope, query, vector, &Cancel::new())
    }

    /// As [`SemanticCache::lookup`], giving up (a miss) once `cancel` is
    /// set; the flag is checked every few hundred entries.
    pub fn lookup_until(
        &self,
        scope: &Scope,
        query: &str,
        vector: &[f32],
        cancel: &Cancel,
    ) -> Option<Hit<T>> {
        let asked = analyse(query);
        let mut best: Option<(f32, Arc<Entry<T>>)> = None;
        for (i, (_, e)) in self.entries.iter().enumerate() {
            if i % 256 == 255 && cancel.is_cancelled() {
                best = None;
                break;
            }
            if e.scope != *scope || e.vector.len() != vector.len() {
                continue;
            }
            let cosine = dot(&e.vector, vector);
            if cosine < self.opts.min_cosine
                || best.as_ref().is_some_and(|(c, _)| *c >= cosine)
                || veto(&e.analysed, &asked).is_some()
            {
                continue;
            }
            best = Some((cosine, e));
        }
        match best {
            Some((cosine, e)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(Hit {
                    value: e.value.clone(),
                    query: e.query.clone(),
                    cosine,
                })
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores an answer; the same question in the same scope replaces it.
    pub fn insert(&self, scope: Scope, query: &str, vector: Vec<f32>, value: T) {
        let mut h = DefaultHasher::new();
        scope.hash(&mut h);
        normalise(query).hash(&mut h);
        self.entries.insert(
            h.finish(),
            Arc::new(Entry {
                scope,
                query: query.to_owned(),
                analysed: analyse(query),
                vector,
                value,
            }),
        );
    }

    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (hits, misses) since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

/// The pipeline's response cache: answers with their citations.
#[async_trait]
impl ResponseCache for SemanticCache<CachedAnswer> {
    async fn lookup(
        &self,
        scope: &Scope,
        query: &str,
        vector: &[f32],
        cancel: Cancel,
    ) -> Option<CachedAnswer> {
        self.lookup_until(scope, query, vector, &cancel)
            .map(|h| h.value)
    }

    fn insert(&self, scope: Scope, query: &str, vector: Vec<f32>, answer: CachedAnswer) {
        SemanticCache::insert(self, scope, query, vector, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    fn scope(collection: &str, version: u64) -> Scope {
        Scope {
            tenant: "t".into(),
            collection: collection.into(),
            filter: "{}".into(),
            version,
        }
    }

    fn cache() -> SemanticCache<String> {
        SemanticCache::new(CacheOptions::default())
    }

    #[test]
    fn hits_a_paraphrase_in_the_same_scope_only() {
        let c = cache();
        let v = unit(&[1.0, 0.0, 0.0]);
        c.insert(
            scope("a", 1),
            "What is machine learning?",
            v.clone(),
            "ml".into(),
        );
        let near = unit(&[1.0, 0.05, 0.0]);
        let hit = c.lookup(&scope("a", 1), "What's machine learning?", &near);
        assert_eq!(hit.as_ref().map(|h| h.value.as_str()), Some("ml"));
        assert!(hit.is_some_and(|h| h.cosine > 0.99 && h.query == "What is machine learning?"));
        // Another collection, or a newer corpus version: no hit.
        assert!(
            c.lookup(&scope("b", 1), "What's machine learning?", &near)
                .is_none()
        );
        assert!(
            c.lookup(&scope("a", 2), "What's machine learning?", &near)
                .is_none()
        );
        // Far away in embedding space: no hit.
        let far = unit(&[0.0, 1.0, 0.0]);
        assert!(
            c.lookup(&scope("a", 1), "What is machine learning?", &far)
                .is_none()
        );
        assert_eq!(c.counts(), (1, 3));
    }

    #[test]
    fn a_negation_never_hits_even_at_cosine_one() {
        let c = cache();
        let v = unit(&[1.0, 2.0, 3.0]);
        c.insert(
            scope("a", 1),
            "Can I take aspirin with ibuprofen?",
            v.clone(),
            "yes".into(),
        );
        assert!(
            c.lookup(&scope("a", 1), "Can I not take aspirin with ibuprofen?", &v)
                .is_none()
        );
        assert!(
            c.lookup(&scope("a", 1), "can i take aspirin with ibuprofen", &v)
                .is_some()
        );
    }

    #[test]
    fn a_cancelled_scan_is_a_miss() {
        let c = cache();
        let v = unit(&[1.0, 1.0]);
        for i in 0..600 {
            c.insert(
                scope("a", 1),
                &format!("question {i}"),
                v.clone(),
                "x".into(),
            );
        }
        c.entries.run_pending_tasks();
        assert!(c.lookup(&scope("a", 1), "question 7", &v).is_some());
        let gone = Cancel::new();
        gone.cancel();
        assert!(
            c.lookup_until(&scope("a", 1), "question 7", &v, &gone)
                .is_none()
        );
    }

    #[test]
    fn the_same_question_replaces_its_entry() {
        let c = cache();
        let v = unit(&[1.0, 1.0]);
        c.insert(scope("a", 1), "What is RAG?", v.clone(), "old".into());
        c.insert(scope("a", 1), "what is  RAG?", v.clone(), "new".into());
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.lookup(&scope("a", 1), "What is RAG?", &v)
                .map(|h| h.value),
            Some("new".to_owned())
        );
    }
}
