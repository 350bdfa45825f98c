//! Documents from files: BEIR-style JSONL (optionally gzipped), plain text,
//! Markdown (parsed by `pulldown-cmark`), HTML (parsed by `html5ever`
//! through `scraper`) and PDF. Shared
//! by `ragtime ingest` and the upload route.

use ragtime_core::{IngestDoc, SECTION_SEP, Section};
use scraper::{Html, Node};
use serde_json::Value;
use std::io::Read;

mod folder;
mod source;
pub use folder::{Documents, FileFilter, PatternError, Skipped, into_documents};

/// Why a file cannot be read as documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// Lowercase, names the file and the problem.
    pub message: String,
    /// Over a size limit (the upload route answers 413).
    pub too_large: bool,
}

impl From<String> for FileError {
    fn from(message: String) -> Self {
        Self {
            message,
            too_large: false,
        }
    }
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FileError {}

/// The most a gzipped file may expand to: a small upload must not become
/// gigabytes in memory.
pub const MAX_DECOMPRESSED_BYTES: u64 = 256 * 1024 * 1024;

/// A problem message (what [`FileError`] carries).
type Msg = String;

fn stem(name: &str) -> &str {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.split('.')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(base)
}

fn utf8(name: &str, bytes: Vec<u8>) -> Result<String, Msg> {
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{name}: not valid UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// `s` with each run of whitespace, line breaks included, made one space
/// and none at either end.
fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    JsonlGz,
    Jsonl,
    Text,
    Markdown,
    Html,
    Pdf,
    Rust,
}

/// The file extensions this reads (lower case; longest first where one
/// ends another).
const FORMATS: &[(&str, Format)] = &[
    (".jsonl.gz", Format::JsonlGz),
    (".json.gz", Format::JsonlGz),
    (".jsonl", Format::Jsonl),
    (".txt", Format::Text),
    (".md", Format::Markdown),
    (".markdown", Format::Markdown),
    (".html", Format::Html),
    (".htm", Format::Html),
    (".pdf", Format::Pdf),
    (".rs", Format::Rust),
];

fn format(name: &str) -> Option<Format> {
    let lower = name.to_ascii_lowercase();
    FORMATS
        .iter()
        .find(|(ext, _)| lower.ends_with(ext))
        .map(|(_, f)| *f)
}

/// The extensions read, for messages.
pub fn supported() -> String {
    FORMATS
        .iter()
        .map(|(ext, _)| *ext)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A document id from the path a file was given by: its folders kept
/// (`guide/build-cache.html` and `reference/build-cache.html` are two
/// documents), `/` as the separator, and no leading `/`, `.` or `..`
/// segments (an id names a document, not a place on someone's disk).
pub fn document_id(path: &str) -> String {
    path.split(['/', '\\'])
        .filter(|seg| !seg.is_empty() && *seg != "." && *seg != "..")
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether this reads files named `name` (by extension).
pub fn is_supported(name: &str) -> bool {
    format(name).is_some()
}

/// A file read, before it becomes documents: JSONL's documents as they
/// are, or one document's blocks (HTML, Markdown, PDF), whose lines
/// repeated on most files of an upload can still be dropped
/// ([`into_documents`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedFile(Parsed);

#[derive(Debug, Clone, PartialEq)]
enum Parsed {
    Docs(Vec<IngestDoc>),
    /// A file that holds no document of its own (a page that only
    /// redirects to another), and why.
    Skipped {
        id: String,
        reason: String,
    },
    Blocks {
        id: String,
        title: String,
        blocks: Vec<Block>,
    },
}

/// A block of a structured document, each on its own line(s) of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// A heading and its level (1 to 6).
    Heading(u8, String),
    /// A paragraph, list item or table row: one line.
    Line(String),
    /// A code block: its lines as they are.
    Code(String),
    /// A term and what it means (a definition list's `<dt>`/`<dd>`, a
    /// Markdown definition, a command's option and its description): one
    /// line, so the flag or key is read, searched and quoted with what it
    /// does.
    Term(String, String),
}

impl Block {
    /// The text of a [`Block::Line`].
    pub fn line(&self) -> Option<&str> {
        match self {
            Block::Line(l) => Some(l),
            _ => None,
        }
    }
}

/// Reads `bytes` named `name` into documents. Text formats become one
/// document whose id is the file's path as given ([`document_id`]); JSONL
/// has one document per line.
pub fn docs_from_file(name: &str, bytes: Vec<u8>) -> Result<Vec<IngestDoc>, FileError> {
    Ok(into_documents(vec![parse_file(name, bytes)?]).docs)
}

/// Reads one file ([`docs_from_file`] without making the documents yet).
/// A gzipped file may expand to at most [`MAX_DECOMPRESSED_BYTES`].
pub fn parse_file(name: &str, bytes: Vec<u8>) -> Result<ParsedFile, FileError> {
    parse_file_within(name, bytes, MAX_DECOMPRESSED_BYTES, "")
}

/// [`parse_file`] with a gzipped file expanding to at most `max` bytes
/// (`setting`, when not empty, is named in the error: the limit an upload
/// had left).
pub fn parse_file_within(
    name: &str,
    bytes: Vec<u8>,
    max: u64,
    setting: &str,
) -> Result<ParsedFile, FileError> {
    let max = max.min(MAX_DECOMPRESSED_BYTES);
    let too_large = || {
        let over = if setting.is_empty() || max == MAX_DECOMPRESSED_BYTES {
            format!("{} MiB", MAX_DECOMPRESSED_BYTES >> 20)
        } else {
            format!("the {max} bytes left of {setting}")
        };
        FileError {
            message: format!("{name}: expands to more than {over}"),
            too_large: true,
        }
    };
    match format(name) {
        Some(Format::JsonlGz) => {}
        Some(Format::Pdf) if pdf_inflated(&bytes, max) > max => return Err(too_large()),
        _ => return read_file(name, bytes).map_err(FileError::from),
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{name}: not a gzip file: {e}"))?;
    if out.len() as u64 > max {
        return Err(too_large());
    }
    Ok(ParsedFile(Parsed::Docs(jsonl(name, &utf8(name, out)?)?)))
}

/// The bytes a PDF's compressed streams inflate to, counted until past
/// `max`: the data after each `stream` keyword is read as zlib
/// (FlateDecode, the filter PDFs compress with) into nothing, so a bomb
/// costs at most `max` bytes of inflating and no memory before it is
/// refused, and the PDF reader, which inflates every stream into memory,
/// only ever reads one within the bound. Data that is not zlib (an image's
/// own coding, a stream left plain) counts as what it inflated to before
/// it stopped: nothing, or the part of a damaged stream that did.
fn pdf_inflated(pdf: &[u8], max: u64) -> u64 {
    struct Counted(u64);
    impl std::io::Write for Counted {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut total = Counted(0);
    let mut at = 0;
    while let Some(i) = pdf[at..].windows(6).position(|w| w == b"stream") {
        let start = at + i;
        at = start + 6;
        if pdf[..start].ends_with(b"end") {
            continue;
        }
        let data = match &pdf[at..] {
            [b'\r', b'\n', rest @ ..] | [b'\n', rest @ ..] => rest,
            _ => continue,
        };
        let left = max - total.0;
        let mut inflate = flate2::read::ZlibDecoder::new(data).take(left + 1);
        let _ = std::io::copy(&mut inflate, &mut total);
        if total.0 > max {
            break;
        }
    }
    total.0
}

impl ParsedFile {
    /// The bytes of text it holds, read (a compressed file's expanded).
    pub fn text_bytes(&self) -> usize {
        match &self.0 {
            Parsed::Docs(docs) => docs.iter().map(|d| d.text.len() + d.title.len()).sum(),
            Parsed::Skipped { .. } => 0,
            Parsed::Blocks { title, blocks, .. } => {
                title.len()
                    + blocks
                        .iter()
                        .map(|b| match b {
                            Block::Heading(_, t) | Block::Line(t) | Block::Code(t) => t.len(),
                            Block::Term(a, b) => a.len() + b.len(),
                        })
                        .sum::<usize>()
            }
        }
    }
}

fn read_file(name: &str, bytes: Vec<u8>) -> Result<ParsedFile, Msg> {
    let base = document_id(name);
    let blocks = |title: Option<String>, blocks: Vec<Block>| -> Result<ParsedFile, Msg> {
        if blocks.is_empty() {
            return Err(format!("{name}: no text found"));
        }
        if base.is_empty() {
            return Err(format!("{name}: a file name is needed"));
        }
        Ok(ParsedFile(Parsed::Blocks {
            id: base.clone(),
            title: title.unwrap_or_else(|| stem(name).to_owned()),
            blocks,
        }))
    };
    let Some(f) = format(name) else {
        return Err(format!(
            "{name}: unsupported file type (supported: {})",
            supported()
        ));
    };
    match f {
        Format::JsonlGz => Err(format!("{name}: gzip is read by parse_file")),
        Format::Jsonl => Ok(ParsedFile(Parsed::Docs(jsonl(name, &utf8(name, bytes)?)?))),
        Format::Text => blocks(None, text_blocks(&utf8(name, bytes)?)),
        Format::Markdown => {
            let (title, b) = markdown_blocks(&utf8(name, bytes)?);
            blocks(title, b)
        }
        Format::Html => {
            let page = html_page(&utf8(name, bytes)?);
            if page.is_redirect() {
                let to = page.refresh.unwrap_or_default();
                return Ok(ParsedFile(Parsed::Skipped {
                    id: base,
                    reason: format!("only redirects to {to}"),
                }));
            }
            blocks(page.title, page.blocks)
        }
        Format::Rust => {
            let (title, b) = source::rust_blocks(&utf8(name, bytes)?);
            blocks(title, b)
        }
        Format::Pdf => {
            let text = pdf_extract::extract_text_from_mem(&bytes)
                .map_err(|e| format!("{name}: cannot read the PDF: {e}"))?;
            blocks(None, pdf_blocks(&text))
        }
    }
}

/// Plain text's blocks: each non-empty line, except a command's options
/// as `--help` prints them — `-v, --verbose   Use verbose output` (the
/// option, two spaces or more, what it does) or the option alone on its
/// line with its description indented below — which are one term each.
pub fn text_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let is_option = |l: &str| {
        let t = l.trim_start();
        let mut c = t.chars();
        c.next() == Some('-')
            && c.next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        i += 1;
        if l.trim().is_empty() {
            continue;
        }
        if !is_option(l) {
            out.push(Block::Line(l.to_owned()));
            continue;
        }
        let t = l.trim_start();
        if let Some(gap) = t.find("  ") {
            out.push(Block::Term(t[..gap].to_owned(), collapse(&t[gap..])));
            continue;
        }
        let mut description = String::new();
        while i < lines.len()
            && !lines[i].trim().is_empty()
            && indent(lines[i]) > indent(l)
            && !is_option(lines[i])
        {
            description.push(' ');
            description.push_str(lines[i].trim());
            i += 1;
        }
        match description.is_empty() {
            true => out.push(Block::Line(t.to_owned())),
            false => out.push(Block::Term(t.to_owned(), collapse(&description))),
        }
    }
    out
}

/// A document's text from its blocks, one line each (code blocks keep
/// their lines), and where each section begins: a heading opens one, its
/// path the headings above it and its own, leaving out those the title
/// already says.
pub fn assemble(title: &str, blocks: &[Block]) -> (String, Vec<Section>) {
    let lower_title = title.to_lowercase();
    let mut text = String::new();
    let mut sections = Vec::new();
    let mut open: Vec<(u8, &str)> = Vec::new();
    for b in blocks {
        match b {
            Block::Heading(level, h) => {
                while open.last().is_some_and(|(l, _)| l >= level) {
                    open.pop();
                }
                open.push((*level, h.as_str()));
                let path: Vec<&str> = open
                    .iter()
                    .map(|(_, h)| *h)
                    .filter(|h| !lower_title.contains(&h.to_lowercase()))
                    .collect();
                sections.push(Section {
                    start: text.len(),
                    path: path.join(SECTION_SEP),
                });
                text.push_str(h);
                text.push('\n');
            }
            Block::Line(l) => {
                text.push_str(l);
                text.push('\n');
            }
            Block::Term(t, d) => {
                text.push_str(&term_line(t, d));
                text.push('\n');
            }
            Block::Code(c) => {
                for l in c
                    .lines()
                    .map(str::trim_end)
                    .filter(|l| !l.trim().is_empty())
                {
                    text.push_str(l);
                    text.push('\n');
                }
            }
        }
    }
    text.truncate(text.trim_end().len());
    (text, sections)
}

/// Text extracted from a PDF, repaired: its lines are where the page
/// wrapped them, so lines are joined into paragraphs (a word hyphenated
/// over a line end joined again), a paragraph ending at a blank line, a
/// bullet or number that starts a list item, or a line that ends a
/// sentence well short of the page's usual line length.
pub fn pdf_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut widths: Vec<usize> = lines
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| l.chars().count())
        .collect();
    widths.sort_unstable();
    // The usual full line: the 75th percentile of non-empty lines.
    let full = widths.get(widths.len() * 3 / 4).copied().unwrap_or(0);
    let item = |l: &str| {
        let first = l.split_whitespace().next().unwrap_or_default();
        matches!(first, "•" | "-" | "–" | "*" | "◦" | "▪")
            || (first.len() <= 4
                && (first.ends_with('.') || first.ends_with(')'))
                && first[..first.len() - 1].chars().all(|c| c.is_ascii_digit())
                && first.len() > 1)
    };
    let mut blocks = Vec::new();
    let mut para = String::new();
    let flush = |para: &mut String, blocks: &mut Vec<Block>| {
        let p = collapse(para);
        if !p.is_empty() {
            blocks.push(Block::Line(p));
        }
        para.clear();
    };
    for l in lines {
        if l.is_empty() {
            flush(&mut para, &mut blocks);
            continue;
        }
        if item(l) {
            flush(&mut para, &mut blocks);
        }
        let hyphenated = para.ends_with('-')
            && para[..para.len() - 1].ends_with(|c: char| c.is_alphabetic())
            && l.starts_with(|c: char| c.is_alphabetic());
        if hyphenated && l.starts_with(|c: char| c.is_lowercase()) {
            // "power-" + "house": one word broken at the line's end.
            para.pop();
        } else if !para.is_empty() && !hyphenated {
            para.push(' ');
        }
        para.push_str(l);
        let short = l.chars().count() * 4 < full * 3;
        if short && l.ends_with(['.', '!', '?', ':']) {
            flush(&mut para, &mut blocks);
        }
    }
    flush(&mut para, &mut blocks);
    blocks
}

/// BEIR lines: `{"_id", "title", "text", "metadata"?}` (`id` works too).
fn jsonl(name: &str, text: &str) -> Result<Vec<IngestDoc>, Msg> {
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("{name}: line {}: {e}", i + 1))?;
        let id = v
            .get("_id")
            .or_else(|| v.get("id"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let body = v.get("text").and_then(Value::as_str).unwrap_or_default();
        if id.is_empty() || body.trim().is_empty() {
            return Err(format!(
                "{name}: line {}: needs a non-empty \"_id\" and \"text\"",
                i + 1
            ));
        }
        docs.push(IngestDoc {
            id: id.to_owned(),
            title: v
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            text: body.to_owned(),
            metadata: v
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            sections: Vec::new(),
        });
    }
    if docs.is_empty() {
        return Err(format!("{name}: no documents"));
    }
    Ok(docs)
}

/// Text of a Markdown document and its first level-1 heading
/// ([`markdown_blocks`], [`assemble`]d).
pub fn markdown_text(md: &str) -> (Option<String>, String) {
    let (title, blocks) = markdown_blocks(md);
    let (text, _) = assemble(title.as_deref().unwrap_or_default(), &blocks);
    (title, text)
}

/// Collects a block's text and ends it as a heading, a line (each line of
/// it, whitespace collapsed; table cells' trailing separators dropped) or
/// code (lines kept).
#[derive(Default)]
struct BlockText {
    cur: String,
    blocks: Vec<Block>,
    /// A term read, waiting for its description.
    term: Option<String>,
}

impl BlockText {
    /// The text read so far is a term; its description follows.
    fn start_description(&mut self) {
        self.flush_term();
        self.term = Some(collapse(&std::mem::take(&mut self.cur)));
    }

