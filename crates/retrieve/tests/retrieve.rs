//! Filtered HNSW recall against brute force, BM25 with filters, and index
//! maintenance (replace, delete).

use ragtime_core::{Cancel, Filter};
use ragtime_retrieve::{Allowed, Chunk, CollectionIndex, DenseParams, SearchPath};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;

/// A small deterministic generator (xorshift) so the test needs no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 11) as f32 / (1u64 << 53) as f32
    }
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-9), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// Clustered unit vectors, like sentence embeddings of a topical corpus.
fn vectors(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut r = Rng(seed);
    let centres: Vec<Vec<f32>> = (0..50)
        .map(|_| (0..dim).map(|_| r.gauss()).collect())
        .collect();
    (0..n)
        .map(|i| {
            let c = &centres[i % centres.len()];
            normalise(c.iter().map(|x| x + 0.9 * r.gauss()).collect())
        })
        .collect()
}

fn entry(id: i64, text: &str, meta: serde_json::Value) -> Chunk {
    Chunk {
        chunk_id: id,
        document_id: id,
        external_id: format!("doc-{id}"),
        position: 0,
        title: String::new(),
        section: String::new(),
        metadata: Arc::new(meta),
        text: text.to_owned(),
    }
}

fn brute(vs: &[Vec<f32>], q: &[f32], k: usize, keep: impl Fn(usize) -> bool) -> Vec<i64> {
    let mut s: Vec<(f32, usize)> = vs
        .iter()
        .enumerate()
        .filter(|(i, _)| keep(*i + 1))
        .map(|(i, v)| (v.iter().zip(q).map(|(a, b)| a * b).sum(), i + 1))
        .collect();
    s.sort_by(|a, b| b.0.total_cmp(&a.0));
    s.into_iter().take(k).map(|(_, i)| i as i64).collect()
}

#[test]
fn filtered_hnsw_recall_at_10_stays_above_095_at_every_selectivity() {
    let (n, dim) = (6000, 384);
    let vs = vectors(n, dim, 7);
    // A low exact-scan threshold so 10 % goes through the filtered graph.
    // A list of 240: these clusters (noise 0.9 a component over 384) are
    // near-isotropic, harder than real embeddings (SciFact: 0.998 of the
    // ten nearest at the shipped 160), and the graph is built on every
    // core, so each build differs: at 160 the unfiltered recall here
    // ranged 0.947-0.962 over five builds. The test is of the filter
    // paths, not of that edge.
    let params = DenseParams {
        exact_below: 256,
        exact_fraction: 0.05,
        ef_search: 240,
        ..DenseParams::default()
    };
    let idx = CollectionIndex::new(dim, params).expect("index");
    // bucket = id % 1000: selectivity 100 %, 10 %, 1 %, 0.1 % via bucket < 1000/100/10/1.
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    entry(i as i64 + 1, "x", json!({"bucket": (i + 1) % 1000})),
                    v.clone(),
                )
            })
            .collect(),
    )
    .expect("add");
    let queries = vectors(40, dim, 99);
    for (limit, label) in [(1000, "100%"), (100, "10%"), (10, "1%"), (1, "0.1%")] {
        let filter = if limit == 1000 {
            Filter::All
        } else {
            Filter::parse(&json!({"bucket": {"$lt": limit}}), "filter").expect("filter")
        };
        let allowed = idx.allowed(&filter);
        let mut found = 0usize;
        let mut wanted = 0usize;
        let mut paths = HashSet::new();
        for q in &queries {
            let truth = brute(&vs, q, 10, |id| limit == 1000 || id % 1000 < limit);
            let (hits, path) = idx.dense_search(q, 10, &allowed, &Cancel::new());
            paths.insert(format!("{path:?}"));
            let got: HashSet<i64> = hits.iter().map(|h| h.chunk_id).collect();
            assert!(
                got.iter()
                    .all(|id| limit == 1000 || (*id as usize) % 1000 < limit),
                "a filtered-out chunk came back"
            );
            found += truth.iter().filter(|t| got.contains(t)).count();
            wanted += truth.len();
            // The graph walks int8 copies; what comes back is scored at
            // full precision, whatever path found it.
            for h in &hits {
                let exact: f32 = vs[h.chunk_id as usize - 1]
                    .iter()
                    .zip(q)
                    .map(|(a, b)| a * b)
                    .sum();
                assert!(
                    (h.score - exact).abs() < 1e-5,
                    "chunk {} scored {} against its exact {exact} ({label})",
                    h.chunk_id,
                    h.score
                );
            }
        }
        let recall = found as f32 / wanted as f32;
        eprintln!("selectivity {label}: recall@10 {recall:.3} via {paths:?}");
        let expected_path = match limit {
            1000 => "Graph",
            100 => "FilteredGraph",
            _ => "Exact",
        };
        assert_eq!(
            paths.into_iter().collect::<Vec<_>>(),
            [expected_path],
            "{label}"
        );
        assert!(recall >= 0.95, "selectivity {label}: recall@10 {recall:.3}");
    }
}

#[test]
fn selective_filters_switch_to_an_exact_scan() {
    let dim = 16;
    let vs = vectors(3000, dim, 3);
    let idx = CollectionIndex::new(
        dim,
        DenseParams {
            exact_below: 100,
            exact_fraction: 0.0,
            ..DenseParams::default()
        },
    )
    .expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    entry(i as i64 + 1, "x", json!({"b": (i + 1) % 100})),
                    v.clone(),
                )
            })
            .collect(),
    )
    .expect("add");
    let few = idx.allowed(&Filter::parse(&json!({"b": 5}), "f").expect("f"));
    assert_eq!(few.count(3000), 30);
    assert_eq!(
        idx.dense_search(&vs[0], 5, &few, &Cancel::new()).1,
        SearchPath::Exact
    );
    let many = idx.allowed(&Filter::parse(&json!({"b": {"$lt": 50}}), "f").expect("f"));
    assert_eq!(
        idx.dense_search(&vs[0], 5, &many, &Cancel::new()).1,
        SearchPath::FilteredGraph
    );
    assert_eq!(
        idx.dense_search(&vs[0], 5, &Allowed::All, &Cancel::new()).1,
        SearchPath::Graph
    );
    // A collection no larger than the threshold is scanned exactly, and its
    // answer is the true top k.
    let small = CollectionIndex::new(
        dim,
        DenseParams {
            exact_below: 100,
            ..DenseParams::default()
        },
    )
    .expect("index");
    small
        .add(
            vs[..100]
                .iter()
                .enumerate()
                .map(|(i, v)| (entry(i as i64 + 1, "x", json!({})), v.clone()))
                .collect(),
        )
        .expect("add");
    let (hits, path) = small.dense_search(&vs[7], 5, &Allowed::All, &Cancel::new());
    assert_eq!(path, SearchPath::Exact);
    assert_eq!(
        hits.iter().map(|h| h.chunk_id).collect::<Vec<_>>(),
        brute(&vs[..100], &vs[7], 5, |_| true)
    );
}

