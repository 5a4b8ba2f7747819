//! The delete guard and the fourth lock kind: a ConfigMap whose leader
//! record is the annotation `control-plane.alpha.kubernetes.io/leader`
//! (client-go's ConfigMapLock up to v0.23, fabric8, the Java and Python
//! clients). On the real API server, the chart's policy lets the janitor's
//! ServiceAccount release the record of an opted-in ConfigMap (a merge patch
//! of the annotation to `kinds::annotation::record::released` and the
//! resourceVersion read) and nothing more: not on a ConfigMap that is not
//! opted in, not with any other change, not to another holder, not a
//! DELETE; and it lets the janitor add the opt-in label to such a ConfigMap
//! only with `autoOptIn.enabled` and outside the excluded namespaces.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::chart::{apply_rbac, kind_of, render, sa_kubeconfig};
use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use lock_janitor::kinds::annotation::record::{self, ANNOTATION};
use lock_janitor_testenv::{fresh_namespace, shared};
use serde_json::{json, Value};

const VAP: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";
const OPT_IN_KEY: &str = "lock-janitor.io/watch";

/// The Python client's record, as `json.dumps` writes it.
const PYTHON: &str = r#"{"holderIdentity": "pod-a", "leaseDurationSeconds": "60", "acquireTime": "2026-12-06 23:30:00.123456", "renewTime": "2026-12-06 23:30:02.345678"}"#;
/// fabric8's record: `leaseDuration`, never `leaseDurationSeconds`.
const FABRIC8: &str = r#"{"holderIdentity":"pod-a","leaseDuration":"PT15S","acquireTime":"2026-12-06T23:30:00.000000Z","renewTime":"2026-12-06T23:30:02.123456Z","leaderTransitions":0}"#;

/// The rendered guard, installed, and a client acting as the janitor's
/// ServiceAccount.
struct Guard {
    policy: String,
    janitor: Client,
}

/// Renders the chart as release namespace `rel` with opt-in label
/// `lock-janitor.io/watch=<label>` (and `extra` values), creates its
/// ServiceAccount, RBAC, policy and binding for real.
async fn install(admin: &Client, rel: &str, label: &str, extra: &[&str]) -> Guard {
    let cp = shared().await;
    let mut args: Vec<String> = vec![
        "--api-versions".into(),
        VAP.into(),
        "--set".into(),
        format!("selector={OPT_IN_KEY}={label}"),
        "--set".into(),
        "replicas=1".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let docs = render(rel, rel, &args);
    apply_rbac(admin, &docs).await;
    let find = |kind: &str| {
        docs.iter()
            .find(|d| kind_of(d) == kind)
            .unwrap_or_else(|| panic!("the chart renders a {kind}"))
            .clone()
    };
    let policy = find("ValidatingAdmissionPolicy");
    let p: ValidatingAdmissionPolicy = serde_json::from_value(policy.clone()).unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("the API server accepts the policy (its CEL compiles)");
    let b: ValidatingAdmissionPolicyBinding =
        serde_json::from_value(find("ValidatingAdmissionPolicyBinding")).unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &b)
        .await
        .unwrap();
    let sa = find("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_owned();
    let kc = sa_kubeconfig(cp, rel, &sa);
    let kc = kube::config::Kubeconfig::read_from(kc).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Guard {
        policy: policy["metadata"]["name"].as_str().unwrap().to_owned(),
        janitor: Client::try_from(config).unwrap(),
    }
}

/// The denial, if the write was refused by a ValidatingAdmissionPolicy.
fn denied(r: kube::Result<impl std::fmt::Debug>) -> Option<String> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
            Some(s.message)
        }
        _ => None,
    }
}

/// A Python application's lock: its record, another annotation, a label
/// and data of its own (a leader annotation lives on any ConfigMap).
fn leader_cm(name: &str, labels: &[(&str, &str)], record: &str) -> ConfigMap {
    let mut l = BTreeMap::from([("app".to_string(), "py-worker".to_string())]);
    l.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(l),
            annotations: Some(BTreeMap::from([
                (ANNOTATION.to_string(), record.to_string()),
                ("team".to_string(), "payments".to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "app.conf".to_string(),
            "workers=2".to_string(),
        )])),
        ..Default::default()
    }
}

