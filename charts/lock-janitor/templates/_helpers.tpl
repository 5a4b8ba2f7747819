{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "lock-janitor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects. Uses the release name alone when it
already contains the chart name, so `helm install lock-janitor ...` gives
"lock-janitor", not "lock-janitor-lock-janitor".
*/}}
{{- define "lock-janitor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespace of every namespaced object: namespaceOverride, else the
release namespace.
*/}}
{{- define "lock-janitor.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lock-janitor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable for the life of a release (a Deployment's selector
cannot change).
*/}}
{{- define "lock-janitor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lock-janitor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "lock-janitor.labels" -}}
helm.sh/chart: {{ include "lock-janitor.chart" . }}
{{ include "lock-janitor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: lock-janitor
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The janitor's ServiceAccount. With serviceAccount.create=false a name is
required: falling back to the namespace's "default" ServiceAccount would
give every pod that uses it cluster-wide delete on ConfigMaps, and put its
own writes under the delete guard.
*/}}
{{- define "lock-janitor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lock-janitor.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else }}
{{- fail "serviceAccount.create=false needs serviceAccount.name: the ServiceAccount the janitor runs as (RBAC and the delete guard are bound to it; the namespace's \"default\" one would lend them to every pod that uses it)" }}
{{- end }}
{{- end }}

{{/*
The opt-in label as "key=value", checked: the delete guard, the auto opt-in
policy and the label carry-over work with exactly one key=value term, so
any other selector is refused here rather than half-enforced.
*/}}
{{- define "lock-janitor.optInLabel" -}}
{{- $s := .Values.selector | toString }}
{{- if not (regexMatch "^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]{0,61}[a-z0-9A-Z])?=[a-z0-9A-Z]([-a-z0-9A-Z_.]{0,61}[a-z0-9A-Z])?$" $s) }}
{{- fail (printf "selector %q: the chart takes exactly one key=value label (such as lock-janitor.io/watch=true); the delete guard, the auto opt-in policy and the label carry-over enforce that one label" $s) }}
{{- end }}
{{- $s }}
{{- end }}

{{/*
The image: [registry/]repository, then @digest or :tag. global.imageRegistry
(a mirror for every chart of an umbrella) wins over image.registry.
*/}}
{{- define "lock-janitor.image" -}}
{{- $registry := default .Values.image.registry ((.Values.global).imageRegistry) }}
{{- $repository := .Values.image.repository }}
{{- if $registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Rules shared by the ClusterRole and the per-namespace Roles: exactly what
`lock-janitor run` needs, nothing else.
*/}}
{{- define "lock-janitor.rules" -}}
# Watch the opted-in locks; delete the stale ones (with uid+resourceVersion
# preconditions); release a stale leader record annotation (a merge patch of
# that annotation carrying the resourceVersion judged); after a takeover,
# patch the opt-in label onto the lock the new leader created (operator-lib
# creates it without labels; the merge patch carries the resourceVersion it
# read, so it never overwrites a change).
{{- if has "configmap" .Values.lockKinds }}
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "delete", "patch"]
{{- end }}
{{- if has "lease" .Values.lockKinds }}
# Watch the opted-in Lease locks; release a stale one with an update guarded
# by its resourceVersion (as client-go releases its own). A Lease held for
# life (one Pod owner, never renewed) is deleted instead, with uid and
# resourceVersion preconditions, and the opt-in label patched onto the one
# its new holder creates, as for ConfigMaps.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "update", "delete", "patch"]
{{- end }}
# Read the holder pods; delete a dead holder only when deletePod is set.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"{{ if .Values.deletePod }}, "delete"{{ end }}]
# Report verdicts as Events; the event recorder patches repeated ones. After
# a restart or a failover, its own StaleLockReclaimed Events say which
# takeovers are still awaited (list).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
# After freeing a lock, whether its holder's workload still wants a leader
# (no NoTakeover for an operator scaled to 0 or uninstalled): the holder
# pod's ReplicaSet, its Deployment, or its StatefulSet, read by name.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get"]
{{- end }}

{{/*
Leader election is on with more than one replica.
*/}}
{{- define "lock-janitor.leaderElect" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
"true" when the delete guard is rendered: admissionPolicies.deleteGuard.enabled
is true (the default; a boolean or the string). No look at the API server:
every supported minor (1.31+) serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy, so plain `helm template` renders it as `helm
install` does.
*/}}
{{- define "lock-janitor.deleteGuard" -}}
{{- if eq (.Values.admissionPolicies.deleteGuard.enabled | toString) "true" }}
{{- "true" }}
{{- end }}
{{- end }}

{{/*
A duration value in nanoseconds (a float), parsed as the janitor parses its
flags (humantime): numbers, a fraction allowed, each followed by a unit
(ns, us, ms, s, m, h, d, w, M, y and their long forms), an optional space
between. Fails on anything else. Argument: (list <value name> <value>).
*/}}
{{- define "lock-janitor.durationNs" -}}
{{- $name := index . 0 }}
{{- $s := index . 1 | toString }}
{{- $units := dict
  "nanos" 1 "nsec" 1 "ns" 1
  "usec" 1000 "us" 1000 "µs" 1000
  "millis" 1000000 "msec" 1000000 "ms" 1000000
  "seconds" 1000000000 "second" 1000000000 "secs" 1000000000 "sec" 1000000000 "s" 1000000000
  "minutes" 60000000000 "minute" 60000000000 "min" 60000000000 "mins" 60000000000 "m" 60000000000
  "hours" 3600000000000 "hour" 3600000000000 "hr" 3600000000000 "hrs" 3600000000000 "h" 3600000000000
  "days" 86400000000000 "day" 86400000000000 "d" 86400000000000
  "weeks" 604800000000000 "week" 604800000000000 "wk" 604800000000000 "wks" 604800000000000 "w" 604800000000000
  "months" 2630016000000000 "month" 2630016000000000 "M" 2630016000000000
  "years" 31557600000000000 "year" 31557600000000000 "yr" 31557600000000000 "yrs" 31557600000000000 "y" 31557600000000000 }}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]+)? ?[a-zA-Zµ]+ ?)+$" $s) }}
{{- fail (printf "%s %q is not a duration: write it as the janitor reads it, a number and a unit (30s, 2m, 1h 30m)" $name $s) }}
{{- end }}
{{- $ns := 0.0 }}
{{- range $t := regexFindAll "[0-9]+(\\.[0-9]+)? ?[a-zA-Zµ]+" $s -1 }}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" $t }}
{{- $u := regexFind "[a-zA-Zµ]+$" $t }}
{{- if not (hasKey $units $u) }}
{{- fail (printf "%s %q: %q is not a unit the janitor knows (ns, us, ms, s, m, h, d, w)" $name $s $u) }}
{{- end }}
{{- if and (contains "." $n) (eq (int (get $units $u)) 1) }}
{{- fail (printf "%s %q is not a duration the janitor reads: a fraction of a nanosecond" $name $s) }}
{{- end }}
{{- $ns = addf $ns (mulf (float64 $n) (float64 (get $units $u))) }}
{{- end }}
{{- $ns }}
{{- end }}

