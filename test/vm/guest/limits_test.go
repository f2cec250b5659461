package guest

// Per-container RDMA limits on a shared HCA (issue 13) on the real kernel:
// the driver publishes the rdma cgroup capacities, a claim's consumed
// hcaHandles become rdma-dra-hook's createRuntime hook in its CDI spec,
// runc runs it, and the kernel's rdma controller enforces rdma.max on the
// verbs calls of the container.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/uverbs"
)

// hookPath is where the image holds rdma-dra-hook (test/vm puts it there).
func hookPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("RDMA_DRA_VM_HOOK")
	if p == "" {
		t.Skip("rdma-dra-hook is missing from the guest image (RDMA_DRA_VM_HOOK is not set)")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("rdma-dra-hook is not in the image: %v", err)
	}
	return p
}

// withCgroupView gives the container its own cgroup namespace and its
// cgroup mounted read-only at /sys/fs/cgroup, so it reads its rdma.max.
func withCgroupView(spec *specs.Spec) *specs.Spec {
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
		Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
	return spec
}

// withOut bind-mounts the host directory dir read-write at /out.
func withOut(spec *specs.Spec, dir string) *specs.Spec {
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/out", Type: "bind", Source: dir, Options: []string{"rbind", "rw"}})
	return spec
}

// withGuestBinary makes the guest test binary runnable in the container
// (/guest, read-only), for its helpers.
func withGuestBinary(spec *specs.Spec) *specs.Spec {
	exe, err := os.Executable()
	if err != nil {
		return spec
	}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/guest", Type: "bind", Source: filepath.Dir(exe),
		Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	return spec
}

// createRuntimeHooks are the args of a spec's createRuntime hooks.
func createRuntimeHooks(spec *specs.Spec) [][]string {
	var out [][]string
	if spec.Hooks != nil {
		for _, h := range spec.Hooks.CreateRuntime {
			out = append(out, append([]string{h.Path}, h.Args...))
		}
	}
	return out
}

// uverbsContextsHelper, run in a container (RDMA_DRA_VM_HELPER=uverbs-contexts),
// asks for $N verbs contexts on $UVERBS and holds them (package uverbs).
func uverbsContextsHelper() int {
	n, _ := strconv.Atoi(os.Getenv("N"))
	return uverbs.Contexts(os.Stdout, os.Getenv("UVERBS"), n)
}

