//! Documents from files: BEIR-style JSONL (optionally gzipped), plain text,
//! Markdown (parsed by `pulldown-cmark`), HTML (parsed by `html5ever`
//! through `scraper`) and PDF. Shared
//! by `ragtime ingest` and the upload route.

use ragtime_core::IngestDoc;
use scraper::{Html, Node};
use serde_json::{Map, Value};
use std::io::Read;

/// Why a file cannot be read as documents (lowercase, names the problem).
pub type FileError = String;

fn stem(name: &str) -> &str {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.split('.')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(base)
}

fn utf8(name: &str, bytes: Vec<u8>) -> Result<String, FileError> {
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{name}: not valid UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        )
    })
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

/// Reads `bytes` named `name` into documents. Text formats become one
/// document whose id is the file's path as given ([`document_id`]); JSONL
/// has one document per line.
pub fn docs_from_file(name: &str, bytes: Vec<u8>) -> Result<Vec<IngestDoc>, FileError> {
    let base = document_id(name);
    let one = |title: String, text: String| -> Result<Vec<IngestDoc>, FileError> {
        if text.trim().is_empty() {
            return Err(format!("{name}: no text found"));
        }
        if base.is_empty() {
            return Err(format!("{name}: a file name is needed"));
        }
        Ok(vec![IngestDoc {
            id: base.clone(),
            title,
            text,
            metadata: Map::from_iter([("source".to_owned(), Value::String(base.clone()))]),
        }])
    };
    let Some(f) = format(name) else {
        return Err(format!(
            "{name}: unsupported file type (supported: {})",
            supported()
        ));
    };
    match f {
        Format::JsonlGz => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(bytes.as_slice())
                .read_to_end(&mut out)
                .map_err(|e| format!("{name}: not a gzip file: {e}"))?;
            jsonl(name, &utf8(name, out)?)
        }
        Format::Jsonl => jsonl(name, &utf8(name, bytes)?),
        Format::Text => one(stem(name).to_owned(), utf8(name, bytes)?),
        Format::Markdown => {
            let (title, text) = markdown_text(&utf8(name, bytes)?);
            one(title.unwrap_or_else(|| stem(name).to_owned()), text)
        }
        Format::Html => {
            let (title, text) = html_text(&utf8(name, bytes)?);
            one(title.unwrap_or_else(|| stem(name).to_owned()), text)
        }
        Format::Pdf => {
            let text = pdf_extract::extract_text_from_mem(&bytes)
                .map_err(|e| format!("{name}: cannot read the PDF: {e}"))?;
            one(stem(name).to_owned(), text)
        }
    }
}

/// BEIR lines: `{"_id", "title", "text", "metadata"?}` (`id` works too).
fn jsonl(name: &str, text: &str) -> Result<Vec<IngestDoc>, FileError> {
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
        });
    }
    if docs.is_empty() {
        return Err(format!("{name}: no documents"));
    }
    Ok(docs)
}

