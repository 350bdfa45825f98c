//! The answer the LLM did not write: the one or two sentences of the top
//! passages that best answer the question, quoted whole with their section
//! path and citation.
//!
//! Candidate sentences are scored by similarity to the query under the
//! embedding model (the best by words embedded a few at a time, within a
//! few tens of milliseconds; past that the rest count as dissimilar, and
//! with none embedded words decide alone), fused with stemmed word overlap
//! and the rank of the passage they come from (a section heading counts
//! for half: it names the topic in the question's words, it answers
//! nothing), and weighed by what the
//! question asks for ([`Ask`]: a number, something to type, an
//! explanation) against what the sentence and the one after it hold, and
//! by whether they name a new term of the kind a "which …" question asks
//! for ([`Target`]); with a cross-encoder configured, the best few are
//! scored by it too, in the time left.
//!
//! The quote is a unit, not a sentence: the best sentence and what it
//! introduces or qualifies — the sentences after it, the code lines or
//! list an "example:" sentence leads into, a definition's `Default:` line
//! — while they fit, going on into the document's next chunk when that is
//! ranked too, and the sentence before it when room is left (first,
//! when the best one points back: "This is useful to …"). Lines stay lines
//! (a code block is quoted as the lines it has). A table row is read and
//! quoted under its table's first row (the column names); a sentence that
//! leads into a table is quoted with the column names and the row whose
//! words best meet the question's.

use crate::chat::ask::{Ask, Target};
use crate::chat::text::{content_words, sentences};
use ragtime_core::{Cancel, Embedder, Passage, Reranker, SECTION_SEP};
use std::collections::HashSet;
use std::time::Duration;

/// Why an answer is extractive: chosen (the answer mode), or what kept the
/// model from answering (said after the quote, never before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Chosen,
    Late,
    Busy,
    Failed,
    /// Not asked: every backend's breaker was open.
    Skipped,
    /// Not asked: the request left the model no time (`llm_ttft` got 0).
    NoTime,
    /// Not asked: the model's context window had no room for a source.
    NoRoom,
    /// The model's answer was not supported by its sources.
    Ungrounded,
}

impl Why {
    /// What the user is told after the quote (nothing when chosen).
    pub fn note(self) -> Option<&'static str> {
        match self {
            Why::Chosen => None,
            Why::Late => Some("The model did not answer in time; this is quoted from the sources."),
            Why::Busy => Some("The model was too busy to answer; this is quoted from the sources."),
            Why::Failed => Some("The model failed to answer; this is quoted from the sources."),
            Why::Skipped => Some(
                "The model was not asked: its backend failed several times in a row and is paused; this is quoted from the sources.",
            ),
            Why::NoTime => Some(
                "The model was not asked: the request's budget left it no time; this is quoted from the sources.",
            ),
            Why::NoRoom => Some(
                "The model was not asked: its context window has no room for the sources; this is quoted from the sources.",
            ),
            Why::Ungrounded => Some("What the sources say:"),
        }
    }
}

/// What a quote answers: the question in its own words, and what the
/// conversation had established before it ([`ChatInput::context`]: the
/// previous question, the sections the last answer cited). The context's
/// words count for [`CONTEXT_WEIGHT`] of the question's, so a follow-up
/// ("And what about *mut T?") is answered about its own subject, not the
/// previous turn's.
///
/// [`ChatInput::context`]: crate::chat::ChatInput::context
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    pub question: &'a str,
    pub context: &'a str,
}

impl<'a> From<&'a str> for Asked<'a> {
    fn from(question: &'a str) -> Self {
        Self {
            question,
            context: "",
        }
    }
}

/// What a word of the conversation's context weighs against one of the
/// question's own.
const CONTEXT_WEIGHT: f32 = 0.3;
/// What a sentence gains, on the scale of its word score, for holding the
/// code the question names verbatim (`*mut T`, `Vec<T>`): the words of two
/// such literals are often the same (`mut`, one-letter `T`), their symbols
/// are what tells them apart.
const LITERAL_WEIGHT: f32 = 0.3;

/// Candidates embedded at most (the best by words and rank go first).
/// Measured on both answer sets: 24 took 36 ms p50 and 52 ms p95 on two
/// cores, past the stage's 40 ms (words alone then decided, run to run
/// differently); 12 take 23 / 36 ms and answer as many questions.
const MAX_EMBEDDED: usize = 12;
/// Longest quote, in characters: the best sentence and those after it
/// that fit (the answer often sits next to the sentence that shares the
/// question's words: "X is the default. To turn it off, pass --y.").
const MAX_QUOTE: usize = 320;

/// A sentence that may be quoted.
#[derive(Debug, Clone)]
struct Candidate<'a> {
    /// Index into the ranked passages.
    rank: usize,
    /// Index of the sentence in its passage.
    at: usize,
    text: &'a str,
    /// The sentence begins a line of its passage (it is quoted on a line of
    /// its own); a whole line is quoted with its indentation.
    line: Option<&'a str>,
    /// For a table row, the table's first row (its column names): read
    /// with the row when scored, quoted before it.
    header: Option<&'a str>,
    /// The last sentence of its passage.
    last: bool,
    lexical: f32,
}

/// Each table row of `text` (a line with cells separated by ` | `) after
/// the first of its table, with that first row: a row alone ("Octal
/// integer | 0o77 | N/A") says little until its columns are named.
fn table_headers(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut header: Option<&str> = None;
    for line in text.lines().map(str::trim) {
        if !line.contains(" | ") {
            header = None;
            continue;
        }
        match header {
            None => header = Some(line),
            Some(h) => out.push((line, h)),
        }
    }
    out
}

