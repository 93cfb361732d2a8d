{{/* Names, labels and the argocd-agent-params mapping of the principal chart. */}}

{{- define "argocd-agent-principal.name" -}}
{{- default "argocd-agent-principal" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "argocd-agent-principal.fullname" -}}
{{- default "argocd-agent-principal" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "argocd-agent-principal.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The principal's --namespace: its Secrets, identity ConfigMap and blocklist live there. */}}
{{- define "argocd-agent-principal.principalNamespace" -}}
{{- default (include "argocd-agent-principal.namespace" .) .Values.principal.namespace -}}
{{- end -}}

{{- define "argocd-agent-principal.serviceAccountName" -}}
{{- default (include "argocd-agent-principal.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "argocd-agent-principal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "argocd-agent-principal.name" . }}
app.kubernetes.io/part-of: argocd-agent
app.kubernetes.io/component: principal
{{- end -}}

{{- define "argocd-agent-principal.labels" -}}
{{ include "argocd-agent-principal.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The argocd-agent-params keys (upstream's names) and the environment variable of
`argocd-agent principal` each one sets, one "key=ENV" per line. The Deployment maps every key
with configMapKeyRef (optional: true), as upstream's manifests do, so a key set in an upstream
ConfigMap reaches the binary; keys of features not implemented here still reach it and make it
refuse to start instead of being ignored. Upstream keys missing here have no counterpart in this
implementation (docs/install.md lists them).
*/}}
{{- define "argocd-agent-principal.paramsEnv" -}}
principal.listen.host=ARGOCD_PRINCIPAL_LISTEN_HOST
principal.listen.port=ARGOCD_PRINCIPAL_LISTEN_PORT
principal.log.level=ARGOCD_PRINCIPAL_LOG_LEVEL
principal.log.format=ARGOCD_PRINCIPAL_LOG_FORMAT
principal.log.full-detail=ARGOCD_PRINCIPAL_FULL_DETAIL
principal.metrics.port=ARGOCD_PRINCIPAL_METRICS_PORT
principal.metrics.address=ARGOCD_PRINCIPAL_METRICS_ADDRESS
principal.healthz.port=ARGOCD_PRINCIPAL_HEALTH_CHECK_PORT
principal.healthz.address=ARGOCD_PRINCIPAL_HEALTH_CHECK_ADDRESS
principal.namespace=ARGOCD_PRINCIPAL_NAMESPACE
principal.allowed-namespaces=ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES
principal.namespace-create.enable=ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE
principal.namespace-create.pattern=ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN
principal.namespace-create.labels=ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS
principal.tls.secret-name=ARGOCD_PRINCIPAL_TLS_SECRET_NAME
principal.tls.server.cert-path=ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH
principal.tls.server.key-path=ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH
principal.tls.server.allow-generate=ARGOCD_PRINCIPAL_TLS_SERVER_ALLOW_GENERATE
principal.tls.server.root-ca-secret-name=ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME
principal.tls.server.root-ca-path=ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_PATH
principal.tls.client-cert.require=ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_REQUIRE
principal.tls.client-cert.match-subject=ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_MATCH_SUBJECT
principal.tls.insecure-plaintext=ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT
principal.tls.min-version=ARGOCD_PRINCIPAL_TLS_MIN_VERSION
principal.tls.max-version=ARGOCD_PRINCIPAL_TLS_MAX_VERSION
principal.tls.ciphersuites=ARGOCD_PRINCIPAL_TLS_CIPHERSUITES
principal.jwt.allow-generate=ARGOCD_PRINCIPAL_JWT_ALLOW_GENERATE
principal.jwt.secret-name=ARGOCD_PRINCIPAL_JWT_SECRET_NAME
principal.jwt.key-path=ARGOCD_PRINCIPAL_JWT_KEY_PATH
principal.auth=ARGOCD_PRINCIPAL_AUTH
principal.websocket.enable=ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET
principal.resource-proxy.enable=ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY
principal.resource-proxy.secret-name=ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME
principal.resource-proxy.tls.cert-path=ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH
principal.resource-proxy.tls.key-path=ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY_PATH
principal.resource-proxy.ca.secret-name=ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME
principal.resource-proxy.ca.path=ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA_PATH
principal.resource-proxy.address=ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS
principal.resource-proxy.listen-address=ARGOCD_PRINCIPAL_RESOURCE_PROXY_LISTEN_ADDRESS
principal.resource-proxy.timeout=ARGOCD_PRINCIPAL_RESOURCE_PROXY_TIMEOUT
principal.resource-proxy.max-in-flight=ARGOCD_PRINCIPAL_RESOURCE_PROXY_MAX_IN_FLIGHT
principal.keep-alive.min-interval=ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL
principal.pprof.port=ARGOCD_PRINCIPAL_PPROF_PORT
principal.redis.server.address=ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS
principal.redis.tls.enabled=ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED
principal.destination-based-mapping=ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING
principal.label-selector=ARGOCD_PRINCIPAL_LABEL_SELECTOR
principal.event-processors=ARGOCD_PRINCIPAL_EVENT_PROCESSORS
principal.self-registration.enabled=ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION
principal.self-registration.client-cert-secret=ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET
principal.agent-version-check=ARGOCD_PRINCIPAL_AGENT_VERSION_CHECK
principal.otlp.address=ARGOCD_PRINCIPAL_OTLP_ADDRESS
principal.spire.socket-path=ARGOCD_PRINCIPAL_SPIRE_AGENT_SOCKET
principal.spire.auth-method=ARGOCD_PRINCIPAL_SPIRE_AUTH_METHOD
{{- end -}}

{{/*
Upstream values of features this implementation does not have yet: each must keep its inert
value, else rendering fails naming the key (instead of a principal that refuses to start).
*/}}
{{- define "argocd-agent-principal.checkUnsupported" -}}
{{- $p := .Values.principal -}}
{{- $bad := list -}}
{{- if not (has (toString $p.keepAlive.minInterval) (list "" "0" "0s")) }}{{ $bad = append $bad "principal.keepAlive.minInterval" }}{{ end -}}
{{- if not (has (toString $p.pprof.port) (list "" "0")) }}{{ $bad = append $bad "principal.pprof.port" }}{{ end -}}
{{- if hasPrefix "userpass:" (toString $p.auth) }}{{ $bad = append $bad "principal.auth userpass:" }}{{ end -}}
{{- if $bad -}}
{{- fail (printf "argocd-agent-rs does not support these yet: %s. Reset them to their defaults (docs/install.md, \"Migrating from upstream's chart\")." (join ", " $bad)) -}}
{{- end -}}
{{- include "argocd-agent-principal.checkSelfRegistration" . -}}
{{- if and $p.spire.enabled (not (has (toString $p.spire.authMethod) (list "jwt" "mtls"))) -}}
{{- fail (printf "principal.spire.authMethod %q: with principal.spire.enabled it must be \"jwt\" or \"mtls\" (upstream's --spire-auth-method)" (toString $p.spire.authMethod)) -}}
{{- end -}}
{{- end -}}

{{/*
principal.selfRegistration.enabled: what the principal would refuse at start, refused here.
The cluster secrets it writes point Argo CD at the resource proxy, and carry the client
certificate of clientCertSecret.
*/}}
{{- define "argocd-agent-principal.checkSelfRegistration" -}}
{{- $p := .Values.principal -}}
{{- if $p.selfRegistration.enabled -}}
{{- if not $p.resourceProxy.enabled -}}
{{- fail "principal.selfRegistration.enabled needs principal.resourceProxy.enabled=true: self-registered cluster secrets point Argo CD at the resource proxy (docs/install.md, \"Self-registration\")" -}}
{{- end -}}
{{- if not $p.selfRegistration.clientCertSecret -}}
{{- fail "principal.selfRegistration.enabled needs principal.selfRegistration.clientCertSecret: the Secret (tls.crt, tls.key, ca.crt) with the client certificate Argo CD presents to the resource proxy" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The resource proxy's container port: the port of principal.resourceProxy.listenAddress. */}}
{{- define "argocd-agent-principal.resourceProxyPort" -}}
{{- $listen := toString .Values.principal.resourceProxy.listenAddress -}}
{{- $port := regexFind "[0-9]+$" $listen -}}
{{- if not $port -}}
{{- fail (printf "principal.resourceProxy.listenAddress %q: expected HOST:PORT" $listen) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{- define "argocd-agent-principal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
