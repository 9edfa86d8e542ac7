{{- define "proxyfleet.name" -}}proxyfleet-operator{{- end -}}
{{- define "proxyfleet.labels" -}}
app.kubernetes.io/name: proxyfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "proxyfleet.selector" -}}
app.kubernetes.io/name: proxyfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "proxyfleet.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "proxyfleet.proxyImage" -}}{{ .Values.proxyImage.repository }}:{{ .Values.proxyImage.tag | default .Chart.AppVersion }}{{- end -}}
