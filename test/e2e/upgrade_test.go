package e2e

// helm upgrade from the last release to this tree, helm rollback and helm
// uninstall, on the real node, with pods holding claims throughout.
//
// The last release is read from CHANGELOG.md: the first heading that
// names a version (vX.Y.Z) together with, in the heading or its section,
// the commit it was cut from. That commit is checked out with `git
// worktree add`, its image built with its own `make image` under the tag
// of its version, and its chart taken from its tree (cached by commit
// under ${XDG_CACHE_HOME:-~/.cache}/rdma-dra-driver/releases).

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// driverRelease is a built release: its chart and its image.
type driverRelease struct {
	version, commit string
	chart, image    string // chart directory, image tarball
	tag             string // the image's tag
}

var (
	versionHeading = regexp.MustCompile(`^#+\s.*?\bv?(\d+\.\d+\.\d+)\b`)
	commitWord     = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
)

// lastRelease applies the rule above to CHANGELOG.md.
func lastRelease(changelog string) (version, commit string, err error) {
	lines := strings.Split(changelog, "\n")
	for i, l := range lines {
		m := versionHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		section := []string{l}
		for _, next := range lines[i+1:] {
			if strings.HasPrefix(next, "#") {
				break
			}
			section = append(section, next)
		}
		for _, s := range section {
			// A commit: a hex word with a letter (a date's or number's
			// digits are not one), or a full 40-digit hash.
			for _, c := range commitWord.FindAllString(s, -1) {
				if strings.ContainsAny(c, "abcdef") || len(c) == 40 {
					return "v" + m[1], c, nil
				}
			}
		}
		return "", "", fmt.Errorf("CHANGELOG.md: release %s names no commit (in its heading or section)", m[1])
	}
	return "", "", fmt.Errorf("CHANGELOG.md names no release (a heading with vX.Y.Z)")
}

func TestLastReleaseRule(t *testing.T) {
	for _, c := range []struct{ in, version, commit string }{
		{"# Changelog\n\n## Unreleased\n- x\n\n## v0.1.0 (5658f81)\n- first\n", "v0.1.0", "5658f81"},
		{"# Changelog\n## [0.2.0] - 2026-12-24\nCommit: 0123abc\n## [0.1.0] - 2026-12-03\nCommit 5658f81\n", "v0.2.0", "0123abc"},
		{"## v0.1.0 — 2026-12-03, commit 5658f81283cce31d189f481366f6817d641f6317\n", "v0.1.0", "5658f81283cce31d189f481366f6817d641f6317"},
	} {
		v, commit, err := lastRelease(c.in)
		if err != nil || v != c.version || commit != c.commit {
			t.Errorf("lastRelease(%q) = %q %q %v, want %q %q", c.in, v, commit, err, c.version, c.commit)
		}
	}
	for _, bad := range []string{"# Changelog\n## Unreleased\n", "## v0.1.0\n- no commit\n"} {
		if _, _, err := lastRelease(bad); err == nil {
			t.Errorf("lastRelease(%q): no error", bad)
		}
	}
}