#[test]
fn bm25_finds_stemmed_terms_and_honours_filters() {
    let idx = CollectionIndex::new(4, DenseParams::default()).expect("index");
    let v = vec![0.5, 0.5, 0.5, 0.5];
    idx.add(vec![
        (
            entry(
                1,
                "Mitochondria produce energy for the cell.",
                json!({"year": 2019}),
            ),
            v.clone(),
        ),
        (
            entry(2, "The cells divide by mitosis.", json!({"year": 2021})),
            v.clone(),
        ),
        (
            entry(3, "Stock markets rallied on Monday.", json!({"year": 2021})),
            v.clone(),
        ),
    ])
    .expect("add");
    let hits = idx
        .lexical_search("cell", 10, &Allowed::All, &Cancel::new())
        .expect("search");
    let ids: Vec<i64> = hits.iter().map(|h| h.chunk_id).collect();
    assert_eq!(ids.len(), 2, "stemming: cell ~ cells: {ids:?}");
    assert!(!ids.contains(&3));
    let recent = idx.allowed(&Filter::parse(&json!({"year": {"$gte": 2020}}), "f").expect("f"));
    let hits = idx
        .lexical_search("cell", 10, &recent, &Cancel::new())
        .expect("search");
    assert_eq!(hits.iter().map(|h| h.chunk_id).collect::<Vec<_>>(), [2]);
    // Query syntax in user text does not fail the search.
    assert!(
        idx.lexical_search("cell AND (\"unbalanced", 10, &Allowed::All, &Cancel::new())
            .is_ok()
    );
    assert!(
        idx.lexical_search("   ", 10, &Allowed::All, &Cancel::new())
            .expect("empty")
            .is_empty()
    );
    // A search whose request was cancelled does no work and finds nothing.
    let cancelled = Cancel::new();
    cancelled.cancel();
    assert!(
        idx.lexical_search("cell", 10, &Allowed::All, &cancelled)
            .expect("cancelled")
            .is_empty()
    );
}

#[test]
fn removed_chunks_never_come_back() {
    let dim = 8;
    let vs = vectors(200, dim, 11);
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    entry(i as i64 + 1, &format!("word{i} common"), json!({})),
                    v.clone(),
                )
            })
            .collect(),
    )
    .expect("add");
    let gone: Vec<i64> = (1..=100).collect();
    idx.remove(&gone).expect("remove");
    assert_eq!(idx.len(), 100);
    for q in vs.iter().take(20) {
        let (hits, _) = idx.dense_search(q, 10, &Allowed::All, &Cancel::new());
        assert!(
            hits.iter().all(|h| h.chunk_id > 100),
            "dense returned a removed chunk"
        );
        assert_eq!(hits.len(), 10);
    }
    let lex = idx
        .lexical_search("common", 200, &Allowed::All, &Cancel::new())
        .expect("lex");
    assert_eq!(lex.len(), 100);
    assert!(lex.iter().all(|h| h.chunk_id > 100));
    assert!(idx.chunk(5).is_none() && idx.chunk(150).is_some());
}

/// Chunk `id` of document `doc` at `position`, with `title`.
fn part(
    id: i64,
    doc: i64,
    position: i32,
    title: &str,
    text: &str,
    meta: serde_json::Value,
) -> Chunk {
    Chunk {
        document_id: doc,
        external_id: format!("doc-{doc}"),
        position,
        title: title.to_owned(),
        ..entry(id, text, meta)
    }
}

fn unit(dim: usize, at: usize) -> Vec<f32> {
    let mut v = vec![0.0; dim];
    v[at] = 1.0;
    v
}

fn doc_ids(hits: &[ragtime_retrieve::DocHit]) -> Vec<i64> {
    hits.iter().map(|d| d.document_id).collect()
}

#[test]
fn whole_documents_are_ranked_and_answer_with_their_best_chunks() {
    let idx = CollectionIndex::new(4, DenseParams::default()).expect("index");
    let year = |y: i64| json!({ "year": y });
    // Document 1 speaks of mitochondria across two chunks (one mention
    // each); document 2 has it once in its title; document 3 not at all.
    idx.add(vec![
        (
            part(
                1,
                1,
                0,
                "Cell biology",
                "Mitochondria make energy.",
                year(2020),
            ),
            unit(4, 0),
        ),
        (
            part(
                2,
                1,
                1,
                "Cell biology",
                "Ribosomes make proteins.",
                year(2020),
            ),
            unit(4, 1),
        ),
        (
            part(
                3,
                1,
                2,
                "Cell biology",
                "More on mitochondria here.",
                year(2020),
            ),
            unit(4, 2),
        ),
        (
            part(4, 2, 0, "Mitochondria", "An organelle.", year(2024)),
            unit(4, 3),
        ),
        (
            part(5, 3, 0, "Plants", "Chloroplasts capture light.", year(2024)),
            unit(4, 3),
        ),
    ])
    .expect("add");
    let all = idx.allowed(&Filter::All);
    let cancel = Cancel::new();
    let search = |boosts, vector: Option<&[f32]>, per: usize, allowed: &Allowed| {
        idx.document_search("mitochondria", 10, allowed, boosts, vector, per, &cancel)
            .expect("search")
    };
    let plain = ragtime_retrieve::Boosts {
        title: 1.0,
        section: 0.3,
    };
    let found = search(plain, None, 3, &all);
    assert_eq!(
        {
            let mut d = doc_ids(&found);
            d.sort_unstable();
            d
        },
        [1, 2],
        "one entry per document, only those that match"
    );
    // A heavy title boost puts the document titled so first.
    let titled = search(
        ragtime_retrieve::Boosts {
            title: 5.0,
            section: 0.3,
        },
        None,
        3,
        &all,
    );
    assert_eq!(doc_ids(&titled)[0], 2);

    // Without a vector a document's chunks come by their own BM25 score,
    // and only those that match; with one, by similarity plus that score:
    // the best chunk first, then those that match.
    let one = found.iter().find(|d| d.document_id == 1).expect("doc 1");
    let mut order: Vec<i64> = one.chunks.iter().map(|h| h.chunk_id).collect();
    order.sort_unstable();
    assert_eq!(order, [1, 3], "the unmatched chunk 2 is left out");
    assert!(one.chunks.iter().all(|h| h.score > 0.0));
    let near_2 = unit(4, 1);
    let by_vector = search(plain, Some(&near_2), 3, &all);
    let one = by_vector
        .iter()
        .find(|d| d.document_id == 1)
        .expect("doc 1");
    let order: Vec<i64> = one.chunks.iter().map(|h| h.chunk_id).collect();
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(order[0], 2, "nearest the vector: {order:?}");
    let near_3 = unit(4, 2);
    let by_vector = search(plain, Some(&near_3), 2, &all);
    let one = by_vector
        .iter()
        .find(|d| d.document_id == 1)
        .expect("doc 1");
    // Chunk 3 is nearest and matches; chunk 1 matches; 2 neither.
    assert_eq!(
        one.chunks.iter().map(|h| h.chunk_id).collect::<Vec<_>>(),
        [3, 1]
    );
    // Filters apply to documents.
    let recent =
        idx.allowed(&Filter::parse(&json!({"year": {"$gte": 2024}}), "filter").expect("filter"));
    assert_eq!(doc_ids(&search(plain, None, 1, &recent)), [2]);

    // Replacing a document's chunks replaces its text in the document
    // index; removing them all removes the document.
    idx.remove(&[1, 3]).expect("remove");
    assert_eq!(doc_ids(&search(plain, None, 1, &all)), [2]);
    idx.add(vec![(
        part(6, 1, 3, "Cell biology", "Mitochondria again.", year(2020)),
        unit(4, 0),
    )])
    .expect("add");
    let again = search(plain, None, 3, &all);
    let one = again
        .iter()
        .find(|d| d.document_id == 1)
        .expect("doc 1 is back");
    assert_eq!(
        one.chunks.iter().map(|h| h.chunk_id).collect::<Vec<_>>(),
        [6]
    );
    idx.remove(&[2, 6]).expect("remove");
    assert_eq!(doc_ids(&search(plain, None, 1, &all)), [2]);
    assert!(idx.document_chunks(1, None).is_empty());
}

