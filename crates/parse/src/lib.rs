//! Documents from files: BEIR-style JSONL (optionally gzipped), plain text,
//! Markdown (parsed by `pulldown-cmark`), HTML (parsed by `html5ever`
//! through `scraper`) and PDF. Shared
//! by `ragtime ingest` and the upload route.

use ragtime_core::{IngestDoc, SECTION_SEP, Section};
use scraper::{Html, Node};
use serde_json::{Map, Value};
use std::io::Read;

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
];

fn format(name: &str) -> Option<Format> {
    let lower = name.to_ascii_lowercase();
    FORMATS
        .iter()
        .find(|(ext, _)| lower.ends_with(ext))
        .map(|(_, f)| *f)
}

/// The extensions, for messages.
fn supported() -> String {
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
}

/// Reads `bytes` named `name` into documents. Text formats become one
/// document whose id is the file's path as given ([`document_id`]); JSONL
/// has one document per line.
pub fn docs_from_file(name: &str, bytes: Vec<u8>) -> Result<Vec<IngestDoc>, FileError> {
    Ok(into_documents(vec![parse_file(name, bytes)?]))
}

/// Reads one file ([`docs_from_file`] without making the documents yet).
/// A gzipped file may expand to at most [`MAX_DECOMPRESSED_BYTES`].
pub fn parse_file(name: &str, bytes: Vec<u8>) -> Result<ParsedFile, FileError> {
    if format(name) != Some(Format::JsonlGz) {
        return read_file(name, bytes).map_err(FileError::from);
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(MAX_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("{name}: not a gzip file: {e}"))?;
    if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(FileError {
            message: format!(
                "{name}: expands to more than {} MiB",
                MAX_DECOMPRESSED_BYTES >> 20
            ),
            too_large: true,
        });
    }
    Ok(ParsedFile(Parsed::Docs(jsonl(name, &utf8(name, out)?)?)))
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
        Format::Text => {
            let text = utf8(name, bytes)?;
            let lines = text
                .lines()
                .map(str::trim_end)
                .filter(|l| !l.trim().is_empty());
            blocks(None, lines.map(|l| Block::Line(l.to_owned())).collect())
        }
        Format::Markdown => {
            let (title, b) = markdown_blocks(&utf8(name, bytes)?);
            blocks(title, b)
        }
        Format::Html => {
            let (title, b) = html_blocks(&utf8(name, bytes)?);
            blocks(title, b)
        }
        Format::Pdf => {
            let text = pdf_extract::extract_text_from_mem(&bytes)
                .map_err(|e| format!("{name}: cannot read the PDF: {e}"))?;
            blocks(None, pdf_blocks(&text))
        }
    }
}

/// How many documents a file read gives.
pub fn documents_in(file: &ParsedFile) -> usize {
    match &file.0 {
        Parsed::Docs(d) => d.len(),
        Parsed::Blocks { .. } => 1,
    }
}

