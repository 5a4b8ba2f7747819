//! Playing the kubelet: there is no kubelet in the test control plane, so tests
//! create nodes and move pods through their phases themselves. Every status
//! write goes through the `status` subresource, as a kubelet's does.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

/// Image of the pods made by [`create_pod`].
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
const PAUSE_IMAGE_ID: &str =
    "registry.k8s.io/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a";
/// Field manager of the status writes.
pub const FIELD_MANAGER: &str = "lock-janitor-testenv-kubelet";

fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).expect("time serializes")
}

fn hash(parts: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// A stable fake InternalIP for a node (10.96.x.y).
pub fn node_ip(node: &str) -> String {
    let h = hash(&["node", node]);
    format!("10.96.{}.{}", (h >> 8) % 256, h % 254 + 1)
}

/// A stable fake pod IP (10.244.x.y).
fn pod_ip(ns: &str, name: &str) -> String {
    let h = hash(&["pod", ns, name]);
    format!("10.244.{}.{}", (h >> 8) % 256, h % 254 + 1)
}

fn container_id(ns: &str, name: &str, uid: &str) -> String {
    let a = hash(&["c1", ns, name, uid]);
    let b = hash(&["c2", ns, name, uid]);
    let c = hash(&["c3", ns, name, uid]);
    let d = hash(&["c4", ns, name, uid]);
    format!("containerd://{a:016x}{b:016x}{c:016x}{d:016x}")
}

fn condition(type_: &str, status: &str, reason: Option<&str>) -> Value {
    let mut c = json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": now()});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    c
}

fn status_patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

/// Creates a Node (if it does not exist yet) and sets its status (Ready=True,
/// addresses, capacity, nodeInfo) through the status subresource. Idempotent.
pub async fn create_node(client: &Client, name: &str) -> kube::Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let resources =
        json!({"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let status = json!({"status": {
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": now(), "lastTransitionTime": now()},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "lastHeartbeatTime": now(), "lastTransitionTime": now()},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "lastHeartbeatTime": now(), "lastTransitionTime": now()},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status (lock-janitor-testenv)", "lastHeartbeatTime": now(), "lastTransitionTime": now()},
        ],
        "addresses": [
            {"type": "InternalIP", "address": node_ip(name)},
            {"type": "Hostname", "address": name},
        ],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": format!("{:032x}", hash(&["machine", name])),
            "systemUUID": format!("{:032x}", hash(&["uuid", name])),
            "bootID": format!("{:032x}", hash(&["boot", name])),
            "kernelVersion": "6.1.0", "osImage": "lock-janitor testenv",
            "containerRuntimeVersion": "containerd://2.0.0",
            "kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64",
        },
    }});
    nodes
        .patch_status(name, &status_patch_params(), &Patch::Merge(&status))
        .await
}

/// Renews the node's heartbeat (Ready condition and its Lease in
/// `kube-node-lease`), as a kubelet does every few seconds. Only matters when
/// the node-lifecycle controller runs ([`crate::Options::node_lifecycle`]).
pub async fn heartbeat(client: &Client, name: &str) -> kube::Result<Node> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch =
                json!({"spec": {"holderIdentity": name, "renewTime": MicroTime(Timestamp::now())}});
            leases
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(e) => return Err(e),
    }
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now()}
    ]}});
    Api::<Node>::all(client.clone())
        .patch_status(name, &status_patch_params(), &Patch::Strategic(&patch))
        .await
}