#[test]
fn long_documents_are_ranked_by_their_best_chunk() {
    use ragtime_retrieve::{AUTO_MAX_CHUNKS, LexicalUnit};
    let idx = CollectionIndex::new(4, DenseParams::default()).expect("index");
    // One long document: AUTO_MAX_CHUNKS + 1 chunks, one of them on comets.
    let n = AUTO_MAX_CHUNKS as i64 + 1;
    let items: Vec<(Chunk, Vec<f32>)> = (0..n)
        .map(|i| {
            let text = if i == 4 {
                "Comets have icy tails."
            } else {
                "Filler text here."
            };
            (
                part(i + 1, 1, i as i32, "Manual", text, json!({})),
                unit(4, 0),
            )
        })
        .collect();
    idx.add(items).expect("add");
    assert_eq!(idx.lexical_unit(LexicalUnit::Auto), LexicalUnit::Chunks);
    assert_eq!(
        idx.lexical_unit(LexicalUnit::Documents),
        LexicalUnit::Documents
    );
    let all = idx.allowed(&Filter::All);
    let found = idx
        .chunk_document_search("comets", 10, &all, None, 3, &Cancel::new())
        .expect("search");
    assert_eq!(doc_ids(&found), [1]);
    assert_eq!(
        found[0]
            .chunks
            .iter()
            .map(|h| h.chunk_id)
            .collect::<Vec<_>>(),
        [5],
        "only the chunk that matches"
    );
    // A short document tips the mean under the line: whole documents.
    let short: Vec<(Chunk, Vec<f32>)> = (0..n)
        .map(|i| {
            (
                part(100 + i, 100 + i, 0, "Note", "Short.", json!({})),
                unit(4, 1),
            )
        })
        .collect();
    idx.add(short).expect("add");
    assert_eq!(idx.lexical_unit(LexicalUnit::Auto), LexicalUnit::Documents);
}

/// Searches whose answers a saved and loaded index must repeat.
fn answers(idx: &CollectionIndex, vs: &[Vec<f32>]) -> Vec<String> {
    let cancel = Cancel::new();
    let mut out = Vec::new();
    for q in vs.iter().step_by(37) {
        let (hits, path) = idx.dense_search(q, 10, &Allowed::All, &cancel);
        out.push(format!(
            "{path:?} {:?}",
            hits.iter().map(|h| h.chunk_id).collect::<Vec<_>>()
        ));
    }
    for q in ["common", "word7", "word150 word151", "tail"] {
        let lex = idx
            .lexical_search(q, 20, &Allowed::All, &cancel)
            .expect("lex");
        out.push(format!(
            "{q}: {:?}",
            lex.iter()
                .map(|h| (h.chunk_id, h.score))
                .collect::<Vec<_>>()
        ));
        let docs = idx
            .document_search(
                q,
                10,
                &Allowed::All,
                ragtime_retrieve::Boosts::DOCUMENTS,
                Some(&vs[3]),
                2,
                &cancel,
            )
            .expect("documents");
        out.push(format!("{q}: {docs:?}"));
    }
    let only = idx.allowed(&ragtime_retrieve::parse_filter(&json!({"group": 1})).expect("filter"));
    let (hits, _) = idx.dense_search(&vs[8], 10, &only, &cancel);
    out.push(format!(
        "filtered {:?}",
        hits.iter().map(|h| h.chunk_id).collect::<Vec<_>>()
    ));
    out
}

#[test]
fn a_saved_collection_loads_with_the_same_answers_and_keeps_changing() {
    let (n, dim) = (3000, 32);
    let vs = vectors(n + 100, dim, 21);
    // The graph, not the exact scan, answers unfiltered searches.
    let params = DenseParams {
        exact_below: 64,
        ..DenseParams::default()
    };
    let idx = CollectionIndex::new(dim, params).expect("index");
    // Three chunks a document, with titles, sections and metadata.
    let chunk = |i: usize| {
        let doc = (i / 3) as i64 + 1;
        Chunk {
            section: format!("part {}", i % 3),
            ..part(
                i as i64 + 1,
                doc,
                (i % 3) as i32,
                &format!("Title {doc}"),
                &format!("word{i} common text of chunk {i}"),
                json!({"group": doc % 4, "tags": ["a", i % 2]}),
            )
        }
    };
    idx.add((0..n).map(|i| (chunk(i), vs[i].clone())).collect())
        .expect("add");
    // Tombstones in the graph: removed chunks must stay removed.
    let gone: Vec<i64> = (1..=60).collect();
    idx.remove(&gone).expect("remove");
    let before = answers(&idx, &vs);

    let dir = tempfile::tempdir().expect("tempdir");
    let saved = idx.save(dir.path()).expect("save");
    assert_eq!((saved.chunks, saved.documents), (n - 60, (n - 60) / 3));
    let loaded = CollectionIndex::load(dir.path(), dim, params, None).expect("load");
    assert_eq!(
        (loaded.len(), loaded.documents()),
        (idx.len(), idx.documents())
    );
    assert_eq!(answers(&loaded, &vs), before);
    assert!(loaded.chunk(5).is_none());
    let c = loaded.chunk(100).expect("chunk 100");
    assert_eq!(
        (c.title.as_str(), c.section.as_str()),
        ("Title 34", "part 0")
    );
    assert_eq!(*c.metadata, json!({"group": 2, "tags": ["a", 1]}));

    // The loaded graph and BM25 segments take new chunks and removals.
    let new: Vec<(Chunk, Vec<f32>)> = (n..n + 100)
        .map(|i| {
            (
                entry(i as i64 + 1, &format!("fresh tail {i}"), json!({})),
                vs[i].clone(),
            )
        })
        .collect();
    loaded.add(new).expect("add to the loaded index");
    loaded
        .remove(&[61, 62, 63])
        .expect("remove from the loaded index");
    for (i, v) in vs.iter().enumerate().skip(n) {
        let (hits, _) = loaded.dense_search(v, 1, &Allowed::All, &Cancel::new());
        assert_eq!(
            hits[0].chunk_id,
            i as i64 + 1,
            "a new point is found by its own vector"
        );
    }
    let tail = loaded
        .lexical_search("tail", 200, &Allowed::All, &Cancel::new())
        .expect("lex");
    assert_eq!(tail.len(), 100);
    let common = loaded
        .lexical_search("common", 5000, &Allowed::All, &Cancel::new())
        .expect("lex");
    assert_eq!(common.len(), n - 63);
    assert!(common.iter().all(|h| h.chunk_id > 63));
}

/// An index of `n` clustered vectors (one chunk a document), saved into
/// a new folder.
fn saved(
    n: usize,
    dim: usize,
    seed: u64,
    params: DenseParams,
) -> (CollectionIndex, Vec<Vec<f32>>, tempfile::TempDir) {
    let vs = vectors(n, dim, seed);
    let idx = CollectionIndex::new(dim, params).expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| (entry(i as i64 + 1, "some text", json!({})), v.clone()))
            .collect(),
    )
    .expect("add");
    let dir = tempfile::tempdir().expect("tempdir");
    idx.save(dir.path()).expect("save");
    (idx, vs, dir)
}

/// Loads the snapshot in `dir` after `file` in it was replaced by each of
/// `versions`, expecting every load refused; the errors, in order.
fn refused_with(
    dir: &std::path::Path,
    dim: usize,
    file: &str,
    versions: Vec<(&str, Vec<u8>)>,
) -> Vec<String> {
    versions
        .into_iter()
        .map(|(what, bytes)| {
            std::fs::write(dir.join(file), &bytes).expect("write");
            let err = CollectionIndex::load(dir, dim, DenseParams::default(), None)
                .err()
                .unwrap_or_else(|| panic!("{file} {what} was served"))
                .to_string();
            eprintln!("{file} {what}: {err}");
            err
        })
        .collect()
}

#[test]
fn a_damaged_snapshot_is_an_error_not_a_wrong_index() {
    let dim = 8;
    let (_, _, dir) = saved(300, dim, 5, DenseParams::default());
    let wrong_dim = CollectionIndex::load(dir.path(), 16, DenseParams::default(), None);
    assert!(wrong_dim.is_err(), "another dimension is refused");
    std::fs::write(
        dir.path().join("chunks.jsonl"),
        "{\"document_id\": 1, trailing",
    )
    .expect("write");
    let err = CollectionIndex::load(dir.path(), dim, DenseParams::default(), None)
        .err()
        .expect("an error");
    assert!(err.to_string().contains("chunks.jsonl line 1"), "{err}");
}

