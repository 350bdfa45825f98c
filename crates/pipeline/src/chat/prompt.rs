//! Sizing and building the prompt: a pure function of what the backend has
//! shown of its speed, the time the request can give the LLM stages, the
//! context window and the passages.

use crate::backend::stats::Estimates;
use ragtime_core::{Message, Passage};
use std::sync::Arc;
use std::time::Duration;

/// Short and exact: small models stay closer to their sources when told to
/// answer briefly and quote (measured with `ragtime-bench answers`).
pub(crate) const SYSTEM: &str = "Answer the question in one or two sentences, using only the numbered sources below. Quote the exact command, flag, attribute, keyword, file name or value the sources give, and cite the source like [1]. If the sources do not contain the answer, say that you do not know.";

/// Default `max_tokens` when the client sets none (`chat.max_tokens`).
pub const DEFAULT_MAX_TOKENS: u32 = 256;
/// Share of the `llm_ttft` allotment the prompt may fill (the rest is
/// headroom for queueing and estimation error).
const TTFT_SHARE: f64 = 0.7;
/// The least of the best passage a prompt holds when the allotment has
/// room for none: a model is never asked without its sources (it answers
/// from what it was trained on, uncited), and one prompt read at the
/// backend's true speed corrects an estimate a busy moment made too slow.
pub const LEAST_SOURCE_CHARS: usize = 600;

/// How much prompt and output a request can afford.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptPlan {
    /// Characters of prompt the backend can prefill within the allotment.
    pub max_chars: usize,
    /// Characters of prompt the context window holds (beside the output).
    pub context_chars: usize,
    /// Output tokens: the client's ask, capped by what fits in the
    /// generation allotment.
    pub output_cap: usize,
    pub chars_per_token: f64,
    pub context_tokens: usize,
}

/// The prompt to send, the passages it holds (its citations, in order)
/// and the output tokens asked for.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub messages: Vec<Message>,
    pub passages: Vec<Passage>,
    pub max_tokens: u32,
    /// Characters of prompt text (all messages).
    pub chars: usize,
    /// The allotment had room for no passage: the best one was sent all
    /// the same (cut to [`LEAST_SOURCE_CHARS`]), past what the backend is
    /// expected to read in time.
    pub over_allotment: bool,
}

impl PromptPlan {
    /// `ttft` and `generate`: the allotments the LLM stages will get.
    pub fn new(
        est: &Estimates,
        ttft: Duration,
        generate: Duration,
        context_tokens: usize,
        asked: Option<u32>,
    ) -> Self {
        let output_cap = (asked.unwrap_or(DEFAULT_MAX_TOKENS) as usize)
            .min(est.output_tokens_within(generate))
            .max(1);
        let context = context_tokens.saturating_sub(output_cap + 64);
        let prompt_tokens = est
            .prompt_tokens_within(ttft.mul_f64(TTFT_SHARE))
            .min(context);
        Self {
            max_chars: (prompt_tokens as f64 * est.chars_per_token) as usize,
            context_chars: (context as f64 * est.chars_per_token) as usize,
            output_cap,
            chars_per_token: est.chars_per_token,
            context_tokens,
        }
    }

    /// The prompt for `query` after `history`, with as many of `hits`
    /// (best first) as fit.
    /// When the allotment holds none of them, the best one goes all the
    /// same, cut to [`LEAST_SOURCE_CHARS`] (as far as the context window
    /// allows).
    pub fn build(&self, hits: &[Passage], history: &[Message], query: &str) -> Prompt {
        let (mut messages, mut passages) = build_prompt(hits, history, query, self.max_chars);
        let mut over_allotment = false;
        if passages.is_empty() && !hits.is_empty() {
            let least = (fixed_chars(history, query) + LEAST_SOURCE_CHARS).min(self.context_chars);
            if least > self.max_chars {
                (messages, passages) = build_prompt(hits, history, query, least);
                over_allotment = !passages.is_empty();
            }
        }
        let chars: usize = messages.iter().map(|m| m.content.len()).sum();
        let room = self
            .context_tokens
            .saturating_sub((chars as f64 / self.chars_per_token) as usize + 16)
            .max(1);
        Prompt {
            messages,
            passages,
            max_tokens: u32::try_from(self.output_cap.min(room)).unwrap_or(DEFAULT_MAX_TOKENS),
            chars,
            over_allotment,
        }
    }
}

