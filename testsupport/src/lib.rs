//! The test support, one crate (`lock-janitor-testsupport`, a
//! dev-dependency of lock-janitor) shared by the end-to-end tests
//! (`tests/e2e`, `tests/isolated`, `tests/node.rs`), the demos and the
//! benchmarks (`examples/`), compiled once: running the real janitor
//! binary, staging locks the way operator-lib does, and waiting for
//! outcomes (here and in `chart`, `cli`, `lease`); the chaos suite's engine
//! (`chaos_engine`); the real node (`real_node`); what the benchmarks share
//! (`bench`, `lease_burst`, `reclaim`).
//!
//! It does not depend on lock-janitor's library: a change to `src/` does not
//! rebuild it. Where a helper needs the library (`lease_burst`'s floor
//! sends the janitor's own release), the caller passes it in.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::ControlPlane;

pub mod bench;
pub mod chaos_engine;
pub mod chart;
pub mod cli;
pub mod lease;
pub mod lease_burst;
pub mod real_node;
pub mod reclaim;

pub const WATCH_LABEL: (&str, &str) = ("lock-janitor.io/watch", "true");
/// The identity the janitor runs as in tests, so the audit log tells its
/// requests apart from the test's own. Granted exactly what the chart grants.
pub const JANITOR_USER: &str = "lock-janitor-e2e";

/// Polls `f` every 200 ms until it returns `Some`, or panics after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_get_from("127.0.0.1", port, path).await
}

/// [`http_get`] from another address (a pod's IP, say).
pub async fn http_get_from(host: &str, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((host, port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of one sample in a Prometheus text exposition, matched by name
/// and a subset of its labels.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text, name, labels).next()
}

/// The sum of every series of metric `name` with these labels (others
/// may differ), 0 if there is none: a counter's total over a label.
pub fn sample_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).sum()
}

fn samples<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            if n != name {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse().ok())?
        })
}

/// A kubeconfig that acts as `user` (impersonation by the admin identity).
pub fn kubeconfig_as(cp: &ControlPlane, user: &str) -> PathBuf {
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).expect("admin kubeconfig");
    let text = admin.replacen("  user:\n", &format!("  user:\n    as: {user}\n"), 1);
    assert_ne!(
        text, admin,
        "kubeconfig layout changed: cannot add impersonation"
    );
    // Tests run in parallel: write once, atomically.
    let path = cp.dir().join(format!("kubeconfig-{user}"));
    if !path.exists() {
        let tmp = cp.dir().join(format!("kubeconfig-{user}.{}", free_port()));
        std::fs::write(&tmp, text).expect("write kubeconfig");
        std::fs::rename(&tmp, &path).expect("rename kubeconfig");
    }
    path
}

/// A copy of the admin kubeconfig pointing at a port where nothing listens.
pub fn kubeconfig_unreachable(cp: &ControlPlane) -> PathBuf {
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).expect("admin kubeconfig");
    let port = free_port();
    let text = admin.replace(cp.server_url(), &format!("https://127.0.0.1:{port}"));
    assert_ne!(text, admin, "kubeconfig has no {}", cp.server_url());
    // Named after the port, which is all that differs between two.
    let path = cp.dir().join(format!("kubeconfig-unreachable-{port}"));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |s: &[&str]| Some(s.iter().map(|x| x.to_string()).collect());
    PolicyRule {
        api_groups: v(groups),
        resources: v(resources),
        verbs: verbs.iter().map(|x| x.to_string()).collect(),
        ..Default::default()
    }
}

/// A user, as an RBAC subject.
pub fn user(name: &str) -> Subject {
    Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// A ServiceAccount, as an RBAC subject.
pub fn service_account(name: &str, namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// A Role `name` in `ns` with `rules`, bound to `subject` (beyond what the
/// chart grants, or instead of it).
pub async fn grant_in(
    client: &Client,
    ns: &str,
    name: &str,
    subject: Subject,
    rules: Vec<PolicyRule>,
) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role = Role {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![subject]),
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap_or_else(|e| panic!("creating Role {name}: {e}"));
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("creating RoleBinding {name}: {e}"));
}

