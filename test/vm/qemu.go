package vm

// Booting an Image in QEMU: TCG (or KVM where it really works), two
// virtio-net NICs on restricted user networks (nothing leaves the VM, unless
// HostNet opens the first one's gateway to the host's loopback), the
// kernel console on ttyS0 and the guest program's output plus an exit
// marker on ttyS1 (a unix socket), both streamed back line by line.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// QEMU is the emulator binary.
const QEMU = "qemu-system-x86_64"

// Available says whether QEMU can run here, and why not.
func Available() (bool, string) {
	if _, err := exec.LookPath(QEMU); err != nil {
		return false, QEMU + " is not installed (apt-get install qemu-system-x86)"
	}
	for _, t := range []string{"apt-cache", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(t); err != nil {
			return false, t + " is not installed: the VM image is built from Debian packages"
		}
	}
	return true, ""
}

// Boot is one VM run.
type Boot struct {
	Image   *Image
	Dir     string // scratch (the ttyS1 socket)
	MemMB   int
	CPUs    int
	Accel   string // "kvm" or "tcg"
	Timeout time.Duration
	// HostNet lets the guest connect to the host's loopback at 10.0.2.2
	// on eth0 (QEMU's user network unrestricted): a node in the guest
	// reaching the host's API server. The guest can then reach whatever
	// the host can; only the node tests ask for it.
	HostNet bool
	// Link, when set, adds a third NIC on a point-to-point L2 segment
	// with another guest (two-node tests).
	Link *LinkNIC
	// Append are extra kernel parameters; NAME=value ones the kernel
	// hands to /init's environment (one image, a different node per boot).
	Append []string
	// Console and Output see each line of ttyS0 and ttyS1 as it comes.
	Console func(line string)
	Output  func(line string)
}

// LinkNIC is a guest's NIC on a private Ethernet segment between two
// guests: QEMU's socket netdev in UDP mode, each end sending its frames to
// the other's port on the host's loopback. No bridge, no tap, no root, and
// neither end must start first; nothing on it reaches the host's network.
type LinkNIC struct {
	MAC    string // unique per guest: the segment is one broadcast domain
	Local  string // 127.0.0.1:port this guest receives on
	Remote string // 127.0.0.1:port of the other guest
}

// Result of a boot that reached the exit marker.
type Result struct {
	ExitCode int
	Output   []string // ttyS1 lines before the marker
	Console  []string // ttyS0 lines
	Elapsed  time.Duration
}

// Run boots the VM and waits for the guest program's exit marker. A
// setup failure in the guest, QEMU exiting early and a timeout are errors
// that carry the last console lines.
//
// A QEMU that crashes (a fatal signal of its own, not our kill) before the
// guest wrote anything on ttyS1 is booted once more, saying so on the
// console: that is the emulator failing under TCG (a segfault in one boot
// of many here), not the guest or the code under test. A second crash, or
// one after the guest started, is an error.
func (b *Boot) Run(ctx context.Context) (*Result, error) {
	res, err := b.run(ctx)
	var crash *qemuCrash
	if errors.As(err, &crash) && ctx.Err() == nil && res != nil && res.ExitCode < 0 && len(res.Output) == 0 {
		if b.Console != nil {
			b.Console(fmt.Sprintf("[host] %v before the guest started; booting it again", crash))
		}
		return b.run(ctx)
	}
	return res, err
}

// qemuCrash is QEMU killed by a fatal signal of its own.
type qemuCrash struct{ sig syscall.Signal }

func (c *qemuCrash) Error() string { return "QEMU crashed (" + c.sig.String() + ")" }

// crashOf tells a QEMU crash from its exit status: SIGKILL is ours (the
// timeout, the test's end) and not a crash.
func crashOf(waitErr error) *qemuCrash {
	var ee *exec.ExitError
	if !errors.As(waitErr, &ee) {
		return nil
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return nil
	}
	switch sig := ws.Signal(); sig {
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGILL, syscall.SIGABRT, syscall.SIGFPE:
		return &qemuCrash{sig: sig}
	}
	return nil
}

