//! Heap bytes per watched ConfigMap lock, by part: the lock watch's cache
//! (kube-runtime's reflector store, as the janitor strips it), the holder
//! index, the per-lock memory of a settled lock, and the metric series of
//! a reclaimed lock (one reason; kept an hour). No control plane: the parts
//! are fed 10,000 locks shaped like operator-lib's and a counting
//! allocator says what each keeps. It tells where the resident memory that
//! `make bench` measures goes (that also counts the allocator's own overhead,
//! kube-runtime's Controller and the fixed costs).
//!
//! `make bench-memory`, or `cargo run --release --example bench_memory [N]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use lock_janitor::controller::memory::Memory;
use lock_janitor::index::{HolderIndex, Index};
use lock_janitor::lock::{self, LockKey};

/// The system allocator, counting live bytes and allocations.
struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only counters are
// added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
        ALLOCS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        BYTES.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// This process's resident anonymous memory (RssAnon), in bytes: what a
/// part costs with the allocator's own overhead (0 off Linux).
fn resident() -> isize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<isize>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn live() -> (isize, isize) {
    (
        BYTES.load(Ordering::Relaxed),
        ALLOCS.load(Ordering::Relaxed),
    )
}

/// Lock `i` as a metadata-only watch delivers it, stripped as the janitor's
/// lock watch strips it.
fn lock_meta(i: usize) -> PartialObjectMeta<ConfigMap> {
    let v = serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "name": format!("operator-{i}-lock"),
            "namespace": format!("scale-{}", i % 10),
            "uid": format!("{i:08x}-1234-4abc-8def-0123456789ab"),
            "resourceVersion": format!("{}", 1_000_000 + i),
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": format!("operator-{i}"),
                "uid": format!("{i:08x}-9876-4abc-8def-0123456789ab"),
            }],
        }
    });
    let mut m: PartialObjectMeta<ConfigMap> =
        serde_json::from_value(v).expect("a valid PartialObjectMetadata");
    lock_janitor::controller::strip_cached(&mut m);
    m
}

/// Heap bytes per watched ConfigMap lock, by part (see the file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Locks to feed the parts.
    #[arg(value_name = "N", default_value_t = 10_000)]
    n: usize,
}

fn main() {
    let Args { n } = clap::Parser::parse();
    let metas: Vec<_> = (0..n).map(lock_meta).collect();
    println!("heap kept per watched lock, {n} locks (requested bytes; the allocator adds its own, in the resident column)");
    // Made before counting starts: its fixed cost is no lock's.
    let metrics = lock_janitor::metrics::Metrics::new().expect("metrics");
    let mut at = (live(), resident());
    let mut report = |part: &str| {
        let now = (live(), resident());
        println!(
            "  {part:<34} {:>6.0} B/lock {:>5.1} allocations/lock {:>6.0} B/lock resident",
            (now.0 .0 - at.0 .0) as f64 / n as f64,
            (now.0 .1 - at.0 .1) as f64 / n as f64,
            (now.1 - at.1) as f64 / n as f64
        );
        at = now;
    };

    let (reader, mut writer) = reflector::store::<PartialObjectMeta<ConfigMap>>();
    writer.apply_watcher_event(&Event::Init);
    for m in &metas {
        writer.apply_watcher_event(&Event::InitApply(m.clone()));
    }
    writer.apply_watcher_event(&Event::InitDone);
    report("lock watch cache (reflector)");

    let index = HolderIndex::default();
    for m in &metas {
        index.apply(m);
    }
    report("holder index");

    let memory = Memory::new(lock_janitor::metrics::Metrics::new().expect("metrics"));
    for m in &metas {
        let l = lock::parse(&m.metadata).expect("a lock");
        let key = LockKey::configmap(l.namespace.clone(), l.name.clone());
        memory.seed_held(&key, &l.resource_version, &l.holder);
    }
    report("memory of a settled lock");

    // A reclaimed lock's series: `lock_janitor_reclaims_total` and
    // `lock_janitor_last_reclaim_timestamp_seconds`, one each per (lock,
    // reason) reclaimed within `RECLAIM_SERIES_TTL`, and the time each was
    // touched (what the soak's RSS follows while locks are reclaimed for
    // the first time).
    for m in &metas {
        let l = lock::parse(&m.metadata).expect("a lock");
        let key = LockKey::configmap(l.namespace.clone(), l.name.clone());
        metrics.reclaimed(&key, lock_janitor::verdict::StaleReason::Evicted);
    }
    report("reclaim series of a reclaimed lock");
    drop((reader, writer, index, memory, metrics));
}
