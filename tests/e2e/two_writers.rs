//! Safety rule 6, tested: two janitors with leader election off, writing at
//! once, over many locks with seeded random fates (evicted, still running,
//! recreated under the holder's name, a takeover racing the reclaim). Ground
//! truth is the audit log: no DELETE of a lock before its holder's death was
//! written, none of a lock whose holder lives, and every stale lock
//! reclaimed exactly once (the other janitor's delete gets 404 or 409).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Evicted,
    Running,
    RecreatedSameName,
    TakeoverRace,
}

#[tokio::test]
async fn two_janitors_writing_at_once_never_delete_a_live_holders_lock() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201);
    let mut rng = fastrand::Rng::with_seed(seed);
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "two-writers").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let n = 24;
    let fates: Vec<Fate> = (0..n)
        .map(|i| match (i % 4, rng.u8(0..4)) {
            // Every fate at least n/4 times, in a shuffled order.
            (0, _) => Fate::Evicted,
            (1, _) => Fate::Running,
            (2, r) if r < 2 => Fate::RecreatedSameName,
            (2, _) => Fate::Evicted,
            _ => Fate::TakeoverRace,
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    for i in 0..n {
        let p = running_pod(&client, &ns, &format!("p{i}"), &node).await;
        create_lock(&client, &lock_for(&format!("l{i}"), &p, true)).await;
    }
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = ["--namespace", ns.as_str(), "--resync", "2s"];
    let a = Janitor::start(&kc, &args).await;
    let b = Janitor::start(&kc, &args).await;

    // When each holder's death began to be written (deletes must follow).
    let mut died: BTreeMap<String, Timestamp> = BTreeMap::new();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for &i in &order {
        let (pod, lock) = (format!("p{i}"), format!("l{i}"));
        match fates[i] {
            Fate::Evicted => {
                died.insert(lock, Timestamp::now());
                kubelet::set_failed(&client, &ns, &pod, "Evicted", "test")
                    .await
                    .unwrap();
            }
            Fate::Running => {}
            Fate::RecreatedSameName => {
                kubelet::force_delete_pod(&client, &ns, &pod).await.unwrap();
                running_pod(&client, &ns, &pod, &node).await;
            }
            Fate::TakeoverRace => {
                died.insert(lock.clone(), Timestamp::now());
                kubelet::set_failed(&client, &ns, &pod, "Preempting", "test")
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(rng.u64(0..100))).await;
                // Whoever comes first: the janitors, or this replica.
                let _ = cms.delete(&lock, &DeleteParams::default()).await;
                let heir = running_pod(&client, &ns, &format!("heir{i}"), &node).await;
                cms.create(&Default::default(), &lock_for(&lock, &heir, false))
                    .await
                    .unwrap_or_else(|e| panic!("seed {seed}: the heir could not take {lock}: {e}"));
            }
        }
    }
    // Every evicted holder's lock goes.
    for i in (0..n).filter(|i| fates[*i] == Fate::Evicted) {
        let lock = format!("l{i}");
        wait_for(
            &format!("{lock} reclaimed"),
            Duration::from_secs(60),
            || async { (!lock_exists(&client, &ns, &lock).await).then_some(()) },
        )
        .await;
    }
    a.wait_sweeps(2).await;
    b.wait_sweeps(2).await;

    let deletes: Vec<_> = writes_by(cp, JANITOR_USER, &ns)
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource.as_deref() == Some("configmaps"))
        .collect();
    let mut reclaimed: BTreeMap<String, usize> = BTreeMap::new();
    for d in &deletes {
        let lock = d.name.clone().unwrap_or_default();
        if d.code != Some(200) {
            assert!(matches!(d.code, Some(404 | 409)), "{d:?}");
            continue;
        }
        *reclaimed.entry(lock.clone()).or_default() += 1;
        let i: usize = lock.trim_start_matches('l').parse().unwrap();
        assert!(
            matches!(fates[i], Fate::Evicted | Fate::TakeoverRace),
            "seed {seed}: {lock} ({:?}) deleted although its holder lives: {d:?}",
            fates[i]
        );
        let at: Timestamp = d.received.as_deref().unwrap().parse().unwrap();
        assert!(
            at > died[&lock],
            "seed {seed}: {lock} deleted at {at} before its holder's death at {}",
            died[&lock]
        );
    }
    for (i, fate) in fates.iter().enumerate() {
        let lock = format!("l{i}");
        match fate {
            Fate::Evicted => assert_eq!(
                reclaimed.get(&lock),
                Some(&1),
                "seed {seed}: {lock} reclaimed once: {deletes:?}"
            ),
            Fate::Running => assert!(
                lock_exists(&client, &ns, &lock).await,
                "seed {seed}: {lock}"
            ),
            Fate::RecreatedSameName => {
                assert!(!reclaimed.contains_key(&lock), "seed {seed}: {lock}")
            }
            Fate::TakeoverRace => {
                // The heir's lock lives on: its holder runs.
                let cm = cms
                    .get_opt(&lock)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("seed {seed}: the heir's {lock} was deleted"));
                let owner = &cm.metadata.owner_references.unwrap()[0];
                assert_eq!(owner.name, format!("heir{i}"), "seed {seed}");
                assert!(
                    reclaimed.get(&lock).copied().unwrap_or(0) <= 1,
                    "seed {seed}: {lock}"
                );
            }
        }
    }
    println!(
        "seed {seed}: {} locks, {} reclaimed by two janitors at once, {} refused deletes (404/409)",
        n,
        reclaimed.len(),
        deletes.iter().filter(|d| d.code != Some(200)).count()
    );
}
