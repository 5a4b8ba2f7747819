//! The end-to-end suites that start a control plane of their own, because
//! they restart its API server (`health`), run it without the garbage
//! collector (`no_gc`), give it nodes of their own (`nodes`) or inject faults
//! into it (`chaos`). One test binary, so they link once; `make test` runs it
//! beside `tests/e2e/` with fewer threads, since each test here starts its
//! own etcd, kube-apiserver and kube-controller-manager.
//!
//!   cargo test --test isolated                   every suite
//!   cargo test --test isolated health::          one suite

use lock_janitor_testsupport as support;
use lock_janitor_testsupport::chaos_engine;

mod chaos;
mod health;
mod no_gc;
mod nodes;
