{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release fullname: <release>-<chart> unless the release name already contains the chart's. */}}
{{- define "outbox-relay.fullname" -}}
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

{{- define "outbox-relay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ include "outbox-relay.chart" . }}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "outbox-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-relay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap mounted at /etc/outbox-relay: the chart's, or existingConfigMap. */}}
{{- define "outbox-relay.configMapName" -}}
{{- default (include "outbox-relay.fullname" .) .Values.existingConfigMap }}
{{- end }}

{{/*
relay.toml, rendered from values as one map with mustToToml (valid TOML by construction: the
encoder writes a table's scalar keys before its sub-tables and arrays of tables):
  - config.shared: the top-level (shared) settings; the chart sets http.listen;
  - sources: each one [[source]] table (one MySQL server/outbox; `name` is the connector name);
  - fleet.enabled: a [fleet] table (group_id, control_topic, instance_id = ${env:POD_NAME}).
Numbers from values files reach templates as float64: toToml would write 5001 as `5001.0` and
67108864 as `6.7108864e+07`, which the relay's integer keys refuse. "outbox-relay.wholeNumbers"
turns every whole float64 into an int64 first (a float key such as tracing.sample_ratio accepts
an integer).
*/}}

{{/* In place: whole float64 values of the map (and of maps and lists inside it) become int64. */}}
{{- define "outbox-relay.wholeNumbers" -}}
{{- $m := . -}}
{{- range $k, $v := $m -}}
{{- if and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v) -}}
{{- $_ := set $m $k (int64 $v) -}}
{{- else if kindIs "map" $v -}}
{{- include "outbox-relay.wholeNumbers" $v -}}
{{- else if kindIs "slice" $v -}}
{{- $items := list -}}
{{- range $item := $v -}}
{{- if and (kindIs "float64" $item) (eq (float64 (int64 $item)) $item) -}}
{{- $items = append $items (int64 $item) -}}
{{- else -}}
{{- if kindIs "map" $item -}}
{{- include "outbox-relay.wholeNumbers" $item -}}
{{- end -}}
{{- $items = append $items $item -}}
{{- end -}}
{{- end -}}
{{- $_ := set $m $k $items -}}
{{- end -}}
{{- end -}}
{{- end }}
{{- define "outbox-relay.config" -}}
{{- $shared := deepCopy (.Values.config.shared | default dict) -}}
{{- range $k := list "source" "fleet" -}}
{{- if hasKey $shared $k -}}
{{- fail (printf "config.shared.%s: use the chart's `%s` value instead" $k (ternary "sources" "fleet" (eq $k "source"))) -}}
{{- end -}}
{{- end -}}
{{- $http := dict -}}
{{- if hasKey $shared "http" -}}
{{- $http = get $shared "http" -}}
{{- end -}}
{{- if and (hasKey $http "enabled") (not $http.enabled) -}}
{{- fail "config.shared.http.enabled = false: the chart's probes and Service need /healthz, /readyz and /metrics" -}}
{{- end -}}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int .Values.containerPort)) -}}
{{- $_ := set $shared "http" $http -}}
{{- $names := dict -}}
{{- range $i, $src := .Values.sources -}}
{{- if not (kindIs "map" $src) -}}
{{- fail (printf "sources[%d]: must be a map (one [[source]] table)" $i) -}}
{{- end -}}
{{- $name := toString (get $src "name" | default "") | trim -}}
{{- if not $name -}}
{{- fail (printf "sources[%d]: `name` is required and must not be empty (it is the connector name: it keys the source's checkpoint row and lease)" $i) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "sources[%d]: name %q is used by sources[%v] too: source names must be unique" $i $name (get $names $name)) -}}
{{- end -}}
{{- $_ := set $names $name $i -}}
{{- if hasKey $src "connector_name" -}}
{{- fail (printf "sources[%d] (%s): the source's connector name is its `name`; remove connector_name" $i $name) -}}
{{- end -}}
{{- range $k := list "http" "tracing" -}}
{{- if hasKey $src $k -}}
{{- fail (printf "sources[%d] (%s): [%s] is process-wide; set it in config.shared" $i $name $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.sources -}}
{{- if hasKey $shared "connector_name" -}}
{{- fail "config.shared.connector_name: with `sources` each source's connector name is its `name`; remove config.shared.connector_name" -}}
{{- end -}}
{{- $_ := set $shared "source" (deepCopy .Values.sources) -}}
{{- end -}}
{{- if .Values.fleet.enabled -}}
{{- if not .Values.sources -}}
{{- fail "fleet.enabled: the fleet shares the `sources` among the replicas; list them in `sources`" -}}
{{- end -}}
{{- /* Each pod derives its own server_id per source (the relay refuses a written one in a fleet). */ -}}
{{- if hasKey (get $shared "mysql" | default dict) "server_id" -}}
{{- fail "config.shared.mysql.server_id: in a fleet each pod derives its own server_id per source (from the source's name and the pod's name); remove it" -}}
{{- end -}}
{{- range $i, $src := .Values.sources -}}
{{- if hasKey (get $src "mysql" | default dict) "server_id" -}}
{{- fail (printf "sources[%d] (%s): mysql.server_id: in a fleet each pod derives its own server_id per source (from the source's name and the pod's name); remove it" $i (get $src "name")) -}}
{{- end -}}
{{- end -}}
{{- $fullname := include "outbox-relay.fullname" . -}}
{{- $_ := set $shared "fleet" (dict
      "enabled" true
      "group_id" (default $fullname .Values.fleet.groupId)
      "control_topic" (default (printf "%s.fleet" $fullname) .Values.fleet.controlTopic)
      "instance_id" "${env:POD_NAME}") -}}
{{- end -}}
{{- include "outbox-relay.wholeNumbers" $shared -}}
{{- mustToToml $shared -}}
{{- end }}
