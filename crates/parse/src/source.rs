//! Rust source files: the doc comments are the prose a reader asks about,
//! the code between them stays lines.

use crate::{Block, BlockText, collapse};

/// The blocks of a `.rs` file, and its title (the first heading of its
/// module docs, when they open with one): `//!` and `///` comments read as
/// Markdown (paragraphs whole, examples as code), the code around them as
/// code blocks with their lines kept.
pub fn rust_blocks(src: &str) -> (Option<String>, Vec<Block>) {
    let mut blocks = Vec::new();
    let mut title = None;
    let mut docs = String::new();
    let mut code = String::new();
    let flush_docs = |docs: &mut String, blocks: &mut Vec<Block>, title: &mut Option<String>| {
        if docs.trim().is_empty() {
            docs.clear();
            return;
        }
        let (t, b) = crate::markdown_blocks(docs);
        if title.is_none() && blocks.is_empty() {
            *title = t;
        }
        blocks.extend(b);
        docs.clear();
    };
    let flush_code = |code: &mut String, blocks: &mut Vec<Block>| {
        let mut b = BlockText {
            cur: std::mem::take(code),
            ..BlockText::default()
        };
        b.end(None, true);
        blocks.extend(b.blocks);
    };
    for line in src.lines() {
        let t = line.trim_start();
        let doc = t
            .strip_prefix("//!")
            .or_else(|| t.strip_prefix("///").filter(|_| !t.starts_with("////")));
        match doc {
            Some(d) => {
                flush_code(&mut code, &mut blocks);
                docs.push_str(d.strip_prefix(' ').unwrap_or(d));
                docs.push('\n');
            }
            None => {
                flush_docs(&mut docs, &mut blocks, &mut title);
                code.push_str(line);
                code.push('\n');
            }
        }
    }
    flush_docs(&mut docs, &mut blocks, &mut title);
    flush_code(&mut code, &mut blocks);
    let title = title.map(|t| collapse(&t));
    (title, blocks)
}
