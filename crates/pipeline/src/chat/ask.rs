//! What a question asks for, read from its words: a number ("how many"),
//! something to type (a flag, a key, an attribute, a command, a default
//! value), or an explanation ("why"). The extractive answer favours the
//! sentences that hold what is asked — a closer-worded sentence without
//! the number does not answer "how many" — decided in microseconds from
//! the words alone, well inside the extractive stage's 40 ms.

use crate::chat::text::specific_terms;

/// What a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A count, a size, a limit.
    Number,
    /// Something to type: a flag, option, key, attribute, command, syntax,
    /// lint or default value.
    Code,
    /// An explanation: why, what happens, the difference.
    Prose,
    /// Nothing that tells.
    Any,
}

const NUMBER: &[&str] = &[
    "how many",
    "how much",
    "how long",
    "how big",
    "how large",
    "how deep",
    "how old",
    "how far",
    "what size",
    "what percentage",
    "number of",
    "maximum",
    "minimum",
    "at most",
    "at least",
    "limit",
];

const CODE: &[&str] = &[
    "flag",
    "option",
    "argument",
    "command",
    "syntax",
    "attribute",
    "lint",
    "keyword",
    "key",
    "variable",
    "macro",
    "default",
    "setting",
    "which value",
    "what value",
    "what do i pass",
    "what do i write",
    "what do i put",
    "what do i add",
    "what do i type",
    "what do i run",
    "what should i pass",
    "what should i write",
    "what should i put",
    "what should i add",
    "what should i run",
    "how do i write",
    "how do i spell",
    "how do i declare",
    "what is it called",
    "what's it called",
    "name of",
    "which name",
    "what name",
];

const PROSE: &[&str] = &[
    "why",
    "what happens",
    "what is the difference",
    "what's the difference",
    "explain",
    "what does it mean",
    "what is the purpose",
    "what's the purpose",
];

impl Ask {
    /// What `question` asks for, from its words (a number first: "how many
    /// arguments" asks for a count).
    pub(crate) fn of(question: &str) -> Ask {
        // Whole words: " key " is not in "monkey"; a plural counts.
        let words: Vec<String> = question
            .to_lowercase()
            .split(|c: char| !(c.is_alphanumeric() || c == '\''))
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect();
        let q = format!(" {} ", words.join(" "));
        let has = |list: &[&str]| {
            list.iter()
                .any(|w| q.contains(&format!(" {w} ")) || q.contains(&format!(" {w}s ")))
        };
        if has(NUMBER) {
            Ask::Number
        } else if has(PROSE) {
            Ask::Prose
        } else if has(CODE) {
            Ask::Code
        } else {
            Ask::Any
        }
    }

    /// How much a candidate whose unit reads `unit` is favoured: more when
    /// it holds what is asked, less when it plainly cannot answer (no
    /// number for "how many"; only code for "why").
    pub(crate) fn weight(self, unit: &str) -> f32 {
        let number = unit
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit()))
            || NUMBER_WORDS
                .iter()
                .any(|w| unit.split_whitespace().any(|u| u.eq_ignore_ascii_case(w)));
        let code = !specific_terms(unit).is_empty();
        let prose =
            unit.split_whitespace().count() >= 6 && unit.contains(|c: char| c.is_ascii_lowercase());
        match self {
            Ask::Number if number => 1.25,
            Ask::Number => 0.85,
            Ask::Code if code => 1.15,
            Ask::Code => 0.9,
            Ask::Prose if prose => 1.05,
            Ask::Prose => 0.85,
            _ => 1.0,
        }
    }
}

/// Numbers written as words.
const NUMBER_WORDS: &[&str] = &[
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "twenty", "hundred", "thousand", "once", "twice",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_asks_for_a_number_something_to_type_or_an_explanation() {
        for (q, ask) in [
            ("How many arguments can a closure capture?", Ask::Number),
            ("what's the maximum alignment?", Ask::Number),
            ("Which flag documents private items?", Ask::Code),
            (
                "What do I pass to instruction_set for Thumb code?",
                Ask::Code,
            ),
            ("what is the default edition", Ask::Code),
            ("Why is this trait not object safe?", Ask::Prose),
            (
                "What happens when a panic crosses an FFI boundary?",
                Ask::Prose,
            ),
            ("tell me about closures", Ask::Any),
        ] {
            assert_eq!(Ask::of(q), ask, "{q}");
        }
    }

    #[test]
    fn units_that_hold_what_is_asked_weigh_more() {
        let with = "A tuple struct may have up to 12 fields for these impls.";
        let without = "Tuple structs implement these traits for small field counts.";
        assert!(Ask::Number.weight(with) > 1.0);
        assert!(Ask::Number.weight(without) < 1.0);
        assert!(Ask::Number.weight("It runs twice per build.") > 1.0);
        assert!(Ask::Code.weight("Pass --document-private-items to rustdoc.") > 1.0);
        assert!(Ask::Code.weight("Pass the flag to the tool.") < 1.0);
        assert!(Ask::Prose.weight("#[doc(hidden)]") < 1.0);
        assert_eq!(Ask::Any.weight("anything at all"), 1.0);
    }
}