/// Grants `JANITOR_USER` what the chart grants with deletePod=true.
pub async fn grant_janitor(client: &Client) {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(JANITOR_USER.into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(
                &[""],
                &["configmaps"],
                &["get", "list", "watch", "delete", "patch"],
            ),
            rule(&[""], &["pods"], &["get", "list", "watch", "delete"]),
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "list", "watch", "update", "delete", "patch"],
            ),
            rule(
                &["events.k8s.io"],
                &["events"],
                &["create", "patch", "list"],
            ),
            // Whether a freed lock's takeover is still wanted: its
            // namespace, and its holder's workload.
            rule(&[""], &["namespaces"], &["get"]),
            rule(&["apps"], &["replicasets"], &["get"]),
            rule(&["apps"], &["deployments"], &["get"]),
            rule(&["apps"], &["statefulsets"], &["get"]),
        ]),
        ..Default::default()
    };
    ignore_conflict(
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await,
    );
    bind_cluster_role(client, JANITOR_USER, JANITOR_USER).await;
}

/// Binds the ClusterRole `role` to the user `user` (idempotent).
pub async fn bind_cluster_role(client: &Client, user: &str, role: &str) {
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(user.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            ..Default::default()
        }]),
    };
    ignore_conflict(
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await,
    );
}

fn ignore_conflict<T>(r: kube::Result<T>) {
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating RBAC: {e}"),
    }
}

pub fn janitor_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LOCK_JANITOR_BIN") {
        return p.into();
    }
    cargo_bin_exe().unwrap_or_else(|| PathBuf::from("target/debug/lock-janitor"))
}

/// The repository's root (this crate is `testsupport/` in it).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testsupport/ has a parent")
}

/// The janitor binary cargo built beside a test of lock-janitor, what
/// `CARGO_BIN_EXE_lock-janitor` says to it: an integration test runs from
/// `<target>/<profile>/deps/`, the binary is `<target>/<profile>/lock-janitor`.
/// None in anything else (an example: `target/debug/lock-janitor` then).
pub fn cargo_bin_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(
        deps.parent()?
            .join(format!("lock-janitor{}", std::env::consts::EXE_SUFFIX)),
    )
}

/// The real `lock-janitor run`, as a child process. Killed on drop.
pub struct Janitor {
    child: Option<Child>,
    pub port: u16,
    pub log: PathBuf,
}

impl Janitor {
    /// Starts `lock-janitor run <args>` against the control plane, as
    /// `kubeconfig`'s identity, and waits until `/readyz` answers 200.
    pub async fn start(kubeconfig: &Path, args: &[&str]) -> Janitor {
        let j = Self::spawn(kubeconfig, args);
        j.wait_ready().await;
        j
    }

    /// As `start`, with `$POD_NAME` (its election identity) `pod`.
    pub async fn start_as_pod(kubeconfig: &Path, args: &[&str], pod: &str) -> Janitor {
        let j = Self::spawn_as(kubeconfig, args, Some(pod));
        j.wait_ready().await;
        j
    }

    pub fn spawn(kubeconfig: &Path, args: &[&str]) -> Janitor {
        Self::spawn_as(kubeconfig, args, None)
    }