#[test]
fn damaged_or_missing_full_precision_vectors_are_an_error() {
    let dim = 8;
    let (_, _, dir) = saved(300, dim, 6, DenseParams::default());
    let file = dir.path().join("dense.vectors");
    let whole = std::fs::read(&file).expect("the vectors are saved beside the graph");
    assert_eq!(whole.len(), 24 + 300 * (8 + dim * 4), "one copy of each");
    assert!(CollectionIndex::load(dir.path(), dim, DenseParams::default(), None).is_ok());
    refused_with(
        dir.path(),
        dim,
        "dense.vectors",
        vec![
            ("truncated", whole[..whole.len() - 5].to_vec()),
            (
                "one point short",
                whole[..whole.len() - (8 + dim * 4)].to_vec(),
            ),
            ("longer", [whole.as_slice(), &[0u8; 9]].concat()),
            (
                "foreign",
                b"not a vectors file at all, though long enough".to_vec(),
            ),
        ],
    );
    // Another index's vectors: the same ids, dimension and length.
    let (_, _, other) = saved(300, dim, 66, DenseParams::default());
    let err = refused_with(
        dir.path(),
        dim,
        "dense.vectors",
        vec![("of another index", read(&other, "dense.vectors"))],
    );
    assert!(err[0].contains("not the one"), "{err:?}");
    std::fs::remove_file(&file).expect("remove");
    assert!(
        CollectionIndex::load(dir.path(), dim, DenseParams::default(), None).is_err(),
        "a graph without its vectors was served"
    );
}

#[test]
fn a_damaged_or_foreign_graph_file_is_an_error_never_a_crash() {
    let dim = 8;
    let (_, _, dir) = saved(300, dim, 7, DenseParams::default());
    let file = dir.path().join("dense.usearch");
    let whole = std::fs::read(&file).expect("the graph is saved as one file");
    assert!(CollectionIndex::load(dir.path(), dim, DenseParams::default(), None).is_ok());
    refused_with(
        dir.path(),
        dim,
        "dense.usearch",
        vec![
            (
                "truncated by a few bytes",
                whole[..whole.len() - 7].to_vec(),
            ),
            ("cut in half", whole[..whole.len() / 2].to_vec()),
            ("cut to its header", whole[..64.min(whole.len())].to_vec()),
            ("empty", Vec::new()),
            (
                "foreign",
                b"not a graph file at all, though long enough to hold a header".repeat(8),
            ),
        ],
    );
    // Another index's graph: the same ids and dimension, other vectors;
    // and a graph missing one point the vectors hold.
    let (_, _, other) = saved(300, dim, 77, DenseParams::default());
    let (fewer, _, _) = saved(300, dim, 7, DenseParams::default());
    fewer.remove(&[300]).expect("remove");
    let fewer_dir = tempfile::tempdir().expect("tempdir");
    fewer.save(fewer_dir.path()).expect("save");
    let err = refused_with(
        dir.path(),
        dim,
        "dense.usearch",
        vec![
            ("of another index", read(&other, "dense.usearch")),
            ("one point short", read(&fewer_dir, "dense.usearch")),
        ],
    );
    assert!(err[0].contains("not the one"), "{err:?}");
    assert!(err[1].contains("points in the graph"), "{err:?}");
}

#[test]
fn chunks_words_stay_in_files_and_a_damaged_texts_file_is_refused() {
    let (n, dim) = (300, 8);
    let vs = vectors(n + 1, dim, 9);
    // Words of about 2 KiB a chunk, each its own.
    let words = |i: usize| format!("chunk {i} says {}", "word ".repeat(400 + i % 17));
    let build = |offset: usize| {
        let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
        idx.add(
            (0..n)
                .map(|i| {
                    let c = Chunk {
                        section: format!("Part {i}"),
                        ..entry(i as i64 + 1, &words(i + offset), json!({"i": i}))
                    };
                    (c, vs[i].clone())
                })
                .collect(),
        )
        .expect("add");
        let dir = tempfile::tempdir().expect("tempdir");
        idx.save(dir.path()).expect("save");
        (idx, dir)
    };
    let (built, dir) = build(0);
    let work = tempfile::tempdir().expect("tempdir");
    let workspace = ragtime_retrieve::Workspace::new(work.path()).expect("workspace");
    let folder = workspace.folder().expect("folder");
    let folder_path = folder.path().to_owned();
    let opened =
        CollectionIndex::load(dir.path(), dim, DenseParams::default(), Some(folder)).expect("load");
    // Read from the snapshot's file: the words are not on the heap.
    let text_bytes: usize = (0..n).map(|i| words(i).len()).sum();
    assert!(
        opened.memory_bytes() + text_bytes <= built.memory_bytes(),
        "opened {} against built {} ({text_bytes} bytes of words)",
        opened.memory_bytes(),
        built.memory_bytes()
    );
    assert!(opened.mapped_bytes() >= text_bytes);
    for id in [1, 150, 300] {
        let (a, b) = (
            opened.chunk(id).expect("opened"),
            built.chunk(id).expect("built"),
        );
        assert_eq!(
            (&a.text, &a.section, &a.metadata),
            (&b.text, &b.section, &b.metadata)
        );
    }
    // Words written after opening go to the work folder's file, and come
    // back with the others when saved again.
    let fresh = Chunk {
        section: "New".into(),
        ..entry(n as i64 + 1, "a brand new chunk", json!({}))
    };
    opened.add(vec![(fresh, vs[n].clone())]).expect("add");
    assert!(
        std::fs::metadata(folder_path.join("texts"))
            .expect("texts")
            .len()
            > 0
    );
    assert_eq!(
        opened.chunk(n as i64 + 1).expect("new").text,
        "a brand new chunk"
    );
    opened.remove(&[2]).expect("remove");
    let again = tempfile::tempdir().expect("tempdir");
    opened.save(again.path()).expect("save again");
    let reopened =
        CollectionIndex::load(again.path(), dim, DenseParams::default(), None).expect("reload");
    assert_eq!(reopened.chunk(n as i64 + 1).expect("new").section, "New");
    assert_eq!(reopened.chunk(3).expect("old").text, words(2));
    assert!(reopened.chunk(2).is_none());

    let whole = read(&dir, "chunks.texts");
    assert!(whole.len() >= text_bytes, "one copy of each chunk's words");
    let (_, other) = build(5);
    let err = refused_with(
        dir.path(),
        dim,
        "chunks.texts",
        vec![
            (
                "truncated by a few bytes",
                whole[..whole.len() - 3].to_vec(),
            ),
            ("cut in half", whole[..whole.len() / 2].to_vec()),
            ("empty", Vec::new()),
            (
                "foreign",
                b"not a texts file, though long enough".repeat(100),
            ),
            ("of another index", read(&other, "chunks.texts")),
        ],
    );
    assert!(err[4].contains("not the one"), "{err:?}");
}

