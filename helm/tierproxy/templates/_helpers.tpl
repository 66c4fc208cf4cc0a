{{- define "tierproxy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "tierproxy.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tierproxy.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tierproxy.adminSecret" -}}
{{- if .Values.admin.existingSecret -}}{{ .Values.admin.existingSecret }}{{- else -}}{{ include "tierproxy.fullname" . }}-admin{{- end -}}
{{- end -}}

{{- define "tierproxy.advertisedHost" -}}
{{- if .Values.proxy.advertisedHost -}}{{ .Values.proxy.advertisedHost }}{{- else -}}{{ include "tierproxy.fullname" . }}.{{ .Release.Namespace }}.svc{{- end -}}
{{- end -}}

{{/* environment shared by the proxy and the tiering job */}}
{{- define "tierproxy.commonEnv" -}}
- name: TIERPROXY_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: TIERPROXY_STORAGE
  value: {{ .Values.storage.uri | quote }}
- name: TIERPROXY_METADATA
  value: {{ .Values.metadata.uri | quote }}
- name: TIERPROXY_TIER_RETENTION_MS
  value: {{ .Values.tier.retentionMs | quote }}
- name: TIERPROXY_TIER_RETENTION_BYTES
  value: {{ .Values.tier.retentionBytes | quote }}
{{- if .Values.iceberg.catalog }}
- name: TIERPROXY_ICEBERG_CATALOG
  value: {{ .Values.iceberg.catalog | quote }}
- name: TIERPROXY_ICEBERG_TABLE
  value: {{ .Values.iceberg.table | quote }}
{{- if .Values.iceberg.existingSecret }}
- name: TIERPROXY_ICEBERG_CATALOG_CREDENTIAL
  valueFrom: {secretKeyRef: {name: {{ .Values.iceberg.existingSecret | quote }}, key: credential, optional: true}}
- name: TIERPROXY_ICEBERG_CATALOG_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.iceberg.existingSecret | quote }}, key: token, optional: true}}
{{- end }}
{{- end }}
{{- if .Values.storage.s3.region }}
- name: AWS_REGION
  value: {{ .Values.storage.s3.region | quote }}
{{- end }}
{{- if .Values.storage.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ .Values.storage.s3.existingSecret | quote }}, key: AWS_ACCESS_KEY_ID}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.storage.s3.existingSecret | quote }}, key: AWS_SECRET_ACCESS_KEY}}
{{- end }}
{{- if .Values.kafka.commandConfig.existingSecret }}
- name: TIERPROXY_COMMAND_CONFIG
  value: /etc/tierproxy/kafka-client/{{ .Values.kafka.commandConfig.key }}
{{- end }}
{{- if .Values.kafka.tls.enabled }}
- name: TIERPROXY_UPSTREAM_SSL_ENABLED
  value: "true"
- name: TIERPROXY_UPSTREAM_SSL_CAFILE
  value: /etc/tierproxy/upstream-tls/ca.crt
- name: TIERPROXY_UPSTREAM_SSL_CHECK_HOSTNAME
  value: {{ .Values.kafka.tls.checkHostname | quote }}
{{- end }}
{{- end -}}

{{/* The proxy's image: repository and tag, the tag defaulting to the chart's appVersion (the package version). */}}
{{- define "tierproxy.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The jobs' image (PySpark and a JRE): the tier job's CronJob or Deployment. */}}
{{- define "tierproxy.jobsImage" -}}
{{ .Values.jobsImage.repository }}:{{ .Values.jobsImage.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The image runs as uid/gid 10001 (a numeric USER, so runAsNonRoot can be checked). */}}
{{- define "tierproxy.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "tierproxy.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities: {drop: ["ALL"]}
{{- end }}

{{/* tierproxy's own identity: the command config Secret, mounted read-only */}}
{{- define "tierproxy.identityMount" -}}
{{- if .Values.kafka.commandConfig.existingSecret }}
- {name: kafka-client, mountPath: /etc/tierproxy/kafka-client, readOnly: true}
{{- end }}
{{- end -}}

{{- define "tierproxy.identityVolume" -}}
{{- if .Values.kafka.commandConfig.existingSecret }}
- name: kafka-client
  secret: {secretName: {{ .Values.kafka.commandConfig.existingSecret | quote }}, defaultMode: 0440}
{{- end }}
{{- end -}}