// buildLastRelease builds, or takes from the cache, the release
// CHANGELOG.md names last.
func buildLastRelease(t *testing.T) driverRelease {
	t.Helper()
	root := cluster.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatalf("the previous release comes from CHANGELOG.md: %v", err)
	}
	version, commit, err := lastRelease(string(b))
	if err != nil {
		t.Fatal(err)
	}
	full, err := exec.Command("git", "-C", root, "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		t.Skipf("the release %s's commit %s is not in this clone (a shallow clone? git fetch --unshallow): %v", version, commit, err)
	}
	commit = strings.TrimSpace(string(full))
	rel := driverRelease{version: version, commit: commit, tag: version}
	base, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(base, "rdma-dra-driver", "releases", commit)
	rel.chart, rel.image = filepath.Join(cache, "chart"), filepath.Join(cache, "image.tar")
	if _, err := os.Stat(filepath.Join(cache, ".complete")); err == nil {
		t.Logf("release %s (%s) from the cache %s", version, commit[:12], cache)
		return rel
	}
	start := time.Now()
	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, node.LastLines(string(out), 30))
		}
	}
	run(root, "git", "worktree", "prune")
	run(root, "git", "worktree", "add", "--detach", src, commit)
	t.Cleanup(func() { _ = exec.Command("git", "-C", root, "worktree", "remove", "--force", src).Run() })
	// Built beside the cache entry, so that the rename below stays on one
	// file system (TMPDIR is often a tmpfs, the cache is on disk).
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.MkdirTemp(filepath.Dir(cache), ".building-"+commit[:12]+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(out) })
	run(src, "make", "-s", "image", "BIN="+filepath.Join(tmp, "bin"), "IMAGE_TAR="+filepath.Join(out, "image.tar"),
		"IMAGE="+strings.TrimSuffix(node.DriverImage, ":dev")+":"+version)
	run(root, "cp", "-r", filepath.Join(src, "deployments", "helm", "rdma-dra-driver"), filepath.Join(out, "chart"))
	if err := os.WriteFile(filepath.Join(out, ".complete"), []byte(commit+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.RemoveAll(cache)
	if err := os.Rename(out, cache); err != nil {
		// Another test process cached it meanwhile.
		if _, serr := os.Stat(filepath.Join(cache, ".complete")); serr != nil {
			t.Fatal(err)
		}
	}
	t.Logf("release %s: built %s's image and chart with git worktree + make image in %s", version, commit[:12], time.Since(start).Round(time.Second))
	return rel
}

// daemonStats is what one driver pod served, from its /metrics polled
// while it lived: the counters' last values and when they first and last
// changed.
type daemonStats struct {
	name, image        string
	prepared, failed   float64
	repeated           float64 // prepares of claims the checkpoint held (releases that count them)
	unprepared         float64
	firstServe, lastAt time.Time
}

type daemonWatch struct {
	w    *realWorld
	mu   sync.Mutex
	pods map[types.UID]*daemonStats
	stop chan struct{}
	done chan struct{}

	// From the checkpoint, polled with the metrics: each claim's prepare
	// times (a prepare records its time, a repeat too) and devices. A
	// repeat of any release shows as a second time; a double as devices
	// that changed.
	preparedAt map[string]map[time.Time]bool
	devices    map[string]string
	changed    []string
}

// observe records one reading of the checkpoint.
func (d *daemonWatch) observe(cp checkpoint.Checkpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, c := range cp.Claims {
		if d.preparedAt[uid] == nil {
			d.preparedAt[uid] = map[time.Time]bool{}
		}
		d.preparedAt[uid][c.PreparedAt] = true
		var devs []string
		for _, dev := range c.Devices {
			devs = append(devs, dev.Device)
		}
		got := strings.Join(devs, ",")
		if was, ok := d.devices[uid]; ok && was != got {
			d.changed = append(d.changed, fmt.Sprintf("claim %s/%s: devices %s, then %s", c.Namespace, c.Name, was, got))
		}
		d.devices[uid] = got
	}
}

// repeats counts the prepares of claims the checkpoint already held.
func (d *daemonWatch) repeats() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, times := range d.preparedAt {
		n += len(times) - 1
	}
	return n
}

// watchDaemons polls every driver pod's metrics every 200 ms.
func (w *realWorld) watchDaemons() *daemonWatch {
	d := &daemonWatch{w: w, pods: map[types.UID]*daemonStats{}, stop: make(chan struct{}), done: make(chan struct{}),
		preparedAt: map[string]map[time.Time]bool{}, devices: map[string]string{}}
	store := checkpoint.NewStore(filepath.Join(w.n.Dir, "var-lib", "kubelet", "plugins", "rdma.dra.dev", "checkpoint.json"))
	go func() {
		defer close(d.done)
		for {
			select {
			case <-d.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if cp, err := store.Load(); err == nil {
				d.observe(cp)
			}
			l, err := w.cp.Client.CoreV1().Pods("rdma-system").List(w.ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, p := range l.Items {
				if p.Status.Phase != corev1.PodRunning {
					continue
				}
				m, err := w.scrape(p)
				if err != nil {
					continue
				}
				now := time.Now()
				d.mu.Lock()
				s := d.pods[p.UID]
				if s == nil {
					s = &daemonStats{name: p.Name, image: p.Spec.Containers[0].Image}
					d.pods[p.UID] = s
				}
				prep, failed, unprep := m[prepareOK], m[prepareErr], m[unprepareOK]
				if prep+failed+unprep > s.prepared+s.failed+s.unprepared {
					if s.firstServe.IsZero() {
						s.firstServe = now
					}
					s.lastAt = now
				}
				s.prepared, s.failed, s.unprepared, s.repeated = prep, failed, unprep, m[prepareRepeated]
				d.mu.Unlock()
			}
		}
	}()
	return d
}

// finish stops polling and returns the daemons in the order they served.
func (d *daemonWatch) finish() []daemonStats {
	close(d.stop)
	<-d.done
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []daemonStats
	for _, s := range d.pods {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].firstServe.IsZero() != out[j].firstServe.IsZero() {
			return out[j].firstServe.IsZero()
		}
		return out[i].firstServe.Before(out[j].firstServe)
	})
	return out
}

