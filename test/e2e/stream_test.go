package e2e

// A stream of short pods with claims, started and stopped in the
// background while a test upgrades, rolls back or kills the node's
// components: each pod lists /dev/infiniband and exits; the stream checks
// it saw its claim's devices, and counts.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// streamKind is what a stream pod asks for.
type streamKind int

const (
	streamClaim  streamKind = iota // its own claim from ib-400g
	streamLegacy                   // rdma/hca: 1 (legacy.route=dra)
)

type podStream struct {
	w       *realWorld
	prefix  string
	kinds   []streamKind // pod i asks for kinds[i%len(kinds)]
	timeout time.Duration

	mu         sync.Mutex
	next       int
	created    int // pods created
	succeeded  int // pods that ran and saw their devices
	lostExits  int // of those, pods whose exit status a containerd kill lost
	lostStarts int // pods whose start a containerd kill cancelled
	failures   []string
	// runtimeDown are the windows in which the test had killed the
	// kubelet or containerd and not yet restarted it (runtimeKill); a pod
	// the runtime lost must have lived through one.
	runtimeDown []window
	byPhase     map[string]int // succeeded pods by the phase label current when they were created
	phase       string
	// disturbing: the test is killing the node's parts (disturb); a pod's
	// timeout then runs from calmAt (calm), not from its creation.
	disturbing bool
	calmAt     time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

// streamLimit bounds a stream pod's wait whatever disturb and calm say.
const streamLimit = 30 * time.Minute

// startStream keeps inFlight pods going until stopStream.
func (w *realWorld) startStream(prefix string, inFlight int, timeout time.Duration, kinds ...streamKind) *podStream {
	s := &podStream{w: w, prefix: prefix, kinds: kinds, timeout: timeout, byPhase: map[string]int{}, stop: make(chan struct{})}
	for range inFlight {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				s.one()
			}
		}()
	}
	return s
}

// setPhase labels the pods created from now on (for the figures).
func (s *podStream) setPhase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

// disturb: from now until calm, the test kills the node's parts faster
// than a loaded machine may start a pod, so no pod is late; calm gives
// every pod its timeout again, counted from then. Each must still run and
// see its devices: the node has to recover, not merely survive.
func (s *podStream) disturb() {
	s.mu.Lock()
	s.disturbing = true
	s.mu.Unlock()
}

func (s *podStream) calm() {
	s.mu.Lock()
	s.disturbing, s.calmAt = false, time.Now()
	s.mu.Unlock()
}

// late reports a pod created at created that has had its timeout.
func (s *podStream) late(created time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.disturbing && time.Since(later(created, s.calmAt)) > s.timeout
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *podStream) stopStream() {
	close(s.stop)
	s.wg.Wait()
}

type window struct{ from, to time.Time }

// runtimeKill records that the test kills the kubelet or containerd now;
// it calls the returned function once it is back.
func (s *podStream) runtimeKill() (back func()) {
	w := window{from: time.Now()}
	return func() {
		w.to = time.Now()
		s.mu.Lock()
		s.runtimeDown = append(s.runtimeDown, w)
		s.mu.Unlock()
	}
}

// runtimeKillGrace is how long after a restart the runtime may still fail
// what it was doing when it was killed (a shim reconnecting, a task
// cleaned up).
const runtimeKillGrace = 10 * time.Second

// runtimeKilledDuring reports whether a kill of the kubelet or containerd
// overlapped [from, to] (with runtimeKillGrace after each restart).
func (s *podStream) runtimeKilledDuring(from, to time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.runtimeDown, func(w window) bool {
		return !w.from.After(to) && !w.to.Add(runtimeKillGrace).Before(from)
	})
}

// lostToRuntime judges a failed start: one the runtime lost is counted,
// anything else fails the test (see lostStart).
func (s *podStream) lostToRuntime(name, phase, why string, created time.Time) {
	switch {
	case !lostStart(why):
		s.fail("%s (%s): start failed: %s", name, phase, why)
	case !s.runtimeKilledDuring(created, time.Now()):
		s.fail("%s (%s): start failed with no kill of the kubelet or containerd in the pod's life: %s", name, phase, why)
	default:
		s.mu.Lock()
		s.lostStarts++
		s.mu.Unlock()
	}
}

