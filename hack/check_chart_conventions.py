#!/usr/bin/env python3
"""Checks the chart's conventions on `helm template` output (stdin), rendered
by hack/test-chart.sh with hack/conventions-values.yaml:

    check_chart_conventions.py <namespace-override>

image.registry / global.imageRegistry, commonLabels, namespaceOverride,
logLevel, the ServiceMonitor's namespace, labels and relabelings, and the
PrometheusRule's labels, additional rule labels, disabled alerts, runbook URL
base and LockJanitorNoTakeover's `for:` taken from takeoverTimeout."""
import sys
import yaml

ns = sys.argv[1]
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
errors = []


def check(ok, msg):
    if not ok:
        errors.append(msg)


def one(kind):
    found = [d for d in docs if d["kind"] == kind]
    check(len(found) == 1, f"{len(found)} {kind} objects, want 1")
    return found[0] if found else {}


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}
for d in docs:
    meta = d["metadata"]
    what = f'{d["kind"]}/{meta["name"]}'
    check(meta.get("labels", {}).get("example.com/team") == "platform", f"{what}: no commonLabels")
    if d["kind"] not in CLUSTER_SCOPED and d["kind"] != "ServiceMonitor":
        check(meta.get("namespace") == ns, f"{what}: namespace {meta.get('namespace')}, want {ns}")

dep = one("Deployment")
pod = dep["spec"]["template"]
check(pod["metadata"]["labels"].get("example.com/team") == "platform", "pod: no commonLabels")
c = pod["spec"]["containers"][0]
check(c["image"].startswith("mirror.example.com/lock-janitor/lock-janitor:"),
      f"image {c['image']}: global.imageRegistry not used")
check("--log-level=debug" in c["args"], f"args {c['args']}: no --log-level=debug")
check(f"--leader-elect-namespace={ns}" in c["args"], "leader election not in namespaceOverride")

sm = one("ServiceMonitor")
check(sm["metadata"]["namespace"] == "monitoring", "serviceMonitor.namespace not used")
check(sm["metadata"]["labels"].get("release") == "kube-prometheus-stack", "serviceMonitor.additionalLabels not used")
check(sm["spec"]["namespaceSelector"]["matchNames"] == [ns], "ServiceMonitor does not select the janitor's namespace")
ep = sm["spec"]["endpoints"][0]
check(ep.get("interval") == "15s", "serviceMonitor.interval not used")
check(ep.get("relabelings") and ep.get("metricRelabelings"), "relabelings / metricRelabelings not used")

pr = one("PrometheusRule")
check(pr["metadata"]["labels"].get("release") == "kube-prometheus-stack", "prometheusRule.additionalLabels not used")
rules = [r for g in pr["spec"]["groups"] for r in g["rules"]]
alerts = {r["alert"]: r for r in rules if "alert" in r}
check("LockJanitorStaleLockReclaimed" not in alerts, "prometheusRule.disabled did not drop LockJanitorStaleLockReclaimed")
check(len(alerts) == 9, f"alerts {sorted(alerts)}")
for name, r in alerts.items():
    check(r["labels"].get("team") == "platform", f"{name}: no additionalRuleLabels")
    check(r["labels"].get("severity") in ("info", "warning", "critical"), f"{name}: its own severity was overridden")
    url = r["annotations"]["runbook_url"]
    check(url == "https://wiki.example.com/lock-janitor#" + name.lower(), f"{name}: runbook_url {url}")
check(alerts.get("LockJanitorNoTakeover", {}).get("for") == "12m", "LockJanitorNoTakeover's for: is not takeoverTimeout")

if errors:
    print("\n".join("check_chart_conventions: " + e for e in errors), file=sys.stderr)
    sys.exit(1)
print(f"check_chart_conventions: {len(docs)} objects follow the chart conventions")
