package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// killState is the kubelet's view of the claims, as the test plays it: a
// claim is prepared, unprepared, or has a call in doubt (interrupted by a
// kill), which the kubelet repeats until it succeeds. A device is handed to
// a claim only when no other claim of it is prepared or in doubt, as the
// scheduler guarantees.
type killState struct {
	mu       sync.Mutex
	claims   []*drapb.Claim
	device   map[string]string // claim UID -> device
	prepared map[string]bool
	doubt    map[string]string // claim UID -> "prepare" or "unprepare"

	prepares, unprepares, interrupted, refused int
}

func (s *killState) busy(device, except string) bool {
	for uid, dev := range s.device {
		if dev == device && uid != except && (s.prepared[uid] || s.doubt[uid] != "") {
			return true
		}
	}
	return false
}

// next picks the next call: one in doubt first, else a random one.
func (s *killState) next(r *rand.Rand) (*drapb.Claim, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.claims {
		if op := s.doubt[c.Uid]; op != "" {
			return c, op
		}
	}
	for range 100 {
		c := s.claims[r.IntN(len(s.claims))]
		if s.prepared[c.Uid] {
			return c, "unprepare"
		}
		if !s.busy(s.device[c.Uid], c.Uid) {
			return c, "prepare"
		}
	}
	return nil, ""
}

func (s *killState) done(c *drapb.Claim, op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.doubt[c.Uid] = op
		s.interrupted++
		return
	}
	delete(s.doubt, c.Uid)
	s.prepared[c.Uid] = op == "prepare"
	if op == "prepare" {
		s.prepares++
	} else {
		s.unprepares++
	}
}

// call makes one kubelet call; a transport error (the daemon killed) is
// the call in doubt, an answer's error a refusal.
func (s *killState) call(dra drapb.DRAPluginClient, c *drapb.Claim, op string) (error, string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if op == "prepare" {
		resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{c}})
		if err != nil {
			return err, ""
		}
		return nil, resp.Claims[c.Uid].Error
	}
	resp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{c}})
	if err != nil {
		return err, ""
	}
	return nil, resp.Claims[c.Uid].Error
}

// registerOnce registers the plugin like register, on connections the
// caller closes (a run of many kills would otherwise keep hundreds open).
func (w *world) registerOnce() (drapb.DRAPluginClient, func()) {
	w.t.Helper()
	socket := w.registrationSocket()
	w.waitRegistered(socket)
	dialer := func(path string) *grpc.ClientConn {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			w.t.Fatal(err)
		}
		return conn
	}
	regConn := dialer(socket)
	defer regConn.Close()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		w.t.Fatal(err)
	}
	conn := dialer(info.Endpoint)
	return drapb.NewDRAPluginClient(conn), func() { conn.Close() }
}

// doubleHeld counts the devices the checkpoint holds for more than one claim.
func doubleHeld(t *testing.T, path string) int {
	t.Helper()
	cp, err := checkpoint.NewStore(path).Load()
	if err != nil {
		t.Fatalf("the checkpoint after a kill: %v", err)
	}
	held := map[string]int{}
	for _, c := range cp.Claims {
		for _, d := range c.Devices {
			held[d.Device]++
		}
	}
	n := 0
	for _, k := range held {
		if k > 1 {
			n++
		}
	}
	return n
}

// ourFiles lists what the driver left in dir that is not the daemon's own
// standing state (its checkpoint, sockets, lock files): CDI specs,
// metadata files and directories, and temp files of any of them.
func ourFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		n := d.Name()
		switch {
		case d.Type()&fs.ModeSocket != 0, n == "checkpoint.json", strings.HasSuffix(n, ".lock"), n == "dra-device-metadata" && d.IsDir():
			return nil
		}
		out = append(out, strings.TrimPrefix(p, dir+"/"))
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

