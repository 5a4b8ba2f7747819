//! The shipped alert rules in a real Prometheus server: it scrapes the real
//! janitor's /metrics (every second, with the chart's rules file loaded, and
//! without honouring the metrics' labels, as OpenShift's user workload
//! monitoring scrapes), and after a staged eviction and reclaim its HTTP API
//! shows LockJanitorStaleLockReclaimed firing for that lock, named by its
//! `lock_namespace`.
//!
//! Needs the `prometheus` binary (Debian package `prometheus`; $PROMETHEUS
//! to use another one).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
/// The namespace the scrape target says the janitor runs in.
const JANITOR_HOME: &str = "janitor-home";

fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/lock-janitor/files/prometheus-rules.yaml")
}

fn prometheus_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROMETHEUS").filter(|p| !p.is_empty()) {
        return p.into();
    }
    for p in ["/usr/bin/prometheus", "/usr/local/bin/prometheus"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!(
        "prometheus not found: install it (Debian: apt-get install prometheus) or set PROMETHEUS"
    );
}

/// A Prometheus server on loopback with its own config and storage in a
/// temp dir. Killed (and its dir removed) on drop.
struct Prometheus {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// Scrapes `127.0.0.1:<target>` every second as job `lock-janitor`, with
    /// the target's own `namespace` label (`JANITOR_HOME`, as the Prometheus
    /// Operator sets it) winning over the metrics' labels (no honor_labels,
    /// as the chart's ServiceMonitor and OpenShift do), and evaluates the
    /// chart's rules every second.
    async fn start(target: u16) -> Prometheus {
        Self::start_with_rules(target, &rules_file()).await
    }

    /// As `start`, with the rules file `rules`.
    async fn start_with_rules(target: u16, rules: &Path) -> Prometheus {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "lock-janitor-prometheus-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("data")).expect("prometheus dir");
        let config = format!(
            "global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: lock-janitor
    honor_labels: false
    static_configs:
      - targets: ['127.0.0.1:{target}']
        labels:
          namespace: {JANITOR_HOME}
",
            rules = rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(prometheus_bin())
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", prometheus_bin().display()));
        let p = Prometheus {
            child: Some(child),
            port,
            dir,
        };
        wait_for("Prometheus ready", WAIT, || async {
            (http_get(p.port, "/-/ready").await.ok()?.0 == 200).then_some(())
        })
        .await;
        p
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the `data` of a successful answer.
    async fn api(&self, path: &str) -> Option<Value> {
        let (code, body) = http_get(self.port, path).await.ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (code == 200 && v["status"] == "success").then(|| v["data"].clone())
    }

    /// An instant query: the result vector.
    async fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        self.api(&path)
            .await
            .and_then(|d| d["result"].as_array().cloned())
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `lock_janitor_*` name in `text`, with its metric family (a
/// histogram's `_bucket`, `_sum` and `_count` belong to it).
fn metric_families(text: &str) -> Vec<(&str, &str)> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("lock_janitor_"))
        .map(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            (name, family)
        })
        .collect()
}

fn value_of(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

#[tokio::test]
async fn reclaim_alert_fires_in_prometheus() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "prom").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    let leader = running_pod(&client, &ns, "leader", &node).await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;

    let j = Janitor::start(
        &kubeconfig_as(cp, JANITOR_USER),
        &[
            "--namespace",
            &ns,
            "--resync",
            "2s",
            "--takeover-timeout",
            "4s",
        ],
    )
    .await;
    let prom = Prometheus::start(j.port).await;
    // The count by kind and reason is there at 0 before any reclaim, so a
    // first one is counted.
    let by_reason = "lock_janitor_reclaims_by_reason_total{kind=\"configmap\",reason=\"Evicted\"}";
    wait_for("Prometheus scraped the reclaims at 0", WAIT, || async {
        let r = prom.query(by_reason).await;
        (r.len() == 1 && value_of(&r[0]) == Some(0.0)).then_some(())
    })
    .await;

