{{- define "fleettune.name" -}}{{ .Release.Name }}-fleettune{{- end -}}
{{- define "fleettune.labels" -}}
app.kubernetes.io/name: fleettune
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "fleettune.namespaces" -}}
{{- if .Values.watchNamespaces }}{{ join "," .Values.watchNamespaces }}{{ else }}{{ .Release.Namespace }}{{ end -}}
{{- end -}}
