package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/rdma-dra/rdma-dra-driver/pkg/legacy"
)

// sharingMode is the value of --sharing, checked once by validateRoutes.
type sharingMode string

const (
	sharingExclusive sharingMode = "exclusive" // one claim per HCA
	sharingShared    sharingMode = legacy.SharingShared
)

// legacyMode is the value of --legacy: the one route, if any, that serves
// rdma/hca to old manifests. Checked once by validateRoutes.
type legacyMode string

const (
	legacyOff          legacyMode = legacy.LegacyOff
	legacyDevicePlugin legacyMode = legacy.LegacyDevicePlugin
	legacyDRA          legacyMode = legacy.LegacyDRA
)

// validateModes refuses combinations that would break the sharing
// invariant: no claim gets exclusive use of an HCA that is handed out shared.
func validateModes(o *options) error {
	if err := validateRoutes(o); err != nil {
		return err
	}
	return validatePolicy(o)
}

// validatePolicy checks the flags of the hostNetwork switch and the limits.
func validatePolicy(o *options) error {
	if o.defaultHCAHandles < 0 || o.defaultHCAObjects < 0 {
		return fmt.Errorf("--default-hca-handles=%d, --default-hca-objects=%d: want 0 or more", o.defaultHCAHandles, o.defaultHCAObjects)
	}
	if o.claimMaxPercent < 0 || o.claimMaxPercent > 100 {
		return fmt.Errorf("--claim-max-percent=%d: want 1 to 100 (0 or 100: a claim may ask for a whole HCA)", o.claimMaxPercent)
	}
	if !o.allowNonHostNetwork && !filepath.IsAbs(o.hookPath) {
		// Prepare sees only the pods a claim is reserved for at its first
		// prepare; the hook sees every container.
		return fmt.Errorf("--allow-non-host-network=false needs the hook (--hook-path=%q is not an absolute path): "+
			"every container that gets an HCA is checked by it when it starts", o.hookPath)
	}
	if v, err := o.memlockValue(); err != nil {
		return err
	} else if v != "" && !filepath.IsAbs(o.hookPath) {
		return fmt.Errorf("--memlock=%s needs the hook (--hook-path=%q is not an absolute path), which sets it for every container that gets an HCA; "+
			"install the hook or set --memlock=off (containers then keep the runtime's limit and need IPC_LOCK)", o.memlock, o.hookPath)
	}
	if o.requireHCALimits && o.legacyRoute != legacyOff && (o.defaultHCAHandles == 0 || o.defaultHCAObjects == 0) {
		return fmt.Errorf("--require-hca-limits with --legacy=%s needs --default-hca-handles and --default-hca-objects: rdma/hca pods cannot ask for limits", o.legacyRoute)
	}
	return nil
}

func validateRoutes(o *options) error {
	switch o.sharing {
	case sharingExclusive, sharingShared:
	default:
		return fmt.Errorf("--sharing=%q: want exclusive or shared", o.sharing)
	}
	if o.sharing == sharingShared && o.sharesPerHCA < 1 {
		return fmt.Errorf("--shares-per-hca=%d: want at least 1", o.sharesPerHCA)
	}
	if o.hcaHandlesPerHCA < 0 || o.hcaObjectsPerHCA < 0 {
		return fmt.Errorf("--hca-handles-per-hca=%d, --hca-objects-per-hca=%d: want 0 or more", o.hcaHandlesPerHCA, o.hcaObjectsPerHCA)
	}
	switch o.legacyRoute {
	case legacyOff:
		return nil
	case legacyDevicePlugin:
		return legacy.ValidateMode(string(o.legacyRoute), string(o.sharing))
	case legacyDRA:
		if o.sharing != sharingShared {
			return errors.New("--legacy=dra publishes one device that hands every HCA to every rdma/hca pod, so it needs --sharing=shared (the HCAs are shared); set --sharing=shared or use --legacy=off")
		}
		if o.legacyShares < 1 {
			return fmt.Errorf("--legacy-shares=%d: want at least 1", o.legacyShares)
		}
		return nil
	}
	return fmt.Errorf("--legacy=%q: want off, device-plugin or dra (one route only: a node must not advertise rdma/hca twice)", o.legacyRoute)
}
