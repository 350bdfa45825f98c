//! BEIR SciFact from `../shared/data/scifact` (or `RAGTIME_SCIFACT`): the
//! corpus, the train queries with judgements, and the split of them the
//! shared cross-encoder never saw. For benchmarks and the tests that
//! measure retrieval quality.

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

/// The 109 train queries the shared cross-encoder did not see: its
/// MODEL.md splits the 809 claims "with a fixed seed (13)" into 700 for
/// training and 109 held out — Python's `random.Random(13).shuffle` over
/// the claims in file order, the last 109 (the split whose 700 training
/// claims hold the 799 positive pairs MODEL.md states). Reproduced here
/// with Python's generator (MT19937, `init_by_array([13])`, `_randbelow`
/// by rejection on `getrandbits`).
pub fn unseen_by_reranker(queries: &[(String, String)]) -> HashSet<String> {
    let mut ids: Vec<&str> = queries.iter().map(|(id, _)| id.as_str()).collect();
    let mut mt = Mt19937::seeded(13);
    for i in (1..ids.len()).rev() {
        let j = mt.below(i as u32 + 1) as usize;
        ids.swap(i, j);
    }
    ids.iter()
        .skip(ids.len().saturating_sub(109))
        .map(|s| (*s).to_owned())
        .collect()
}

/// Python's Mersenne Twister, as `random.Random(seed)` for a seed below
/// 2^32 (written out: no crate reproduces Python's seeding).
struct Mt19937 {
    mt: [u32; 624],
    i: usize,
}

impl Mt19937 {
    fn seeded(seed: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = 19_650_218;
        for i in 1..624 {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        // init_by_array with the one-word key [seed].
        let (mut i, n) = (1usize, 624usize);
        for _ in 0..n {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(seed);
            i += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
        }
        for _ in 0..n - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        Self { mt, i: 624 }
    }

    fn next(&mut self) -> u32 {
        if self.i >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 == 1 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.i = 0;
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `_randbelow(n)`: `getrandbits(n.bit_length())` until below `n`.
    fn below(&mut self, n: u32) -> u32 {
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.next() >> (32 - k);
            if r < n {
                return r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_out_split_is_pythons() {
        // random.Random(13).random() == 0.2590084917154736 in CPython.
        let mut mt = Mt19937::seeded(13);
        let (a, b) = (mt.next() >> 5, mt.next() >> 6);
        let r = (a as f64 * 67_108_864.0 + b as f64) / 9_007_199_254_740_992.0;
        assert!((r - 0.259_008_491_715_473_6).abs() < 1e-15, "{r}");
        // The claims of SciFact's train file, shuffled as Python does.
        let queries: Vec<(String, String)> =
            (0..809).map(|i| (i.to_string(), String::new())).collect();
        let mut unseen: Vec<u32> = unseen_by_reranker(&queries)
            .iter()
            .map(|s| s.parse().unwrap_or(0))
            .collect();
        unseen.sort_unstable();
        assert_eq!(unseen.len(), 109);
        // sorted(x[700:], key=int)[:6] after random.Random(13).shuffle(x)
        // of x = [str(i) for i in range(809)].
        assert_eq!(unseen[..6], [2, 14, 30, 44, 72, 75]);
    }
}
