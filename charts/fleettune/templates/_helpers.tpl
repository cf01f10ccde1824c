{{- define "fleettune.name" -}}{{ .Release.Name | trunc 53 | trimSuffix "-" }}-fleettune{{- end -}}

{{- define "fleettune.selectorLabels" -}}
app.kubernetes.io/name: fleettune
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleettune.labels" -}}
{{ include "fleettune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleettune.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "fleettune.name" .) -}}
{{- end -}}

{{- /* Comma-separated watched namespaces (namespaced mode only). */ -}}
{{- define "fleettune.namespaces" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end -}}

{{- define "fleettune.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest }}{{ $img.repository }}@{{ $img.digest }}{{ else }}{{ $img.repository }}:{{ $img.tag | default .Chart.AppVersion }}{{ end -}}
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
# One Job per trial: created, watched (wakes the loop), deleted once its record is stored.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
# A finished trial's verdict is read from its Pod's termination message; the watch
# sees a Pod end before its Job is marked Complete.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# The results store (sharded ConfigMaps owned by the run), published configurations, and
# user kernel sources (watched: an edited source starts a new round at once).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update]
# kopf posts warnings as Events.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
{{- if .Values.peering.enabled }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
