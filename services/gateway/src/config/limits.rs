//! `[limits]`: what one tenant, and one replica, may hold and do at once.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

/// Per-tenant rate limits and quotas, and what idle collections cost
/// (`[limits]`); 0 turns a rate limit off.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Sustained requests per second per tenant on `/v1`.
    pub requests_per_s: f64,
    /// Requests a tenant may send at once before the rate applies (0: the
    /// rate, rounded up).
    pub burst: u32,
    /// Chat streams open at once per tenant.
    pub concurrent_streams: u32,
    /// Collections a tenant may have (admins set a tenant's own with
    /// `PUT /admin/tenants/{tenant}/quotas`).
    pub max_collections: i64,
    /// Documents a tenant may store over all its collections.
    pub max_documents: i64,
    /// Chunks a tenant may store over all its collections.
    pub max_chunks: i64,
    /// A collection no search has used for this long drops its in-memory
    /// indexes; its next request loads them from the store (0: never).
    pub idle_unload_s: u64,
    /// Collections whose indexes load at start, the largest first; the
    /// rest load at their first request.
    pub preload_collections: usize,
    /// Ingests (`POST /v1/documents`, uploads) running at once over all
    /// tenants; one more answers 503 `overloaded` with `Retry-After` (0:
    /// no limit). Each holds its documents' text and vectors until it
    /// commits, so this bounds ingest memory beside the embedding queue.
    pub max_concurrent_ingests: usize,
    /// Ingest jobs a replica holds, queued or running; one more answers
    /// 503 `overloaded` (0: no limit). A running job takes one of
    /// `max_concurrent_ingests`.
    pub max_jobs: usize,
    /// Jobs one tenant may hold on a replica, queued or running; one more
    /// answers 503 `overloaded` naming this setting (0: no limit).
    pub max_jobs_per_tenant: usize,
    /// The text all held jobs keep in memory until they are done (each
    /// holds its whole upload); a job that would pass it answers 503
    /// `overloaded` naming this setting (0: no limit).
    pub max_queued_job_bytes: usize,
    /// An ingest whose documents' text is larger than this (or that has
    /// more than 1,000 documents) runs as a job: 202 with its id.
    pub job_above_bytes: usize,
    /// The text one upload's files may expand to, all together, once
    /// decompressed and read (a `.jsonl.gz` of a few MiB can hold GiB);
    /// past it the upload is a 413 naming this setting.
    pub max_upload_expanded_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let q = ragtime_pipeline::corpus::Quotas::default();
        Self {
            requests_per_s: 0.0,
            burst: 0,
            concurrent_streams: 0,
            max_collections: q.max_collections,
            max_documents: q.max_documents,
            max_chunks: q.max_chunks,
            idle_unload_s: 0,
            preload_collections: 1000,
            max_concurrent_ingests: 8,
            max_jobs: 16,
            max_jobs_per_tenant: 4,
            max_queued_job_bytes: 512 * 1024 * 1024,
            job_above_bytes: 4 * 1024 * 1024,
            max_upload_expanded_bytes: 256 * 1024 * 1024,
        }
    }
}

impl LimitsConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.requests_per_s >= 0.0 && self.requests_per_s.is_finite()) {
            return Err(invalid("limits.requests_per_s", "must be 0 (off) or more"));
        }
        for (name, v) in [
            ("limits.max_collections", self.max_collections),
            ("limits.max_documents", self.max_documents),
            ("limits.max_chunks", self.max_chunks),
        ] {
            if v < 1 {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        if self.max_upload_expanded_bytes < 1024 {
            return Err(invalid(
                "limits.max_upload_expanded_bytes",
                "must be at least 1024",
            ));
        }
        Ok(())
    }
}
