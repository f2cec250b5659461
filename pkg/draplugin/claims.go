package draplugin

// The claim state: what prepare and unprepare do on disk. A call locks its
// claims (by namespace and name: a retried prepare of a claim waits for the
// first, and a claim made again under the same name waits for the old one's
// unprepare, which shares its metadata directory), checks and reserves
// their devices in memory, writes the CDI specs and metadata files (a
// claim's spec and its metadata at once) without any shared lock, and
// records the claims in the checkpoint with one read-modify-write under the
// checkpoint's file lock, which also checks the devices again against what
// another daemon (a rolling update) recorded meanwhile. A claim that fails
// at any step is undone.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// claimState prepares and unprepares claims.
type claimState struct {
	cfg     *Config
	store   CheckpointStore
	specs   CDISpecs
	meta    metadataFiles // meta.dataDir "": no metadata files
	bootID  string
	current func() *view // the publisher's latest view
	ips     *nodeIPCache
	metrics *Metrics
	locks   claimLocks
	held    reservations
	// orphanSpecs are CDI specs found after a corrupt checkpoint was moved
	// aside: their claims may still be prepared, so only an unprepare
	// removes them. Set in New, read-only after.
	orphanSpecs map[string]bool
}

func newClaimState(cfg *Config, deps Deps, metrics *Metrics, current func() *view, ips *nodeIPCache) *claimState {
	return &claimState{
		cfg:     cfg,
		store:   deps.Checkpoint,
		specs:   deps.SpecDir,
		meta:    metadataFiles{driver: cfg.DriverName, dataDir: cfg.PluginDataDir, cdiDir: deps.SpecDir.Dir()},
		bootID:  deps.BootID,
		current: current,
		ips:     ips,
		metrics: metrics,
	}
}

// prepare prepares claims as v has the HCAs, with the facts gathered for
// them, and returns each claim's result and the records of those prepared.
// Then, under their own locks, it rewrites the specs of the claims prepared
// before for the same pods: their pods' limits (and aggregate env) now
// count these, and every spec of a pod must carry the same pod limits.
func (s *claimState) prepare(ctx context.Context, v *view, claims []*resourceapi.ResourceClaim, facts []claimFacts) (map[types.UID]kubeletplugin.PrepareResult, []checkpoint.Claim, error) {
	results, prepared, siblings, err := s.prepareLocked(ctx, v, claims, facts)
	for _, c := range siblings {
		s.rewriteOne(ctx, s.current(), c)
	}
	return results, prepared, err
}

// siblingsOf are the claims of cp, other than those prepared, reserved for
// one of the same pods.
func siblingsOf(cp checkpoint.Checkpoint, prepared []checkpoint.Claim) []checkpoint.Claim {
	var out []checkpoint.Claim
	for _, uid := range sortedKeys(cp.Claims) {
		o := cp.Claims[uid]
		if slices.ContainsFunc(prepared, func(c checkpoint.Claim) bool { return c.UID == o.UID }) {
			continue
		}
		if slices.ContainsFunc(prepared, func(c checkpoint.Claim) bool { return sharesPod(c, o) }) {
			out = append(out, o)
		}
	}
	return out
}