func (b *Boot) run(ctx context.Context) (*Result, error) {
	sock := filepath.Join(b.Dir, "ttyS1.sock")
	_ = os.Remove(sock)
	accel := b.Accel
	if accel == "" {
		accel = "tcg"
	}
	cpus := b.CPUs
	if cpus == 0 {
		cpus = 2
	}
	mem := b.MemMB
	if mem == 0 {
		mem = 1024
	}
	args := []string{
		"-machine", "q35,accel=" + accel, "-cpu", cpuFor(accel), "-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem),
		"-display", "none", "-monitor", "none", "-no-reboot",
		"-kernel", b.Image.Kernel, "-initrd", b.Image.Initrd,
		"-append", strings.Join(append([]string{"console=ttyS0 loglevel=4 panic=-1 rdinit=/init"}, b.Append...), " "),
		"-serial", "stdio",
		"-chardev", "socket,id=res,path=" + sock + ",server=on,wait=on",
		"-serial", "chardev:res",
		"-netdev", "user,id=n0,restrict=" + onOff(!b.HostNet) + ",ipv6=off", "-device", "virtio-net-pci,netdev=n0",
		"-netdev", "user,id=n1,restrict=on,ipv6=off,net=10.0.3.0/24", "-device", "virtio-net-pci,netdev=n1",
		"-nodefaults",
	}
	if l := b.Link; l != nil {
		args = append(args, "-netdev", "socket,id=n2,udp="+l.Remote+",localaddr="+l.Local,
			"-device", "virtio-net-pci,netdev=n2,mac="+l.MAC)
	}
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, QEMU, args...)
	// QEMU goes with the test process, even one killed by go test's timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", QEMU, err)
	}
	res := &Result{ExitCode: -1}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		scanLines(stdout, func(l string) {
			mu.Lock()
			res.Console = append(res.Console, l)
			mu.Unlock()
			if b.Console != nil {
				b.Console(l)
			}
		})
	}()
	var guestErrs []string
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	conn, err := dialRetry(ctx, sock, exited)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, b.failure(res, fmt.Errorf("connecting to the VM's ttyS1 at %s: %w; qemu said: %s", sock, err, strings.TrimSpace(stderr.String())))
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	scanLines(conn, func(l string) {
		if b.Output != nil {
			b.Output(l)
		}
		switch {
		case strings.HasPrefix(l, markerError):
			guestErrs = append(guestErrs, strings.TrimPrefix(l, markerError))
		case strings.HasPrefix(l, markerExit):
			if n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, markerExit))); err == nil {
				res.ExitCode = n
			}
		default:
			if res.ExitCode < 0 {
				res.Output = append(res.Output, l)
			}
		}
	})
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(30 * time.Second):
		cancel()
		waitErr = <-exited
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	switch {
	case len(guestErrs) > 0:
		return res, b.failure(res, fmt.Errorf("guest setup failed: %s", strings.Join(guestErrs, "\n")))
	case res.ExitCode >= 0:
		return res, nil
	case ctx.Err() != nil:
		return res, b.failure(res, fmt.Errorf("timed out after %v without the guest's exit marker", b.Timeout))
	}
	if crash := crashOf(waitErr); crash != nil {
		return res, b.failure(res, fmt.Errorf("QEMU ended without the guest's exit marker: %w: %s", crash, strings.TrimSpace(stderr.String())))
	}
	return res, b.failure(res, fmt.Errorf("QEMU ended without the guest's exit marker: %s", strings.TrimSpace(stderr.String())))
}

// failure adds the last console lines to err.
func (b *Boot) failure(res *Result, err error) error {
	tail := res.Console
	if len(tail) > 30 {
		tail = tail[len(tail)-30:]
	}
	out := res.Output
	if len(out) > 30 {
		out = out[len(out)-30:]
	}
	return fmt.Errorf("%w\nlast console lines:\n  %s\nlast guest output:\n  %s", err,
		strings.Join(tail, "\n  "), strings.Join(out, "\n  "))
}

func cpuFor(accel string) string {
	if accel == "kvm" {
		return "host"
	}
	return "max"
}

// dialRetry dials the unix socket at path until QEMU has made it, QEMU
// exits or ctx ends.
func dialRetry(ctx context.Context, path string, exited <-chan error) (net.Conn, error) {
	var c net.Conn
	err := poll.Until(ctx, "QEMU's ttyS1 socket", 50*time.Millisecond, 2*time.Minute, func(context.Context) (bool, string, error) {
		select {
		case e := <-exited:
			return false, "", fmt.Errorf("QEMU exited (%v) before its ttyS1 socket was up", e)
		default:
		}
		var err error
		c, err = net.Dial("unix", path)
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	return c, err
}

func scanLines(r io.Reader, f func(string)) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		l, err := br.ReadString('\n')
		if l != "" {
			f(strings.TrimRight(l, "\r\n"))
		}
		if err != nil {
			return
		}
	}
}

// ProbeKVM reports whether KVM boots this kernel: /dev/kvm may be a
// paravirtual KVM that stock kernels cannot use (QEMU aborts with "failed
// to set MSR" or hangs). It boots the kernel with no root file system and
// waits for its panic, which a working KVM reaches in a few seconds. The
// verdict is cached in dir.
func ProbeKVM(ctx context.Context, dir, kernel string) (bool, string) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return false, "no /dev/kvm"
	}
	qv, _ := exec.Command(QEMU, "--version").Output()
	un, _ := exec.Command("uname", "-r").Output()
	key := filepath.Join(dir, "kvm-probe-"+sanitize(strings.Fields(string(qv) + " x x x")[3]+"-"+strings.TrimSpace(string(un))+"-"+filepath.Base(kernel)))
	if b, err := os.ReadFile(key); err == nil {
		v := string(b)
		return strings.HasPrefix(v, "ok"), v
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	probe := exec.CommandContext(ctx, QEMU, "-machine", "q35,accel=kvm", "-cpu", "host", "-m", "256",
		"-display", "none", "-monitor", "none", "-no-reboot", "-nodefaults", "-serial", "stdio",
		"-kernel", kernel, "-append", "console=ttyS0 panic=-1")
	probe.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := probe.CombinedOutput()
	verdict := "ok"
	if !bytes.Contains(out, []byte("Kernel panic")) {
		last := string(out)
		if len(last) > 300 {
			last = last[len(last)-300:]
		}
		verdict = fmt.Sprintf("KVM did not boot the kernel (%v): %s", errOr(err, ctx.Err()), strings.TrimSpace(last))
	}
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(key, []byte(verdict), 0o644)
	return verdict == "ok", verdict
}

func errOr(a, b error) error {
	if b != nil {
		return b
	}
	if a == nil {
		return errors.New("no panic seen")
	}
	return a
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == ':' {
			return '_'
		}
		return r
	}, s)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
