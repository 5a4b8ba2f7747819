//! The chart's delete guard (a ValidatingAdmissionPolicy) on the real API
//! server 1.37, rendered from the chart as a cluster that serves
//! `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy renders it:
//! the janitor's ServiceAccount is refused, naming the policy, what RBAC
//! allows but docs/design.md does not (deleting an unlabeled ConfigMap, a labeled
//! one with data, one in kube-system; changing a ConfigMap beyond the opt-in
//! label; updating a Lease beyond its release), other users are unaffected,
//! and a real janitor run under the guard reclaims a stale ConfigMap lock,
//! carries the label over to the new leader's lock, and releases a stale
//! Lease, as without it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::chart::{apply_rbac, kind_of, render, sa_kubeconfig};
use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};
use serde_json::{json, Value};

const VAP: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

async fn client_for(kubeconfig: &std::path::Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// The rendered Deployment's ServiceAccount and container args (without
/// the metrics address and log format, which tests set, and without
/// --auto-opt-in).
fn deployment_of(docs: &[Value]) -> (String, Vec<String>) {
    let deployment = docs.iter().find(|d| kind_of(d) == "Deployment").unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let sa = spec["serviceAccountName"].as_str().unwrap().to_owned();
    let args = spec["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--metrics-bind-address") && !a.starts_with("--log-format"))
        // Cluster-wide on the shared control plane, --auto-opt-in would
        // label every suite's locks: this janitor is scoped by its selector.
        .filter(|a| *a != "--auto-opt-in")
        .map(str::to_owned)
        .collect();
    (sa, args)
}

/// The denial, if the write was refused by the guard.
fn denied(r: kube::Result<impl std::fmt::Debug>) -> Option<String> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
            Some(s.message)
        }
        _ => None,
    }
}

