use clap::{Parser, Subcommand};
use ragtime_gateway::{Application, Config};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "ragtime",
    version,
    about = "A RAG service whose whole pipeline keeps time"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service: on 127.0.0.1:8080 unless `server.addr` (or
    /// RAGTIME__SERVER__ADDR=0.0.0.0:8080) says otherwise, its store and
    /// indexes under `data_dir` (~/.local/share/ragtime, or
    /// RAGTIME__DATA_DIR). Every setting can be given as
    /// RAGTIME__SECTION__KEY (docs/configuration.md).
    Serve {
        /// Config file (default: ./ragtime.toml if present).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Listen here (host:port), over `server.addr`.
        #[arg(long, value_name = "HOST:PORT")]
        addr: Option<std::net::SocketAddr>,
    },
    /// Ingest files or folders (walked, every file of a known type) into
    /// the store: BEIR-style .jsonl / .jsonl.gz (`_id`, `title`, `text`,
    /// `metadata`), .txt, .md, .html, .pdf, .rs. A file's document id is
    /// its path from the folder given (`races.html`, `sub/page.html`), or
    /// the path of a file named itself. Licence files and tables of
    /// contents (`toc.html`) are passed over unless --include names them.
    /// A running server on the same store serves the new documents within
    /// a second.
    Ingest {
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Target collection (created if missing).
        #[arg(long, default_value = "default")]
        collection: String,
        /// Documents per transaction.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Send the files to a running server instead (its URL, e.g.
        /// http://localhost:8080): they are ingested there as jobs, whose
        /// progress is shown; Ctrl-C cancels them.
        #[arg(long, env = "RAGTIME_SERVER")]
        server: Option<String>,
        /// The API key for --server.
        #[arg(long, env = "RAGTIME_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Read only the files that match (repeatable): a pattern with a
        /// `/` matches the path from the folder given (`guide/*.html`),
        /// one without the file's name anywhere (`*.md`).
        #[arg(long, value_name = "PATTERN")]
        include: Vec<String>,
        /// Leave out the files that match (repeatable; read as --include
        /// is), e.g. `--exclude print.html --exclude '**/drafts/**'`.
        #[arg(long, value_name = "PATTERN")]
        exclude: Vec<String>,
        /// Put this before every document id (`--id-prefix nomicon/`).
        #[arg(long, value_name = "PREFIX", default_value = "")]
        id_prefix: String,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the effective configuration (secrets hidden) and exit.
    Config {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Rewrite the embedding model's graphs once and write them beside
    /// `model.onnx`, keyed by its checksum; later starts load them instead
    /// of rewriting. (A start prepares them too when they are missing.)
    PrepareModel {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Print the HTTP API's OpenAPI 3.1 document (what `GET /openapi.json`
    /// serves) and exit: generate a client without a running server.
    Openapi,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config, addr } => {
            let mut config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            if let Some(addr) = addr {
                config.server.addr = addr;
            }
            let telemetry = ragtime_gateway::init_telemetry(&config);
            let app = match Application::build(config).await {
                Ok(app) => app,
                Err(e) => return fail(&format!("{e:#}")),
            };
            let res = app.run_until_stopped().await;
            telemetry.shutdown();
            match res {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => fail(&format!("{e:#}")),
            }
        }
        Command::Ingest {
            config,
            collection,
            batch,
            server,
            api_key,
            include,
            exclude,
            id_prefix,
            files,
        } => {
            let filter = match ragtime_parse::FileFilter::new(&include, &exclude) {
                Ok(f) => f,
                Err(e) => return fail(&format!("--{}: {e}", e.list)),
            };
            if let Some(server) = server {
                let sent = ragtime_gateway::cli::ingest_remote(
                    &server,
                    api_key.as_deref(),
                    &collection,
                    &files,
                    &filter,
                    &id_prefix,
                );
                return match sent.await {
                    Ok(()) => std::process::ExitCode::SUCCESS,
                    Err(e) => fail(&format!("{e:#}")),
                };
            }
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let _telemetry = ragtime_gateway::init_telemetry(&config);
            let done = ragtime_gateway::ingest_files(
                &config,
                &collection,
                &files,
                &filter,
                &id_prefix,
                batch.max(1),
            );
            match done.await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => fail(&format!("{e:#}")),
            }
        }
        Command::Config { config } => match Config::load(config.as_deref()) {
            Ok(c) => {
                match serde_json::to_string_pretty(&c.redacted()) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(&e),
                }
                std::process::ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Openapi => {
            let doc = ragtime_gateway::routes::openapi::document();
            match serde_json::to_string_pretty(&doc) {
                Ok(s) => println!("{s}"),
                Err(e) => return fail(&e),
            }
            std::process::ExitCode::SUCCESS
        }
        Command::PrepareModel { config } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            let _telemetry = ragtime_gateway::init_telemetry(&config);
            let model = config.embed.model_dir.join("model.onnx");
            let p = match ragtime_embed::prepare::prepare(&model) {
                Ok(p) => p,
                Err(e) => return fail(&e),
            };
            let how = match p.outcome {
                ragtime_embed::prepare::Outcome::Reused => "already prepared",
                _ => "written",
            };
            println!("{} (sha256 {}): {how}", model.display(), p.sha256);
            let s = p.simplified;
            println!(
                "  queries:  {} ({} attentions, {} NaN guards, {} GELUs fused)",
                p.query.path().display(),
                s.attentions,
                s.nan_guards,
                s.gelus
            );
            match &p.passage_int8 {
                Some(g) => println!(
                    "  passages: {} ({} int8 matrix products)",
                    g.path().display(),
                    p.int8_products
                ),
                None => println!("  passages: no int8 weights, the query graph is used"),
            }
            std::process::ExitCode::SUCCESS
        }
    }
}

fn fail(e: &dyn std::fmt::Display) -> std::process::ExitCode {
    eprintln!("ragtime: error: {e}");
    std::process::ExitCode::from(2)
}
