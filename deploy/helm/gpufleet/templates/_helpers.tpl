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

{{/* The operators' port: operatorPort with ingest fronts, else the gRPC port. */}}
{{- define "gpufleet.operatorPort" -}}
{{- if gt (int .Values.controller.ingestFronts) 0 }}{{ int .Values.controller.operatorPort }}{{ else }}{{ int .Values.controller.grpcPort }}{{ end }}
{{- end }}

{{/* With controller.replicaIngest, the Service the agents stream to: every controller pod's gRPC
port (controller-agents-service.yaml). `<fullname>-controller-agents`, the fullname cut so that
the name stays within 63 characters and never becomes the leader's `<fullname>-controller`. */}}
{{- define "gpufleet.controllerAgentsService" -}}
{{- printf "%s-controller-agents" (include "gpufleet.fullname" . | trunc 45 | trimSuffix "-") }}
{{- end }}

{{/* The Service the agents stream to: the leader's `<fullname>-controller`, or with
controller.replicaIngest the one of every controller pod. */}}
{{- define "gpufleet.agentsService" -}}
{{- if .Values.controller.replicaIngest }}
{{- include "gpufleet.controllerAgentsService" . }}
{{- else }}
{{- printf "%s-controller" (include "gpufleet.fullname" .) }}
{{- end }}
{{- end }}

{{/* Where the agents stream to. */}}
{{- define "gpufleet.controllerAddress" -}}
{{- printf "%s.%s.svc:%d" (include "gpufleet.agentsService" .) .Release.Namespace (int .Values.controller.grpcPort) }}
{{- end }}

{{/* Paths inside the containers. */}}
{{- define "gpufleet.bmcCredentialsDir" }}/var/run/secrets/gpufleet/bmc{{ end }}
{{- define "gpufleet.bmcCaDir" }}/etc/gpufleet/bmc-ca{{ end }}
{{- define "gpufleet.stateDir" }}/var/lib/gpufleet{{ end }}
{{- define "gpufleet.tlsDir" }}/var/run/secrets/gpufleet/tls{{ end }}
{{- define "gpufleet.operatorTokensDir" }}/var/run/secrets/gpufleet/operator-tokens{{ end }}
{{- define "gpufleet.webConfigDir" }}/var/run/secrets/gpufleet/web-config{{ end }}

{{/* The Secret whose key (gpufleet.dbSecretKey) holds the controller's postgresql:// URL, given to
it as GPUFLEET_DB: the user's (postgresql.existingSecret, before url) or the chart's
(controller-db-secret.yaml, from postgresql.url). Empty: the SQLite file on the controller's
volume. */}}
{{- define "gpufleet.dbSecret" -}}
{{- if .Values.postgresql.existingSecret }}
{{- .Values.postgresql.existingSecret }}
{{- else if .Values.postgresql.url }}
{{- printf "%s-controller-db" (include "gpufleet.fullname" .) }}
{{- end }}
{{- end }}

{{- define "gpufleet.dbSecretKey" -}}
{{- if .Values.postgresql.existingSecret }}
{{- .Values.postgresql.secretKey }}
{{- else }}
{{- print "url" }}
{{- end }}
{{- end }}

{{/* The claim behind the controller's volume at gpufleet.stateDir, or empty for an emptyDir. The
SQLite file needs it (with persistence.enabled); with PostgreSQL only a `record` file there does
(controller.config.record): no claim is made for the database alone. */}}
{{- define "gpufleet.controllerClaim" -}}
{{- $persistence := .Values.controller.persistence }}
{{- $record := toString (default "" (index (default (dict) .Values.controller.config) "record")) }}
{{- $recordOnVolume := hasPrefix (printf "%s/" (include "gpufleet.stateDir" .)) $record }}
{{- if and $persistence.enabled (or (not (include "gpufleet.dbSecret" .)) $recordOnVolume) }}
{{- default (printf "%s-controller" (include "gpufleet.fullname" .)) $persistence.existingClaim }}
{{- end }}
{{- end }}