pub(crate) fn snippet(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    match cut.rfind(' ') {
        Some(i) if i > max / 2 => format!("{}…", &cut[..i]),
        _ => format!("{cut}…"),
    }
}

fn source_block(i: usize, hit: &Passage) -> String {
    let heading = hit.chunk.heading();
    if heading.is_empty() {
        format!("[{}] {}", i + 1, hit.chunk.text)
    } else {
        format!("[{}] {heading}\n{}", i + 1, hit.chunk.text)
    }
}

/// The prompt's characters besides its sources: the system prompt, the
/// earlier turns and the question.
fn fixed_chars(history: &[Message], query: &str) -> usize {
    SYSTEM.len() + 16 + query.len() + history.iter().map(|m| m.content.len() + 8).sum::<usize>()
}

/// The prompt: system prompt and sources first (in chunk-id order, so the
/// same passages give the same prefix), then earlier turns, then the
/// question. Passages are taken best-first until `max_chars` is used up.
pub fn build_prompt(
    hits: &[Passage],
    history: &[Message],
    query: &str,
    max_chars: usize,
) -> (Vec<Message>, Vec<Passage>) {
    let mut room = max_chars.saturating_sub(fixed_chars(history, query));
    let mut chosen: Vec<Passage> = Vec::new();
    for h in hits {
        let need = h.chunk.text.len() + h.chunk.title.len() + h.chunk.section.len() + 12;
        if need <= room {
            room -= need;
            chosen.push(h.clone());
        } else if chosen.is_empty() && room > 200 {
            // The best passage alone is too long: send the part that fits.
            let mut cut = h.clone();
            let mut text = Arc::unwrap_or_clone(cut.chunk.clone());
            let keep = room.saturating_sub(text.title.len() + text.section.len() + 12);
            text.text = snippet(&text.text, keep);
            cut.chunk = Arc::new(text);
            chosen.push(cut);
            break;
        } else {
            break;
        }
    }
    chosen.sort_by_key(|h| h.chunk.chunk_id);
    let sources: Vec<String> = chosen
        .iter()
        .enumerate()
        .map(|(i, h)| source_block(i, h))
        .collect();
    let system = if sources.is_empty() {
        format!("{SYSTEM}\n\nSources: none were found.")
    } else {
        format!("{SYSTEM}\n\nSources:\n\n{}", sources.join("\n\n"))
    };
    let mut messages = vec![Message::new("system", system)];
    messages.extend(history.iter().cloned());
    messages.push(Message::new("user", query));
    (messages, chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tests::hit;

    #[test]
    fn prompt_is_static_first_and_stable_in_order() {
        let hits = vec![hit(9, "Nine", "ninth text"), hit(3, "Three", "third text")];
        let history = vec![
            Message::new("user", "hi"),
            Message::new("assistant", "hello"),
        ];
        let (msgs, chosen) = build_prompt(&hits, &history, "what is third?", 10_000);
        assert_eq!(msgs.len(), 4);
        assert_eq!(msgs[0].role, "system");
        assert_eq!(msgs[3], Message::new("user", "what is third?"));
        assert_eq!(&msgs[1..3], &history[..]);
        // Sources in chunk-id order whatever the rank order.
        let sys = &msgs[0].content;
        assert!(sys.find("[1] Three").unwrap_or(usize::MAX) < sys.find("[2] Nine").unwrap_or(0));
        assert_eq!(
            chosen.iter().map(|h| h.chunk.chunk_id).collect::<Vec<_>>(),
            [3, 9]
        );
        let (again, _) = build_prompt(
            &[hits[1].clone(), hits[0].clone()],
            &history,
            "other?",
            10_000,
        );
        assert_eq!(again[0], msgs[0], "same passages, same prefix");
    }

    #[test]
    fn passages_are_trimmed_best_first_to_the_room_left() {
        let long = "word ".repeat(200);
        let hits = vec![hit(1, "A", &long), hit(2, "B", &long), hit(3, "C", &long)];
        let room = SYSTEM.len() + 100 + 2 * 1010;
        let (_, chosen) = build_prompt(&hits, &[], "q", room);
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[0].chunk.chunk_id, 1);
        // No room at all: no sources, and the prompt says so.
        let (msgs, chosen) = build_prompt(&hits, &[], "q", 10);
        assert!(chosen.is_empty());
        assert!(msgs[0].content.contains("none were found"));
        // Room for part of the best passage only: it is cut, not dropped.
        let (_, chosen) = build_prompt(&hits, &[], "q", SYSTEM.len() + 600);
        assert_eq!(chosen.len(), 1);
        assert!(chosen[0].chunk.text.len() < long.len());
    }

    #[test]
    fn the_best_passage_goes_even_when_the_allotment_holds_none() {
        // 26 ms a prompt token (a busy moment's estimate): 2.8 s of the
        // 4 s allotment reads about 100 tokens, room for the question only.
        let est = Estimates {
            ttft_base_ms: 100.0,
            ms_per_prompt_token: 26.0,
            ms_per_output_token: 10.0,
            chars_per_token: 4.0,
            ms_per_read_token: None,
            observations: 10,
        };
        let secs = Duration::from_secs;
        let p = PromptPlan::new(&est, secs(4), secs(10), 4096, None);
        let long = "word ".repeat(400);
        let hits = vec![hit(1, "A", &long), hit(2, "B", &long)];
        let (_, none) = build_prompt(&hits, &[], "q", p.max_chars);
        assert!(none.is_empty(), "the allotment alone holds no passage");
        let prompt = p.build(&hits, &[], "q");
        assert_eq!(prompt.passages.len(), 1);
        assert_eq!(prompt.passages[0].chunk.chunk_id, 1, "the best one");
        assert!(prompt.passages[0].chunk.text.len() <= LEAST_SOURCE_CHARS);
        assert!(prompt.over_allotment);
        assert!(!prompt.messages[0].content.contains("none were found"));
        // A context window with no room for any: none, and the caller does
        // not ask the model.
        let tiny = PromptPlan::new(&est, secs(4), secs(10), 64 + 8 + 100, Some(8));
        let prompt = tiny.build(&hits, &[], "q");
        assert!(prompt.passages.is_empty());
        assert!(!prompt.over_allotment);
    }

    #[test]
    fn the_plan_fits_the_allotments_and_the_context() {
        let est = Estimates {
            ttft_base_ms: 100.0,
            ms_per_prompt_token: 1.0,
            ms_per_output_token: 10.0,
            chars_per_token: 4.0,
            ms_per_read_token: None,
            observations: 10,
        };
        // 1 s of TTFT: 70 % = 700 ms, minus 100 ms base = 600 tokens.
        let p = PromptPlan::new(
            &est,
            Duration::from_secs(1),
            Duration::from_secs(2),
            4096,
            None,
        );
        assert_eq!(p.max_chars, 2400);
        // 2 s at 10 ms a token: 201 tokens fit, under the 256 default.
        assert_eq!(p.output_cap, 201);
        // The client's own max_tokens is smaller: it stands.
        let p = PromptPlan::new(
            &est,
            Duration::from_secs(1),
            Duration::from_secs(2),
            4096,
            Some(50),
        );
        assert_eq!(p.output_cap, 50);
        // A small context caps the prompt: 512 − (50 + 64) tokens.
        let p = PromptPlan::new(
            &est,
            Duration::from_secs(10),
            Duration::from_secs(2),
            512,
            Some(50),
        );
        assert_eq!(p.max_chars, 398 * 4);
        let prompt = p.build(&[hit(1, "T", "text")], &[], "q");
        assert_eq!(prompt.passages.len(), 1);
        assert!(!prompt.over_allotment);
        assert_eq!(prompt.max_tokens, 50);
        assert_eq!(
            prompt.chars,
            prompt
                .messages
                .iter()
                .map(|m| m.content.len())
                .sum::<usize>()
        );
    }
}
