{{/* Names, labels and the image, as ingress-nginx's chart derives them. */}}

{{- define "db.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "db.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "db.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "db.controller.fullname" -}}
{{- printf "%s-%s" (include "db.fullname" .) .Values.controller.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "db.controller.electionID" -}}
{{- default (printf "%s-leader" (include "db.fullname" .)) .Values.controller.electionID -}}
{{- end -}}

{{- define "db.controller.publishServicePath" -}}
{{- default (printf "%s/%s" (include "db.namespace" .) (include "db.controller.fullname" .)) .Values.controller.publishService.pathOverride -}}
{{- end -}}

{{- define "db.watchNamespace" -}}
{{- default (include "db.namespace" .) .Values.controller.scope.namespace -}}
{{- end -}}

{{- define "db.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "db.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "db.admission.fullname" -}}
{{- printf "%s-admission" (include "db.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "db.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "db.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: {{ include "db.name" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "db.selectorLabels" -}}
app.kubernetes.io/name: {{ include "db.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "db.image" -}}
{{- $img := .Values.controller.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- $repo := ternary (printf "%s/%s" $img.registry $img.image) $img.image (ne $img.registry "") -}}
{{- if $img.digest -}}
{{- printf "%s:%s@%s" $repo $tag $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}
