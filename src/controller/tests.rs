//! Unit tests of the controller: the per-lock backoff, the refused scope's
//! backoff and the sync gate.

use super::*;

#[test]
fn errors_back_off_per_lock_with_jitter() {
    let within = |d: Duration, base: u64| {
        let b = Duration::from_secs(base);
        d >= b.mul_f64(0.8) && d <= b.mul_f64(1.2)
    };
    for _ in 0..100 {
        assert!(within(error_backoff(1), 5));
        assert!(within(error_backoff(2), 10));
        assert!(within(error_backoff(4), 40));
        assert!(within(error_backoff(7), 300), "capped");
        assert!(within(error_backoff(u32::MAX), 300));
        let r = resync_after(Duration::from_secs(300));
        assert!(r >= Duration::from_secs(225) && r <= Duration::from_secs(300));
    }
    let spread: std::collections::BTreeSet<u128> =
        (0..50).map(|_| error_backoff(3).as_millis()).collect();
    assert!(spread.len() > 1, "jittered");
}

#[test]
fn a_refused_scope_is_checked_again_from_5s_up_to_2min() {
    let within = |d: Duration, base: u64| {
        let b = Duration::from_secs(base);
        d >= b.mul_f64(0.8) && d <= b.mul_f64(1.2)
    };
    for _ in 0..100 {
        assert!(within(refused_retry(1), 5));
        assert!(within(refused_retry(2), 10));
        assert!(within(refused_retry(5), 80));
        assert!(within(refused_retry(6), 120), "capped");
        assert!(within(refused_retry(u32::MAX), 120));
    }
}

/// Before every watch has synced, a reconcile does nothing at all: no
/// API call (the client points nowhere), no judgement.
#[tokio::test]
async fn nothing_happens_before_the_watches_sync() {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let shared = Shared::new().unwrap();
    shared.readiness.expect_in("", 2);
    shared.readiness.synced_in("");
    let ctx = Context::new(
        client,
        shared.clone(),
        Settings {
            kinds: vec![crate::lock::LockKind::ConfigMap],
            selector: Selector::parse(crate::DEFAULT_SELECTOR).unwrap(),
            namespaces: vec![],
            dry_run: false,
            delete_pod: false,
            policy: Policy {
                owner_gone_grace: Duration::from_secs(30),
            },
            resync: Duration::from_secs(300),
            takeover_timeout: Duration::from_secs(300),
        },
    );
    let mut lock = LockMeta::default();
    lock.metadata.name = Some("op-lock".into());
    lock.metadata.namespace = Some("ops".into());
    let lock = Arc::new(lock);
    let action = reconcile(lock.clone(), ctx.clone(), Turn::default())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(1)));
    assert_eq!(shared.metrics.reconcile_duration.get_sample_count(), 0);

    // Once synced, the same reconcile reads live, and fails here (nothing
    // listens): an error, never a verdict.
    shared.readiness.synced_in("");
    let err = reconcile(lock, ctx, Turn::default()).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            crate::ErrorKind::Api | crate::ErrorKind::Timeout
        ),
        "{err}"
    );
    assert_eq!(shared.metrics.reconcile_duration.get_sample_count(), 1);
}

/// A watched ConfigMap keeps only the annotations some kind reads, each up
/// to the longest value its kind reads; a longer one is kept as a value
/// that reads as none, so that the lock stays its kind (unmanageable).
#[test]
fn the_watched_copy_keeps_only_what_kinds_read() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::PartialObjectMetaExt;
    let mut unread: LockMeta = ObjectMeta {
        annotations: Some([("team".to_string(), "ops".to_string())].into()),
        ..Default::default()
    }
    .into_response_partial();
    strip_cached(&mut unread);
    assert_eq!(unread.metadata.annotations, None);
    for (name, max) in crate::kinds::watched_annotations() {
        for (len, kept_as) in [(max, "x".repeat(max)), (max + 1, scope::TOO_LARGE.into())] {
            let annotations = [("team", "ops".to_string()), (name, "x".repeat(len))]
                .map(|(k, v)| (k.to_string(), v));
            let mut meta: LockMeta = ObjectMeta {
                annotations: Some(annotations.into()),
                labels: Some([("team".to_string(), "ops".to_string())].into()),
                ..Default::default()
            }
            .into_response_partial();
            strip_cached(&mut meta);
            let kept = meta.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(kept.len(), 1, "{name}: {:?}", kept.keys());
            assert!(kept[name] == kept_as, "{name}: {len} bytes");
            assert!(meta.metadata.labels.is_none());
            if len > max {
                // Still the kind that reads it, and never a lock it can
                // judge: reported, never written.
                let o = crate::kinds::Object::ConfigMapMeta(&meta.metadata);
                let k = crate::kinds::of(o);
                assert_eq!(k.watched_annotation().map(|(w, _)| w), Some(name));
                assert_eq!(k.candidate(o), None, "{name}");
                if k.judged() == crate::kinds::Judged::ByRenewals {
                    assert!(matches!(k.record(o), Some(Err(_))), "{name}");
                }
            }
        }
    }
}