#[test]
fn a_documents_changed_or_removed_metadata_is_what_filters_see() {
    let dim = 8;
    let vs = vectors(40, dim, 3);
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    // Forty documents of two chunks, sharing three metadata values.
    let chunk = |i: usize, team: &str| {
        part(
            i as i64 + 1,
            (i / 2) as i64 + 1,
            (i % 2) as i32,
            "Title",
            &format!("text {i}"),
            json!({"team": team, "lang": "en"}),
        )
    };
    let teams = ["search", "llm", "ops"];
    idx.add(
        (0..40)
            .map(|i| (chunk(i, teams[(i / 2) % 3]), vs[i].clone()))
            .collect(),
    )
    .expect("add");
    let docs = |team: &str| -> Vec<usize> {
        let f = Filter::parse(&json!({"team": team}), "filter").expect("filter");
        match idx.allowed(&f) {
            Allowed::Only(set) => set.documents.to_vec(),
            Allowed::All => panic!("a filter allows all"),
        }
    };
    assert_eq!(docs("ops"), vec![3, 6, 9, 12, 15, 18]);
    // Document 3 moves to another team (its chunks rewritten under new ids).
    idx.remove(&[5, 6]).expect("remove");
    idx.add(vec![
        (
            Chunk {
                chunk_id: 105,
                ..chunk(4, "search")
            },
            vs[4].clone(),
        ),
        (
            Chunk {
                chunk_id: 106,
                ..chunk(5, "search")
            },
            vs[5].clone(),
        ),
    ])
    .expect("add");
    assert_eq!(docs("ops"), vec![6, 9, 12, 15, 18]);
    assert!(docs("search").contains(&3));
    assert_eq!(
        *idx.chunk(106).expect("chunk").metadata,
        json!({"team": "search", "lang": "en"})
    );
    // Every "ops" document removed, then a new one: found again.
    let ops: Vec<i64> = [6, 9, 12, 15, 18]
        .iter()
        .flat_map(|d| [2 * d - 1, 2 * d])
        .collect();
    idx.remove(&ops).expect("remove");
    assert_eq!(docs("ops"), Vec::<usize>::new());
    idx.add(vec![(
        Chunk {
            chunk_id: 500,
            document_id: 50,
            external_id: "doc-50".into(),
            ..chunk(0, "ops")
        },
        vs[0].clone(),
    )])
    .expect("add");
    assert_eq!(docs("ops"), vec![50]);
    assert_eq!(docs("llm"), vec![2, 5, 8, 11, 14, 17, 20]);
}

/// A saved index's file.
fn read(dir: &tempfile::TempDir, file: &str) -> Vec<u8> {
    std::fs::read(dir.path().join(file)).expect("a saved file")
}

#[test]
fn an_opened_index_reads_its_vectors_in_place_and_keeps_changing() {
    let (n, dim) = (400, 64);
    let params = DenseParams {
        exact_below: 16,
        ..DenseParams::default()
    };
    let (idx, _, dir) = saved(n, dim, 12, params);
    let opened = CollectionIndex::load(dir.path(), dim, params, None).expect("load");
    // The full-precision vectors stay in the file: the heap holds at least
    // their bytes less than the index that wrote them.
    assert!(
        opened.memory_bytes() + n * dim * 4 <= idx.memory_bytes(),
        "opened {} against built {}",
        opened.memory_bytes(),
        idx.memory_bytes()
    );
    let top = |i: &CollectionIndex, q: &[f32]| -> Vec<(i64, f32)> {
        i.dense_search(q, 10, &i.allowed(&Filter::All), &Cancel::new())
            .0
            .iter()
            .map(|h| (h.chunk_id, h.score))
            .collect()
    };
    let queries = vectors(20, dim, 77);
    for q in &queries {
        assert_eq!(top(&opened, q), top(&idx, q));
    }
    // A mapped point removed, a new one added (chunk ids are never
    // reused: a changed document's chunks get new ones).
    let q = &queries[0];
    let removed = top(&idx, q)[0].0;
    opened.remove(&[removed]).expect("remove");
    opened
        .add(vec![(entry(n as i64 + 1, "text", json!({})), q.clone())])
        .expect("add");
    let after = top(&opened, q);
    assert_eq!(
        after[0].0,
        n as i64 + 1,
        "the new point is the query itself"
    );
    assert!((after[0].1 - 1.0).abs() < 1e-5);
    assert!(after.iter().all(|(id, _)| *id != removed), "removed");
    assert_eq!(after[1..], top(&idx, q)[1..10], "the rest read in place");
    // Saved again (mapped and heap points together) and opened again.
    let again = tempfile::tempdir().expect("tempdir");
    opened.save(again.path()).expect("save again");
    drop(dir);
    let reopened = CollectionIndex::load(again.path(), dim, params, None).expect("reload");
    for q in &queries {
        assert_eq!(top(&reopened, q), top(&opened, q));
    }
}

#[test]
fn searches_and_writes_together_never_wait_on_each_other() {
    let dim = 16;
    let vs = vectors(3000, dim, 21);
    // Through the graph (not an exact scan), with tombstones in it.
    let params = DenseParams {
        exact_below: 16,
        exact_fraction: 0.0,
        ..DenseParams::default()
    };
    let idx = Arc::new(CollectionIndex::new(dim, params).expect("index"));
    idx.add(
        vs[..2000]
            .iter()
            .enumerate()
            .map(|(i, v)| (entry(i as i64 + 1, "text", json!({})), v.clone()))
            .collect(),
    )
    .expect("add");
    idx.remove(&(1..=100).collect::<Vec<i64>>())
        .expect("tombstones");
    let (done, finished) = std::sync::mpsc::channel();
    for s in 0..3u64 {
        let (idx, done) = (idx.clone(), done.clone());
        let queries = vectors(50, dim, 100 + s);
        std::thread::spawn(move || {
            for _ in 0..20 {
                for q in &queries {
                    let all = idx.allowed(&Filter::All);
                    assert_eq!(idx.dense_search(q, 10, &all, &Cancel::new()).0.len(), 10);
                }
            }
            done.send("search").expect("send");
        });
    }
    {
        let (idx, done, vs) = (idx.clone(), done.clone(), vs.clone());
        std::thread::spawn(move || {
            for (i, v) in vs.iter().enumerate().skip(2000) {
                let id = i as i64 + 1;
                idx.add(vec![(entry(id, "text", json!({})), v.clone())])
                    .expect("add");
                idx.remove(&[id - 1000]).expect("remove");
            }
            done.send("write").expect("send");
        });
    }
    for _ in 0..4 {
        finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("searches and writes deadlocked");
    }
}

/// Every file under `dir` by its path, with its inode and bytes.
fn files(dir: &std::path::Path) -> std::collections::BTreeMap<String, (u64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let meta = e.metadata().expect("metadata");
            (
                e.file_name().to_string_lossy().into_owned(),
                (meta.ino(), std::fs::read(e.path()).expect("read")),
            )
        })
        .collect()
}

