//! `[telemetry]`: logs, traces and how traces are sampled.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormatSetting {
    Auto,
    Pretty,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub log_format: LogFormatSetting,
    /// From the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (unset: no export).
    pub otlp_endpoint: Option<String>,
    /// From `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc` (default) or `http/protobuf`.
    pub otlp_protocol: String,
    /// Share of healthy requests whose trace is exported, 0 to 1 (a caller's
    /// sampled `traceparent` is honoured). Degraded requests — partial, a
    /// stage overran, shed, failed — are exported whatever it is.
    pub sample_ratio: f64,
    /// Spans of not-yet-chosen traces held until their request ends; past
    /// it spans are dropped (and counted).
    pub sample_buffer_spans: usize,
    /// The same bound in MiB (spans' text and attributes, estimated): when
    /// either is reached the oldest held traces give way.
    pub sample_buffer_mib: usize,
    /// Put the question and the answer on the request's span
    /// (`input.value`, `output.value`, at most 4 KiB each). Off by default:
    /// traces then carry no user content.
    pub capture_content: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormatSetting::Auto,
            otlp_endpoint: None,
            otlp_protocol: "grpc".into(),
            sample_ratio: 1.0,
            sample_buffer_spans: 20_000,
            sample_buffer_mib: 64,
            capture_content: false,
        }
    }
}

impl TelemetryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(invalid("telemetry.sample_ratio", "must be between 0 and 1"));
        }
        if !(100..=10_000_000).contains(&self.sample_buffer_spans) {
            return Err(invalid(
                "telemetry.sample_buffer_spans",
                "must be between 100 and 10000000",
            ));
        }
        if !(1..=4096).contains(&self.sample_buffer_mib) {
            return Err(invalid(
                "telemetry.sample_buffer_mib",
                "must be between 1 and 4096",
            ));
        }
        Ok(())
    }
}
