package guest

// Memlock from the hook (issue 30) on the real kernel: a container that a
// restricted pod would be (uid 1000, every capability set empty,
// no_new_privs) registers a 256 MiB memory region on rxe0 and moves it with
// ibv_rc_pingpong, because the claim's CDI spec carries rdma-dra-hook's
// memlock hook; the same container without that hook is refused by the
// kernel (ib_umem_get: ENOMEM past RLIMIT_MEMLOCK without CAP_IPC_LOCK).

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/uverbs"
)

const (
	memlockRegion = 256 << 20 // what each container registers, and its pingpong's message
	memlockPort   = 18530
	// restrictedUID is the container's user: not root, as the restricted
	// Pod Security Standard asks (runAsNonRoot).
	restrictedUID = 1000
	// defaultMemlock is the kernel's RLIMIT_MEMLOCK (8 MiB since 5.16),
	// which runc and so the container inherit from the guest's init.
	defaultMemlock = 8 << 20
)

// regMRHelper, run in a container (RDMA_DRA_VM_HELPER=uverbs-reg-mr),
// registers $BYTES on $UVERBS (package uverbs).
func regMRHelper() int {
	n, _ := strconv.Atoi(os.Getenv("BYTES"))
	return uverbs.RegMR(os.Stdout, os.Getenv("UVERBS"), n)
}

// restricted makes spec's process a restricted pod's: uid and gid 1000,
// every capability set empty, no_new_privs, and no RLIMIT_MEMLOCK of the
// runtime's own (a spec that sets one wins over the hook, which then
// leaves it; containerd sets none).
func restricted(spec *specs.Spec) *specs.Spec {
	spec.Process.User = specs.User{UID: restrictedUID, GID: restrictedUID}
	spec.Process.Capabilities = &specs.LinuxCapabilities{}
	spec.Process.NoNewPrivileges = true
	spec.Process.Rlimits = slices.DeleteFunc(spec.Process.Rlimits, func(r specs.POSIXRlimit) bool { return r.Type == "RLIMIT_MEMLOCK" })
	return spec
}

// isMemlockHook: the hook is rdma-dra-hook's memlock subcommand.
func isMemlockHook(h specs.Hook) bool { return len(h.Args) > 1 && h.Args[1] == "memlock" }