func (s *claimState) prepareLocked(ctx context.Context, v *view, claims []*resourceapi.ResourceClaim, facts []claimFacts) (map[types.UID]kubeletplugin.PrepareResult, []checkpoint.Claim, []checkpoint.Claim, error) {
	keys := make([]string, len(claims))
	for i, c := range claims {
		keys[i] = c.Namespace + "/" + c.Name
	}
	defer s.locks.lock(keys)()
	cp, err := s.store.Load()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	fail := func(c checkpoint.Claim, err error) {
		results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
	}
	var reserved []checkpoint.Claim
	defer func() { s.held.release(reserved) }()
	for i, claim := range claims {
		c, err := resolve(s.cfg, v, claim, facts[i], s.bootID)
		if err == nil {
			err = s.held.reserve(c, cp)
		}
		if err != nil {
			fail(c, err)
			continue
		}
		reserved = append(reserved, c)
	}

	candidates := append(slices.Collect(maps.Values(cp.Claims)), reserved...)
	var written []checkpoint.Claim
	devs := map[string][]kubeletplugin.Device{}
	for _, c := range reserved {
		var err error
		devs[c.UID], err = s.writeFiles(v, c, group(s.cfg, v, c, candidates), podLimitsOf(s.cfg, v, c, candidates))
		if err != nil {
			s.undo(c, cp)
			fail(c, err)
			continue
		}
		written = append(written, c)
	}

	refused, err := s.record(written)
	var prepared []checkpoint.Claim
	for _, c := range written {
		lost := err
		if lost == nil {
			lost = refused[c.UID]
		}
		if lost != nil {
			s.undo(c, cp)
			fail(c, lost)
			continue
		}
		results[types.UID(c.UID)] = kubeletplugin.PrepareResult{Devices: devs[c.UID]}
		prepared = append(prepared, c)
		if _, repeat := cp.Claims[c.UID]; repeat {
			s.metrics.prepareRepeated.Inc()
			klog.FromContext(ctx).V(2).Info("Prepared a claim again (already in the checkpoint)", "claim", c.Namespace+"/"+c.Name, "claimUID", c.UID)
		}
	}
	if cur := s.current(); cur != v && len(prepared) > 0 {
		// A rescan changed the inventory during the prepare and may have
		// rewritten the prepared claims' specs before these were recorded:
		// write them as the new inventory has the HCAs.
		s.rewriteLocked(klog.FromContext(ctx), cur, prepared)
	}
	return results, prepared, siblingsOf(cp, prepared), nil
}

// writeFiles writes claim c's CDI spec and its metadata files at once:
// they are files of their own, and a prepare waits for the slower, not
// for both. It returns what the kubelet gets for c.
func (s *claimState) writeFiles(v *view, c checkpoint.Claim, group []hca.HCA, pods podTotals) ([]kubeletplugin.Device, error) {
	var devs []kubeletplugin.Device
	var metaErr error
	var wg sync.WaitGroup
	wg.Go(func() { devs, metaErr = s.writeMetadata(v, c) })
	specErr := s.writeSpec(v, c, group, pods)
	wg.Wait()
	if specErr != nil {
		return nil, specErr
	}
	return devs, metaErr
}

