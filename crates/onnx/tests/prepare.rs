//! Preparing the real all-MiniLM-L6-v2 model from `make setup`, in
//! copies of it in temporary folders.

use prost::Message;
use ragtime_onnx::prepare::{
    Outcome, PrepareError, Prepared, PreparedGraph, load_or_prepare, prepare, prepare_in_memory,
};
use ragtime_onnx::{Simplified, decode_model};
use std::path::{Path, PathBuf};

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn setup_model() -> PathBuf {
    let path = cache().join("models/all-minilm-l6-v2/model.onnx");
    assert!(
        path.is_file(),
        "run `make setup` first: no {}",
        path.display()
    );
    path
}

/// A temporary folder holding a copy of the setup model.
fn copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("model.onnx");
    std::fs::copy(setup_model(), &model).expect("copy the model");
    (dir, model)
}

/// The file names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn file(g: &PreparedGraph) -> &Path {
    match g {
        PreparedGraph::File(p) => p,
        PreparedGraph::Memory { path, .. } => panic!("{} is in memory", path.display()),
    }
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .expect("mtime")
}

const SETUP: Simplified = Simplified {
    attentions: 6,
    nan_guards: 0,
    gelus: 6,
};

/// The typed messages hold every field of the setup model: decoding and
/// encoding it gives back the same bytes.
#[test]
fn the_setup_model_round_trips_byte_for_byte() {
    let bytes = std::fs::read(setup_model()).expect("model");
    let model = decode_model(bytes.clone().into()).expect("decode");
    assert_eq!(model.encode_to_vec(), bytes);
}

#[test]
fn prepare_writes_the_graphs_beside_the_model_keyed_by_its_checksum() {
    let (dir, model) = copy();
    let p = prepare(&model).expect("prepare");
    assert_eq!(p.outcome, Outcome::Written);
    assert_eq!(p.simplified, SETUP);
    assert_eq!(p.int8_products, 36);
    assert_eq!(p.sha256.len(), 64);
    let key = &p.sha256[..16];
    let query = format!("model.{key}.query.onnx");
    let passage = format!("model.{key}.passage-int8.onnx");
    let manifest = format!("model.{key}.prepared.json");
    assert_eq!(file(&p.query), dir.path().join(&query));
    let int8 = p.passage_int8.as_ref().expect("int8 graph");
    assert_eq!(file(int8), dir.path().join(&passage));
    // Only the three files: no temporary file is left behind.
    let mut want = vec!["model.onnx".to_owned(), manifest, passage, query];
    want.sort();
    assert_eq!(listing(dir.path()), want);
    // The files hold the rewritten graphs: nothing is left to rewrite.
    let mut q = decode_model(std::fs::read(file(&p.query)).expect("read").into()).expect("decode");
    assert_eq!(ragtime_onnx::simplify(&mut q), Ok(Simplified::default()));
    let mut i = decode_model(std::fs::read(file(int8)).expect("read").into()).expect("decode");
    assert_eq!(ragtime_onnx::int8_matmuls(&mut i), Ok(0));
    // And they are the graphs preparing in memory gives.
    let m = prepare_in_memory(&model).expect("in memory");
    assert_eq!(m.outcome, Outcome::InMemory);
    let bytes = |g: &PreparedGraph| match g {
        PreparedGraph::Memory { bytes, .. } => bytes.clone(),
        PreparedGraph::File(f) => std::fs::read(f).expect("read"),
    };
    assert_eq!(bytes(&m.query), bytes(&p.query));
    assert_eq!(m.passage_int8.as_ref().map(bytes), Some(bytes(int8)));
}