    // Prometheus scrapes the janitor, which judged the lock held. No reclaim
    // series exists for a lock that was never reclaimed (no series per lock
    // "just in case"), and nothing fires.
    let counter = format!(
        "lock_janitor_reclaims_total{{kind=\"configmap\",lock_namespace=\"{ns}\",lock=\"op-lock\",reason=\"Evicted\"}}"
    );
    let held = "lock_janitor_locks{kind=\"configmap\",state=\"held\"}";
    wait_for("Prometheus scraped the held lock", WAIT, || async {
        let r = prom.query(held).await;
        (r.len() == 1 && value_of(&r[0]) == Some(1.0)).then_some(())
    })
    .await;
    assert!(prom.query(&counter).await.is_empty());
    let firing = format!(
        "ALERTS{{alertname=\"LockJanitorStaleLockReclaimed\",alertstate=\"firing\",lock_namespace=\"{ns}\"}}"
    );
    assert!(prom.query(&firing).await.is_empty());

    kubelet::set_failed(&client, &ns, "leader", "Evicted", "low on memory")
        .await
        .expect("evict");
    wait_for("lock reclaimed", WAIT, || async {
        (!lock_exists(&client, &ns, "op-lock").await).then_some(())
    })
    .await;

    let alert = wait_for("LockJanitorStaleLockReclaimed firing", WAIT, || async {
        prom.query(&firing).await.into_iter().next()
    })
    .await;
    let labels = &alert["metric"];
    // The lock's namespace, whatever the scrape did to `namespace`.
    assert_eq!(labels["lock_namespace"], ns.as_str(), "{alert}");
    assert_eq!(labels["lock"], "op-lock", "{alert}");
    assert_eq!(labels["reason"], "Evicted", "{alert}");
    assert_eq!(labels["kind"], "configmap", "{alert}");
    assert_eq!(labels["severity"], "info", "{alert}");

    // The alerts API carries the annotations people read.
    let alerts = prom.api("/api/v1/alerts").await.expect("alerts API");
    let a = alerts["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| {
            a["labels"]["alertname"] == "LockJanitorStaleLockReclaimed"
                && a["labels"]["lock_namespace"] == ns.as_str()
        })
        .unwrap_or_else(|| panic!("not in /api/v1/alerts: {alerts}"));
    assert_eq!(a["state"], "firing");
    assert_eq!(
        a["annotations"]["summary"],
        format!("lock-janitor reclaimed the stale configmap lock {ns}/op-lock (Evicted).").as_str()
    );
    assert!(a["annotations"]["runbook_url"]
        .as_str()
        .is_some_and(|u| u.ends_with("docs/runbooks.md#lockjanitorstalelockreclaimed")));

    // The counter was born at 1 with the reclaim; its `namespace` is the
    // target's, its `lock_namespace` the lock's.
    let r = prom.query(&counter).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(value_of(&r[0]), Some(1.0));
    assert_eq!(r[0]["metric"]["namespace"], JANITOR_HOME, "{r:?}");
    // The documented "how many" queries count that first reclaim, and the
    // first takeover timeout (nobody made the lock again within 4 s).
    // increase() extrapolates from its samples to the window's end, by as
    // much as a scrape interval: a series a few scrapes old reads high for
    // a few seconds, then settles, hence round() and the wait.
    for (what, q) in [
        (
            "reclaims a day",
            "round(sum by (kind, reason) (increase(lock_janitor_reclaims_by_reason_total{kind=\"configmap\",reason=\"Evicted\"}[1d])))".to_owned(),
        ),
        (
            "takeover timeouts a day",
            format!("round(sum by (lock_namespace, lock) (increase(lock_janitor_takeover_timeouts_total{{lock_namespace=\"{ns}\"}}[1d])))"),
        ),
    ] {
        let v = wait_for(what, WAIT, || async {
            let r = prom.query(&q).await;
            r.first().and_then(value_of).filter(|v| *v == 1.0)
        })
        .await;
        assert_eq!(v, 1.0, "{what}: {q}");
    }
    let last = format!(
        "max by (kind, lock_namespace, lock) (max_over_time(lock_janitor_last_reclaim_timestamp_seconds{{lock_namespace=\"{ns}\"}}[1d]))"
    );
    let r = prom.query(&last).await;
    assert_eq!(r.len(), 1, "which locks were reclaimed: {r:?}");
    assert_eq!(r[0]["metric"]["lock"], "op-lock", "{r:?}");
    // Only the reason that happened fires.
    let all = prom
        .query(&format!(
            "ALERTS{{alertname=\"LockJanitorStaleLockReclaimed\",lock_namespace=\"{ns}\"}}"
        ))
        .await;
    assert_eq!(all.len(), 1, "{all:?}");

    // Every query of the shipped Grafana dashboard parses and runs in this
    // Prometheus, and names only metrics the janitor exports.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("charts/lock-janitor/files/grafana-dashboard.json"),
        )
        .expect("the dashboard"),
    )
    .expect("dashboard JSON");
    let exported: std::collections::BTreeSet<String> = lock_janitor::metrics::Metrics::new()
        .unwrap()
        .names()
        .iter()
        .cloned()
        .collect();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    // The dashboard's panels that count events count this first reclaim
    // and this first takeover timeout: 1 each for this lock.
    for title in [
        "Reclaims (per lock, last 10m)",
        "Takeover timeouts (last 1h)",
    ] {
        let expr = dashboard["panels"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["title"] == title)
            .and_then(|p| p["targets"][0]["expr"].as_str())
            .unwrap_or_else(|| panic!("no panel {title:?} in the dashboard"))
            .replace("$cluster", ".*")
            .replace("$job", ".*");
        let q = format!("round({expr})");
        let v = wait_for(title, WAIT, || async {
            prom.query(&q)
                .await
                .iter()
                .find(|r| {
                    r["metric"]["lock_namespace"] == ns.as_str() && r["metric"]["lock"] == "op-lock"
                })
                .and_then(value_of)
                .filter(|v| *v == 1.0)
        })
        .await;
        assert_eq!(v, 1.0, "{title}: {q}");
    }
    // The alert rules (and their comments) name only exported metrics too.
    let rules = std::fs::read_to_string(rules_file()).expect("rules file");
    for (name, family) in metric_families(&rules) {
        assert!(
            exported.contains(family),
            "the rules name {name}, not exported"
        );
    }
    for e in &exprs {
        let path = format!("/api/v1/query?query={}", url_encode(e));
        assert!(
            prom.api(&path).await.is_some(),
            "the dashboard query fails: {e}"
        );
        for (name, family) in metric_families(e) {
            assert!(
                exported.contains(family),
                "{e} names {name}, not exported: {exported:?}"
            );
        }
    }
}

