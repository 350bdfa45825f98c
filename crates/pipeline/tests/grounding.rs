//! The grounding check with the real all-MiniLM-L6-v2 model from `make
//! setup`: a paraphrase of a source sentence is supported; an answer that
//! names a flag no source has, or says something the sources do not, is
//! not.

use ragtime_core::{Cancel, Passage};
use ragtime_embed::{EmbedService, EmbedderOptions, OnnxEmbedder, ServiceOptions};
use ragtime_pipeline::chat::{check_grounding, embed_sources};
use std::path::PathBuf;
use std::sync::Arc;

fn service() -> EmbedService {
    let cache = std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        });
    let e = OnnxEmbedder::load(&EmbedderOptions {
        model_dir: cache.join("models/all-minilm-l6-v2"),
        ort_lib: cache.join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 1,
        max_tokens: 256,
        batch_size: 32,
        max_batch_tokens: 1024,
        passage_int8: true,
    })
    .unwrap_or_else(|e| panic!("load the model with `make setup` first: {e}"));
    EmbedService::new(e, ServiceOptions::default())
}

fn passage(id: i64, title: &str, text: &str) -> Passage {
    let c = ragtime_testkit::chunk(id, &format!("d{id}"), title, text, serde_json::json!({}));
    Passage {
        chunk: Arc::new(c),
        score: 1.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paraphrases_are_supported_and_made_up_flags_or_claims_are_not() {
    let svc = service();
    let sources = [
        passage(
            1,
            "Creating a project",
            "The new command creates a package in a new folder. It also initializes a git repository by default. If you don't want it to do that, pass --vcs none.",
        ),
        passage(
            2,
            "Type layout",
            "The size of a value is always a multiple of its alignment. A bool has a size and alignment of 1.",
        ),
    ];
    let ahead = embed_sources(&sources, &svc, Cancel::new()).await;
    assert_eq!(ahead.len(), 5, "every source sentence embedded ahead");
    let check = |answer: &'static str| {
        let svc = &svc;
        let sources = &sources;
        let ahead = &ahead;
        async move {
            let cold = check_grounding(answer, sources, &Default::default(), svc, Cancel::new())
                .await
                .expect("the check finishes without a deadline");
            let warm = check_grounding(answer, sources, ahead, svc, Cancel::new()).await;
            assert_eq!(
                Some(&cold),
                warm.as_ref(),
                "sentences embedded ahead give the same verdict"
            );
            cold
        }
    };

    let g = check(
        "By default a new git repository is set up as well; to avoid that, pass --vcs none [1].",
    )
    .await;
    assert_eq!((g.sentences, g.supported), (1, 1), "a paraphrase: {g:?}");
    assert!(g.grounded());

    let g = check("Pass --no-git to the new command to skip the repository [1].").await;
    assert_eq!(g.supported, 0, "a flag no source has: {g:?}");
    assert!(g.unsupported[0].contains("--no-git"), "{g:?}");

    let g =
        check("The compiler downloads every dependency from the internet before each build.").await;
    assert_eq!(g.supported, 0, "a claim the sources do not make: {g:?}");
    assert!(!g.grounded());

    let g = check("A bool takes one byte, and its alignment is also 1 [2].").await;
    assert_eq!(g.supported, 1, "{g:?}");
}
