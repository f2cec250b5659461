package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// TestRealNodeRestartChaos: seeded random SIGKILLs of the kubelet,
// containerd and the driver's container while two pods hold HCAs and a
// stream of pods with claims starts and stops. The kubelet and containerd
// are started again at once, as a service manager would; the kubelet
// restarts the driver (its crash-loop back-off capped at 2s here, so 50
// rounds fit in minutes). Throughout: no HCA in two claims (the API's
// allocations and the driver's checkpoint, sampled every round); every
// stream pod runs and sees its claim's HCA, during the kills or within 4
// minutes of their end (a loaded machine may start none while they go
// on); the two holders keep their
// containers and HCAs. At the end nothing is left: no checkpoint entry, no
// CDI spec. RDMA_CHAOS_SEED repeats a run, RDMA_CHAOS_ROUNDS changes its
// length (default 50).
func TestRealNodeRestartChaos(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	seed, rounds := chaosSeedAndRounds(t)
	t.Logf("restart chaos: seed %d, %d rounds (RDMA_CHAOS_SEED=%d repeats them)", seed, rounds, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	w := newRealWorld(t, func(o *node.Options) { o.MaxContainerRestartPeriod = 2 * time.Second })
	w.install(t, "rdma", "")
	holders, holderUIDs, want := w.longPods(t, "held", 2)
	ids := w.containerIDs(t, holders)
	after := w.lastTicks(t, holders)

	begin := time.Now()
	stream := w.startStream("c", 3, 4*time.Minute, streamClaim)
	stream.disturb()
	kills := map[string]int{}
	var doubles []string
	sample := func(round int) { doubles = append(doubles, w.doubles(t, round)...) }
	for round := 1; round <= rounds; round++ {
		victim := []string{"kubelet", "containerd", "driver"}[rng.IntN(3)]
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		start := time.Now()
		switch victim {
		case "kubelet", "containerd":
			back := stream.runtimeKill()
			if err := w.n.Kill(victim); err != nil {
				t.Fatal(err)
			}
			var err error
			if victim == "kubelet" {
				err = w.n.StartKubelet(w.ctx)
			} else {
				err = w.n.StartContainerd(w.ctx)
			}
			if err != nil {
				t.Fatalf("round %d: restarting %s: %v", round, victim, err)
			}
			back()
		case "driver":
			pid := w.driverPid(t)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("round %d: kill -9 %d (the driver): %v", round, pid, err)
			}
		}
		kills[victim]++
		sample(round)
		t.Logf("round %d: SIGKILLed %s, back in %s; stream: %s", round, victim, time.Since(start).Round(10*time.Millisecond), stream.figures())
	}
	t.Logf("%d rounds in %s; stream: %s", rounds, time.Since(begin).Round(time.Second), stream.figures())
	stream.calm()
	stream.stopStream()
	poll.For(t, "the driver Ready after the last round", 2*time.Minute, func() (bool, string) {
		pods := w.driverPods(t)
		return len(pods) == 1 && ready(&pods[0]), fmt.Sprintf("%d pods", len(pods))
	})
	sample(rounds + 1)
	for _, f := range stream.failures {
		t.Errorf("stream pod: %s", f)
	}
	// Starts the kills cut short are forgiven, not a stream that never ran.
	if stream.succeeded == 0 {
		t.Errorf("no stream pod ran and saw its devices: %s", stream.figures())
	}
	for _, d := range doubles {
		t.Errorf("double: %s", d)
	}
	w.keepSeeing(t, holders, ids, after, want)
	// The stream's last claims are unprepared once their pods are gone.
	poll.For(t, "only the holders' claims prepared", 2*time.Minute, func() (bool, string) {
		var got []string
		for uid := range w.checkpoint(t).Claims {
			got = append(got, uid)
		}
		slices.Sort(got)
		// A claim spec and a metadata spec per holder, nothing else: no
		// temporary file of a write the kills cut short.
		files := w.specFiles()
		return slices.Equal(got, slices.Sorted(slices.Values(holderUIDs))) && len(files) == 2*len(holderUIDs),
			fmt.Sprintf("checkpoint %v, holders %v; CDI dir %v", got, holderUIDs, files)
	})
	w.checkPrepared(t, holderUIDs)
	w.reset(t)
	var byVictim []string
	for _, v := range []string{"kubelet", "containerd", "driver"} {
		byVictim = append(byVictim, fmt.Sprintf("%s %d", v, kills[v]))
	}
	t.Logf("restart chaos figures: seed %d, %d rounds (%s) in %s; pods started %d (2 holders, %d stream), ran %d (exit status lost to containerd %d), starts lost to containerd %d; claims prepared %d; leaks %d, double %d",
		seed, rounds, strings.Join(byVictim, ", "), time.Since(begin).Round(time.Second), 2+stream.created, stream.created, 2+stream.succeeded,
		stream.lostExits, stream.lostStarts, 2+stream.succeeded, len(w.checkpoint(t).Claims)+len(w.specFiles()), len(doubles))
}

// chaosSeedAndRounds are RDMA_CHAOS_SEED (default: the clock) and
// RDMA_CHAOS_ROUNDS (default 50).
func chaosSeedAndRounds(t *testing.T) (int64, int) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("RDMA_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("RDMA_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	rounds := 50
	if s := os.Getenv("RDMA_CHAOS_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("RDMA_CHAOS_ROUNDS=%q: want a positive number", s)
		}
		rounds = v
	}
	return seed, rounds
}

// doubles are the devices allocated to two claims in the API or prepared
// for two claims in the driver's checkpoint.
func (w *realWorld) doubles(t *testing.T, round int) []string {
	var doubles []string
	// The API: no device in two allocated claims.
	l, err := w.cp.Client.ResourceV1().ResourceClaims("default").List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, c := range l.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if o, dup := owner[r.Device]; dup {
				doubles = append(doubles, fmt.Sprintf("round %d: %s allocated to claims %s and %s", round, r.Device, o, c.Name))
			}
			owner[r.Device] = c.Name
		}
	}
	// The driver's checkpoint: no device prepared for two claims.
	prepared := map[string]string{}
	for uid, c := range w.checkpoint(t).Claims {
		for _, d := range c.Devices {
			if o, dup := prepared[d.Device]; dup {
				doubles = append(doubles, fmt.Sprintf("round %d: %s prepared for claims %s and %s", round, d.Device, o, uid))
			}
			prepared[d.Device] = uid
		}
	}
	return doubles
}

// driverPid is the host pid of the driver's running container, waiting
// for the kubelet to have (re)started it.
func (w *realWorld) driverPid(t *testing.T) int {
	t.Helper()
	var pid int
	poll.For(t, "the driver's container running", 2*time.Minute, func() (bool, string) {
		pods := w.driverPods(t)
		if len(pods) != 1 || len(pods[0].Status.ContainerStatuses) != 1 || pods[0].Status.ContainerStatuses[0].State.Running == nil {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		id := strings.TrimPrefix(pods[0].Status.ContainerStatuses[0].ContainerID, "containerd://")
		out, err := w.n.Ctr(w.ctx, "tasks", "ls")
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
				pid, err = strconv.Atoi(f[1])
				return err == nil, l
			}
		}
		return false, "no running task " + id
	})
	return pid
}