// rollTo waits for the release's DaemonSet to have exactly one pod, Ready,
// running image, and the pod it replaces to be gone; it checks the old
// pod was deleted only after the new one was Ready (maxSurge 1).
func (w *realWorld) rollTo(t *testing.T, image string, old corev1.Pod) corev1.Pod {
	t.Helper()
	var cur corev1.Pod
	poll.For(t, "the driver pod running "+image+" Ready and "+old.Name+" gone", 4*time.Minute, func() (bool, string) {
		l, err := w.cp.Client.CoreV1().Pods("rdma-system").List(w.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + w.release})
		if err != nil {
			return false, err.Error()
		}
		var st []string
		n := 0
		for _, p := range l.Items {
			st = append(st, fmt.Sprintf("%s %s %s ready %v", p.Name, p.Spec.Containers[0].Image, p.Status.Phase, ready(&p)))
			if p.UID == old.UID || p.DeletionTimestamp != nil {
				return false, strings.Join(st, "; ")
			}
			if p.Spec.Containers[0].Image == image && ready(&p) {
				cur = p
			}
			n++
		}
		return n == 1 && cur.Name != "", strings.Join(st, "; ")
	})
	return cur
}

// TestRealNodeUpgradeRollback: the last release installed by helm, pods
// with claims running (an exclusive one, one claim shared by two pods, an
// rdma/hca one), then helm upgrade to this tree and helm rollback while a
// stream of pods starts and stops; then helm uninstall with the pods still
// running and a new install that picks their claims up.
func TestRealNodeUpgradeRollback(t *testing.T) {
	t.Parallel() // a real node of its own: see parallel in main_test.go
	rel := buildLastRelease(t)
	w := newRealWorld(t, func(o *node.Options) { o.Images = append(o.Images, rel.image) })
	h, err := cluster.NewHelm(w.cp, w.dir)
	if err != nil {
		t.Fatal(err)
	}
	u := &upgradeRun{w: w, h: h, rel: rel, oldImage: strings.TrimSuffix(node.DriverImage, ":dev") + ":" + rel.tag}
	u.installOld(t)
	u.startLongPods(t)
	u.upgradeAndRollBack(t)
	u.noDoublePrepare(t)
	u.uninstallWithPodsRunning(t)
	u.reinstall(t)
}

// upgradeRun is TestRealNodeUpgradeRollback's state from step to step.
type upgradeRun struct {
	w        *realWorld
	h        *cluster.Helm
	rel      driverRelease
	oldImage string
	daemons  *daemonWatch
	stream   *podStream
	served   []daemonStats
	// The long-running pods: their names, what each sees in
	// /dev/infiniband, their claims, container IDs and last ticks.
	names, longUIDs []string
	want, ids       map[string]string
	after           map[string]int
	exclUID         string
	// The prepares the daemons counted: all, the repeats among them, and
	// those beyond one per claim.
	prepared, repeated, double float64
}

const upgradeNS = "rdma-system"

// values of the release tag; this tree's chart ("dev") also gets the
// memlock this host allows (the last release's chart has no such value).
func (u *upgradeRun) values(tag string) string {
	memlock := ""
	if tag == "dev" {
		memlock = fmt.Sprintf(`,"memlock":%q`, u.w.memlock)
	}
	return fmt.Sprintf(`{"image":{"tag":%q},"sysfsRoot":%q,"devRoot":%q,"sharing":"shared","legacy":{"route":"dra"}%s}`, tag, u.w.sim.SysfsRoot, u.w.sim.DevRoot, memlock)
}