// TestSIGKILLLeavesNoFiles SIGKILLs the daemon (device metadata on, the
// default) at random moments while the test, playing the kubelet, prepares
// and unprepares claims and repeats each interrupted call, as the kubelet
// does. At the end every claim is unprepared: no CDI spec, metadata file or
// temp file of ours is left, and no device was ever held for two claims.
//
// RDMA_DRA_KILLS sets the number of kills (default 50; the check
// is 1,000), RDMA_DRA_KILL_SEED the seed (printed).
func TestSIGKILLLeavesNoFiles(t *testing.T) {
	t.Parallel() // no node: see parallel in main_test.go
	kills, seed := killsAndSeed(t)
	t.Logf("%d kills, seed %d (RDMA_DRA_KILL_SEED=%d repeats it)", kills, seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))

	w := newBareWorld(t, "-v=1")
	if _, err := w.cp.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &killState{device: map[string]string{}, prepared: map[string]bool{}, doubt: map[string]string{}}
	// Two claims per HCA, so a kill also races a device changing hands.
	for i := range 20 {
		device := fmt.Sprintf("mlx5-%d", i%10)
		c := allocatedClaim(t, w.cp.Client, fmt.Sprintf("k-%d", i), device)
		ref := &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
		s.claims = append(s.claims, ref)
		s.device[ref.Uid] = device
	}
	cpPath := filepath.Join(w.kubeletDir, "plugins", "rdma.dra.dev", "checkpoint.json")
	double := 0
	for k := range kills {
		w.startDriver()
		dra, hangUp := w.registerOnce()
		double += doubleHeld(t, cpPath)
		// Calls run until the kill, which comes 0-100 ms into them: early
		// in a call, mid-write, or between calls.
		killed := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			s.callUntilKilled(t, dra, k, rand.New(rand.NewPCG(seed, uint64(k)+1)), killed)
		}()
		time.Sleep(time.Duration(r.IntN(100_000)) * time.Microsecond)
		close(killed)
		w.proc.Kill()
		<-stopped
		hangUp()
		if t.Failed() {
			t.Fatalf("after %d kills", k+1)
		}
	}

	// The kubelet finishes: every call in doubt, then every claim unprepared.
	w.startDriver()
	dra, hangUp := w.registerOnce()
	defer hangUp()
	double += doubleHeld(t, cpPath)
	for _, c := range s.claims {
		op := s.doubt[c.Uid]
		if op == "" && s.prepared[c.Uid] {
			op = "unprepare"
		}
		if op == "prepare" {
			err, refusal := s.call(dra, c, op)
			if err != nil || refusal != "" {
				t.Fatalf("repeating the prepare of %s: %v %s", c.Name, err, refusal)
			}
			op = "unprepare"
		}
		if op == "unprepare" {
			if err, refusal := s.call(dra, c, op); err != nil || refusal != "" {
				t.Fatalf("unprepare of %s: %v %s", c.Name, err, refusal)
			}
		}
	}
	if err := w.proc.Stop(); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
	w.proc = nil

	leaks := append(ourFiles(t, w.cdiDir), ourFiles(t, filepath.Join(w.kubeletDir, "plugins", "rdma.dra.dev"))...)
	if left, _ := os.ReadDir(filepath.Join(w.kubeletDir, "plugins", "rdma.dra.dev", "dra-device-metadata")); len(left) > 0 {
		for _, e := range left {
			leaks = append(leaks, "dra-device-metadata/"+e.Name())
		}
	}
	t.Logf("kills %d, prepares %d, unprepares %d, calls interrupted %d, refused %d, leaks %d, double %d",
		kills, s.prepares, s.unprepares, s.interrupted, s.refused, len(leaks), double)
	if len(leaks) > 0 {
		t.Errorf("files of ours left behind: %v", leaks)
	}
	if double > 0 {
		t.Errorf("%d times a device was held for two claims", double)
	}
	if s.prepares == 0 || s.interrupted == 0 {
		t.Errorf("the kills never met a call (%d prepares, %d interrupted): the test shows nothing", s.prepares, s.interrupted)
	}
}

// killsAndSeed are RDMA_DRA_KILLS (default 50) and RDMA_DRA_KILL_SEED
// (default: the clock).
func killsAndSeed(t *testing.T) (int, uint64) {
	kills := 50
	if v := os.Getenv("RDMA_DRA_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("RDMA_DRA_KILLS=%q: want a number of kills", v)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RDMA_DRA_KILL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("RDMA_DRA_KILL_SEED=%q: %v", v, err)
		}
		seed = n
	}
	return kills, seed
}

// callUntilKilled plays the kubelet until killed: the next call wr picks,
// over and over; a call the kill may have cut short stays in doubt.
func (s *killState) callUntilKilled(t *testing.T, dra drapb.DRAPluginClient, k int, wr *rand.Rand, killed <-chan struct{}) {
	for {
		select {
		case <-killed:
			return
		default:
		}
		c, op := s.next(wr)
		if c == nil {
			runtime.Gosched()
			continue
		}
		err, refusal := s.call(dra, c, op)
		if refusal != "" {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
			t.Errorf("kill %d: %s of %s refused: %s", k, op, c.Name, refusal)
			s.done(c, op, nil)
			continue
		}
		select {
		case <-killed:
			err = fmt.Errorf("killed") // its answer may not have been the daemon's last word
		default:
		}
		s.done(c, op, err)
	}
}