// record adds the written claims to the checkpoint in one update. Under
// the checkpoint's file lock it checks their devices once more against the
// claims recorded meanwhile, by this daemon or another: refused names the
// claims that lost.
func (s *claimState) record(written []checkpoint.Claim) (refused map[string]error, err error) {
	if len(written) == 0 {
		return nil, nil
	}
	err = s.store.Update(func(cp *checkpoint.Checkpoint) error {
		refused = map[string]error{}
		for _, c := range written {
			if err := holderError(c, *cp, nil); err != nil {
				refused[c.UID] = err
				continue
			}
			cp.Claims[c.UID] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recording it in the checkpoint: %w", err)
	}
	return refused, nil
}

// undo removes the files of a claim that failed: without a record,
// unprepare could not clean up. An earlier, recorded prepare keeps them.
func (s *claimState) undo(c checkpoint.Claim, cp checkpoint.Checkpoint) {
	if _, known := cp.Claims[c.UID]; known {
		return
	}
	_ = s.specs.RemoveClaim(c.UID)
	if s.meta.dataDir != "" {
		_ = s.meta.remove(c.Namespace, c.Name, c.UID, sameNameClaim(cp, c.Namespace, c.Name, c.UID))
	}
}

// sameNameClaim reports whether cp holds a claim namespace/name other than
// uid (a claim deleted and made again): the metadata directory, named by
// namespace and name, is then that claim's.
func sameNameClaim(cp checkpoint.Checkpoint, namespace, name, uid string) bool {
	for _, c := range cp.Claims {
		if c.Namespace == namespace && c.Name == name && c.UID != uid {
			return true
		}
	}
	return false
}

// unprepare removes the claims' files and records, and returns each
// claim's result and the HCAs the kernel should hand back from pods'
// namespaces (ibdev -> claim).
func (s *claimState) unprepare(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, map[string]string, error) {
	keys := make([]string, len(claims))
	for i, c := range claims {
		keys[i] = c.Namespace + "/" + c.Name
	}
	defer s.locks.lock(keys)()
	results := make(map[types.UID]error, len(claims))
	var done []string
	var cp checkpoint.Checkpoint
	if s.meta.dataDir != "" {
		var err error
		if cp, err = s.store.Load(); err != nil {
			return nil, nil, fmt.Errorf("reading the checkpoint: %w", err)
		}
	}
	for _, claim := range claims {
		if err := s.specs.RemoveClaim(string(claim.UID)); err != nil {
			results[claim.UID] = fmt.Errorf("claim %s: removing its CDI spec: %w", claim.String(), err)
			continue
		}
		if s.meta.dataDir != "" {
			// Also when metadata is off now: an earlier daemon may have
			// written them.
			if err := s.meta.remove(claim.Namespace, claim.Name, string(claim.UID), sameNameClaim(cp, claim.Namespace, claim.Name, string(claim.UID))); err != nil {
				results[claim.UID] = fmt.Errorf("claim %s: %w", claim.String(), err)
				continue
			}
		}
		results[claim.UID] = nil
		done = append(done, string(claim.UID))
	}
	v := s.current()
	moved := map[string]string{}
	err := s.store.Update(func(cp *checkpoint.Checkpoint) error {
		clear(moved)
		for _, uid := range done {
			if c, ok := cp.Claims[uid]; ok {
				for _, ibdev := range movedDevices(v, c) {
					moved[ibdev] = c.Namespace + "/" + c.Name
				}
			}
			delete(cp.Claims, uid)
		}
		return nil
	})
	if err != nil {
		moved = nil // still recorded: the kubelet asks again
		for _, uid := range done {
			results[types.UID(uid)] = fmt.Errorf("claim %s: updating the checkpoint: %w", uid, err)
		}
	}
	klog.FromContext(ctx).V(4).Info("Unprepared claims", "count", len(done))
	return results, moved, nil
}

// claimLocks are a mutex per claim key, made on first use and dropped when
// nobody holds or waits for it.
type claimLocks struct {
	mu    sync.Mutex
	locks map[string]*claimLock
}

type claimLock struct {
	mu    sync.Mutex
	users int // holders and waiters; guarded by claimLocks.mu
}

// lock takes the locks of keys, in sorted order (two calls with
// overlapping claims cannot deadlock), and returns their unlock.
func (l *claimLocks) lock(keys []string) (unlock func()) {
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	held := make([]*claimLock, len(keys))
	for i, k := range keys {
		held[i] = l.acquire(k)
		held[i].mu.Lock()
	}
	return func() {
		for i := len(keys) - 1; i >= 0; i-- {
			held[i].mu.Unlock()
			l.release(keys[i], held[i])
		}
	}
}

func (l *claimLocks) acquire(key string) *claimLock {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.locks == nil {
		l.locks = map[string]*claimLock{}
	}
	c := l.locks[key]
	if c == nil {
		c = &claimLock{}
		l.locks[key] = c
	}
	c.users++
	return c
}

func (l *claimLocks) release(key string, c *claimLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.users--; c.users == 0 {
		delete(l.locks, key)
	}
}

// reservations are the claims being prepared in this process, between the
// check of their devices and their record in the checkpoint: the check
// and the reserve are one step under mu, which guards nothing else and is
// never held across I/O.
type reservations struct {
	mu     sync.Mutex
	claims map[string]checkpoint.Claim // by UID
}

// reserve reserves c's devices, unless a claim of cp or one in flight
// holds one.
func (r *reservations) reserve(c checkpoint.Claim, cp checkpoint.Checkpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	inFlight := make([]checkpoint.Claim, 0, len(r.claims))
	for _, uid := range sortedKeys(r.claims) {
		inFlight = append(inFlight, r.claims[uid])
	}
	if err := holderError(c, cp, inFlight); err != nil {
		return err
	}
	if r.claims == nil {
		r.claims = map[string]checkpoint.Claim{}
	}
	r.claims[c.UID] = c
	return nil
}

func (r *reservations) release(claims []checkpoint.Claim) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range claims {
		delete(r.claims, c.UID)
	}
}
