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
{{- /* The admission policies' shared variables: is the object's namespace governed by the
ProxyFleetPolicy given as a parameter (its namespaceSelector; an operator it does not know,
or In/NotIn without values, governs, failing closed as the operator does), and the policy's
name for messages. */ -}}
{{- define "proxyfleet.policyVariables" -}}
- name: labels
  expression: "namespaceObject.metadata.?labels.orValue({})"
- name: governed
  expression: >-
    !has(params.spec.namespaceSelector)
    || ((!has(params.spec.namespaceSelector.matchLabels) || params.spec.namespaceSelector.matchLabels.all(k,
          k in variables.labels && variables.labels[k] == params.spec.namespaceSelector.matchLabels[k]))
        && (!has(params.spec.namespaceSelector.matchExpressions) || params.spec.namespaceSelector.matchExpressions.all(e,
          (e.operator in ['In', 'NotIn'] && (!has(e.values) || size(e.values) == 0))
          || (e.operator == 'In' && e.key in variables.labels && variables.labels[e.key] in e.values)
          || (e.operator == 'NotIn' && !(e.key in variables.labels && variables.labels[e.key] in e.values))
          || (e.operator == 'Exists' && e.key in variables.labels)
          || (e.operator == 'DoesNotExist' && !(e.key in variables.labels))
          || !(e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist']))))
- name: where
  expression: "' (ProxyFleetPolicy ' + params.metadata.name + ')'"
{{- end -}}
{{- /* allowedPrometheusAddresses over a canary strategy at .at (a CEL path), named .field in
the message; .absent is true when there is no strategy there. */ -}}
{{- define "proxyfleet.prometheusRule" -}}
- expression: >-
    !variables.governed || !has(params.spec.allowedPrometheusAddresses)
    || {{ .absent }}
    || ((!has({{ .at }}.analysis)
         || ((!has({{ .at }}.analysis.source) || !has({{ .at }}.analysis.source.prometheus)
              || {{ .at }}.analysis.source.prometheus.address in params.spec.allowedPrometheusAddresses)
             && (!has({{ .at }}.analysis.metrics) || {{ .at }}.analysis.metrics.all(m,
                  !has(m.prometheus) || m.prometheus.address in params.spec.allowedPrometheusAddresses))))
        && (!has({{ .at }}.steps) || {{ .at }}.steps.all(s, !has(s.analysis)
            || ((!has(s.analysis.source) || !has(s.analysis.source.prometheus)
                 || s.analysis.source.prometheus.address in params.spec.allowedPrometheusAddresses)
                && (!has(s.analysis.metrics) || s.analysis.metrics.all(m,
                     !has(m.prometheus) || m.prometheus.address in params.spec.allowedPrometheusAddresses))))))
  messageExpression: "'{{ .field }}: an analysis queries a Prometheus address not in allowedPrometheusAddresses' + variables.where"
  reason: Forbidden
{{- end -}}
{{- /* Requests the admission policies leave alone: the operator's own writes (finalizers,
clearing a command), and updates that leave the spec as it was (a command annotation on a fleet
the operator holds for a policy is metadata, not a spec the policy judges). */ -}}
{{- define "proxyfleet.policyMatchConditions" -}}
- name: not-the-operator
  expression: "request.userInfo.username != 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "proxyfleet.name" . }}'"
- name: spec-written
  expression: "request.operation != 'UPDATE' || object.spec != oldObject.spec"
{{- end -}}
