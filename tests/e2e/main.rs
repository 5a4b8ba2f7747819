//! The end-to-end suites that share one real control plane (etcd,
//! kube-apiserver, kube-controller-manager: `lock_janitor_testenv::shared()`),
//! one module per suite, in one test binary: kube, tokio and the test support
//! are linked once, the control plane starts once, and every test runs in one
//! parallel pool (`make test` runs it with `--test-threads=6`).
//!
//! Each test works in a namespace of its own (`fresh_namespace`), and every
//! janitor it starts is scoped to it: by `--namespace`, or by a selector no
//! other test uses (a janitor with neither would reclaim, label and restore
//! across every suite), and objects that are cluster-scoped are named after
//! that namespace or defined once in `support` (the monitoring CRDs).
//! Suites that restart or reconfigure an API server start their own and live
//! in `tests/isolated/`; the real node's suite is `tests/node.rs`.
//!
//!   cargo test --test e2e                        every suite
//!   cargo test --test e2e scan::                 one suite
//!   cargo test --test e2e scan::piped_tables     one test

use lock_janitor_testsupport as support;

mod admission;
mod admission_record;
mod auto_opt_in;
mod chart;
mod check;
mod docs;
mod fabric8;
mod ha;
mod janitor;
mod java;
mod lease_safety;
mod leases;
mod operator_lib;
mod peer_locks;
mod plugin;
mod prometheus;
mod python;
mod restore;
mod scan;
mod scopes;
mod sweeps;
mod takeover;
mod two_writers;
mod upgrade;