/// Whether `s` (a slice of `text`) begins a line of it, and the whole
/// line, indentation kept, when `s` is all of it.
fn line_of<'a>(text: &'a str, s: &'a str) -> (bool, Option<&'a str>) {
    let start = (s.as_ptr() as usize).saturating_sub(text.as_ptr() as usize);
    let Some(before) = text.get(..start) else {
        return (false, None);
    };
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    if !before[line_start..].trim().is_empty() {
        return (false, None);
    }
    let end = start + s.len();
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    let whole = text[end..line_end].trim().is_empty();
    (true, whole.then(|| text[line_start..line_end].trim_end()))
}

/// The passages an answer may quote, best first, each with the number it
/// is cited by.
pub type Ranked<'a> = [(usize, &'a Passage)];

fn candidates<'a>(asked: &Asked<'_>, ranked: &Ranked<'a>) -> Vec<Candidate<'a>> {
    let q: HashSet<String> = content_words(asked.question).into_iter().collect();
    let context: HashSet<String> = content_words(asked.context)
        .into_iter()
        .filter(|w| !q.contains(w))
        .collect();
    let literals = literals(asked.question);
    let weight = q.len() as f32 + CONTEXT_WEIGHT * context.len() as f32;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (rank, (_, p)) in ranked.iter().enumerate() {
        // An anchor label alone on its line (`[items.fn.intro]`) says
        // nothing to a reader.
        let all: Vec<&str> = sentences(&p.chunk.text)
            .into_iter()
            .filter(|s| !(s.starts_with('[') && s.ends_with(']') && !s.contains(' ')))
            .collect();
        let n = all.len();
        let rows = table_headers(&p.chunk.text);
        let headings: Vec<&str> = p.chunk.section.split(SECTION_SEP).collect();
        for (at, s) in all.into_iter().enumerate() {
            if !seen.insert(s) {
                continue; // overlapping chunks repeat sentences
            }
            let header = rows.iter().find(|(row, _)| *row == s).map(|&(_, h)| h);
            let mut words: HashSet<String> = content_words(s).into_iter().collect();
            words.extend(header.map(content_words).unwrap_or_default());
            let overlap = if weight == 0.0 {
                0.0
            } else {
                let own = q.intersection(&words).count() as f32;
                let before = context.intersection(&words).count() as f32;
                (own + CONTEXT_WEIGHT * before) / weight
            };
            let literal = if literals.is_empty() {
                0.0
            } else {
                let spaced = s.split_whitespace().collect::<Vec<_>>().join(" ");
                let found = literals.iter().filter(|l| spaced.contains(l.as_str()));
                found.count() as f32 / literals.len() as f32
            };
            let prior = 1.0 / (1.0 + rank as f32);
            let mut shape = 1.0;
            // A heading or a fragment answers little (a heading names the
            // topic in the question's own words, so it shares them most).
            if s.split_whitespace().count() < 4 || headings.contains(&s) {
                shape *= 0.5;
            }
            // A chunk may begin or end inside a sentence.
            if at == 0 && s.starts_with(|c: char| c.is_lowercase()) {
                shape *= 0.7;
            }
            if at + 1 == n && !s.ends_with(['.', '!', '?', ':', ')', '`']) {
                shape *= 0.8;
            }
            let (starts, whole) = line_of(&p.chunk.text, s);
            out.push(Candidate {
                rank,
                at,
                text: s,
                line: whole.or(starts.then_some(s)),
                header,
                last: at + 1 == n,
                lexical: shape * (0.7 * overlap + 0.3 * prior) + LITERAL_WEIGHT * literal,
            });
        }
    }
    out
}

/// The code `question` names: each `backticked` span, and each word with
/// a code symbol in it (`*mut`, `Vec<T>`, `--release`, `std::mem`) with
/// the short words after it that belong to it (`*mut T`, `&'a mut T`), its
/// sentence's punctuation trimmed.
fn literals(question: &str) -> Vec<String> {
    const SYMBOLS: &[char] = &[
        '*', '&', '<', '>', '(', ')', '[', ']', '{', '}', ':', '#', '!', '=', '/', '_', '-',
    ];
    let mut out: Vec<String> = question
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let bare: String = question.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = bare
        .split_whitespace()
        .map(|w| w.trim_end_matches(['?', '.', ',', ';', '!', ':', '"']))
        .map(|w| w.trim_start_matches('"'))
        .collect();
    let mut i = 0;
    while i < words.len() {
        // Prose parentheses around a word are not its own.
        let mut w = words[i];
        if !w.contains(')') {
            w = w.strip_prefix('(').unwrap_or(w);
        }
        if !w.contains('(') {
            w = w.strip_suffix(')').unwrap_or(w);
        }
        let symbol = w.chars().any(|c| SYMBOLS.contains(&c));
        // A hyphenated or snake-cased word of letters only is prose
        // ("built-in"), unless it leads with the symbol (`--release`).
        let code = symbol
            && w.chars().count() > 1
            && !(w.chars().all(|c| c.is_alphanumeric() || c == '-') && !w.starts_with('-'));
        if !code {
            i += 1;
            continue;
        }
        let mut lit = w.to_owned();
        let mut j = i + 1;
        while j < words.len() && j < i + 3 && belongs(words[j]) {
            lit.push(' ');
            lit.push_str(words[j]);
            j += 1;
        }
        out.push(lit);
        i = j;
    }
    out
}

