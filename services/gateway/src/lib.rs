//! The ragtime gateway: HTTP routes, start-up and the mapping of errors to
//! HTTP responses. Every request's decisions live in `ragtime-pipeline`;
//! handlers parse, call the pipeline and shape the answer.

mod app;
mod auth;
pub mod cli;
pub mod config;
pub mod error;
mod extract;
mod loader;
mod observe;
pub mod routes;
mod state;

pub use app::{Application, init_telemetry};
pub use cli::ingest_files;
pub use config::Config;
pub use loader::Overrides;