#[test]
fn lexical_indexes_on_disk_answer_as_in_memory_and_share_their_files_with_the_snapshot() {
    let (n, dim) = (600, 16);
    let vs = vectors(n + 50, dim, 31);
    let params = DenseParams::default();
    let work = tempfile::tempdir().expect("tempdir");
    let workspace = ragtime_retrieve::Workspace::new(work.path().join("ws")).expect("workspace");
    let folder = workspace.folder().expect("folder");
    let folder_path = folder.path().to_owned();
    let on_disk = CollectionIndex::new_in(dim, params, Some(folder)).expect("on disk");
    let in_memory = CollectionIndex::new(dim, params).expect("in memory");
    let words = ["glacier", "basalt", "lichen", "delta", "moraine", "fjord"];
    let chunk = |i: usize| {
        part(
            i as i64 + 1,
            (i / 2) as i64 + 1,
            (i % 2) as i32,
            &format!("Title {}", i / 2),
            &format!(
                "{} {} rock number {i}",
                words[i % words.len()],
                words[(i / 7) % words.len()]
            ),
            // Metadata is a document's: the same on both its chunks.
            json!({"group": (i / 2) % 3}),
        )
    };
    for idx in [&on_disk, &in_memory] {
        // Two writes and a removal: several segments and deletes.
        idx.add((0..n / 2).map(|i| (chunk(i), vs[i].clone())).collect())
            .expect("add");
        idx.add((n / 2..n).map(|i| (chunk(i), vs[i].clone())).collect())
            .expect("add");
        idx.remove(&(1..=40).collect::<Vec<_>>()).expect("remove");
    }
    // Every match with its score (not a top k: equal scores may come in
    // another order from another segment layout), by id.
    let answers = |idx: &CollectionIndex| -> Vec<String> {
        let cancel = Cancel::new();
        let some = idx.allowed(&ragtime_retrieve::parse_filter(&json!({"group": 1})).expect("f"));
        let mut out = Vec::new();
        for q in [
            "glacier basalt",
            "lichen rock",
            "fjord number 77",
            "moraine",
        ] {
            for allowed in [&Allowed::All, &some] {
                let mut lex = idx
                    .lexical_search(q, 10_000, allowed, &cancel)
                    .expect("lex");
                lex.sort_by_key(|h| h.chunk_id);
                out.push(format!(
                    "{:?}",
                    lex.iter()
                        .map(|h| (h.chunk_id, h.score))
                        .collect::<Vec<_>>()
                ));
                let mut docs = idx
                    .document_search(
                        q,
                        10_000,
                        allowed,
                        ragtime_retrieve::Boosts::DOCUMENTS,
                        None,
                        2,
                        &cancel,
                    )
                    .expect("documents");
                docs.sort_by_key(|d| d.document_id);
                out.push(format!(
                    "{:?}",
                    docs.iter()
                        .map(|d| (
                            d.document_id,
                            d.score,
                            d.chunks.iter().map(|c| c.chunk_id).collect::<Vec<_>>()
                        ))
                        .collect::<Vec<_>>()
                ));
            }
        }
        out
    };
    let before = answers(&in_memory);
    assert!(
        before.iter().any(|a| a.len() > 10),
        "the queries match something"
    );
    assert_eq!(answers(&on_disk), before, "the same answers from disk");
    // The postings are read in place, not held on the heap.
    assert!(on_disk.mapped_bytes() > 0);
    assert_eq!(in_memory.mapped_bytes(), 0);
    // (Within a few bytes: tantivy's segment files differ slightly between
    // two indexes of the same documents.)
    let (heap, mapped, all) = (
        on_disk.memory_bytes(),
        on_disk.mapped_bytes(),
        in_memory.memory_bytes(),
    );
    assert!(
        (heap + mapped).abs_diff(all) * 100 < mapped,
        "what one holds on the heap, the other maps: {heap} + {mapped} against {all}"
    );
    // Saved: the snapshot's index files are the folder's own (hard links).
    let snap = tempfile::tempdir().expect("tempdir");
    on_disk.save(snap.path()).expect("save");
    let saved = files(&snap.path().join("chunks-bm25"));
    let live = files(&folder_path.join("chunks-bm25"));
    assert!(saved.len() > 3, "{:?}", saved.keys());
    for (name, (ino, _)) in &saved {
        assert_eq!(
            live.get(name).map(|f| f.0),
            Some(*ino),
            "{name} is linked, not copied"
        );
    }
    // Written after the save: the snapshot's files do not change.
    on_disk
        .add((n..n + 50).map(|i| (chunk(i), vs[i].clone())).collect())
        .expect("add after the save");
    on_disk.remove(&[41, 42]).expect("remove after the save");
    assert_eq!(files(&snap.path().join("chunks-bm25")), saved);
    assert!(
        answers(&on_disk) != before,
        "the live index moved on (the check above could not fail otherwise)"
    );

    // Opened into a new folder: the state the snapshot holds, even after
    // the index that wrote it and its folder are gone.
    drop(on_disk);
    assert!(!folder_path.exists(), "a dropped index's folder is removed");
    let opened = CollectionIndex::load(
        snap.path(),
        dim,
        params,
        Some(workspace.folder().expect("folder")),
    )
    .expect("open");
    drop(snap);
    assert_eq!(answers(&opened), before);
    assert!(opened.mapped_bytes() > 0);
    // And it keeps changing like the in-memory one.
    for idx in [&opened, &in_memory] {
        idx.add((n..n + 50).map(|i| (chunk(i), vs[i].clone())).collect())
            .expect("add");
        idx.remove(&[41, 42]).expect("remove");
    }
    assert_eq!(answers(&opened), answers(&in_memory));
}

/// The graph's candidate list follows the collection's size: a graph past
/// `ef_reference` points walks a longer list (and so finds more of the true
/// nearest) than the same graph held to `ef_search`, filtered walks keep at
/// least as many, and a fixed list wider than `ef_max` is still served.
#[test]
fn the_graph_walks_a_longer_candidate_list_as_the_collection_grows() {
    let params = DenseParams {
        ef_search: 4,
        ef_reference: 250,
        ef_growth: 1.0,
        ef_max: 96,
        exact_below: 16,
        exact_fraction: 0.0,
        ..DenseParams::default()
    };
    assert_eq!(params.ef_for(100), 4, "up to the reference size");
    assert_eq!(params.ef_for(250), 4);
    assert_eq!(params.ef_for(1000), 16, "four times the reference size");
    assert_eq!(params.ef_for(1_000_000), 96, "at most ef_max");
    assert_eq!(
        DenseParams {
            ef_growth: 0.5,
            ..params
        }
        .ef_for(2250),
        12,
        "the size's power"
    );

    let (n, dim) = (4000, 32);
    let vs = vectors(n, dim, 31);
    let idx = CollectionIndex::new(dim, params).expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    entry(i as i64 + 1, "x", json!({"half": (i + 1) % 2})),
                    v.clone(),
                )
            })
            .collect(),
    )
    .expect("add");
    let queries = vectors(60, dim, 77);
    let recall = |allowed: &Allowed, keep: &dyn Fn(usize) -> bool| {
        let mut found = 0;
        for q in &queries {
            let truth = brute(&vs, q, 10, keep);
            let (hits, path) = idx.dense_search(q, 10, allowed, &Cancel::new());
            assert_ne!(path, SearchPath::Exact);
            found += hits.iter().filter(|h| truth.contains(&h.chunk_id)).count();
        }
        found as f32 / (queries.len() * 10) as f32
    };
    let half = idx.allowed(&Filter::parse(&json!({"half": 0}), "filter").expect("filter"));
    // 4,000 points: the list grows to 64 (of at most 96).
    let grown = recall(&Allowed::All, &|_| true);
    let grown_half = recall(&half, &|id| id % 2 == 0);
    idx.set_ef_search(Some(10));
    let held = recall(&Allowed::All, &|_| true);
    let held_half = recall(&half, &|id| id % 2 == 0);
    assert!(
        grown > held && grown_half > held_half,
        "recall@10 with the grown list {grown:.3} (half: {grown_half:.3}) against the held one {held:.3} ({held_half:.3})"
    );
    // Wider than ef_max, fixed by hand: every walk takes it.
    idx.set_ef_search(Some(1000));
    assert!(recall(&Allowed::All, &|_| true) >= grown);
    assert!(recall(&half, &|id| id % 2 == 0) >= grown_half);
}

/// A collection whose folder cannot be made (here the workspace's folder
/// has become a file; a full or read-only disk does the same) keeps its
/// BM25 indexes in memory and answers as an on-disk one does; the next
/// collection made once the folder is back goes to disk again.
#[test]
fn a_collection_whose_folder_cannot_be_made_keeps_its_indexes_in_memory() {
    let (n, dim) = (200, 16);
    let vs = vectors(n, dim, 5);
    let work = tempfile::tempdir().expect("tempdir");
    let root = work.path().join("ws");
    let indexes = ragtime_retrieve::Indexes::new(dim, DenseParams::default())
        .with_workspace(ragtime_retrieve::Workspace::new(&root).expect("workspace"));
    let fill = |idx: &CollectionIndex| {
        idx.add(
            (0..n)
                .map(|i| {
                    let word = ["granite", "shale", "quartz"][i % 3];
                    (
                        entry(i as i64 + 1, &format!("{word} sample {i}"), json!({})),
                        vs[i].clone(),
                    )
                })
                .collect(),
        )
        .expect("add");
        let hits = idx
            .lexical_search("quartz", 1000, &Allowed::All, &Cancel::new())
            .expect("search");
        let mut ids: Vec<i64> = hits.iter().map(|h| h.chunk_id).collect();
        ids.sort_unstable();
        ids
    };

    std::fs::remove_dir_all(&root).expect("remove the workspace's folder");
    std::fs::write(&root, b"not a folder").expect("a file in its place");
    let in_memory = indexes.create().expect("an index without its folder");
    let found = fill(&in_memory);
    assert_eq!(
        found,
        (0..n as i64)
            .filter(|i| i % 3 == 2)
            .map(|i| i + 1)
            .collect::<Vec<_>>(),
        "every chunk with the word, from memory"
    );
    assert_eq!(in_memory.mapped_bytes(), 0, "nothing on disk");

    std::fs::remove_file(&root).expect("remove the file");
    std::fs::create_dir(&root).expect("the folder back");
    let on_disk = indexes.create().expect("an index in its folder");
    assert_eq!(fill(&on_disk), found, "the same answers from disk");
    assert!(on_disk.mapped_bytes() > 0, "its postings mapped from disk");
    assert_eq!(std::fs::read_dir(&root).expect("ws").count(), 1);
    drop(on_disk);
    assert_eq!(
        std::fs::read_dir(&root).expect("ws").count(),
        0,
        "its folder removed with it"
    );
}