/// Whether `word`, after a word of code, is part of it: a type parameter
/// (`T`), a lifetime (`'a`) or a keyword that qualifies a type (`mut`).
fn belongs(word: &str) -> bool {
    let mut chars = word.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => c.is_uppercase(),
        (Some('\''), Some(_)) => word[1..].chars().all(char::is_alphanumeric),
        _ => ["mut", "const", "dyn", "ref", "impl", "fn"].contains(&word),
    }
}

/// Each candidate's score: its similarity to the query when there is one,
/// fused with its words and rank.
fn fused(cands: &[Candidate<'_>], sims: Option<&[f32]>) -> Vec<f32> {
    (0..cands.len())
        .map(|i| match sims {
            Some(s) => 0.6 * s[i].max(0.0) + 0.4 * cands[i].lexical,
            None => cands[i].lexical,
        })
        .collect()
}

/// Blends a cross-encoder's scores of some candidates (`scored`: index,
/// raw score) into `scores`, half and half, the cross-encoder's scores
/// scaled to 0..1 within the batch (they compare within one query only);
/// a candidate it did not score counts as its lowest.
fn blend_cross(scores: &mut [f32], scored: &[(usize, f32)]) {
    let (lo, hi) = scored
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &(_, s)| {
            (lo.min(s), hi.max(s))
        });
    if scored.is_empty() {
        return;
    }
    let mut cross = vec![0.0; scores.len()];
    for &(i, s) in scored {
        cross[i] = if hi > lo { (s - lo) / (hi - lo) } else { 0.5 };
    }
    for (s, c) in scores.iter_mut().zip(cross) {
        *s = 0.5 * *s + 0.5 * c;
    }
}

/// Each candidate's score weighed by what `query` asks for: the ask (a
/// number, something to type) against the sentence and the one after it,
/// the kind of term a "which …" question names against all the unit would
/// quote (the name often comes a sentence or two after the words the
/// question shares: "… Such code is called sound."). Weighing the ask
/// against the whole unit too favoured any passage with code further on
/// (on the rustdoc book three questions went wrong, none right).
fn weigh(query: &str, cands: &[Candidate<'_>], scores: &mut [f32]) {
    let ask = Ask::of(query);
    let target = Target::of(query);
    if ask == Ask::Any && target.is_none() {
        return;
    }
    for (i, c) in cands.iter().enumerate() {
        let next = following(cands, i).next().map_or("", |n| n.text);
        scores[i] *= ask.weight(&format!("{} {next}", c.text));
        if let Some(t) = &target {
            // What would be quoted: the sentence and those after it that fit.
            let mut unit = c.text.to_owned();
            for n in following(cands, i) {
                if unit.len() + 1 + n.text.len() > MAX_QUOTE {
                    break;
                }
                unit.push(' ');
                unit.push_str(n.text);
            }
            scores[i] *= t.weight(&unit);
        }
    }
}

/// The sentences after candidate `i` in its passage, in order, up to the
/// first one missing (a sentence repeated by an earlier passage is not a
/// candidate of this one).
fn following<'c, 'a>(
    cands: &'c [Candidate<'a>],
    i: usize,
) -> impl Iterator<Item = &'c Candidate<'a>> {
    let c = &cands[i];
    cands[i + 1..]
        .iter()
        .enumerate()
        .take_while(move |(k, n)| n.rank == c.rank && n.at == c.at + 1 + k)
        .map(|(_, n)| n)
}

