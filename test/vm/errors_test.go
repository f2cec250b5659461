package vm

// The harness's own failures must say what failed: a guest setup step with
// the kernel's last words, and a timeout with the last console lines.

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

func TestVMFailuresNameTheCause(t *testing.T) {
	// Beside TestVM: mostly an idle guest waiting for its timeout.
	t.Parallel()
	if os.Getenv("RDMA_DRA_VM") == "0" {
		t.Skip("the environment sets RDMA_DRA_VM=0: the VM suite is switched off on this machine")
	}
	if ok, why := Available(); !ok {
		t.Skip("no VM on this machine: " + why)
	}
	if os.Getenv("RDMA_DRA_VM_RUN") != "" || os.Getenv("RDMA_DRA_VM_SHELL") != "" {
		t.Skip("the environment sets RDMA_DRA_VM_RUN or RDMA_DRA_VM_SHELL, which select guest tests only")
	}
	cacheDir, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := &Cache{Dir: cacheDir, Log: t.Logf}
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		spec    ImageSpec
		timeout time.Duration
		want    []string
	}{
		// rdma_rxe needs the crc32 crypto algorithm, which nothing declares.
		{"rxe without crc32", ImageSpec{Prog: "/bin/true", Without: []string{"crc32_generic"}}, 3 * time.Minute,
			[]string{"guest setup failed", "rxe", "dmesg:"}},
		{"timeout", ImageSpec{Prog: "/bin/sleep", Args: []string{"600"}}, 20 * time.Second,
			[]string{"timed out after 20s without the guest's exit marker", "last console lines:\n  init: loading modules"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			im, err := cache.Build(ctx, dir, c.spec)
			if err != nil {
				t.Fatal(err)
			}
			accel := "tcg"
			if ok, _ := ProbeKVM(ctx, cacheDir, im.Kernel); ok {
				accel = "kvm"
			}
			_, err = (&Boot{Image: im, Dir: dir, Accel: accel, Timeout: c.timeout}).Run(ctx)
			if err == nil {
				t.Fatal("the boot succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			t.Logf("the harness said: %v", err)
		})
	}
}
