//! The checks of what the chart installed: the Deployment and its pods, the
//! leader Lease, the auto opt-in policy, the Prometheus Operator objects.

use k8s_openapi::api::coordination::v1::Lease;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};

use super::selectors::{self, Labels, Picked};
use super::{release_selector, Check, Install, PART_OF_LABEL};
use crate::call;

/// Whether the API server serves `resource` (plural) in `group_version`.
pub async fn served(client: &Client, group_version: &str, resource: &str) -> anyhow::Result<bool> {
    match call(
        format!("discovering {group_version}"),
        client.list_api_group_resources(group_version),
    )
    .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == resource)),
        Err(crate::Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An `Api` of a kind this crate has no type for (its plural guessed by
/// kube, right for every kind here).
fn dynamic(client: &Client, gv: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let (group, version) = gv.split_once('/').unwrap_or(("", gv));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The admission policy of `kind` named `name` and, if there is one, its
/// binding of that name.
pub async fn policy_and_binding(
    i: &Install,
    gv: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<(DynamicObject, Option<DynamicObject>)>> {
    let read = |kind: String, action: String| async move {
        call(action, dynamic(&i.client, gv, &kind, None).get_opt(name)).await
    };
    let Some(policy) = read(kind.to_owned(), format!("reading {name}")).await? else {
        return Ok(None);
    };
    let binding = read(format!("{kind}Binding"), format!("reading binding {name}")).await?;
    Ok(Some((policy, binding)))
}

fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn replicas(i: &Install) -> i32 {
    i.deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
}

/// Check 1: the Deployment exists (it was found) and its pods are ready.
pub fn install_found(i: &Install) -> Check {
    const NAME: &str = "install-found";
    let want = replicas(i);
    let ready_replicas = i
        .deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let what = format!(
        "deployment {}/{}{}",
        i.namespace,
        i.name,
        i.release
            .as_ref()
            .map(|r| format!(" (release {r})"))
            .unwrap_or_default()
    );
    if want == 0 {
        return Check::warn(
            NAME,
            format!("{what} is scaled to 0 replicas: no janitor runs"),
            format!(
                "kubectl -n {} scale deployment/{} --replicas=2",
                i.namespace, i.name
            ),
        );
    }
    if ready_replicas < want {
        let look = format!(
            "kubectl -n {ns} describe pods -l {sel}; kubectl -n {ns} logs -l {sel} (a pod is ready once every watch has synced)",
            ns = i.namespace,
            sel = i.pod_selector()
        );
        let pods = not_ready_pods(i);
        return Check::fail(
            NAME,
            format!("{what}: {ready_replicas}/{want} pods ready{pods}"),
            look,
        );
    }
    if let Some(e) = &i.args_error {
        return Check::warn(
            NAME,
            format!("{what}: {ready_replicas}/{want} pods ready, but its flags do not parse ({e}); the checks assume the defaults"),
            "compare the Deployment's args and LOCK_JANITOR_* env with `lock-janitor run --help`",
        );
    }
    if i.run.dry_run {
        let (how, hint) = dry_run_how(i);
        return Check::warn(
            NAME,
            format!("{what}: {ready_replicas}/{want} pods ready, in dry-run mode ({how}): it reports stale locks and frees none"),
            hint,
        );
    }
    if !i.unread_env.is_empty() {
        return Check::warn(
            NAME,
            format!(
                "{what}: {ready_replicas}/{want} pods ready; its container sets {} through valueFrom, which check does not read: \
                 the checks assume what its args say, else the defaults",
                i.unread_env.join(", ")
            ),
            "set these flags in the container's args (the chart's values or extraArgs) so that check sees them",
        );
    }
    Check::ok(NAME, format!("{what}: {ready_replicas}/{want} pods ready"))
}

/// `; not ready: pod (phase), ...` for the pods not ready, or nothing.
fn not_ready_pods(i: &Install) -> String {
    let not_ready: Vec<String> = i
        .pods
        .iter()
        .filter(|p| !ready(p))
        .map(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "no status".into());
            format!(
                "{} ({phase})",
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    if not_ready.is_empty() {
        String::new()
    } else {
        format!("; not ready: {}", not_ready.join(", "))
    }
}

/// How dry-run mode is on (the env or the flag), and how to turn it off.
fn dry_run_how(i: &Install) -> (String, String) {
    if i.from_env.iter().any(|e| e == DRY_RUN_ENV) {
        (
            format!("{DRY_RUN_ENV} in its container's env"),
            format!(
                "to let it free stale locks, remove {DRY_RUN_ENV} from the container's env (the chart's extraEnv), then {}",
                i.helm_upgrade("")
            ),
        )
    } else {
        (
            "--dry-run".to_owned(),
            format!(
                "to let it free stale locks: {}",
                i.helm_upgrade("--set dryRun=false")
            ),
        )
    }
}

/// The variable that turns on `run --dry-run`.
const DRY_RUN_ENV: &str = "LOCK_JANITOR_DRY_RUN";

/// Check 2: with leader election, a pod of the Deployment holds a fresh Lease.
pub async fn leader(i: &Install) -> Check {
    const NAME: &str = "leader";
    let want = replicas(i);
    if !i.run.leader_elect {
        if want > 1 {
            return Check::warn(
                NAME,
                format!("{want} replicas without --leader-elect: every replica writes"),
                "the chart turns on --leader-elect with replicas > 1; do not remove it with extraArgs",
            );
        }
        return Check::ok(NAME, "one replica, no leader election: it writes itself");
    }
    let ns = i
        .run
        .leader_elect_namespace
        .clone()
        .unwrap_or_else(|| i.namespace.clone());
    let name = &i.run.leader_elect_lease;
    let api: Api<Lease> = Api::namespaced(i.client.clone(), &ns);
    let lease = match call(format!("reading lease {ns}/{name}"), api.get_opt(name)).await {
        Ok(l) => l,
        Err(e) => {
            return Check::or_failed(
                NAME,
                Err(e.into()),
                "get on leases in the install's namespace",
            )
        }
    };
    let logs = format!(
        "read the replicas' logs: kubectl -n {} logs -l {} --prefix | grep -i lease",
        i.namespace,
        i.pod_selector()
    );
    let Some(lease) = lease else {
        return Check::fail(
            NAME,
            format!("no leader Lease {ns}/{name}: no replica has led yet"),
            format!("a ready replica takes it within seconds; {logs}"),
        );
    };
    let spec = lease.spec.unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder.is_empty() {
        return Check::fail(
            NAME,
            format!("the leader Lease {ns}/{name} is held by nobody"),
            logs,
        );
    }
    let now = Timestamp::now();
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    let renewed = spec.renew_time.map(|t| t.0);
    let age = renewed.map(|t| now.duration_since(t).as_secs());
    match age {
        Some(age) if age <= duration => {}
        _ => {
            let ago = age
                .map(|a| format!("{}s ago", a - duration))
                .unwrap_or_else(|| "(never renewed)".into());
            return Check::fail(
                NAME,
                format!(
                    "the leader Lease {ns}/{name} held by {holder} expired {ago}: nobody leads"
                ),
                format!("the leader stopped renewing; {logs}"),
            );
        }
    }
    let pods: Vec<&str> = i
        .pods
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    if !pods.contains(&holder.as_str()) {
        return Check::fail(
            NAME,
            format!("the leader Lease {ns}/{name} is held by {holder}, which is no pod of the Deployment ({})", pods.join(", ")),
            format!("another process elects on this Lease? Each release needs its own --leader-elect-lease; {logs}"),
        );
    }
    Check::ok(
        NAME,
        format!(
            "pod {holder} leads (Lease {ns}/{name}, renewed {}s ago, lasts {duration}s)",
            age.unwrap_or(0)
        ),
    )
}

/// Check 5: whether the janitor opts new locks in by itself
/// (`--auto-opt-in`), and where it does not (`--exclude-namespaces`).
pub fn auto_opt_in(i: &Install) -> Check {
    const NAME: &str = "auto-opt-in";
    let excluded = &i.run.scope.exclude_namespaces;
    let outside = if excluded.is_empty() {
        String::new()
    } else {
        format!(", outside {excluded}")
    };
    if i.run.auto_opt_in {
        return Check::ok(
            NAME,
            format!(
                "on: the leader labels every unlabeled lock candidate in {}{outside}",
                i.scope_text()
            ),
        );
    }
    Check::warn(
        NAME,
        "off: new locks are protected only once someone labels them (`lock-janitor label`)",
        i.helm_upgrade("--set autoOptIn.enabled=true"),
    )
}

/// Check 8: with the Prometheus Operator, a ServiceMonitor and a
/// PrometheusRule of the release, each picked up by a Prometheus: its label
/// and namespace selectors select it (kube-prometheus-stack selects by a
/// `release` label; a Prometheus with empty selectors, as OpenShift's user
/// workload monitoring has, needs none). Where the Prometheus objects
/// cannot be read, it says so and does not warn.
pub async fn monitoring(i: &Install) -> Check {
    Check::or_failed(
        MONITORING,
        monitoring_objects(i).await,
        "list on servicemonitors and prometheusrules",
    )
}

/// The name of check 8.
const MONITORING: &str = "monitoring";

/// A ServiceMonitor or PrometheusRule of the release: what a Prometheus
/// picks it as, `Kind ns/name`, the object.
type Monitored = (Picked, String, DynamicObject);

/// A Prometheus: (namespace/name, its namespace, its spec).
type Prometheus = (String, String, serde_json::Value);

/// Check 8's steps: the release's objects, the Prometheus objects, and
/// which of them picks each.
async fn monitoring_objects(i: &Install) -> anyhow::Result<Check> {
    const NAME: &str = MONITORING;
    let gv = "monitoring.coreos.com/v1";
    if !served(&i.client, gv, "servicemonitors").await? {
        return Ok(Check::ok(
            NAME,
            "skipped: the Prometheus Operator is not installed (monitoring.coreos.com/v1 not served)",
        ));
    }
    let (found, missing) = release_monitoring(i, gv).await?;
    if !missing.is_empty() {
        return Ok(Check::warn(
            NAME,
            format!(
                "the Prometheus Operator is installed but the release has no {}: no scrapes, no alerts",
                missing.join(" or ")
            ),
            i.helm_upgrade("--set serviceMonitor.enabled=true --set prometheusRule.enabled=true"),
        ));
    }
    let prometheuses = match prometheuses(&i.client).await {
        Ok(p) if !p.is_empty() => p,
        // Nothing to compare with: no warning on a guess.
        other => {
            let why = match other {
                Ok(_) => "no Prometheus object found".to_owned(),
                Err(e) => format!("the Prometheus objects could not be read: {e}"),
            };
            let names: Vec<String> = found.iter().map(named).collect();
            return Ok(Check::ok(
                NAME,
                format!(
                    "{} ({why}; whether a Prometheus selects them is not checked)",
                    names.join(", ")
                ),
            ));
        }
    };
    let (picked, unpicked) = picked_by(i, &prometheuses, &found).await;
    if !unpicked.is_empty() {
        return Ok(unpicked_warning(i, &prometheuses, &unpicked));
    }
    Ok(Check::ok(NAME, picked.join("; ")))
}

/// The release's ServiceMonitors (in its namespace, or scraping it) and
/// PrometheusRules; and the kinds it has none of.
async fn release_monitoring(
    i: &Install,
    gv: &str,
) -> anyhow::Result<(Vec<Monitored>, Vec<&'static str>)> {
    let selector = release_selector(PART_OF_LABEL, i.release.as_deref());
    let lp = ListParams::default().labels(&selector);
    let mut found: Vec<Monitored> = Vec::new();
    let mut missing = Vec::new();
    for (picked, kind, plural, ns) in [
        (
            Picked::ServiceMonitor,
            "ServiceMonitor",
            "servicemonitors",
            None,
        ),
        (
            Picked::PrometheusRule,
            "PrometheusRule",
            "prometheusrules",
            Some(i.namespace.as_str()),
        ),
    ] {
        // Each CRD on its own: one may be installed without the other.
        if plural != "servicemonitors" && !served(&i.client, gv, plural).await? {
            missing.push(kind);
            continue;
        }
        let api = dynamic(&i.client, gv, kind, ns);
        // A ServiceMonitor may live in another namespace
        // (serviceMonitor.namespace): this release's scrapes its own.
        let items: Vec<DynamicObject> = call(format!("listing {plural}"), api.list(&lp))
            .await?
            .items
            .into_iter()
            .filter(|o| {
                o.metadata.namespace.as_deref() == Some(i.namespace.as_str())
                    || o.data["spec"]["namespaceSelector"]["matchNames"]
                        .as_array()
                        .is_some_and(|n| n.iter().any(|n| n == i.namespace.as_str()))
            })
            .collect();
        if items.is_empty() {
            missing.push(kind);
        }
        for o in items {
            let id = format!(
                "{kind} {}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            );
            found.push((picked, id, o));
        }
    }
    Ok((found, missing))
}

/// `Kind ns/name`, with its `release` label if it has one.
fn named((_, id, o): &Monitored) -> String {
    match o.metadata.labels.as_ref().and_then(|l| l.get("release")) {
        Some(r) => format!("{id} (release={r})"),
        None => id.clone(),
    }
}

/// `... picked up by Prometheus a, b` for each object some Prometheus
/// selects; and those none selects.
async fn picked_by<'a>(
    i: &Install,
    prometheuses: &[Prometheus],
    found: &'a [Monitored],
) -> (Vec<String>, Vec<&'a Monitored>) {
    let mut namespaces: BTreeMap<String, Labels> = BTreeMap::new();
    let mut picked = Vec::new();
    let mut unpicked = Vec::new();
    for f in found {
        let (kind, _, o) = f;
        let ns = o.metadata.namespace.clone().unwrap_or_default();
        if !namespaces.contains_key(&ns) {
            let labels = namespace_labels(&i.client, &ns).await;
            namespaces.insert(ns.clone(), labels);
        }
        let labels: Labels = o
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let by: Vec<&str> = prometheuses
            .iter()
            .filter(|(_, home, spec)| {
                selectors::picks(spec, home, *kind, &labels, &ns, &namespaces[&ns])
            })
            .map(|(id, _, _)| id.as_str())
            .collect();
        if by.is_empty() {
            unpicked.push(f);
        } else {
            picked.push(format!(
                "{} picked up by Prometheus {}",
                named(f),
                by.join(", ")
            ));
        }
    }
    (picked, unpicked)
}

/// The warning for objects no Prometheus picks up: each Prometheus'
/// selectors, and the chart values that would make the first one pick them.
fn unpicked_warning(i: &Install, prometheuses: &[Prometheus], unpicked: &[&Monitored]) -> Check {
    let (kind, _, _) = unpicked[0];
    let how: Vec<String> = prometheuses
        .iter()
        .map(|(id, _, spec)| format!("{id}: {}", selectors::describe(spec, *kind)))
        .collect();
    let sets: Vec<String> = unpicked
        .iter()
        .flat_map(|(kind, _, _)| {
            let value = kind.labels_value();
            prometheuses
                .iter()
                .map(|(_, _, spec)| selectors::wanted_labels(spec, *kind))
                .find(|l| !l.is_empty())
                .unwrap_or_default()
                .into_iter()
                .map(move |(k, v)| format!("--set {value}.{k}={v}"))
        })
        .collect();
    let hint = if sets.is_empty() {
        "label them (the chart's serviceMonitor.additionalLabels, prometheusRule.additionalLabels) so that a Prometheus' selectors pick them, or widen its selectors".to_owned()
    } else {
        i.helm_upgrade(&sets.join(" "))
    };
    Check::warn(
        MONITORING,
        format!(
            "{} picked up by no Prometheus ({}): no scrapes or no alerts",
            unpicked
                .iter()
                .map(|f| named(f))
                .collect::<Vec<_>>()
                .join(", "),
            how.join("; ")
        ),
        hint,
    )
}

/// Every Prometheus of the Prometheus Operator: (namespace/name, its
/// namespace, its spec).
async fn prometheuses(client: &Client) -> anyhow::Result<Vec<Prometheus>> {
    let gv = "monitoring.coreos.com/v1";
    if !served(client, gv, "prometheuses").await? {
        return Ok(Vec::new());
    }
    let api = dynamic(client, gv, "Prometheus", None);
    let list = call("listing prometheuses", api.list(&ListParams::default())).await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let id = format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or_default());
            (id, ns, p.data["spec"].clone())
        })
        .collect())
}

/// A namespace's labels; where it cannot be read, the one label the API
/// server sets on every namespace.
async fn namespace_labels(client: &Client, ns: &str) -> Labels {
    let api: Api<Namespace> = Api::all(client.clone());
    match call(format!("reading namespace {ns}"), api.get_opt(ns)).await {
        Ok(Some(n)) => n.metadata.labels.unwrap_or_default().into_iter().collect(),
        _ => Labels::from([("kubernetes.io/metadata.name".to_owned(), ns.to_owned())]),
    }
}