    /// A term with no description is a line of its own.
    fn flush_term(&mut self) {
        if let Some(t) = self.term.take().filter(|t| !t.is_empty()) {
            self.blocks.push(Block::Line(t));
        }
    }

    /// The description read so far, ended: with its term, or added to the
    /// term before it (a second description), or a line.
    fn end_description(&mut self) {
        let d = collapse(&std::mem::take(&mut self.cur));
        if d.is_empty() {
            return;
        }
        match self.term.take() {
            Some(t) => self.blocks.push(Block::Term(t, d)),
            None => match self.blocks.last_mut() {
                Some(Block::Term(_, desc)) => {
                    desc.push(' ');
                    desc.push_str(&d);
                }
                _ => self.blocks.push(Block::Line(d)),
            },
        }
    }

    fn end(&mut self, heading: Option<u8>, code: bool) {
        let cur = std::mem::take(&mut self.cur);
        if code {
            if !cur.trim().is_empty() {
                self.blocks.push(Block::Code(cur.trim_end().to_owned()));
            }
            return;
        }
        for l in cur.lines() {
            let l = collapse(l);
            let l = l.trim_end_matches(" |").trim_end_matches('|').trim_end();
            if l.is_empty() {
                continue;
            }
            self.blocks.push(match heading {
                Some(level) => Block::Heading(level, l.to_owned()),
                None => Block::Line(l.to_owned()),
            });
        }
    }
}

/// A Markdown document's blocks, parsed by `pulldown-cmark`, and its
/// first level-1 heading: headings, paragraphs (a paragraph wrapped over
/// several lines of the file is one line, so a sentence stays whole),
/// list items, table rows (cells separated by ` | `), definitions (a term
/// with its description, one [`Block::Term`]) and code blocks (lines
/// kept); link targets, images and raw HTML dropped.
pub fn markdown_blocks(md: &str) -> (Option<String>, Vec<Block>) {
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    let mut b = BlockText::default();
    let mut title: Option<String> = None;
    let mut heading: Option<u8> = None;
    let mut code = false;
    let mut definition = false;
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_DEFINITION_LIST;
    for ev in Parser::new_ext(md, options) {
        match ev {
            Event::Start(Tag::DefinitionListTitle) => b.end(None, false),
            Event::End(TagEnd::DefinitionListTitle) => b.start_description(),
            Event::Start(Tag::DefinitionListDefinition) => definition = true,
            Event::End(TagEnd::DefinitionListDefinition) => {
                b.end_description();
                definition = false;
            }
            Event::End(TagEnd::DefinitionList) => b.flush_term(),
            Event::Start(Tag::Paragraph) | Event::End(TagEnd::Paragraph) if definition => {
                b.cur.push(' ')
            }
            Event::Start(Tag::Heading { level, .. }) => {
                b.end(None, false);
                heading = Some(level as u8);
            }
            Event::End(TagEnd::Heading(level)) => {
                let text = collapse(&b.cur);
                if level as u8 == 1 && title.is_none() && !text.is_empty() {
                    title = Some(text);
                }
                b.end(heading.take(), false);
            }
            Event::Start(Tag::CodeBlock(_)) => {
                b.end(None, false);
                code = true;
            }
            Event::End(TagEnd::CodeBlock) => {
                b.end(None, true);
                code = false;
            }
            Event::Start(Tag::Paragraph | Tag::Item | Tag::TableRow | Tag::TableHead)
            | Event::End(TagEnd::Paragraph | TagEnd::Item | TagEnd::TableRow | TagEnd::TableHead) => {
                b.end(heading, code)
            }
            Event::End(TagEnd::TableCell) => b.cur.push_str(" | "),
            Event::Text(t) | Event::Code(t) => b.cur.push_str(&t),
            Event::SoftBreak => b.cur.push(' '),
            Event::HardBreak => b.cur.push('\n'),
            _ => {}
        }
    }
    b.end(heading, code);
    (title, b.blocks)
}

/// Elements whose text starts and ends a line.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "br",
    "li",
    "tr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "section",
    "article",
    "table",
    "ul",
    "ol",
    "blockquote",
    "pre",
    "main",
    "header",
    "footer",
    "nav",
    "aside",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "hr",
];

