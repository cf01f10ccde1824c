{{- /* Names. Kubernetes allows 63 characters in a label value and in a Service name (a DNS
       label), so every name the chart makes fits in 63, whatever the release name (Helm
       allows 53). The usual helpers: `helm install fleettune` gives `fleettune`, not
       `fleettune-fleettune` (a release name that contains the chart's name is used alone). */ -}}
{{- define "fleettune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleettune.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The fullname with a suffix (list . "metrics"): the fullname is cut so that the suffix,
       which tells the objects apart, always survives. */ -}}
{{- define "fleettune.suffixed" -}}
{{- $ctx := index . 0 -}}{{- $suffix := index . 1 -}}
{{- $room := int (sub 62 (len $suffix)) -}}
{{- printf "%s-%s" (include "fleettune.fullname" $ctx | trunc $room | trimSuffix "-") $suffix -}}
{{- end -}}

{{- /* A name of at most 63 characters that stands for a longer one: itself when it fits,
       else its first characters and a hash of all of it (as fleettune.names.label_value does),
       so that two long names that share their beginning stay apart. */ -}}
{{- define "fleettune.bounded" -}}
{{- if le (len .) 63 -}}{{ . }}{{- else -}}
{{- printf "%s-%s" (trunc 52 . | trimSuffix "-") (sha256sum . | trunc 10) -}}
{{- end -}}
{{- end -}}

{{- define "fleettune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fleettune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleettune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "fleettune.labels" -}}
{{ include "fleettune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "fleettune.chart" . }}
{{- end -}}

{{- define "fleettune.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "fleettune.fullname" .) -}}
{{- end -}}

{{- /* Comma-separated watched namespaces (namespaced mode only). */ -}}
{{- define "fleettune.namespaces" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end -}}

{{- define "fleettune.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest }}{{ $img.repository }}@{{ $img.digest }}{{ else }}{{ $img.repository }}:{{ $img.tag | default .Chart.AppVersion }}{{ end -}}
{{- end -}}

{{- /* Secret names from a list of names or of {name: ...} objects (both forms are accepted). */ -}}
{{- define "fleettune.secretNames" -}}
{{- $names := list -}}
{{- range . -}}
{{- if kindIs "map" . }}{{ $names = append $names .name }}{{ else }}{{ $names = append $names . }}{{ end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{- /* The rules the operator needs on objects in a namespace it watches: shared by the
       namespaced Roles and the cluster-wide ClusterRole so that both modes grant the same. */ -}}
{{- define "fleettune.namespacedRules" -}}
# TuningRuns: kopf watches them and patches its finalizer; the loop writes the status.
- apiGroups: [fleettune.dev]
  resources: [tuningruns]
  verbs: [get, list, watch, patch]
- apiGroups: [fleettune.dev]
  resources: [tuningruns/status]
  verbs: [get, patch]
# Trial Jobs name their run as owner with blockOwnerDeletion; where the
# OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift), setting that
# needs update on the owner's finalizers subresource. Nothing else: no update of the runs.
- apiGroups: [fleettune.dev]
  resources: [tuningruns/finalizers]
  verbs: [update]
# One Job per trial: created, watched (wakes the loop), deleted once its record is stored.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
# A finished trial's verdict is read from its Pod's termination message; the watch
# sees a Pod end before its Job is marked Complete.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
{{- if gt (int .Values.followAnswers) 0 }}
# A running batch Pod's answers, read from its log as it prints them (followAnswers).
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
{{- end }}
# The results store (sharded ConfigMaps owned by the run), published configurations, and
# user kernel sources (watched: an edited source starts a new round at once).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
# kopf posts warnings as Events; the operator counts a repeated one on its Event (patch).
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.peering.enabled }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
