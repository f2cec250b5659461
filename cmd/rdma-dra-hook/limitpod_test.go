package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
)

// podNode is a root whose pid 42 is container c1 of pod "u-1" (cgroupfs
// layout, cgroup v2); pod "-nordma" has a directory where its rdma.max
// would be, so a write there fails.
func podNode(t *testing.T, podCgroup string) string {
	t.Helper()
	files := map[string]string{
		"proc/42/cgroup":      "0::/kubepods/besteffort/" + podCgroup + "/c1\n",
		"proc/self/mountinfo": "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
		"sys/fs/cgroup/kubepods/besteffort/" + podCgroup + "/c1/cgroup.controllers": "rdma\n",
		"sys/fs/cgroup/kubepods/besteffort/" + podCgroup + "/c1/rdma.max":           "",
	}
	if podCgroup == "pod-nordma" {
		files["sys/fs/cgroup/kubepods/besteffort/"+podCgroup+"/rdma.max/x"] = ""
	} else {
		files["sys/fs/cgroup/kubepods/besteffort/"+podCgroup+"/rdma.max"] = ""
	}
	return tree(t, files)
}

// TestLimitPod: with --pod the hook sets the pod's rdma.max (the parent of
// the container's cgroup) to its pod's entry, keeps the container's own,
// writes the same again on a second run, and refuses a pod it was not
// told of or a parent that is not a pod's cgroup, naming the file and HCA.
func TestLimitPod(t *testing.T) {
	state := `{"ociVersion":"1.2.0","id":"ctr1","status":"creating","pid":42,"bundle":"/b"}`
	base := []string{"limit", "--device=rxe0", "--hca-handle=max", "--hca-object=3"}
	tests := []struct {
		name      string
		podCgroup string
		pods      []string
		runs      int
		wantPod   string // the pod's rdma.max afterwards
		wantErr   string
	}{
		{name: "own entry", podCgroup: "podu-1", pods: []string{"--pod=u-0:1:2", "--pod=u-1:max:5"}, wantPod: "rxe0 hca_handle=max hca_object=5\n"},
		{name: "twice, the same", podCgroup: "podu-1", pods: []string{"--pod=u-1:2:5"}, runs: 2, wantPod: "rxe0 hca_handle=2 hca_object=5\n"},
		{name: "any pod", podCgroup: "podu-9", pods: []string{"--pod=*:max:3"}, wantPod: "rxe0 hca_handle=max hca_object=3\n"},
		{name: "systemd slice", podCgroup: "kubepods-besteffort-podu_1.slice", pods: []string{"--pod=u-1:1:1"}, wantPod: "rxe0 hca_handle=1 hca_object=1\n"},
		{name: "no --pod: container only", podCgroup: "podu-1", wantPod: ""},
		{name: "a pod not counted", podCgroup: "podu-2", pods: []string{"--pod=u-1:1:1"},
			wantErr: "HCA rxe0: container ctr1 is in pod u-2, but the claim's limits were counted for pods u-1 only"},
		{name: "parent not a pod", podCgroup: "notapod", pods: []string{"--pod=u-1:1:1"},
			wantErr: "HCA rxe0: cannot set the pod's rdma.max of container ctr1: " + "ROOT/sys/fs/cgroup/kubepods/besteffort/notapod, the parent of the container's cgroup, is not a pod's cgroup"},
		{name: "pod cgroup without rdma.max", podCgroup: "pod-nordma", pods: []string{"--pod=-nordma:1:1"},
			wantErr: "HCA rxe0: cannot set the pod's rdma.max (rxe0 hca_handle=1 hca_object=1) in ROOT/sys/fs/cgroup/kubepods/besteffort/pod-nordma/rdma.max for container ctr1"},
		{name: "bad --pod", podCgroup: "podu-1", pods: []string{"--pod=u-1:1"}, wantErr: `"u-1:1" is not <pod uid|*>:<hca_handle>:<hca_object>`},
		{name: "bad --pod value", podCgroup: "podu-1", pods: []string{"--pod=u-1:1:lots"}, wantErr: `hca_object: "lots"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := podNode(t, tt.podCgroup)
			var err error
			for range max(tt.runs, 1) {
				if err = run(append(base, tt.pods...), strings.NewReader(state), deps{fs: rdmacg.FS{Root: root}}); err != nil {
					break
				}
			}
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "ROOT", root)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want one containing %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			pod := filepath.Join(root, "sys/fs/cgroup/kubepods/besteffort", tt.podCgroup)
			for file, want := range map[string]string{filepath.Join(pod, "c1/rdma.max"): "rxe0 hca_handle=max hca_object=3\n", filepath.Join(pod, "rdma.max"): tt.wantPod} {
				if b, _ := os.ReadFile(file); string(b) != want {
					t.Errorf("%s = %q, want %q", file, b, want)
				}
			}
		})
	}
}
