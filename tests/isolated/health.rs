//! Never "looks healthy, does nothing": a janitor whose watches start failing
//! after start-up (here: its RBAC binding removed, then the API server
//! restarted so that open watches must reconnect) turns not ready within a
//! minute and counts the errors; once RBAC is restored it is ready again.
//! Own control plane (the API server is restarted).

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::DeleteParams;
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, ControlPlane, Options};

#[tokio::test]
async fn failing_watches_turn_readiness_off_and_back_on() {
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "health").await;
    let leader = running_pod(&client, &ns, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    let user = "health-janitor";
    bind_cluster_role(&client, user, JANITOR_USER).await;
    let j = Janitor::start(&kubeconfig_as(&cp, user), &["--resync", "5s"]).await;
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(1.0), "{m}");
    let errors = |m: &str| {
        sample(
            m,
            "lock_janitor_watch_errors_total",
            &[("resource", "configmaps")],
        )
        .unwrap_or(0.0)
            + sample(
                m,
                "lock_janitor_watch_errors_total",
                &[("resource", "pods")],
            )
            .unwrap_or(0.0)
    };
    assert_eq!(errors(&m), 0.0, "{m}");

    // RBAC taken away; the API server restarts, so every watch reconnects.
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(user, &DeleteParams::default())
        .await
        .unwrap();
    cp.restart_apiserver()
        .await
        .expect("restart kube-apiserver");
    let (code, body) = wait_for("/readyz 503", Duration::from_secs(120), || async {
        let (code, body) = http_get(j.port, "/readyz").await.ok()?;
        (code == 503).then_some((code, body))
    })
    .await;
    assert_eq!(code, 503);
    assert!(body.contains("failing for more than a minute"), "{body}");
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(0.0), "{m}");
    assert!(errors(&m) > 0.0, "{m}");
    assert!(j.logs().contains("watch failing"), "{}", j.logs());

    // Restored: ready again, without a restart of the janitor.
    bind_cluster_role(&client, user, JANITOR_USER).await;
    wait_for("/readyz 200 again", Duration::from_secs(120), || async {
        (j.readyz().await == Some(200)).then_some(())
    })
    .await;
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(1.0), "{m}");
}

/// Grants `user` the leader-election Lease of namespace `ns`.
async fn grant_election(client: &kube::Client, ns: &str, user: &str) {
    let verbs = ["get", "create", "update"];
    let rules = vec![rule(&["coordination.k8s.io"], &["leases"], &verbs)];
    grant_in(
        client,
        ns,
        &format!("election-{user}"),
        crate::support::user(user),
        rules,
    )
    .await;
}

async fn leading(j: &Janitor) -> bool {
    sample(&j.metrics().await, "lock_janitor_leader", &[]) == Some(1.0)
}

/// The leader's watches fail (its user loses RBAC, the API server restarts
/// so the open watches end) while its election client still renews: once
/// it has been not ready past the minute, it hands the Lease over and the
/// ready standby leads and reclaims. Own control plane.
#[tokio::test]
async fn a_leader_whose_watches_fail_hands_over_to_the_ready_standby() {
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "handover").await;
    let (ua, ub) = ("janitor-a", "janitor-b");
    for u in [ua, ub] {
        bind_cluster_role(&client, u, JANITOR_USER).await;
        grant_election(&client, &ns, u).await;
    }
    let args = [
        "--namespace",
        ns.as_str(),
        "--leader-elect",
        "--leader-elect-namespace",
        ns.as_str(),
        "--resync",
        "5s",
    ];
    let a = Janitor::start(&kubeconfig_as(&cp, ua), &args).await;
    wait_for("a leads", Duration::from_secs(40), || async {
        leading(&a).await.then_some(())
    })
    .await;
    let b = Janitor::start(&kubeconfig_as(&cp, ub), &args).await;
    assert!(!leading(&b).await, "b stands by");

    // Only a's watches fail: its RBAC for the locks and pods is gone; its
    // election Role stays, so its lease is still renewed.
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(ua, &DeleteParams::default())
        .await
        .unwrap();
    cp.restart_apiserver()
        .await
        .expect("restart kube-apiserver");
    wait_for("b leads", Duration::from_secs(150), || async {
        leading(&b).await.then_some(())
    })
    .await;
    assert!(!leading(&a).await, "{}", a.logs());
    assert!(
        a.logs()
            .contains("offering the leader lease to a ready replica"),
        "{}",
        a.logs()
    );
    // And b does the work.
    let leader = running_pod(&client, &ns, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    lock_janitor_testenv::kubelet::set_failed(&client, &ns, "leader", "Evicted", "test")
        .await
        .unwrap();
    wait_for("op-lock reclaimed", Duration::from_secs(30), || async {
        (!lock_exists(&client, &ns, "op-lock").await).then_some(())
    })
    .await;
    b.wait_said("stale lock reclaimed").await;
}

