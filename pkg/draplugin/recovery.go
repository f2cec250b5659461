package draplugin

// Bringing the disk back in line with the checkpoint and the inventory, on
// the slow path: at start (New) a corrupt checkpoint is moved aside and the
// CDI specs of prepared claims are rewritten; a new view rewrites the specs
// that depend on what changed; at start and on every rescan tick the sweep
// removes the specs and temp files of claims that are not prepared. Only
// rewriteLocked also runs in a prepare, for its own claims when a rescan
// changed the inventory meanwhile.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// quarantineCheckpoint moves the unreadable checkpoint aside (for a human
// to inspect) and says so. The checkpoint is not fsynced
// (checkpoint.BootScoped), so a power loss may leave it empty or truncated;
// then it was last written before this boot, and its claims would have been
// discarded at start anyway (discardPreviousBoot): nothing is lost, which is
// said at info level and not counted as an error. One written during this
// boot lost claims that may be in use: an error, counted in
// background_errors_total{kind="checkpoint"}. So is one whose age cannot be
// told.
func (s *claimState) quarantineCheckpoint(ctx context.Context, loadErr error, bootTime func() (time.Time, error)) error {
	logger := klog.FromContext(ctx)
	// Before the move: it keeps the mtime, but the file is then elsewhere.
	modified, booted, earlier, why := writtenBeforeBoot(s.store.Path(), bootTime)
	moved, err := s.store.Quarantine()
	if err != nil {
		return fmt.Errorf("%v; moving it aside failed too: %w", loadErr, err)
	}
	if earlier {
		logger.Info("Checkpoint of an earlier boot is unreadable, as a power loss may leave it (it is not fsynced); moved it aside and starting with no prepared claims. Nothing is lost: the node rebooted since, and an earlier boot's claims are discarded anyway; the kubelet prepares again those of pods still on this node",
			"movedTo", moved, "modified", modified.UTC().Format(time.RFC3339), "bootTime", booted.UTC().Format(time.RFC3339), "reason", loadErr.Error())
		return nil
	}
	kv := []any{"movedTo", moved}
	if why != nil {
		kv = append(kv, "notFromAnEarlierBoot", why.Error())
	} else {
		kv = append(kv, "modified", modified.UTC().Format(time.RFC3339), "bootTime", booted.UTC().Format(time.RFC3339))
	}
	logger.Error(loadErr, "Checkpoint is corrupt; moved it aside and starting with no prepared claims", kv...)
	s.metrics.backgroundErrors.WithLabelValues("checkpoint").Inc()
	return nil
}

// writtenBeforeBoot tells whether the file at path was last modified before
// the node booted. why says what kept it from telling (earlier is then
// false).
func writtenBeforeBoot(path string, bootTime func() (time.Time, error)) (modified, booted time.Time, earlier bool, why error) {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}, time.Time{}, false, err
	}
	booted, err = bootTime()
	if err != nil {
		return fi.ModTime(), time.Time{}, false, err
	}
	return fi.ModTime(), booted, fi.ModTime().Before(booted), nil
}

// staleSpecAge is how old a CDI spec of a claim the checkpoint does not
// know must be before it is removed. A prepare writes the spec before the
// checkpoint, and during a rolling update the other daemon may be between
// the two.
const staleSpecAge = time.Minute

// staleTempAge is how old the temporary file of a CDI spec or checkpoint
// write must be before the sweep removes it: a write takes milliseconds,
// and another daemon's write may be under way during a rolling update.
const staleTempAge = 10 * time.Second

// sweep is the one sweep of what no prepared claim owns: the CDI specs of
// claims that are not prepared (a crash between writing a spec and the
// checkpoint leaves one), their metadata files, and the temporary files of
// writes that never finished. It runs at start and on every rescan tick,
// on the slow path.
func (s *claimState) sweep(ctx context.Context, now time.Time) {
	logger := klog.FromContext(ctx)
	cp, err := s.store.Load()
	if err != nil {
		return // New reported it
	}
	uids, err := s.specs.ClaimUIDs()
	if err != nil {
		logger.Error(err, "Listing CDI specs")
		return
	}
	for _, temps := range []struct {
		kind   string
		remove func(time.Time) ([]string, error)
	}{{"cdi", s.specs.RemoveStaleTemps}, {"checkpoint", s.store.RemoveStaleTemps}} {
		names, err := temps.remove(now.Add(-staleTempAge))
		for _, name := range names {
			logger.Info("Removed the temporary file of a write that never finished", "kind", temps.kind, "file", name)
		}
		if err != nil {
			logger.Error(err, "Removing stale temporary files", "kind", temps.kind)
			s.metrics.backgroundErrors.WithLabelValues(temps.kind).Inc()
		}
	}
	for _, uid := range uids {
		if _, ok := cp.Claims[uid]; ok || slices.Contains(s.cfg.PreserveSpecs, uid) || s.orphanSpecs[uid] {
			continue
		}
		fi, err := os.Stat(s.specs.Path(uid))
		if err == nil && now.Sub(fi.ModTime()) < staleSpecAge {
			continue
		}
		if err := s.specs.RemoveClaim(uid); err != nil {
			logger.Error(err, "Removing the CDI spec of a claim that is not prepared", "claimUID", uid)
			s.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
			continue
		}
		logger.Info("Removed CDI spec of a claim that is not prepared", "claimUID", uid)
	}
	if s.meta.dataDir == "" {
		return
	}
	removed, err := s.meta.sweep(cp, now, staleSpecAge)
	for _, path := range removed {
		logger.Info("Removed a device metadata file of no prepared claim, or left by a write that never finished", "path", path)
	}
	if err != nil {
		logger.Error(err, "Sweeping device metadata files")
		s.metrics.backgroundErrors.WithLabelValues("metadata").Inc()
	}
}

