{{/* Names, labels and the argocd-agent-params mapping of the agent chart. */}}

{{- define "argocd-agent-agent.name" -}}
{{- default "argocd-agent-agent" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "argocd-agent-agent.fullname" -}}
{{- default "argocd-agent-agent" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "argocd-agent-agent.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "argocd-agent-agent.serviceAccountName" -}}
{{- default (include "argocd-agent-agent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "argocd-agent-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "argocd-agent-agent.name" . }}
app.kubernetes.io/part-of: argocd-agent
app.kubernetes.io/component: agent
{{- end -}}

{{- define "argocd-agent-agent.labels" -}}
{{ include "argocd-agent-agent.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The argocd-agent-params keys (upstream's names) and the environment variable of
`argocd-agent agent` each one sets, one "key=ENV" per line, wired with configMapKeyRef
(optional: true) as upstream's manifests do. Two differ from upstream's manifests on purpose:
agent.log.format sets ARGOCD_AGENT_LOG_FORMAT (upstream's manifest sets the principal's variable),
and agent.redis.address and agent.app-label-selector set the variables this binary reads for
--redis-addr and --label-selector, so that a value there takes effect (or, for the Redis
address, stops startup) instead of being ignored.
*/}}
{{- define "argocd-agent-agent.paramsEnv" -}}
agent.server.address=ARGOCD_AGENT_REMOTE_SERVER
agent.server.port=ARGOCD_AGENT_REMOTE_PORT
agent.log.level=ARGOCD_AGENT_LOG_LEVEL
agent.log.format=ARGOCD_AGENT_LOG_FORMAT
agent.namespace=ARGOCD_AGENT_NAMESPACE
agent.mode=ARGOCD_AGENT_MODE
agent.creds=ARGOCD_AGENT_CREDS
agent.tls.secret-name=ARGOCD_AGENT_TLS_SECRET_NAME
agent.tls.client.cert-path=ARGOCD_AGENT_TLS_CLIENT_CERT_PATH
agent.tls.client.key-path=ARGOCD_AGENT_TLS_CLIENT_KEY_PATH
agent.tls.client.insecure=ARGOCD_AGENT_TLS_INSECURE
agent.tls.root-ca-secret-name=ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME
agent.tls.root-ca-path=ARGOCD_AGENT_TLS_ROOT_CA_PATH
agent.tls.min-version=ARGOCD_AGENT_TLS_MIN_VERSION
agent.tls.max-version=ARGOCD_AGENT_TLS_MAX_VERSION
agent.tls.ciphersuites=ARGOCD_AGENT_TLS_CIPHERSUITES
agent.tls.insecure-plaintext=ARGOCD_AGENT_INSECURE_PLAINTEXT
agent.metrics.port=ARGOCD_AGENT_METRICS_PORT
agent.healthz.port=ARGOCD_AGENT_HEALTH_CHECK_PORT
agent.websocket.enable=ARGOCD_AGENT_ENABLE_WEBSOCKET
agent.compression.enable=ARGOCD_AGENT_ENABLE_COMPRESSION
agent.keep-alive.interval=ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL
agent.pprof.port=ARGOCD_AGENT_PPROF_PORT
agent.redis.address=REDIS_ADDR
agent.redis.username=REDIS_USERNAME
agent.redis.tls.enabled=ARGOCD_AGENT_REDIS_TLS_ENABLED
agent.resource-proxy.enable=ARGOCD_AGENT_ENABLE_RESOURCE_PROXY
agent.destination-based-mapping=ARGOCD_AGENT_DESTINATION_BASED_MAPPING
agent.create-namespace=ARGOCD_AGENT_CREATE_NAMESPACE
agent.allowed-namespaces=ARGOCD_AGENT_ALLOWED_NAMESPACES
agent.app-label-selector=ARGOCD_AGENT_LABEL_SELECTOR
agent.name=ARGOCD_AGENT_NAME
agent.heartbeat.interval=ARGOCD_AGENT_HEARTBEAT_INTERVAL
agent.otlp.address=ARGOCD_AGENT_OTLP_ADDRESS
agent.spire.socket-path=ARGOCD_AGENT_SPIRE_AGENT_SOCKET
agent.spire.auth-method=ARGOCD_AGENT_SPIRE_AUTH_METHOD
{{- end -}}

{{/* Upstream values of features not implemented here must keep their inert value. */}}
{{- define "argocd-agent-agent.checkUnsupported" -}}
{{- $v := .Values -}}
{{- $bad := list -}}
{{- if gt (int $v.replicaCount) 1 }}{{ $bad = append $bad "replicaCount > 1" }}{{ end -}}
{{- if ne (toString $v.tlsClientInSecure) "false" }}{{ $bad = append $bad "tlsClientInSecure" }}{{ end -}}
{{- if not (has (toString $v.pprofPort) (list "" "0")) }}{{ $bad = append $bad "pprofPort" }}{{ end -}}
{{- if hasPrefix "userpass:" (toString $v.auth) }}{{ $bad = append $bad "auth userpass:" }}{{ end -}}
{{- if $bad -}}
{{- fail (printf "argocd-agent-rs does not support these yet: %s. Reset them to their defaults (docs/install.md, \"Migrating from upstream's chart\")." (join ", " $bad)) -}}
{{- end -}}
{{- if not $v.server -}}
{{- fail "server: the principal's address is required" -}}
{{- end -}}
{{- if and $v.spire.enabled (not (has (toString $v.spire.authMethod) (list "jwt" "mtls"))) -}}
{{- fail (printf "spire.authMethod %q: with spire.enabled it must be \"jwt\" or \"mtls\" (upstream's --spire-auth-method)" (toString $v.spire.authMethod)) -}}
{{- end -}}
{{- end -}}

{{- define "argocd-agent-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
