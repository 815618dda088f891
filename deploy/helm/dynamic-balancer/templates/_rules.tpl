{{/* Rules on the watched kinds: cluster-wide, or in the scoped namespace. */}}
{{- define "db.namespacedRules" -}}
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
# Secrets: the watches ask only for type=kubernetes.io/tls and type=Opaque (basic-auth users).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses/status"]
  verbs: ["patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.gatewayAPI.enabled }}
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways", "listenersets", "httproutes", "grpcroutes", "tcproutes", "tlsroutes", "udproutes", "referencegrants", "backendtlspolicies"]
  verbs: ["list", "watch"]
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["gateways/status", "listenersets/status", "httproutes/status", "grpcroutes/status", "tcproutes/status", "tlsroutes/status", "udproutes/status", "backendtlspolicies/status"]
  verbs: ["patch"]
# Client CA bundles a Gateway's spec.tls.frontend names (only their
# ca.crt is kept).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch"]
{{- if .Values.gatewayAPI.service.enabled }}
# A Service per Gateway, beside it, and its EndpointSlice naming the nginx
# Pods (--gateway-service-selector), kept by the leader. Only objects
# carrying this controller's labels are changed; another of the same name
# is left alone.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- end }}
{{- end -}}
