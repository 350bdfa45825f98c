//! The verification step on a candidate hit. Cosine similarity of sentence
//! embeddings cannot tell "how do I X" from "how do I not X", or "from
//! Paris to London" from "from London to Paris": such pairs score higher
//! than most true paraphrases. So a candidate above the cosine floor is
//! checked word by word:
//!
//! - **hard vetoes**: a negation on one side only, a number on one side
//!   only, or entities swapped around a directional word (`to`, `from`,
//!   `than`, `vs`, …);
//! - **a score** combining cosine with lexical agreement (content-word
//!   overlap, words left unmatched, a different question word), a logistic
//!   model fitted on the labelled Quora pairs (`ragtime-bench cache`).

use std::collections::HashSet;

const STOP: &[&str] = &[
    "a",
    "an",
    "the",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "am",
    "do",
    "does",
    "did",
    "doing",
    "i",
    "me",
    "my",
    "we",
    "our",
    "you",
    "your",
    "he",
    "she",
    "it",
    "its",
    "they",
    "them",
    "their",
    "his",
    "her",
    "this",
    "that",
    "these",
    "those",
    "of",
    "in",
    "on",
    "at",
    "by",
    "for",
    "with",
    "about",
    "as",
    "and",
    "or",
    "but",
    "if",
    "so",
    "can",
    "could",
    "should",
    "would",
    "will",
    "shall",
    "may",
    "might",
    "must",
    "have",
    "has",
    "had",
    "what",
    "why",
    "how",
    "when",
    "where",
    "who",
    "whom",
    "whose",
    "which",
    "there",
    "here",
    "any",
    "some",
    "all",
    "much",
    "many",
    "more",
    "most",
    "get",
    "one",
    "ones",
    "someone",
    "something",
    "anyone",
    "us",
    "s",
    "t",
    "to",
    "from",
    "than",
    "into",
    "vs",
    "versus",
    "over",
    "against",
    "before",
    "after",
    "up",
    "out",
    "just",
    "also",
    "very",
    "really",
    "way",
    "ways",
    "best",
    "good",
    "possible",
    "not",
    "no",
    "never",
    "without",
    "cannot",
    "nor",
    "none",
    "n't",
];

const QUESTION: &[&str] = &[
    "what", "why", "how", "when", "where", "who", "whom", "whose", "which",
];

const NEGATION: &[&str] = &["not", "no", "never", "without", "cannot", "nor", "none"];

/// Words whose two sides may not trade places.
const DIRECTIONAL: &[&str] = &[
    "to", "from", "than", "vs", "versus", "into", "over", "against", "before", "after", "beat",
    "beats", "defeat", "defeated",
];

/// What the check needs of one question, computed once per cache entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysed {
    /// Content words, stemmed, in order.
    content: Vec<String>,
    numbers: HashSet<String>,
    negated: bool,
    directional: bool,
    question_word: Option<&'static str>,
}

fn stem(w: &str) -> String {
    let w = w.strip_suffix("'s").unwrap_or(w);
    let n = w.chars().count();
    if n > 4 && w.ends_with("ies") {
        return format!("{}y", &w[..w.len() - 3]);
    }
    if n > 5 && w.ends_with("ing") {
        return w[..w.len() - 3].to_owned();
    }
    if n > 4 && w.ends_with("ed") && !w.ends_with("eed") {
        return w[..w.len() - 2].to_owned();
    }
    if n > 3 && w.ends_with('s') && !w.ends_with("ss") && !w.ends_with("us") {
        return w[..w.len() - 1].to_owned();
    }
    w.to_owned()
}

pub fn analyse(text: &str) -> Analysed {
    let lower = text.to_lowercase();
    let mut content = Vec::new();
    let mut numbers = HashSet::new();
    let (mut negated, mut directional, mut question_word) = (false, false, None);
    for raw in lower.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '.')) {
        let w = raw.trim_matches(|c| c == '\'' || c == '.');
        if w.is_empty() {
            continue;
        }
        if w.ends_with("n't") || NEGATION.contains(&w) {
            negated = true;
            continue;
        }
        if w.chars().any(|c| c.is_ascii_digit()) {
            numbers.insert(w.to_owned());
        }
        if DIRECTIONAL.contains(&w) {
            directional = true;
        }
        if question_word.is_none() {
            question_word = QUESTION.iter().find(|q| **q == w).copied();
        }
        // "u.s." and "u.s" are one word; other dots split.
        for part in w.split('.').filter(|p| !p.is_empty()) {
            let part = part.strip_suffix("'s").unwrap_or(part);
            if !STOP.contains(&part) {
                content.push(stem(part));
            }
        }
    }
    Analysed {
        content,
        numbers,
        negated,
        directional,
        question_word,
    }
}

/// Why a candidate was refused outright.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Veto {
    Negation,
    Number,
    Swapped,
}

/// The lexical features of a pair; see [`Verifier::score`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features {
    pub cosine: f32,
    /// Shared content words over all distinct content words (Jaccard).
    pub overlap: f32,
    /// Content words of either side missing from the other, as a share.
    pub unmatched: f32,
    /// 1 when both ask with a different question word (what/why/how…).
    pub question_differs: f32,
    pub veto: Option<Veto>,
}