    fn spawn_as(kubeconfig: &Path, args: &[&str], pod: Option<&str>) -> Janitor {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("lock-janitor-{port}-{}.log", std::process::id()));
        let out = std::fs::File::create(&log).expect("janitor log");
        let child = Command::new(janitor_bin())
            .arg("run")
            .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                // LOCK_JANITOR_TEST_LOG: more (or less) of the janitor's log.
                std::env::var("LOCK_JANITOR_TEST_LOG")
                    .unwrap_or_else(|_| "info,lock_janitor=debug,kube=warn".into()),
            )
            .env(
                "POD_NAME",
                pod.map_or_else(|| format!("lock-janitor-e2e-{port}"), str::to_owned),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {}: {e} (build it with `cargo build`)",
                    janitor_bin().display()
                )
            });
        Janitor {
            child: Some(child),
            port,
            log,
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (10 s at most) until the log has `line`: what a janitor says
    /// after a write (a reclaim's report follows its write, and waits while
    /// other locks are judged, up to 1 s) comes a little after what the
    /// write's watcher sees.
    pub async fn wait_said(&self, line: &str) {
        let what = format!("the janitor's log says {line:?}");
        wait_for(&what, Duration::from_secs(10), || async {
            self.logs().contains(line).then_some(())
        })
        .await
    }

    pub async fn readyz(&self) -> Option<u16> {
        http_get(self.port, "/readyz").await.ok().map(|(c, _)| c)
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // A janitor that exited (its port taken by another test's
            // janitor between free_port and its bind, say) must not pass for
            // ready on the port's new owner's answer.
            if self.exited() {
                panic!(
                    "janitor exited before it was ready; its log:\n{}",
                    self.logs()
                );
            }
            if self.readyz().await == Some(200) {
                return;
            }
            if Instant::now() > deadline {
                panic!("janitor not ready within 60s; its log:\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the process has exited (a zombie until it is waited for;
    /// Linux's /proc, where these tests run).
    fn exited(&self) -> bool {
        let Some(child) = &self.child else {
            return true;
        };
        match std::fs::read_to_string(format!("/proc/{}/stat", child.id())) {
            // "pid (comm) state ...": comm may hold spaces and parentheses.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => true,
        }
    }

    /// Resync sweeps done so far (a debug log line each).
    pub fn sweeps(&self) -> usize {
        self.logs().matches("resync sweep done").count()
    }

    /// Waits until `n` more resync sweeps are done.
    pub async fn wait_sweeps(&self, n: usize) {
        let before = self.sweeps();
        wait_for(
            &format!("{n} more resync sweeps"),
            Duration::from_secs(60),
            || async { (self.sweeps() >= before + n).then_some(()) },
        )
        .await;
    }

    pub async fn metrics(&self) -> String {
        let (code, body) = http_get(self.port, "/metrics")
            .await
            .expect("scrape /metrics");
        assert_eq!(code, 200, "/metrics answered {code}");
        body
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([format!("-{sig}"), self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {}", self.pid());
    }

    /// Waits for the process to exit, up to `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- janitor log ({}) ---\n{}",
                self.log.display(),
                self.logs()
            );
        }
    }
}

/// The janitor's metrics once `lock_janitor_reclaims_total{labels}` (the
/// first series these labels match) reached `n`: a reclaim is counted just after its Event
/// is written, after the write a test sees (the Event waits while other
/// locks are judged, 1 s at most).
pub async fn metrics_reclaimed(j: &Janitor, labels: &[(&str, &str)], n: f64) -> String {
    wait_for(
        &format!("lock_janitor_reclaims_total{labels:?} at {n}"),
        Duration::from_secs(30),
        || async {
            let m = j.metrics().await;
            (sample(&m, "lock_janitor_reclaims_total", labels).is_some_and(|v| v >= n)).then_some(m)
        },
    )
    .await
}

/// A leader-for-life lock exactly as operator-lib writes it: a ConfigMap whose
/// only ownerReference is the leader's own pod.
pub fn lock_for(name: &str, holder: &Pod, labeled: bool) -> ConfigMap {
    let labels =
        labeled.then(|| BTreeMap::from([(WATCH_LABEL.0.to_string(), WATCH_LABEL.1.to_string())]));
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: holder.metadata.namespace.clone(),
            labels,
            owner_references: Some(vec![pod_owner(holder)]),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn pod_owner(pod: &Pod) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// operator-lib's `leader.Become`: create the lock owned by our pod; on
/// AlreadyExists, if it is ours we lead, else retry with backoff from 1 s
/// doubling to 16 s. Returns once this pod leads. The opt-in label is part
/// of the lock as the operator's deployment would set it up.
pub async fn become_leader(client: &Client, me: &Pod, lock_name: &str, labeled: bool) -> ConfigMap {
    let ns = me.metadata.namespace.clone().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let my_uid = me.metadata.uid.clone().unwrap_or_default();
    let mut backoff = Duration::from_secs(1);
    loop {
        match api
            .create(&PostParams::default(), &lock_for(lock_name, me, labeled))
            .await
        {
            Ok(cm) => return cm,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                if let Ok(Some(existing)) = api.get_opt(lock_name).await {
                    let owners = existing
                        .metadata
                        .owner_references
                        .clone()
                        .unwrap_or_default();
                    if owners.iter().any(|o| o.uid == my_uid) {
                        return existing;
                    }
                }
            }
            Err(e) => eprintln!("become_leader: {e}; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(16));
    }
}

/// Creates a pod, marks it Running (as a kubelet would) and returns it.
pub async fn running_pod(client: &Client, ns: &str, name: &str, node: &str) -> Pod {
    lock_janitor_testenv::kubelet::create_pod(client, ns, name, node, &[("app", "operator")])
        .await
        .expect("create pod");
    lock_janitor_testenv::kubelet::set_running(client, ns, name)
        .await
        .expect("set running")
}

pub async fn create_lock(client: &Client, cm: &ConfigMap) -> ConfigMap {
    let ns = cm.metadata.namespace.clone().unwrap_or_default();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), cm)
        .await
        .expect("create lock")
}

pub async fn lock_exists(client: &Client, ns: &str, name: &str) -> bool {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .expect("get lock")
        .is_some()
}

/// Events (events.k8s.io/v1) in `ns` with this reason.
pub async fn events(client: &Client, ns: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Waits for an Event with `reason` regarding the object `name`.
pub async fn wait_event(client: &Client, ns: &str, reason: &str, name: &str) -> Event {
    wait_for(
        &format!("Event {reason} on {ns}/{name}"),
        Duration::from_secs(30),
        || async {
            events(client, ns, reason)
                .await
                .into_iter()
                .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        },
    )
    .await
}

/// Writes by `user` to configmaps or pods in `ns`, from the audit log.
pub fn writes_by(
    cp: &ControlPlane,
    user: &str,
    ns: &str,
) -> Vec<lock_janitor_testenv::audit::AuditEvent> {
    lock_janitor_testenv::audit::read(cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == user
                && e.namespace.as_deref() == Some(ns)
                && matches!(
                    e.verb.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
                && matches!(e.resource.as_deref(), Some("configmaps" | "pods"))
        })
        .collect()
}

/// Of the janitor's requests before the freeing write of `lock` (`before`,
/// in the order the API server answered them): the last is a GET of the
/// holder pod, and the intent Event on the lock (a create or patch of an
/// Event named after it) came before that GET and after an earlier read of
/// the holder (the judgement's GET, or a Lease's list of pods). Only a reclaim's own requests count:
/// watches, lists, sweeps and other locks' Events run beside it.
pub fn assert_holder_read_last(
    before: &[lock_janitor_testenv::audit::AuditEvent],
    lock: &str,
    holder: &str,
) {
    use lock_janitor_testenv::audit::AuditEvent;
    let holder_get = |e: &AuditEvent| {
        e.verb == "get"
            && e.resource.as_deref() == Some("pods")
            && e.subresource.is_none()
            && e.name.as_deref() == Some(holder)
    };
    let event_on_lock = |e: &AuditEvent| {
        e.resource.as_deref() == Some("events")
            && matches!(e.verb.as_str(), "create" | "patch")
            && e.name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{lock}.")))
    };
    // A Lease's judgement lists the pods its identity may name.
    let pods_list = |e: &AuditEvent| {
        e.verb == "list" && e.resource.as_deref() == Some("pods") && e.subresource.is_none()
    };
    let mine: Vec<(usize, &AuditEvent)> = before
        .iter()
        .enumerate()
        .filter(|(_, e)| e.effective_user() == JANITOR_USER && (holder_get(e) || event_on_lock(e)))
        .collect();
    let said: Vec<String> = mine
        .iter()
        .map(|(_, e)| {
            format!(
                "{} {}/{}",
                e.verb,
                e.resource.as_deref().unwrap_or_default(),
                e.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let n = mine.len();
    assert!(
        n >= 2
            && holder_get(mine[n - 1].1)
            && event_on_lock(mine[n - 2].1)
            && before[..mine[n - 2].0]
                .iter()
                .any(|e| e.effective_user() == JANITOR_USER && (holder_get(e) || pods_list(e))),
        "expected the holder read, the intent Event, the holder read again, then the write; was: {said:?}"
    );
}
