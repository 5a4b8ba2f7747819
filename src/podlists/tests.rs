//! The sharing rule, its failures and the by-name read of a page.
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

fn pod(name: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p
}

type Listed = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Vec<Pod>>, Error>> + Send>>;

/// A lister whose lists each wait for a permit; it reports the hosts
/// of each list as it starts.
fn gated(
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<Vec<String>>,
    lists: Arc<AtomicUsize>,
) -> impl Fn(Vec<String>) -> Listed + Send + 'static {
    move |hosts: Vec<String>| {
        let (gate, started, lists) = (gate.clone(), started.clone(), lists.clone());
        Box::pin(async move {
            lists.fetch_add(1, Ordering::SeqCst);
            let _ = started.send(hosts.clone());
            gate.acquire().await.unwrap().forget();
            Ok(hosts.iter().map(|h| vec![pod(h)]).collect())
        })
    }
}

/// Judgements that ask while a list runs share the next one, never the
/// one under way; each gets the pods its own identity names.
#[tokio::test]
async fn a_list_under_way_is_not_joined_and_the_next_one_is_shared() {
    let lists = PodLists::default();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicUsize::new(0));

    let first = tokio::spawn({
        let (lists, l) = (
            lists.clone(),
            gated(gate.clone(), tx.clone(), count.clone()),
        );
        async move { lists.named("ns", true, "a", l).await }
    });
    assert_eq!(started.recv().await.unwrap(), vec!["a".to_string()]);

    // Two more ask while the first list runs.
    let mut later = Vec::new();
    for host in ["b", "c"] {
        let (lists, l) = (
            lists.clone(),
            gated(gate.clone(), tx.clone(), count.clone()),
        );
        later.push(tokio::spawn(async move {
            lists.named("ns", true, host, l).await
        }));
    }
    // They are waiting, not listing.
    wait_waiting(&lists, "ns", 2).await;
    assert_eq!(count.load(Ordering::SeqCst), 1, "no second list yet");

    gate.add_permits(1);
    let a = first.await.unwrap().unwrap();
    assert_eq!(a[0].metadata.name.as_deref(), Some("a"));
    // The next list starts for both at once.
    let mut next = started.recv().await.unwrap();
    next.sort();
    assert_eq!(next, vec!["b".to_string(), "c".to_string()]);
    gate.add_permits(1);
    for (h, j) in ["b", "c"].into_iter().zip(later) {
        let got = j.await.unwrap().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].metadata.name.as_deref(), Some(h));
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
    // Nobody waits: the slot is gone, and a new judgement lists anew.
    wait_idle(&lists).await;
    let (l, c) = (
        gated(gate.clone(), tx.clone(), count.clone()),
        count.clone(),
    );
    gate.add_permits(1);
    lists.named("ns", true, "d", l).await.unwrap();
    assert_eq!(c.load(Ordering::SeqCst), 3);
}

async fn wait_waiting(lists: &PodLists, ns: &str, n: usize) {
    for _ in 0..1000 {
        if lists.waiting(ns, true) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} never waited on {ns}");
}

async fn wait_idle(lists: &PodLists) {
    for _ in 0..200 {
        if lists.busy() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the slot was never released");
}

/// Other namespaces, and the budgeted client, list on their own.
#[tokio::test]
async fn namespaces_and_clients_do_not_share() {
    let lists = PodLists::default();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for (ns, urgent) in [("x", true), ("y", true), ("x", false)] {
        let (lists, l) = (
            lists.clone(),
            gated(gate.clone(), tx.clone(), count.clone()),
        );
        jobs.push(tokio::spawn(async move {
            lists.named(ns, urgent, "h", l).await
        }));
    }
    for _ in 0..3 {
        started.recv().await.unwrap();
    }
    gate.add_permits(3);
    for j in jobs {
        assert_eq!(j.await.unwrap().unwrap().len(), 1);
    }
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

/// A failed list fails every judgement that waited on it, with its
/// status; a list that panics answers with an error, and the next
/// judgement lists again.
#[tokio::test]
async fn failures_reach_every_waiter() {
    let lists = PodLists::default();
    let forbidden = |_: Vec<String>| async {
        Err(Error::Kube {
            action: "listing pods in ns".into(),
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("no", "Forbidden").with_code(403),
            )),
        })
    };
    let e = lists.named("ns", false, "a", forbidden).await.unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Forbidden);

    let panics = |_: Vec<String>| async {
        if true {
            panic!("a bug in the list");
        }
        Ok(Vec::new())
    };
    let e = lists.named("ns", false, "a", panics).await.unwrap_err();
    assert!(e.to_string().contains("unanswered"), "{e}");
    wait_idle(&lists).await;
    let short = |_: Vec<String>| async { Ok(Vec::new()) };
    let e = lists.named("ns", false, "a", short).await.unwrap_err();
    assert!(e.to_string().contains("answered 0 of 1"), "{e}");
    wait_idle(&lists).await;
    let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
    assert_eq!(lists.named("ns", false, "a", ok).await.unwrap().len(), 1);
}

