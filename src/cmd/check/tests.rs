//! Unit tests of the check command: flags read from a Deployment, the chart
//! label, hints and rendering.

use super::*;
use serde_json::{json, Value};

#[test]
fn table_and_summary() {
    let checks = vec![
        Check::ok("leader", "pod a leads"),
        Check::warn("install-found", "one replica", "scale it"),
        Check::fail("stale-now", "ns/x", "label it"),
    ];
    let t = render_table(&checks);
    assert_eq!(
        t,
        "ok    leader         pod a leads\n\
         warn  install-found  one replica\n\
         \x20                    hint: scale it\n\
         fail  stale-now      ns/x\n\
         \x20                    hint: label it\n"
    );
    assert!(summary(&checks, false).contains("3 checks: 1 ok, 1 warn, 1 fail"));
    let warned = &checks[..2];
    assert!(summary(warned, false).ends_with("the install works; see the hints of the warnings\n"));
    assert!(summary(warned, true).contains("dry-run mode"));
    assert!(!summary(warned, true).contains("the install works"));
}

fn deployment(args: Value, env: Value) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"labels": {"helm.sh/chart": "lock-janitor-0.1.0"}},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {"containers": [
            {"name": "sidecar", "args": ["--dry-run"], "env": [{"name": "LOCK_JANITOR_DRY_RUN", "value": "true"}]},
            {"name": "lock-janitor", "args": args, "env": env}
        ]}}}
    }))
    .unwrap()
}

#[test]
fn deployment_args_are_run_flags() {
    let d = deployment(
        json!(["--namespace=x", "--leader-elect", "--leader-elect-lease=lj"]),
        json!([]),
    );
    let f = run_flags(&d);
    assert!(f.error.is_none());
    assert_eq!(f.run.scope.namespaces, ["x"]);
    assert!(f.run.leader_elect);
    assert_eq!(f.run.leader_elect_lease, "lj");
    assert!(
        !f.run.dry_run,
        "the janitor container's flags, not another's"
    );
    let f = run_flags(&deployment(json!(["--bogus"]), json!([])));
    assert!(f.error.is_some());
    assert!(f.run.scope.namespaces.is_empty());
}

#[test]
fn the_containers_env_sets_what_its_args_leave_unset() {
    let env = json!([
        {"name": "LOCK_JANITOR_DRY_RUN", "value": "true"},
        {"name": "LOCK_JANITOR_NAMESPACE", "value": "a,b"},
        {"name": "LOCK_JANITOR_LEADER_ELECT_LEASE", "value": "from-env"},
        {"name": "LOCK_JANITOR_LOCK_KINDS", "value": "lease"},
        {"name": "LOCK_JANITOR_DELETE_POD", "value": "false"},
        {"name": "LOCK_JANITOR_SELECTOR", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "OTHER", "value": "x"}
    ]);
    let f = run_flags(&deployment(
        json!(["--namespace=x", "--leader-elect-lease=from-args"]),
        env,
    ));
    assert_eq!(f.error, None);
    assert!(f.run.dry_run);
    assert!(!f.run.delete_pod);
    // Args win where both are set, as clap's do.
    assert_eq!(f.run.scope.namespaces, ["x"]);
    assert_eq!(f.run.leader_elect_lease, "from-args");
    assert_eq!(f.run.lock_kinds, [crate::lock::LockKind::Lease]);
    assert_eq!(
        f.from_env,
        [
            "LOCK_JANITOR_DRY_RUN",
            "LOCK_JANITOR_DELETE_POD",
            "LOCK_JANITOR_LOCK_KINDS"
        ]
    );
    assert_eq!(f.unread_env, ["LOCK_JANITOR_SELECTOR"]);
    assert_eq!(f.run.scope.selector.as_str(), crate::DEFAULT_SELECTOR);

    // A list from the env alone; the last entry of a name wins.
    let f = run_flags(&deployment(
        json!([]),
        json!([
            {"name": "LOCK_JANITOR_NAMESPACE", "value": "old"},
            {"name": "LOCK_JANITOR_NAMESPACE", "value": "a,b"}
        ]),
    ));
    assert_eq!(f.run.scope.namespaces, ["a", "b"]);

    // What the pod would refuse is said, and the defaults assumed.
    let f = run_flags(&deployment(
        json!([]),
        json!([{"name": "LOCK_JANITOR_DRY_RUN", "value": "yes"}]),
    ));
    assert!(f.error.unwrap().contains("LOCK_JANITOR_DRY_RUN"));
    assert!(!f.run.dry_run);
    let f = run_flags(&deployment(
        json!([]),
        json!([{"name": "LOCK_JANITOR_RESYNC", "value": "0s"}]),
    ));
    assert!(f.error.unwrap().contains("LOCK_JANITOR_RESYNC"));
}

#[test]
fn the_chart_label_names_chart_and_version() {
    assert_eq!(
        chart_of("lock-janitor-0.1.0"),
        Some(("lock-janitor".into(), "0.1.0".into()))
    );
    assert_eq!(
        chart_of("lock-janitor-1.2.0-rc.1_build.5"),
        Some(("lock-janitor".into(), "1.2.0-rc.1+build.5".into()))
    );
    assert_eq!(chart_of("lock-janitor"), None);
    assert_eq!(chart_of("-1.0.0"), None);
}

#[tokio::test]
async fn fix_it_hints_pin_the_version_and_invent_no_chart_url() {
    let d = deployment(json!([]), json!([]));
    let install = |d: Deployment| Install {
        namespace: "ops".into(),
        name: "lj".into(),
        release: Some("lj".into()),
        deployment: d,
        pods: Vec::new(),
        service_account: "lj".into(),
        run: run_flags(&deployment(json!([]), json!([]))).run,
        args_error: None,
        from_env: Vec::new(),
        unread_env: Vec::new(),
        client: unreachable_client(),
        config: kube::Config::new("http://127.0.0.1:1".parse().unwrap()),
    };
    let hint = install(d.clone()).helm_upgrade("--set dryRun=false");
    assert_eq!(
        hint,
        "helm upgrade lj <your chart reference> --version 0.1.0 -n ops --reset-then-reuse-values \
         --set dryRun=false (<your chart reference>: where you installed chart lock-janitor 0.1.0 from)"
    );
    let mut bare = d;
    bare.metadata.labels = None;
    let hint = install(bare).helm_upgrade("");
    assert!(
        hint.starts_with(
            "helm upgrade lj <your chart reference> --version <installed chart version> -n ops \
             --reset-then-reuse-values ("
        ),
        "{hint}"
    );
    for hint in [hint, no_install_hint()] {
        assert!(!hint.contains("oci://") && !hint.contains("ghcr"), "{hint}");
        assert!(
            !hint.contains("--reuse-values") || hint.contains("--version"),
            "{hint}"
        );
    }
    assert!(no_install_hint().contains(&format!("--version {}", env!("CARGO_PKG_VERSION"))));
}

fn no_install_hint() -> String {
    let args = CheckArgs {
        namespace: None,
        release: None,
        output: CheckOutput::Table,
        cluster: Default::default(),
    };
    no_install(&args, "any namespace").hint.unwrap()
}

fn unreachable_client() -> Client {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    Client::try_from(config).unwrap()
}
