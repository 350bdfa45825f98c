//! The grounding check (`verify`): each sentence of a generated answer
//! against the passages it cites (all the prompt's passages when it cites
//! none). A sentence is supported when every specific term in it — code,
//! flag, path, number, identifier — occurs in those passages, and it says
//! what one of their sentences says (cosine similarity under the embedding
//! model). The passages' sentences are embedded ahead, while the model
//! generates ([`embed_sources`]); after generation, only the answer's
//! sentences (and any source sentence not embedded ahead), in one batch.
//! Both at full precision: the int8 passage graph quantises each batch by
//! its own range, so a sentence's vector would depend on what it was
//! batched with, and a verdict near the threshold with it.

use crate::chat::text::{cited, content_words, normalised, sentences, specific_terms};
use ragtime_core::{Cancel, Embedder, Grounding, Passage};
use std::collections::{HashMap, HashSet};

/// Similarity at which a source sentence is taken to say what an answer
/// sentence says.
pub const SUPPORT_COSINE: f32 = 0.62;
/// Source sentences compared with each answer sentence at most (the ones
/// sharing most words with it).
const PER_SENTENCE: usize = 3;
/// Words of an answer sentence compared with its sources at most.
const CLAIM_WORDS: usize = 40;
/// Answer sentences checked at most (the first ones: what a user reads),
/// so the check fits its 50 ms on two cores.
const MAX_CLAIMS: usize = 6;

/// One answer sentence to check.
struct Claim<'a> {
    text: &'a str,
    /// A specific term no source contains.
    missing: Option<String>,
    /// Indexes (into the batch) of the source sentences to compare with.
    compare: Vec<usize>,
}

/// Whether `s` says anything that could be checked: a few words, not
/// only citation marks or a list marker.
fn checkable(s: &str) -> bool {
    content_words(s).len() >= 3
}

/// Source sentences embedded ahead of the check (while the model
/// generates), so that after generation only the answer's sentences are.
pub type SourceVectors = HashMap<String, Vec<f32>>;

/// Source sentences embedded ahead at most: the passages' first ones, in
/// rank order.
const AHEAD: usize = 48;

/// Embeds the sentences of `passages` ahead of the check; empty when the
/// embedding fails or is cancelled (the check then embeds what it needs).
pub async fn embed_sources(
    passages: &[Passage],
    embedder: &dyn Embedder,
    cancel: Cancel,
) -> SourceVectors {
    let mut texts: Vec<String> = Vec::new();
    for p in passages {
        for s in sentences(&p.chunk.text) {
            if texts.len() < AHEAD && !texts.iter().any(|t| t == s) {
                texts.push(s.to_owned());
            }
        }
    }
    if texts.is_empty() {
        return SourceVectors::new();
    }
    match embedder.embed_texts(texts.clone(), cancel).await {
        Ok(v) if v.len() == texts.len() => texts.into_iter().zip(v).collect(),
        _ => SourceVectors::new(),
    }
}