// TestMemlockWithoutCapabilities: see the top of the file. The server's
// container runs once without the memlock hook (refused: the kernel's
// ENOMEM from the raw REG_MR, and ibv_rc_pingpong's "Couldn't register
// MR"), then the server and client containers, with it, each register 256
// MiB and move one 256 MiB message each way.
func TestMemlockWithoutCapabilities(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	hook := os.Getenv("RDMA_DRA_VM_HOOK")
	if _, err := os.Stat(hook); hook == "" || err != nil {
		t.Fatalf("rdma-dra-hook is missing from the guest image (RDMA_DRA_VM_HOOK=%q: %v): test/vm always puts it there", hook, err)
	}
	n := startNode(t, nodeConfig{shares: 1000, hookPath: hook, memlock: "unlimited"})
	srv := n.claim("memlock-server", []string{"rxe0"}, "33333333-aaaa-4aaa-8aaa-000000000001")
	cli := n.claim("memlock-client", []string{"rxe0"}, "33333333-aaaa-4aaa-8aaa-000000000002")
	idSrv, idCli := n.prepare(srv), n.prepare(cli)
	uverbsPath := "/dev/infiniband/" + uverbsOf(t, n.drv.Inventory(), "rxe0")
	gid := strconv.Itoa(gidIndex(t, n, "rxe0"))
	spec := func(id string, ids []string, server ...string) *specs.Spec {
		args := append([]string{uverbsPath, "rxe0", gid, strconv.Itoa(memlockPort), strconv.Itoa(memlockRegion)}, server...)
		s := withGuestBinary(restricted(withCDI(t, containerSpec(id, shScript("memlock.sh", args...)...), n.cdiDir, ids...)))
		if s.Hooks == nil || !slices.ContainsFunc(s.Hooks.CreateRuntime, isMemlockHook) {
			t.Fatalf("the claim's CDI spec gives %s no memlock hook: createRuntime hooks %v", id, createRuntimeHooks(s))
		}
		return s
	}

	// Without the hook: the same container, the driver's memlock hook
	// taken out of its spec; the kernel refuses the region.
	bare := spec("memlock-nohook", idSrv)
	t.Logf("the driver's createRuntime hooks: %v", createRuntimeHooks(bare))
	bare.Hooks.CreateRuntime = slices.DeleteFunc(bare.Hooks.CreateRuntime, isMemlockHook)
	r := runContainer(t, "memlock-nohook", bare, 2*time.Minute)
	checkRestricted(t, "without the hook", r.out, fmt.Sprintf("%d %d", defaultMemlock, defaultMemlock))
	refused := fmt.Sprintf("reg_mr %d bytes on %s: register: cannot allocate memory", memlockRegion, uverbsPath)
	if r.exit == 0 || !strings.Contains(r.out, refused) || !strings.Contains(r.out, "Couldn't register MR") {
		t.Errorf("without the hook: exit %d; want the kernel's refusal %q and ibv_rc_pingpong's \"Couldn't register MR\":\n%s", r.exit, refused, r.out)
	} else {
		t.Logf("without the hook, refused (exit %d):\n%s", r.exit, r.out)
	}

	// With it: both ends register and move 256 MiB each way.
	var wg sync.WaitGroup
	var sres ctrResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sres, serr = runContainerErr("memlock-server", spec("memlock-server", idSrv), 3*time.Minute)
	}()
	err := poll.Until(t.Context(), fmt.Sprintf("the server to listen on %d", memlockPort), 50*time.Millisecond, time.Minute,
		func(context.Context) (bool, string, error) { return listening(memlockPort), "", nil })
	if err != nil {
		wg.Wait()
		t.Fatalf("%v: %v\n%s", err, serr, sres.out)
	}
	cres := runContainer(t, "memlock-client", spec("memlock-client", idCli, "10.0.2.15"), 3*time.Minute)
	wg.Wait()
	if serr != nil {
		t.Fatal(serr)
	}
	for _, c := range []struct {
		who string
		res ctrResult
	}{{"server", sres}, {"client", cres}} {
		checkRestricted(t, c.who, c.res.out, "unlimited unlimited")
		reg := regexp.MustCompile(fmt.Sprintf(`reg_mr %d bytes on %s: ok \(lkey 0x[0-9a-f]+\), VmPin: (\d+) kB`, memlockRegion, regexp.QuoteMeta(uverbsPath))).FindStringSubmatch(c.res.out)
		m := throughput.FindStringSubmatch(c.res.out)
		switch {
		case reg == nil || mustAtoi(reg[1]) < memlockRegion>>10:
			t.Errorf("%s: no 256 MiB region registered and pinned:\n%s", c.who, c.res.out)
		case c.res.exit != 0 || m == nil || m[1] != strconv.Itoa(2*memlockRegion):
			t.Errorf("%s: ibv_rc_pingpong exit %d, want %d bytes moved:\n%s", c.who, c.res.exit, 2*memlockRegion, c.res.out)
		default:
			t.Logf("%s with the hook: %s; ibv_rc_pingpong %s bytes in %s s = %s Mbit/s", c.who, reg[0], m[1], m[2], m[3])
		}
	}
	n.unprepare(srv)
	n.unprepare(cli)
}

// checkRestricted holds what a memlock.sh container said of itself: uid
// and gid 1000, every capability set empty, no_new_privs, and the memlock
// limit "soft hard".
func checkRestricted(t *testing.T, who, out, memlock string) {
	t.Helper()
	id := strconv.Itoa(restrictedUID)
	want := []string{"Uid: " + strings.Repeat(id+" ", 3) + id, "Gid: " + strings.Repeat(id+" ", 3) + id, "NoNewPrivs: 1", "memlock: " + memlock}
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		want = append(want, c+": 0000000000000000")
	}
	for _, w := range want {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w) + `$`).MatchString(out) {
			t.Errorf("%s: its container did not say %q:\n%s", who, w, out)
		}
	}
}

// mustAtoi is s as an int, 0 when it is none (callers matched \d+).
func mustAtoi(s string) int { n, _ := strconv.Atoi(s); return n }
