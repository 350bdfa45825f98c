//! Files read together (one upload, one `ragtime ingest` of a folder) made
//! documents: what a folder as users have it holds besides the pages —
//! page chrome on every page, pages that only redirect, a page that
//! repeats the others (an mdBook's `print.html`), files they did not mean
//! to send — is dropped here, so none of it fills the top hits.

use crate::{Block, Parsed, ParsedFile, assemble};
use ragtime_core::IngestDoc;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// A file that gives no document, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its index among the files read together.
    pub file: usize,
    /// The document id it would have had.
    pub id: String,
    /// Lowercase, for the user: "only redirects to …", "repeats 18 other
    /// pages of this upload (a.html, b.html, …)".
    pub reason: String,
}

/// The documents of files read together, each with the index of the file
/// it came from, and the files skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Documents {
    pub docs: Vec<IngestDoc>,
    /// `from[i]` is the file `docs[i]` came from.
    pub from: Vec<usize>,
    pub skipped: Vec<Skipped>,
}

/// A line counts toward telling a page's content apart (shorter ones —
/// "Examples", "}" — are on many pages by chance).
const MIN_LINE: usize = 24;
/// A page holds another when this share of the other's lines is on it…
const CONTAINED: f32 = 0.8;
/// …(pages of fewer lines than this are too small to tell)…
const MIN_LINES: usize = 5;
/// …and repeats others when it holds at least this many (two copies of
/// one page are both kept: neither is a compilation of the other)…
const REPEATED_FROM: usize = 3;
/// …and their lines are this share of its own.
const REPEATED_SHARE: f32 = 0.6;

/// The lines that tell a structured file's content apart.
fn content_lines(blocks: &[Block]) -> HashSet<&str> {
    blocks
        .iter()
        .filter_map(|b| match b {
            Block::Line(l) | Block::Term(l, _) => Some(l.as_str()),
            _ => None,
        })
        .filter(|l| l.len() >= MIN_LINE)
        .collect()
}

/// The structured files that repeat others (index → reason): a file that
/// holds nearly all of at least [`REPEATED_FROM`] smaller files (each
/// [`CONTAINED`] of its lines found in it), those files' lines making up
/// [`REPEATED_SHARE`] of its own — a print-all page holds every chapter.
/// Pages that share boilerplate (the common options of a tool's command
/// pages) each keep most lines of their own and are not caught.
fn repeats(files: &[ParsedFile]) -> HashMap<usize, String> {
    let lines: Vec<Option<(&str, HashSet<&str>)>> = files
        .iter()
        .map(|f| match &f.0 {
            Parsed::Blocks { id, blocks, .. } => Some((id.as_str(), content_lines(blocks))),
            _ => None,
        })
        .collect();
    let mut on: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        for line in l.iter().flat_map(|(_, s)| s.iter()) {
            on.entry(line).or_default().push(i);
        }
    }
    let size = |j: usize| lines[j].as_ref().map_or(0, |(_, s)| s.len());
    let mut out = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        let Some((_, mine)) = l else { continue };
        let mut shared: HashMap<usize, usize> = HashMap::new();
        for line in mine {
            for &j in on[line].iter().filter(|&&j| j != i) {
                *shared.entry(j).or_default() += 1;
            }
        }
        let held: HashSet<usize> = shared
            .into_iter()
            .filter(|&(j, n)| {
                size(j) >= MIN_LINES
                    && size(j) < mine.len()
                    && n as f32 >= CONTAINED * size(j) as f32
            })
            .map(|(j, _)| j)
            .collect();
        let covered = mine
            .iter()
            .filter(|line| on[*line].iter().any(|j| held.contains(j)))
            .count();
        if held.len() < REPEATED_FROM || (covered as f32) < REPEATED_SHARE * mine.len() as f32 {
            continue;
        }
        let mut names: Vec<&str> = held
            .iter()
            .filter_map(|&j| lines[j].as_ref().map(|(id, _)| *id))
            .collect();
        names.sort_unstable();
        let more = names.len().saturating_sub(3);
        names.truncate(3);
        let more = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        let reason = format!(
            "repeats {} other pages read with it ({}{more})",
            held.len(),
            names.join(", ")
        );
        out.insert(i, reason);
    }
    out
}