/// Lexical search skips what cannot reach the top k (block-max WAND):
/// what it returns is exactly the best k of every match scored, with a
/// filter and after removals too.
#[test]
fn a_pruned_lexical_search_returns_the_best_of_every_match() {
    let (n, dim) = (5000, 8);
    let vs = vectors(n, dim, 11);
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    let words = [
        "cell", "protein", "gene", "the", "of", "tumour", "receptor", "binding", "mouse", "acid",
    ];
    let mut r = 7u64;
    let mut next = || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r
    };
    let chunks: Vec<(Chunk, Vec<f32>)> = (0..n)
        .map(|i| {
            // Common words in most chunks, rare ones in few, lengths varied.
            let len = 3 + (next() % 20) as usize;
            let text: Vec<&str> = (0..len)
                .map(|_| {
                    let x = next() % 100;
                    words[if x < 60 {
                        3 + (x % 2) as usize
                    } else {
                        (x % 10) as usize
                    }]
                })
                .collect();
            (
                entry(i as i64 + 1, &text.join(" "), json!({"odd": (i + 1) % 2})),
                vs[i].clone(),
            )
        })
        .collect();
    for part in chunks.chunks(1000) {
        idx.add(part.to_vec()).expect("add");
    }
    idx.remove(&(1..=500).step_by(3).collect::<Vec<_>>())
        .expect("remove");
    let odd = idx.allowed(&Filter::parse(&json!({"odd": 1}), "filter").expect("filter"));
    let cancel = Cancel::new();
    for q in [
        "the cell of the mouse",
        "protein binding",
        "tumour receptor acid gene",
        "of",
    ] {
        for allowed in [&Allowed::All, &odd] {
            let every = idx.lexical_search(q, n, allowed, &cancel).expect("all");
            assert!(every.len() > 100, "{q}: {} matches", every.len());
            for h in &every {
                assert!(
                    h.chunk_id > 500 || (h.chunk_id - 1) % 3 != 0,
                    "a removed chunk"
                );
                if !matches!(allowed, Allowed::All) {
                    assert_eq!(h.chunk_id % 2, 1, "a chunk the filter leaves out");
                }
            }
            for k in [1, 5, 10, 50] {
                let top = idx.lexical_search(q, k, allowed, &cancel).expect("top");
                assert_eq!(top.len(), k);
                // The pruned walk adds a document's term scores in another
                // order: the last bit of a score may differ, and so may the
                // order of near-equal ones.
                let near = |a: f32, b: f32| (a - b).abs() <= 1e-5 * a.abs().max(1.0);
                for (i, (a, b)) in top.iter().zip(&every).enumerate() {
                    assert!(
                        near(a.score, b.score),
                        "{q}, k {k}: rank {i}: {} against {}",
                        a.score,
                        b.score
                    );
                }
                let cut = every[k - 1].score;
                let score_of: std::collections::HashMap<i64, f32> =
                    every.iter().map(|h| (h.chunk_id, h.score)).collect();
                let got: HashSet<i64> = top.iter().map(|h| h.chunk_id).collect();
                for h in &every {
                    if h.score > cut && !near(h.score, cut) {
                        assert!(
                            got.contains(&h.chunk_id),
                            "{q}, k {k}: chunk {} ({}) missing",
                            h.chunk_id,
                            h.score
                        );
                    }
                }
                for h in &top {
                    let full = score_of[&h.chunk_id];
                    assert!(
                        full >= cut || near(full, cut),
                        "{q}, k {k}: chunk {} ({full}) below the k-th ({cut})",
                        h.chunk_id
                    );
                }
            }
        }
    }
}

/// A top-k BM25 search over many segments answers what the full ranking's
/// first k are: the segments walked later start from the k-th best score
/// of those before (a shared threshold), which must skip nothing that
/// belongs in the top k, with or without a filter, at any k.
#[test]
fn a_top_k_over_many_segments_is_the_full_rankings_first_k() {
    let dim = 4;
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    let mut r = Rng(0x5e6);
    let words = ["common", "rare", "granite", "shale", "quartz", "mica"];
    // Twelve writes: twelve commits, so a dozen segments (a write merges
    // some, never all).
    for batch in 0..12i64 {
        let chunks = (0..80i64)
            .map(|i| {
                let id = batch * 80 + i + 1;
                let text: Vec<&str> = (0..3 + r.next() % 20)
                    .map(|_| words[(r.next() % 6) as usize])
                    .collect();
                let v: Vec<f32> = (0..dim).map(|_| r.gauss()).collect();
                (
                    entry(id, &text.join(" "), json!({"group": id % 3})),
                    normalise(v),
                )
            })
            .collect();
        idx.add(chunks).expect("add");
    }
    let cancel = Cancel::new();
    let some = idx.allowed(&ragtime_retrieve::parse_filter(&json!({"group": 1})).expect("f"));
    for q in ["common", "granite shale", "rare mica quartz", "common rare"] {
        for allowed in [&Allowed::All, &some] {
            let full = idx
                .lexical_search(q, 10_000, allowed, &cancel)
                .expect("full");
            assert!(full.len() > 100, "{q}: {} matches", full.len());
            for k in [1, 3, 10, 50] {
                let top = idx.lexical_search(q, k, allowed, &cancel).expect("top");
                let want: Vec<(i64, f32)> =
                    full.iter().take(k).map(|h| (h.chunk_id, h.score)).collect();
                let got: Vec<(i64, f32)> = top.iter().map(|h| (h.chunk_id, h.score)).collect();
                // tantivy's block-max walk adds a document's term scores in
                // the order its skips leave the terms in, so a score can
                // differ in its last bit between two walks (0.7807586
                // against 0.7807587 seen), and two documents within a bit
                // of each other can swap. Every score in place, and every
                // document clear of the k-th score, must be the same.
                const EPS: f32 = 1e-5;
                assert_eq!(got.len(), want.len(), "{q} at k {k}");
                for (g, w) in got.iter().zip(&want) {
                    assert!((g.1 - w.1).abs() <= EPS, "{q} at k {k}: {got:?} / {want:?}");
                }
                let kth = want.last().map_or(0.0, |w| w.1);
                let clear = |v: &[(i64, f32)]| -> HashSet<i64> {
                    v.iter().filter(|h| h.1 > kth + EPS).map(|h| h.0).collect()
                };
                assert_eq!(clear(&got), clear(&want), "{q} at k {k}");
            }
        }
    }
}