fn configmap(
    name: &str,
    labels: &[(&str, &str)],
    owner: Option<&k8s_openapi::api::core::v1::Pod>,
    data: bool,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            owner_references: owner.map(|p| vec![pod_owner(p)]),
            ..Default::default()
        },
        data: data.then(|| BTreeMap::from([("k".to_string(), "v".to_string())])),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_guard_refuses_what_rbac_allows_and_lets_the_janitor_work() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let rel = fresh_namespace(&admin, "guard-rel").await;
    let ns = fresh_namespace(&admin, "guard-locks").await;
    // Excluded from auto opt-in by a glob (`?`), besides the defaults.
    let excluded = fresh_namespace(&admin, "guard-excl").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&admin, &node).await.unwrap();
    // This release watches its own selector, so that the cluster-wide
    // janitors of other tests never touch its locks.
    let selector = format!("lock-janitor.io/watch={ns}");
    let docs = render(
        &rel,
        &rel,
        &[
            "--api-versions".into(),
            VAP.into(),
            "--set".into(),
            format!("selector={selector}"),
            "--set".into(),
            "replicas=1".into(),
            "--set".into(),
            "deletePod=true".into(),
            "--set-json".into(),
            r#"autoOptIn.excludeNamespaces=["kube-system","kube-public","kube-node-lease","openshift-*","guard-excl-??????"]"#.into(),
        ],
    );
    apply_rbac(&admin, &docs).await;
    let policy = docs
        .iter()
        .find(|d| kind_of(d) == "ValidatingAdmissionPolicy")
        .expect("the guard is rendered where the API server serves VAP v1");
    let binding = docs
        .iter()
        .find(|d| kind_of(d) == "ValidatingAdmissionPolicyBinding")
        .expect("its binding");
    let policy_name = policy["metadata"]["name"].as_str().unwrap().to_owned();
    let p: ValidatingAdmissionPolicy = serde_json::from_value(policy.clone()).unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &p)
        .await
        .expect("the API server accepts the policy (its CEL compiles)");
    let b: ValidatingAdmissionPolicyBinding = serde_json::from_value(binding.clone()).unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &b)
        .await
        .unwrap();
    let (sa, args) = deployment_of(&docs);
    let sa = sa.as_str();
    let kc = sa_kubeconfig(cp, &rel, sa);
    let janitor_client = client_for(&kc).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let as_janitor: Api<ConfigMap> = Api::namespaced(janitor_client.clone(), &ns);
    let label_value = ns.as_str();
    let opt_in = ("lock-janitor.io/watch", label_value);

    // An unlabeled lock-shaped ConfigMap: RBAC allows the delete, the
    // guard refuses it (once the API server has loaded the policy).
    let holder = running_pod(&admin, &ns, "holder", &node).await;
    let mut attempt = 0;
    let message = loop {
        attempt += 1;
        assert!(attempt < 100, "the guard never took effect");
        // A fresh one each time: before the API server has loaded the
        // policy, the delete goes through.
        let name = format!("unlabeled-{attempt}");
        let cm = configmap(&name, &[], Some(&holder), false);
        cms.create(&PostParams::default(), &cm).await.unwrap();
        match as_janitor.delete(&name, &DeleteParams::default()).await {
            Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
                let cm = configmap("unlabeled", &[], Some(&holder), false);
                cms.create(&PostParams::default(), &cm).await.unwrap();
                cms.delete(&name, &DeleteParams::default()).await.unwrap();
                break s.message;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            Err(e) => panic!("unexpected answer: {e}"),
        }
    };
    assert!(message.contains(&policy_name), "{message}");
    // Labeled but holding data: not lock-shaped.
    cms.create(
        &PostParams::default(),
        &configmap("with-data", &[opt_in], Some(&holder), true),
    )
    .await
    .unwrap();
    assert!(denied(
        as_janitor
            .delete("with-data", &DeleteParams::default())
            .await
    )
    .is_some());
    // In kube-system.
    let system: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let victim = format!("guard-victim-{ns}");
    system
        .create(
            &PostParams::default(),
            &configmap(&victim, &[], None, false),
        )
        .await
        .unwrap();
    let system_as_janitor: Api<ConfigMap> = Api::namespaced(janitor_client.clone(), "kube-system");
    assert!(denied(
        system_as_janitor
            .delete(&victim, &DeleteParams::default())
            .await
    )
    .is_some());
    // A patch beyond the opt-in label.
    let other = json!({"metadata": {"labels": {"team": "payments"}}});
    assert!(denied(
        as_janitor
            .patch("unlabeled", &PatchParams::default(), &Patch::Merge(&other))
            .await
    )
    .is_some());
    // A Lease update that is not a release.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let now = MicroTime(Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("some-lease".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("holder".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(now.clone()),
            acquire_time: Some(now),
            ..Default::default()
        }),
    };
    let mut l = leases.create(&PostParams::default(), &lease).await.unwrap();
    l.spec.as_mut().unwrap().holder_identity = Some(String::new());
    l.spec.as_mut().unwrap().lease_duration_seconds = Some(1);
    let as_janitor_leases: Api<Lease> = Api::namespaced(janitor_client.clone(), &ns);
    let m = denied(
        as_janitor_leases
            .replace("some-lease", &PostParams::default(), &l)
            .await,
    )
    .expect("the release of a Lease that is not opted in is refused");
    assert!(m.contains("release an opted-in, renewed one"), "{m}");

    // Adding the opt-in label and anything else: a finalizer (it would wedge
    // the lock), an annotation, a second owner. Each refused, naming the
    // policy; the label alone is the carry-over, checked by the run below.
    for (what, extra) in [
        ("a finalizer", json!({"finalizers": ["example.com/keep"]})),
        (
            "an annotation",
            json!({"annotations": {"team": "payments"}}),
        ),
        (
            "an ownerReference",
            json!({"ownerReferences": [pod_owner(&holder), {
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"}]}),
        ),
    ] {
        let mut meta = extra.as_object().unwrap().clone();
        meta.insert("labels".into(), json!({opt_in.0: opt_in.1}));
        let patch = json!({ "metadata": meta });
        let m = denied(
            as_janitor
                .patch("unlabeled", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )
        .unwrap_or_else(|| panic!("the label with {what} was let through"));
        assert!(m.contains(&policy_name), "{m}");
    }
    let data = json!({"metadata": {"labels": {opt_in.0: opt_in.1}}, "data": {"k": "v"}});
    assert!(denied(
        as_janitor
            .patch("unlabeled", &PatchParams::default(), &Patch::Merge(&data))
            .await
    )
    .is_some());

    // An opted-in, held Lease: a release that also adds an ownerReference
    // (the garbage collector could then delete it) or a finalizer, or one
    // that keeps more than client-go's release, is refused; a Lease is
    // never deleted, even where RBAC would let it.
    let mut held = lease.clone();
    held.metadata.name = Some("held-lease".into());
    held.metadata.labels = Some(BTreeMap::from([(opt_in.0.into(), opt_in.1.into())]));
    held.spec.as_mut().unwrap().lease_transitions = Some(2);
    let held = leases.create(&PostParams::default(), &held).await.unwrap();
    let release = |mut l: Lease| {
        l = lock_janitor::lock::lease::released(l, Timestamp::now());
        l
    };
    let mut owned = release(held.clone());
    owned.metadata.owner_references = Some(vec![pod_owner(&holder)]);
    let mut finalized = release(held.clone());
    finalized.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    let mut transitions = release(held.clone());
    transitions.spec.as_mut().unwrap().lease_transitions = Some(7);
    let mut relabeled = release(held.clone());
    relabeled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "payments".into());
    for (what, l) in [
        ("an ownerReference", owned),
        ("a finalizer", finalized),
        ("other leaseTransitions", transitions),
        ("another label", relabeled),
    ] {
        let m = denied(
            as_janitor_leases
                .replace("held-lease", &PostParams::default(), &l)
                .await,
        )
        .unwrap_or_else(|| panic!("a release with {what} was let through"));
        assert!(m.contains(&policy_name), "{what}: {m}");
    }
    // The release of a Lease the official Java client holds names no holder
    // at all: admitted (another Lease: this one's DELETE is checked below).
    let mut java = held.clone();
    java.metadata = ObjectMeta {
        name: Some("java-lease".into()),
        labels: held.metadata.labels.clone(),
        ..Default::default()
    };
    let java = leases.create(&PostParams::default(), &java).await.unwrap();
    let mut no_holder = release(java);
    no_holder.spec.as_mut().unwrap().holder_identity = None;
    // With no holder, still exactly the release: one second, the
    // transitions kept.
    let mut longer = no_holder.clone();
    longer.spec.as_mut().unwrap().lease_duration_seconds = Some(15);
    let mut transitions = no_holder.clone();
    transitions.spec.as_mut().unwrap().lease_transitions = Some(9);
    for (what, l) in [
        ("a longer lease", longer),
        ("other transitions", transitions),
    ] {
        let m = denied(
            as_janitor_leases
                .replace("java-lease", &PostParams::default(), &l)
                .await,
        )
        .unwrap_or_else(|| panic!("a release with no holder and {what} was let through"));
        assert!(m.contains(&policy_name), "{what}: {m}");
    }
    let admitted = as_janitor_leases
        .replace("java-lease", &PostParams::default(), &no_holder)
        .await
        .expect("the guard admits a release with no holder at all");
    assert_eq!(admitted.spec.unwrap().holder_identity, None);
    // Lease DELETE: granted here by an extra Role, refused by the policy.
    let rules = vec![rule(&["coordination.k8s.io"], &["leases"], &["delete"])];
    grant_in(
        &admin,
        &ns,
        "extra-leases-delete",
        service_account(sa, &rel),
        rules,
    )
    .await;
    let m = wait_for("the Role takes effect", Duration::from_secs(30), || async {
        match as_janitor_leases
            .delete("held-lease", &DeleteParams::default())
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
                Some(s.message)
            }
            Err(kube::Error::Api(s)) if s.code == 403 => None,
            other => panic!("a Lease delete was not refused by the guard: {other:?}"),
        }
    })
    .await;
    assert!(m.contains("held for life"), "{m}");
    // A release of another version than the Lease's, or of none, is
    // refused by the API server itself (409, 422), before any admission
    // policy runs (see a_validating_policy_sees_the_stored_version_of_an_update).
    for (what, version, code) in [
        ("another version", Some("1"), 409),
        ("no version", None, 422),
    ] {
        let mut l = release(held.clone());
        l.metadata.resource_version = version.map(str::to_owned);
        match as_janitor_leases
            .replace("held-lease", &PostParams::default(), &l)
            .await
        {
            Err(kube::Error::Api(s)) if s.code == code => {}
            other => panic!("a release with {what} was not refused with {code}: {other:?}"),
        }
    }
    // The release itself, whole, passes.
    as_janitor_leases
        .replace("held-lease", &PostParams::default(), &release(held.clone()))
        .await
        .expect("client-go's release of an opted-in Lease passes the guard");

    // deletePod: RBAC lets it delete every pod; the guard only a dead one.
    let pods_as_janitor: Api<Pod> = Api::namespaced(janitor_client.clone(), &ns);
    let m = denied(
        pods_as_janitor
            .delete("holder", &DeleteParams::default())
            .await,
    )
    .expect("a running pod's delete is refused");
    assert!(m.contains("only a dead holder pod"), "{m}");

    // The guard demands the preconditions the janitor always sends: an
    // opted-in, lock-shaped ConfigMap is deleted only with both.
    let shaped = cms
        .create(
            &PostParams::default(),
            &configmap("shaped", &[opt_in], Some(&holder), false),
        )
        .await
        .unwrap();
    let uid = shaped.metadata.uid.clone();
    let version = shaped.metadata.resource_version.clone();
    let with = |uid: Option<String>, resource_version: Option<String>| DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version,
        }),
        ..Default::default()
    };
    for (what, dp) in [
        ("no preconditions", DeleteParams::default()),
        ("a uid alone", with(uid.clone(), None)),
        ("a resourceVersion alone", with(None, version.clone())),
    ] {
        let m = denied(as_janitor.delete("shaped", &dp).await)
            .unwrap_or_else(|| panic!("a lock DELETE with {what} was let through"));
        assert!(m.contains(&policy_name), "{what}: {m}");
        assert!(
            m.contains("uid and resourceVersion preconditions"),
            "{what}: {m}"
        );
    }
    as_janitor
        .delete("shaped", &with(uid, version))
        .await
        .expect("a lock DELETE with both preconditions passes");
    // A held Lease that was never renewed (no renewTime) is never released.
    let mut unrenewed = lease.clone();
    unrenewed.metadata.name = Some("unrenewed-lease".into());
    unrenewed.metadata.labels = Some(BTreeMap::from([(opt_in.0.into(), opt_in.1.into())]));
    unrenewed.spec.as_mut().unwrap().renew_time = None;
    let unrenewed = leases
        .create(&PostParams::default(), &unrenewed)
        .await
        .unwrap();
    let m = denied(
        as_janitor_leases
            .replace(
                "unrenewed-lease",
                &PostParams::default(),
                &release(unrenewed),
            )
            .await,
    )
    .expect("the release of a Lease without a renewTime is refused");
    assert!(m.contains("renewed one"), "{m}");
    // A Lease held for life (one Pod owner, no renewTime, no duration):
    // deleted only opted in and with both preconditions; its new copy may
    // get the opt-in label and nothing else. A Lease with a renewTime is
    // never deleted, preconditions or not.
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "holder".into(),
        uid: holder.metadata.uid.clone().unwrap(),
        ..Default::default()
    };
    let for_life = |name: &str, labeled: bool| Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(vec![owner.clone()]),
            labels: labeled.then(|| BTreeMap::from([(opt_in.0.into(), opt_in.1.into())])),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("holder".into()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let both = |l: &Lease| with(l.metadata.uid.clone(), l.metadata.resource_version.clone());
    let life = leases
        .create(&PostParams::default(), &for_life("for-life", true))
        .await
        .unwrap();
    for (what, dp) in [
        ("no preconditions", DeleteParams::default()),
        ("a uid alone", with(life.metadata.uid.clone(), None)),
    ] {
        let m = denied(as_janitor_leases.delete("for-life", &dp).await)
            .unwrap_or_else(|| panic!("a for-life Lease DELETE with {what} was let through"));
        assert!(
            m.contains("uid and resourceVersion preconditions"),
            "{what}: {m}"
        );
    }
    let renewed = leases.get("held-lease").await.unwrap();
    let m = denied(
        as_janitor_leases
            .delete("held-lease", &both(&renewed))
            .await,
    )
    .expect("a renewed Lease's DELETE is refused, preconditions or not");
    assert!(m.contains("held for life"), "{m}");
    // Owned by one pod, held by another: that one may run; never deleted.
    let mut other = for_life("for-life-other", true);
    other.spec.as_mut().unwrap().holder_identity = Some("someone-else".into());
    let other = leases.create(&PostParams::default(), &other).await.unwrap();
    let m = denied(
        as_janitor_leases
            .delete("for-life-other", &both(&other))
            .await,
    )
    .expect("a Lease owned by one pod and held by another is never deleted");
    assert!(m.contains("held for life"), "{m}");
    let unlabeled = leases
        .create(
            &PostParams::default(),
            &for_life("for-life-unlabeled", false),
        )
        .await
        .unwrap();
    let m = denied(
        as_janitor_leases
            .delete("for-life-unlabeled", &both(&unlabeled))
            .await,
    )
    .expect("a for-life Lease that is not opted in is never deleted");
    assert!(m.contains("held for life"), "{m}");
    let relabel = |extra: Value| {
        let mut p = json!({"metadata": {"labels": {opt_in.0: opt_in.1},
                                        "resourceVersion": unlabeled.metadata.resource_version}});
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
        p
    };
    let m = denied(
        as_janitor_leases
            .patch(
                "for-life-unlabeled",
                &PatchParams::default(),
                &Patch::Merge(relabel(json!({"spec": {"holderIdentity": "someone-else"}}))),
            )
            .await,
    )
    .expect("a change of a for-life Lease beyond the label is refused");
    assert!(m.contains(&policy_name), "{m}");
    as_janitor_leases
        .patch(
            "for-life-unlabeled",
            &PatchParams::default(),
            &Patch::Merge(relabel(json!({}))),
        )
        .await
        .expect("the opt-in label carried over to a for-life Lease passes");
    // A renewed Lease (a candidate of `label` and --auto-opt-in): the opt-in
    // label alone passes; the label with a change of its holder does not.
    let renewed = leases.get("some-lease").await.unwrap();
    let relabel_renewed = |extra: Value| {
        let mut p = json!({"metadata": {"labels": {opt_in.0: opt_in.1},
                                        "resourceVersion": renewed.metadata.resource_version}});
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
        p
    };
    let m = denied(
        as_janitor_leases
            .patch(
                "some-lease",
                &PatchParams::default(),
                &Patch::Merge(relabel_renewed(
                    json!({"spec": {"holderIdentity": "someone-else"}}),
                )),
            )
            .await,
    )
    .expect("a change of a renewed Lease beyond the label is refused");
    assert!(m.contains(&policy_name), "{m}");
    as_janitor_leases
        .patch(
            "some-lease",
            &PatchParams::default(),
            &Patch::Merge(relabel_renewed(json!({}))),
        )
        .await
        .expect("the opt-in label added to a renewed Lease passes");
    // ... but not in a namespace excluded from auto opt-in (kube-system by
    // default, another by a glob): labeled, it would be releasable.
    for in_ns in ["kube-system", excluded.as_str()] {
        let name = format!("renewed-{ns}");
        let admin_leases: Api<Lease> = Api::namespaced(admin.clone(), in_ns);
        let mut l = lease.clone();
        l.metadata.name = Some(name.clone());
        let l = admin_leases
            .create(&PostParams::default(), &l)
            .await
            .unwrap();
        let label = json!({"metadata": {"labels": {opt_in.0: opt_in.1},
                                        "resourceVersion": l.metadata.resource_version}});
        let m = denied(
            Api::<Lease>::namespaced(janitor_client.clone(), in_ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&label))
                .await,
        )
        .unwrap_or_else(|| panic!("the opt-in label on a renewed Lease in {in_ns} is refused"));
        assert!(m.contains("outside the excluded namespaces"), "{m}");
        admin_leases
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    as_janitor_leases
        .delete("for-life", &both(&life))
        .await
        .expect("a for-life Lease's DELETE with both preconditions passes");
    // deletePod: a pod whose phase says Failed while its status still says
    // a container runs is refused; so is a dead pod's DELETE without a uid
    // precondition; the janitor's own (uid precondition) passes.
    let pods_admin: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let half = running_pod(&admin, &ns, "half-dead", &node).await;
    pods_admin
        .patch_status(
            "half-dead",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    let m = denied(
        pods_as_janitor
            .delete("half-dead", &with(half.metadata.uid.clone(), None))
            .await,
    )
    .expect("a Failed pod with a container running is refused");
    assert!(m.contains("no container running"), "{m}");
    let dead_pod = running_pod(&admin, &ns, "dead-pod", &node).await;
    kubelet::set_failed(&admin, &ns, "dead-pod", "Evicted", "test")
        .await
        .unwrap();
    let m = denied(
        pods_as_janitor
            .delete("dead-pod", &DeleteParams::default())
            .await,
    )
    .expect("a dead pod's DELETE without a uid precondition is refused");
    assert!(m.contains("uid precondition"), "{m}");
    pods_as_janitor
        .delete("dead-pod", &with(dead_pod.metadata.uid.clone(), None))
        .await
        .expect("a dead pod's DELETE with its uid passes");

    // Other users are unaffected.
    cms.delete("unlabeled", &DeleteParams::default())
        .await
        .unwrap();
    system
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();

    // A real janitor under the guard does its job: a stale ConfigMap lock
    // reclaimed, the label carried over to the new leader's lock, a stale
    // Lease released.
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let j = Janitor::start(&kc, &refs).await;
    let leader = running_pod(&admin, &ns, "leader", &node).await;
    cms.create(
        &PostParams::default(),
        &configmap("op-lock", &[opt_in], Some(&leader), false),
    )
    .await
    .unwrap();
    let dead = running_pod(&admin, &ns, "lease-holder", &node).await;
    let mut opted = lease.clone();
    opted.metadata.name = Some("op-lease".into());
    opted.metadata.labels = Some(BTreeMap::from([(opt_in.0.into(), opt_in.1.into())]));
    opted.spec.as_mut().unwrap().holder_identity = dead.metadata.name.clone();
    // Nobody renews it: released half its 10 s lease after the death.
    opted.spec.as_mut().unwrap().lease_duration_seconds = Some(10);
    opted.spec.as_mut().unwrap().renew_time = Some(MicroTime(Timestamp::now()));
    leases.create(&PostParams::default(), &opted).await.unwrap();

    kubelet::set_failed(&admin, &ns, "leader", "Evicted", "test")
        .await
        .unwrap();
    kubelet::set_failed(&admin, &ns, "lease-holder", "Evicted", "test")
        .await
        .unwrap();
    wait_for(
        "the stale lock reclaimed",
        Duration::from_secs(30),
        || async { (!lock_exists(&admin, &ns, "op-lock").await).then_some(()) },
    )
    .await;
    // operator-lib's replica creates the lock again, unlabeled.
    let heir = running_pod(&admin, &ns, "heir", &node).await;
    cms.create(
        &PostParams::default(),
        &configmap("op-lock", &[], Some(&heir), false),
    )
    .await
    .unwrap();
    wait_for(
        "the label carried over",
        Duration::from_secs(30),
        || async {
            let cm = cms.get("op-lock").await.ok()?;
            (cm.metadata.labels?.get(opt_in.0).map(String::as_str) == Some(opt_in.1)).then_some(())
        },
    )
    .await;
    wait_for(
        "the stale Lease released",
        Duration::from_secs(30),
        || async {
            let l = leases.get("op-lease").await.ok()?;
            (l.spec?.holder_identity.as_deref() == Some("")).then_some(())
        },
    )
    .await;
    // --delete-pod: the dead holder pod is deleted through the guard.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), &ns);
    wait_for("the dead pod deleted", Duration::from_secs(30), || async {
        pods.get_opt("leader")
            .await
            .ok()?
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    // Nothing of the janitor's was refused by the guard.
    assert!(
        !j.logs().contains("ValidatingAdmissionPolicy"),
        "{}",
        j.logs()
    );
    // Its release is an update of the Lease as read: the body carries the
    // resourceVersion judged (the audit log keeps Lease update bodies).
    let janitor_user = format!("system:serviceaccount:{rel}:{sa}");
    let releases: Vec<_> = lock_janitor_testenv::audit::read(cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == janitor_user
                && e.verb == "update"
                && e.namespace.as_deref() == Some(ns.as_str())
                && e.name.as_deref() == Some("op-lease")
        })
        .collect();
    assert_eq!(releases.len(), 1, "{releases:#?}");
    assert!(
        releases[0]
            .request_object
            .as_ref()
            .and_then(|b| b.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty()),
        "the release carries the version read: {:?}",
        releases[0]
    );
    metrics_reclaimed(
        &j,
        &[("kind", "configmap"), ("lock_namespace", ns.as_str())],
        1.0,
    )
    .await;
    let m = metrics_reclaimed(
        &j,
        &[("kind", "lease"), ("lock_namespace", ns.as_str())],
        1.0,
    )
    .await;
    for kind in ["configmap", "lease"] {
        assert_eq!(
            sample(
                &m,
                "lock_janitor_reclaims_total",
                &[("kind", kind), ("lock_namespace", ns.as_str())]
            ),
            Some(1.0),
            "{m}"
        );
    }
}

/// What a ValidatingAdmissionPolicy sees of a Lease UPDATE's
/// resourceVersion, asked of the real API server with a probe policy that
/// denies every update of one Lease and says what it saw. A PUT that
/// carries the current version reaches it with `object` at that version,
/// equal to `oldObject`'s. A PUT without one (an unconditional update) is
/// refused by the API server itself, 422 (Leases take no unconditional
/// update), and one with another version 409, both before the policy runs.
/// A merge patch without a version reaches it at the stored version, as if
/// it had carried it. So the delete guard's
/// `object.metadata.resourceVersion == oldObject.metadata.resourceVersion`
/// holds for every release it is asked about, and no validating policy can
/// tell an unconditional patch from a guarded one: what keeps a release to
/// the version judged is the API server for a PUT and the janitor, whose
/// release is a PUT of the Lease read (its body in the audit log, above).
/// Should an API server ever pass the client's version through, this test
/// fails, and the guard's check starts to refuse.
#[tokio::test]
async fn a_validating_policy_sees_the_stored_version_of_an_update() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let ns = fresh_namespace(&admin, "rv-probe").await;
    let name = format!("rv-probe-{ns}");
    let vap: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                                   "resources": ["leases"], "operations": ["UPDATE"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            },
            "matchConditions": [{"name": "the-probe", "expression": "request.name == 'probe'"}],
            "validations": [{
                "expression": "false",
                "messageExpression": "'probe saw object=' + (has(object.metadata.resourceVersion) ? object.metadata.resourceVersion : '<none>') + ' oldObject=' + oldObject.metadata.resourceVersion + ' end'"
            }]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .create(&PostParams::default(), &vap)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let now = MicroTime(Timestamp::now());
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("probe".into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("holder".into()),
                    lease_duration_seconds: Some(15),
                    renew_time: Some(now.clone()),
                    acquire_time: Some(now),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let saw = |r: kube::Result<Lease>| match r {
        Err(kube::Error::Api(s)) if s.message.contains("probe saw") => Some(s.message),
        _ => None,
    };
    // In effect once it denies (the API server loads policies a moment
    // after they are created; until then the update goes through, and the
    // next try releases the Lease as read again).
    let (with_version, released) =
        wait_for("the probe in effect", Duration::from_secs(30), || async {
            let read = leases.get("probe").await.unwrap();
            let released = lock_janitor::lock::lease::released(read, Timestamp::now());
            saw(leases
                .replace("probe", &PostParams::default(), &released)
                .await)
            .map(|m| (m, released))
        })
        .await;
    let stored = released.metadata.resource_version.clone().unwrap();
    let expect = format!("probe saw object={stored} oldObject={stored} end");
    assert!(with_version.contains(&expect), "{with_version}");
    let mut unconditional = released.clone();
    unconditional.metadata.resource_version = None;
    match leases
        .replace("probe", &PostParams::default(), &unconditional)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("resourceVersion") => {}
        r => panic!("a PUT without a version was not refused with 422 before the policy: {r:?}"),
    }
    let mut other = released.clone();
    other.metadata.resource_version = Some("1".into());
    match leases
        .replace("probe", &PostParams::default(), &other)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        r => panic!("another version was not refused with 409 before the policy: {r:?}"),
    }
    let release_patch = json!({"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}});
    let patched = saw(leases
        .patch(
            "probe",
            &PatchParams::default(),
            &Patch::Merge(&release_patch),
        )
        .await)
    .expect("a merge patch without a version reaches the policy");
    assert!(patched.contains(&expect), "{patched}");
    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
        .delete(&name, &Default::default())
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
        .delete(&name, &Default::default())
        .await
        .unwrap();
}
