package main

import (
	"strings"
	"testing"
)

const chart = "../../deployments/helm/rdma-dra-driver"

func TestRenderMatrix(t *testing.T) {
	tests := []struct {
		values  string
		want    []string
		notWant []string
		wantErr string
	}{
		{values: `{}`, want: []string{"kind: DaemonSet", "name: hca.rdma.dra.dev", "--sharing=exclusive", "--legacy=off", "validationActions: [Warn]"},
			notWant: []string{"extendedResourceName", "device-plugins"}},
		{values: `{"sharing":"shared","legacy":{"route":"dra"}}`, want: []string{"extendedResourceName: rdma/hca", "name: legacy.rdma.dra.dev"}},
		{values: `{"sharing":"shared","legacy":{"route":"device-plugin"}}`, want: []string{"--legacy=device-plugin", "/var/lib/kubelet/device-plugins"}, notWant: []string{"extendedResourceName"}},
		{values: `{"policies":{"podRDMA":{"action":"Deny","claimTemplates":["ib-400g"]}}}`, want: []string{"validationActions: [Deny]", `["ib-400g"]`}},
		{values: `{"allowNonHostNetwork":true}`, want: []string{"--allow-non-host-network=true"}, notWant: []string{"only allowed for hostNetwork pods"}},
		{values: `{"logging":{"format":"json","verbosity":4}}`, want: []string{"--logging-format=json", "--v=4"}},
		{values: `{"legacy":{"route":"dra"}}`, wantErr: "needs sharing=shared"},
		{values: `{"sharing":"sometimes"}`, wantErr: "sharing"},
		{values: `{"shairng":"shared"}`, wantErr: "shairng"},
	}
	for _, tt := range tests {
		out, err := render(chart, "rdma", "rdma-system", tt.values)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err %v, want %q", tt.values, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.values, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q", tt.values, w)
			}
		}
		for _, w := range tt.notWant {
			if strings.Contains(out, w) {
				t.Errorf("%s: output has %q", tt.values, w)
			}
		}
	}
}