// listed fails t unless helm lists the release at revision, deployed, from chart.
func (u *upgradeRun) listed(t *testing.T, revision, chart string) {
	t.Helper()
	rels, err := u.h.List(u.w.ctx, upgradeNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(rels) != 1 || rels[0].Revision != revision || rels[0].Status != "deployed" || rels[0].Chart != chart {
		t.Fatalf("helm list = %+v, want revision %s deployed, chart %s", rels, revision, chart)
	}
	t.Logf("helm list: %s revision %s %s, chart %s, app version %s", rels[0].Name, rels[0].Revision, rels[0].Status, rels[0].Chart, rels[0].AppVersion)
}

// chartOf is the chart's name-version as helm lists it.
func (u *upgradeRun) chartOf(t *testing.T, dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("%s/Chart.yaml has no version", dir)
	}
	return "rdma-dra-driver-" + m[1]
}

// installOld installs the last release from its own chart and watches its daemons.
func (u *upgradeRun) installOld(t *testing.T) {
	w := u.w
	// The old release, from its own chart.
	w.release = "rdma"
	start := time.Now()
	if err := u.h.Install(w.ctx, "rdma", upgradeNS, u.rel.chart, u.values(u.rel.tag)); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the "+u.rel.version+" driver Ready with every HCA published", 3*time.Minute, func() (bool, string) {
		pods := w.driverPods(t)
		if len(pods) != 1 || !ready(&pods[0]) {
			return false, fmt.Sprintf("%d driver pods", len(pods))
		}
		return len(sliceDevices(w.ctx, w.cp, w.n.Name)) >= len(w.devices), fmt.Sprintf("devices %v", sliceDevices(w.ctx, w.cp, w.n.Name))
	})
	t.Logf("%s installed by helm and Ready in %s", u.rel.version, time.Since(start).Round(100*time.Millisecond))
	u.listed(t, "1", u.chartOf(t, u.rel.chart))
	u.daemons = w.watchDaemons()
}

// startLongPods starts the long-running pods and records what they see.
func (u *upgradeRun) startLongPods(t *testing.T) {
	w := u.w
	// The long-running pods.
	w.ensureTemplate(t)
	claim := func(name string, shares int64) {
		t.Helper()
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: "ib.rdma.dra.dev",
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"rdma.dra.dev/shares": *resource.NewQuantity(shares, resource.DecimalSI)}}}
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "hca", Exactly: req}}}}}
		if _, err := w.cp.Client.ResourceV1().ResourceClaims("default").Create(w.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claim("whole-hca", 1000) // every share: exclusive
	claim("one-share", 1)    // shared by two pods
	long := map[string]func(*corev1.Pod){
		"excl": func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr("whole-hca")}}
		},
		"shared-a": func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr("one-share")}}
		},
		"shared-b": func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "rdma", ResourceClaimName: ptr("one-share")}}
		},
		"legacy": func(p *corev1.Pod) {
			p.Spec.ResourceClaims = nil
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdma/hca": resource.MustParse("1")}}
		},
	}
	u.names = slices.Sorted(maps.Keys(long))
	// shared-b after shared-a runs: two pods of one claim starting at once
	// may both have the kubelet ask for it (each pod's worker finds it not
	// yet prepared), a repeat too quick for the checkpoint poll to see.
	for _, name := range u.names {
		if name == "shared-b" {
			w.waitPhase(t, corev1.PodRunning, "shared-a")
		}
		w.realClaimPod(t, name, true, tickScript, func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways }, long[name])
	}
	w.waitPhase(t, corev1.PodRunning, u.names...)
	u.want = map[string]string{}
	for _, name := range u.names {
		uid, devs := w.longClaim(t, name)
		if !slices.Contains(u.longUIDs, uid) {
			u.longUIDs = append(u.longUIDs, uid)
		}
		u.want[name] = w.uverbsOf(devs...)
		if got := w.waitTicks(t, name, 0)[0].devs; got != u.want[name] {
			t.Fatalf("%s sees %q, want %q", name, got, u.want[name])
		}
	}
	if u.want["shared-a"] != u.want["shared-b"] {
		t.Fatalf("the two pods of one claim see %q and %q", u.want["shared-a"], u.want["shared-b"])
	}
	u.ids = w.containerIDs(t, u.names)
	u.after = w.lastTicks(t, u.names)
	w.checkPrepared(t, u.longUIDs)
}

