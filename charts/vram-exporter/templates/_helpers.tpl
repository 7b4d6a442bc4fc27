{{/* The name: the app.kubernetes.io/name label, and the scrape job's name. */}}
{{- define "vram-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Objects' names: the release's name when it already says vram-exporter. */}}
{{- define "vram-exporter.fullname" -}}
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

{{/* What selects this release's pods; never changes after the first install. */}}
{{- define "vram-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vram-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "vram-exporter.labels" -}}
{{ include "vram-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
{{- end }}

{{/* The image; the chart of the repository names none, and says what to set. */}}
{{- define "vram-exporter.image" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set: set it to the registry your nodes pull vram-exporter from, e.g. --set image.repository=ghcr.io/OWNER/vram-exporter (a release's chart names its published image; to build and push your own, see docs/kubernetes.md)" }}
{{- end }}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "vram-exporter.npdImage" -}}
{{- with .Values.nodeProblemDetector.image }}
{{- if .digest }}
{{- printf "%s:%s@%s" .repository .tag .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding web-config.yml. */}}
{{- define "vram-exporter.webConfigSecret" -}}
{{- .Values.webConfig.existingSecret | default (printf "%s-web-config" (include "vram-exporter.fullname" .)) }}
{{- end }}

{{/* One endpoint of a ServiceMonitor or PodMonitor, from .Values.serviceMonitor or .Values.podMonitor. */}}
{{- define "vram-exporter.endpoint" -}}
- port: metrics
  interval: {{ .interval }}
  scrapeTimeout: {{ .scrapeTimeout }}
  {{- with .scheme }}
  scheme: {{ . }}
  {{- end }}
  {{- with .tlsConfig }}
  tlsConfig:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .basicAuth }}
  basicAuth:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    {{- with .relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* A byte count in words, as the alert descriptions write it: 1GiB, 512MiB, 1000B. */}}
{{- define "vram-exporter.bytes" -}}
{{- $bytes := int64 . }}
{{- $units := list (list 1099511627776 "TiB") (list 1073741824 "GiB") (list 1048576 "MiB") (list 1024 "KiB") }}
{{- $said := "" }}
{{- range $units }}
{{- if and (not $said) (gt $bytes 0) (eq (mod $bytes (index . 0)) 0) }}
{{- $said = printf "%d%s" (div $bytes (index . 0)) (index . 1) }}
{{- end }}
{{- end }}
{{- $said | default (printf "%dB" $bytes) }}
{{- end }}

{{/*
  A string as a YAML scalar, written the way the rules file writes it: a literal block
  (|) when it spans lines; plain when YAML allows; else quoted. Never folded, as toYaml
  folds long lines. (list STRING INDENT)
*/}}
{{- define "vram-exporter.yamlString" -}}
{{- $value := toString (index . 0) }}
{{- $indent := index . 1 }}
{{- $style := toYaml $value | trunc 1 }}
{{- if and (contains "\n" $value) (hasSuffix "\n" $value) (not (hasSuffix "\n\n" $value)) (not (hasPrefix " " $value)) }}
{{- printf "|\n%s" (trimSuffix "\n" $value | indent $indent) }}
{{- else if contains "\n" $value }}
{{- toJson $value | replace "\\u003c" "<" | replace "\\u003e" ">" | replace "\\u0026" "&" }}
{{- else if eq $style "'" }}
{{- printf "'%s'" (replace "'" "''" $value) }}
{{- else if eq $style "\"" }}
{{- toJson $value | replace "\\u003c" "<" | replace "\\u003e" ">" | replace "\\u0026" "&" }}
{{- else }}
{{- $value }}
{{- end }}
{{- end }}
