//! The heap's live bytes, for `ragtime-bench metadata`: the system
//! allocator behind `cap`'s counter. Every subcommand pays its one atomic
//! add an allocation: nanoseconds, against the milliseconds they time.

use std::alloc::System;

#[global_allocator]
static ALLOCATOR: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

/// Bytes allocated and not yet freed.
pub fn held() -> usize {
    ALLOCATOR.allocated()
}