// keepOrphanSpecs keeps the CDI specs found beside a corrupt checkpoint
// until their claims are unprepared.
func (s *claimState) keepOrphanSpecs(ctx context.Context) error {
	uids, err := s.specs.ClaimUIDs()
	if err != nil {
		return fmt.Errorf("listing CDI specs: %w", err)
	}
	s.orphanSpecs = map[string]bool{}
	for _, uid := range uids {
		s.orphanSpecs[uid] = true
	}
	if len(uids) > 0 {
		klog.FromContext(ctx).Info("Keeping the CDI specs found beside the corrupt checkpoint: running pods may restart containers with them; each goes when the kubelet unprepares its claim", "specs", len(uids))
	}
	return nil
}

// recoverSpecs rewrites the CDI specs of prepared claims: /var/run/cdi is a
// tmpfs that a reboot empties while the kubelet still has them prepared.
func (s *claimState) recoverSpecs(ctx context.Context) error {
	if _, err := s.store.Load(); err != nil {
		return err
	}
	s.rewriteSpecs(ctx, s.current(), func(checkpoint.Claim) bool { return true })
	return nil
}

// inventoryChanged rewrites the specs that depend on what changed from old
// to cur: the publisher calls it for every new view.
func (s *claimState) inventoryChanged(ctx context.Context, old, cur *view) {
	if s.cfg.LegacyShares > 0 {
		s.refreshNodeWideSpecs(ctx, cur)
	}
	if old.inv.NetnsMode != cur.inv.NetnsMode {
		s.netnsModeChanged(ctx, old, cur)
	}
}

// refreshNodeWideSpecs rewrites the CDI specs of prepared claims that stand
// for "every HCA of the node" (the legacy device), and of the claims
// sharing a pod with them: an HCA added since the prepare is in a restarted
// container, and a vanished one no longer makes the runtime fail on a
// missing device node.
func (s *claimState) refreshNodeWideSpecs(ctx context.Context, v *view) {
	cp, err := s.store.Load()
	if err != nil {
		return // New reported it; the next successful load retries
	}
	var nodeWide []checkpoint.Claim
	for _, c := range cp.Claims {
		if slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool { return s.cfg.isLegacy(dev.Device) }) {
			nodeWide = append(nodeWide, c)
		}
	}
	s.rewriteSpecs(ctx, v, func(c checkpoint.Claim) bool {
		return slices.ContainsFunc(nodeWide, func(n checkpoint.Claim) bool { return n.UID == c.UID || sharesPod(c, n) })
	})
}

// rewriteSpecs rewrites, as v has the HCAs, the CDI specs of the prepared
// claims that match, each under its claim's lock and as the checkpoint
// has it then: a prepare or unprepare of the claim in flight goes first.
func (s *claimState) rewriteSpecs(ctx context.Context, v *view, match func(checkpoint.Claim) bool) {
	cp, err := s.store.Load()
	if err != nil {
		return // New reported it; the next successful load retries
	}
	for _, uid := range sortedKeys(cp.Claims) {
		if c := cp.Claims[uid]; match(c) {
			s.rewriteOne(ctx, v, c)
		}
	}
}

func (s *claimState) rewriteOne(ctx context.Context, v *view, c checkpoint.Claim) {
	defer s.locks.lock([]string{c.Namespace + "/" + c.Name})()
	cp, err := s.store.Load()
	if err != nil {
		return
	}
	if now, ok := cp.Claims[c.UID]; ok {
		s.rewriteLocked(klog.FromContext(ctx), v, []checkpoint.Claim{now})
	}
}

// rewriteLocked rewrites the CDI specs and metadata of prepared claims,
// whose locks the caller holds. A failure is logged and counted, and the
// checkpoint entry stays: unprepare must still work.
func (s *claimState) rewriteLocked(logger klog.Logger, v *view, claims []checkpoint.Claim) {
	cp, err := s.store.Load()
	if err != nil {
		return
	}
	all := slices.Collect(maps.Values(cp.Claims))
	for _, claim := range claims {
		if err := s.writeSpec(v, claim, group(s.cfg, v, claim, all), podLimitsOf(s.cfg, v, claim, all)); err != nil {
			logger.Error(err, "Cannot rewrite the CDI spec of a prepared claim", "claim", claim.Namespace+"/"+claim.Name, "claimUID", claim.UID)
			s.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
			continue
		}
		// Derived like the spec, and written without fsync: a reboot or
		// an inventory change rewrites it here.
		if _, err := s.writeMetadata(v, claim); err != nil {
			logger.Error(err, "Cannot rewrite the device metadata of a prepared claim", "claim", claim.Namespace+"/"+claim.Name, "claimUID", claim.UID)
			s.metrics.backgroundErrors.WithLabelValues("metadata").Inc()
		}
	}
}
