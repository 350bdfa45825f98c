//! What a question asks for, read from its words: a number ("how many"),
//! something to type (a flag, a key, an attribute, a command, a default
//! value), or an explanation ("why"). The extractive answer favours the
//! sentences that hold what is asked — a closer-worded sentence without
//! the number does not answer "how many" — decided in microseconds from
//! the words alone, well inside the extractive stage's 40 ms. A "which
//! lint"/"what trait" question also names the kind of term it wants
//! ([`Target`]): the answer names one the question does not hold, beside
//! that kind.

use crate::chat::text::{content_words, specific_terms, stem};
use std::collections::HashSet;

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
        // A code point ("U+0023") names a character, not an amount.
        let number = unit
            .split_whitespace()
            .filter(|t| !code_point(t))
            .flat_map(|t| t.split(|c: char| !c.is_ascii_alphanumeric()))
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

/// What a "which …" or "what …" question names the kind of ("which
/// lint", "what literal prefix", "which Unicode property"), or that it
/// asks what something is called ("what was it called before", "the term
/// for"). The answer is then a term the question does not hold, written
/// next to that kind ("the `Termination` trait", "the Pattern_White_Space
/// Unicode property", "… is called sound"): a sentence that only repeats
/// the question's own words beside it does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The words after the question word (at most two, before its verb).
    kind: Vec<String>,
    /// The question asks for a name.
    naming: bool,
    /// The question's own content words (a term among them is not news).
    asked: HashSet<String>,
}

/// Words that end the kind after "which"/"what": verbs, pronouns and
/// prepositions ("which repr *do* I need", "what trait *must* …").
const KIND_ENDS: &[&str] = &[
    "is", "are", "was", "were", "be", "do", "does", "did", "must", "should", "can", "could",
    "will", "would", "has", "have", "had", "i", "you", "we", "it", "they", "to", "of", "for", "in",
    "on", "at", "by", "with", "from", "if", "when", "that", "happens", "goes", "gets",
];

/// Kinds that name no kind of thing.
const NO_KIND: &[&str] = &[
    "way",
    "ways",
    "thing",
    "things",
    "one",
    "ones",
    "happens",
    "about",
    "else",
    "exactly",
    "difference",
    "purpose",
    "reason",
    "point",
    "name",
    "term",
    "word",
];

/// Words beside a kind that name no term ("the *following* trait").
const NOT_TERMS: &[&str] = &[
    "the",
    "a",
    "an",
    "this",
    "that",
    "these",
    "those",
    "following",
    "same",
    "other",
    "another",
    "new",
    "given",
    "each",
    "every",
    "any",
    "all",
    "some",
    "such",
    "certain",
    "specific",
    "different",
    "first",
    "last",
    "its",
    "their",
    "own",
    "is",
    "are",
    "be",
    "of",
    "or",
    "and",
    "in",
    "on",
    "for",
    "to",
    "as",
    "with",
    "by",
];

/// Phrases that introduce a name ("is *called* sound", "*known as* object
/// safety").
const NAMING: &[&str] = &["called", "known as", "named", "referred to as", "term"];

impl Target {
    /// The kind `question` asks for, if it names one.
    pub(crate) fn of(question: &str) -> Option<Target> {
        let lower = question.to_lowercase();
        let words: Vec<&str> = lower
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '\''))
            .filter(|w| !w.is_empty())
            .collect();
        let naming = lower.contains(" called")
            || lower.contains(" call ")
            || lower.contains("term for")
            || lower.contains("name for")
            || lower.contains("name of")
            || lower.contains("known as");
        // The kind's words as written (the stop lists hold words, not
        // stems) and stemmed.
        let mut raw: Vec<&str> = Vec::new();
        let mut kind = Vec::new();
        if let Some(at) = words
            .iter()
            .position(|w| matches!(*w, "which" | "what" | "what's"))
        {
            let mut rest = words[at + 1..].iter().copied().peekable();
            while rest.next_if(|w| matches!(*w, "the" | "a" | "an")).is_some() {}
            for w in rest {
                if KIND_ENDS.contains(&w) || kind.len() == 2 {
                    break;
                }
                // "which two primitive types": the count is not the kind.
                if NUMBER_WORDS.contains(&w) || w.chars().all(|c| c.is_ascii_digit()) {
                    continue;
                }
                raw.push(w);
                kind.push(plain(w));
            }
        }
        if let [one] = raw.as_slice()
            && NO_KIND.contains(one)
        {
            kind.clear();
        }
        if kind.is_empty() && !naming {
            return None;
        }
        Some(Target {
            kind,
            naming,
            asked: content_words(question).into_iter().collect(),
        })
    }

    /// How much a unit reading `unit` is favoured: more when it names a
    /// term the question does not hold beside the kind asked for (within
    /// two words), or after "called"/"known as" when a name is asked for;
    /// a little more for a plain new word right beside the kind.
    pub(crate) fn weight(&self, unit: &str) -> f32 {
        let tokens: Vec<&str> = unit
            .split_whitespace()
            .map(|t| t.trim_matches(|c: char| ",.;:()\"'`".contains(c)))
            .collect();
        let plains: Vec<String> = tokens.iter().map(|t| plain(t)).collect();
        // The stop lists hold words as written, not stems.
        let lowers: Vec<String> = tokens.iter().map(|t| t.to_lowercase()).collect();
        let is_kind = |i: usize| {
            let w = &plains[i];
            self.kind
                .iter()
                .any(|k| w == k || (k.len() >= 4 && w.starts_with(k.as_str())))
        };
        // A word the question does not hold, naming something: not the
        // kind itself, nor "the following".
        let fresh = |i: usize| {
            let w = &plains[i];
            !w.is_empty()
                && !NOT_TERMS.contains(&lowers[i].as_str())
                && !self.asked.contains(w)
                && !is_kind(i)
        };
        // A term: code, an identifier, a capitalised word inside the
        // sentence.
        let term = |i: usize| {
            let t = tokens[i];
            fresh(i)
                && ((i > 0 && t.starts_with(|c: char| c.is_uppercase()))
                    || !specific_terms(t).is_empty())
        };
        let beside =
            |i: usize| (i.saturating_sub(2)..(i + 3).min(tokens.len())).any(|j| j != i && term(j));
        let by_kind = (0..tokens.len()).any(|i| is_kind(i) && beside(i));
        // "called X", "known as X" (an article between).
        let named = self.naming
            && NAMING.iter().any(|n| {
                let n: Vec<&str> = n.split(' ').collect();
                (0..tokens.len()).any(|i| {
                    tokens[i..]
                        .iter()
                        .zip(&n)
                        .filter(|(a, b)| a.eq_ignore_ascii_case(b))
                        .count()
                        == n.len()
                        && (i + n.len()..tokens.len())
                            .find(|&j| !matches!(plains[j].as_str(), "a" | "an" | "the"))
                            .is_some_and(fresh)
                })
            });
        // A plain word right beside the kind ("the transparent
        // representation"): likelier a name than not, weighed less.
        let plain_beside = (0..tokens.len()).any(|i| {
            is_kind(i)
                && [i.wrapping_sub(1), i + 1]
                    .iter()
                    .any(|&j| j < tokens.len() && fresh(j) && !content_words(tokens[j]).is_empty())
        });
        if by_kind || named {
            1.3
        } else if plain_beside {
            1.15
        } else {
            1.0
        }
    }
}

