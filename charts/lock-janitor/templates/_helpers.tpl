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
# preconditions); after a takeover, patch the opt-in label onto the lock the
# new leader created (operator-lib creates it without labels; the merge patch
# carries the resourceVersion it read, so it never overwrites a change).
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
{{- end }}

{{/*
Leader election is on with more than one replica.
*/}}
{{- define "lock-janitor.leaderElect" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
The MutatingAdmissionPolicy API version to render the auto opt-in policy
with: v1 where served (Kubernetes 1.36+); v1beta1 (1.34-1.35, where the
cluster enables it) only when admissionPolicies.autoOptIn.allowV1beta1 is
set; empty when neither.
*/}}
{{- define "lock-janitor.mapVersion" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- "admissionregistration.k8s.io/v1" }}
{{- else if and .Values.admissionPolicies.autoOptIn.allowV1beta1 (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy") }}
{{- "admissionregistration.k8s.io/v1beta1" }}
{{- end }}
{{- end }}