/// `a` with `b` merged in (objects key by key, anything else replaced).
fn merged(mut a: Value, b: Value) -> Value {
    match (&mut a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                let old = a.remove(&k).unwrap_or(Value::Null);
                a.insert(k, merged(old, v));
            }
        }
        (a, b) => *a = b,
    }
    a
}

/// The janitor's release as a merge patch: the annotation set to the
/// released record, at the version read; `extra` merged in.
fn release_patch(cm: &ConfigMap, extra: Value) -> Value {
    let value = &cm.metadata.annotations.as_ref().unwrap()[ANNOTATION];
    let released = record::released(value).expect("a record the janitor can release");
    assert!(record::is_released(&released), "{released}");
    merged(
        json!({"metadata": {
            "annotations": {ANNOTATION: released},
            "resourceVersion": cm.metadata.resource_version,
        }}),
        extra,
    )
}

/// The annotation set to `value`, at the version read.
fn record_patch(cm: &ConfigMap, value: &str) -> Value {
    json!({"metadata": {
        "annotations": {ANNOTATION: value},
        "resourceVersion": cm.metadata.resource_version,
    }})
}

fn merge(p: &Value) -> Patch<&Value> {
    Patch::Merge(p)
}

/// Waits until the guard refuses the janitor's release of a ConfigMap that
/// is not opted in (a fresh one each try: before the API server has loaded
/// the policy, the release goes through). Returns the refusal.
async fn guard_effective(admin: &Client, guard: &Guard, ns: &str) -> String {
    let tries = AtomicUsize::new(0);
    let (tries, admin, janitor) = (&tries, admin, &guard.janitor);
    wait_for(
        "the guard takes effect",
        Duration::from_secs(60),
        || async move {
            let name = format!("not-opted-in-{}", tries.fetch_add(1, Ordering::Relaxed));
            let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &leader_cm(&name, &[], PYTHON))
                .await
                .unwrap();
            let patch = release_patch(&cm, json!({}));
            denied(
                Api::<ConfigMap>::namespaced(janitor.clone(), ns)
                    .patch(&name, &PatchParams::default(), &merge(&patch))
                    .await,
            )
        },
    )
    .await
}

