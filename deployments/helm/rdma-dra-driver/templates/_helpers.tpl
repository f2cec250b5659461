{{- define "rdma.name" -}}rdma-dra-driver{{- end -}}
{{- define "rdma.labels" -}}
app.kubernetes.io/name: {{ include "rdma.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "rdma.image" -}}{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}{{- end -}}
{{- define "rdma.serviceAccount" -}}{{ .Release.Name }}-node{{- end -}}