// TestLimitsOnSharedRxe: two claims share rxe0 with hcaHandles 1 each (the
// driver publishing hcaHandles/hcaObjects, the hook in their CDI specs);
// each container reads rdma.max "rxe0 hca_handle=1 hca_object=max" from
// its own cgroup, a second verbs context in the server's container fails
// while the pingpong between the two containers works; a claim without
// limits is unlimited as before; a container whose hook cannot set the
// limit never runs; an hcaObjects limit stops a pingpong at its objects.
func TestLimitsOnSharedRxe(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	hook := hookPath(t)
	n := startNode(t, nodeConfig{shares: 1000, hcaHandles: 64, hcaObjects: 1 << 20, hookPath: hook})

	// The slice offers the capacities.
	sl, err := n.slice(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sl.Spec.Devices {
		if d.Name != "rxe0" {
			continue
		}
		h, o := d.Capacity[driverName+"/hcaHandles"], d.Capacity[driverName+"/hcaObjects"]
		if h.Value.Value() != 64 || o.Value.Value() != 1<<20 {
			t.Errorf("rxe0's capacities: hcaHandles %v, hcaObjects %v; want 64 and %d", h.Value.String(), o.Value.String(), 1<<20)
		}
		t.Logf("rxe0 publishes hcaHandles %s, hcaObjects %s (default per claim %s)", h.Value.String(), o.Value.String(), h.RequestPolicy.Default.String())
	}

	one := map[string]int64{"hcaHandles": 1}
	srv := n.claimConsuming("lim-server", one, []string{"rxe0"}, "22222222-aaaa-4aaa-8aaa-000000000001")
	cli := n.claimConsuming("lim-client", one, []string{"rxe0"}, "22222222-aaaa-4aaa-8aaa-000000000002")
	free := n.claim("unlimited", []string{"rxe0"}, "22222222-aaaa-4aaa-8aaa-000000000003")
	objs := n.claimConsuming("lim-objects", map[string]int64{"hcaObjects": 2}, []string{"rxe0"}, "22222222-aaaa-4aaa-8aaa-000000000004")
	idSrv, idCli, idFree, idObjs := n.prepare(srv), n.prepare(cli), n.prepare(free), n.prepare(objs)
	gid := gidIndex(t, n, "rxe0")
	uverbs := "/dev/infiniband/" + uverbsOf(t, n.drv.Inventory(), "rxe0")
	out := t.TempDir()

	wantHook := []string{hook, "rdma-dra-hook", "limit", "--device=rxe0", "--hca-handle=1", "--hca-object=max"}
	for _, c := range []struct {
		name string
		ids  []string
		want [][]string
	}{{"lim-server", idSrv, [][]string{wantHook}}, {"lim-client", idCli, [][]string{wantHook}}, {"unlimited", idFree, nil},
		{"lim-objects", idObjs, [][]string{{hook, "rdma-dra-hook", "limit", "--device=rxe0", "--hca-handle=max", "--hca-object=2"}}}} {
		got := createRuntimeHooks(withCDI(t, containerSpec(c.name, "true"), n.cdiDir, c.ids...))
		if !slices.EqualFunc(got, c.want, slices.Equal) {
			t.Errorf("%s: createRuntime hooks %q, want %q", c.name, got, c.want)
		}
	}

	t.Run("two containers with hcaHandles 1", func(t *testing.T) {
		port := pingpongPort + 10
		pp := fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -p %d -n 500 -s 4096", gid, port)
		// The server holds one context while it waits for the client; a
		// second one in its container is refused, by rdma-core's
		// ibv_devinfo and by the kernel's answer to GET_CONTEXT.
		srvScript := fmt.Sprintf(`echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
%[1]s > /tmp/server.log 2>&1 &
s=$!
for i in $(seq 300); do grep -q ':%04[2]X 00000000:0000 0A' /proc/net/tcp && break; sleep 0.1; done
echo "rdma.current: $(cat /sys/fs/cgroup/rdma.current)"
o=$(ibv_devinfo -d rxe0 2>&1); e=$?; echo "second open (ibv_devinfo -d rxe0): exit $e $(echo "$o" | tail -n 1)"
RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=%[3]s N=1 /guest/guest.test
touch /out/second-open-done
wait $s; r=$?; cat /tmp/server.log; echo server=$r; exit $r`, pp, port, uverbs)
		var wg sync.WaitGroup
		var sres ctrResult
		var serr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := withGuestBinary(withOut(withCgroupView(containerSpec("lim-server", "sh", "-c", srvScript)), out))
			sres, serr = runContainerErr("lim-server", withCDI(t, spec, n.cdiDir, idSrv...), 120*time.Second)
		}()
		done := filepath.Join(out, "second-open-done")
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(done); err == nil {
				break
			}
			if time.Now().After(deadline) {
				exec.Command("runc", "--root", runcRoot, "kill", "lim-server", "KILL").Run()
				wg.Wait()
				t.Fatalf("the server container never got to its second open: %v\n%s", serr, sres.out)
			}
		}
		cliScript := fmt.Sprintf(`echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
%s 10.0.2.15`, pp)
		cres := runContainer(t, "lim-client", withCDI(t, withCgroupView(containerSpec("lim-client", "sh", "-c", cliScript)), n.cdiDir, idCli...), 60*time.Second)
		wg.Wait()
		if serr != nil {
			t.Fatal(serr)
		}
		t.Logf("server container:\n%s", sres.out)
		t.Logf("client container:\n%s", cres.out)
		for who, o := range map[string]string{"server": sres.out, "client": cres.out} {
			if !strings.Contains(o, "rdma.max: rxe0 hca_handle=1 hca_object=max") {
				t.Errorf("%s: its cgroup's rdma.max is not rxe0's limit of 1 handle", who)
			}
		}
		if !regexp.MustCompile(`rdma.current: rxe0 hca_handle=1 hca_object=\d+`).MatchString(sres.out) {
			t.Errorf("server: rdma.current does not show its one handle in use")
		}
		if !strings.Contains(sres.out, "second open (ibv_devinfo -d rxe0): exit 1 Failed to open device") {
			t.Errorf("server: a second ibv_open_device in the container did not fail")
		}
		if !strings.Contains(sres.out, "context 1 on "+uverbs+": resource temporarily unavailable") {
			t.Errorf("server: the kernel did not refuse a second verbs context with EAGAIN")
		}
		for who, r := range map[string]ctrResult{"server": sres, "client": cres} {
			m := throughput.FindStringSubmatch(r.out)
			if r.exit != 0 || m == nil {
				t.Errorf("ibv_rc_pingpong %s within its limit: exit %d", who, r.exit)
				continue
			}
			t.Logf("ibv_rc_pingpong %s with hca_handle=1: %s bytes in %s s = %s Mbit/s", who, m[1], m[2], m[3])
		}
	})

	t.Run("a claim without limits is unlimited", func(t *testing.T) {
		port := pingpongPort + 11
		pp := fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -p %d -n 500 -s 4096", gid, port)
		script := fmt.Sprintf(`echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
%[1]s > /tmp/server.log 2>&1 &
s=$!
for i in $(seq 300); do grep -q ':%04[2]X 00000000:0000 0A' /proc/net/tcp && break; sleep 0.1; done
o=$(ibv_devinfo -d rxe0 2>&1); e=$?; echo "second open (ibv_devinfo -d rxe0): exit $e $(echo "$o" | grep -m1 state:)"
RDMA_DRA_VM_HELPER=uverbs-contexts UVERBS=%[3]s N=3 /guest/guest.test
%[1]s 10.0.2.15; c=$?
wait $s; r=$?; cat /tmp/server.log; echo client=$c server=$r; [ $c = 0 ] && [ $r = 0 ]`, pp, port, uverbs)
		spec := withGuestBinary(withCgroupView(containerSpec("unlimited", "sh", "-c", script)))
		r := runContainer(t, "unlimited", withCDI(t, spec, n.cdiDir, idFree...), 120*time.Second)
		t.Logf("container without limits:\n%s", r.out)
		if !strings.Contains(r.out, "rdma.max: rxe0 hca_handle=max hca_object=max") {
			t.Errorf("rdma.max is not unlimited for rxe0")
		}
		if !strings.Contains(r.out, "second open (ibv_devinfo -d rxe0): exit 0") {
			t.Errorf("a second ibv_open_device failed without a limit")
		}
		for i := 1; i <= 3; i++ {
			if !strings.Contains(r.out, fmt.Sprintf("context %d on %s: ok", i, uverbs)) {
				t.Errorf("verbs context %d (with the pingpong server's: %d at once) refused without a limit", i, i+1)
			}
		}
		if m := throughput.FindAllStringSubmatch(r.out, -1); r.exit != 0 || len(m) != 2 {
			t.Errorf("pingpong (server and client, two contexts in one container): exit %d", r.exit)
		}
	})

	t.Run("hcaObjects 2 stops a pingpong at its third object", func(t *testing.T) {
		script := fmt.Sprintf(`echo "rdma.max: $(cat /sys/fs/cgroup/rdma.max)"
ibv_rc_pingpong -d rxe0 -g %d -p %d -n 5`, gid, pingpongPort+12)
		r := runContainer(t, "lim-objects", withCDI(t, withCgroupView(containerSpec("lim-objects", "sh", "-c", script)), n.cdiDir, idObjs...), 60*time.Second)
		t.Logf("container with hcaObjects 2 (exit %d):\n%s", r.exit, r.out)
		if !strings.Contains(r.out, "rdma.max: rxe0 hca_handle=max hca_object=2") {
			t.Errorf("rdma.max does not hold the object limit")
		}
		if r.exit == 0 || !strings.Contains(r.out, "Couldn't create CQ") {
			t.Errorf("the pingpong was not stopped at its third object (PD, MR, then the CQ)")
		}
	})

	t.Run("fail closed: no rdma controller in the container's cgroup", func(t *testing.T) {
		// A parent cgroup with a process of its own cannot enable domain
		// controllers for its children (EBUSY); runc ignores that, so the
		// container's cgroup has no rdma controller and the hook cannot
		// set the limit.
		parent := "/sys/fs/cgroup/nordma"
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		sleeper := exec.Command("sleep", "600")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sleeper.Process.Kill()
			sleeper.Wait()
			for i := 0; i < 50; i++ {
				if err := os.Remove(parent); err == nil || errors.Is(err, os.ErrNotExist) {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Errorf("cannot remove %s", parent)
		})
		if err := os.WriteFile(filepath.Join(parent, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		id := "lim-failclosed"
		spec := withOut(containerSpec(id, "touch", "/out/failclosed-ran"), out)
		spec.Linux.CgroupsPath = "/nordma/" + id
		r := runContainer(t, id, withCDI(t, spec, n.cdiDir, idSrv...), 60*time.Second)
		t.Logf("runc run %s: exit %d\n%s", id, r.exit, r.out)
		want := regexp.MustCompile(regexp.QuoteMeta("rdma-dra-hook: HCA rxe0: cannot set rdma.max (rxe0 hca_handle=1 hca_object=max) of container "+id+": ") +
			`/proc/\d+/cgroup: ` + regexp.QuoteMeta("/sys/fs/cgroup/nordma/"+id+"/cgroup.controllers: the rdma controller is not enabled for this cgroup"))
		if r.exit == 0 || !want.MatchString(r.out) {
			t.Errorf("runc run: exit %d; want a refusal matching %q", r.exit, want)
		}
		if _, err := os.Stat(filepath.Join(out, "failclosed-ran")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the container's command ran without its limit (/out/failclosed-ran: %v)", err)
		}
	})

	t.Run("fail closed: the HCA is gone when the container starts", func(t *testing.T) {
		// A soft-iWARP device of its own on eth1, prepared with a limit,
		// then deleted before its container starts (an HCA unplugged
		// between prepare and start): the kernel's rdma.max has no such
		// device.
		if ok, why := siwBuilt(); !ok {
			t.Skipf("needs a siw device to delete: %s", why)
		}
		command(t, "rdma", "link", "add", "siw9", "type", "siw", "netdev", "eth1")
		deleted := false
		t.Cleanup(func() {
			if !deleted {
				exec.Command("rdma", "link", "delete", "siw9").Run()
			}
		})
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if slices.ContainsFunc(n.drv.Inventory().HCAs, func(h hca.HCA) bool { return h.Name == "siw9" && h.Uverbs != nil }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the driver never saw siw9: %+v", n.drv.Inventory().HCAs)
			}
		}
		gone := n.claimConsuming("lim-gone", one, []string{"siw9"}, "22222222-aaaa-4aaa-8aaa-000000000005")
		ids := n.prepare(gone)
		id := "lim-gone"
		spec := withCDI(t, withOut(containerSpec(id, "touch", "/out/gone-ran"), out), n.cdiDir, ids...)
		if got, want := createRuntimeHooks(spec), [][]string{{hook, "rdma-dra-hook", "limit", "--device=siw9", "--hca-handle=1", "--hca-object=max"}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("createRuntime hooks %q, want %q", got, want)
		}
		command(t, "rdma", "link", "delete", "siw9")
		deleted = true
		r := runContainer(t, id, spec, 60*time.Second)
		t.Logf("runc run %s after rdma link delete siw9: exit %d\n%s", id, r.exit, r.out)
		want := regexp.MustCompile(regexp.QuoteMeta("rdma-dra-hook: HCA siw9: cannot set rdma.max (siw9 hca_handle=1 hca_object=max) of container "+id+": "+
			`writing "siw9 hca_handle=1 hca_object=max" to /sys/fs/cgroup/vmtest/`+id+"/rdma.max: the kernel has no such RDMA device (") + `[a-z ]+\)`)
		// runc's log quotes the hook's stderr, escaping its quotes.
		if r.exit == 0 || !want.MatchString(strings.ReplaceAll(r.out, `\"`, `"`)) {
			t.Errorf("runc run: exit %d; want a refusal matching %q", r.exit, want)
		}
		if _, err := os.Stat(filepath.Join(out, "gone-ran")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the container's command ran without its limit (/out/gone-ran: %v)", err)
		}
		n.unprepare(gone)
	})

	for _, c := range []*resourceapi.ResourceClaim{srv, cli, free, objs} {
		n.unprepare(c)
	}
}
