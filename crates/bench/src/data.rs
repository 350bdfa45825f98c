use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;

pub struct SciFact {
    /// (id, title, text)
    pub corpus: Vec<(String, String, String)>,
    /// (query id, text) for queries with judgements.
    pub queries: Vec<(String, String)>,
    pub qrels: HashMap<String, HashSet<String>>,
}

fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RAGTIME_SCIFACT") {
        return PathBuf::from(d);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.join("../../../shared/data/scifact")
}

fn s(v: &serde_json::Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_owned()
}

pub fn load_scifact() -> SciFact {
    let d = dir();
    let open = |name: &str| {
        std::fs::File::open(d.join(name))
            .unwrap_or_else(|e| panic!("{}: {e} (set RAGTIME_SCIFACT)", d.join(name).display()))
    };
    let corpus = BufReader::new(flate2::read::GzDecoder::new(open("corpus.jsonl.gz")))
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .map(|v| (s(&v, "_id"), s(&v, "title"), s(&v, "text")))
        .collect();
    let mut qrels: HashMap<String, HashSet<String>> = HashMap::new();
    for line in BufReader::new(open("qrels-train.tsv"))
        .lines()
        .map_while(Result::ok)
        .skip(1)
    {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() >= 3 && f[2].trim() != "0" {
            qrels
                .entry(f[0].to_owned())
                .or_default()
                .insert(f[1].to_owned());
        }
    }
    let queries = BufReader::new(open("queries-train.jsonl"))
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .map(|v| (s(&v, "_id"), s(&v, "text")))
        .filter(|(id, _)| qrels.contains_key(id))
        .collect();
    SciFact {
        corpus,
        queries,
        qrels,
    }
}
