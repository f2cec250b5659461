package guest

// Per-container RDMA limits on a shared HCA (issue 13) on the real kernel:
// the driver publishes the rdma cgroup capacities, a claim's consumed
// hcaHandles become rdma-dra-hook's createRuntime hook in its CDI spec,
// runc runs it, and the kernel's rdma controller enforces rdma.max on the
// verbs calls of the container.

import (
	"context"
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
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
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

// limitsEnv is TestLimitsOnSharedRxe's node and the claims it prepared:
// one handle for the server and the client each, none, two objects.
type limitsEnv struct {
	n                            *node
	hook, uverbs, out            string
	gid                          int
	one                          map[string]int64
	idSrv, idCli, idFree, idObjs []string
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
	f := &limitsEnv{n: n, hook: hook, one: one, out: t.TempDir(),
		idSrv: n.prepare(srv), idCli: n.prepare(cli), idFree: n.prepare(free), idObjs: n.prepare(objs),
		gid: gidIndex(t, n, "rxe0"), uverbs: "/dev/infiniband/" + uverbsOf(t, n.drv.Inventory(), "rxe0")}
	idSrv, idCli, idFree, idObjs := f.idSrv, f.idCli, f.idFree, f.idObjs

	wantHook := func(pod string) []string {
		return []string{hook, "rdma-dra-hook", "limit", "--device=rxe0", "--hca-handle=1", "--hca-object=max", "--pod=" + pod + ":1:max"}
	}
	for _, c := range []struct {
		name string
		ids  []string
		want [][]string
	}{{"lim-server", idSrv, [][]string{wantHook("pod-lim-server")}}, {"lim-client", idCli, [][]string{wantHook("pod-lim-client")}}, {"unlimited", idFree, nil},
		{"lim-objects", idObjs, [][]string{{hook, "rdma-dra-hook", "limit", "--device=rxe0", "--hca-handle=max", "--hca-object=2", "--pod=pod-lim-objects:max:2"}}}} {
		got := createRuntimeHooks(withCDI(t, containerSpec(c.name, "true"), n.cdiDir, c.ids...))
		if !slices.EqualFunc(got, c.want, slices.Equal) {
			t.Errorf("%s: createRuntime hooks %q, want %q", c.name, got, c.want)
		}
	}

	t.Run("two containers with hcaHandles 1", f.twoContainersWithOneHandle)

	t.Run("a claim without limits is unlimited", f.unlimitedClaim)

	t.Run("hcaObjects 2 stops a pingpong at its third object", f.objectLimit)

	t.Run("fail closed: no rdma controller in the container's cgroup", f.failClosedWithoutController)

	t.Run("fail closed: the HCA is gone when the container starts", f.failClosedHCAGone)

	for _, c := range []*resourceapi.ResourceClaim{srv, cli, free, objs} {
		n.unprepare(c)
	}
}

func (f *limitsEnv) twoContainersWithOneHandle(t *testing.T) {
	port := pingpongPort + 10
	pp := fmt.Sprintf("-d rxe0 -g %d -p %d -n 500 -s 4096", f.gid, port)
	// The server holds one context while it waits for the client; a
	// second one in its container is refused, by rdma-core's
	// ibv_devinfo and by the kernel's answer to GET_CONTEXT.
	srvScript := shScript("limits-server.sh", pp, strconv.Itoa(port), f.uverbs)
	var wg sync.WaitGroup
	var sres ctrResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		spec := inPod(withGuestBinary(withOut(withCgroupView(containerSpec("lim-server", srvScript...)), f.out)), "pod-lim-server")
		sres, serr = runContainerErr("lim-server", withCDI(t, spec, f.n.cdiDir, f.idSrv...), 120*time.Second)
	}()
	done := filepath.Join(f.out, "second-open-done")
	err := poll.Until(t.Context(), "the server container to get to its second open", 50*time.Millisecond, 60*time.Second,
		func(context.Context) (bool, string, error) { _, err := os.Stat(done); return err == nil, "", nil })
	if err != nil {
		exec.Command("runc", "--root", runcRoot, "kill", "lim-server", "KILL").Run()
		wg.Wait()
		t.Fatalf("%v: %v\n%s", err, serr, sres.out)
	}
	cliScript := shScript("limits-pingpong.sh", append(strings.Fields(pp), "10.0.2.15")...)
	cres := runContainer(t, "lim-client", withCDI(t, inPod(withCgroupView(containerSpec("lim-client", cliScript...)), "pod-lim-client"), f.n.cdiDir, f.idCli...), 60*time.Second)
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
	if !strings.Contains(sres.out, "context 1 on "+f.uverbs+": resource temporarily unavailable") {
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
}

func (f *limitsEnv) unlimitedClaim(t *testing.T) {
	port := pingpongPort + 11
	pp := fmt.Sprintf("-d rxe0 -g %d -p %d -n 500 -s 4096", f.gid, port)
	script := shScript("limits-unlimited.sh", pp, strconv.Itoa(port), f.uverbs)
	spec := withGuestBinary(withCgroupView(containerSpec("unlimited", script...)))
	r := runContainer(t, "unlimited", withCDI(t, spec, f.n.cdiDir, f.idFree...), 120*time.Second)
	t.Logf("container without limits:\n%s", r.out)
	if !strings.Contains(r.out, "rdma.max: rxe0 hca_handle=max hca_object=max") {
		t.Errorf("rdma.max is not unlimited for rxe0")
	}
	if !strings.Contains(r.out, "second open (ibv_devinfo -d rxe0): exit 0") {
		t.Errorf("a second ibv_open_device failed without a limit")
	}
	for i := 1; i <= 3; i++ {
		if !strings.Contains(r.out, fmt.Sprintf("context %d on %s: ok", i, f.uverbs)) {
			t.Errorf("verbs context %d (with the pingpong server's: %d at once) refused without a limit", i, i+1)
		}
	}
	if m := throughput.FindAllStringSubmatch(r.out, -1); r.exit != 0 || len(m) != 2 {
		t.Errorf("pingpong (server and client, two contexts in one container): exit %d", r.exit)
	}
}

func (f *limitsEnv) objectLimit(t *testing.T) {
	script := shScript("limits-pingpong.sh", "-d", "rxe0", "-g", strconv.Itoa(f.gid), "-p", strconv.Itoa(pingpongPort+12), "-n", "5")
	r := runContainer(t, "lim-objects", withCDI(t, inPod(withCgroupView(containerSpec("lim-objects", script...)), "pod-lim-objects"), f.n.cdiDir, f.idObjs...), 60*time.Second)
	t.Logf("container with hcaObjects 2 (exit %d):\n%s", r.exit, r.out)
	if !strings.Contains(r.out, "rdma.max: rxe0 hca_handle=max hca_object=2") {
		t.Errorf("rdma.max does not hold the object limit")
	}
	if r.exit == 0 || !strings.Contains(r.out, "Couldn't create CQ") {
		t.Errorf("the pingpong was not stopped at its third object (PD, MR, then the CQ)")
	}
}

func (f *limitsEnv) failClosedWithoutController(t *testing.T) {
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
		err := poll.Until(context.Background(), "removing "+parent, 100*time.Millisecond, 5*time.Second, func(context.Context) (bool, string, error) {
			err := os.Remove(parent)
			return err == nil || errors.Is(err, os.ErrNotExist), fmt.Sprint(err), nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	if err := os.WriteFile(filepath.Join(parent, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	id := "lim-failclosed"
	spec := withOut(containerSpec(id, "touch", "/out/failclosed-ran"), f.out)
	spec.Linux.CgroupsPath = "/nordma/" + id
	r := runContainer(t, id, withCDI(t, spec, f.n.cdiDir, f.idSrv...), 60*time.Second)
	t.Logf("runc run %s: exit %d\n%s", id, r.exit, r.out)
	want := regexp.MustCompile(regexp.QuoteMeta("rdma-dra-hook: HCA rxe0: cannot set rdma.max (rxe0 hca_handle=1 hca_object=max) of container "+id+": ") +
		`/proc/\d+/cgroup: ` + regexp.QuoteMeta("/sys/fs/cgroup/nordma/"+id+"/cgroup.controllers: the rdma controller is not enabled for this cgroup"))
	if r.exit == 0 || !want.MatchString(r.out) {
		t.Errorf("runc run: exit %d; want a refusal matching %q", r.exit, want)
	}
	if _, err := os.Stat(filepath.Join(f.out, "failclosed-ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the container's command ran without its limit (/out/failclosed-ran: %v)", err)
	}
}

func (f *limitsEnv) failClosedHCAGone(t *testing.T) {
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
	poll.For(t, "the driver to see siw9", 30*time.Second, func() (bool, string) {
		hcas := f.n.drv.Inventory().HCAs
		return slices.ContainsFunc(hcas, func(h hca.HCA) bool { return h.Name == "siw9" && h.Uverbs != nil }), fmt.Sprintf("%+v", hcas)
	})
	gone := f.n.claimConsuming("lim-gone", f.one, []string{"siw9"}, "22222222-aaaa-4aaa-8aaa-000000000005")
	ids := f.n.prepare(gone)
	id := "lim-gone"
	spec := withCDI(t, withOut(containerSpec(id, "touch", "/out/gone-ran"), f.out), f.n.cdiDir, ids...)
	if got, want := createRuntimeHooks(spec), [][]string{{f.hook, "rdma-dra-hook", "limit", "--device=siw9", "--hca-handle=1", "--hca-object=max", "--pod=pod-lim-gone:1:max"}}; !slices.EqualFunc(got, want, slices.Equal) {
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
	if _, err := os.Stat(filepath.Join(f.out, "gone-ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the container's command ran without its limit (/out/gone-ran: %v)", err)
	}
	f.n.unprepare(gone)
}