// upgradeAndRollBack upgrades to this tree and rolls back under a stream of pods.
func (u *upgradeRun) upgradeAndRollBack(t *testing.T) {
	w := u.w
	// Upgrade and roll back under a stream of pods (own claims and rdma/hca).
	u.stream = w.startStream("s", 2, 3*time.Minute, streamClaim, streamLegacy)
	u.stream.setPhase(u.rel.version)
	time.Sleep(5 * time.Second)
	old := w.driverPod(t)
	u.stream.setPhase("upgrading")
	start := time.Now()
	if err := u.h.Upgrade(w.ctx, "rdma", upgradeNS, cluster.ChartDir(), u.values("dev")); err != nil {
		t.Fatal(err)
	}
	cur := w.rollTo(t, node.DriverImage, old)
	t.Logf("helm upgrade %s -> this tree: new daemon %s Ready and %s gone in %s", u.rel.version, cur.Name, old.Name, time.Since(start).Round(100*time.Millisecond))
	u.listed(t, "2", u.chartOf(t, cluster.ChartDir()))
	u.stream.setPhase("upgraded")
	time.Sleep(10 * time.Second)

	u.stream.setPhase("rolling back")
	start = time.Now()
	if err := u.h.Rollback(w.ctx, "rdma", upgradeNS, 1); err != nil {
		t.Fatal(err)
	}
	back := w.rollTo(t, u.oldImage, cur)
	t.Logf("helm rollback to 1: daemon %s (%s) Ready and %s gone in %s", back.Name, u.rel.version, cur.Name, time.Since(start).Round(100*time.Millisecond))
	u.listed(t, "3", u.chartOf(t, u.rel.chart))
	u.stream.setPhase("rolled back")
	time.Sleep(10 * time.Second)
	u.stream.stopStream()
	u.served = u.daemons.finish()

	t.Logf("stream: %s", u.stream.figures())
	for _, f := range u.stream.failures {
		t.Errorf("stream pod: %s", f)
	}
	for _, p := range []string{u.rel.version, "upgraded", "rolled back"} {
		if u.stream.byPhase[p] == 0 {
			t.Errorf("no stream pod created while %s ran: %s", p, u.stream.figures())
		}
	}
	w.keepSeeing(t, u.names, u.ids, u.after, u.want)
	w.checkPrepared(t, u.longUIDs)
}

// noDoublePrepare adds up the daemons' prepares.
func (u *upgradeRun) noDoublePrepare(t *testing.T) {
	// No claim prepared twice: every daemon's successful prepares add up to
	// one per claim (the long pods' and each stream pod's own). The two
	// daemons of a rolling update never both serve: each one's calls end
	// before the next one's begin.
	// A repeat is the kubelet asking again for a claim the checkpoint
	// holds (a call whose answer a daemon's stop cut off): the same
	// devices, no new state. The checkpoint shows each as a new prepare
	// time (older releases do not count them in a metric), so repeats are
	// counted apart; a double is a prepare beyond those.
	var failed float64
	for i, s := range u.served {
		t.Logf("daemon %s (%s): %v prepares (%v repeats by its count), %v failed, %v unprepares, served %s..%s", s.name, s.image, s.prepared, s.repeated, s.failed, s.unprepared,
			s.firstServe.Format("15:04:05.000"), s.lastAt.Format("15:04:05.000"))
		u.prepared += s.prepared
		failed += s.failed
		if i > 0 && !s.firstServe.IsZero() && u.served[i-1].lastAt.After(s.firstServe) {
			t.Errorf("daemons %s and %s both served: %s's last call at %s, after %s's first at %s", u.served[i-1].name, s.name,
				u.served[i-1].name, u.served[i-1].lastAt.Format("15:04:05.000"), s.name, s.firstServe.Format("15:04:05.000"))
		}
	}
	u.repeated = float64(u.daemons.repeats())
	claims := float64(len(u.longUIDs) + u.stream.succeeded)
	u.double = u.prepared - u.repeated - claims
	if u.double != 0 || failed != 0 {
		t.Errorf("prepares across %d daemons: %v for %v claims (double %v, repeats %v apart), %v failed", len(u.served), u.prepared, claims, u.double, u.repeated, failed)
	}
	for _, c := range u.daemons.changed {
		t.Errorf("a claim's devices changed across prepares: %s", c)
	}
}