/// The shared filter suite (the database engine runs the same one): each
/// filter allows exactly the documents `Filter::matches` selects over
/// their metadata as written, here where metadata are kept by field; and
/// each document's metadata reads back as written (to its text: -0.0
/// stays -0.0). Every document is there twice, the second time with a
/// key of its own beside the shared ones (so that the two share their
/// fields' values, not their whole metadata), and the first a third time
/// (its whole metadata shared); checked before and after a
/// snapshot, and after the second half is removed and written again with
/// its neighbour's metadata (values freed and taken again while others
/// hold them).
#[test]
fn filters_select_exactly_what_the_filter_language_selects() {
    use ragtime_testkit::filters::{filters, metadata};
    let dim = 8;
    let metas = metadata();
    let n = metas.len();
    let with_own_key = |i: usize, own: usize| {
        let mut m = metas[i].clone();
        if let Some(o) = m.as_object_mut() {
            o.insert("own".into(), json!(own));
        }
        m
    };
    let add = |idx: &CollectionIndex, docs: &[(usize, serde_json::Value)]| {
        idx.add(
            docs.iter()
                .map(|(d, meta)| {
                    let id = *d as i64 + 1;
                    let chunk = part(id, id, 0, "T", "a shared word", meta.clone());
                    (chunk, unit(dim, d % dim))
                })
                .collect(),
        )
        .expect("add");
    };
    let check = |index: &CollectionIndex, written: &[serde_json::Value], when: &str| {
        for (d, want) in written.iter().enumerate() {
            let got = index.chunk(d as i64 + 1).expect("chunk");
            assert_eq!(
                got.metadata.to_string(),
                want.to_string(),
                "{when}: document {d}'s metadata"
            );
        }
        for f in filters() {
            let filter = Filter::parse(&f, "filter").expect("parse");
            let want: Vec<usize> = (0..written.len())
                .filter(|&d| filter.matches(&written[d]))
                .map(|d| d + 1)
                .collect();
            let got = match index.allowed(&filter) {
                Allowed::Only(set) => set.documents.to_vec(),
                Allowed::All => (1..=written.len()).collect(),
            };
            assert_eq!(got, want, "{when}: {f}");
        }
    };
    // And the first document's metadata once more, whole.
    let mut written: Vec<serde_json::Value> = (0..2 * n)
        .map(|d| {
            if d < n {
                metas[d].clone()
            } else {
                with_own_key(d - n, d)
            }
        })
        .chain([metas[0].clone()])
        .collect();
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    add(
        &idx,
        &written.iter().cloned().enumerate().collect::<Vec<_>>(),
    );
    check(&idx, &written, "written");
    let dir = tempfile::tempdir().expect("tempdir");
    idx.save(dir.path()).expect("save");
    let loaded =
        CollectionIndex::load(dir.path(), dim, DenseParams::default(), None).expect("load");
    check(&loaded, &written, "opened from its snapshot");
    let second: Vec<i64> = (n..2 * n).map(|d| d as i64 + 1).collect();
    idx.remove(&second).expect("remove");
    let again: Vec<(usize, serde_json::Value)> = (n..2 * n)
        .map(|d| (d, with_own_key((d + 1) % n, d)))
        .collect();
    add(&idx, &again);
    for (d, meta) in again {
        written[d] = meta;
    }
    check(&idx, &written, "rewritten");
}

/// The filter cache is bounded in bytes, not only in entries: filters
/// that each allow every chunk fill it to its bound and no further, and
/// each still answers its own set.
#[test]
fn the_filter_cache_is_bounded_in_bytes() {
    let dim = 8;
    let vs = vectors(3000, dim, 5);
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| (entry(i as i64 + 1, "x", json!({"b": i})), v.clone()))
            .collect(),
    )
    .expect("add");
    let cap = 1024 * 1024;
    idx.set_filter_cache_bytes(cap);
    for k in 0..100 {
        // Each allows all 3,000 chunks: about 48 KB of numbers.
        let f = Filter::parse(&json!({"b": {"$gte": -k}}), "f").expect("f");
        assert_eq!(idx.allowed(&f).count(3000), 3000);
        assert!(
            idx.filter_cache_bytes() <= cap,
            "{} bytes",
            idx.filter_cache_bytes()
        );
    }
    assert!(idx.filter_cache_bytes() > cap / 2, "the cache is used");
    // One set past a quarter of the bound is not kept at all.
    idx.set_filter_cache_bytes(64 * 1024);
    let f = Filter::parse(&json!({"b": {"$gte": -1000}}), "f").expect("f");
    assert_eq!(idx.allowed(&f).count(3000), 3000);
    assert!(idx.filter_cache_bytes() <= 1024 * 1024);
}

/// A filter's set is not made past its search's deadline: a cancelled
/// walk answers nothing and caches nothing; the next one answers whole.
#[test]
fn a_filter_walk_stops_once_its_search_is_cancelled() {
    let dim = 8;
    let vs = vectors(10_000, dim, 6);
    let idx = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    idx.add(
        vs.iter()
            .enumerate()
            .map(|(i, v)| (entry(i as i64 + 1, "x", json!({"b": i % 7})), v.clone()))
            .collect(),
    )
    .expect("add");
    let f = Filter::parse(&json!({"b": 3}), "f").expect("f");
    let cancelled = Cancel::new();
    cancelled.cancel();
    assert!(idx.allowed_within(&f, &cancelled).is_none());
    assert_eq!(idx.filter_cache_bytes(), 0, "nothing cached");
    let whole = idx.allowed_within(&f, &Cancel::new()).expect("answered");
    assert_eq!(whole.count(10_000), 10_000 / 7 + 1);
}

/// Documents rewritten over and over (a collection opened from its
/// snapshot, and one in memory): the chunks' words held stay within about
/// twice the live ones, on disk and in the heap, and every chunk reads its
/// latest words, lexical search finding them.
#[test]
fn rewritten_chunks_words_are_compacted_and_read_their_latest_text() {
    let (n, dim) = (100, 8);
    let vs = vectors(n, dim, 5);
    // About 10 KiB a chunk: 1 MiB live, 40 MiB written over the rounds.
    let words = |i: usize, round: usize| {
        format!(
            "chunk {i} round{round} {}",
            "filler ".repeat(1400 + (i + round) % 13)
        )
    };
    let batch = |round: usize| -> Vec<(Chunk, Vec<f32>)> {
        (0..n)
            .map(|i| {
                (
                    entry(i as i64 + 1, &words(i, round), json!({})),
                    vs[i].clone(),
                )
            })
            .collect()
    };
    let live = |round: usize| -> usize { (0..n).map(|i| words(i, round).len() + 8).sum() };
    let seed = CollectionIndex::new(dim, DenseParams::default()).expect("index");
    seed.add(batch(0)).expect("add");
    let saved = tempfile::tempdir().expect("tempdir");
    seed.save(saved.path()).expect("save");
    let work = tempfile::tempdir().expect("tempdir");
    let workspace = ragtime_retrieve::Workspace::new(work.path()).expect("workspace");
    let opened = CollectionIndex::load(
        saved.path(),
        dim,
        DenseParams::default(),
        Some(workspace.folder().expect("folder")),
    )
    .expect("load");
    for idx in [&opened, &seed] {
        let mut most = 0;
        for round in 1..=40 {
            // Rewritten in place (same chunk ids), and every fifth round
            // removed and written anew.
            if round % 5 == 0 {
                let ids: Vec<i64> = (1..=n as i64).collect();
                idx.remove(&ids).expect("remove");
            }
            idx.add(batch(round)).expect("add");
            most = most.max(idx.words_bytes());
        }
        // Twice the live words and the floor, a quarter more for a heap
        // buffer's spare capacity.
        let bound = (2 * live(40) + (4 << 20)) * 5 / 4 + (1 << 20);
        eprintln!(
            "live words {} bytes; most held over 40 rounds {most} bytes (bound {bound})",
            live(40)
        );
        assert!(most <= bound, "{most} bytes held for {} live", live(40));
        for i in [0, 37, 99] {
            let c = idx.chunk(i as i64 + 1).expect("chunk");
            assert_eq!(c.text, words(i, 40));
        }
        let hits = idx
            .lexical_search("round40", 200, &Allowed::All, &Cancel::new())
            .expect("search");
        assert_eq!(hits.len(), n);
        assert!(
            idx.lexical_search("round39", 5, &Allowed::All, &Cancel::new())
                .expect("search")
                .is_empty()
        );
    }
    // What a compacted collection saves reads back the same.
    let again = tempfile::tempdir().expect("tempdir");
    opened.save(again.path()).expect("save");
    let reopened =
        CollectionIndex::load(again.path(), dim, DenseParams::default(), None).expect("reload");
    assert_eq!(reopened.chunk(50).expect("chunk").text, words(49, 40));
}