/// Table cells: a row stays one line, its cells separated by ` | `.
const CELLS: &[&str] = &["td", "th"];

/// Never text: code and metadata, and the page chrome around the content
/// (site navigation, footers).
const HIDDEN: &[&str] = &[
    "script", "style", "noscript", "template", "head", "title", "nav", "footer",
];

/// Visible text of an HTML page and its `<title>` ([`html_blocks`],
/// [`assemble`]d).
pub fn html_text(html: &str) -> (Option<String>, String) {
    let (title, blocks) = html_blocks(html);
    let (text, _) = assemble(title.as_deref().unwrap_or_default(), &blocks);
    (title, text)
}

/// The blocks of an HTML page and its `<title>` ([`html_page`]).
pub fn html_blocks(html: &str) -> (Option<String>, Vec<Block>) {
    let page = html_page(html);
    (page.title, page.blocks)
}

/// An HTML page read: its `<title>`, its blocks, and where it sends the
/// reader when it refreshes to another page (`<meta http-equiv=refresh>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtmlPage {
    pub title: Option<String>,
    pub blocks: Vec<Block>,
    pub refresh: Option<String>,
}

impl HtmlPage {
    /// A page that only sends the reader elsewhere: it refreshes to
    /// another and says little itself ("Redirecting to…").
    pub fn is_redirect(&self) -> bool {
        let said: usize = self.blocks.iter().map(|b| block_text(b).len()).sum();
        self.refresh.is_some() && said < 400
    }
}

