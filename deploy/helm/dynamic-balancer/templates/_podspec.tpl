{{/* The controller's pod template, shared by the Deployment and the DaemonSet. */}}
{{- define "db.controller.podTemplate" -}}
{{- $c := .Values.controller -}}
metadata:
  labels:
    {{- include "db.labels" . | nindent 4 }}
    app.kubernetes.io/component: controller
    {{- with $c.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- /* No config checksum: a changed ConfigMap is applied live by the
         running controller, so it must not roll the pods. */}}
  {{- with $c.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "db.serviceAccountName" . }}
  automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
  terminationGracePeriodSeconds: {{ $c.terminationGracePeriodSeconds }}
  dnsPolicy: {{ $c.dnsPolicy }}
  {{- if $c.hostNetwork }}
  hostNetwork: true
  {{- end }}
  {{- with $c.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $c.podSecurityContext | nindent 4 }}
    {{- if and $c.unprivilegedPortStart (not $c.hostNetwork) }}
    sysctls:
      - name: net.ipv4.ip_unprivileged_port_start
        value: "0"
    {{- end }}
  containers:
    - name: controller
      image: {{ include "db.image" . }}
      imagePullPolicy: {{ $c.image.pullPolicy }}
      args:
        - --nginx-binary=/usr/local/nginx/sbin/nginx
        - --nginx-module=/usr/local/nginx/modules/ngx_http_dynamic_balancer_module.so
        - --conf-dir=/etc/ingress-controller
        - --configmap={{ include "db.namespace" . }}/{{ include "db.controller.fullname" . }}
        - --ingress-class={{ $c.ingressClass }}
        - --controller-class={{ $c.ingressClassResource.controllerValue }}
        {{- if $c.watchIngressWithoutClass }}
        - --watch-ingress-without-class
        {{- end }}
        {{- if $c.allowSnippetAnnotations }}
        - --allow-snippet-annotations
        {{- range $c.snippetAllowedPaths }}
        - --snippet-allowed-path={{ . }}
        {{- end }}
        {{- end }}
        {{- if $c.scope.enabled }}
        - --watch-namespace={{ include "db.watchNamespace" . }}
        {{- end }}
        - --election-id={{ include "db.controller.electionID" . }}
        - --election-ttl={{ $c.electionTTL }}
        {{- if $c.publishService.enabled }}
        - --publish-service={{ include "db.controller.publishServicePath" . }}
        {{- end }}
        - --http-port={{ $c.containerPort.http }}
        - --https-port={{ $c.containerPort.https }}
        - --metrics-address=0.0.0.0:{{ $c.metrics.port }}
        - --shutdown-grace-period={{ $c.shutdownGracePeriod }}
        - --log-format=json
        # nginx's logs go to the container's log, as ingress-nginx's do.
        - --nginx-error-log=stderr
        - --nginx-access-log=/dev/stdout
        {{- if $c.admissionWebhooks.enabled }}
        - --validating-webhook=:{{ $c.admissionWebhooks.port }}
        - --validating-webhook-certificate=/usr/local/certificates/cert
        - --validating-webhook-key=/usr/local/certificates/key
        - --validating-webhook-timeout={{ $c.admissionWebhooks.validationTimeout }}
        {{- end }}
        {{- if .Values.tcp }}
        - --tcp-services-configmap={{ include "db.namespace" . }}/{{ include "db.controller.fullname" . }}-tcp
        {{- end }}
        {{- if .Values.udp }}
        - --udp-services-configmap={{ include "db.namespace" . }}/{{ include "db.controller.fullname" . }}-udp
        {{- end }}
        {{- if .Values.gatewayAPI.enabled }}
        - --enable-gateway-api
        - --gateway-base-port={{ .Values.gatewayAPI.basePort }}
        {{- if .Values.gatewayAPI.service.enabled }}
        - --gateway-service-selector=app.kubernetes.io/name={{ include "db.name" . }},app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=controller
        - --gateway-service-type={{ .Values.gatewayAPI.service.type }}
        {{- end }}
        {{- end }}
        {{- range $key, $value := $c.extraArgs }}
        {{- if eq (toString $value) "" }}
        - --{{ $key }}
        {{- else }}
        - --{{ $key }}={{ $value }}
        {{- end }}
        {{- end }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- with $c.extraEnvs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      securityContext:
        {{- toYaml $c.containerSecurityContext | nindent 8 }}
      ports:
        - name: http
          containerPort: {{ $c.containerPort.http }}
          protocol: TCP
          {{- if $c.hostPort.enabled }}
          hostPort: {{ $c.hostPort.ports.http }}
          {{- end }}
        - name: https
          containerPort: {{ $c.containerPort.https }}
          protocol: TCP
          {{- if $c.hostPort.enabled }}
          hostPort: {{ $c.hostPort.ports.https }}
          {{- end }}
        {{- if eq (toString (index $c.config "use-http3" | default "false")) "true" }}
        - name: https-quic
          containerPort: {{ $c.containerPort.https }}
          protocol: UDP
          {{- if $c.hostPort.enabled }}
          hostPort: {{ $c.hostPort.ports.https }}
          {{- end }}
        {{- end }}
        - name: metrics
          containerPort: {{ $c.metrics.port }}
          protocol: TCP
        {{- if $c.admissionWebhooks.enabled }}
        - name: webhook
          containerPort: {{ $c.admissionWebhooks.port }}
          protocol: TCP
        {{- end }}
        {{- range $port, $target := .Values.tcp }}
        - name: {{ printf "%s%s-tcp" $.Values.portNamePrefix (toString $port) | trunc 15 }}
          containerPort: {{ $port }}
          protocol: TCP
        {{- end }}
        {{- range $port, $target := .Values.udp }}
        - name: {{ printf "%s%s-udp" $.Values.portNamePrefix (toString $port) | trunc 15 }}
          containerPort: {{ $port }}
          protocol: UDP
        {{- end }}
      livenessProbe:
        {{- toYaml $c.livenessProbe | nindent 8 }}
      readinessProbe:
        {{- toYaml $c.readinessProbe | nindent 8 }}
      resources:
        {{- toYaml $c.resources | nindent 8 }}
      volumeMounts:
        # The root filesystem is read-only: nginx.conf, certificates, the
        # API token, logs and nginx's temp files live here.
        - name: conf
          mountPath: /etc/ingress-controller
        - name: tmp
          mountPath: /tmp
        {{- if $c.admissionWebhooks.enabled }}
        - name: webhook-cert
          mountPath: /usr/local/certificates/
          readOnly: true
        {{- end }}
        {{- with $c.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: conf
      emptyDir: {}
    - name: tmp
      emptyDir: {}
    {{- if $c.admissionWebhooks.enabled }}
    - name: webhook-cert
      secret:
        secretName: {{ include "db.admission.fullname" . }}
    {{- end }}
    {{- with $c.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $c.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $c.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