/// A word lower-cased, its punctuation dropped and stemmed (as
/// [`content_words`] does).
fn plain(t: &str) -> String {
    stem(
        t.chars()
            .filter(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
            .to_lowercase(),
    )
}

/// Whether token `t` is a Unicode code point ("U+0023", "(U+FEFF)").
fn code_point(t: &str) -> bool {
    let t = t.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    t.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("u+"))
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
        // A code point is not an amount.
        assert!(
            Ask::Number.weight("Ends at as many U+0023 (#) characters as it began with.") < 1.0
        );
        assert!(Ask::Number.weight("Fewer than 256 of the character U+0023 (#).") > 1.0);
        assert!(Ask::Code.weight("Pass --document-private-items to rustdoc.") > 1.0);
        assert!(Ask::Code.weight("Pass the flag to the tool.") < 1.0);
        assert!(Ask::Prose.weight("#[doc(hidden)]") < 1.0);
        assert_eq!(Ask::Any.weight("anything at all"), 1.0);
    }

    #[test]
    fn a_which_question_names_the_kind_of_term_it_asks_for() {
        let q = "I wrote #[expect(unused_variables)] on a used variable. Which lint fires?";
        let t = Target::of(q).expect("a kind");
        assert!(t.kind.contains(&"lint".to_owned()), "{t:?}");
        // A new term beside the kind answers; the question's own does not.
        assert!(t.weight("Otherwise the unfulfilled_lint_expectations lint is emitted.") > 1.0);
        assert_eq!(
            t.weight("The unused_variables lint would usually be emitted here."),
            1.0
        );
        // Capitalised inside the sentence: a name.
        let t = Target::of("What trait must the return type of main implement?").expect("a kind");
        assert!(t.weight("The Termination trait lists the return types.") > 1.0);
        assert_eq!(t.weight("Every impl of a trait in a return type."), 1.0);
        // "the following trait" names none (the stop words as written).
        assert_eq!(
            t.weight("It must implement the following trait for it."),
            1.0
        );
        // A count before the kind is not part of it.
        let t =
            Target::of("Which two primitive types can a const parameter have?").expect("a kind");
        assert_eq!(t.kind, ["primit", "type"], "{t:?}");
        assert!(t.weight("The allowed types are u8, char and bool.") > 1.0);
        // A plain word right beside the kind counts for less.
        let t = Target::of("Which repr gives a newtype its field's ABI?").expect("a kind");
        let plain = t.weight("A struct with the transparent representation has it.");
        assert!(plain > 1.0 && plain < 1.3, "{plain}");
        // Asked for a name: what follows "called" / "known as".
        for (q, unit) in [
            (
                "What do you call unsafe code no safe caller can misuse?",
                "Unsafe code with this property for any safe client is called sound.",
            ),
            (
                "What's the name of the table of method pointers in a &dyn Trait?",
                "a virtual method table, often just called a vtable, which holds",
            ),
            (
                "What was dyn compatibility called before?",
                "This concept was formerly known as object safety.",
            ),
        ] {
            let t = Target::of(q).expect(q);
            assert!(t.weight(unit) > 1.0, "{q}: {unit}");
            assert_eq!(t.weight("Nothing here names anything new."), 1.0, "{q}");
        }
        // No kind: why, how, what happens, what purpose.
        for q in [
            "What purpose does #[must_use] serve?",
            "Why is this not allowed?",
            "how do I run the tests",
            "what happens on overflow",
        ] {
            assert_eq!(Target::of(q), None, "{q}");
        }
    }
}
