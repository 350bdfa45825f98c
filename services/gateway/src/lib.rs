//! The ragtime gateway: HTTP routes, start-up and the mapping of errors to
//! HTTP responses. The pipeline's decisions live in `ragtime-pipeline`.

pub mod config;
pub mod error;
mod experiment;
mod extract;
pub mod files;
mod observe;
mod routes;
mod startup;
mod state;
mod tenant;

pub use config::Config;
pub use startup::{Application, ingest_files, init_telemetry};