/// The unit to quote, given each candidate's score: the best sentence,
/// the sentences after it while they fit (what it introduces or
/// qualifies), then the one before it when there is room — first, when
/// the best one points back at it.
fn pick<'a>(ranked: &Ranked<'a>, cands: &[Candidate<'a>], scores: &[f32]) -> Vec<Candidate<'a>> {
    let score = |i: usize| scores[i];
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
    let Some(&best) = order.first() else {
        return Vec::new();
    };
    let b = &cands[best];
    let mut chosen = vec![b.clone()];
    let mut len = b.text.len();
    let sentence = |at: usize| cands.iter().find(|c| c.rank == b.rank && c.at == at);
    let points_back = leans_back(b.text);
    // The sentence before, when it says something: a whole sentence, not a
    // heading, a lone brace or the tail of a sentence the chunk cut.
    let before =
        b.at.checked_sub(1)
            .and_then(sentence)
            .filter(|s| points_back || whole_sentence(s.text));
    // A sentence that points back ("This is useful to …") needs the one
    // before it ("Use `as _`."): that goes first. Otherwise the ones that
    // follow go first, while they fit: the answer often sits after the
    // sentence that shares the question's words ("X is the default. To
    // turn it off, pass --y.", "For example:" and its code).
    let take_before = |chosen: &mut Vec<Candidate<'a>>, len: &mut usize| {
        if let Some(before) = before
            && *len + 1 + before.text.len() <= MAX_QUOTE
        {
            *len += 1 + before.text.len();
            chosen.insert(0, before.clone());
        }
    };
    if let Some(h) = b.header {
        // A row goes with its table's column names, before it.
        let header = cands
            .iter()
            .find(|c| c.rank == b.rank && c.text == h)
            .cloned()
            .unwrap_or_else(|| Candidate {
                at: usize::MAX,
                text: h,
                line: Some(h),
                header: None,
                last: false,
                lexical: 0.0,
                ..b.clone()
            });
        len += 1 + h.len();
        chosen.insert(0, header);
    } else if points_back {
        take_before(&mut chosen, &mut len);
    }
    let list = after(ranked, cands, best);
    for next in list.iter().copied() {
        // A sentence that leads into a table ("The module used depends on
        // the edition:") is quoted with its column names and the row whose
        // words best meet the question's, not the first rows that fit
        // (the rows may go on into the next chunk).
        let best_row = (0..cands.len())
            .filter(|&i| {
                b.header.is_none()
                    && cands[i].header == Some(next.text)
                    && list.iter().any(|c| std::ptr::eq(*c, &cands[i]))
            })
            // The row's own words tell rows apart ("2021", "octal").
            .max_by(|&x, &y| {
                cands[x]
                    .lexical
                    .total_cmp(&cands[y].lexical)
                    .then(score(x).total_cmp(&score(y)))
            });
        // Quoted as one passage: the best one's (a continuation is its
        // document's next chunk).
        let own = |c: &Candidate<'a>| Candidate {
            rank: b.rank,
            ..c.clone()
        };
        if let Some(row) = best_row {
            if len + 2 + next.text.len() + cands[row].text.len() <= MAX_QUOTE {
                len += 2 + next.text.len() + cands[row].text.len();
                chosen.push(own(next));
                chosen.push(own(&cands[row]));
            }
            break;
        }
        if len + 1 + next.text.len() > MAX_QUOTE {
            break;
        }
        len += 1 + next.text.len();
        chosen.push(own(next));
    }
    if !points_back && b.header.is_none() {
        take_before(&mut chosen, &mut len);
    }
    // A close runner-up from another passage, when there is room.
    if let Some(&second) = order.get(1)
        && cands[second].rank != b.rank
        && !chosen.iter().any(|c| c.text == cands[second].text)
        && score(second) >= 0.9 * score(best)
        && len + cands[second].text.len() <= MAX_QUOTE
    {
        chosen.push(cands[second].clone());
    }
    chosen
}

/// The sentences after candidate `best`, in order: the rest of its
/// passage, then — when that runs to the passage's end — its document's
/// next chunk, when that is among the ranked passages too (an "Example"
/// sentence at a chunk's end has its code in the next one; when the next
/// chunk ranks above this one, the sentences they share are its
/// candidates, so this passage's run stops short of its end and does not
/// go on). What the next chunk repeats of this one (chunks overlap,
/// the overlap may begin inside a sentence) is left out, and it goes on
/// only while its sentences are candidates in order (a sentence an earlier
/// passage holds is not one of its candidates: the quote stops there, as
/// within a passage).
fn after<'c, 'a>(
    ranked: &Ranked<'a>,
    cands: &'c [Candidate<'a>],
    best: usize,
) -> Vec<&'c Candidate<'a>> {
    let b = &cands[best];
    let mut out: Vec<&Candidate<'a>> = following(cands, best).collect();
    let ends = out.last().map_or(b.last, |c| c.last);
    let chunk = &ranked[b.rank].1.chunk;
    let next = ranked.iter().position(|(_, p)| {
        p.chunk.document_id == chunk.document_id && p.chunk.position == chunk.position + 1
    });
    if ends && let Some(next) = next {
        let text = &ranked[next].1.chunk.text;
        let repeated = ragtime_core::overlap_len(&chunk.text, text);
        let offset =
            |c: &Candidate<'_>| (c.text.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
        let mut at = None;
        for c in cands.iter().filter(|c| c.rank == next) {
            if at.is_none() && offset(c) < repeated {
                continue; // the overlap
            }
            if at.is_some_and(|a| c.at != a + 1) {
                break;
            }
            at = Some(c.at);
            out.push(c);
        }
    }
    out
}

/// Whether `s` is a sentence of prose: four words or more, from a capital
/// (or code) to its full stop.
fn whole_sentence(s: &str) -> bool {
    s.split_whitespace().count() >= 4
        && !s.starts_with(|c: char| c.is_lowercase())
        && s.ends_with(['.', '!', '?', ':'])
}

/// Whether a sentence opens by pointing back at the one before it.
fn leans_back(s: &str) -> bool {
    const BACK: &[&str] = &[
        "this",
        "that",
        "these",
        "those",
        "it",
        "its",
        "they",
        "such",
        "thus",
        "so",
        "here",
        "otherwise",
        "instead",
        "however",
    ];
    let first = s.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("");
    BACK.iter().any(|w| first.eq_ignore_ascii_case(w))
}

/// The chosen sentences of one passage as they read there: a sentence that
/// begins a line of it goes on a new line (whole lines with their
/// indentation), the rest follow with a space.
fn join_lines(texts: &[&Candidate<'_>]) -> String {
    let mut out = String::new();
    for (i, c) in texts.iter().enumerate() {
        match c.line {
            Some(line) if i > 0 => {
                out.push('\n');
                out.push_str(line);
            }
            _ if i > 0 => {
                out.push(' ');
                out.push_str(c.text);
            }
            Some(line) => out.push_str(line.trim_start()),
            None => out.push_str(c.text),
        }
    }
    out
}

/// The answer text from the chosen sentences: each passage's quote, then
/// where it comes from (its title — the section path when the document has
/// sections — and citation number).
fn compose(ranked: &Ranked<'_>, chosen: &[Candidate<'_>], why: Why) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut by_rank: Vec<(usize, Vec<&Candidate<'_>>)> = Vec::new();
    for c in chosen {
        match by_rank.iter_mut().find(|(r, _)| *r == c.rank) {
            Some((_, v)) => v.push(c),
            None => by_rank.push((c.rank, vec![c])),
        }
    }
    for (rank, texts) in by_rank {
        let (n, p) = ranked[rank];
        let quote = crate::chat::prompt::snippet(&join_lines(&texts), MAX_QUOTE);
        // Each line of the quote a line of the block quote.
        let quote = quote.replace('\n', "\n> ");
        let heading = p.chunk.heading();
        let source = if heading.is_empty() {
            format!("[{n}]")
        } else {
            format!("{heading} [{n}]")
        };
        parts.push(format!("> {quote}\n— {source}"));
    }
    let body = if parts.is_empty() {
        "No sources matched the question.".to_owned()
    } else {
        parts.join("\n\n")
    };
    with_note(body, why)
}