// uninstallWithPodsRunning uninstalls the release with the long pods running.
func (u *upgradeRun) uninstallWithPodsRunning(t *testing.T) {
	w := u.w
	// helm uninstall with the pods running.
	objs, err := u.h.Manifest(w.ctx, "rdma", upgradeNS)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := u.h.Uninstall(w.ctx, "rdma", upgradeNS); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the driver pod to be gone", 2*time.Minute, func() (bool, string) {
		pods := w.driverPods(t)
		return len(pods) == 0, fmt.Sprintf("%d pods", len(pods))
	})
	left, err := cluster.Remaining(w.ctx, w.cp, objs)
	if err != nil {
		t.Fatal(err)
	}
	rels, err := u.h.List(w.ctx, upgradeNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 || len(rels) > 0 {
		t.Errorf("after helm uninstall: objects %v, releases %+v left", left, rels)
	}
	t.Logf("helm uninstall: the release's %d objects and the driver pod gone in %s", len(objs), time.Since(start).Round(100*time.Millisecond))
	// The kubelet wipes an unregistered driver's ResourceSlices (after a
	// grace period for a restart): nothing is left for the scheduler to
	// allocate that no daemon could prepare.
	poll.For(t, "the node's ResourceSlices to go after the uninstall", 3*time.Minute, func() (bool, string) {
		devs := sliceDevices(w.ctx, w.cp, w.n.Name)
		return len(devs) == 0, fmt.Sprintf("%d devices published", len(devs))
	})
	t.Logf("the node's ResourceSlices gone %s after helm uninstall began", time.Since(start).Round(100*time.Millisecond))
	w.keepSeeing(t, u.names, u.ids, w.lastTicks(t, u.names), u.want)
	w.checkPrepared(t, u.longUIDs) // the running pods' claims stay prepared
	// A pod ends while no driver runs: its claim waits, prepared.
	u.exclUID, _ = w.longClaim(t, "excl")
	if err := w.cp.Client.CoreV1().Pods("default").Delete(w.ctx, "excl", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if _, held := w.checkpoint(t).Claims[u.exclUID]; !held {
		t.Errorf("excl's claim left the checkpoint with no driver to unprepare it")
	}
}

// reinstall installs this tree again, which picks the claims up.
func (u *upgradeRun) reinstall(t *testing.T) {
	w := u.w
	// A later install (this tree) picks the claims up: the ended pod's
	// claim is unprepared, the running ones keep theirs, new pods start.
	w.release = "rdma"
	if err := u.h.Install(w.ctx, "rdma", upgradeNS, cluster.ChartDir(), u.values("dev")); err != nil {
		t.Fatal(err)
	}
	poll.For(t, "the reinstalled driver to unprepare excl's claim", 3*time.Minute, func() (bool, string) {
		_, held := w.checkpoint(t).Claims[u.exclUID]
		return !held, fmt.Sprintf("checkpoint %d claims, CDI dir %v", len(w.checkpoint(t).Claims), w.specFiles())
	})
	rest := slices.DeleteFunc(slices.Clone(u.names), func(n string) bool { return n == "excl" })
	w.keepSeeing(t, rest, map[string]string{"legacy": u.ids["legacy"], "shared-a": u.ids["shared-a"], "shared-b": u.ids["shared-b"]}, w.lastTicks(t, rest), u.want)
	w.checkPrepared(t, slices.DeleteFunc(slices.Clone(u.longUIDs), func(uid string) bool { return uid == u.exclUID }))
	w.realClaimPod(t, "after-reinstall", true, "ls /dev/infiniband")
	w.waitPhase(t, corev1.PodSucceeded, "after-reinstall")
	w.reset(t)
	t.Logf("upgrade/rollback figures: pods started %d (4 long, %d stream), claims prepared %v (repeats %v apart), leaks %d, double %v",
		4+u.stream.created, u.stream.created, u.prepared, u.repeated, len(w.checkpoint(t).Claims)+len(w.specFiles()), u.double)
}

// longClaim is the UID and devices of the claim a long pod runs with: its
// named claim, or the scheduler's claim for rdma/hca.
func (w *realWorld) longClaim(t *testing.T, pod string) (string, []string) {
	t.Helper()
	p := w.pod(t, pod)
	if p.Status.ExtendedResourceClaimStatus != nil {
		c, err := w.cp.Client.ResourceV1().ResourceClaims("default").Get(w.ctx, p.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var all []string
		for d := range w.devices {
			all = append(all, d)
		}
		return string(c.UID), all // the legacy device: every HCA
	}
	return w.claimOf(t, pod)
}
