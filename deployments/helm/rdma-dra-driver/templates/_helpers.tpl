{{- define "rdma.name" -}}rdma-dra-driver{{- end -}}
{{- define "rdma.labels" -}}
app.kubernetes.io/name: {{ include "rdma.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "rdma.image" -}}{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}{{- end -}}
{{- define "rdma.serviceAccount" -}}{{ .Release.Name }}-node{{- end -}}
{{- /* The label that marks a DeviceClass granting admin-only config
  (managementDevices, moveNetdev), and the namespace label that allows
  claims naming such a class (policy-admin-grants.yaml). */}}
{{- define "rdma.adminGrantLabel" -}}{{ .Values.driverName }}/admin-grant{{- end -}}
{{- define "rdma.adminGrantNamespaceLabel" -}}{{ .Values.driverName }}/admin-grants-allowed{{- end -}}
{{- /* Claim status (status.devices) is written only where the API server
  authorizes it per node and per driver (DRAResourceClaimGranularStatusAuthorization,
  on by default from Kubernetes 1.36): below that, patch on
  resourceclaims/status is cluster-wide, also over reservedFor. */}}
{{- define "rdma.claimStatus" -}}
{{- if and .Values.claimStatus (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) }}true{{ else }}false{{ end -}}
{{- end -}}
