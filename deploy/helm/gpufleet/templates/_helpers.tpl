{{/* Names, labels, images and the two components' config files. */}}

{{- define "gpufleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* `<release>-<chart>`, or the release name alone when it already holds the chart's name. Leaves
room for the `-controller` suffix within Kubernetes' 63 characters. */}}
{{- define "gpufleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpufleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "root" $ "component" "agent"). */}}
{{- define "gpufleet.labels" -}}
helm.sh/chart: {{ include "gpufleet.chart" .root }}
{{ include "gpufleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: gpufleet
{{- end }}

{{- define "gpufleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpufleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image of a component: `image` with the component's own `image` map over it. */}}
{{- define "gpufleet.image" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (index .root.Values .component "image") }}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) }}
{{- end }}

{{- define "gpufleet.imagePullPolicy" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (index .root.Values .component "image") }}
{{- $image.pullPolicy }}
{{- end }}

{{- define "gpufleet.serviceAccountName" -}}
{{- $sa := index .root.Values .component "serviceAccount" }}
{{- if $sa.create }}
{{- default (printf "%s-%s" (include "gpufleet.fullname" .root) .component) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{/* Where the agents stream to: the controller's Service. */}}
{{- define "gpufleet.controllerAddress" -}}
{{- printf "%s-controller.%s.svc:%d" (include "gpufleet.fullname" .) .Release.Namespace (int .Values.controller.grpcPort) }}
{{- end }}

{{/* Paths inside the containers. */}}
{{- define "gpufleet.bmcCredentialsDir" }}/var/run/secrets/gpufleet/bmc{{ end }}
{{- define "gpufleet.bmcCaDir" }}/etc/gpufleet/bmc-ca{{ end }}
{{- define "gpufleet.stateDir" }}/var/lib/gpufleet{{ end }}

{{/* Fails when `config` (a user's config map) sets a key the chart sets itself. Call with
(list $config (dict "dotted.key" "what to do instead") "agent.config"). */}}
{{- define "gpufleet.refuseManagedKeys" -}}
{{- $config := index . 0 }}
{{- $where := index . 2 }}
{{- range $path, $instead := index . 1 }}
{{- $node := $config }}
{{- $found := true }}
{{- range $key := splitList "." $path }}
{{- if and $found (kindIs "map" $node) (hasKey $node $key) }}
{{- $node = index $node $key }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}
{{- fail (printf "%s.%s is set by the chart: %s" $where $path $instead) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The agent's config file (agent/config.py): the user's `agent.config` with the keys the chart
owns added. The node name comes from the downward API as `--node`, the BMC's URL as `--bmc-url`
(Kubernetes expands $(NODE_NAME) in arguments, not in files). */}}
{{- define "gpufleet.agentConfig" -}}
{{- $managed := dict
  "node" "each agent gets its Kubernetes node name as --node"
  "host_root" "the host's / is mounted at /host"
  "stream.controller" "the agents stream to this release's controller"
  "stream.spool_dir" "set tuning.hostPath instead (used with tuning.enabled)"
  "metrics.address" "set agent.metrics.port instead"
  "metrics.dcgm_compat" "set agent.metrics.dcgmCompat instead"
  "bmc.url" "set agent.bmc.url instead"
  "bmc.credentials_dir" "set agent.bmc.existingSecret instead"
  "bmc.ca_bundle" "set agent.bmc.caConfigMap instead"
  "bmc.insecure" "set agent.bmc.insecure instead"
  "tuning.enabled" "set tuning.enabled instead (it also grants the capability tuning needs)"
  "tuning.state_dir" "set tuning.hostPath instead" }}
{{- include "gpufleet.refuseManagedKeys" (list .Values.agent.config $managed "agent.config") }}
{{- $config := deepCopy .Values.agent.config }}
{{- $_ := set $config "host_root" "/host" }}
{{- $stream := dict "controller" (include "gpufleet.controllerAddress" .) }}
{{- if .Values.tuning.enabled }}
{{- $_ := set $stream "spool_dir" (printf "%s/spool" (include "gpufleet.stateDir" .)) }}
{{- else }}
{{- $_ := set $stream "spool_dir" "/var/spool/gpufleet" }}
{{- end }}
{{- $_ := set $config "stream" (mergeOverwrite (default (dict) $config.stream) $stream) }}
{{- $metrics := dict "address" (printf "0.0.0.0:%d" (int .Values.agent.metrics.port)) "dcgm_compat" .Values.agent.metrics.dcgmCompat }}
{{- $_ := set $config "metrics" (mergeOverwrite (default (dict) $config.metrics) $metrics) }}
{{- if .Values.agent.bmc.url }}
{{- $bmc := default (dict) $config.bmc }}
{{- $_ := set $bmc "credentials_dir" (include "gpufleet.bmcCredentialsDir" .) }}
{{- if .Values.agent.bmc.caConfigMap }}
{{- $_ := set $bmc "ca_bundle" (printf "%s/ca.crt" (include "gpufleet.bmcCaDir" .)) }}
{{- end }}
{{- $_ := set $bmc "insecure" .Values.agent.bmc.insecure }}
{{- $_ := set $config "bmc" $bmc }}
{{- end }}
{{- $tuning := default (dict) $config.tuning }}
{{- $_ := set $tuning "enabled" .Values.tuning.enabled }}
{{- if .Values.tuning.enabled }}
{{- $_ := set $tuning "state_dir" (printf "%s/tuning" (include "gpufleet.stateDir" .)) }}
{{- end }}
{{- $_ := set $config "tuning" $tuning }}
{{- toYaml $config }}
{{- end }}

{{/* The controller's config file (controller/config.py): the user's `controller.config` with the
keys the chart owns added. */}}
{{- define "gpufleet.controllerConfig" -}}
{{- $managed := dict
  "listen" "set controller.grpcPort instead"
  "metrics_address" "set controller.metricsPort instead"
  "db" "the SQLite file is on the controller's volume (controller.persistence)" }}
{{- include "gpufleet.refuseManagedKeys" (list .Values.controller.config $managed "controller.config") }}
{{- $config := deepCopy .Values.controller.config }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%d" (int .Values.controller.grpcPort)) }}
{{- $_ := set $config "metrics_address" (printf "0.0.0.0:%d" (int .Values.controller.metricsPort)) }}
{{- $_ := set $config "db" (printf "%s/gpufleet.db" (include "gpufleet.stateDir" .)) }}
{{- toYaml $config }}
{{- end }}
