{{/*
Labels every object of the release carries, beside its own app.kubernetes.io/name and
component. Pod templates keep only their selector's labels: a chart upgrade then changes
no pod template, so it restarts nothing.
*/}}
{{- define "gas.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: gas
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "gas.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
kube-scheduler's image: its tag follows the cluster's version, vendor suffix dropped
(v1.33.2-eks-0a1b2c3 and v1.33.2+k3s1 give v1.33.2), unless scheduler.image.tag is set.
*/}}
{{- define "gas.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if or (not $tag) (not (include "gas.knownVersion" .)) -}}
{{- fail (printf "the cluster reports no version kube-scheduler's image could be named by (%q): set scheduler.image.tag to the cluster's (e.g. v1.33.2)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if not (hasPrefix "v" $tag) -}}{{- $tag = printf "v%s" $tag -}}{{- end -}}
{{- end -}}
{{ .Values.scheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{/* Whether the cluster says its version: a build without a version stamp says v0.0.0. */}}
{{- define "gas.knownVersion" -}}
{{- if not (hasPrefix "v0.0.0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}

{{- define "gas.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Secret names, which depend on where the certificates come from. */}}
{{- define "gas.gasSecret" -}}
{{- if eq .Values.certificates.source "existing" -}}{{ .Values.certificates.existing.gasSecret }}{{- else -}}gas-tls{{- end -}}
{{- end -}}
{{- define "gas.webhookSecret" -}}
{{- if eq .Values.certificates.source "existing" -}}{{ .Values.certificates.existing.webhookSecret }}{{- else -}}gas-webhook-tls{{- end -}}
{{- end -}}
{{- define "gas.schedulerClientSecret" -}}
{{- if eq .Values.certificates.source "existing" -}}{{ .Values.certificates.existing.schedulerClientSecret }}{{- else -}}gas-scheduler-client{{- end -}}
{{- end -}}

{{/* Which webhook runs, if any: mutating (any-cluster), validating (kubeadm), claims (DRA). */}}
{{- define "gas.webhookKind" -}}
{{- if eq .Values.scheduling "any-cluster" -}}mutating
{{- else if and (eq .Values.scheduling "kubeadm") .Values.kubeadm.validatingWebhook -}}validating
{{- else if and .Values.dra.enabled .Values.dra.claimsWebhook -}}claims
{{- end -}}
{{- end -}}

{{/* Whether gas serve runs (and so the ClusterRole gas and its Secret). */}}
{{- define "gas.extender" -}}
{{- if has .Values.scheduling (list "any-cluster" "kubeadm") -}}true{{- end -}}
{{- end -}}

{{/*
Combinations that cannot work, refused before anything is applied.
*/}}
{{- define "gas.validate" -}}
{{- if and (eq .Values.scheduling "none") (eq .Values.nodeSide "none") (not .Values.dra.enabled) -}}
{{- fail "scheduling: none, nodeSide: none and dra.enabled false install nothing: pick a way (docs/helm.md)" -}}
{{- end -}}
{{- if and .Values.dra.claimsWebhook (not .Values.dra.enabled) -}}
{{- fail "dra.claimsWebhook needs dra.enabled: the claims it makes are served by gas dra" -}}
{{- end -}}
{{- if and .Values.dra.claimsWebhook (ne .Values.scheduling "none") -}}
{{- fail "dra.claimsWebhook needs scheduling: none: a pod it converts asks for no gpu.intel.com/ resource, and the extender's webhook answers for the same Service" -}}
{{- end -}}
{{- if and .Values.kubeadm.validatingWebhook (ne .Values.scheduling "kubeadm") -}}
{{- fail "kubeadm.validatingWebhook is for scheduling: kubeadm (the any-cluster way runs its webhook in the gas-scheduler pods)" -}}
{{- end -}}
{{- $known := include "gas.knownVersion" . -}}
{{- if and $known (not (semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "gas needs Kubernetes 1.28 or later (the webhook's matchConditions, the scheduler configuration's v1 API); this cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and $known .Values.dra.enabled (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "dra.enabled needs Kubernetes 1.34 or later (resource.k8s.io/v1); this cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/*
The generated certificates, made once per rendering and shared by every template that
needs them: read back from the Secrets of an installed release (so an upgrade keeps the
CA behind the webhook configuration's caBundle), else made anew. Returns a dict of PEMs:
ca.crt, tls.crt, tls.key, client.crt, client.key, webhook.crt, webhook.key.
*/}}
{{- define "gas.generatedCerts" -}}
{{- if not (hasKey .Values "__gasCerts") -}}
{{- $ns := .Release.Namespace -}}
{{- $certs := dict -}}
{{- $gas := lookup "v1" "Secret" $ns "gas-tls" -}}
{{- $client := lookup "v1" "Secret" $ns "gas-scheduler-client" -}}
{{- $webhook := lookup "v1" "Secret" $ns "gas-webhook-tls" -}}
{{- /* The CA of an installed release: every Secret the chart makes holds its ca.crt. */ -}}
{{- $ca := "" -}}
{{- range $secret := list $gas $client $webhook -}}
{{- if and (not $ca) $secret $secret.data (index $secret.data "ca.crt") -}}
{{- $ca = index $secret.data "ca.crt" | b64dec -}}
{{- end -}}
{{- end -}}
{{- if $ca -}}
{{- /* An installed release: keep what is there. */ -}}
{{- $_ := set $certs "ca.crt" $ca -}}
{{- if and $gas $gas.data -}}
{{- range $key := list "tls.crt" "tls.key" "client.crt" "client.key" -}}
{{- if hasKey $gas.data $key -}}{{- $_ := set $certs $key (index $gas.data $key | b64dec) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $client $client.data -}}
{{- range $key := list "client.crt" "client.key" -}}
{{- if hasKey $client.data $key -}}{{- $_ := set $certs $key (index $client.data $key | b64dec) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $webhook $webhook.data -}}
{{- $_ := set $certs "webhook.crt" (index $webhook.data "tls.crt" | b64dec) -}}
{{- $_ := set $certs "webhook.key" (index $webhook.data "tls.key" | b64dec) -}}
{{- end -}}
{{- end -}}
{{- /* What this rendering's way needs; a certificate another way would need is not asked for. */ -}}
{{- $needed := list -}}
{{- if include "gas.extender" . -}}{{- $needed = concat $needed (list "tls.crt" "client.crt") -}}{{- end -}}
{{- if include "gas.webhookKind" . -}}{{- $needed = append $needed "webhook.crt" -}}{{- end -}}
{{- $missing := false -}}
{{- range $key := $needed -}}
{{- if not (hasKey $certs $key) -}}{{- $missing = true -}}{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- /*
No CA key is kept in the cluster: a certificate missing from an installed release (a way
changed) cannot be signed by its CA, so every certificate is made anew with a new CA, and
the webhook configuration rendered with it.
*/ -}}
{{- $caKey := genPrivateKey "ecdsa" -}}
{{- $newCA := genCAWithKey "gas CA" (int .Values.certificates.caDays) $caKey -}}
{{- $days := int .Values.certificates.days -}}
{{- $server := genSignedCertWithKey (printf "gas-extender.%s.svc" $ns) (list "127.0.0.1") (list (printf "gas-extender.%s.svc" $ns) (printf "gas-extender.%s.svc.cluster.local" $ns) "localhost") $days $newCA (genPrivateKey "ecdsa") -}}
{{- $clientCert := genSignedCertWithKey "kube-scheduler" nil nil $days $newCA (genPrivateKey "ecdsa") -}}
{{- $webhookCert := genSignedCertWithKey (printf "gas-webhook.%s.svc" $ns) nil (list (printf "gas-webhook.%s.svc" $ns) (printf "gas-webhook.%s.svc.cluster.local" $ns)) $days $newCA (genPrivateKey "ecdsa") -}}
{{- $certs = dict "ca.crt" $newCA.Cert "tls.crt" $server.Cert "tls.key" $server.Key "client.crt" $clientCert.Cert "client.key" $clientCert.Key "webhook.crt" $webhookCert.Cert "webhook.key" $webhookCert.Key -}}
{{- end -}}
{{- $_ := set .Values "__gasCerts" $certs -}}
{{- end -}}
{{- toJson (index .Values "__gasCerts") -}}
{{- end -}}

{{/* The caBundle of the webhook configuration (base64 PEM), or nothing under cert-manager. */}}
{{- define "gas.caBundle" -}}
{{- $source := .Values.certificates.source -}}
{{- if eq $source "generate" -}}
{{- index (include "gas.generatedCerts" . | fromJson) "ca.crt" | b64enc -}}
{{- else if eq $source "existing" -}}
{{- if .Values.certificates.existing.caBundle -}}
{{- .Values.certificates.existing.caBundle -}}
{{- else -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace .Values.certificates.existing.gasSecret -}}
{{- if and $secret $secret.data (index $secret.data "ca.crt") -}}
{{- index $secret.data "ca.crt" -}}
{{- else -}}
{{- fail (printf "certificates.source existing: set certificates.existing.caBundle (base64 of the CA that signed the webhook's certificate), or create Secret %s/%s with ca.crt first" .Release.Namespace .Values.certificates.existing.gasSecret) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* gas serve's flags from values, beyond each way's own: none at the defaults. */}}
{{- define "gas.serveArgs" -}}
{{- if ne .Values.policy "first-fit" }}
- --policy={{ .Values.policy }}
{{- end }}
{{- if .Values.allowlist }}
- --enableAllowlist
{{- end }}
{{- if .Values.denylist }}
- --enableDenylist
{{- end }}
{{- if not (kindIs "invalid" .Values.logLevel) }}
- --v={{ .Values.logLevel }}
{{- end }}
{{- end -}}

{{/* The scheduler configuration of the any-cluster way (its ConfigMap's config.yaml). */}}
{{- define "gas.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: ""
  qps: 100
  burst: 200
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: gas-scheduler
profiles:
  - schedulerName: {{ .Values.scheduler.schedulerName }}
extenders:
  - urlPrefix: "https://127.0.0.1:9001/scheduler"
    filterVerb: "filter"
    {{- if .Values.scheduler.prioritize }}
    prioritizeVerb: "prioritize"
    weight: 1
    {{- end }}
    preemptVerb: "preempt"
    bindVerb: "bind"
    enableHTTPS: true
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: 10s
    managedResources:
      - name: "gpu.intel.com/i915"
        ignoredByScheduler: false
      - name: "gpu.intel.com/xe"
        ignoredByScheduler: false
    tlsConfig:
      insecure: false
      caFile: "/etc/kubernetes/gas/ca.crt"
      certFile: "/etc/kubernetes/gas/client.crt"
      keyFile: "/etc/kubernetes/gas/client.key"
{{- end -}}

{{/* The webhook configuration's one webhook (gas.tools.webhook_config builds the same). */}}
{{- define "gas.webhook" -}}
- name: gpu-pods.gas.intel.com
  admissionReviewVersions: [v1]
  clientConfig:
    service:
      namespace: {{ .Release.Namespace }}
      name: gas-webhook
      path: /admission/pods
      port: 443
    {{- with include "gas.caBundle" . }}
    caBundle: {{ . }}
    {{- end }}
  rules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [pods]
      scope: Namespaced
  failurePolicy: {{ .Values.webhook.failurePolicy }}
  matchPolicy: Equivalent
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values:
          {{- toYaml (concat (list .Release.Namespace "kube-system") .Values.webhook.excludeNamespaces | uniq) | nindent 10 }}
  matchConditions:
    - name: asks-for-intel-gpu
      expression: >-
        object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('gpu.intel.com/')))
        || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('gpu.intel.com/')))))
        || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('gpu.intel.com/')))
        || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('gpu.intel.com/'))))))
  sideEffects: {{ if eq (include "gas.webhookKind" .) "claims" }}NoneOnDryRun{{ else }}None{{ end }}
  timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
  {{- if ne (include "gas.webhookKind" .) "validating" }}
  reinvocationPolicy: Never
  {{- end }}
{{- end -}}

{{/* cert-manager's CA injection, on the webhook configuration. */}}
{{- define "gas.caInjection" -}}
{{- if eq .Values.certificates.source "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/gas-webhook
{{- end }}
{{- end -}}

{{/*
gas webhook's container, in the gas-scheduler pods and in the webhook's own Deployment:
"mode" is its one flag of the way (--schedulerName=..., --validateOnly, --draClaims).
*/}}
{{- define "gas.webhookContainer" -}}
{{- $ := .root -}}
- name: webhook
  image: {{ include "gas.image" $ }}
  imagePullPolicy: {{ $.Values.image.pullPolicy }}
  args:
    - webhook
    - --port=9443
    - --cert=/etc/gas/webhook/tls.crt
    - --key=/etc/gas/webhook/tls.key
    - {{ .mode }}
    {{- if not (kindIs "invalid" $.Values.logLevel) }}
    - --v={{ $.Values.logLevel }}
    {{- end }}
  ports:
    - {name: webhook, containerPort: 9443}
  # HTTPS without a client certificate: the webhook asks for none.
  readinessProbe:
    httpGet: {path: /readyz, port: webhook, scheme: HTTPS}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /healthz, port: webhook, scheme: HTTPS}
    periodSeconds: 10
    failureThreshold: 6
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: ["ALL"]}
  volumeMounts:
    - {name: webhook-tls, mountPath: /etc/gas/webhook, readOnly: true}
    - {name: tmp, mountPath: /tmp}
{{- end -}}
