package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// sameErrNetns is a kernel whose namespace comparison fails.
type sameErrNetns struct{ fakeNetns }

func (*sameErrNetns) sameNetns() (bool, error) { return false, errors.New("stat: no such process") }

func TestHostnet(t *testing.T) {
	containerd := `{"id":"ctr1","pid":42,"annotations":{"io.kubernetes.cri.container-name":"c","io.kubernetes.cri.sandbox-name":"podnet","io.kubernetes.cri.sandbox-namespace":"team-a"}}`
	crio := `{"id":"ctr1","pid":42,"annotations":{"io.kubernetes.container.name":"init","io.kubernetes.pod.name":"p","io.kubernetes.pod.namespace":"default"}}`
	bare := `{"id":"ctr1","pid":42}`
	tests := []struct {
		name    string
		args    []string
		stdin   string
		kernel  netnsKernel
		wantErr string
	}{
		{name: "host network: allowed", args: []string{"hostnet", "--device=mlx5_0"}, stdin: containerd, kernel: &fakeNetns{same: true}},
		{
			name: "own namespace: refused, naming the pod's container, the HCA and the switch", args: []string{"hostnet", "--device=mlx5_0"}, stdin: containerd, kernel: &fakeNetns{},
			wantErr: "HCA mlx5_0: refused to container c of pod team-a/podnet: it is not on the host network (its network namespace is not the node's), " +
				"and RDMA for pods that are not on the host network is disabled on this node (driver flag --allow-non-host-network=false, Helm value allowNonHostNetwork)",
		},
		{name: "CRI-O's annotations", args: []string{"hostnet", "--device=mlx5_0", "--device=mlx5_1"}, stdin: crio, kernel: &fakeNetns{},
			wantErr: "HCAs mlx5_0, mlx5_1: refused to container init of pod default/p: it is not on the host network"},
		{name: "no annotations: the container ID", args: []string{"hostnet", "--device=rxe0"}, stdin: bare, kernel: &fakeNetns{},
			wantErr: "HCA rxe0: refused to container ctr1: it is not on the host network"},
		{name: "comparison fails: refused", args: []string{"hostnet", "--device=rxe0"}, stdin: containerd, kernel: &sameErrNetns{},
			wantErr: "HCA rxe0: checking the hostNetwork policy for container c of pod team-a/podnet: stat: no such process"},
		{name: "no device", args: []string{"hostnet"}, stdin: containerd, wantErr: "want at least one --device"},
		{name: "stray argument", args: []string{"hostnet", "--device=rxe0", "x"}, stdin: containerd, wantErr: `unexpected arguments ["x"]`},
		{name: "not a hook", args: []string{"hostnet", "--device=rxe0"}, stdin: "", wantErr: "HCA rxe0: the OCI state on stdin is not JSON"},
		{name: "no process", args: []string{"hostnet", "--device=rxe0"}, stdin: `{"id":"c","pid":0}`, wantErr: "HCA rxe0: the OCI state of container \"c\" has no process"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			open := func(pid int) (netnsKernel, error) {
				if pid != 42 {
					t.Errorf("opened pid %d, want 42", pid)
				}
				return tt.kernel, nil
			}
			err := run(tt.args, strings.NewReader(tt.stdin), deps{openNetns: open})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	err := run([]string{"hostnet", "--device=rxe0"}, strings.NewReader(containerd), deps{openNetns: func(int) (netnsKernel, error) { return nil, os.ErrNotExist }})
	if err == nil || !strings.Contains(err.Error(), "HCA rxe0: cannot open the network namespace of container c of pod team-a/podnet (pid 42) to check the hostNetwork policy") {
		t.Errorf("container gone: %v", err)
	}
}

// TestHostnetRealKernel runs the check against this host's namespaces: a
// process in the hook's own namespace passes, one in a namespace of its
// own is refused.
func TestHostnetRealKernel(t *testing.T) {
	own := fmt.Sprintf(`{"id":"self","pid":%d}`, os.Getpid())
	if err := run([]string{"hostnet", "--device=rxe0"}, strings.NewReader(own), deps{openNetns: openHostNetns}); err != nil {
		t.Errorf("a process in the hook's namespace: %v", err)
	}
	pid := childInNetns(t)
	child := fmt.Sprintf(`{"id":"child","pid":%d}`, pid)
	err := run([]string{"hostnet", "--device=rxe0"}, strings.NewReader(child), deps{openNetns: openHostNetns})
	if err == nil || !strings.Contains(err.Error(), "HCA rxe0: refused to container child: it is not on the host network") {
		t.Errorf("a process in a namespace of its own: %v", err)
	}
}
