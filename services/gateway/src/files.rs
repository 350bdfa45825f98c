//! Documents from files: BEIR-style JSONL (optionally gzipped), plain text,
//! Markdown, HTML and PDF. Shared by `ragtime ingest` and the upload route.

use ragtime_pipeline::rag::IngestDoc;
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

/// The file extensions this reads.
pub const SUPPORTED: &str = ".txt, .md, .html, .htm, .pdf, .jsonl, .jsonl.gz";

/// Reads `bytes` named `name` into documents. Text formats become one
/// document whose id is the file name; JSONL has one document per line.
pub fn docs_from_file(name: &str, bytes: Vec<u8>) -> Result<Vec<IngestDoc>, FileError> {
    let lower = name.to_ascii_lowercase();
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name).to_owned();
    let one = |title: String, text: String| -> Result<Vec<IngestDoc>, FileError> {
        if text.trim().is_empty() {
            return Err(format!("{name}: no text found"));
        }
        Ok(vec![IngestDoc {
            id: base.clone(),
            title,
            text,
            metadata: Map::from_iter([("source".to_owned(), Value::String(base.clone()))]),
        }])
    };
    if lower.ends_with(".jsonl.gz") || lower.ends_with(".json.gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| format!("{name}: not a gzip file: {e}"))?;
        jsonl(name, &utf8(name, out)?)
    } else if lower.ends_with(".jsonl") {
        jsonl(name, &utf8(name, bytes)?)
    } else if lower.ends_with(".txt") {
        one(stem(name).to_owned(), utf8(name, bytes)?)
    } else if lower.ends_with(".md") || lower.ends_with(".markdown") {
        let text = utf8(name, bytes)?;
        let title = text
            .lines()
            .find_map(|l| l.strip_prefix("# ").map(|t| t.trim().to_owned()))
            .unwrap_or_else(|| stem(name).to_owned());
        one(title, text)
    } else if lower.ends_with(".html") || lower.ends_with(".htm") {
        let (title, text) = html_text(&utf8(name, bytes)?);
        one(title.unwrap_or_else(|| stem(name).to_owned()), text)
    } else if lower.ends_with(".pdf") {
        let text = pdf_extract::extract_text_from_mem(&bytes)
            .map_err(|e| format!("{name}: cannot read the PDF: {e}"))?;
        one(stem(name).to_owned(), text)
    } else {
        Err(format!(
            "{name}: unsupported file type (supported: {SUPPORTED})"
        ))
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

/// Visible text of an HTML page and its `<title>`: scripts, styles and
/// tags dropped, block elements on their own lines, entities decoded.
pub fn html_text(html: &str) -> (Option<String>, String) {
    let mut out = String::with_capacity(html.len() / 2);
    let mut title = None;
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    while i < html.len() {
        if html[i..].starts_with('<') {
            let Some(end) = html[i..].find('>').map(|e| i + e) else {
                break;
            };
            let tag = lower[i + 1..end]
                .trim_start_matches('/')
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap_or("");
            let closing = lower[i + 1..].starts_with('/');
            if !closing && matches!(tag, "script" | "style" | "title" | "noscript") {
                let close = format!("</{tag}");
                let stop = lower[end..].find(&close).map_or(html.len(), |p| end + p);
                if tag == "title" {
                    title = Some(decode_entities(html[end + 1..stop].trim()));
                }
                i = lower[stop..].find('>').map_or(html.len(), |p| stop + p + 1);
                continue;
            }
            if matches!(
                tag,
                "p" | "div"
                    | "br"
                    | "li"
                    | "tr"
                    | "h1"
                    | "h2"
                    | "h3"
                    | "h4"
                    | "h5"
                    | "h6"
                    | "section"
                    | "article"
                    | "table"
                    | "ul"
                    | "ol"
                    | "blockquote"
                    | "pre"
            ) {
                out.push('\n');
            }
            i = end + 1;
        } else {
            let next = html[i..].find('<').map_or(html.len(), |p| i + p);
            out.push_str(&decode_entities(&html[i..next]));
            i = next;
        }
    }
    let text = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    (title.filter(|t| !t.is_empty()), text)
}

fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find('&') {
        out.push_str(&rest[..p]);
        rest = &rest[p..];
        let Some(semi) = rest.find(';').filter(|&x| x <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let ent = &rest[1..semi];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some(' '),
            e if e.starts_with("#x") || e.starts_with("#X") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_keeps_visible_text_only() {
        let (title, text) = html_text(
            "<html><head><title>Cells &amp; Energy</title><style>p{color:red}</style></head>\
             <body><h1>ATP</h1><p>Mitochondria&nbsp;make <b>ATP</b>.</p><script>alert(1)</script><p>5 &lt; 6 &#x263A;</p></body></html>",
        );
        assert_eq!(title.as_deref(), Some("Cells & Energy"));
        assert_eq!(text, "ATP\nMitochondria make ATP.\n5 < 6 \u{263A}");
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
            ("cells.md", "Cell biology")
        );
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