{{/*
The bounds the janitor's flags have (src/cli.rs: parse_duration at most
24h, parse_positive_duration above 0, parse_at_least_a_second 1s to 24h,
parse_lease_duration 3s to 10m),
checked at render time, so that an out-of-range value fails `helm install`
with its name instead of a pod that crash-loops on the flag.
tests/e2e/chart.rs renders each bound and its neighbours and asks the
binary's own parser the same question.
*/}}
{{- define "lock-janitor.checkDurations" -}}
{{- $day := 86400000000000.0 }}
{{- $checks := list
  (list "leaderElection.leaseDuration" .Values.leaderElection.leaseDuration "--leader-elect-lease-duration" 3000000000.0 true 600000000000.0 "at least 3s and at most 10m")
  (list "ownerGoneGrace" .Values.ownerGoneGrace "--owner-gone-grace" 1000000000.0 true $day "at least 1s and at most 24h")
  (list "resync" .Values.resync "--resync" 1000000000.0 true $day "at least 1s and at most 24h")
  (list "takeoverTimeout" .Values.takeoverTimeout "--takeover-timeout" 0.0 false $day "more than 0 and at most 24h") }}
{{- range $c := $checks }}
{{- $name := index $c 0 }}{{- $v := index $c 1 }}{{- $min := index $c 3 }}{{- $max := index $c 5 }}
{{- $d := include "lock-janitor.durationNs" (list $name $v) | float64 }}
{{- $low := ternary (lt $d $min) (le $d $min) (index $c 4) }}
{{- if or $low (gt $d $max) }}
{{- fail (printf "%s %q is out of range: the janitor's %s takes %s (it would refuse to start)" $name (toString $v) (index $c 2) (index $c 6)) }}
{{- end }}
{{- end }}
{{- end }}
