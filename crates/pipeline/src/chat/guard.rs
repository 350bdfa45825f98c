//! The repetition guard: small local models fall into loops — the same
//! line, or the same phrase, over and over until `max_tokens` runs out.
//! The guard reads the answer as it streams and says where the loop began
//! once a line of some length comes a third time, or a run of
//! [`GRAM_WORDS`] words does; the generation stops there and the answer is
//! what came before the loop.

use std::collections::{HashMap, VecDeque};

/// A line that comes this often is a loop.
const LINE_REPEATS: u32 = 3;
/// Shorter lines (code braces, list markers, separators) repeat honestly.
const MIN_LINE_CHARS: usize = 12;
/// Words in a phrase that, repeated [`GRAM_REPEATS`] times, is a loop.
const GRAM_WORDS: usize = 8;
const GRAM_REPEATS: u32 = 3;

/// How often something was seen, and where its second occurrence began.
#[derive(Default)]
struct Seen(HashMap<String, (u32, usize)>);

impl Seen {
    /// Counts `key` starting at `start`; the start of its second
    /// occurrence once it reached `limit`.
    fn count(&mut self, key: String, start: usize, limit: u32) -> Option<usize> {
        let e = self.0.entry(key).or_insert((0, start));
        e.0 += 1;
        if e.0 == 2 {
            e.1 = start;
        }
        (e.0 >= limit).then_some(e.1)
    }
}

#[derive(Default)]
pub(crate) struct LoopGuard {
    /// Bytes of answer seen so far.
    len: usize,
    line: String,
    line_start: usize,
    lines: Seen,
    word: String,
    word_start: usize,
    words: VecDeque<(String, usize)>,
    grams: Seen,
}

impl LoopGuard {
    /// Feeds the next piece of the answer. `Some(at)` once the answer
    /// loops: the byte offset (into everything fed) where the loop began,
    /// the second occurrence of what repeats. What is before it stands.
    pub(crate) fn push(&mut self, delta: &str) -> Option<usize> {
        for (i, c) in delta.char_indices() {
            let at = self.len + i;
            if c.is_whitespace() {
                if let Some(cut) = self.end_word() {
                    return Some(cut);
                }
            } else {
                if self.word.is_empty() {
                    self.word_start = at;
                }
                self.word.extend(c.to_lowercase());
            }
            if c == '\n' {
                if let Some(cut) = self.end_line() {
                    return Some(cut);
                }
                self.line_start = at + 1;
            } else {
                self.line.push(c);
            }
        }
        self.len += delta.len();
        None
    }

    fn end_line(&mut self) -> Option<usize> {
        let line = std::mem::take(&mut self.line);
        let key = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if key.chars().filter(|c| !c.is_whitespace()).count() < MIN_LINE_CHARS {
            return None;
        }
        self.lines.count(key, self.line_start, LINE_REPEATS)
    }

    fn end_word(&mut self) -> Option<usize> {
        if self.word.is_empty() {
            return None;
        }
        let word = std::mem::take(&mut self.word);
        self.words.push_back((word, self.word_start));
        if self.words.len() > GRAM_WORDS {
            self.words.pop_front();
        }
        if self.words.len() < GRAM_WORDS {
            return None;
        }
        let key = self
            .words
            .iter()
            .map(|(w, _)| w.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        let start = self.words[0].1;
        self.grams.count(key, start, GRAM_REPEATS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `text` in pieces of `n` bytes (on char boundaries); where the
    /// guard cut it, if it did.
    fn stream(text: &str, n: usize) -> Option<usize> {
        let mut g = LoopGuard::default();
        let mut rest = text;
        while !rest.is_empty() {
            let mut k = n.min(rest.len());
            while !rest.is_char_boundary(k) {
                k += 1;
            }
            let (piece, tail) = rest.split_at(k);
            if let Some(at) = g.push(piece) {
                return Some(at);
            }
            rest = tail;
        }
        None
    }

    #[test]
    fn a_repeated_line_is_cut_where_it_first_repeats() {
        let line = "This is a custom build configuration file.\n";
        let text = format!("Intro line here.\n{line}{line}{line}{line}");
        for n in [1, 3, 7, 50] {
            let at = stream(&text, n).expect("a loop");
            assert_eq!(
                &text[..at],
                format!("Intro line here.\n{line}"),
                "pieces of {n}"
            );
        }
    }

    #[test]
    fn a_repeated_phrase_without_newlines_is_a_loop() {
        let s = "the answer is to pass the flag to the tool again. ";
        let text = format!("First, {s}{s}{s}{s}");
        let at = stream(&text, 4).expect("a loop");
        assert!(
            text[..at].starts_with("First, the answer"),
            "{}",
            &text[..at]
        );
        assert!(at < text.len() - 2 * s.len(), "cut at {at}");
        let word = "and ".repeat(30);
        assert_eq!(
            stream(&word, 2),
            Some(4),
            "a one-word loop keeps its first word"
        );
    }

    #[test]
    fn ordinary_answers_pass() {
        let text = "Use `cargo new --vcs none` to create a project without a git repository [1].\n\
            ```\n}\n}\n}\n```\n\
            - item one\n- item two\n- item three\n\
            The flag `--vcs none` skips the repository; `--vcs git` is the default [2].\n\
            See the reference for every other option of cargo new and cargo init [1].";
        assert_eq!(stream(text, 3), None);
    }
}
