//! The real node for `make test-node` and `make demo-node`: a control plane
//! and a node (testenv/src/node.rs), the real operator-lib operator as a
//! Deployment, the chart's janitor, a memory hog. Shared by tests/node.rs,
//! examples/demo_node.rs and examples/bench_node.rs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::ListParams;
use kube::{Api, Client};
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::node::{self, Node, NodeOptions, Prepared};
use lock_janitor_testenv::{audit, bin_dir, fresh_namespace, ControlPlane};

/// operator-lib's lock in testenv/node/manifests/operator.yaml.
pub const LOCK: &str = "memcached-operator-lock";
pub const OPERATOR_LABEL: &str = "app=memcached-operator";

/// The env var `make test-node` sets; without it tests/node.rs refuses to run
/// (it is not part of `make test`).
pub const ENV: &str = "LOCK_JANITOR_NODE";

pub struct RealNode {
    pub cp: ControlPlane,
    pub node: Node,
    pub client: Client,
    pub started: Duration,
}

fn manifests() -> PathBuf {
    crate::repo_root().join("testenv/node/manifests")
}

/// The static musl janitor for the image: $LOCK_JANITOR_MUSL_BIN, else
/// target/x86_64-unknown-linux-musl/release/lock-janitor.
pub fn musl_janitor() -> Option<PathBuf> {
    let p = std::env::var("LOCK_JANITOR_MUSL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            crate::repo_root().join("target/x86_64-unknown-linux-musl/release/lock-janitor")
        });
    p.exists().then_some(p)
}

impl RealNode {
    /// A control plane and a Ready node with the images imported (the
    /// janitor's too when `with_janitor_image`). Panics, naming what is missing.
    pub async fn start(with_janitor_image: bool) -> RealNode {
        let t = Instant::now();
        let prep = Prepared::new().unwrap_or_else(|e| panic!("{e}"));
        let cp = ControlPlane::start(prep.control_plane_options())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let node = Node::start(
            &prep,
            cp.kubeconfig_path(),
            cp.dir(),
            NodeOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("the real node did not start: {e}"));
        let janitor = if with_janitor_image {
            Some(musl_janitor().unwrap_or_else(|| {
                panic!("no static janitor: run `cargo build --release --target x86_64-unknown-linux-musl --bin lock-janitor` (make test-node does)")
            }))
        } else {
            None
        };
        node.import_images(janitor.as_deref())
            .unwrap_or_else(|e| panic!("importing images: {e}"));
        let client = cp.client().await.expect("admin client");
        RealNode {
            cp,
            node,
            client,
            started: t.elapsed(),
        }
    }

    pub async fn namespace(&self, prefix: &str) -> String {
        fresh_namespace(&self.client, prefix).await
    }

    /// Runs the control plane's kubectl as admin; panics on failure.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the control plane's kubectl as admin; its output, failed or not.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        let mut cmd = Command::new(bin_dir().join("kubectl"));
        cmd.args(args)
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(s) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(s.as_bytes())
                .expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// The real operator-lib operator: a Deployment of two replicas in `ns`.
    pub fn deploy_operator(&self, ns: &str) {
        let text = std::fs::read_to_string(manifests().join("operator.yaml"))
            .expect("operator.yaml")
            .replace("NAMESPACE", ns);
        self.kubectl(&["apply", "-n", ns, "-f", "-"], Some(&text));
    }

