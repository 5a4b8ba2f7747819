//! The end-to-end suites that start a control plane of their own, because
//! they restart its API server (`health`), run it without the garbage
//! collector (`no_gc`), give it nodes of their own (`nodes`) or inject faults
//! into it (`chaos`). One test binary, so they link once; `make test` runs it
//! beside `tests/e2e/` with fewer threads, since each test here starts its
//! own etcd, kube-apiserver and kube-controller-manager.
//!
//!   cargo test --test isolated                   every suite
//!   cargo test --test isolated health::          one suite

#[path = "../chaos_engine/mod.rs"]
mod chaos_engine;
#[path = "../support/mod.rs"]
mod support;

mod chaos;
mod health;
mod no_gc;
mod nodes;
