//! Whether anyone still wants a freed lock taken over: its namespace is not
//! being deleted, and the workload that ran its holder (the holder pod's
//! controller: a ReplicaSet, followed up to its Deployment, or a
//! StatefulSet) still exists and asks for replicas. Read live at each look
//! of a follower, so that what is awaited stays derived from the API.
//! Anything this cannot read (no RBAC for it, an API error, a controller of
//! another kind) counts as wanted: the doubt keeps the alert possible.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Client};
use tracing::debug;

use crate::call;
use crate::lock::Holder;

/// What runs a lock's holder pod, as far as it is known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// Not read yet (after a restart): read from the holder pod at the
    /// first look, if the pod is still there.
    #[default]
    Unread,
    /// A pod without a controller, or one of a kind not followed here (a
    /// Job, a DaemonSet, an operator's own): always wanted.
    Unknown,
    /// A ReplicaSet (and through it its Deployment) or a StatefulSet, by
    /// name, in the lock's namespace.
    ReplicaSet(String),
    StatefulSet(String),
}

impl Workload {
    /// The workload of a holder pod: its controller owner.
    pub fn of(pod: Option<&Pod>) -> Workload {
        let Some(pod) = pod else {
            return Workload::Unread;
        };
        let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
        match owners.iter().find(|o| o.controller == Some(true)) {
            Some(o) if apps(o) && o.kind == "ReplicaSet" => Workload::ReplicaSet(o.name.clone()),
            Some(o) if apps(o) && o.kind == "StatefulSet" => Workload::StatefulSet(o.name.clone()),
            _ => Workload::Unknown,
        }
    }
}

fn apps(o: &OwnerReference) -> bool {
    o.api_version == "apps/v1"
}

/// Whether a takeover is still wanted.
#[derive(Debug, PartialEq, Eq)]
pub enum Wanted {
    Yes,
    /// The namespace is gone or being deleted: nothing more to follow.
    NoNamespace(&'static str),
    /// The workload is gone or scaled to 0: not awaited any more.
    NoWorkload(&'static str),
}

/// A read that found nothing (404) is `None`; one that failed is a doubt:
/// wanted.
async fn read<K>(api: Api<K>, name: &str, what: &str) -> Option<Option<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match call(format!("reading {what} {name}"), api.get_opt(name)).await {
        Ok(o) => Some(o),
        Err(e) => {
            debug!(name, error = %e, "could not read {what}; the takeover stays awaited");
            None
        }
    }
}

/// Replicas asked for: unset means 1, as the API defaults it.
fn scaled_to_zero(replicas: Option<i32>) -> bool {
    replicas == Some(0)
}

/// Whether a takeover of a lock in `namespace` held by `old` is still
/// wanted. `workload` None: the lock is merely followed (only its
/// namespace matters); `Unread` is read from the holder pod here, once.
pub async fn wanted(
    client: &Client,
    namespace: &str,
    old: &Holder,
    workload: Option<&mut Workload>,
) -> Wanted {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match read(namespaces, namespace, "namespace").await {
        Some(None) => return Wanted::NoNamespace("namespace deleted"),
        Some(Some(n)) if n.metadata.deletion_timestamp.is_some() => {
            return Wanted::NoNamespace("namespace being deleted")
        }
        _ => {}
    }
    let Some(workload) = workload else {
        return Wanted::Yes;
    };
    if *workload == Workload::Unread {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        *workload = match read(pods, &old.name, "the dead holder").await {
            Some(Some(p)) if p.metadata.uid.as_deref() == Some(old.uid.as_str()) => {
                Workload::of(Some(&p))
            }
            // Gone, or another pod under its name: nothing says whose it was.
            Some(_) => Workload::Unknown,
            // Not read: tried again at the next look.
            None => return Wanted::Yes,
        };
    }
    let deployment = match &*workload {
        Workload::Unread | Workload::Unknown => return Wanted::Yes,
        Workload::StatefulSet(name) => {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
            return match read(api, name, "statefulset").await {
                Some(None) => Wanted::NoWorkload("statefulset deleted"),
                Some(Some(s)) if scaled_to_zero(s.spec.as_ref().and_then(|s| s.replicas)) => {
                    Wanted::NoWorkload("statefulset scaled to 0")
                }
                _ => Wanted::Yes,
            };
        }
        Workload::ReplicaSet(name) => {
            let api: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
            let rs = match read(api, name, "replicaset").await {
                Some(None) => return Wanted::NoWorkload("replicaset deleted"),
                Some(Some(rs)) => rs,
                None => return Wanted::Yes,
            };
            let owners = rs.metadata.owner_references.as_deref().unwrap_or_default();
            match owners
                .iter()
                .find(|o| o.controller == Some(true) && apps(o) && o.kind == "Deployment")
            {
                Some(d) => d.name.clone(),
                // A ReplicaSet of its own: its replicas say.
                None if scaled_to_zero(rs.spec.as_ref().and_then(|s| s.replicas)) => {
                    return Wanted::NoWorkload("replicaset scaled to 0")
                }
                None => return Wanted::Yes,
            }
        }
    };
    // A Deployment's ReplicaSets come and go with rollouts: its own replicas
    // say whether it wants pods.
    let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    match read(api, &deployment, "deployment").await {
        Some(None) => Wanted::NoWorkload("deployment deleted"),
        Some(Some(d)) if scaled_to_zero(d.spec.as_ref().and_then(|s| s.replicas)) => {
            Wanted::NoWorkload("deployment scaled to 0")
        }
        _ => Wanted::Yes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod_owned_by(owners: Vec<OwnerReference>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                owner_references: Some(owners),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn owner(api_version: &str, kind: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "op-7d9f".into(),
            uid: "u".into(),
            controller,
            ..Default::default()
        }
    }

    #[test]
    fn the_workload_is_the_pods_controller_of_a_kind_followed() {
        let table = [
            (
                vec![owner("apps/v1", "ReplicaSet", Some(true))],
                Workload::ReplicaSet("op-7d9f".into()),
            ),
            (
                vec![owner("apps/v1", "StatefulSet", Some(true))],
                Workload::StatefulSet("op-7d9f".into()),
            ),
            // Not the controller: an owner only.
            (
                vec![owner("apps/v1", "ReplicaSet", None)],
                Workload::Unknown,
            ),
            (
                vec![owner("batch/v1", "Job", Some(true))],
                Workload::Unknown,
            ),
            (
                vec![owner("example.com/v1", "ReplicaSet", Some(true))],
                Workload::Unknown,
            ),
            (vec![], Workload::Unknown),
        ];
        for (owners, want) in table {
            assert_eq!(
                Workload::of(Some(&pod_owned_by(owners.clone()))),
                want,
                "{owners:?}"
            );
        }
        assert_eq!(Workload::of(None), Workload::Unread);
    }
}