    pub async fn lock(&self, ns: &str) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.client.clone(), ns)
            .get_opt(LOCK)
            .await
            .expect("get the lock")
    }

    /// The pod that owns the lock, if any.
    pub async fn owner(&self, ns: &str) -> Option<String> {
        let cm = self.lock(ns).await?;
        Some(cm.metadata.owner_references?.first()?.name.clone())
    }

    pub async fn pods(&self, ns: &str, selector: &str) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(selector))
            .await
            .expect("list pods")
            .items
    }

    /// Waits until the lock is owned by a Running pod other than `not`
    /// and another replica runs; returns the owner.
    pub async fn wait_leader(&self, ns: &str, not: Option<&str>, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Some(o) = self.owner(ns).await {
                if Some(o.as_str()) != not {
                    let pods = self.pods(ns, OPERATOR_LABEL).await;
                    let running = |p: &Pod| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                            && p.metadata.deletion_timestamp.is_none()
                    };
                    let leads = pods
                        .iter()
                        .any(|p| p.metadata.name.as_deref() == Some(&o) && running(p));
                    if leads {
                        return o;
                    }
                }
            }
            if start.elapsed() > timeout {
                panic!(
                    "no new leader in {ns} within {timeout:?} (lock owner {:?}, not {not:?}); pods:\n{}\nkubelet log tail:\n{}",
                    self.owner(ns).await,
                    self.kubectl(&["get", "pods", "-n", ns, "-o", "wide"], None),
                    tail(&self.node.kubelet_log(), 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Both replicas Running and one of them waiting for the lock.
    pub async fn wait_standby(&self, ns: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            let waiting = self
                .pods(ns, OPERATOR_LABEL)
                .await
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| self.pod_log(ns, p).contains("Not the leader. Waiting."))
                .count();
            if waiting >= 1 {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "no replica waiting for the lock in {ns}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A container's log as the kubelet wrote it (podLogsDir), all restarts.
    pub fn pod_log(&self, ns: &str, pod: &Pod) -> String {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let dir = self
            .node
            .dir()
            .join("pod-logs")
            .join(format!("{ns}_{name}_{uid}"));
        let mut out = String::new();
        for c in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                out.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
            }
        }
        out
    }

    /// Opts the lock in (the janitor's own `label --apply`, as an admin would).
    pub fn label_locks(&self, ns: &str) {
        let out = Command::new(janitor_host_bin())
            .args(["label", "--apply", "--namespace", ns])
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .output()
            .expect("run lock-janitor label");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn wait_labeled(&self, ns: &str) {
        let start = Instant::now();
        loop {
            let labeled = self
                .lock(ns)
                .await
                .and_then(|cm| cm.metadata.labels)
                .and_then(|l| l.get("lock-janitor.io/watch").cloned())
                .as_deref()
                == Some("true");
            if labeled {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "lock not labeled"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Installs the chart (two replicas, election on) from the node's image
    /// lock-janitor.local/lock-janitor:dev into `ns`, watching `watch`.
    pub fn install_chart(&self, release: &str, ns: &str, watch: &[&str]) {
        self.helm_chart("install", release, ns, watch, &[], true);
    }

    /// Installs the chart with its shipped values (replicas, resync, log
    /// format, resources), only the image pointed at the node's
    /// lock-janitor.local/lock-janitor:dev and `watch` set.
    pub fn install_chart_as_shipped(&self, release: &str, ns: &str, watch: &[&str]) {
        self.helm_chart("install", release, ns, watch, &[], false);
    }

    /// Waits for the chart's Deployment (release `lock-janitor`) in `ns` to
    /// finish rolling out (3 minutes at most).
    pub fn wait_rollout(&self, ns: &str) {
        self.kubectl(
            &[
                "rollout",
                "status",
                "-n",
                ns,
                "deployment/lock-janitor",
                "--timeout=180s",
            ],
            None,
        );
    }

    /// `helm upgrade` of an install made by [`install_chart`](Self::install_chart)
    /// with the same values, and `sets` (`key=value`) on top; returns once
    /// helm has applied it (the rollout goes on).
    pub fn upgrade_chart(&self, release: &str, ns: &str, watch: &[&str], sets: &[&str]) {
        self.helm_chart("upgrade", release, ns, watch, sets, true);
    }

    /// `helm upgrade` of an install made by
    /// [`install_chart_as_shipped`](Self::install_chart_as_shipped), with
    /// `sets` (`key=value`) on top of the shipped values.
    pub fn upgrade_chart_as_shipped(&self, release: &str, ns: &str, watch: &[&str], sets: &[&str]) {
        self.helm_chart("upgrade", release, ns, watch, sets, false);
    }

    /// `test_values`: two replicas, `resync=5s` and plain logs on top of
    /// the chart's defaults (what the tests assert on).
    fn helm_chart(
        &self,
        verb: &str,
        release: &str,
        ns: &str,
        watch: &[&str],
        sets: &[&str],
        test_values: bool,
    ) {
        let chart = crate::repo_root().join("charts/lock-janitor");
        let mut args: Vec<String> = vec![
            verb.into(),
            release.into(),
            chart.display().to_string(),
            "--namespace".into(),
            ns.into(),
            "--set".into(),
            "image.registry=lock-janitor.local".into(),
            "--set".into(),
            "image.repository=lock-janitor".into(),
            "--set".into(),
            format!("image.tag={}", node::JANITOR_IMAGE_TAG),
            "--set".into(),
            "image.pullPolicy=Never".into(),
        ];
        if test_values {
            for set in ["replicas=2", "resync=5s", "logFormat=plain"] {
                args.push("--set".into());
                args.push(set.into());
            }
        }
        for (i, w) in watch.iter().enumerate() {
            args.push("--set".into());
            args.push(format!("watchNamespaces[{i}]={w}"));
        }
        for set in sets {
            args.push("--set".into());
            args.push((*set).to_owned());
        }
        let out = Command::new(bin_dir().join("helm"))
            .args(&args)
            .env("KUBECONFIG", self.cp.kubeconfig_path())
            .env("HELM_CACHE_HOME", self.cp.dir().join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.cp.dir().join("helm-config"))
            .env("HELM_DATA_HOME", self.cp.dir().join("helm-data"))
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "helm {verb}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The janitor pods' Lease holder (the chart's leader).
    pub async fn janitor_leader(&self, ns: &str, lease: &str) -> Option<String> {
        Api::<Lease>::namespaced(self.client.clone(), ns)
            .get_opt(lease)
            .await
            .ok()
            .flatten()?
            .spec?
            .holder_identity
    }

    /// Memory available as the kubelet computes it: capacity (MemTotal)
    /// minus the root memory cgroup's working set (usage - inactive_file).
    pub fn memory_available_mib() -> u64 {
        let usage: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory/memory.usage_in_bytes")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let stat = std::fs::read_to_string("/sys/fs/cgroup/memory/memory.stat").unwrap_or_default();
        let inactive: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        (total_kib * 1024).saturating_sub(usage.saturating_sub(inactive)) / (1 << 20)
    }

    /// A Guaranteed pod that allocates `mib` MiB (within its request, so the
    /// kubelet ranks it after pods that exceed theirs).
    pub fn hog(&self, ns: &str, name: &str, mib: u64) {
        let req = mib + 64;
        let pod = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","labels":{{"app":"hog"}}}},
"spec":{{"automountServiceAccountToken":false,"terminationGracePeriodSeconds":0,"containers":[{{"name":"hog",
"image":"{}","imagePullPolicy":"Never","args":["{mib}","1"],
"resources":{{"requests":{{"memory":"{req}Mi","cpu":"50m"}},"limits":{{"memory":"{req}Mi","cpu":"50m"}}}}}}]}}}}"#,
            node::HOG_IMAGE
        );
        self.kubectl(&["apply", "-n", ns, "-f", "-"], Some(&pod));
    }

    /// The kubelet's Event on a pod with `reason` (e.g. Evicted), if any.
    pub async fn event(&self, ns: &str, pod: &str, reason: &str) -> Option<Event> {
        Api::<Event>::namespaced(self.client.clone(), ns)
            .list(
                &ListParams::default()
                    .fields(&format!("involvedObject.name={pod},reason={reason}")),
            )
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    }

    pub fn audit(&self) -> Vec<AuditEvent> {
        audit::read(self.cp.audit_log_path())
    }

    /// Writes (create/update/patch/delete) in `ns` by `user`, any resource.
    pub fn writes(&self, user: &str, ns: &str) -> Vec<AuditEvent> {
        self.audit()
            .into_iter()
            .filter(|e| {
                e.user == user
                    && e.namespace.as_deref() == Some(ns)
                    && e.stage == "ResponseComplete"
                    && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
            })
            .collect()
    }
}

pub fn janitor_host_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LOCK_JANITOR_BIN") {
        return p.into();
    }
    crate::cargo_bin_exe().unwrap_or_else(|| crate::repo_root().join("target/debug/lock-janitor"))
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