/// Text of a Markdown document, parsed by `pulldown-cmark`, and its first
/// level-1 heading: each block (heading, paragraph, list item, table row,
/// code block) on its own line(s); a paragraph wrapped over several lines
/// of the file is one line (a sentence stays whole); code blocks keep
/// their lines; a table row is one line, cells separated by ` | `; link
/// targets, images and raw HTML dropped.
pub fn markdown_text(md: &str) -> (Option<String>, String) {
    use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};
    let mut out = String::with_capacity(md.len());
    let mut title: Option<String> = None;
    let mut in_h1 = false;
    let mut h1 = String::new();
    let newline = |out: &mut String| {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    };
    for ev in Parser::new_ext(md, Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH) {
        match ev {
            Event::Start(Tag::Heading { level, .. }) => {
                newline(&mut out);
                in_h1 = level == HeadingLevel::H1 && title.is_none();
            }
            Event::End(TagEnd::Heading(_)) => {
                if in_h1 {
                    title = Some(h1.trim().to_owned()).filter(|t| !t.is_empty());
                    in_h1 = false;
                }
                newline(&mut out);
            }
            Event::Start(Tag::CodeBlock(_)) => {
                newline(&mut out);
            }
            Event::End(TagEnd::CodeBlock) => {
                newline(&mut out);
            }
            Event::Start(Tag::Paragraph | Tag::Item | Tag::TableRow | Tag::TableHead)
            | Event::End(TagEnd::Paragraph | TagEnd::Item | TagEnd::TableRow | TagEnd::TableHead) => {
                newline(&mut out)
            }
            Event::End(TagEnd::TableCell) => out.push_str(" | "),
            Event::Text(t) | Event::Code(t) => {
                if in_h1 {
                    h1.push_str(&t);
                }
                out.push_str(&t);
            }
            Event::SoftBreak => out.push(' '),
            Event::HardBreak => out.push('\n'),
            _ => {}
        }
    }
    let text = out
        .lines()
        .map(|l| {
            l.trim_end()
                .trim_end_matches(" |")
                .trim_end_matches('|')
                .trim_end()
        })
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    (title, text)
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

/// Visible text of an HTML page and its `<title>`: the main content only
/// when the page marks it (`<main>`, `role="main"`, else `<article>`);
/// scripts, styles, navigation, footers, comments and tags dropped; block
/// elements on their own lines; whitespace inside a block collapsed as a
/// browser does (a sentence wrapped over two lines of the file stays one
/// line of text), except in `<pre>`, whose lines are kept; entities
/// decoded (by the HTML5 parser).
pub fn html_text(html: &str) -> (Option<String>, String) {
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
            text.trim().to_owned()
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
    let mut out = String::with_capacity(html.len() / 2);
    let mut stack = vec![(content, false)];
    // Depth-first, closing each block with a newline after its children.
    while let Some((node, closing)) = stack.pop() {
        match node.value() {
            Node::Element(e) if closing && BLOCKS.contains(&e.name()) => out.push('\n'),
            Node::Element(e) if closing && CELLS.contains(&e.name()) => out.push_str(" | "),
            Node::Element(_) if closing => {}
            Node::Element(e) if HIDDEN.contains(&e.name()) => {}
            Node::Element(e) => {
                if BLOCKS.contains(&e.name()) {
                    out.push('\n');
                }
                stack.push((node, true));
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            Node::Text(t)
                if node
                    .ancestors()
                    .any(|a| matches!(a.value(), Node::Element(e) if e.name() == "pre")) =>
            {
                out.push_str(t)
            }
            Node::Text(t) => {
                // HTML whitespace, line breaks included, is one space.
                let mut words = t.split_whitespace().peekable();
                if t.starts_with(char::is_whitespace) && words.peek().is_some() {
                    out.push(' ');
                }
                while let Some(w) = words.next() {
                    out.push_str(w);
                    if words.peek().is_some() || t.ends_with(char::is_whitespace) {
                        out.push(' ');
                    }
                }
            }
            Node::Document | Node::Fragment => {
                stack.extend(node.children().rev().map(|c| (c, false)));
            }
            _ => {}
        }
    }
    let text = out
        .lines()
        .map(|l| {
            let l = l.split_whitespace().collect::<Vec<_>>().join(" ");
            l.trim_end_matches(" |").trim_end_matches('|').to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    (title, text)
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
            docs_from_file("a.txt", vec![0xff, 0xfe, b'a']).is_err_and(|e| e.contains("UTF-8"))
        );
        assert!(docs_from_file("a.docx", b"x".to_vec()).is_err_and(|e| e.contains("unsupported")));
        assert!(
            docs_from_file("a.jsonl", b"{\"_id\":\"1\"}".to_vec())
                .is_err_and(|e| e.contains("line 1"))
        );
        assert!(docs_from_file("a.txt", b"   ".to_vec()).is_err_and(|e| e.contains("no text")));
        assert!(docs_from_file("a.pdf", b"not a pdf".to_vec()).is_err_and(|e| e.contains("PDF")));
    }
}
