//! Sentences and the words that must not be made up: what the extractive
//! answer quotes and what the grounding check tests.

/// Words too common to say anything about a match.
const STOP: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "has", "have", "how",
    "its", "may", "one", "our", "out", "use", "was", "what", "when", "where", "which", "who",
    "why", "will", "with", "this", "that", "there", "their", "them", "then", "than", "from",
    "into", "does", "doing", "did", "should", "would", "could", "get", "got", "i'm", "your",
    "yours", "about", "also", "just", "only", "some", "such", "these", "those", "want", "need",
    "way", "make", "using", "used", "there's", "it's", "is", "be", "do", "it", "in", "on", "of",
    "to", "or", "an", "a", "as", "at", "by", "if", "so", "my", "me", "we", "no", "yes",
];

/// Abbreviations after which a full stop does not end a sentence.
const ABBREVIATIONS: &[&str] = &[
    "e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.", "fig.",
];

/// Lower-cased content words of `text`, stemmed (stop words and one-letter
/// words dropped), so "closures" meets "closure" and "implementation"
/// meets "implement".
pub(crate) fn content_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.chars().count() > 1)
        .map(str::to_lowercase)
        .filter(|w| !STOP.contains(&w.as_str()))
        .map(stem)
        .collect()
}

/// `w` (lower case) reduced to its English Snowball stem ("closures",
/// "closure" → "closur"; "looping", "loops" → "loop"): a question's words
/// rarely take the form its answer's do.
pub(crate) fn stem(w: String) -> String {
    match frostem::Stemmer::new(frostem::Algorithm::English).stem(&w) {
        std::borrow::Cow::Borrowed(_) => w,
        std::borrow::Cow::Owned(s) => s,
    }
}

/// The sentences of `text`, trimmed, in order. A line break always ends
/// one (so a code line or a list item stays whole and alone); within a
/// line, `.`, `!` or `?` followed by a space and a capital, digit, quote
/// or bracket ends one, except after a known abbreviation.
pub(crate) fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in text.lines() {
        let bytes = line.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if matches!(b, b'.' | b'!' | b'?')
                && bytes.get(i + 1) == Some(&b' ')
                && bytes.get(i + 2).is_some_and(|n| {
                    n.is_ascii_uppercase() || n.is_ascii_digit() || b"\"'(`[".contains(n)
                })
            {
                let piece = &line[start..=i];
                let last_word = piece.rsplit(' ').next().unwrap_or("").to_ascii_lowercase();
                if !ABBREVIATIONS.contains(&last_word.as_str()) {
                    push(&mut out, piece);
                    start = i + 2;
                }
            }
            i += 1;
        }
        push(&mut out, &line[start..]);
    }
    out
}

fn push<'a>(out: &mut Vec<&'a str>, s: &'a str) {
    let s = s.trim();
    if !s.is_empty() {
        out.push(s);
    }
}

/// The specific terms of a sentence that a source must contain for the
/// sentence to stand: code in backticks, flags, paths, numbers and
/// identifiers (anything with `_`, `::`, `#`, `/`, `.` or `=` inside, a
/// digit, an inner capital or all capitals). Citation marks (`[1]`) are not
/// terms.
pub(crate) fn specific_terms(sentence: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut rest = sentence;
    // Code spans first, whole.
    let mut plain = String::new();
    while let Some(open) = rest.find('`') {
        plain.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('`') {
            Some(close) => {
                let code = after[..close].trim();
                if !code.is_empty() {
                    terms.push(code.to_owned());
                }
                rest = &after[close + 1..];
            }
            None => {
                rest = after;
            }
        }
    }
    plain.push_str(rest);
    for raw in plain.split_whitespace() {
        let w = raw.trim_matches(|c: char| {
            matches!(
                c,
                ',' | ';' | ':' | '"' | '\'' | '(' | ')' | '!' | '?' | '*'
            )
        });
        let w = w.trim_end_matches('.');
        if w.is_empty() || is_citation(w) {
            continue;
        }
        let inner = w.get(1..w.len().saturating_sub(1)).unwrap_or("");
        let chars: Vec<char> = w.chars().collect();
        let flag = w.starts_with('-') && chars.len() > 1 && chars[1].is_alphanumeric();
        let symbol = ["_", "::", "#", "/", ".", "="]
            .iter()
            .any(|s| inner.contains(s))
            || w.starts_with('#')
            || w.starts_with("--");
        let digit = chars.iter().any(char::is_ascii_digit);
        let inner_cap = chars.iter().skip(1).any(char::is_ascii_uppercase)
            && chars.iter().any(char::is_ascii_lowercase);
        let all_caps = chars.len() > 1
            && chars
                .iter()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            && chars.iter().filter(|c| c.is_ascii_uppercase()).count() > 1;
        if flag || symbol || digit || inner_cap || all_caps {
            terms.push(w.trim_start_matches('[').trim_end_matches(']').to_owned());
        }
    }
    terms.retain(|t| !t.is_empty());
    terms
}

/// `[3]` and the like.
fn is_citation(w: &str) -> bool {
    let inner = w.trim_start_matches('[').trim_end_matches(']');
    w.starts_with('[')
        && !inner.is_empty()
        && inner
            .split(',')
            .all(|p| p.trim().chars().all(|c| c.is_ascii_digit()))
}

/// The citation numbers a sentence carries (`[1]`, `[2, 3]`).
pub(crate) fn cited(sentence: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut rest = sentence;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find(']') else { break };
        for p in after[..close].split(',') {
            if let Ok(n) = p.trim().parse::<usize>() {
                out.push(n);
            }
        }
        rest = &after[close + 1..];
    }
    out
}

/// Lower case with runs of whitespace as one space, for "does the source
/// contain this term" checks that ignore line wraps.
pub(crate) fn normalised(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_end_at_stops_and_lines_not_at_abbreviations_or_decimals() {
        let t = "Use the attribute, e.g. Foo here. Version 1.5 works! Next one?\n    let x = a.b(); // code stays\n- a list item. And more";
        assert_eq!(
            sentences(t),
            [
                "Use the attribute, e.g. Foo here.",
                "Version 1.5 works!",
                "Next one?",
                "let x = a.b(); // code stays",
                "- a list item.",
                "And more"
            ]
        );
    }

    #[test]
    fn specific_terms_are_code_flags_paths_numbers_and_identifiers() {
        let s = "Pass `--vcs none` or set CARGO_HOME, see src/main.rs and #[must_use] with 42 items [1].";
        let t = specific_terms(s);
        for want in [
            "--vcs none",
            "CARGO_HOME",
            "src/main.rs",
            "#[must_use",
            "42",
        ] {
            assert!(t.iter().any(|x| x == want), "{want} missing from {t:?}");
        }
        assert!(!t.iter().any(|x| x == "1" || x == "[1]"), "{t:?}");
        assert!(specific_terms("The cache is shared by every request.").is_empty());
        assert_eq!(specific_terms("Use --release for speed."), ["--release"]);
    }

    #[test]
    fn citations_and_content_words() {
        assert_eq!(cited("It is so [1]. Also [2, 3]"), [1, 2, 3]);
        assert_eq!(
            content_words("How do closures capture the values?"),
            content_words("closure captured value")
        );
        assert_eq!(
            content_words("implementation looping"),
            content_words("implements loop")
        );
    }
}