/// A list task dropped before it ran (a runtime shutting down) takes
/// its slot with it: its waiters are answered, and nobody waits on a
/// slot marked running that no task serves.
#[tokio::test]
async fn a_task_that_never_ran_releases_its_slot() {
    let lists = PodLists::default();
    let key = ("ns".to_string(), true);
    let (tx, rx) = oneshot::channel();
    lock(&lists.slots).insert(
        key.clone(),
        Slot {
            running: true,
            waiting: vec![("a".into(), tx)],
        },
    );
    let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
    let task = run(
        Ended {
            slots: lists.slots.clone(),
            key,
            armed: true,
        },
        Arc::new(Semaphore::new(1)),
        ok,
    );
    drop(task);
    assert_eq!(lists.busy(), 0);
    assert!(
        rx.await.is_err(),
        "the waiter is answered by a dropped reply"
    );
    assert_eq!(lists.named("ns", true, "a", ok).await.unwrap().len(), 1);
}

/// A namespace waiting for its turn gathers every judgement that asks
/// meanwhile into its one list.
#[tokio::test]
async fn a_namespace_waiting_for_its_turn_gathers_judgements() {
    let lists = PodLists::with_turns(1);
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicUsize::new(0));
    let spawn = |ns: &'static str, host: &'static str| {
        let (lists, l) = (
            lists.clone(),
            gated(gate.clone(), tx.clone(), count.clone()),
        );
        tokio::spawn(async move { lists.named(ns, true, host, l).await })
    };
    let x = spawn("x", "a");
    assert_eq!(started.recv().await.unwrap(), vec!["a".to_string()]);
    let y: Vec<_> = ["b", "c", "d"].into_iter().map(|h| spawn("y", h)).collect();
    wait_waiting(&lists, "y", 3).await;
    assert_eq!(count.load(Ordering::SeqCst), 1, "y waits for its turn");
    gate.add_permits(1);
    x.await.unwrap().unwrap();
    let mut hosts = started.recv().await.unwrap();
    hosts.sort();
    assert_eq!(hosts, ["b", "c", "d"].map(String::from).to_vec());
    gate.add_permits(1);
    for j in y {
        assert_eq!(j.await.unwrap().unwrap().len(), 1);
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

/// A budgeted list that holds its turn (its pages paced by the idle
/// budget) never holds back a list a death makes necessary.
#[tokio::test]
async fn budgeted_lists_take_no_urgent_turn() {
    let lists = PodLists::with_turns(1);
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel();
    let count = Arc::new(AtomicUsize::new(0));
    let budgeted = tokio::spawn({
        let (lists, l) = (
            lists.clone(),
            gated(gate.clone(), tx.clone(), count.clone()),
        );
        async move { lists.named("x", false, "a", l).await }
    });
    started.recv().await.unwrap();
    let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
    assert_eq!(lists.named("y", true, "b", ok).await.unwrap().len(), 1);
    gate.add_permits(1);
    budgeted.await.unwrap().unwrap();
}

/// A pod read by name alone answers to the same identities as the pod
/// read whole: its name, its hostname, a long name cut at 63, and a
/// host-network pod's node.
#[test]
fn a_pod_read_by_name_answers_as_the_whole_pod() {
    let long = "x".repeat(70);
    let pods: Vec<Pod> = [
        serde_json::json!({"metadata": {"name": "plain", "managedFields": [{"manager": "k"}]},
                           "spec": {"containers": []}}),
        serde_json::json!({"metadata": {"name": "twin-b"},
                           "spec": {"hostname": "twin", "containers": []}}),
        serde_json::json!({"metadata": {"name": long}, "spec": {"containers": []}}),
        serde_json::json!({"metadata": {"name": "hostnet"},
                           "spec": {"hostNetwork": true, "nodeName": "node-1", "containers": []}}),
        serde_json::json!({"metadata": {"name": "nospec"}}),
        serde_json::json!({"metadata": {"generateName": "gen-"}}),
    ]
    .into_iter()
    .map(|v| serde_json::from_value(v).unwrap())
    .collect();
    let hosts = [
        "plain".to_string(),
        "twin".into(),
        "twin-b".into(),
        "x".repeat(63),
        long.clone(),
        "hostnet".into(),
        "node-1".into(),
        "nospec".into(),
        "gen-".into(),
        "other".into(),
    ];
    let mut matched = 0;
    for whole in &pods {
        let slim: SlimPod = serde_json::from_str(&serde_json::to_string(whole).unwrap()).unwrap();
        let slim = slim.into_pod();
        for h in &hosts {
            let want = crate::lock::lease::names(h, whole);
            matched += usize::from(want);
            assert_eq!(
                crate::lock::lease::names(h, &slim),
                want,
                "{h} / {:?}",
                whole.metadata.name
            );
        }
    }
    assert!(matched >= 6, "the cases match something: {matched}");
}
