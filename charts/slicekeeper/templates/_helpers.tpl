{{/* Names and labels shared by the templates. */}}

{{- define "slicekeeper.operatorName" -}}
slicekeeper-operator
{{- end }}

{{- define "slicekeeper.labels" -}}
app.kubernetes.io/part-of: slicekeeper
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "slicekeeper.operatorSelector" -}}
app.kubernetes.io/name: slicekeeper-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "slicekeeper.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
