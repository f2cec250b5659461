package draplugin

// Bringing the disk back in line with the checkpoint, on the slow path: at
// start (New) a corrupt checkpoint is moved aside and the CDI specs of
// prepared claims are rewritten; at start and on every rescan tick the
// sweep removes the specs and temp files of claims that are not prepared.
// Nothing here runs inside a prepare or unprepare call.

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
func (d *Driver) quarantineCheckpoint(ctx context.Context, loadErr error, bootTime func() (time.Time, error)) error {
	logger := klog.FromContext(ctx)
	// Before the move: it keeps the mtime, but the file is then elsewhere.
	modified, booted, earlier, why := writtenBeforeBoot(d.store.Path(), bootTime)
	moved, err := d.store.Quarantine()
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
	d.metrics.backgroundErrors.WithLabelValues("checkpoint").Inc()
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

// staleTempAge is how old a CDI spec's temporary file must be before the
// sweep removes it: a write takes milliseconds, and another daemon's write
// may be under way during a rolling update.
const staleTempAge = 10 * time.Second

// sweepSpecs removes the CDI specs of claims that are not prepared (a crash
// between writing a spec and the checkpoint leaves one). It runs at start
// and on every rescan tick, on the slow path.
func (d *Driver) sweepSpecs(ctx context.Context, now time.Time) {
	logger := klog.FromContext(ctx)
	cp, err := d.store.Load()
	if err != nil {
		return // New reported it
	}
	uids, err := d.specs.ClaimUIDs()
	if err != nil {
		logger.Error(err, "Listing CDI specs")
		return
	}
	temps, err := d.specs.RemoveStaleTemps(now.Add(-staleTempAge))
	for _, name := range temps {
		logger.Info("Removed the temporary file of a CDI spec write that never finished", "file", name)
	}
	if err != nil {
		logger.Error(err, "Removing stale CDI temporary files")
		d.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
	}
	for _, uid := range uids {
		if _, ok := cp.Claims[uid]; ok || slices.Contains(d.cfg.PreserveSpecs, uid) || d.orphanSpecs[uid] {
			continue
		}
		fi, err := os.Stat(d.specs.Path(uid))
		if err == nil && now.Sub(fi.ModTime()) < staleSpecAge {
			continue
		}
		if err := d.specs.RemoveClaim(uid); err != nil {
			logger.Error(err, "Removing the CDI spec of a claim that is not prepared", "claimUID", uid)
			d.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
			continue
		}
		logger.Info("Removed CDI spec of a claim that is not prepared", "claimUID", uid)
	}
	if d.meta.dataDir == "" {
		return
	}
	removed, err := d.meta.sweep(cp, now, staleSpecAge)
	for _, path := range removed {
		logger.Info("Removed a device metadata file of no prepared claim, or left by a write that never finished", "path", path)
	}
	if err != nil {
		logger.Error(err, "Sweeping device metadata files")
		d.metrics.backgroundErrors.WithLabelValues("metadata").Inc()
	}
}

// recoverSpecs rewrites the CDI specs of prepared claims: /var/run/cdi is a
// tmpfs that a reboot empties while the kubelet still has them prepared.
func (d *Driver) recoverSpecs(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	cp, err := d.store.Load()
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rewriteSpecsLocked(logger, cp, func(checkpoint.Claim) bool { return true })
	return nil
}

// rewriteSpecsLocked rewrites the CDI specs of the prepared claims that
// match. A failure is logged and counted, and the checkpoint entry stays:
// unprepare must still work.
func (d *Driver) rewriteSpecsLocked(logger klog.Logger, cp checkpoint.Checkpoint, match func(checkpoint.Claim) bool) {
	all := slices.Collect(maps.Values(cp.Claims))
	for _, uid := range sortedKeys(cp.Claims) {
		claim := cp.Claims[uid]
		if !match(claim) {
			continue
		}
		if err := d.writeSpecLocked(claim, d.groupLocked(claim, all)); err != nil {
			logger.Error(err, "Cannot rewrite the CDI spec of a prepared claim", "claim", claim.Namespace+"/"+claim.Name, "claimUID", uid)
			d.metrics.backgroundErrors.WithLabelValues("cdi").Inc()
			continue
		}
		// Derived like the spec, and written without fsync: a reboot or
		// an inventory change rewrites it here.
		if _, err := d.writeMetadataLocked(claim); err != nil {
			logger.Error(err, "Cannot rewrite the device metadata of a prepared claim", "claim", claim.Namespace+"/"+claim.Name, "claimUID", uid)
			d.metrics.backgroundErrors.WithLabelValues("metadata").Inc()
		}
	}
}
