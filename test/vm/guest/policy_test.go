package guest

// The hostNetwork switch and the default limits on the real kernel
// (docs/security.md): the hook's namespace check as runc runs it, and the
// rdma.max a claim that asked for none gets.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPolicyHostnetRefusal: with non-hostNetwork RDMA off, a claim
// prepared for a hostNetwork pod carries the hostnet hook; a container in
// the node's namespace runs with it, one in a namespace of its own (a pod
// off the host network that joined the claim later, which prepare never
// saw) is refused by the hook before its process runs.
func TestPolicyHostnetRefusal(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	hook := hookPath(t)
	n := startNode(t, nodeConfig{shares: 1000, hookPath: hook, pods: true, hostNetworkOnly: true})
	n.pod("joined", true)
	ids := n.prepare(n.claim("joined", []string{"rxe0"}, "55555555-aaaa-4aaa-8aaa-000000000001"))
	out := t.TempDir()

	host := withOut(withCDI(t, containerSpec("pol-host", "touch", "/out/host-ran"), n.cdiDir, ids...), out)
	want := [][]string{{hook, "rdma-dra-hook", "hostnet", "--device=rxe0"}}
	if got := createRuntimeHooks(host); len(got) != 1 || strings.Join(got[0], " ") != strings.Join(want[0], " ") {
		t.Fatalf("createRuntime hooks %q, want %q", got, want)
	}
	if r := runContainer(t, "pol-host", host, 60*time.Second); r.exit != 0 {
		t.Errorf("the container on the node's network: exit %d\n%s", r.exit, r.out)
	}
	if _, err := os.Stat(filepath.Join(out, "host-ran")); err != nil {
		t.Errorf("the container on the node's network did not run: %v", err)
	}

	id := "pol-podnet"
	podnet := withOwnNetns(withOut(withCDI(t, containerSpec(id, "touch", "/out/podnet-ran"), n.cdiDir, ids...), out))
	r := runContainer(t, id, podnet, 60*time.Second)
	t.Logf("runc run %s: exit %d\n%s", id, r.exit, r.out)
	wantMsg := "rdma-dra-hook: HCA rxe0: refused to container " + id + ": it is not on the host network (its network namespace is not the node's), " +
		"and RDMA for pods that are not on the host network is disabled on this node (driver flag --allow-non-host-network=false"
	if r.exit == 0 || !strings.Contains(r.out, wantMsg) {
		t.Errorf("runc run: exit %d; want a refusal containing %q", r.exit, wantMsg)
	}
	if _, err := os.Stat(filepath.Join(out, "podnet-ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the container off the node's network ran (/out/podnet-ran: %v)", err)
	}
}

// TestPolicyDefaultLimit: a claim on a shared rxe0 that asks for no
// hcaHandles or hcaObjects gets the node's defaults as its container's
// rdma.max, read back from the container's own cgroup.
func TestPolicyDefaultLimit(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	hook := hookPath(t)
	n := startNode(t, nodeConfig{shares: 1000, hcaHandles: 64, hcaObjects: 1 << 20, hookPath: hook, defaultHCAHandles: 2, defaultHCAObjects: 500})
	ids := n.prepare(n.claim("asks-none", []string{"rxe0"}, "55555555-aaaa-4aaa-8aaa-000000000002"))
	id := "pol-default"
	r := runContainer(t, id, withCDI(t, inPod(withCgroupView(containerSpec(id, "cat", "/sys/fs/cgroup/rdma.max")), "pod-asks-none"), n.cdiDir, ids...), 60*time.Second)
	t.Logf("runc run %s: exit %d\n%s", id, r.exit, r.out)
	if want := "rxe0 hca_handle=2 hca_object=500"; r.exit != 0 || !strings.Contains(r.out, want) {
		t.Errorf("the container's rdma.max: exit %d, %q; want %q", r.exit, r.out, want)
	}
}
