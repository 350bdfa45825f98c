//! The one ONNX Runtime environment of the process.

use crate::LoadError;
use ort::environment::Environment;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

static ENV: OnceLock<Environment> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Loads `libonnxruntime` from `lib` (once per process) and returns the
/// shared environment. Later calls return the first environment.
pub fn ort_environment(lib: &Path) -> Result<Environment, LoadError> {
    if let Some(env) = ENV.get() {
        return Ok(env.clone());
    }
    let _guard = INIT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(env) = ENV.get() {
        return Ok(env.clone());
    }
    if !lib.is_file() {
        return Err(LoadError::File {
            path: lib.to_owned(),
            message: "ONNX Runtime library not found (run `make setup`)".into(),
        });
    }
    let env = ort::init_from(lib)
        .map_err(|e| LoadError::File {
            path: lib.to_owned(),
            message: e.to_string(),
        })?
        .with_name("ragtime")
        .build()
        .map_err(|e| LoadError::Ort(e.to_string()))?;
    Ok(ENV.get_or_init(|| env).clone())
}