/// LockJanitorUnprotectedLocks in a real Prometheus, scraping a janitor with
/// --auto-opt-in that may not write (--dry-run: it counts and never labels):
/// one unlabeled lock candidate fires it; labeled by hand, the candidate is
/// no longer counted and the alert goes. The rule is the shipped one with
/// its `for: 30m` cut to 3 s (the 30 minutes are the promtool case's).
#[tokio::test]
async fn unprotected_locks_alert_fires_until_the_lock_is_labeled() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "prom-unprotected").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    let holder = running_pod(&client, &ns, "operator-0", &node).await;
    create_lock(&client, &lock_for("op-lock", &holder, false)).await;

    let rules = std::fs::read_to_string(rules_file()).expect("rules");
    let (before, after) = rules
        .split_once("- alert: LockJanitorUnprotectedLocks")
        .expect("the rule is shipped");
    assert!(after.contains("for: 30m"), "{after}");
    let short = format!(
        "{before}- alert: LockJanitorUnprotectedLocks{}",
        after.replacen("for: 30m", "for: 3s", 1)
    );
    let dir = tempfile::tempdir().expect("rules dir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, short).expect("rules copy");

    let j = Janitor::start(
        &kubeconfig_as(cp, JANITOR_USER),
        &["--namespace", &ns, "--auto-opt-in", "--dry-run"],
    )
    .await;
    let prom = Prometheus::start_with_rules(j.port, &path).await;
    let firing =
        "ALERTS{alertname=\"LockJanitorUnprotectedLocks\",alertstate=\"firing\",kind=\"configmap\"}";
    let alert = wait_for("LockJanitorUnprotectedLocks firing", WAIT, || async {
        prom.query(firing).await.into_iter().next()
    })
    .await;
    assert_eq!(alert["metric"]["severity"], "warning", "{alert}");
    assert_eq!(alert["metric"]["job"], "lock-janitor", "{alert}");

    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), &ns);
    let label = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
    cms.patch(
        "op-lock",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&label),
    )
    .await
    .expect("label the lock");
    wait_for("LockJanitorUnprotectedLocks resolved", WAIT, || async {
        prom.query(firing).await.is_empty().then_some(())
    })
    .await;
    let gauge = "lock_janitor_unprotected_locks{kind=\"configmap\"}";
    let r = prom.query(gauge).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(value_of(&r[0]), Some(0.0));
}