/// Checks `answer` against `passages` (numbered from 1 as in the prompt),
/// using the source sentences' vectors in `ahead` where it has them.
/// `None` when the check could not finish (the embedding failed or ran out
/// of time): nothing is claimed either way.
pub async fn check(
    answer: &str,
    passages: &[Passage],
    ahead: &SourceVectors,
    embedder: &dyn Embedder,
    cancel: Cancel,
) -> Option<Grounding> {
    let mut batch: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = Default::default();
    // Vectors already known, by the batch index they stand in for.
    let mut known: HashMap<usize, &[f32]> = HashMap::new();
    let texts: Vec<String> = passages
        .iter()
        .map(|p| normalised(&format!("{}\n{}", p.chunk.heading(), p.chunk.text)))
        .collect();
    let source_sentences: Vec<Vec<&str>> =
        passages.iter().map(|p| sentences(&p.chunk.text)).collect();
    let mut claims = Vec::new();
    for s in sentences(answer)
        .into_iter()
        .filter(|s| checkable(s))
        .take(MAX_CLAIMS)
    {
        let valid: Vec<usize> = cited(s)
            .into_iter()
            .filter(|n| (1..=passages.len()).contains(n))
            .map(|n| n - 1)
            .collect();
        let sources = if valid.is_empty() {
            (0..passages.len()).collect()
        } else {
            valid
        };
        let missing = specific_terms(s).into_iter().find(|t| {
            let t = normalised(t);
            !sources.iter().any(|&i| texts[i].contains(&t))
        });
        let mut compare = Vec::new();
        for t in nearest(s, &sources, &source_sentences) {
            let at = *index.entry(t.to_owned()).or_insert_with(|| {
                batch.push(t.to_owned());
                batch.len() - 1
            });
            if let Some(v) = ahead.get(t) {
                known.insert(at, v);
            }
            compare.push(at);
        }
        claims.push(Claim {
            text: s,
            missing,
            compare,
        });
    }
    if claims.is_empty() {
        return Some(Grounding::default());
    }
    let first_claim = batch.len();
    // A run-on sentence (a model that lists or loops) is compared by its
    // beginning: its embedding costs grow with its length, and the check
    // has 50 ms.
    batch.extend(claims.iter().map(|c| {
        let words: Vec<&str> = c.text.split_whitespace().take(CLAIM_WORDS).collect();
        words.join(" ")
    }));
    // Only what was not embedded ahead goes to the model.
    let wanted: Vec<usize> = (0..batch.len())
        .filter(|i| !known.contains_key(i))
        .collect();
    let texts = wanted
        .iter()
        .map(|&i| std::mem::take(&mut batch[i]))
        .collect();
    let embedded = embedder.embed_texts(texts, cancel).await.ok()?;
    let mut vectors: Vec<&[f32]> = vec![&[]; batch.len()];
    for (i, v) in known {
        vectors[i] = v;
    }
    for (&i, v) in wanted.iter().zip(&embedded) {
        vectors[i] = v;
    }
    Some(verdict(&claims, &vectors, first_claim))
}

/// The source sentences (of passages `sources`) sharing most words with
/// claim `s`, at most [`PER_SENTENCE`].
fn nearest<'a>(s: &str, sources: &[usize], source_sentences: &[Vec<&'a str>]) -> Vec<&'a str> {
    let words: HashSet<String> = content_words(s).into_iter().collect();
    let mut near: Vec<(usize, &str)> = sources
        .iter()
        .flat_map(|&i| source_sentences[i].iter().copied())
        .map(|t| {
            let w: HashSet<String> = content_words(t).into_iter().collect();
            (words.intersection(&w).count(), t)
        })
        .collect();
    near.sort_by_key(|n| std::cmp::Reverse(n.0));
    near.truncate(PER_SENTENCE);
    near.into_iter().map(|(_, t)| t).collect()
}

/// Each claim supported when it names nothing the sources lack and its
/// vector (at `first_claim` + its index) is close enough to one of the
/// source sentences it is compared with.
fn verdict(claims: &[Claim<'_>], vectors: &[&[f32]], first_claim: usize) -> Grounding {
    let cos =
        |a: usize, b: usize| -> f32 { vectors[a].iter().zip(vectors[b]).map(|(x, y)| x * y).sum() };
    let mut g = Grounding::default();
    for (k, c) in claims.iter().enumerate() {
        let best = c
            .compare
            .iter()
            .map(|&i| cos(first_claim + k, i))
            .fold(f32::MIN, f32::max);
        let said = best >= SUPPORT_COSINE;
        g.sentences += 1;
        match (&c.missing, said) {
            (None, true) => g.supported += 1,
            (Some(term), _) => g
                .unsupported
                .push(format!("{} (not in the sources: {term})", c.text)),
            (None, false) => g.unsupported.push(c.text.to_owned()),
        }
    }
    g
}
