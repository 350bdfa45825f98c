//! Where collections' on-disk indexes live while this process serves them.
//!
//! A [`Workspace`] is a folder of this run's own: each collection index
//! made in it takes a folder of its own ([`WorkDir`]), removed when the
//! index is dropped (a reload or an unload makes a new one; searches still
//! holding the old index read on, the kernel keeping removed files that
//! are mapped). Nothing in a workspace outlives the run that made it or is
//! read by another: the store is the durable record and a snapshot the
//! saved copy, so a workspace needs no flushing and a crash leaves only
//! garbage for the next run to remove (the caller's job: it knows which
//! runs are live).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A folder that collections' on-disk indexes are made in.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    next: AtomicU64,
}

impl Workspace {
    /// The workspace at `root` (made if missing; what it holds is left as
    /// it is: folder names continue past it).
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Self {
            root,
            next: AtomicU64::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new, empty folder for one collection index.
    pub fn folder(&self) -> std::io::Result<WorkDir> {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let path = self.root.join(n.to_string());
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(WorkDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Workspace {
    /// Removes the folder: a collection index still held somewhere reads
    /// on (its files are mapped), and a new one cannot be made.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One collection index's folder in a [`Workspace`], removed on drop.
#[derive(Debug)]
pub struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove an index folder");
        }
    }
}