#[test]
fn a_second_call_reuses_the_prepared_files() {
    let (dir, model) = copy();
    let first = prepare(&model).expect("prepare");
    let files = listing(dir.path());
    let written = mtime(file(&first.query));
    std::thread::sleep(std::time::Duration::from_millis(20));
    for again in [
        prepare(&model).expect("again"),
        load_or_prepare(&model).expect("load"),
    ] {
        assert_eq!(again.outcome, Outcome::Reused);
        assert_eq!(again.simplified, SETUP);
        assert_eq!(again.int8_products, 36);
        assert_eq!(file(&again.query), file(&first.query));
        assert_eq!(mtime(file(&again.query)), written, "not rewritten");
    }
    assert_eq!(listing(dir.path()), files);
}

#[test]
fn a_changed_model_gets_new_files_and_the_old_ones_go() {
    let (dir, model) = copy();
    let old = prepare(&model).expect("prepare");
    // Another model: the same graph under another version number.
    let mut m = decode_model(std::fs::read(&model).expect("read").into()).expect("decode");
    m.model_version = Some(m.model_version.unwrap_or(0) + 1);
    std::fs::write(&model, m.encode_to_vec()).expect("write");
    let new = prepare(&model).expect("prepare the new model");
    assert_eq!(new.outcome, Outcome::Written);
    assert_ne!(new.sha256, old.sha256);
    assert_ne!(file(&new.query), file(&old.query));
    assert_eq!(new.simplified, SETUP);
    let key = &new.sha256[..16];
    assert!(
        listing(dir.path())
            .iter()
            .all(|f| f == "model.onnx" || f.contains(key)),
        "stale files left: {:?}",
        listing(dir.path())
    );
    assert_eq!(listing(dir.path()).len(), 4);
}

/// A damaged prepared file (here cut short) is not reused.
#[test]
fn a_truncated_prepared_file_is_prepared_again() {
    let (_dir, model) = copy();
    let first = prepare(&model).expect("prepare");
    let q = file(&first.query);
    let bytes = std::fs::read(q).expect("read");
    std::fs::write(q, &bytes[..bytes.len() / 2]).expect("truncate");
    let again = prepare(&model).expect("again");
    assert_eq!(again.outcome, Outcome::Written);
    assert_eq!(std::fs::read(q).expect("read"), bytes);
}

/// When the graphs cannot be written, `prepare` fails and
/// `load_or_prepare` prepares in memory. (Tests run as root, so a
/// read-only folder would not stop them: a folder in the way of the query
/// graph does.)
#[test]
fn an_unwritable_folder_falls_back_to_memory() {
    let (dir, model) = copy();
    let sha = ragtime_onnx::prepare::sha256_hex(&std::fs::read(&model).expect("read"));
    let blocked = dir.path().join(format!("model.{}.query.onnx", &sha[..16]));
    std::fs::create_dir_all(blocked.join("in-the-way")).expect("mkdir");
    let e = prepare(&model).expect_err("cannot write");
    assert!(matches!(e, PrepareError::Io { .. }), "{e}");
    let p: Prepared = load_or_prepare(&model).expect("in memory");
    assert_eq!(p.outcome, Outcome::InMemory);
    assert_eq!(p.simplified, SETUP);
    assert!(matches!(p.query, PreparedGraph::Memory { .. }));
    assert!(matches!(p.passage_int8, Some(PreparedGraph::Memory { .. })));
    // No temporary files are left behind.
    assert!(
        listing(dir.path()).iter().all(|f| !f.ends_with(".tmp")),
        "{:?}",
        listing(dir.path())
    );
}

/// Processes starting together prepare the same files at once: each gets
/// whole graphs.
#[test]
fn concurrent_preparations_all_get_whole_graphs() {
    let (dir, model) = copy();
    let runs: Vec<Prepared> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3).map(|_| s.spawn(|| prepare(&model))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join").expect("prepare"))
            .collect()
    });
    let want = prepare_in_memory(&model).expect("in memory");
    let PreparedGraph::Memory { bytes, .. } = &want.query else {
        panic!("in memory")
    };
    for r in &runs {
        assert_eq!(&std::fs::read(file(&r.query)).expect("read"), bytes);
    }
    assert_eq!(listing(dir.path()).len(), 4);
}