/// Lines (not headings, not code) found on more than half of the
/// structured files, and on three at least, when there are four or more:
/// page chrome (a site's banner, a "press ← or → to navigate" hint).
fn chrome(files: &[ParsedFile], skip: &HashMap<usize, String>) -> HashSet<String> {
    let structured: Vec<&Vec<Block>> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains_key(i))
        .filter_map(|(_, f)| match &f.0 {
            Parsed::Blocks { blocks, .. } => Some(blocks),
            _ => None,
        })
        .collect();
    if structured.len() < 4 {
        return HashSet::new();
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for blocks in &structured {
        let lines: HashSet<&str> = blocks.iter().filter_map(Block::line).collect();
        for l in lines {
            *seen.entry(l).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|&(_, n)| n >= 3 && n * 2 > structured.len())
        .map(|(l, _)| l.to_owned())
        .collect()
}

/// The documents of files read together (one upload, one `ragtime
/// ingest`). A page that only redirects is skipped (found when it was
/// read); so is a page that repeats the others ([`repeats`]: a print-all
/// page would otherwise fill the top hits with copies); page chrome is
/// dropped from each page ([`chrome`]), unless that would leave it empty.
pub fn into_documents(files: Vec<ParsedFile>) -> Documents {
    let skip = repeats(&files);
    let chrome = chrome(&files, &skip);
    let mut out = Documents::default();
    // A page whose text another page of the upload already has (a
    // generated site's index.html and its first chapter) is read once.
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (i, f) in files.into_iter().enumerate() {
        match f.0 {
            Parsed::Docs(docs) => {
                out.from.extend(std::iter::repeat_n(i, docs.len()));
                out.docs.extend(docs);
            }
            Parsed::Skipped { id, reason } => out.skipped.push(Skipped {
                file: i,
                id,
                reason,
            }),
            Parsed::Blocks { id, .. } if skip.contains_key(&i) => out.skipped.push(Skipped {
                file: i,
                id,
                reason: skip[&i].clone(),
            }),
            Parsed::Blocks { id, title, blocks } => {
                let is_chrome = |b: &Block| matches!(b, Block::Line(l) if chrome.contains(l));
                let blocks = if blocks
                    .iter()
                    .all(|b| is_chrome(b) || matches!(b, Block::Heading(..)))
                {
                    blocks
                } else {
                    blocks.into_iter().filter(|b| !is_chrome(b)).collect()
                };
                let (text, sections) = assemble(&title, &blocks);
                if let Some(first) = seen.get(&text) {
                    let reason = format!("the same text as {first}");
                    out.skipped.push(Skipped {
                        file: i,
                        id,
                        reason,
                    });
                    continue;
                }
                seen.insert(text.clone(), id.clone());
                out.from.push(i);
                out.docs.push(IngestDoc {
                    metadata: Map::from_iter([("source".to_owned(), Value::String(id.clone()))]),
                    id,
                    title,
                    text,
                    sections,
                });
            }
        }
    }
    out
}

/// Which files of a folder or upload are read: `include` patterns (none:
/// every file of a known type) less `exclude` patterns. A pattern with a
/// `/` matches the path from the folder given (`guide/*.html`,
/// `**/drafts/**`); one without matches the file's name in any folder
/// (`print.html`, `*.rs`), as `.gitignore` reads them.
#[derive(Debug, Clone, Default)]
pub struct FileFilter {
    include: Vec<glob::Pattern>,
    exclude: Vec<glob::Pattern>,
}

/// A pattern that is not one: which list it was in (`include` or
/// `exclude`, the form field and the flag that name it) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub list: &'static str,
    pub message: String,
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl FileFilter {
    /// The filter, or which pattern is not one (and why).
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, PatternError> {
        let compile =
            |ps: &[String], list: &'static str| -> Result<Vec<glob::Pattern>, PatternError> {
                ps.iter()
                    .map(|p| {
                        glob::Pattern::new(p.trim_start_matches("./")).map_err(|e| PatternError {
                            list,
                            message: format!("{p:?} is not a pattern: {}", e.msg),
                        })
                    })
                    .collect()
            };
        Ok(Self {
            include: compile(include, "include")?,
            exclude: compile(exclude, "exclude")?,
        })
    }

    fn matches(p: &glob::Pattern, path: &str) -> bool {
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        if p.as_str().contains('/') {
            p.matches_with(path, options)
        } else {
            let name = path.rsplit('/').next().unwrap_or(path);
            p.matches_with(name, options)
        }
    }

    /// Why the file at `path` is passed over unless an include pattern
    /// names it: a licence file (`LICENSE`, `fonts/OPEN-SANS-LICENSE.txt`,
    /// `COPYING`) or a generated site's table of contents (`toc.html`),
    /// text no one asks about that would be cited as if it answered.
    pub fn passes_over(&self, path: &str) -> Option<String> {
        let path = crate::document_id(path);
        let name = path
            .rsplit('/')
            .next()
            .unwrap_or(&path)
            .to_ascii_lowercase();
        let stem = name.split('.').next().unwrap_or(&name);
        let licence = ["license", "licence", "copying", "copyright"]
            .iter()
            .any(|w| {
                stem == *w
                    || ["-", "_"].iter().any(|sep| {
                        stem.starts_with(&format!("{w}{sep}"))
                            || stem.ends_with(&format!("{sep}{w}"))
                    })
            });
        let why = if licence {
            "a licence file"
        } else if matches!(name.as_str(), "toc.html" | "toc.htm") {
            "a table of contents"
        } else {
            return None;
        };
        if self.include.iter().any(|p| Self::matches(p, &path)) {
            return None;
        }
        Some(format!("{why} (name it in an include pattern to read it)"))
    }

    /// Why the file at `path` (relative, `/`-separated) is not read, or
    /// `None` when it is.
    pub fn refuses(&self, path: &str) -> Option<String> {
        if let Some(why) = self.passes_over(path) {
            return Some(why);
        }
        let path = crate::document_id(path);
        if !self.include.is_empty() && !self.include.iter().any(|p| Self::matches(p, &path)) {
            return Some("matches no include pattern".to_owned());
        }
        self.exclude
            .iter()
            .find(|p| Self::matches(p, &path))
            .map(|p| format!("excluded by {:?}", p.as_str()))
    }

    /// Whether any pattern was given.
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}
