//! The answer the LLM did not write: the best sentence of each top passage,
//! quoted with its citation.

use crate::chat::prompt::snippet;
use ragtime_core::Passage;

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() > 2)
        .map(str::to_lowercase)
        .collect()
}

/// The sentence of `text` sharing the most words with the query.
fn best_sentence(text: &str, query: &[String]) -> String {
    let mut best = ("", 0usize);
    for s in text.split_inclusive(['.', '!', '?', '\n']) {
        let s = s.trim();
        if s.is_empty() {
            continue;
        }
        let n = words(s).iter().filter(|w| query.contains(w)).count();
        if n > best.1 || best.0.is_empty() {
            best = (s, n);
        }
    }
    snippet(best.0, 300)
}

/// The answer when the model gave none in time: the best sentence of each
/// of the top passages, each with its citation number.
pub fn extractive_answer(query: &str, passages: &[Passage]) -> String {
    if passages.is_empty() {
        return "No answer could be generated in time, and no sources matched the question."
            .to_owned();
    }
    let q = words(query);
    let lines: Vec<String> = passages
        .iter()
        .enumerate()
        .map(|(i, h)| format!("- {} [{}]", best_sentence(&h.chunk.text, &q), i + 1))
        .collect();
    format!(
        "The model could not answer in time; here is what the sources say:\n\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tests::hit;

    #[test]
    fn extractive_answer_cites_the_best_sentence_of_each_passage() {
        let hits = vec![
            hit(
                1,
                "Tea",
                "Tea is a drink. Green tea contains caffeine and catechins.",
            ),
            hit(
                2,
                "Coffee",
                "Coffee contains more caffeine than tea. It is roasted.",
            ),
        ];
        let a = extractive_answer("how much caffeine does green tea contain", &hits);
        assert!(
            a.contains("- Green tea contains caffeine and catechins. [1]"),
            "{a}"
        );
        assert!(
            a.contains("- Coffee contains more caffeine than tea. [2]"),
            "{a}"
        );
        assert!(extractive_answer("q", &[]).contains("no sources matched"));
    }
}