{{/* Non-empty when the controller's replicas can share a store: PostgreSQL (a lease in the database
names the one that leads; the others wait as standbys) and no claim (a ReadWriteOnce volume, and the
`record` file on it, belong to one pod). */}}
{{- define "gpufleet.controllerShared" -}}
{{- if and (include "gpufleet.dbSecret" .) (not (include "gpufleet.controllerClaim" .)) }}true{{ end }}
{{- end }}

{{/* With a shared store (PostgreSQL), the leader's pod alone carries this label (controller/kube/role.py):
the Service and the PodMonitor select it, so operators, scrapes and (without controller.replicaIngest)
agents reach the leader and never a standby. */}}
{{- define "gpufleet.controllerRoleSelector" -}}
{{- if include "gpufleet.controllerShared" . }}
gpufleet.io/controller-role: leader
{{- end }}
{{- end }}

{{/* The controller pods Prometheus scrapes: with controller.replicaIngest every one (each ingests its
own agents and serves its own /metrics: frames, connected agents, store latency; its
gpufleet_controller_leading says whether it leads), otherwise the leader alone (a standby that does
not ingest serves no /metrics). */}}
{{- define "gpufleet.controllerScrapeSelector" -}}
{{- if not .Values.controller.replicaIngest }}
{{- include "gpufleet.controllerRoleSelector" . }}
{{- end }}
{{- end }}

{{/* Fails when controller.replicas asks several controllers of a store they cannot share. */}}
{{- define "gpufleet.checkReplicas" -}}
{{- if gt (int .Values.controller.replicas) 1 }}
{{- if not (include "gpufleet.dbSecret" .) }}
{{- fail "controller.replicas > 1 needs postgresql.url or postgresql.existingSecret: an SQLite file cannot be shared by several controllers" }}
{{- end }}
{{- with include "gpufleet.controllerClaim" . }}
{{- fail (printf "controller.replicas > 1 with controller.config.record under %s: the replicas cannot share its claim (%s) or the file; put record elsewhere (e.g. under /tmp) or set controller.persistence.enabled=false" (include "gpufleet.stateDir" $) .) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Fails when controller.replicaIngest has no store the replicas share: they record there which
replica owns each node. */}}
{{- define "gpufleet.checkReplicaIngest" -}}
{{- if and .Values.controller.replicaIngest (not (include "gpufleet.dbSecret" .)) }}
{{- fail "controller.replicaIngest needs postgresql.url or postgresql.existingSecret: the replicas record in the shared store which of them owns each node" }}
{{- end }}
{{- end }}