/// Nothing swallowed: an election that cannot create its Lease counts
/// lock_janitor_leader_renew_errors_total and says so. (A failing sweep:
/// `a_failing_sweep_is_counted_and_said`.)
#[tokio::test]
async fn election_failures_are_counted() {
    let cp = lock_janitor_testenv::shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "swallowed").await;
    let user = format!("swallowed-{ns}");
    // Leases to watch, but not creating its election Lease; pods for now.
    let read = ["get", "list", "watch"];
    let leases = vec![rule(&["coordination.k8s.io"], &["leases"], &read)];
    grant_in(
        &client,
        &ns,
        "leases-only",
        crate::support::user(&user),
        leases,
    )
    .await;
    let pods = vec![rule(&[""], &["pods"], &read)];
    grant_in(&client, &ns, "pods", crate::support::user(&user), pods).await;
    let j = Janitor::start(
        &kubeconfig_as(cp, &user),
        &[
            "--namespace",
            &ns,
            "--lock-kinds",
            "lease",
            "--leader-elect",
            "--leader-elect-namespace",
            &ns,
            "--resync",
            "1s",
        ],
    )
    .await;
    wait_for(
        "the failure counted and said",
        Duration::from_secs(60),
        || async {
            let m = j.metrics().await;
            let renew = sample(&m, "lock_janitor_leader_renew_errors_total", &[]).unwrap_or(0.0);
            (renew > 0.0
                && j.logs()
                    .contains("could not renew or acquire the leader lease"))
            .then_some(())
        },
    )
    .await;
}

/// A leader's sweep that cannot read pods (RBAC taken away after start-up)
/// counts as a pod watch error and is said under the sweep's own name.
#[tokio::test]
async fn a_failing_sweep_is_counted_and_said() {
    let s = crate::support::lease::scenario("sweep-fails").await;
    let user = format!("sweep-fails-{}", s.ns);
    let read = ["get", "list", "watch"];
    let leases = vec![rule(&["coordination.k8s.io"], &["leases"], &read)];
    grant_in(
        &s.client,
        &s.ns,
        "leases",
        crate::support::user(&user),
        leases,
    )
    .await;
    let pods = vec![rule(&[""], &["pods"], &read)];
    grant_in(&s.client, &s.ns, "pods", crate::support::user(&user), pods).await;
    // A Lease lock for the sweep to look at: its holder's terminal pods.
    s.pod("op-0").await;
    s.lease("op-lease", "op-0", 0, true).await;
    let j = Janitor::start(
        &kubeconfig_as(s.cp, &user),
        &[
            "--namespace",
            &s.ns,
            "--lock-kinds",
            "lease",
            "--resync",
            "1s",
        ],
    )
    .await;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(s.client.clone(), &s.ns)
        .delete("pods", &DeleteParams::default())
        .await
        .unwrap();
    let scope = format!("pods sweep in {}", s.ns);
    wait_for(
        "the sweep's failure counted and said",
        Duration::from_secs(60),
        || async {
            let m = j.metrics().await;
            let pods = sample(
                &m,
                "lock_janitor_watch_errors_total",
                &[("resource", "pods")],
            )
            .unwrap_or(0.0);
            let logs = j.logs();
            (pods > 0.0 && logs.contains("resync sweep failed") && logs.contains(&scope))
                .then_some(())
        },
    )
    .await;
}

/// Binds the janitor's ClusterRole to `user` in namespace `ns` only, as the
/// chart does for each of `watchNamespaces`.
async fn bind_in(client: &kube::Client, ns: &str, user: &str) {
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef};
    let binding = RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(user.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: JANITOR_USER.into(),
        },
        subjects: Some(vec![crate::support::user(user)]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&Default::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("binding {user} in {ns}: {e}"));
}

fn scope_ready(m: &str, scope: &str) -> Option<f64> {
    sample(m, "lock_janitor_scope_ready", &[("scope", scope)])
}

