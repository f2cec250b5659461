package main

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestLeastPrivilege: the DaemonSet rendered with default values mounts
// only what the daemon uses (its own plugin dir, the registry dir,
// /dev/infiniband, never /dev or the kubelet's whole plugins dir), runs
// under the runtime's default seccomp profile, and every container has a
// read-only root and no capabilities.
func TestLeastPrivilege(t *testing.T) {
	for _, values := range []string{`{}`, `{"sharing":"shared","legacy":{"route":"device-plugin"}}`} {
		out, err := render(chart, "rdma", "rdma-system", values)
		if err != nil {
			t.Fatal(err)
		}
		var ds struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						SecurityContext struct {
							SeccompProfile struct{ Type string }
						}
						Volumes []struct {
							Name     string
							HostPath *struct{ Path string }
						}
						InitContainers, Containers []struct {
							Name            string
							SecurityContext struct {
								ReadOnlyRootFilesystem bool
								Capabilities           struct{ Drop []string }
							}
						}
					}
				}
			}
		}
		for _, doc := range strings.Split(out, "\n---\n") {
			if err := yaml.Unmarshal([]byte(doc), &ds); err == nil && ds.Kind == "DaemonSet" {
				break
			}
		}
		if ds.Kind != "DaemonSet" {
			t.Fatalf("%s: no DaemonSet rendered", values)
		}
		pod := ds.Spec.Template.Spec
		if pod.SecurityContext.SeccompProfile.Type != "RuntimeDefault" {
			t.Errorf("%s: seccompProfile %q, want RuntimeDefault", values, pod.SecurityContext.SeccompProfile.Type)
		}
		var paths []string
		for _, v := range pod.Volumes {
			if v.HostPath == nil {
				continue
			}
			paths = append(paths, v.HostPath.Path)
			switch v.HostPath.Path {
			case "/", "/dev", "/var/lib/kubelet", "/var/lib/kubelet/plugins":
				t.Errorf("%s: volume %s mounts the host's %s", values, v.Name, v.HostPath.Path)
			}
		}
		for _, want := range []string{"/var/lib/kubelet/plugins/rdma.dra.dev", "/var/lib/kubelet/plugins_registry", "/dev/infiniband"} {
			if !strings.Contains(strings.Join(paths, " ")+" ", want+" ") {
				t.Errorf("%s: host paths %v lack %s", values, paths, want)
			}
		}
		for _, c := range append(pod.InitContainers, pod.Containers...) {
			if !c.SecurityContext.ReadOnlyRootFilesystem || strings.Join(c.SecurityContext.Capabilities.Drop, ",") != "ALL" {
				t.Errorf("%s: container %s: %+v, want a read-only root and every capability dropped", values, c.Name, c.SecurityContext)
			}
		}
	}
}

// TestPodPolicyDefaults: the pod policy covers init and ephemeral
// containers, and denies (failing closed) by default when the device-plugin
// route is on; an explicit action wins.
func TestPodPolicyDefaults(t *testing.T) {
	tests := []struct {
		values        string
		action, fails string
	}{
		{`{}`, "validationActions: [Warn]", "failurePolicy: Ignore"},
		{`{"sharing":"shared","legacy":{"route":"device-plugin"}}`, "validationActions: [Deny]", "failurePolicy: Fail"},
		{`{"sharing":"shared","legacy":{"route":"device-plugin"},"policies":{"podRDMA":{"action":"Warn"}}}`, "validationActions: [Warn]", "failurePolicy: Ignore"},
		{`{"policies":{"podRDMA":{"action":"Deny"}}}`, "validationActions: [Deny]", "failurePolicy: Fail"},
	}
	for _, tt := range tests {
		out, err := render(chart, "rdma", "rdma-system", tt.values)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(out, "name: rdma-pod-rdma")
		if i < 0 {
			t.Fatalf("%s: no pod policy", tt.values)
		}
		policy := out[i:]
		for _, want := range []string{tt.action, tt.fails, "object.spec.initContainers.filter", "object.spec.ephemeralContainers.filter", "pods/ephemeralcontainers"} {
			if !strings.Contains(policy, want) {
				t.Errorf("%s: pod policy lacks %q", tt.values, want)
			}
		}
	}
	out, err := render(chart, "rdma", "rdma-system", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"spec.driver == 'rdma.dra.dev'", "spec.pool.name == variables.userNode"} {
		if !strings.Contains(out, want) {
			t.Errorf("the node-slices policy lacks %q", want)
		}
	}
}