/// `body` with what the user is told of `why` (after it; before it for an
/// ungrounded answer's sources).
pub fn with_note(body: String, why: Why) -> String {
    match why.note() {
        Some(note) if why == Why::Ungrounded => format!("{note}\n\n{body}"),
        Some(note) => format!("{body}\n\n({note})"),
        None => body,
    }
}

/// The extractive answer by words and rank alone (no embedding model).
pub fn extractive_answer<'q>(asked: impl Into<Asked<'q>>, ranked: &Ranked<'_>, why: Why) -> String {
    let asked = asked.into();
    let cands = candidates(&asked, ranked);
    let mut scores = fused(&cands, None);
    weigh(asked.question, &cands, &mut scores);
    compose(ranked, &pick(ranked, &cands, &scores), why)
}

/// Candidates a configured cross-encoder scores at most (the best so far).
const MAX_CROSS: usize = 6;

/// The extractive answer with the models' help: the candidates are
/// embedded a few at a time within `time`; past it (or without a query
/// vector) words and rank decide alone. With a cross-encoder, the best
/// few are then scored by it too, in what is left of `time`.
pub async fn extract(
    asked: Asked<'_>,
    query_vec: Option<&[f32]>,
    ranked: &Ranked<'_>,
    embedder: &dyn Embedder,
    cross: Option<&dyn Reranker>,
    time: Duration,
    why: Why,
) -> Quote {
    let started = std::time::Instant::now();
    let cands = candidates(&asked, ranked);
    let wanted = match query_vec {
        Some(_) => cands.len().min(MAX_EMBEDDED),
        None => 0,
    };
    let (sims, embedded) = match query_vec.filter(|_| !cands.is_empty() && !time.is_zero()) {
        Some(qv) => similarities(&cands, qv, embedder, time).await,
        None => (None, 0),
    };
    let mut scores = fused(&cands, sims.as_deref());
    weigh(asked.question, &cands, &mut scores);
    let left = time.saturating_sub(started.elapsed());
    if let Some(cross) = cross.filter(|_| !cands.is_empty() && !left.is_zero()) {
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        order.truncate(MAX_CROSS);
        let texts = order.iter().map(|&i| cands[i].text.to_owned()).collect();
        let cancel = Cancel::with_deadline(std::time::Instant::now() + left);
        let query = format!("{}{}", asked.question, asked.context);
        if let Ok(Ok(s)) = tokio::time::timeout(left, cross.score(&query, texts, cancel)).await
            && s.len() == order.len()
        {
            let scored: Vec<(usize, f32)> = order.into_iter().zip(s).collect();
            blend_cross(&mut scores, &scored);
        }
    }
    Quote {
        text: compose(ranked, &pick(ranked, &cands, &scores), why),
        wanted,
        embedded,
    }
}

/// An extractive answer, and how much of the reading it had time for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    pub text: String,
    /// The candidate sentences it meant to compare with the question by
    /// their vectors (none without a query vector).
    pub wanted: usize,
    /// Those embedded in time.
    pub embedded: usize,
}

impl Quote {
    /// The text as a stage's result: whole when every sentence it meant
    /// to embed was, partial (saying how many) when time cut that short.
    pub fn done(self) -> crate::budget::Done<String> {
        use crate::budget::Done;
        if self.embedded >= self.wanted {
            return Done::Full(self.text);
        }
        let note = format!(
            "{} of {} candidate sentences embedded in time; words and rank chose the rest",
            self.embedded, self.wanted
        );
        Done::Partial(self.text, note)
    }
}

/// Candidates embedded per call: the best by words go first, so a quote
/// short of time still has their similarity.
const EMBED_GROUP: usize = 4;

