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
    /// Run the HTTP service.
    Serve {
        /// Config file (default: ./ragtime.toml if present).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Print the effective configuration (secrets hidden) and exit.
    Config {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { config } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => return fail(&e),
            };
            ragtime_gateway::init_telemetry(&config);
            let app = match Application::build(config).await {
                Ok(app) => app,
                Err(e) => return fail(&format!("{e:#}")),
            };
            match app.run_until_stopped().await {
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
    }
}

fn fail(e: &dyn std::fmt::Display) -> std::process::ExitCode {
    eprintln!("ragtime: error: {e}");
    std::process::ExitCode::from(2)
}