/// The documents of files read together (one upload, one `ragtime ingest`):
/// where at least four are structured, a line (not a heading, not code)
/// found on more than half of them, and on three at least, is page chrome
/// (a site's banner, a "press ← or → to navigate" hint) and is dropped
/// from each; a document it would leave empty keeps it.
pub fn into_documents(files: Vec<ParsedFile>) -> Vec<IngestDoc> {
    let structured = files
        .iter()
        .filter(|f| matches!(f.0, Parsed::Blocks { .. }))
        .count();
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    if structured >= 4 {
        for f in &files {
            if let Parsed::Blocks { blocks, .. } = &f.0 {
                let lines: std::collections::HashSet<&str> = blocks
                    .iter()
                    .filter_map(|b| match b {
                        Block::Line(l) => Some(l.as_str()),
                        _ => None,
                    })
                    .collect();
                for l in lines {
                    *seen.entry(l).or_default() += 1;
                }
            }
        }
    }
    let chrome: std::collections::HashSet<String> = seen
        .into_iter()
        .filter(|&(_, n)| n >= 3 && n * 2 > structured)
        .map(|(l, _)| l.to_owned())
        .collect();
    let mut out = Vec::new();
    for f in files {
        match f.0 {
            Parsed::Docs(docs) => out.extend(docs),
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
                out.push(IngestDoc {
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
}

impl BlockText {
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
/// list items, table rows (cells separated by ` | `) and code blocks
/// (lines kept); link targets, images and raw HTML dropped.
pub fn markdown_blocks(md: &str) -> (Option<String>, Vec<Block>) {
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    let mut b = BlockText::default();
    let mut title: Option<String> = None;
    let mut heading: Option<u8> = None;
    let mut code = false;
    for ev in Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match ev {
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

/// Elements whose text is not shown.
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

/// The blocks of an HTML page and its `<title>`: the main content only
/// when the page marks it (`<main>`, `role="main"`, else `<article>`);
/// scripts, styles, navigation, footers, comments and tags dropped; each
/// block element a block of its own (`h1`–`h6` headings, `<pre>` code
/// whose lines are kept), whitespace inside it collapsed as a browser
/// does (a sentence wrapped over two lines of the file stays one line of
/// text); entities decoded (by the HTML5 parser).
pub fn html_blocks(html: &str) -> (Option<String>, Vec<Block>) {
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
    let level = |name: &str| match name {
        "h1" => Some(1),
        "h2" => Some(2),
        "h3" => Some(3),
        "h4" => Some(4),
        "h5" => Some(5),
        "h6" => Some(6),
        _ => None,
    };
    let mut b = BlockText::default();
    let mut heading: Option<u8> = None;
    let mut pre = 0usize;
    let mut stack = vec![(content, false)];
    // Depth-first, ending each block after its children.
    while let Some((node, closing)) = stack.pop() {
        match node.value() {
            Node::Element(e) if closing && BLOCKS.contains(&e.name()) => {
                b.end(heading, pre > 0);
                if level(e.name()).is_some() {
                    heading = None;
                }
                if e.name() == "pre" {
                    pre -= 1;
                }
            }
            Node::Element(e) if closing && CELLS.contains(&e.name()) => b.cur.push_str(" | "),
            Node::Element(_) if closing => {}
            Node::Element(e) if HIDDEN.contains(&e.name()) => {}
            Node::Element(e) => {
                if BLOCKS.contains(&e.name()) {
                    b.end(heading, pre > 0);
                    if let Some(l) = level(e.name()) {
                        heading = Some(l);
                    }
                    if e.name() == "pre" {
                        pre += 1;
                    }
                }
                stack.push((node, true));
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            Node::Text(t) if pre > 0 => b.cur.push_str(t),
            Node::Text(t) => {
                // HTML whitespace, line breaks included, is one space.
                let mut words = t.split_whitespace().peekable();
                if t.starts_with(char::is_whitespace) && words.peek().is_some() {
                    b.cur.push(' ');
                }
                while let Some(w) = words.next() {
                    b.cur.push_str(w);
                    if words.peek().is_some() || t.ends_with(char::is_whitespace) {
                        b.cur.push(' ');
                    }
                }
            }
            Node::Document | Node::Fragment => {
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            _ => {}
        }
    }
    b.end(heading, pre > 0);
    (title, b.blocks)
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
            metadata: Map::new(),
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
        let docs = into_documents(files.clone());
        assert_eq!(docs.len(), 5);
        for (i, d) in docs.iter().enumerate() {
            assert!(!d.text.contains("Keyboard"), "chrome dropped: {}", d.text);
            assert!(d.text.contains(&format!("Page {i} says")), "content kept");
            assert!(d.text.starts_with("Examples"), "headings kept: {}", d.text);
            assert!(d.text.ends_with('}'), "code kept: {}", d.text);
            assert_eq!(d.section_at(d.text.len() - 1), "Examples");
        }
        // Three files are too few to tell chrome from content.
        let few = into_documents(files[..3].to_vec());
        assert!(few.iter().all(|d| d.text.contains("Keyboard")));
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
        let lines: Vec<&str> = blocks
            .iter()
            .filter_map(|b| match b {
                Block::Line(l) => Some(l.as_str()),
                _ => None,
            })
            .collect();
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
}