/// Each candidate's cosine similarity to the query (the best by words and
/// rank embedded, a few at a time, within `time`), or `None` when not even
/// the first few were embedded in time.
///
/// Embedding 12 sentences took 13 to 45 ms on two cores (the batch pads to
/// its longest sentence, and the cores are shared): in one call, one in
/// eight questions lost every similarity at the 40 ms mark and was chosen
/// by words alone. A few at a time, the deadline costs only the last few.
async fn similarities(
    cands: &[Candidate<'_>],
    qv: &[f32],
    embedder: &dyn Embedder,
    time: Duration,
) -> (Option<Vec<f32>>, usize) {
    // The best by words and rank are embedded; the rest count as
    // dissimilar (they stay candidates, to be quoted after a chosen one).
    // Tokio's clock, so that a paused test clock measures it too.
    let deadline = tokio::time::Instant::now() + time;
    let mut by_words: Vec<usize> = (0..cands.len()).collect();
    by_words.sort_by(|&a, &b| cands[b].lexical.total_cmp(&cands[a].lexical));
    by_words.truncate(MAX_EMBEDDED);
    let mut sims: Option<Vec<f32>> = None;
    let mut embedded = 0;
    for group in by_words.chunks(EMBED_GROUP) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let texts: Vec<String> = group
            .iter()
            .map(|&i| match cands[i].header {
                Some(h) => format!("{h}\n{}", cands[i].text),
                None => cands[i].text.to_owned(),
            })
            .collect();
        let cancel = Cancel::with_deadline(deadline.into_std());
        match tokio::time::timeout(left, embedder.embed_passages(texts, cancel)).await {
            Ok(Ok(vs)) if vs.len() == group.len() => {
                let sims = sims.get_or_insert_with(|| vec![0.0; cands.len()]);
                for (&i, v) in group.iter().zip(&vs) {
                    sims[i] = v.iter().zip(qv).map(|(a, b)| a * b).sum();
                }
                embedded += group.len();
            }
            _ => break,
        }
    }
    (sims, embedded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tests::hit;
    use std::sync::Arc;

    fn ranked(hits: &[Passage]) -> Vec<(usize, &Passage)> {
        hits.iter().enumerate().map(|(i, h)| (i + 1, h)).collect()
    }

    #[test]
    fn quotes_the_sentence_that_answers_whole_with_its_source() {
        let hits = vec![
            hit(
                1,
                "Getting started › New projects",
                "A new project is created by the new command. This also initializes a new git repository by default. If you don't want it to do that, pass --vcs none.",
            ),
            hit(
                2,
                "Coffee",
                "Coffee contains more caffeine than tea. It is roasted.",
            ),
        ];
        let a = extractive_answer(
            "how do I start a new project without a git repository?",
            &ranked(&hits),
            Why::Chosen,
        );
        assert!(a.starts_with("> "), "{a}");
        assert!(a.contains("git repository by default"), "{a}");
        assert!(a.contains("— Getting started › New projects [1]"), "{a}");
        assert!(!a.contains("in time"), "chosen, not a timeout: {a}");
        let late = extractive_answer("caffeine in coffee", &ranked(&hits), Why::Late);
        assert!(
            late.starts_with("> Coffee contains more caffeine"),
            "{late}"
        );
        assert!(
            late.ends_with("(The model did not answer in time; this is quoted from the sources.)")
        );
        assert!(extractive_answer("q", &[], Why::Late).starts_with("No sources matched"));
    }

    #[test]
    fn the_sentences_after_the_best_one_follow_while_they_fit() {
        let hits = vec![hit(
            1,
            "Build",
            "Caching is off by default. To turn the build cache on:\ncargo build --cache on\nThat is all.",
        )];
        let a = extractive_answer("turn the build cache on", &ranked(&hits), Why::Chosen);
        assert!(
            a.contains("To turn the build cache on:\n> cargo build --cache on"),
            "{a}"
        );
    }

    /// The quote of one passage (`section`, `text`) for `question`.
    fn quote_one(section: &str, text: &str, question: &str) -> String {
        let hits = vec![hit(1, section, text)];
        extractive_answer(question, &ranked(&hits), Why::Chosen)
    }

    #[test]
    fn a_unit_goes_on_into_its_documents_next_chunk() {
        let mut first = hit(
            1,
            "Procedural macros",
            "Derive macros may declare helper attributes. A helper attribute is declared by adding its identifier to the attributes list. For example:",
        );
        let mut next = hit(
            2,
            "Procedural macros",
            "adding its identifier to the attributes list. For example:\n#[proc_macro_derive(Show, attributes(helper))]\npub fn derive_show(item: TokenStream) -> TokenStream {",
        );
        let other = hit(3, "Attributes", "Attributes are metadata applied to items.");
        for (p, position) in [(&mut first, 4), (&mut next, 5)] {
            let c = Arc::make_mut(&mut p.chunk);
            c.document_id = 7;
            c.position = position;
        }
        let question = "How do I declare a helper attribute for a derive macro?";
        // Ranked apart (another page between): the next chunk still goes on.
        let hits = vec![first.clone(), other.clone(), next.clone()];
        let a = extractive_answer(question, &ranked(&hits), Why::Chosen);
        assert!(
            a.contains("For example:\n> #[proc_macro_derive(Show, attributes(helper))]"),
            "{a}"
        );
        assert_eq!(a.matches("is declared by adding").count(), 1, "{a}");
        // The next chunk begins inside a sentence this one quoted: the
        // fragment is not quoted again.
        assert_eq!(
            a.matches("identifier to the attributes list").count(),
            1,
            "{a}"
        );
        assert!(
            a.contains("[1]") && !a.contains("[3]"),
            "cited as one passage: {a}"
        );
        // Another document's chunk does not continue it.
        Arc::make_mut(&mut next.chunk).document_id = 8;
        let hits = vec![first, other, next];
        let a = extractive_answer(question, &ranked(&hits), Why::Chosen);
        assert!(!a.contains("attributes(helper)"), "{a}");
    }

    #[test]
    fn a_heading_is_not_quoted_for_sharing_the_questions_words() {
        let mut p = hit(
            1,
            "Traits",
            "Return-position impl Trait in trait implementations\nFunctions in traits may use impl Trait as the return type of a method.",
        );
        Arc::make_mut(&mut p.chunk).section =
            "Impl trait › Return-position impl Trait in trait implementations".into();
        let mut q = hit(
            2,
            "Special traits",
            "The Termination trait gives the return types main may have.",
        );
        Arc::make_mut(&mut q.chunk).section = "Termination".into();
        let hits = vec![p, q];
        let a = extractive_answer(
            "What trait must the return type of main implement?",
            &ranked(&hits),
            Why::Chosen,
        );
        assert!(a.starts_with("> The Termination trait"), "{a}");
    }

    #[test]
    fn a_sentence_is_quoted_with_the_code_block_it_introduces_lines_kept() {
        let a = quote_one(
            "Documentation tests › Attributes",
            "Code blocks can be annotated with attributes. For example, to skip running a test, write:\nfn main() {\n    loop {}\n}\nThe test is still compiled.",
            "how do I keep a doc test from running",
        );
        assert!(
            a.starts_with("> Code blocks can be annotated with attributes. For example, to skip running a test, write:\n> fn main() {\n>     loop {}\n> }\n"),
            "{a}"
        );
        assert!(a.contains("— Documentation tests › Attributes [1]"), "{a}");
    }

    #[test]
    fn a_definition_is_quoted_with_its_default_line() {
        let a = quote_one(
            "Configuration › build.jobs",
            "build.jobs\nSets the maximum number of compiler processes to run in parallel.\nType: integer\nDefault: number of logical CPUs\nEnvironment: CARGO_BUILD_JOBS",
            "how many compiler processes run in parallel by default?",
        );
        assert!(a.contains("> Default: number of logical CPUs"), "{a}");
        // The key is the section's own name: said where the quote comes from.
        assert!(a.starts_with("> Sets the maximum number"), "{a}");
        assert!(
            a.contains("\n\u{2014} Configuration › build.jobs [1]"),
            "{a}"
        );
    }

    #[test]
    fn how_many_chooses_the_unit_with_the_number_over_closer_words() {
        let hits = vec![
            hit(1, "Derive", "A tuple struct can derive Debug."),
            hit(
                2,
                "Impls",
                "Derived impls cover tuple structs of up to 12 fields.",
            ),
        ];
        let r = ranked(&hits);
        let q = "how many fields may a tuple struct have for derived Debug";
        let a = extractive_answer(q, &r, Why::Chosen);
        assert!(
            a.starts_with("> Derived impls cover tuple structs of up to 12 fields."),
            "{a}"
        );
        // Asked what it is, not how many: the closer words win.
        let a = extractive_answer("can a tuple struct derive Debug", &r, Why::Chosen);
        assert!(a.starts_with("> A tuple struct can derive Debug."), "{a}");
    }

    #[test]
    fn the_code_a_question_names_is_read_with_its_symbols() {
        assert_eq!(literals("And what about *mut T?"), ["*mut T"]);
        assert_eq!(literals("Is &'a mut T covariant?"), ["&'a mut T"]);
        assert_eq!(
            literals("Why use Box<T> in a struct with std::mem::swap?"),
            ["Box<T>", "std::mem::swap"]
        );
        assert_eq!(
            literals("Does `cargo build --release` keep built-in lints (see max_width)?"),
            ["cargo build --release", "max_width"]
        );
        assert!(literals("How do I start a well-known project, e.g. a web one?").is_empty());
    }

    #[test]
    fn similarity_outranks_words_when_it_is_there() {
        let hits = vec![
            hit(1, "T", "The river bank was muddy after the rain."),
            hit(2, "U", "Deposits at a bank earn interest every month."),
        ];
        let r = ranked(&hits);
        let c = candidates(&"where does my savings money grow".into(), &r);
        assert_eq!(c.len(), 2);
        // By words and rank alone, the first passage's sentence.
        assert!(
            pick(&r, &c, &fused(&c, None))[0]
                .text
                .starts_with("The river")
        );
        // The model's similarity knows better.
        let p = pick(&r, &c, &fused(&c, Some(&[0.1, 0.8])));
        assert!(p[0].text.starts_with("Deposits"), "{p:?}");
        // And a cross-encoder that prefers the first takes it back.
        let mut s = fused(&c, Some(&[0.1, 0.8]));
        blend_cross(&mut s, &[(0, 4.0), (1, -3.0)]);
        assert!(pick(&r, &c, &s)[0].text.starts_with("The river"), "{s:?}");
    }

    /// Prefers sentences that name "bank" first; takes `delay`.
    struct Cross(Duration);

    #[async_trait::async_trait]
    impl Reranker for Cross {
        async fn score(
            &self,
            _query: &str,
            passages: Vec<String>,
            _cancel: Cancel,
        ) -> Result<Vec<f32>, ragtime_core::StageError> {
            tokio::time::sleep(self.0).await;
            Ok(passages
                .iter()
                .map(|p| if p.starts_with("The river") { 5.0 } else { 0.0 })
                .collect())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cross_encoder_has_its_say_within_the_time_left() {
        let hits = vec![
            hit(1, "T", "Deposits at a bank earn interest every month."),
            hit(2, "U", "The river bank was muddy after the rain."),
        ];
        let r = ranked(&hits);
        let e = ragtime_testkit::HashEmbedder::new(8);
        let (quick, slow) = (
            Cross(Duration::from_millis(5)),
            Cross(Duration::from_millis(500)),
        );
        let cases: [(Option<&dyn Reranker>, &str, &str); 3] = [
            (None, "> Deposits", "words and rank alone"),
            (Some(&quick), "> The river", "the cross-encoder's choice"),
            (Some(&slow), "> Deposits", "too slow: not waited for"),
        ];
        for (cross, starts, why) in cases {
            let time = Duration::from_millis(40);
            let a = extract(
                "bank deposits".into(),
                None,
                &r,
                &e,
                cross,
                time,
                Why::Chosen,
            )
            .await
            .text;
            assert!(a.starts_with(starts), "{why}: {a}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_sentences_embedded_in_time_keep_their_similarity_past_the_deadline() {
        let text = "Alpha one is here. Beta two is there. Gamma three goes. Delta four stays. Epsilon five ends. Zeta six waits.";
        let hits = vec![hit(1, "T", text)];
        let r = ranked(&hits);
        let query = "alpha beta gamma delta epsilon zeta";
        let c = candidates(&query.into(), &r);
        assert_eq!(c.len(), 6);
        let time = Duration::from_millis(40);
        let embedded = |delay: u64| {
            let e = ragtime_testkit::HashEmbedder::new(64).with_delay(Duration::from_millis(delay));
            let qv = e.vector(query);
            let c = &c;
            async move {
                let (sims, embedded) = similarities(c, &qv, &e, time).await;
                let counted = sims.map(|sims| sims.iter().filter(|s| **s != 0.0).count());
                assert_eq!(counted.unwrap_or(0), embedded);
                counted
            }
        };
        // Time for both groups: every candidate has its similarity.
        assert_eq!(embedded(10).await, Some(6));
        // Each call 30 ms: the second would end past the 40 ms; the first
        // group keeps what it got.
        assert_eq!(embedded(30).await, Some(EMBED_GROUP));
        // Not even the first few in time: words alone.
        assert_eq!(embedded(100).await, None);
    }

    #[test]
    fn a_which_question_quotes_the_sentence_naming_a_new_term_of_that_kind() {
        let hits = vec![
            hit(
                1,
                "Diagnostics › expect",
                "The unused_variables lint is suppressed by an expect attribute.",
            ),
            hit(
                2,
                "Diagnostics › expect",
                "If an expect attribute on a variable is not fulfilled, the unfulfilled_lint_expectations lint is emitted.",
            ),
        ];
        let r = ranked(&hits);
        // By words and rank the first passage's sentence would win (4 of
        // the question's 7 words, ranked first, against 5 of 7 ranked
        // second); it names no lint the question does not.
        let q = "I put expect(unused_variables) on a used variable: which lint fires because the expect attribute is not fulfilled?";
        let a = extractive_answer(q, &r, Why::Chosen);
        assert!(
            a.starts_with("> If an expect attribute on a variable is not fulfilled, the unfulfilled_lint_expectations lint"),
            "{a}"
        );
        // Asked no kind: the closer words win.
        let a = extractive_answer(
            "what does the expect attribute do to the unused_variables lint",
            &r,
            Why::Chosen,
        );
        assert!(
            a.starts_with("> The unused_variables lint is suppressed"),
            "{a}"
        );
    }

    #[test]
    fn a_table_row_is_quoted_under_its_column_names() {
        let a = quote_one(
            "Tokens › Number literals",
            "Integer literals come in four bases.\nNumber literals | Example | Exponentiation\nDecimal integer | 98_222 | N/A\nHex integer | 0xff | N/A\nOctal integer | 0o77 | N/A\nBinary integer | 0b1111_0000 | N/A",
            "What prefix do I write for an octal integer literal?",
        );
        assert!(
            a.starts_with(
                "> Number literals | Example | Exponentiation\n> Octal integer | 0o77 | N/A"
            ),
            "{a}"
        );
        // A sentence that leads into a table (closer to the question by
        // words than any row): its column names and the row the question
        // names, not the first rows that fit.
        let a = quote_one(
            "Preludes › Standard library prelude",
            "The module used depends on the crate's edition and on whether no_std is applied:\nEdition | no_std not applied | no_std applied\n2015 | std::prelude::rust_2015 | core::prelude::rust_2015\n2018 | std::prelude::rust_2018 | core::prelude::rust_2018\n2021 | std::prelude::rust_2021 | core::prelude::rust_2021\n2024 | std::prelude::rust_2024 | core::prelude::rust_2024",
            "Which module does the crate's edition decide when no_std is applied, for 2021?",
        );
        assert!(
            a.starts_with("> The module used depends on the crate's edition and on whether no_std is applied:\n> Edition | no_std not applied | no_std applied\n> 2021 | std::prelude::rust_2021 | core::prelude::rust_2021\n"),
            "{a}"
        );
        assert!(!a.contains("rust_2015"), "{a}");
    }

    #[test]
    fn a_name_asked_for_counts_in_the_sentences_quoted_after_the_best() {
        // The name comes two sentences after the words the question
        // shares: what the unit quotes is weighed, not its first sentence.
        let hits = vec![
            hit(
                1,
                "Undefined behavior",
                "Safe callers of unsafe code can trigger undefined behavior in many ways.",
            ),
            hit(
                2,
                "Undefined behavior",
                "Unsafe code must make sure no safe caller can trigger undefined behavior. The compiler does not check it. Such code is called sound.",
            ),
        ];
        let r = ranked(&hits);
        let q = "What do you call unsafe code that no safe caller can use to trigger undefined behavior?";
        let a = extractive_answer(q, &r, Why::Chosen);
        assert!(
            a.starts_with("> Unsafe code must make sure no safe caller can trigger undefined behavior. The compiler does not check it. Such code is called sound."),
            "{a}"
        );
    }
}