/// Creates a pod bound to `node` (spec.nodeName set: no scheduler involved),
/// one container `main` running [`PAUSE_IMAGE`]. Creates the node first if it
/// does not exist (the pod-GC controller deletes pods bound to missing nodes
/// after ~40 s).
pub async fn create_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> kube::Result<Pod> {
    if Api::<Node>::all(client.clone())
        .get_opt(node)
        .await?
        .is_none()
    {
        create_node(client, node).await?;
    }
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![Container {
                name: "main".to_string(),
                image: Some(PAUSE_IMAGE.to_string()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
}

struct PodFacts {
    node: String,
    uid: String,
    start_time: Value,
}

async fn facts(api: &Api<Pod>, name: &str) -> kube::Result<PodFacts> {
    let pod = api.get(name).await?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let start_time = match pod.status.as_ref().and_then(|s| s.start_time.clone()) {
        Some(t) => serde_json::to_value(t).expect("time serializes"),
        None => now(),
    };
    Ok(PodFacts {
        node,
        uid: pod.metadata.uid.unwrap_or_default(),
        start_time,
    })
}

async fn patch_pod_status(api: &Api<Pod>, name: &str, patch: Value) -> kube::Result<Pod> {
    api.patch_status(name, &status_patch_params(), &Patch::Merge(&patch))
        .await
}

/// Phase Running: Initialized/Ready/ContainersReady/PodScheduled True, the
/// container running, podIP/hostIP and startTime set.
pub async fn set_running(client: &Client, ns: &str, name: &str) -> kube::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let f = facts(&api, name).await?;
    let ip = pod_ip(ns, name);
    let host_ip = node_ip(&f.node);
    let patch = json!({"status": {
        "phase": "Running",
        "reason": null,
        "message": null,
        "conditions": [
            condition("PodReadyToStartContainers", "True", None),
            condition("Initialized", "True", None),
            condition("Ready", "True", None),
            condition("ContainersReady", "True", None),
            condition("PodScheduled", "True", None),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": f.start_time,
        "containerStatuses": [{
            "name": "main",
            "image": PAUSE_IMAGE,
            "imageID": PAUSE_IMAGE_ID,
            "containerID": container_id(ns, name, &f.uid),
            "ready": true,
            "started": true,
            "restartCount": 0,
            "state": {"running": {"startedAt": f.start_time}},
        }],
    }});
    patch_pod_status(&api, name, patch).await
}

/// Phase Failed with `status.reason = reason` (`Evicted`, `Preempting`,
/// `Terminated`, `NodeShutdown`, or anything else) and `status.message`.
/// Ready/ContainersReady False, the container terminated (exit code 137 for
/// the kubelet-initiated reasons above, else 1), finishedAt now. The
/// kubelet-initiated reasons also get a `DisruptionTarget` condition.
pub async fn set_failed(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    message: &str,
) -> kube::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let f = facts(&api, name).await?;
    let killed = matches!(
        reason,
        "Evicted" | "Preempting" | "Terminated" | "NodeShutdown" | "Shutdown"
    );
    let mut conditions = vec![];
    if killed {
        let mut c = condition("DisruptionTarget", "True", Some("TerminationByKubelet"));
        c["message"] = json!(message);
        conditions.push(c);
    }
    conditions.extend([
        condition("PodReadyToStartContainers", "False", None),
        condition("Initialized", "True", None),
        condition("Ready", "False", Some("PodFailed")),
        condition("ContainersReady", "False", Some("PodFailed")),
        condition("PodScheduled", "True", None),
    ]);
    let patch = json!({"status": {
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "conditions": conditions,
        "startTime": f.start_time,
        "containerStatuses": [terminated(ns, name, &f, if killed { 137 } else { 1 }, "Error")],
    }});
    patch_pod_status(&api, name, patch).await
}

/// The status of the pod's one container after it terminated just now.
fn terminated(ns: &str, name: &str, f: &PodFacts, exit_code: i32, reason: &str) -> Value {
    json!({
        "name": "main",
        "image": PAUSE_IMAGE,
        "imageID": PAUSE_IMAGE_ID,
        "containerID": container_id(ns, name, &f.uid),
        "ready": false,
        "started": false,
        "restartCount": 0,
        "state": {"terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": f.start_time,
            "finishedAt": now(),
            "containerID": container_id(ns, name, &f.uid),
        }},
    })
}

/// Phase Succeeded: the container terminated with exit code 0, reason Completed.
pub async fn set_succeeded(client: &Client, ns: &str, name: &str) -> kube::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let f = facts(&api, name).await?;
    let patch = json!({"status": {
        "phase": "Succeeded",
        "reason": null,
        "message": null,
        "conditions": [
            condition("PodReadyToStartContainers", "False", None),
            condition("Initialized", "True", Some("PodCompleted")),
            condition("Ready", "False", Some("PodCompleted")),
            condition("ContainersReady", "False", Some("PodCompleted")),
            condition("PodScheduled", "True", None),
        ],
        "startTime": f.start_time,
        "containerStatuses": [terminated(ns, name, &f, 0, "Completed")],
    }});
    patch_pod_status(&api, name, patch).await
}

/// Deletes a pod at once (grace period 0), as the kubelet's final delete does
/// once the containers are gone. A 404 counts as success.
pub async fn force_delete_pod(client: &Client, ns: &str, name: &str) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
