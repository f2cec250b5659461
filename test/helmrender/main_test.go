package main

import (
	"encoding/json"
	"os"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const chart = "../../deployments/helm/rdma-dra-driver"

func TestRenderMatrix(t *testing.T) {
	tests := []struct {
		values  string
		want    []string
		notWant []string
		wantErr string
	}{
		{values: `{}`, want: []string{"kind: DaemonSet", "name: hca.rdma.dra.dev", "--sharing=exclusive", "--legacy=off", "validationActions: [Warn]", "--kernel-events=true", "maxSurge: 1", "--dev-root=/host-dev", "--host-dev-root=/dev", "mountPath: /host-dev"},
			notWant: []string{"extendedResourceName", "device-plugins", "hostNetwork: true", "--sysfs-root", "mountPath: /dev"}},
		{values: `{"hostNetwork":true,"kernelEvents":false}`, want: []string{"hostNetwork: true", "dnsPolicy: ClusterFirstWithHostNet", "maxSurge: 0", "maxUnavailable: 1", "--kernel-events=false"}},
		{values: `{"hostNetwork":"yes"}`, wantErr: "hostNetwork"},
		{values: `{"sharing":"shared","legacy":{"route":"dra"}}`, want: []string{"extendedResourceName: rdma/hca", "name: legacy.rdma.dra.dev"}},
		{values: `{"sharing":"shared","legacy":{"route":"device-plugin"}}`, want: []string{"--legacy=device-plugin", "/var/lib/kubelet/device-plugins"}, notWant: []string{"extendedResourceName"}},
		{values: `{"policies":{"podRDMA":{"action":"Deny","claimTemplates":["ib-400g"]}}}`, want: []string{"validationActions: [Deny]", `["ib-400g"]`}},
		{values: `{"allowNonHostNetwork":true}`, want: []string{"--allow-non-host-network=true"}, notWant: []string{"only allowed for hostNetwork pods"}},
		// The hook gives memlock by default: the pod policy asks for no
		// IPC_LOCK; with memlock off it does, and the flag says off.
		{values: `{}`, want: []string{"--memlock=unlimited", "only allowed for hostNetwork pods"}, notWant: []string{"withoutIPCLock", "capabilities.add"}},
		{values: `{"memlock":"8Mi"}`, want: []string{"--memlock=8Mi"}, notWant: []string{"withoutIPCLock", "capabilities.add"}},
		{values: `{"memlock":"off"}`, want: []string{"--memlock=off", "name: withoutIPCLock", "need securityContext.capabilities.add: [IPC_LOCK] to pin memory (Helm value memlock: off"}},
		{values: `{"memlock":"off","allowNonHostNetwork":true}`, want: []string{"name: withoutIPCLock"}, notWant: []string{"only allowed for hostNetwork pods"}},
		// Nothing left to check: no policy (one without validations is invalid).
		{values: `{"allowNonHostNetwork":true}`, notWant: []string{"rdma-pod-rdma"}},
		{values: `{"memlock":"lots"}`, wantErr: "memlock"},
		{values: `{"memlock":8388608}`, wantErr: "memlock"},
		{values: `{"logging":{"format":"json","verbosity":4}}`, want: []string{"--logging-format=json", "--v=4"}},
		{values: `{"legacy":{"route":"dra"}}`, wantErr: "needs sharing=shared"},
		{values: `{"sysfsRoot":"/node/sys","devRoot":"/node/dev"}`, want: []string{"--sysfs-root=/node/sys", "--dev-root=/host-dev", "--host-dev-root=/node/dev", "path: /node/sys", "path: /node/dev"}},
		{values: `{"bootIDFile":"/node/boot_id"}`, want: []string{"--boot-id-file=/host-boot-id", "path: /node/boot_id", "mountPath: /host-boot-id"}},
		{values: `{}`, notWant: []string{"--boot-id-file", "host-boot-id"}},
		{values: `{"bootIDFile":"boot_id"}`, wantErr: "bootIDFile"},
		{values: `{"devRoot":"dev"}`, wantErr: "devRoot"},
		{values: `{"sharing":"sometimes"}`, wantErr: "sharing"},
		{values: `{"shairng":"shared"}`, wantErr: "shairng"},
		// Helm renders YAML numbers as float64: without int64 a million
		// became "1e+06", which the daemon's flag parser refuses (exit 2).
		{values: `{"sharesPerHCA":2000000,"legacy":{"shares":9000},"hook":{"hcaHandlesPerHCA":5000000,"hcaObjectsPerHCA":16000000}}`,
			want:    []string{"--shares-per-hca=2000000", "--hca-handles-per-hca=5000000", "--hca-objects-per-hca=16000000", "--hook-path=/opt/rdma-dra-driver/bin/rdma-dra-hook", "name: install-hook"},
			notWant: []string{"e+0"}},
		{values: `{"hook":{"dir":"/usr/libexec/rdma"}}`, want: []string{"--hook-path=/usr/libexec/rdma/rdma-dra-hook", "path: /usr/libexec/rdma"}},
		{values: `{"hook":{"dir":"bin"}}`, wantErr: "hook"},
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

// TestStaticDeviceClassesMatchChart: deployments/deviceclass*.yaml (for
// kubectl users) are what the chart renders; they must not drift.
func TestStaticDeviceClassesMatchChart(t *testing.T) {
	out, err := render(chart, "rdma", "rdma-system", `{"sharing":"shared","legacy":{"route":"dra"}}`)
	if err != nil {
		t.Fatal(err)
	}
	rendered := deviceClasses(t, out)
	var static []string
	for _, f := range []string{"../../deployments/deviceclasses.yaml", "../../deployments/deviceclass-legacy.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		static = append(static, deviceClasses(t, string(b))...)
	}
	sort.Strings(static)
	if strings.Join(rendered, "\n") != strings.Join(static, "\n") {
		t.Errorf("chart DeviceClasses:\n%s\n\nstatic files:\n%s", strings.Join(rendered, "\n"), strings.Join(static, "\n"))
	}
}

// deviceClasses returns each DeviceClass document as canonical JSON, sorted.
func deviceClasses(t *testing.T, multi string) []string {
	t.Helper()
	var out []string
	for _, doc := range strings.Split(multi, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj["kind"] != "DeviceClass" {
			continue
		}
		b, _ := json.Marshal(obj)
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}

// TestInstallOrder: ServiceAccount and RBAC come before the DaemonSet, as
// `helm install` creates them.
func TestInstallOrder(t *testing.T) {
	out, err := renderInstallOrderAt("", chart, "rdma", "rdma-system", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	sa, role, ds := strings.Index(out, "kind: ServiceAccount"), strings.Index(out, "kind: ClusterRole\n"), strings.Index(out, "kind: DaemonSet")
	if sa < 0 || role < 0 || ds < 0 || sa > ds || role > ds {
		t.Errorf("install order: ServiceAccount at %d, ClusterRole at %d, DaemonSet at %d", sa, role, ds)
	}
}