fn block_text(b: &Block) -> &str {
    match b {
        Block::Heading(_, t) | Block::Line(t) | Block::Code(t) | Block::Term(t, _) => t,
    }
}

/// The one line a term and its description make.
fn term_line(term: &str, description: &str) -> String {
    if description.is_empty() {
        term.to_owned()
    } else {
        format!("{term} \u{2014} {description}")
    }
}

/// Where a `<meta http-equiv="refresh" content="0; URL=…">` sends the
/// reader.
fn refresh_target(doc: &Html) -> Option<String> {
    doc.tree.root().descendants().find_map(|n| match n.value() {
        Node::Element(e)
            if e.name() == "meta"
                && e.attr("http-equiv")
                    .is_some_and(|v| v.eq_ignore_ascii_case("refresh")) =>
        {
            let content = e.attr("content").unwrap_or_default();
            let lower = content.to_ascii_lowercase();
            let target = match lower.find("url=") {
                Some(i) => &content[i + 4..],
                None => content,
            };
            Some(target.trim().trim_matches(['\'', '"']).to_owned())
        }
        _ => None,
    })
}

/// Hidden from a reader: code and metadata, the page chrome around the
/// content (site navigation, footers), and the lines of an example that
/// mdBook hides (`<span class="boring">`: `fn main() {` around a snippet).
fn hidden(e: &scraper::node::Element) -> bool {
    HIDDEN.contains(&e.name())
        || e.has_class("boring", scraper::CaseSensitivity::AsciiCaseInsensitive)
}

