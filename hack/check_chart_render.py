#!/usr/bin/env python3
"""Asserts properties of `helm template` output for the lock-janitor chart.

    helm template lj charts/lock-janitor -n NS [-f VALUES] | hack/check_chart_render.py CASE NS

CASE is one of: defaults, all-on, namespaced, guard (the defaults with the
delete guard set either way: the guard is not checked), openshift (the defaults rendered
with `--api-versions security.openshift.io/v1`: the pod must also pass
OpenShift's restricted-v2 SCC). Called by hack/test-chart.sh.
Prints one line per failed check and exits 1 if any failed.
"""
import sys

import yaml

RULES_FILE = "charts/lock-janitor/files/prometheus-rules.yaml"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
OPTIONAL = {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"}

errors = []


def check(ok, msg):
    if not ok:
        errors.append(msg)


def mebibytes(q):
    """A memory quantity (Ki, Mi, Gi or bytes) in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for u, f in units.items():
        if str(q).endswith(u):
            return float(str(q)[:-2]) * f
    return float(q) / 2**20


def containers_of(pod):
    return pod.get("initContainers", []) + pod.get("containers", []) + pod.get("ephemeralContainers", [])


def pod_security_restricted(pod):
    """Pod Security Standards "restricted" (baseline included), the checks that
    apply to a pod template (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
    tests/chart.rs also has the API server's PodSecurity admission judge it."""
    psc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not pod.get(key), f"PSS baseline: pod sets {key}")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        check(kinds <= {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"},
              f"PSS restricted: volume {v.get('name')} of type {kinds}")
    check(psc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost"), "PSS restricted: no pod seccompProfile RuntimeDefault")
    check(psc.get("runAsUser") != 0, "PSS restricted: runAsUser 0")
    for c in containers_of(pod):
        sc = c.get("securityContext", {})
        name = c.get("name")
        check(not sc.get("privileged"), f"PSS: container {name} is privileged")
        check(sc.get("allowPrivilegeEscalation") is False, f"PSS restricted: container {name} allowPrivilegeEscalation is not false")
        check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"PSS restricted: container {name} is not runAsNonRoot")
        check(sc.get("runAsUser", psc.get("runAsUser")) != 0, f"PSS restricted: container {name} runs as UID 0")
        caps = sc.get("capabilities", {})
        check("ALL" in caps.get("drop", []), f"PSS restricted: container {name} does not drop ALL capabilities")
        check(set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"PSS restricted: container {name} adds {caps.get('add')}")
        check(sc.get("seccompProfile", {}).get("type", "RuntimeDefault") in ("RuntimeDefault", "Localhost"),
              f"PSS restricted: container {name} seccomp {sc.get('seccompProfile')}")
        check(not any(p.get("hostPort") for p in c.get("ports", [])), f"PSS: container {name} uses a hostPort")
        check(sc.get("procMount", "Default") == "Default", f"PSS: container {name} procMount")


def restricted_v2(pod):
    """OpenShift's restricted-v2 SCC, the default for every authenticated user:
    UID and fsGroup from the namespace's range (MustRunAsRange / MustRunAs: a
    pod that fixes them outside the range is rejected, so the chart fixes
    none), no privilege escalation, every capability dropped (only
    NET_BIND_SERVICE may be added), seccomp runtime/default, SELinux assigned
    (no seLinuxOptions of our own), no host namespaces, ports or paths, and
    only the volume types listed below."""
    psc = pod.get("securityContext", {})
    for key in ("runAsUser", "runAsGroup", "fsGroup", "supplementalGroups", "seLinuxOptions"):
        check(key not in psc, f"restricted-v2: pod securityContext fixes {key}={psc.get(key)!r}")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "restricted-v2: pod seccompProfile is not RuntimeDefault")
    check(psc.get("runAsNonRoot") is True, "restricted-v2 + Pod Security: pod runAsNonRoot is not true")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not pod.get(key), f"restricted-v2: pod sets {key}")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        check(kinds <= {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"},
              f"restricted-v2: volume {v.get('name')} of type {kinds}")
    for c in containers_of(pod):
        sc = c.get("securityContext", {})
        name = c.get("name")
        for key in ("runAsUser", "runAsGroup", "seLinuxOptions"):
            check(key not in sc, f"restricted-v2: container {name} fixes {key}={sc.get(key)!r}")
        check(sc.get("allowPrivilegeEscalation") is False, f"restricted-v2: container {name} allowPrivilegeEscalation is not false")
        check(not sc.get("privileged"), f"restricted-v2: container {name} is privileged")
        caps = sc.get("capabilities", {})
        check(caps.get("drop") == ["ALL"], f"restricted-v2: container {name} capabilities.drop is {caps.get('drop')}, want [ALL]")
        check(set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"restricted-v2: container {name} adds {caps.get('add')}")
        check(sc.get("seccompProfile", {}).get("type", "RuntimeDefault") == "RuntimeDefault", f"restricted-v2: container {name} seccomp")
        check(not any(p.get("hostPort") for p in c.get("ports", [])), f"restricted-v2: container {name} uses a hostPort")


def main():
    case, release_ns = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    # The `helm test` hook's objects (templates/tests/) are checked apart:
    # helm creates them only when the test runs.
    is_hook = lambda d: "helm.sh/hook" in (d["metadata"].get("annotations") or {})
    hooks = [d for d in docs if is_hook(d)]
    by_kind = {}
    for d in docs:
        if not is_hook(d):
            by_kind.setdefault(d["kind"], []).append(d)

    def one(kind):
        objs = by_kind.get(kind, [])
        check(len(objs) == 1, f"want exactly one {kind}, got {len(objs)}")
        return objs[0] if objs else {}

    # Labels and namespaces on every object.
    for d in docs:
        meta, kind = d["metadata"], d["kind"]
        labels = meta.get("labels", {})
        for key in ("name", "instance", "version", "component", "managed-by", "part-of"):
            check(f"app.kubernetes.io/{key}" in labels, f"{kind}/{meta['name']}: no app.kubernetes.io/{key} label")
        if kind in CLUSTER_SCOPED:
            check("namespace" not in meta, f"{kind}/{meta['name']} is cluster-scoped but has a namespace")
        elif kind not in ("Role", "RoleBinding"):
            check(meta.get("namespace") == release_ns, f"{kind}/{meta['name']}: namespace {meta.get('namespace')!r}, want the release namespace {release_ns!r}")

    # Deployment: hardened pod, probes, POD_NAME, args.
    dep = one("Deployment")
    spec = dep.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    check(spec.get("replicas") == 2, "Deployment replicas != 2 (hot standby by default)")
    check(spec.get("strategy", {}).get("type") == "RollingUpdate"
          and spec["strategy"].get("rollingUpdate", {}).get("maxUnavailable") == 0,
          "Deployment strategy is not RollingUpdate with maxUnavailable 0 (leader election)")
    check(pod.get("terminationGracePeriodSeconds", 0) >= 45, "terminationGracePeriodSeconds below the janitor's drain bound")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
    check(case == "all-on" or (anti and anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"),
          "no soft anti-affinity across nodes by default")
    check(pod.get("automountServiceAccountToken") is True, "pod does not automount its token")
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, "pod runAsNonRoot is not true")
    # No fixed IDs: the image's USER (65532) runs it, and OpenShift assigns its own.
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        check(key not in psc, f"pod securityContext fixes {key}={psc.get(key)!r}: OpenShift's restricted-v2 assigns it")
    check(pod.get("nodeSelector") == {"kubernetes.io/os": "linux"} or case == "all-on",
          f"nodeSelector {pod.get('nodeSelector')}, want only kubernetes.io/os: linux (the image is multi-arch)")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "pod seccompProfile is not RuntimeDefault")
    containers = pod.get("containers", [])
    check(len(containers) == 1, "want one container")
    c = containers[0] if containers else {}
    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation is not false")
    check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem is not true")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities do not drop ALL")
    pod_security_restricted(pod)
    if case == "openshift":
        restricted_v2(pod)
    check(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "liveness probe is not /healthz")
    check(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "readiness probe is not /readyz")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name",
          "POD_NAME is not set from metadata.name")
    check(env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
          "POD_NAMESPACE is not set from metadata.namespace")
    res = c.get("resources", {})
    check(res.get("requests") and res.get("limits"), "resources lack requests or limits")
    # A memory request the janitor stays within at user scale (ranked after
    # the pods over their requests under memory pressure) and a limit that
    # holds the 10,000-lock stress run; a CPU request and no CPU limit (not
    # throttled in a mass death). values.yaml says which runs sized them.
    req, lim = res.get("requests", {}), res.get("limits", {})
    check(req.get("memory") and lim.get("memory") and mebibytes(req["memory"]) <= mebibytes(lim["memory"]),
          f"want a memory request and a limit at least as high: {res}")
    check(req.get("cpu") and "cpu" not in lim, f"a CPU request and no CPU limit by default: {res}")
    if case == "defaults":
        check((req.get("cpu"), req.get("memory"), lim.get("memory")) == ("50m", "64Mi", "192Mi"),
              f"default resources {res}, want requests 50m / 64Mi and a 192Mi memory limit")
    # An optional priority class: none by default.
    check(pod.get("priorityClassName") == ("system-cluster-critical" if case == "all-on" else None),
          f"priorityClassName {pod.get('priorityClassName')!r}")
    # A soft spread over zones by default, counting the janitor's own pods;
    # all-on overrides it.
    spread = pod.get("topologySpreadConstraints", [])
    if case == "all-on":
        check([t.get("topologyKey") for t in spread] == ["kubernetes.io/hostname"]
              and spread[0].get("labelSelector", {}).get("matchLabels") == {"team": "platform"},
              f"topologySpreadConstraints not as all-on-values.yaml sets them: {spread}")
    else:
        want_spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": spec.get("selector", {}).get("matchLabels")}}]
        check(spread == want_spread, f"topologySpreadConstraints {spread}, want {want_spread}")
    args = c.get("args", [])
    ports = c.get("ports", [])
    check(ports and ports[0].get("name") == "metrics", "container port is not named metrics")
    port = ports[0]["containerPort"] if ports else None
    check(f"--metrics-bind-address=0.0.0.0:{port}" in args, f"args lack --metrics-bind-address for port {port}: {args}")
    check("--selector=lock-janitor.io/watch=true" in args, f"args lack the default selector: {args}")
    check("--lock-kinds=configmap,lease" in args, f"args lack --lock-kinds=configmap,lease: {args}")
    check(any(a.startswith("--owner-gone-grace=") for a in args) and any(a.startswith("--resync=") for a in args),
          "args lack --owner-gone-grace or --resync")
    full = dep["metadata"]["name"]
    for a in ("--leader-elect", f"--leader-elect-lease={full}", f"--leader-elect-namespace={release_ns}",
              "--leader-elect-lease-duration=15s"):
        check(a in args, f"args lack {a}: {args}")

    # ServiceAccount.
    sa_name = pod.get("serviceAccountName")
    sas = by_kind.get("ServiceAccount", [])
    if case == "namespaced":
        check(not sas, "serviceAccount.create=false still creates a ServiceAccount")
        check(sa_name == "janitor", f"pod uses ServiceAccount {sa_name!r}, want 'janitor'")
    else:
        sa = one("ServiceAccount")
        check(sa.get("automountServiceAccountToken") is False, "ServiceAccount automounts its token")
        check(sa.get("metadata", {}).get("name") == sa_name, "pod does not use the chart's ServiceAccount")

    # The test hook: one Pod that runs `lock-janitor check` on this release,
    # as hardened as the janitor's own, as a ServiceAccount of its own.
    test_pods = [d for d in hooks if d["kind"] == "Pod"]
    check(len(test_pods) == 1, f"want exactly one helm test Pod, got {len(test_pods)}")
    for tp in test_pods:
        tspec = tp.get("spec", {})
        check(tp["metadata"]["annotations"].get("helm.sh/hook") == "test", "the test Pod is not a test hook")
        check(tspec.get("containers", [{}])[0].get("args", [])[:1] == ["check"], "the test Pod does not run check")
        check(tspec.get("serviceAccountName") != sa_name, "the test Pod runs as the janitor's ServiceAccount")
        check(tspec.get("restartPolicy") == "Never", "the test Pod restarts")
    # Its ServiceAccount and RBAC (impersonation) go once the test passed,
    # and before the next one; the Pod stays for `helm test --logs`.
    for h in hooks:
        policy = h["metadata"]["annotations"].get("helm.sh/hook-delete-policy", "").split(",")
        want = ["before-hook-creation"] if h["kind"] == "Pod" else ["before-hook-creation", "hook-succeeded"]
        check(policy == want, f"hook {h['kind']}/{h['metadata']['name']}: delete policy {policy}, want {want}")

    # Service.
    svc = one("Service")
    check([p.get("name") for p in svc.get("spec", {}).get("ports", [])] == ["metrics"], "Service port is not named metrics")

    # RBAC: exactly the documented rules.
    delete_pod = case in ("all-on", "namespaced")
    want_rules = [
        ("", "configmaps", ["get", "list", "watch", "delete", "patch"]),
        ("coordination.k8s.io", "leases", ["get", "list", "watch", "update", "delete", "patch"]),
        ("", "pods", ["get", "list", "watch"] + (["delete"] if delete_pod else [])),
        ("events.k8s.io", "events", ["create", "patch", "list"]),
        ("apps", "replicasets", ["get"]),
        ("apps", "deployments", ["get"]),
        ("apps", "statefulsets", ["get"]),
    ]
    # The leader Lease: its own Lease by name (get, update), create, in the
    # release namespace only.
    leader_roles = [r for r in by_kind.get("Role", []) if r["metadata"]["name"].endswith("-leader")]
    check(len(leader_roles) == 1 and leader_roles[0]["metadata"]["namespace"] == release_ns,
          "want one leader-election Role in the release namespace")
    if leader_roles:
        got = [(r["apiGroups"], r["resources"], r.get("resourceNames"), r["verbs"]) for r in leader_roles[0]["rules"]]
        want = [(["coordination.k8s.io"], ["leases"], [full], ["get", "update"]),
                (["coordination.k8s.io"], ["leases"], None, ["create"])]
        check(got == want, f"leader Role rules {got}, want {want}")
    if case == "namespaced":
        check(not by_kind.get("ClusterRole") and not by_kind.get("ClusterRoleBinding"), "namespaced mode has cluster-wide grants")
        roles = [r for r in by_kind.get("Role", []) if not r["metadata"]["name"].endswith("-leader")]
        bindings = [b for b in by_kind.get("RoleBinding", []) if not b["metadata"]["name"].endswith("-leader")]
        check(sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"], "want a Role in team-a and team-b")
        check(sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"], "want a RoleBinding in team-a and team-b")
        for b in bindings:
            subj = b.get("subjects", [{}])[0]
            check(subj.get("name") == sa_name and subj.get("namespace") == release_ns,
                  f"RoleBinding in {b['metadata']['namespace']} does not bind {release_ns}/{sa_name}")
        rule_sets = [r.get("rules", []) for r in roles]
        check("--namespace=team-a" in args and "--namespace=team-b" in args, f"args lack --namespace flags: {args}")
    else:
        check(all(r["metadata"]["name"].endswith("-leader") for r in by_kind.get("Role", []) + by_kind.get("RoleBinding", [])),
              "cluster-wide mode creates Roles other than the leader-election one")
        cluster_rules = one("ClusterRole").get("rules", [])
        # Cluster-wide only: whether a freed lock's namespace is being deleted.
        check(cluster_rules[-1:] == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}],
              f"ClusterRole does not end with get on namespaces: {cluster_rules[-1:]}")
        rule_sets = [cluster_rules[:-1]]
        crb = one("ClusterRoleBinding")
        subj = crb.get("subjects", [{}])[0]
        check(subj.get("name") == sa_name and subj.get("namespace") == release_ns, "ClusterRoleBinding does not bind the janitor's ServiceAccount")
        check(not any(a.startswith("--namespace") for a in args), f"all-namespaces mode passes --namespace: {args}")
    for rules in rule_sets:
        got = [(r["apiGroups"][0], r["resources"][0], r["verbs"]) for r in rules]
        check(got == want_rules, f"RBAC rules {got}, want {want_rules}")
        for r in rules:
            check(len(r["apiGroups"]) == 1 and len(r["resources"]) == 1, f"rule grants more than one group/resource: {r}")

    # The delete guard, on by default: rendered under plain `helm template`.
    if case in ("defaults", "all-on", "openshift"):
        one("ValidatingAdmissionPolicy")
        one("ValidatingAdmissionPolicyBinding")

    # Optional objects.
    if case == "defaults":
        for kind in OPTIONAL:
            check(kind not in by_kind, f"{kind} rendered although it is off by default")
        pdb = one("PodDisruptionBudget").get("spec", {})
        check(pdb.get("maxUnavailable") == 1, f"default PDB is not maxUnavailable 1: {pdb}")
        check("--dry-run" not in args and "--delete-pod" not in args, f"default args act dangerously: {args}")
        check("--log-format=json" in args, "chart default log format is not json")
    if case == "all-on":
        for kind in OPTIONAL:
            one(kind)
        check("--dry-run" in args and "--delete-pod" in args, f"args lack --dry-run/--delete-pod: {args}")
        sm = one("ServiceMonitor")
        ep = sm.get("spec", {}).get("endpoints", [{}])[0]
        check(ep.get("port") == "metrics" and "honorLabels" not in ep,
              "ServiceMonitor does not scrape port metrics, or sets honorLabels (the target's labels must win; a lock's namespace is lock_namespace)")
        dash = [c for c in by_kind.get("ConfigMap", []) if c["metadata"]["name"].endswith("-dashboard")]
        check(len(dash) == 1 and dash[0]["metadata"]["labels"].get("grafana_dashboard") == "1",
              "grafanaDashboard.enabled renders no ConfigMap labeled grafana_dashboard")
        if dash:
            import json as _json
            panels = _json.loads(dash[0]["data"]["lock-janitor.json"]).get("panels", [])
            check(len(panels) >= 8, "the dashboard has too few panels")
        np = one("NetworkPolicy")
        ing_ports = [p.get("port") for p in np.get("spec", {}).get("ingress", [{}])[0].get("ports", [])]
        check(ing_ports == ["metrics"], f"NetworkPolicy ingress ports {ing_ports}, want [metrics]")
        # DNS: 53 and OpenShift's 5353, UDP and TCP each.
        egress_ports = {(p.get("port"), p.get("protocol")) for r in np.get("spec", {}).get("egress", []) for p in r.get("ports", [])}
        for port in (53, 5353):
            for proto in ("UDP", "TCP"):
                check((port, proto) in egress_ports, f"NetworkPolicy egress lacks DNS {port}/{proto}: {sorted(egress_ports)}")
    if case in ("all-on", "namespaced"):
        # The PrometheusRule carries exactly the rules of the plain file.
        # The chart scopes the target matcher to its own namespace.
        with open(RULES_FILE) as f:
            plain = yaml.safe_load(f.read().replace(
                'job=~".*lock-janitor.*"', f'job=~".*lock-janitor.*",namespace="{release_ns}"'))["groups"]
        rendered = one("PrometheusRule").get("spec", {}).get("groups", [])
        if case == "all-on":
            check(rendered == plain, "PrometheusRule groups differ from " + RULES_FILE)
        else:
            flat = yaml.safe_dump(rendered)
            check(f'job=~"janitor",namespace="{release_ns}"' in flat and ".*lock-janitor.*" not in flat,
                  "prometheusRule.jobRegex and the release namespace were not substituted into LockJanitorDown")
            names = [r["alert"] for g in rendered for r in g["rules"]]
            want = [r["alert"] for g in plain for r in g["rules"]]
            check(names == want, f"PrometheusRule alerts {names}, want {want}")
        pdb = one("PodDisruptionBudget").get("spec", {})
        if case == "namespaced":
            check(pdb.get("minAvailable") == 0 and "maxUnavailable" not in pdb, f"PDB minAvailable not honoured: {pdb}")
        else:
            check(pdb.get("maxUnavailable") == 1 and "minAvailable" not in pdb, f"PDB default is not maxUnavailable 1: {pdb}")

    for e in errors:
        print(f"check-chart-render[{case}]: {e}")
    if errors:
        sys.exit(1)
    print(f"check-chart-render[{case}]: {len(docs)} objects ({', '.join(sorted(by_kind))}) OK")


if __name__ == "__main__":
    main()
