{{/* Chart name. */}}
{{- define "prescale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-prescale, or the release name when it already contains the chart name. */}}
{{- define "prescale.fullname" -}}
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

{{- define "prescale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prescale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prescale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prescale.labels" -}}
helm.sh/chart: {{ include "prescale.chart" . }}
{{ include "prescale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prescale
{{- end }}

{{- define "prescale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prescale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "prescale.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "prescale.headroomPriorityClassName" -}}
{{- default "prescale-headroom" .Values.headroom.priorityClass.name }}
{{- end }}

{{/* Namespaces where headroom placeholders may be created. */}}
{{- define "prescale.headroomNamespaces" -}}
{{- if .Values.headroom.namespaces }}
{{- toYaml (uniq .Values.headroom.namespaces) }}
{{- else }}
{{- toYaml (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* Secret with the external metrics API's serving pair. */}}
{{- define "prescale.externalMetricsSecretName" -}}
{{- if .Values.externalMetrics.tlsSecretName }}
{{- .Values.externalMetrics.tlsSecretName }}
{{- else if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "prescale.fullname" .) }}
{{- else }}
{{- .Values.tls.secretName }}
{{- end }}
{{- end }}

{{- define "prescale.externalMetricsServiceName" -}}
{{- printf "%s-external-metrics" (include "prescale.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Secret holding the serving pair (tls.crt, tls.key, ca.crt). */}}
{{- define "prescale.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "prescale.fullname" .) }}
{{- else }}
{{- .Values.tls.secretName }}
{{- end }}
{{- end }}

{{- define "prescale.certificateName" -}}
{{- printf "%s-serving" (include "prescale.fullname" .) }}
{{- end }}

{{/* DNS names the serving certificate must carry: every name a scalerAddress or the aggregator may use. */}}
{{- define "prescale.dnsNames" -}}
{{- $ns := .Release.Namespace }}
{{- $names := list }}
{{- range $svc := list (include "prescale.fullname" .) (include "prescale.externalMetricsServiceName" .) }}
{{- $names = append $names $svc }}
{{- $names = append $names (printf "%s.%s" $svc $ns) }}
{{- $names = append $names (printf "%s.%s.svc" $svc $ns) }}
{{- $names = append $names (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- end }}
{{- range .Values.tls.certManager.extraDnsNames }}
{{- $names = append $names . }}
{{- end }}
{{- toYaml $names }}
{{- end }}

{{/* Fail early on combinations that cannot work. Included by the Deployment. */}}
{{- define "prescale.validate" -}}
{{- if and .Values.tls.enabled (not .Values.tls.certManager.enabled) (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName (an existing kubernetes.io/tls Secret) or tls.certManager.enabled" }}
{{- end }}
{{- if and .Values.tls.clientAuth (not .Values.tls.enabled) }}
{{- fail "tls.clientAuth needs tls.enabled" }}
{{- end }}
{{- if .Values.externalMetrics.enabled }}
{{- if not (include "prescale.externalMetricsSecretName" .) }}
{{- fail "externalMetrics.enabled needs a serving certificate (HTTPS only): externalMetrics.tlsSecretName, tls.certManager.enabled or tls.secretName" }}
{{- end }}
{{- $cmServes := and .Values.tls.certManager.enabled (not .Values.externalMetrics.tlsSecretName) }}
{{- if and .Values.externalMetrics.apiService.create (not $cmServes) (not .Values.externalMetrics.apiService.caBundle) (not .Values.externalMetrics.apiService.insecureSkipTLSVerify) }}
{{- fail "externalMetrics.apiService needs caBundle (base64 PEM of the CA that signed the serving Secret), tls.certManager.enabled (cainjector fills it), or insecureSkipTLSVerify" }}
{{- end }}
{{- range .Values.externalMetrics.metrics }}
{{- if not (regexMatch "^[-_.a-z0-9]+$" (toString .name)) }}
{{- fail (printf "externalMetrics.metrics: name %q must be lowercase [a-z0-9-_.], as prescale's own check (the HPA lowercases metric names in the URL)" (toString .name)) }}
{{- end }}
{{- if not .metadata }}
{{- fail (printf "externalMetrics.metrics[%s]: metadata is required" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not .Values.rbac.karpenter.enabled) .Values.rbac.karpenter.resizeNodePools }}
{{- fail "rbac.karpenter.resizeNodePools needs rbac.karpenter.enabled" }}
{{- end }}
{{- if ge (int .Values.headroom.priorityClass.value) 0 }}
{{- fail "headroom.priorityClass.value must be negative so real workloads preempt placeholders" }}
{{- end }}
{{- end }}