/// An HTML page's blocks: the main content only when the page marks it
/// (`<main>`, `role="main"`, else `<article>`); scripts, styles,
/// navigation, footers, comments and tags dropped; each block element a
/// block of its own (`h1`–`h6` headings, `<pre>` code whose lines are
/// kept, a `<dt>` with its `<dd>` one term), whitespace inside it
/// collapsed as a browser does (a sentence wrapped over two lines of the
/// file stays one line of text); entities decoded (by the HTML5 parser).
pub fn html_page(html: &str) -> HtmlPage {
    let doc = Html::parse_document(html);
    let title = doc
        .tree
        .root()
        .descendants()
        .find(|n| matches!(n.value(), Node::Element(e) if e.name() == "title"))
        .map(|t| {
            let text: String = t
                .descendants()
                .filter_map(|n| n.value().as_text().map(|x| x.to_string()))
                .collect();
            collapse(&text)
        })
        .filter(|t| !t.is_empty());
    let element = |pick: &dyn Fn(&scraper::node::Element) -> bool| {
        doc.tree
            .root()
            .descendants()
            .find(|n| matches!(n.value(), Node::Element(e) if pick(e)))
    };
    let content = element(&|e| e.name() == "main")
        .or_else(|| element(&|e| e.attr("role") == Some("main")))
        .or_else(|| element(&|e| e.name() == "article"))
        .unwrap_or_else(|| doc.tree.root());
    let mut w = HtmlWalk::default();
    let mut stack = vec![(content, false)];
    // Depth-first, ending each block after its children.
    while let Some((node, closing)) = stack.pop() {
        match node.value() {
            Node::Element(e) if closing => w.close(e.name()),
            Node::Element(e) if hidden(e) => {}
            Node::Element(e) => {
                w.open(e.name());
                stack.push((node, true));
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            Node::Text(t) => w.text(t),
            Node::Document | Node::Fragment => {
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            _ => {}
        }
    }
    w.b.end(w.heading, w.pre > 0);
    w.b.flush_term();
    HtmlPage {
        title,
        blocks: w.b.blocks,
        refresh: refresh_target(&doc),
    }
}

fn heading_level(name: &str) -> Option<u8> {
    match name {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    }
}

/// The state of a walk over an HTML page's elements.
#[derive(Default)]
struct HtmlWalk {
    b: BlockText,
    heading: Option<u8>,
    pre: usize,
    /// Inside a `<dd>`: its blocks are one description.
    dd: usize,
}

impl HtmlWalk {
    fn open(&mut self, name: &str) {
        if !BLOCKS.contains(&name) {
            return;
        }
        match name {
            "dt" => {
                self.b.end(self.heading, self.pre > 0);
                self.b.flush_term();
            }
            "dd" => {
                self.b.end(self.heading, false);
                self.dd += 1;
            }
            "pre" if self.dd > 0 => {
                // Code inside a description: what came before is the
                // description; the code keeps its lines.
                self.b.end_description();
                self.pre += 1;
            }
            _ if self.dd > 0 && self.pre == 0 => self.b.cur.push(' '),
            _ => {
                self.b.end(self.heading, self.pre > 0);
                if let Some(l) = heading_level(name) {
                    self.heading = Some(l);
                }
                if name == "pre" {
                    self.pre += 1;
                }
            }
        }
    }

    fn close(&mut self, name: &str) {
        if CELLS.contains(&name) {
            self.b.cur.push_str(" | ");
            return;
        }
        if !BLOCKS.contains(&name) {
            return;
        }
        match name {
            "dt" => self.b.start_description(),
            "dd" => {
                self.b.end_description();
                self.dd = self.dd.saturating_sub(1);
            }
            "dl" => {
                self.b.end(self.heading, false);
                self.b.flush_term();
            }
            "pre" if self.dd > 0 => {
                self.b.end(None, true);
                self.pre -= 1;
            }
            _ if self.dd > 0 && self.pre == 0 => self.b.cur.push(' '),
            _ => {
                self.b.end(self.heading, self.pre > 0);
                if heading_level(name).is_some() {
                    self.heading = None;
                }
                if name == "pre" {
                    self.pre -= 1;
                }
            }
        }
    }

    fn text(&mut self, t: &str) {
        if self.pre > 0 {
            self.b.cur.push_str(t);
            return;
        }
        // Whitespace alone between two inline elements is a space
        // (`<code>-p</code> <em>spec</em>`).
        if t.trim().is_empty() {
            if !t.is_empty() && !self.b.cur.is_empty() && !self.b.cur.ends_with(' ') {
                self.b.cur.push(' ');
            }
            return;
        }
        // HTML whitespace, line breaks included, is one space.
        let mut words = t.split_whitespace().peekable();
        if t.starts_with(char::is_whitespace) && words.peek().is_some() {
            self.b.cur.push(' ');
        }
        while let Some(w) = words.next() {
            self.b.cur.push_str(w);
            if words.peek().is_some() || t.ends_with(char::is_whitespace) {
                self.b.cur.push(' ');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_keeps_wrapped_sentences_whole_and_drops_the_chrome() {
        let (_, text) = html_text(
            "<html><body><nav><a href=/>Home</a> | Press \u{2190} or \u{2192} to navigate</nav>\n             <main><h1>cargo new</h1>\n<p>This also initializes a new git\n   repository by default. If you don't want it to do that, pass\n<code>--vcs none</code>.</p>\n             <pre><code>cargo new hello\ncd hello</code></pre></main>\n             <footer>Copyright the authors</footer></body></html>",
        );
        assert_eq!(
            text,
            "cargo new\nThis also initializes a new git repository by default. If you don't want it to do that, pass --vcs none.\ncargo new hello\ncd hello"
        );
    }

    #[test]
    fn html_keeps_visible_text_only() {
        let (title, text) = html_text(
            "<html><head><title>Cells &amp; Energy</title><style>p{color:red}</style></head>\
             <body><h1>ATP</h1><p>Mitochondria&nbsp;make <b>ATP</b>.</p><script>alert(1)</script><p>5 &lt; 6 &#x263A;</p></body></html>",
        );
        assert_eq!(title.as_deref(), Some("Cells & Energy"));
        assert_eq!(text, "ATP\nMitochondria make ATP.\n5 < 6 \u{263A}");
        let (_, table) = html_text(
            "<main><p>Sizes:</p><table><tr><th>Type</th><th>Size</th></tr>\n<tr><td><code>bool</code></td>\n<td>1</td></tr></table></main>",
        );
        assert_eq!(
            table, "Sizes:\nType | Size\nbool | 1",
            "a table row stays one line"
        );
    }

    #[test]
    fn markdown_keeps_wrapped_sentences_code_blocks_and_table_rows_whole() {
        let (title, text) = markdown_text(
            "# cargo new\n\nThis also initializes a new git\nrepository by default. Pass\n`--vcs none` to skip it.\n\n```sh\ncargo new hello\n  cd hello\n```\n\n- one item\n  wrapped\n- [two](https://example.com)\n\n| Type | Size |\n|---|---|\n| `bool` | 1 |\n",
        );
        assert_eq!(title.as_deref(), Some("cargo new"));
        assert_eq!(
            text,
            "cargo new\nThis also initializes a new git repository by default. Pass --vcs none to skip it.\ncargo new hello\n  cd hello\none item wrapped\ntwo\nType | Size\nbool | 1"
        );
    }

    #[test]
    fn headings_open_sections_with_their_paths() {
        let (title, blocks) = html_blocks(
            "<title>Type layout - The Reference</title><main><h1>Type layout</h1><p>Intro.</p>\
             <h2>Size and alignment</h2><p>All values have a size.</p>\
             <h3>Primitive data layout</h3><pre><code>fn main() {\n    let x = 1;\n}</code></pre>\
             <h2>Reprs</h2><p>Each repr.</p></main>",
        );
        let title = title.unwrap_or_default();
        let (text, sections) = assemble(&title, &blocks);
        let paths: Vec<&str> = sections.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "",
                "Size and alignment",
                "Size and alignment \u{203a} Primitive data layout",
                "Reprs"
            ],
            "the title's own heading is left out; a level-2 heading closes a level 3"
        );
        for s in &sections {
            assert!(text[..s.start].is_empty() || text[..s.start].ends_with('\n'));
        }
        assert_eq!(&text[sections[2].start..][..21], "Primitive data layout");
        assert!(
            text.contains("fn main() {\n    let x = 1;\n}"),
            "a code block keeps its lines and indentation: {text}"
        );
        let doc = IngestDoc {
            id: "t".into(),
            title,
            text: text.clone(),
            metadata: serde_json::Map::new(),
            sections,
        };
        assert_eq!(
            doc.section_at(text.find("All values").unwrap_or(0)),
            "Size and alignment"
        );
        assert_eq!(doc.section_at(0), "");
        let (_, md) = markdown_blocks("# A\n\n## B\n\nText.\n\n### C\n\n```\ncode\n```\n");
        assert_eq!(
            md,
            [
                Block::Heading(1, "A".into()),
                Block::Heading(2, "B".into()),
                Block::Line("Text.".into()),
                Block::Heading(3, "C".into()),
                Block::Code("code".into()),
            ]
        );
    }

    #[test]
    fn lines_repeated_on_most_pages_of_an_upload_are_dropped() {
        let page = |body: &str| {
            format!(
                "<main><p>Keyboard shortcuts | Press \u{2190} or \u{2192} to navigate</p>\
                 <h2>Examples</h2><p>{body}</p><pre>}}</pre></main>"
            )
        };
        let files: Vec<ParsedFile> = (0..5)
            .map(|i| {
                parse_file(
                    &format!("p{i}.html"),
                    page(&format!("Page {i} says {i}.")).into_bytes(),
                )
                .expect("parses")
            })
            .collect();
        let docs = into_documents(files.clone()).docs;
        assert_eq!(docs.len(), 5);
        for (i, d) in docs.iter().enumerate() {
            assert!(!d.text.contains("Keyboard"), "chrome dropped: {}", d.text);
            assert!(d.text.contains(&format!("Page {i} says")), "content kept");
            assert!(d.text.starts_with("Examples"), "headings kept: {}", d.text);
            assert!(d.text.ends_with('}'), "code kept: {}", d.text);
            assert_eq!(d.section_at(d.text.len() - 1), "Examples");
        }
        // Three files are too few to tell chrome from content.
        let few = into_documents(files[..3].to_vec()).docs;
        assert!(few.iter().all(|d| d.text.contains("Keyboard")));
    }

    /// A PDF whose one content stream (FlateDecode) inflates to `n` spaces.
    fn flate_pdf(n: usize) -> Vec<u8> {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&vec![b' '; n]).expect("zlib");
        let data = z.finish().expect("zlib");
        let mut pdf = format!(
            "%PDF-1.4\n4 0 obj\n<< /Length {} /Filter /FlateDecode >>\nstream\n",
            data.len()
        )
        .into_bytes();
        pdf.extend_from_slice(&data);
        pdf.extend_from_slice(b"\nendstream\nendobj\n%%EOF\n");
        pdf
    }

    #[test]
    fn a_pdf_whose_streams_inflate_past_the_bound_is_refused_before_it_is_read() {
        let bomb = flate_pdf(3 << 20);
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
        assert_eq!(
            pdf_inflated(&bomb, 1 << 20),
            (1 << 20) + 1,
            "stops past the bound"
        );
        assert_eq!(pdf_inflated(&bomb, 4 << 20), 3 << 20);
        let e = parse_file_within(
            "bomb.pdf",
            bomb,
            1 << 20,
            "limits.max_upload_expanded_bytes",
        )
        .err()
        .expect("refused");
        assert!(e.too_large, "{}", e.message);
        assert!(
            e.message.contains("bomb.pdf")
                && e.message.contains("limits.max_upload_expanded_bytes"),
            "{}",
            e.message
        );
        // Within the bound it goes on to the PDF reader (this one has no
        // page tree: an error of another kind).
        let e = parse_file_within("small.pdf", flate_pdf(1000), 1 << 20, "x")
            .err()
            .expect("not a whole PDF");
        assert!(!e.too_large, "{}", e.message);
    }

    #[test]
    fn pdf_lines_are_joined_into_paragraphs() {
        let text = "Mitochondria are the power-\nhouse of the cell and make\nmost of its ATP in a process\ncalled respiration.\n\n\
                    A second paragraph begins here and it\nruns over two lines.\n\
                    Short title line.\n\
                    • first bullet item of a list\n\
                    • second bullet item of it\n\n\
                    Self-\nContained words keep their hyphen when the next line\nis capitalised.";
        let blocks = pdf_blocks(text);
        let lines: Vec<&str> = blocks.iter().filter_map(Block::line).collect();
        assert_eq!(
            lines,
            [
                "Mitochondria are the powerhouse of the cell and make most of its ATP in a process called respiration.",
                "A second paragraph begins here and it runs over two lines.",
                "Short title line.",
                "• first bullet item of a list",
                "• second bullet item of it",
                "Self-Contained words keep their hyphen when the next line is capitalised."
            ]
        );
    }

    #[test]
    fn comments_and_odd_markup_do_not_leak() {
        let (_, text) = html_text(
            "<body><!-- a > b, <p>not shown</p> --><p>Shown &gt; kept</p><p>a <span>b</span>c</p></body>",
        );
        assert_eq!(text, "Shown > kept\na bc");
    }

    #[test]
    fn formats_by_extension() {
        let d = docs_from_file(
            "notes/cells.md",
            b"# Cell biology\n\nMitochondria make ATP.".to_vec(),
        )
        .unwrap_or_default();
        assert_eq!(
            (d[0].id.as_str(), d[0].title.as_str()),
            ("notes/cells.md", "Cell biology"),
            "the id keeps the folders given"
        );
        for (given, id) in [
            ("./guide/a.html", "guide/a.html"),
            ("/srv/../docs//b.md", "srv/docs/b.md"),
            ("win\\dir\\c.txt", "win/dir/c.txt"),
        ] {
            assert_eq!(document_id(given), id, "{given}");
        }
        let d = docs_from_file(
            "a.jsonl",
            br#"{"_id":"1","title":"T","text":"x","metadata":{"y":1}}
{"id":"2","text":"y"}"#
                .to_vec(),
        )
        .unwrap_or_default();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].metadata.get("y"), Some(&Value::from(1)));
        assert!(
            docs_from_file("a.txt", vec![0xff, 0xfe, b'a'])
                .is_err_and(|e| e.message.contains("UTF-8"))
        );
        assert!(
            docs_from_file("a.docx", b"x".to_vec())
                .is_err_and(|e| e.message.contains("unsupported"))
        );
        assert!(
            docs_from_file("a.jsonl", b"{\"_id\":\"1\"}".to_vec())
                .is_err_and(|e| e.message.contains("line 1"))
        );
        assert!(
            docs_from_file("a.txt", b"   ".to_vec()).is_err_and(|e| e.message.contains("no text"))
        );
        assert!(
            docs_from_file("a.pdf", b"not a pdf".to_vec())
                .is_err_and(|e| e.message.contains("PDF"))
        );
    }

    #[test]
    fn a_definition_list_term_is_one_line_with_its_description() {
        let (_, text) = html_text(
            "<main><h2>Options</h2><dl>\
             <dt><code>-p</code> <em>spec</em>, <code>--package</code> <em>spec</em></dt>\
             <dd><p>Build only the specified packages.</p><p>See the spec page.</p></dd>\
             <dt><code>--offline</code></dt><dd>Run without\n accessing the network.</dd>\
             <dt>--lonely</dt></dl><p>After.</p></main>",
        );
        assert_eq!(
            text,
            "Options\n-p spec, --package spec \u{2014} Build only the specified packages. See the spec page.\n\
             --offline \u{2014} Run without accessing the network.\n--lonely\nAfter."
        );
        let (_, md) = markdown_text(
            "# Config\n\n`build.jobs`\n: Sets the number of parallel jobs.\n\n`build.target`\n: The target triple.\n",
        );
        assert_eq!(
            md,
            "Config\nbuild.jobs \u{2014} Sets the number of parallel jobs.\nbuild.target \u{2014} The target triple."
        );
    }

    #[test]
    fn mdbook_hidden_example_lines_are_dropped_and_code_keeps_its_lines() {
        let (_, text) = html_text(
            "<main><p>Give it an alias:</p><pre><code class=\"language-rust\">\
             <span class=\"boring\">#![allow(unused)]\n</span><span class=\"boring\">fn main() {\n\
             </span>#[doc(alias = \"x\")]\npub struct Y;\n<span class=\"boring\">}</span></code></pre></main>",
        );
        assert_eq!(
            text,
            "Give it an alias:\n#[doc(alias = \"x\")]\npub struct Y;"
        );
    }

    #[test]
    fn a_page_that_only_redirects_gives_no_document() {
        let stub = "<html><head><title>Redirecting...</title>\
            <meta http-equiv=\"refresh\" content=\"0; URL=write-documentation/a.html\"></head>\
            <body><p>Redirecting to... <a href=\"write-documentation/a.html\">write-documentation/a.html</a>.</p></body></html>";
        let page = "<main><h1>A</h1><p>Real content about attributes.</p></main>";
        let read = into_documents(vec![
            parse_file("a.html", stub.as_bytes().to_vec()).expect("parses"),
            parse_file("write-documentation/a.html", page.as_bytes().to_vec()).expect("parses"),
        ]);
        assert_eq!(read.docs.len(), 1);
        assert_eq!(read.docs[0].id, "write-documentation/a.html");
        assert_eq!(read.from, [1]);
        assert_eq!(
            read.skipped,
            [Skipped {
                file: 0,
                id: "a.html".into(),
                reason: "only redirects to write-documentation/a.html".into()
            }]
        );
        // A page with its own content that also refreshes is kept.
        let long = format!(
            "<head><meta http-equiv=refresh content=30></head><main><p>{}</p></main>",
            "News of the day, long enough to be read. ".repeat(20)
        );
        assert_eq!(
            docs_from_file("news.html", long.into_bytes()).map(|d| d.len()),
            Ok(1)
        );
    }

    #[test]
    fn a_page_that_repeats_the_others_is_skipped() {
        let chapter = |i: usize| -> Vec<String> {
            (0..6)
                .map(|j| format!("Chapter {i} explains its own point number {j} at length."))
                .collect()
        };
        let html = |lines: &[String]| {
            let ps: String = lines.iter().map(|l| format!("<p>{l}</p>")).collect();
            format!("<main>{ps}</main>")
        };
        let mut files: Vec<ParsedFile> = (0..4)
            .map(|i| {
                parse_file(&format!("ch{i}.html"), html(&chapter(i)).into_bytes()).expect("parses")
            })
            .collect();
        let all: Vec<String> = (0..4).flat_map(chapter).collect();
        files.push(parse_file("print.html", html(&all).into_bytes()).expect("parses"));
        // Two copies of one page: neither repeats the other's whole set,
        // but the second has the first's text, so it is read once.
        files.push(parse_file("copy/ch0.html", html(&chapter(0)).into_bytes()).expect("parses"));
        let read = into_documents(files);
        let ids: Vec<&str> = read.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["ch0.html", "ch1.html", "ch2.html", "ch3.html"]);
        assert_eq!(read.skipped.len(), 2, "{:?}", read.skipped);
        assert_eq!(read.skipped[1].id, "copy/ch0.html");
        assert_eq!(read.skipped[1].reason, "the same text as ch0.html");
        assert_eq!(read.skipped[0].id, "print.html");
        assert!(
            read.skipped[0].reason.starts_with(
                "repeats 5 other pages read with it (ch0.html, ch1.html, ch2.html, and 2 more)"
            ),
            "{}",
            read.skipped[0].reason
        );
    }

    #[test]
    fn rust_sources_read_their_docs_as_prose_and_keep_code_lines() {
        let src = "//! # Retry\n//!\n//! Retries a call\n//! up to three times.\n\nuse std::time::Duration;\n\n/// The pause between tries.\n///\n/// ```\n/// let d = PAUSE;\n/// ```\npub const PAUSE: Duration = Duration::from_millis(50);\n";
        let d = docs_from_file("src/retry.rs", src.as_bytes().to_vec()).expect("reads");
        assert_eq!(d[0].title, "Retry");
        assert_eq!(
            d[0].text,
            "Retry\nRetries a call up to three times.\nuse std::time::Duration;\nThe pause between tries.\nlet d = PAUSE;\npub const PAUSE: Duration = Duration::from_millis(50);"
        );
        assert!(is_supported("lib.rs"));
    }

    #[test]
    fn include_and_exclude_patterns_read_like_gitignore() {
        let f = FileFilter::new(
            &["*.html".into(), "notes/**".into()],
            &["print.html".into(), "**/drafts/*".into()],
        )
        .expect("patterns");
        assert_eq!(f.refuses("guide/intro.html"), None);
        assert_eq!(f.refuses("notes/a/b.md"), None, "a path pattern");
        assert_eq!(
            f.refuses("guide/intro.md").as_deref(),
            Some("matches no include pattern")
        );
        assert_eq!(
            f.refuses("book/print.html").as_deref(),
            Some("excluded by \"print.html\"")
        );
        assert_eq!(
            f.refuses("./x/drafts/y.html").as_deref(),
            Some("excluded by \"**/drafts/*\"")
        );
        let err = FileFilter::new(&[], &["[".into()]).expect_err("a bad pattern");
        assert!(err.message.starts_with("\"[\" is not a pattern"), "{err}");
        assert_eq!(err.list, "exclude");
        assert!(
            FileFilter::new(&[], &[]).is_ok_and(|f| f.is_empty() && f.refuses("a/b.c").is_none())
        );
    }

    #[test]
    fn licence_files_and_tables_of_contents_are_passed_over_unless_included() {
        let f = FileFilter::new(&[], &[]).expect("no patterns");
        for path in [
            "fonts/OPEN-SANS-LICENSE.txt",
            "LICENSE",
            "LICENCE.md",
            "COPYING.txt",
            "theme/source-code-pro_license.txt",
            "toc.html",
        ] {
            assert!(f.passes_over(path).is_some(), "{path}");
            assert!(f.refuses(path).is_some(), "{path}");
        }
        for path in [
            "licensing.html",
            "guide/licenses-explained.md",
            "races.html",
        ] {
            assert_eq!(f.refuses(path), None, "{path}");
        }
        let f = FileFilter::new(&["toc.html".into(), "*.txt".into()], &[]).expect("patterns");
        assert_eq!(f.refuses("toc.html"), None, "named: read");
        assert_eq!(f.refuses("fonts/OPEN-SANS-LICENSE.txt"), None);
    }

    #[test]
    fn a_page_with_another_page_s_text_is_read_once() {
        let page = |title: &str| {
            format!(
                "<html><head><title>{title}</title></head><body><h1>Intro</h1><p>The book begins here, with what it covers.</p></body></html>"
            )
        };
        let files = ["index.html", "intro.html", "other.html"]
            .iter()
            .map(|n| {
                let body = if *n == "other.html" {
                    "<html><body><h1>Other</h1><p>Something else entirely.</p></body></html>"
                        .to_owned()
                } else {
                    page("Intro")
                };
                parse_file(n, body.into_bytes()).expect("parses")
            })
            .collect();
        let read = into_documents(files);
        let ids: Vec<&str> = read.docs.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["index.html", "other.html"]);
        assert_eq!(read.skipped.len(), 1);
        assert_eq!(read.skipped[0].id, "intro.html");
        assert_eq!(read.skipped[0].reason, "the same text as index.html");
    }

    #[test]
    fn a_command_s_options_are_terms_with_what_they_do() {
        let help = "Usage: tool [OPTIONS]\n\nOptions:\n  -v, --verbose    Use verbose output\n  --jobs <N>\n      Number of parallel jobs,\n      defaults to the CPUs\n  -q\n  --offline  Run without the network\n";
        let d = docs_from_file("help.txt", help.as_bytes().to_vec()).expect("reads");
        assert_eq!(
            d[0].text,
            "Usage: tool [OPTIONS]\nOptions:\n-v, --verbose \u{2014} Use verbose output\n--jobs <N> \u{2014} Number of parallel jobs, defaults to the CPUs\n-q\n--offline \u{2014} Run without the network"
        );
    }
}