{{/* The Secret with the controller's certificate: cert-manager's or the user's. */}}
{{- define "gpufleet.controllerTlsSecret" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-controller-tls" (include "gpufleet.fullname" .) }}
{{- else }}
{{- .Values.tls.controllerSecret }}
{{- end }}
{{- end }}

{{/* The agent's CA file, and its certificate and key as `--tls-cert`/`--tls-key` (a YAML list):
from the node's own directory (agentHostPath, its file names agentHostFiles), or from the Secret
holding every node's pair (agentSecret: `$(NODE_NAME).crt`, expanded by Kubernetes). */}}
{{- define "gpufleet.agentTlsCa" -}}
{{- $dir := include "gpufleet.tlsDir" . }}
{{- if .Values.tls.agentHostPath }}
{{- printf "%s/%s" $dir .Values.tls.agentHostFiles.ca }}
{{- else }}
{{- printf "%s/ca.crt" $dir }}
{{- end }}
{{- end }}

{{- define "gpufleet.agentTlsArgs" -}}
{{- $dir := include "gpufleet.tlsDir" . }}
{{- if .Values.tls.agentHostPath }}
{{- $files := .Values.tls.agentHostFiles }}
- {{ printf "--tls-cert=%s/%s" $dir $files.cert | quote }}
- {{ printf "--tls-key=%s/%s" $dir $files.key | quote }}
{{- else }}
- {{ printf "--tls-cert=%s/$(NODE_NAME).crt" $dir | quote }}
- {{ printf "--tls-key=%s/$(NODE_NAME).key" $dir | quote }}
{{- end }}
{{- end }}

{{/* Fails unless the transport is mutual TLS with every certificate given, or plaintext chosen
explicitly: says what to set. */}}
{{- define "gpufleet.checkTls" -}}
{{- $tls := .Values.tls }}
{{- if $tls.enabled }}
{{- if $tls.insecure }}
{{- fail "tls.insecure=true is plaintext: it needs tls.enabled=false (or leave tls.insecure false)" }}
{{- end }}
{{- if and $tls.certManager.enabled $tls.controllerSecret }}
{{- fail "tls.controllerSecret and tls.certManager.enabled both give the controller's certificate: set one" }}
{{- end }}
{{- if not (or $tls.controllerSecret $tls.certManager.enabled) }}
{{- fail "tls.enabled: set tls.controllerSecret (a Secret with tls.crt, tls.key and ca.crt; `gpufleet certs` makes them) or tls.certManager.enabled=true with tls.certManager.issuerRef.name, and tls.agentHostPath (or tls.agentSecret); or tls.enabled=false with tls.insecure=true for plaintext" }}
{{- end }}
{{- if and $tls.certManager.enabled (not $tls.certManager.issuerRef.name) }}
{{- fail "tls.certManager.enabled: set tls.certManager.issuerRef.name (the Issuer or ClusterIssuer that signs the controller's certificate)" }}
{{- end }}
{{- if and $tls.agentHostPath $tls.agentSecret }}
{{- fail "tls.agentHostPath and tls.agentSecret both give the agents' certificates: set one (agentHostPath keeps each node's key on its node)" }}
{{- end }}
{{- if not (or $tls.agentHostPath $tls.agentSecret) }}
{{- fail "tls.enabled: set tls.agentHostPath (a directory on each node holding that node's own node.crt, node.key and ca.crt; `gpufleet certs node` makes them) or, in a lab, tls.agentSecret (a Secret with ca.crt and every node's NODE.crt/NODE.key); or tls.enabled=false with tls.insecure=true for plaintext" }}
{{- end }}
{{- else if not $tls.insecure }}
{{- fail "tls.enabled=false is plaintext gRPC (anyone who can reach the port can speak as any node): choose it explicitly with tls.insecure=true, or keep TLS on" }}
{{- end }}
{{- end }}

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
  "tuning.state_dir" "set tuning.hostPath instead"
  "stream.tls_ca" "set tls.agentHostPath (or tls.agentSecret) instead"
  "stream.tls_cert" "set tls.agentHostPath (or tls.agentSecret) instead"
  "stream.tls_key" "set tls.agentHostPath (or tls.agentSecret) instead"
  "stream.insecure" "set tls.enabled and tls.insecure instead"
  "metrics.web_config" "set metrics.webConfigSecret instead" }}
{{- include "gpufleet.refuseManagedKeys" (list .Values.agent.config $managed "agent.config") }}
{{- include "gpufleet.checkTls" . }}
{{- $config := deepCopy .Values.agent.config }}
{{- $_ := set $config "host_root" "/host" }}
{{- $stream := dict "controller" (include "gpufleet.controllerAddress" .) }}
{{- if .Values.tuning.enabled }}
{{- $_ := set $stream "spool_dir" (printf "%s/spool" (include "gpufleet.stateDir" .)) }}
{{- else }}
{{- $_ := set $stream "spool_dir" "/var/spool/gpufleet" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- /* The node's own certificate and key come as --tls-cert and --tls-key (gpufleet.agentTlsArgs):
with agentSecret their names hold $(NODE_NAME), expanded in arguments, not in files. */}}
{{- $_ := set $stream "tls_ca" (include "gpufleet.agentTlsCa" .) }}
{{- else }}
{{- $_ := set $stream "insecure" true }}
{{- end }}
{{- $_ := set $config "stream" (mergeOverwrite (default (dict) $config.stream) $stream) }}
{{- $metrics := dict "address" (printf "0.0.0.0:%d" (int .Values.agent.metrics.port)) "dcgm_compat" .Values.agent.metrics.dcgmCompat }}
{{- with .Values.metrics.webConfigSecret }}
{{- $_ := set $metrics "web_config" (printf "%s/web-config.yml" (include "gpufleet.webConfigDir" $)) }}
{{- end }}
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
keys the chart owns added. With PostgreSQL it has no `db`: GPUFLEET_DB, from the Secret, gives the
URL (and its password) only to the process. */}}
{{- define "gpufleet.controllerConfig" -}}
{{- $managed := dict
  "listen" "set controller.grpcPort instead"
  "metrics_address" "set controller.metricsPort instead"
  "health_listen" "set controller.healthPort instead"
  "db" "set postgresql.url or postgresql.existingSecret, or the SQLite file is on the controller's volume (controller.persistence)"
  "tls" "set tls.controllerSecret or tls.certManager instead"
  "insecure" "set tls.enabled=false and tls.insecure=true instead"
  "operator_tokens" "set operatorTokens.secret instead"
  "metrics_web_config" "set metrics.webConfigSecret instead"
  "kubernetes.leader_lease" "set controller.leaderLease instead"
  "ingest_fronts" "set controller.ingestFronts instead"
  "operator_listen" "set controller.ingestFronts and controller.operatorPort instead"
  "replica_ingest" "set controller.replicaIngest instead" }}
{{- include "gpufleet.refuseManagedKeys" (list .Values.controller.config $managed "controller.config") }}
{{- include "gpufleet.checkTls" . }}
{{- $config := deepCopy .Values.controller.config }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%d" (int .Values.controller.grpcPort)) }}
{{- $_ := set $config "metrics_address" (printf "0.0.0.0:%d" (int .Values.controller.metricsPort)) }}
{{- if gt (int .Values.controller.ingestFronts) 0 }}
{{- if eq (int .Values.controller.operatorPort) (int .Values.controller.grpcPort) }}
{{- fail "controller.operatorPort must differ from controller.grpcPort: with ingestFronts the fronts serve grpcPort" }}
{{- end }}
{{- $_ := set $config "ingest_fronts" (int .Values.controller.ingestFronts) }}
{{- $_ := set $config "operator_listen" (printf "0.0.0.0:%d" (int .Values.controller.operatorPort)) }}
{{- end }}
{{- include "gpufleet.checkReplicaIngest" . }}
{{- if .Values.controller.replicaIngest }}
{{- $_ := set $config "replica_ingest" true }}
{{- end }}
{{- if include "gpufleet.controllerShared" . }}
{{- $_ := set $config "health_listen" (printf "0.0.0.0:%d" (int .Values.controller.healthPort)) }}
{{- with .Values.controller.leaderLease }}
{{- $kube := deepCopy (default (dict) $config.kubernetes) }}
{{- $_ := set $kube "leader_lease" . }}
{{- $_ := set $config "kubernetes" $kube }}
{{- end }}
{{- else if .Values.controller.leaderLease }}
{{- fail "controller.leaderLease elects one of several controllers: it needs postgresql (and no controller.persistence record file)" }}
{{- end }}
{{- if not (include "gpufleet.dbSecret" .) }}
{{- $_ := set $config "db" (printf "%s/gpufleet.db" (include "gpufleet.stateDir" .)) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $dir := include "gpufleet.tlsDir" . }}
{{- $_ := set $config "tls" (dict "cert" (printf "%s/tls.crt" $dir) "key" (printf "%s/tls.key" $dir) "client_ca" (printf "%s/ca.crt" $dir)) }}
{{- else }}
{{- $_ := set $config "insecure" true }}
{{- end }}
{{- with .Values.operatorTokens.secret }}
{{- $_ := set $config "operator_tokens" (printf "%s/tokens.yaml" (include "gpufleet.operatorTokensDir" $)) }}
{{- end }}
{{- with .Values.metrics.webConfigSecret }}
{{- $_ := set $config "metrics_web_config" (printf "%s/web-config.yml" (include "gpufleet.webConfigDir" $)) }}
{{- end }}
{{- toYaml $config }}
{{- end }}