func (s *podStream) fail(format string, args ...any) {
	s.mu.Lock()
	s.failures = append(s.failures, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

// one runs one pod to its end and deletes it.
func (s *podStream) one() {
	w := s.w
	s.mu.Lock()
	i := s.next
	s.next++
	phase := s.phase
	s.mu.Unlock()
	kind := s.kinds[i%len(s.kinds)]
	name := fmt.Sprintf("%s%d", s.prefix, i)
	// The listing goes to the termination message, a file the kubelet
	// reads from the pod's directory: stdout passes through containerd,
	// which the restart chaos kills, losing what the container wrote then.
	pod := claimPod(name, true, "ls /dev/infiniband | tee /dev/termination-log; sleep 1")
	pod.Spec.TerminationGracePeriodSeconds = ptr(int64(1))
	pod.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	if kind == streamLegacy {
		pod.Spec.ResourceClaims = nil
		pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdma/hca": resource.MustParse("1")}}
	}
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	c := w.cp.Client.CoreV1().Pods("default")
	created := time.Now()
	if _, err := c.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		s.fail("%s: create: %v", name, err)
		time.Sleep(time.Second)
		return
	}
	s.mu.Lock()
	s.created++
	s.mu.Unlock()
	defer func() {
		if err := c.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			s.fail("%s: delete: %v", name, err)
		}
	}()
	var p *corev1.Pod
	var startErr string
	startFailedNow := false
	var seen string
	err := poll.Until(ctx, name+" to finish", 250*time.Millisecond, streamLimit, func(ctx context.Context) (bool, string, error) {
		if s.late(created) {
			return false, "", fmt.Errorf("not within %s of its creation or of the end of the kills; last seen: %s", s.timeout, seen)
		}
		got, err := c.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			seen = err.Error()
			return false, seen, nil
		}
		p = got
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return true, "", nil
		}
		// A start that failed leaves the pod Pending (restartPolicy Never)
		// or, when containerd was killed while the container started and
		// ran, Failed with reason StartError.
		if startErr, startFailedNow = startFailed(p); startFailedNow {
			return true, "", nil
		}
		seen = fmt.Sprintf("%s %+v", p.Status.Phase, p.Status.ContainerStatuses)
		return false, seen, nil
	})
	if startFailedNow {
		s.lostToRuntime(name, phase, startErr, created)
		return
	}
	if err != nil {
		s.fail("%s (%s): %v; events: %s", name, phase, err, w.events(name))
		return
	}
	if why, failed := startFailed(p); failed && p.Status.Phase == corev1.PodFailed {
		s.lostToRuntime(name, phase, why, created)
		return
	}
	lost := p.Status.Phase == corev1.PodFailed && lostExit(p)
	if p.Status.Phase == corev1.PodFailed && !lost {
		s.fail("%s (%s): Failed: %+v", name, phase, p.Status)
		return
	}
	if lost && !s.runtimeKilledDuring(created, time.Now()) {
		s.fail("%s (%s): exit status lost with no kill of the kubelet or containerd in the pod's life: %+v", name, phase, p.Status)
		return
	}
	var msg string
	if cs := p.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Terminated != nil {
		msg = cs[0].State.Terminated.Message
	}
	got := strings.Join(infinibandListing(msg), " ")
	var want string
	if kind == streamLegacy {
		var all []string
		for d := range w.devices {
			all = append(all, d)
		}
		want = w.uverbsOf(all...)
	} else {
		devs := w.claims.devices(name)
		if len(devs) != 1 {
			s.fail("%s: its claim had %v, want one HCA", name, devs)
			return
		}
		want = w.uverbsOf(devs...)
	}
	if got != want {
		s.fail("%s (%s) saw %q, want %q", name, phase, got, want)
		return
	}
	s.mu.Lock()
	s.succeeded++
	if lost {
		s.lostExits++
	}
	s.byPhase[phase]++
	s.mu.Unlock()
}

// lostExit tells a pod whose container ran but whose exit status a
// containerd kill lost: containerd's CRI reports a task it cannot find
// when it comes back with exit code 255 and reason "Unknown". Such a pod
// is judged by its termination message, which the kubelet reads from the
// pod's directory.
func lostExit(p *corev1.Pod) bool {
	cs := p.Status.ContainerStatuses
	if len(cs) != 1 || cs[0].State.Terminated == nil {
		return false
	}
	t := cs[0].State.Terminated
	return t.ExitCode == 255 && t.Reason == "Unknown" && t.Message != ""
}

// startFailed reports a container whose start failed (reason StartError):
// with restartPolicy Never the kubelet leaves such a pod Pending.
func startFailed(p *corev1.Pod) (string, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.Reason == "StartError" {
			return t.Message, true
		}
	}
	return "", false
}

// lostStart tells a start that a containerd kill cut short from one that
// failed on the driver's account: a message naming our hook (its refusal),
// CDI or our CDI kind (an injection error) is ours and fails the test. Any
// other failed start under the chaos is the runtime's: containerd killed
// while it created or started the task ("context canceled", "ttrpc:
// closed", a lost shim connection), whatever words that takes.
func lostStart(msg string) bool {
	for _, ours := range []string{"rdma-dra-hook", "CDI", "cdi", "rdma.dra.dev"} {
		if strings.Contains(msg, ours) {
			return false
		}
	}
	return true
}

// figures says how many pods were created and ran, by phase.
func (s *podStream) figures() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var phases []string
	for p, n := range s.byPhase {
		phases = append(phases, fmt.Sprintf("%s %d", p, n))
	}
	slices.Sort(phases)
	return fmt.Sprintf("%d pods created, %d ran and saw their devices (%s; %d of them with the exit status lost to a containerd kill), %d starts lost to a containerd kill, %d failures",
		s.created, s.succeeded, strings.Join(phases, ", "), s.lostExits, s.lostStarts, len(s.failures))
}

// scrape reads every sample of a driver pod's /metrics (through the node's
// network namespace) whose name starts with rdma_dra_.
func (w *realWorld) scrape(p corev1.Pod) (map[string]float64, error) {
	if p.Status.PodIP == "" {
		return nil, fmt.Errorf("%s has no IP yet", p.Name)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return w.n.Dial(ctx, network, addr)
	}}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + net.JoinHostPort(p.Status.PodIP, "9464") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "rdma_dra_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}
