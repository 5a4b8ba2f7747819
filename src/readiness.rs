//! Readiness: every watch has listed once, and shutdown has not started.
//! What `/readyz` answers and what gates every write (safety rule 4).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A count of watches that have not finished their first list, and a flag
/// raised when shutdown starts.
#[derive(Debug, Default)]
pub struct Readiness {
    unsynced: AtomicUsize,
    registered: AtomicBool,
    shutting_down: AtomicBool,
}

impl Readiness {
    /// Declares `n` watches that must each call `synced` once.
    pub fn expect(&self, n: usize) {
        self.unsynced.fetch_add(n, Ordering::SeqCst);
        self.registered.store(true, Ordering::SeqCst);
    }
    pub fn synced(&self) {
        self.unsynced.fetch_sub(1, Ordering::SeqCst);
    }
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }
    /// Every declared watch has listed once.
    pub fn is_synced(&self) -> bool {
        self.registered.load(Ordering::SeqCst) && self.unsynced.load(Ordering::SeqCst) == 0
    }
    pub fn is_ready(&self) -> bool {
        self.is_synced() && !self.shutting_down.load(Ordering::SeqCst)
    }
}