/// One broken namespace must not stop reclaims everywhere: two replicas
/// with election watch namespaces a and b; b's RoleBindings are deleted
/// (and the API server restarted, so the open watches must reconnect).
/// Both replicas turn not ready; the leader offers its lease, nobody ready
/// takes it, and a replica takes it back: an eviction in a is reclaimed,
/// and lock_janitor_scope_ready says b is the broken scope. (Before, the
/// leader released the lease and the standby, equally not ready, never
/// took it: nobody led.) Own control plane.
#[tokio::test]
async fn one_broken_namespace_does_not_stop_reclaims_in_the_others() {
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let a = fresh_namespace(&client, "scope-a").await;
    let b = fresh_namespace(&client, "scope-b").await;
    let election = fresh_namespace(&client, "scope-election").await;
    let users = ["janitor-1", "janitor-2"];
    for u in users {
        bind_in(&client, &a, u).await;
        bind_in(&client, &b, u).await;
        grant_election(&client, &election, u).await;
    }
    let holder_a = running_pod(&client, &a, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &holder_a, true)).await;
    let holder_b = running_pod(&client, &b, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &holder_b, true)).await;
    let args = [
        "--namespace",
        a.as_str(),
        "--namespace",
        b.as_str(),
        "--leader-elect",
        "--leader-elect-namespace",
        election.as_str(),
        "--resync",
        "5s",
    ];
    let j1 = Janitor::start(&kubeconfig_as(&cp, users[0]), &args).await;
    wait_for("janitor-1 leads", Duration::from_secs(40), || async {
        leading(&j1).await.then_some(())
    })
    .await;
    let j2 = Janitor::start(&kubeconfig_as(&cp, users[1]), &args).await;
    for j in [&j1, &j2] {
        let m = j.metrics().await;
        assert_eq!(scope_ready(&m, &a), Some(1.0), "{m}");
        assert_eq!(scope_ready(&m, &b), Some(1.0), "{m}");
    }

    // b breaks for both replicas: its RoleBindings are gone.
    for u in users {
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &b)
            .delete(u, &DeleteParams::default())
            .await
            .unwrap();
    }
    cp.restart_apiserver()
        .await
        .expect("restart kube-apiserver");
    // Past the minute: both not ready, and they say which scope is broken.
    for j in [&j1, &j2] {
        wait_for(
            "scope b reported broken",
            Duration::from_secs(150),
            || async {
                let m = j.metrics().await;
                (scope_ready(&m, &b) == Some(0.0)).then_some(())
            },
        )
        .await;
        let m = j.metrics().await;
        assert_eq!(scope_ready(&m, &a), Some(1.0), "a works: {m}");
        assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(0.0), "{m}");
        let (code, body) = http_get(j.port, "/readyz").await.unwrap();
        assert_eq!(code, 503);
        assert!(body.contains(&format!("in {b}")), "{body}");
    }
    // The leader offers the lease; nobody ready takes it, so one of them
    // takes it back and leads while b stays broken.
    let offered = |j: &Janitor| {
        j.logs()
            .contains("offering the leader lease to a ready replica")
    };
    wait_for(
        "the leader offers its lease",
        Duration::from_secs(30),
        || async { (offered(&j1) || offered(&j2)).then_some(()) },
    )
    .await;
    wait_for(
        "a replica takes the lease back while b is broken",
        Duration::from_secs(60),
        || async {
            let back = |j: &Janitor| j.logs().contains("leading while not ready");
            (back(&j1) || back(&j2)).then_some(())
        },
    )
    .await;
    wait_for(
        "a replica leads while b is broken",
        Duration::from_secs(30),
        || async { (leading(&j1).await || leading(&j2).await).then_some(()) },
    )
    .await;
    let (lead, other) = if leading(&j1).await {
        (&j1, &j2)
    } else {
        (&j2, &j1)
    };
    assert!(
        lead.logs().contains("leading while not ready"),
        "{}",
        lead.logs()
    );
    // And it reclaims in the healthy scope.
    lock_janitor_testenv::kubelet::set_failed(&client, &a, "leader", "Evicted", "test")
        .await
        .unwrap();
    wait_for("a's lock reclaimed", Duration::from_secs(30), || async {
        (!lock_exists(&client, &a, "op-lock").await).then_some(())
    })
    .await;
    lead.wait_said("stale lock reclaimed").await;
    assert!(
        !other.logs().contains("stale lock reclaimed"),
        "{}",
        other.logs()
    );
    assert!(
        lock_exists(&client, &b, "op-lock").await,
        "b's live lock kept"
    );
}