#[tokio::test]
async fn the_guard_admits_exactly_the_release_of_a_leader_record() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let rel = fresh_namespace(&admin, "rec-rel").await;
    let ns = fresh_namespace(&admin, "rec-locks").await;
    let guard = install(&admin, &rel, &ns, &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let as_janitor: Api<ConfigMap> = Api::namespaced(guard.janitor.clone(), &ns);
    let opt_in = (OPT_IN_KEY, ns.as_str());
    let pp = PatchParams::default();

    // Not opted in: refused, naming the policy and what it admits.
    let m = guard_effective(&admin, &guard, &ns).await;
    assert!(m.contains(&guard.policy), "{m}");
    assert!(
        m.contains("releasing the held leader record of an opted-in one"),
        "{m}"
    );

    // An opted-in ConfigMap held by pod-a (the Python client's record).
    let held = cms
        .create(
            &PostParams::default(),
            &leader_cm("held", &[opt_in], PYTHON),
        )
        .await
        .unwrap();
    // The release with anything else: each refused.
    for (what, extra) in [
        (
            "a change of data",
            json!({"data": {"app.conf": "workers=3"}}),
        ),
        ("new data", json!({"data": {"extra": "1"}})),
        ("binaryData", json!({"binaryData": {"b": "AAE="}})),
        ("immutable", json!({"immutable": true})),
        (
            "another annotation changed",
            json!({"metadata": {"annotations": {"team": "billing"}}}),
        ),
        (
            "another annotation added",
            json!({"metadata": {"annotations": {"note": "x"}}}),
        ),
        (
            "another annotation removed",
            json!({"metadata": {"annotations": {"team": null}}}),
        ),
        (
            "a label added",
            json!({"metadata": {"labels": {"tier": "gold"}}}),
        ),
        (
            "a label removed",
            json!({"metadata": {"labels": {"app": null}}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/keep"]}}),
        ),
        (
            "an ownerReference",
            json!({"metadata": {"ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"}]}}),
        ),
    ] {
        let patch = release_patch(&held, extra);
        let m = denied(as_janitor.patch("held", &pp, &merge(&patch)).await)
            .unwrap_or_else(|| panic!("a release with {what} was let through"));
        assert!(m.contains(&guard.policy), "{what}: {m}");
    }
    // The record set to anything but a released one: refused, and
    // is_release_of (the guard's mirror) says the same.
    for (what, value) in [
        (
            "another holder",
            r#"{"holderIdentity":"pod-b","leaseDurationSeconds":15}"#,
        ),
        (
            "another holder, one second",
            r#"{"holderIdentity":"pod-b","leaseDurationSeconds":1}"#,
        ),
        (
            "a second holderIdentity after the prefix",
            r#"{"holderIdentity":null,"leaseDurationSeconds":1,"holderIdentity":"pod-b"}"#,
        ),
        (
            "a holder in another case after the prefix",
            r#"{"holderIdentity":null,"leaseDurationSeconds":1,"HolderIdentity":"pod-b"}"#,
        ),
        (
            "a holder spelt with an escape",
            r#"{"holderIdentity":null,"leaseDurationSeconds":1,"h\u006flderIdentity":"pod-b"}"#,
        ),
        (
            "a longer lease",
            r#"{"holderIdentity":null,"leaseDurationSeconds":10}"#,
        ),
        (
            "an empty holder (client-go's own release, not the janitor's)",
            r#"{"holderIdentity":"","leaseDurationSeconds":1}"#,
        ),
        (
            "Python's spacing",
            r#"{"holderIdentity": "", "leaseDurationSeconds": 1}"#,
        ),
        ("empty", ""),
        (
            "no holder and no duration, for a record that is not fabric8's",
            r#"{"holderIdentity":null,"acquireTime":"2026-12-06 23:30:00.123456"}"#,
        ),
        (
            "fabric8's form, for a record that is not fabric8's",
            r#"{"holderIdentity":"","leaseDuration":"PT15S"}"#,
        ),
    ] {
        assert!(!record::is_release_of(PYTHON, value), "{what}");
        let patch = record_patch(&held, value);
        let m = denied(as_janitor.patch("held", &pp, &merge(&patch)).await)
            .unwrap_or_else(|| panic!("the record set to {what} was let through"));
        assert!(m.contains(&guard.policy), "{what}: {m}");
    }
    // Never deleted: it has no Pod owner, preconditions or not.
    let m = denied(
        as_janitor
            .delete(
                "held",
                &DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: held.metadata.uid.clone(),
                        resource_version: held.metadata.resource_version.clone(),
                    }),
                    ..Default::default()
                },
            )
            .await,
    )
    .expect("the DELETE of a leader-record ConfigMap was let through");
    assert!(m.contains("lock-shaped ConfigMaps"), "{m}");
    // Nor one that is lock-shaped besides (one Pod owner, no data): a record
    // is released, never deleted, whatever else the ConfigMap is.
    // Its owner exists (else the garbage collector would delete it first).
    let owner = running_pod(&admin, &ns, "pod-a", "node-a").await;
    let mut shaped = leader_cm("shaped", &[opt_in], PYTHON);
    shaped.data = None;
    shaped.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "pod-a".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    let shaped = cms.create(&PostParams::default(), &shaped).await.unwrap();
    let m = denied(
        as_janitor
            .delete(
                "shaped",
                &DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: shaped.metadata.uid.clone(),
                        resource_version: shaped.metadata.resource_version.clone(),
                    }),
                    ..Default::default()
                },
            )
            .await,
    )
    .expect("the DELETE of a lock-shaped ConfigMap with a leader record was let through");
    assert!(m.contains("lock-shaped ConfigMaps"), "{m}");

    // The release itself: admitted, and the record reads back free for one
    // second, with every other field, annotation, label and data kept.
    let patch = release_patch(&held, json!({}));
    let after = as_janitor
        .patch("held", &pp, &merge(&patch))
        .await
        .expect("the guard admits the janitor's release");
    let annotations = after.metadata.annotations.clone().unwrap();
    let value = &annotations[ANNOTATION];
    assert_eq!(value, &record::released(PYTHON).unwrap());
    let r = record::parse(value).unwrap();
    assert_eq!(
        (r.holder, r.duration),
        (None, Some(SignedDuration::from_secs(1)))
    );
    assert_eq!(r.renew_mark.as_deref(), Some("2026-12-06 23:30:02.345678"));
    assert_eq!(annotations["team"], "payments");
    assert_eq!(after.metadata.labels, held.metadata.labels);
    assert_eq!(after.data, held.data);
    // Released already: not released again.
    let value = &after.metadata.annotations.as_ref().unwrap()[ANNOTATION];
    assert!(!record::is_release_of(
        value,
        &record::released(value).unwrap()
    ));
    let patch = release_patch(&after, json!({}));
    let m = denied(as_janitor.patch("held", &pp, &merge(&patch)).await)
        .expect("a second release was let through");
    assert!(m.contains(&guard.policy), "{m}");

    // fabric8's record: released with no holder and no second duration
    // (its reader refuses a field it does not know), and only so.
    let f8 = cms
        .create(
            &PostParams::default(),
            &leader_cm("fabric8", &[opt_in], FABRIC8),
        )
        .await
        .unwrap();
    for (what, value) in [
        (
            "a second holderIdentity",
            r#"{"holderIdentity":"","leaseDuration":"PT15S","holderIdentity":"pod-b"}"#,
        ),
        (
            "a holder in another case",
            r#"{"holderIdentity":"","leaseDuration":"PT15S","HOLDERIDENTITY":"pod-b"}"#,
        ),
        (
            "a lease after the holder",
            r#"{"holderIdentity":"","leaseDuration":"PT15S","leaseDurationSeconds":60}"#,
        ),
        (
            "a holder spelt with an escape",
            r#"{"holderIdentity":"","leaseDuration":"PT15S","h\u006flderIdentity":"pod-b"}"#,
        ),
        (
            "spacing",
            r#"{"holderIdentity":"" ,"leaseDuration":"PT15S"}"#,
        ),
        ("fabric8's own fields dropped", r#"{"holderIdentity":""}"#),
        (
            "null, which fabric8 before 6.x cannot read",
            r#"{"holderIdentity":null,"leaseDuration":"PT15S"}"#,
        ),
    ] {
        assert!(!record::is_release_of(FABRIC8, value), "{what}");
        let patch = record_patch(&f8, value);
        let m = denied(as_janitor.patch("fabric8", &pp, &merge(&patch)).await)
            .unwrap_or_else(|| panic!("fabric8's record set to {what} was let through"));
        assert!(m.contains(&guard.policy), "{what}: {m}");
    }
    // A fabric8 record that mentions leaseDurationSeconds (in a value): the
    // guard cannot tell it is fabric8's, so fabric8's form is refused, and
    // the janitor does not write it (the lock is unmanageable).
    let odd = FABRIC8.replace(
        r#""leaderTransitions""#,
        r#""note":"no leaseDurationSeconds","leaderTransitions""#,
    );
    assert!(record::released(&odd).is_err());
    let odd_cm = cms
        .create(
            &PostParams::default(),
            &leader_cm("fabric8-odd", &[opt_in], &odd),
        )
        .await
        .unwrap();
    let f8_form = r#"{"holderIdentity":"","leaseDuration":"PT15S","note":"x"}"#;
    assert!(!record::is_release_of(&odd, f8_form));
    let patch = record_patch(&odd_cm, f8_form);
    assert!(
        denied(as_janitor.patch("fabric8-odd", &pp, &merge(&patch)).await).is_some(),
        "fabric8's form over a record that mentions leaseDurationSeconds was let through"
    );
    let patch = release_patch(&f8, json!({}));
    let after = as_janitor
        .patch("fabric8", &pp, &merge(&patch))
        .await
        .expect("the guard admits the release of fabric8's record");
    let value = after.metadata.annotations.clone().unwrap()[ANNOTATION].clone();
    assert!(!value.contains("leaseDurationSeconds"), "{value}");
    assert!(value.starts_with(r#"{"holderIdentity":"","#), "{value}");
    let r = record::parse(&value).unwrap();
    assert_eq!(
        (r.holder, r.duration),
        (None, Some(SignedDuration::from_secs(15)))
    );
    let patch = release_patch(&after, json!({}));
    assert!(
        denied(as_janitor.patch("fabric8", &pp, &merge(&patch)).await).is_some(),
        "a second release of fabric8's record was let through"
    );

    // A record never written (the Python client's "" before its first):
    // nothing to release.
    let empty = cms
        .create(&PostParams::default(), &leader_cm("empty", &[opt_in], ""))
        .await
        .unwrap();
    let patch = record_patch(&empty, &record::released("{}").unwrap());
    assert!(denied(as_janitor.patch("empty", &pp, &merge(&patch)).await).is_some());

    // Auto opt-in (on by default): the label alone on a ConfigMap with a
    // leader record is admitted; with anything else, or where the record is
    // empty, refused.
    let label = json!({"metadata": {"labels": {opt_in.0: opt_in.1}}});
    let candidate = cms
        .create(&PostParams::default(), &leader_cm("candidate", &[], PYTHON))
        .await
        .unwrap();
    let with_annotation = merged(
        label.clone(),
        json!({"metadata": {"annotations": {"team": "billing"}}}),
    );
    let with_record = merged(
        label.clone(),
        record_patch(&candidate, &record::released(PYTHON).unwrap()),
    );
    for (what, patch) in [
        ("another annotation", with_annotation),
        ("the release", with_record),
        ("data", merged(label.clone(), json!({"data": {"k": "v"}}))),
    ] {
        assert!(
            denied(as_janitor.patch("candidate", &pp, &merge(&patch)).await).is_some(),
            "the label with {what} was let through"
        );
    }
    let labeled = as_janitor
        .patch("candidate", &pp, &merge(&label))
        .await
        .expect("the guard admits the opt-in label on a ConfigMap with a leader record");
    assert_eq!(
        labeled
            .metadata
            .labels
            .unwrap()
            .get(OPT_IN_KEY)
            .map(String::as_str),
        Some(ns.as_str())
    );
    let unheld = cms
        .create(&PostParams::default(), &leader_cm("unheld", &[], ""))
        .await
        .unwrap();
    let m = denied(as_janitor.patch("unheld", &pp, &merge(&label)).await)
        .expect("the label on a ConfigMap with an empty record was let through");
    assert!(m.contains("or to one with a leader record"), "{m}");
    assert_eq!(
        cms.get("unheld").await.unwrap().metadata.resource_version,
        unheld.metadata.resource_version
    );

    // An excluded namespace (kube-system, by default): the label refused.
    let system: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let name = format!("rec-{ns}");
    system
        .create(&PostParams::default(), &leader_cm(&name, &[], PYTHON))
        .await
        .unwrap();
    let refused = denied(
        Api::<ConfigMap>::namespaced(guard.janitor.clone(), "kube-system")
            .patch(&name, &pp, &merge(&label))
            .await,
    );
    system
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        refused.is_some(),
        "the label on a leader-record ConfigMap in kube-system was let through"
    );
}

#[tokio::test]
async fn without_auto_opt_in_the_guard_refuses_the_label_on_a_leader_record() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let rel = fresh_namespace(&admin, "rec-noauto-rel").await;
    let ns = fresh_namespace(&admin, "rec-noauto").await;
    let guard = install(&admin, &rel, &ns, &["--set", "autoOptIn.enabled=false"]).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let as_janitor: Api<ConfigMap> = Api::namespaced(guard.janitor.clone(), &ns);
    let pp = PatchParams::default();
    guard_effective(&admin, &guard, &ns).await;

    let candidate = cms
        .create(&PostParams::default(), &leader_cm("candidate", &[], PYTHON))
        .await
        .unwrap();
    let label = json!({"metadata": {"labels": {OPT_IN_KEY: ns}}});
    let m = denied(as_janitor.patch("candidate", &pp, &merge(&label)).await)
        .expect("the label was let through without auto opt-in");
    assert!(m.contains(&guard.policy), "{m}");
    assert!(!m.contains("or to one with a leader record"), "{m}");
    assert_eq!(
        cms.get("candidate")
            .await
            .unwrap()
            .metadata
            .resource_version,
        candidate.metadata.resource_version
    );
    // The release of an opted-in one is still admitted.
    let held = cms
        .create(
            &PostParams::default(),
            &leader_cm("held", &[(OPT_IN_KEY, ns.as_str())], PYTHON),
        )
        .await
        .unwrap();
    let patch = release_patch(&held, json!({}));
    let after = as_janitor
        .patch("held", &pp, &merge(&patch))
        .await
        .expect("the guard admits the release without auto opt-in too");
    assert!(record::is_released(
        &after.metadata.annotations.unwrap()[ANNOTATION]
    ));
}
