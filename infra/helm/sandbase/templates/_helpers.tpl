{{/* Names and labels. */}}
{{- define "sandbase.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandbase.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sandbase.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sandbase.image" -}}
{{- $image := index .root.Values.image .component -}}
{{- printf "%s%s:%s" .root.Values.image.registry $image.repository (default .root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{- define "sandbase.secretName" -}}
{{- default (printf "%s-secrets" (include "sandbase.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{/* The Secret sandbox nodes may read: the node token alone. A worker pod references only
it, so the Node authorizer never lets a sandbox node read the platform Secret. */}}
{{- define "sandbase.nodeSecretName" -}}
{{- default (printf "%s-node" (include "sandbase.fullname" .)) .Values.secrets.existingNodeSecret -}}
{{- end -}}

{{- define "sandbase.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sandbase.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The internal Service's DNS name: workers call the gateway there. */}}
{{/* The internal channel's Secrets: the gateways' and the workers'. */}}
{{- define "sandbase.gatewayTLSSecret" -}}
{{- .Values.internalTLS.secretName | default (printf "%s-internal-tls" (include "sandbase.fullname" .)) -}}
{{- end -}}
{{- define "sandbase.workerTLSSecret" -}}
{{- .Values.internalTLS.workerSecretName | default (printf "%s-internal-tls-worker" (include "sandbase.fullname" .)) -}}
{{- end -}}

{{- define "sandbase.internalHost" -}}
{{- printf "%s-internal.%s.svc" (include "sandbase.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Cross-field rules a schema cannot state, each failing with the keys at fault. */}}
{{- define "sandbase.validate" -}}
{{- $gateway := .Values.gateway -}}
{{- if and (or (gt (int $gateway.replicas) 1) $gateway.autoscaling.enabled) (not $gateway.artifacts.s3.bucket) -}}
{{- fail "gateway.artifacts.s3.bucket is required when gateway.replicas > 1 or gateway.autoscaling.enabled: artifacts, recordings and snapshots must be shared by every gateway" -}}
{{- end -}}
{{- if and $gateway.autoscaling.enabled (gt (int $gateway.autoscaling.minReplicas) (int $gateway.autoscaling.maxReplicas)) -}}
{{- fail "gateway.autoscaling.minReplicas must not exceed gateway.autoscaling.maxReplicas" -}}
{{- end -}}
{{- if not .Values.secrets.existingSecret -}}
{{- range $key := list "databaseUrl" "redisUrl" "sessionSecret" "nodeToken" -}}
{{- if not (index $.Values.secrets $key) -}}
{{- fail (printf "secrets.%s is required (or name a Secret you manage in secrets.existingSecret)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.vault.enabled (not .Values.secrets.vaultKeys) -}}
{{- fail "secrets.vaultKeys is required when vault.enabled (`sandbase vault new-key` prints one), or set vault.enabled=false" -}}
{{- end -}}
{{- if lt (len .Values.secrets.sessionSecret) 32 -}}
{{- fail "secrets.sessionSecret must be at least 32 characters" -}}
{{- end -}}
{{- if lt (len .Values.secrets.nodeToken) 32 -}}
{{- fail "secrets.nodeToken must be at least 32 characters" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.secrets.existingSecret .Values.worker.enabled (not .Values.secrets.existingNodeSecret) -}}
{{- fail "secrets.existingNodeSecret is required with secrets.existingSecret when worker.enabled: a Secret holding only SANDBASE_WORKERS__NODE_TOKEN, so sandbox nodes never reference the platform Secret" -}}
{{- end -}}
{{- $tls := .Values.internalTLS -}}
{{- if and $tls.enabled (ne (empty $tls.secretName) (empty $tls.workerSecretName)) .Values.worker.enabled -}}
{{- fail "internalTLS.secretName and internalTLS.workerSecretName go together (leave both empty for the chart's own channel): workers hold a certificate of their own naming internalTLS.workerName, never the gateway's key" -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled .Values.worker.enabled (empty .Values.networkPolicy.workerNodeCIDRs) -}}
{{- fail "networkPolicy.workerNodeCIDRs is required when networkPolicy.enabled and worker.enabled: workers run in the nodes' network and reach the internal listener from the nodes' addresses" -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ingress.host) -}}
{{- fail "ingress.host is required when ingress.enabled" -}}
{{- end -}}
{{- if and .Values.ingress.enabled (empty .Values.trustedProxies) -}}
{{- fail "trustedProxies is required when ingress.enabled: behind the ingress every client has the controller's address, so name the controller's pod network (e.g. 10.0.0.0/8) for per-address limits to see each client" -}}
{{- end -}}
{{- if and (eq $gateway.service.type "LoadBalancer") (ne $gateway.service.externalTrafficPolicy "Local") (empty .Values.trustedProxies) -}}
{{- fail "trustedProxies is required with a LoadBalancer Service (or set gateway.service.externalTrafficPolicy=Local, which keeps clients' addresses): otherwise every client shares the balancer's address" -}}
{{- end -}}
{{- end -}}

{{/* The gateway's sandbase.toml: the chart's settings under the operator's `config`. */}}
{{- define "sandbase.config" -}}
{{- $server := dict "listen" "0.0.0.0:8080" "internal_listen" "0.0.0.0:8081" -}}
{{- if .Values.publicUrl -}}
{{- $_ := set $server "public_url" .Values.publicUrl -}}
{{- end -}}
{{- if .Values.gateway.dashboard -}}
{{- $_ := set $server "web_dir" "/usr/share/sandbase/web" -}}
{{- end -}}
{{- with .Values.trustedProxies -}}
{{- $_ := set $server "trusted_proxies" . -}}
{{- end -}}
{{- $runs := dict "artifacts_dir" "/var/lib/sandbase/artifacts" -}}
{{- $s3 := .Values.gateway.artifacts.s3 -}}
{{- if $s3.bucket -}}
{{- $bucket := dict "bucket" $s3.bucket "region" $s3.region -}}
{{- if $s3.endpoint -}}{{- $_ := set $bucket "endpoint" $s3.endpoint -}}{{- end -}}
{{- if $s3.prefix -}}{{- $_ := set $bucket "prefix" $s3.prefix -}}{{- end -}}
{{- $_ := set $runs "s3" $bucket -}}
{{- end -}}
{{- $chart := dict "server" $server "runs" $runs "database" (dict "migrate_on_start" (not .Values.migrations.enabled)) -}}
{{- if .Values.vault.enabled -}}
{{- $_ := set $chart "vault" (dict "key_file" "/etc/sandbase/secrets/vault.keys") -}}
{{- end -}}
{{- if .Values.internalTLS.enabled -}}
{{- $_ := set $chart "internal_tls" (dict "ca_file" "/etc/sandbase/tls/ca.crt" "cert_file" "/etc/sandbase/tls/tls.crt" "key_file" "/etc/sandbase/tls/tls.key" "peer_name" .Values.internalTLS.workerName) -}}
{{- end -}}
{{- toToml (mustMergeOverwrite $chart (deepCopy .Values.config)) -}}
{{- end -}}

{{/* The gateway's secrets as environment variables (never in its ConfigMap). */}}
{{- define "sandbase.secretEnv" -}}
{{- $secret := include "sandbase.secretName" . -}}
{{- range $pair := list (list "DATABASE_URL" "DATABASE_URL" false) (list "REDIS_URL" "REDIS_URL" false) (list "SANDBASE_AUTH__JWT_SECRET" "SANDBASE_AUTH__JWT_SECRET" false) (list "SANDBASE_WORKERS__NODE_TOKEN" "SANDBASE_WORKERS__NODE_TOKEN" false) (list "SANDBASE_AUTH__OPERATOR_TOKEN" "SANDBASE_AUTH__OPERATOR_TOKEN" true) (list "SANDBASE_STRIPE__SECRET_KEY" "SANDBASE_STRIPE__SECRET_KEY" true) (list "SANDBASE_STRIPE__WEBHOOK_SECRET" "SANDBASE_STRIPE__WEBHOOK_SECRET" true) }}
- name: {{ index $pair 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ index $pair 1 }}
      {{- if index $pair 2 }}
      optional: true
      {{- end }}
{{- end }}
{{- end -}}

{{/* A container's security context that holds nothing: non-root, read-only, no capabilities. */}}
{{- define "sandbase.restricted" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