impl Features {
    pub const NAMES: [&'static str; 4] = ["cosine", "overlap", "unmatched", "question_differs"];

    pub fn vector(&self) -> [f32; 4] {
        [
            self.cosine,
            self.overlap,
            self.unmatched,
            self.question_differs,
        ]
    }
}

/// Shared words appear in a different order and a directional word sits
/// among them: "flights from Paris to London" vs "from London to Paris".
fn swapped(a: &Analysed, b: &Analysed) -> bool {
    if !(a.directional && b.directional) {
        return false;
    }
    let first = |v: &[String], w: &str| v.iter().position(|x| x == w);
    let shared: Vec<&String> = {
        let mut seen = HashSet::new();
        a.content
            .iter()
            .filter(|w| b.content.contains(w) && seen.insert(*w))
            .collect()
    };
    for (i, x) in shared.iter().enumerate() {
        for y in &shared[i + 1..] {
            let (ax, ay) = (first(&a.content, x), first(&a.content, y));
            let (bx, by) = (first(&b.content, x), first(&b.content, y));
            if let (Some(ax), Some(ay), Some(bx), Some(by)) = (ax, ay, bx, by)
                && (ax < ay) != (bx < by)
            {
                return true;
            }
        }
    }
    false
}

pub fn features(a: &Analysed, b: &Analysed, cosine: f32) -> Features {
    let sa: HashSet<&String> = a.content.iter().collect();
    let sb: HashSet<&String> = b.content.iter().collect();
    let shared = sa.intersection(&sb).count() as f32;
    let union = sa.union(&sb).count() as f32;
    let overlap = if union > 0.0 { shared / union } else { 1.0 };
    let total = (sa.len() + sb.len()) as f32;
    let unmatched = if total > 0.0 {
        (total - 2.0 * shared) / total
    } else {
        0.0
    };
    let question_differs = match (a.question_word, b.question_word) {
        (Some(x), Some(y)) if x != y => 1.0,
        _ => 0.0,
    };
    let veto = if a.negated != b.negated {
        Some(Veto::Negation)
    } else if a.numbers != b.numbers {
        Some(Veto::Number)
    } else if swapped(a, b) {
        Some(Veto::Swapped)
    } else {
        None
    };
    Features {
        cosine,
        overlap,
        unmatched,
        question_differs,
        veto,
    }
}

/// A logistic model over [`Features`]: `σ(bias + Σ wᵢ·xᵢ)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verifier {
    pub weights: [f32; 4],
    pub bias: f32,
}

impl Default for Verifier {
    /// Fitted on `../shared/data/paraphrase/pairs.tsv` by
    /// `ragtime-bench cache` (all 10,000 pairs; the table in the README
    /// comes from two-fold cross-validation).
    fn default() -> Self {
        Self {
            weights: [14.0, 4.0, -3.0, -1.0],
            bias: -13.0,
        }
    }
}

impl Verifier {
    /// Probability-like score in (0, 1); 0 when a veto applies.
    pub fn score(&self, f: &Features) -> f32 {
        if f.veto.is_some() {
            return 0.0;
        }
        let z = self.bias
            + self
                .weights
                .iter()
                .zip(f.vector())
                .map(|(w, x)| w * x)
                .sum::<f32>();
        1.0 / (1.0 + (-z).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(a: &str, b: &str) -> Features {
        features(&analyse(a), &analyse(b), 0.95)
    }

    #[test]
    fn negations_numbers_and_swaps_are_vetoed() {
        assert_eq!(
            f("How do I lose weight?", "How do I not lose weight?").veto,
            Some(Veto::Negation)
        );
        assert_eq!(
            f("Why can't I sleep at night?", "Why can I sleep at night?").veto,
            Some(Veto::Negation)
        );
        assert_eq!(
            f(
                "Best phone under 200 dollars?",
                "Best phone under 300 dollars?"
            )
            .veto,
            Some(Veto::Number)
        );
        assert_eq!(
            f(
                "How long is a flight from Paris to London?",
                "How long is a flight from London to Paris?"
            )
            .veto,
            Some(Veto::Swapped)
        );
        assert_eq!(
            f(
                "Is Messi better than Ronaldo?",
                "Is Ronaldo better than Messi?"
            )
            .veto,
            Some(Veto::Swapped)
        );
        // Reordering without a directional word is a paraphrase.
        assert_eq!(
            f(
                "Why did the US lose the Vietnam war?",
                "The Vietnam war: why did the US lose it?"
            )
            .veto,
            None
        );
    }

    #[test]
    fn lexical_agreement_is_measured() {
        let same = f("What is machine learning?", "What's machine learning?");
        assert_eq!(same.veto, None);
        assert!((same.overlap - 1.0).abs() < 1e-6, "{same:?}");
        assert_eq!(same.unmatched, 0.0);
        let other = f("How do I learn Python?", "Why do people learn Python?");
        assert_eq!(other.question_differs, 1.0);
        assert!(other.overlap < 1.0 && other.unmatched > 0.0, "{other:?}");
    }

    #[test]
    fn the_score_orders_by_agreement_and_vetoes_are_zero() {
        let v = Verifier::default();
        let close = v.score(&f("What is machine learning?", "What is machine learning?"));
        let far = v.score(&features(
            &analyse("What is machine learning?"),
            &analyse("What is deep sea fishing?"),
            0.95,
        ));
        assert!(close > far, "{close} vs {far}");
        assert_eq!(
            v.score(&f("How do I lose weight?", "How do I not lose weight?")),
            0.0
        );
    }
}
