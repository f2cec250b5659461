package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// specExt is the extension of the files WriteClaim writes: they are
	// JSON, which the CDI library (a YAML 1.2 parser) reads.
	specExt = ".json"
	// legacyExt is the CDI library's other extension. Files of ours with
	// it are still found and removed, so that a claim never has two files
	// (the runtime would drop the devices they both define).
	legacyExt = ".yaml"
	// tmpExt ends temporary files: the CDI cache and its watcher ignore
	// anything not ending in .json or .yaml.
	tmpExt   = ".tmp"
	fileMode = 0o644
	dirMode  = 0o755
)

// specPrefix starts the name of every per-claim spec file of ours; the
// claim UID follows it.
var specPrefix = cdiapi.GenerateTransientSpecName(Vendor, Class, "")

// SpecDir is a CDI spec directory holding one transient spec file per
// claim, named cdi.GenerateTransientSpecName(Vendor, Class, claimUID) +
// ".json".
//
// Files hold CDI version cdispec.MinimumRequiredVersion of their content,
// which for the edits of this package is 0.5.0 (device nodes with hostPath,
// and device names that start with a digit, as claim UIDs do): the lowest
// version that carries them, so runtimes with older CDI libraries read
// them too.
//
// A SpecDir holds no state besides its path: it is safe for concurrent use,
// and several SpecDirs on one directory do not interfere. Concurrent writes
// of one claim leave one of the versions, whole.
type SpecDir struct {
	dir string
}

// NewSpecDir returns a SpecDir for dir; "" means the CDI library's dynamic
// directory, /var/run/cdi. It touches nothing on disk.
func NewSpecDir(dir string) *SpecDir {
	if dir == "" {
		dir = cdiapi.DefaultDynamicDir
	}
	return &SpecDir{dir: filepath.Clean(dir)}
}

// Dir is the directory's path.
func (d *SpecDir) Dir() string { return d.dir }

// Path is the path of claimUID's spec file, whether or not it exists.
func (d *SpecDir) Path(claimUID string) string {
	return filepath.Join(d.dir, cdiapi.GenerateTransientSpecName(Vendor, Class, claimUID)+specExt)
}

// ClaimDevice is one CDI device of a claim's spec file.
type ClaimDevice struct {
	// Name is the device name, built with DeviceName.
	Name string
	// Edits are what the device adds to a container, from DeviceEdits.
	// They must not be empty.
	Edits cdispec.ContainerEdits
}

// WriteClaim writes claimUID's spec file: common as the spec-level edits
// (applied once when any device of the claim is injected) and devices,
// sorted by name. Rewriting a claim replaces its file, so WriteClaim is
// idempotent. The directory is created if missing: /var/run is a tmpfs
// that a reboot empties, and runtimes do not create it.
//
// Before anything is written the spec goes through the checks the CDI
// library's reader (cdi.ReadSpec) makes after parsing: version, vendor,
// class, device names, edits, no empty device. They run on the spec in
// memory: reading the file back and parsing it again (YAML) cost more than
// writing it, and the JSON of a cdispec.Spec parses back to the same spec
// (TestWrittenSpecsReadBack reads every accepted spec with cdi.ReadSpec).
// WriteClaim also refuses what the library lets through but would go wrong
// later: duplicate names, relative device paths, character or block nodes
// without a major number (the runtime would stat the host node).
//
// The write is atomic (atomicfile.Write: a temporary file in the same
// directory, renamed over the spec) but not fsynced: a spec is derived
// state, which the driver rewrites from its checkpoint at every start, and
// the CDI dir is usually a tmpfs that a reboot empties anyway. The
// library's Cache.WriteSpec is not used because it creates files 0600;
// files here are 0644. A failed write leaves no temporary file and the old
// file, if any, in place.
func (d *SpecDir) WriteClaim(claimUID string, common cdispec.ContainerEdits, devices []ClaimDevice) error {
	if err := checkClaimUID(claimUID); err != nil {
		return err
	}
	path := d.Path(claimUID)
	spec, err := buildSpec(common, devices)
	if err == nil {
		err = validateAsCDI(spec)
	}
	if err != nil {
		return fmt.Errorf("CDI spec %s for claim %s: %w", path, claimUID, err)
	}
	data, err := marshalSpec(spec)
	if err != nil {
		return fmt.Errorf("CDI spec %s for claim %s: %w", path, claimUID, err)
	}
	if err := os.MkdirAll(d.dir, dirMode); err != nil {
		return fmt.Errorf("CDI spec dir: %w", err)
	}
	err = atomicfile.Write(path, data,
		atomicfile.WithMode(fileMode),
		atomicfile.WithTempPattern(tempPattern(path)),
		atomicfile.WithoutSync())
	if err != nil {
		return fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	legacy := strings.TrimSuffix(path, specExt) + legacyExt
	switch err := os.Remove(legacy); {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("CDI spec for claim %s: removing the old %s: %w", claimUID, legacy, err)
	}
	return nil
}

// tempPattern names WriteClaim's temporary files for the spec file at path
// (see atomicfile.WithTempPattern): hidden, "."+base+"."+random+".tmp",
// which RemoveClaim matches when it cleans up after a crash.
func tempPattern(path string) string {
	return "." + filepath.Base(path) + ".*" + tmpExt
}

// RemoveClaim removes claimUID's spec file, and any temporary file a crash
// left behind for it. A missing file or directory is success.
func (d *SpecDir) RemoveClaim(claimUID string) error {
	if err := checkClaimUID(claimUID); err != nil {
		return err
	}
	base := filepath.Base(d.Path(claimUID))
	names := []string{base, strings.TrimSuffix(base, specExt) + legacyExt}
	entries, err := os.ReadDir(d.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("CDI spec dir: %w", err)
	}
	for _, e := range entries {
		// What tempPattern makes.
		if n := e.Name(); strings.HasPrefix(n, "."+base+".") && strings.HasSuffix(n, tmpExt) {
			names = append(names, n)
		}
	}
	// No fsync of the directory, as for writes: a spec that comes back
	// after a crash (a CDI dir on disk) belongs to no prepared claim, and
	// the driver's sweep removes it.
	for _, n := range names {
		err := os.Remove(filepath.Join(d.dir, n))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing CDI spec of claim %s: %w", claimUID, err)
		}
	}
	return nil
}

// RemoveStaleTemps removes WriteClaim's temporary files (tempPattern's
// names, for any claim) last modified before olderThan, and returns the
// names it removed. A write killed between creating its temporary file and
// renaming it leaves one behind, which RemoveClaim would only find at the
// claim's unprepare. Younger files are spared: another daemon (a rolling
// update) may be writing them now. Other vendors' files are never touched.
func (d *SpecDir) RemoveStaleTemps(olderThan time.Time) ([]string, error) {
	return atomicfile.RemoveStale(d.dir, func(n string) bool {
		return strings.HasPrefix(n, "."+specPrefix) && strings.HasSuffix(n, tmpExt)
	}, olderThan)
}

// ClaimUIDs returns the UIDs of the claims that have a spec file in the
// directory, sorted: files named like WriteClaim's (or the same name
// ending in .yaml). The name carries our vendor and class, so other
// vendors' specs, which the driver must never touch, are not listed; files
// are not opened. A missing directory has no claims.
func (d *SpecDir) ClaimUIDs() ([]string, error) {
	entries, err := os.ReadDir(d.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("CDI spec dir: %w", err)
	}
	var uids []string
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		uid, ok := strings.CutPrefix(e.Name(), specPrefix)
		if !ok {
			continue
		}
		if u, ok := strings.CutSuffix(uid, specExt); ok {
			uid = u
		} else if u, ok := strings.CutSuffix(uid, legacyExt); ok {
			uid = u
		} else {
			continue
		}
		if uid != "" {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

// checkClaimUID refuses UIDs that would not come back from ClaimUIDs as
// they went in (GenerateTransientSpecName turns "/" into "_").
func checkClaimUID(uid string) error {
	if uid == "" || strings.ContainsAny(uid, "/\x00") {
		return fmt.Errorf("invalid claim UID %q for a CDI spec file name", uid)
	}
	return nil
}

// buildSpec assembles a claim's spec without touching the callers' slices.
func buildSpec(common cdispec.ContainerEdits, devices []ClaimDevice) (*cdispec.Spec, error) {
	if len(devices) == 0 {
		return nil, errors.New("no devices")
	}
	spec := &cdispec.Spec{Kind: Kind, ContainerEdits: common}
	if err := checkEdits(common); err != nil {
		return nil, fmt.Errorf("spec-level edits: %w", err)
	}
	sorted := slices.Clone(devices)
	slices.SortFunc(sorted, func(a, b ClaimDevice) int { return strings.Compare(a.Name, b.Name) })
	for i, dev := range sorted {
		if i > 0 && sorted[i-1].Name == dev.Name {
			return nil, fmt.Errorf("device %q given twice", dev.Name)
		}
		if err := checkEdits(dev.Edits); err != nil {
			return nil, fmt.Errorf("device %q: %w", dev.Name, err)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: dev.Name, ContainerEdits: dev.Edits})
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// checkEdits catches what the CDI library accepts but resolves at
// container creation from the host, or not at all.
func checkEdits(e cdispec.ContainerEdits) error {
	for _, n := range e.DeviceNodes {
		if n == nil {
			return errors.New("nil device node")
		}
		if !filepath.IsAbs(n.Path) || (n.HostPath != "" && !filepath.IsAbs(n.HostPath)) {
			return fmt.Errorf("device node %q (host %q): paths must be absolute", n.Path, n.HostPath)
		}
		if (n.Type == "c" || n.Type == "b") && n.Major == 0 {
			return fmt.Errorf("device node %s has no device number (major 0)", n.Path)
		}
	}
	return nil
}

// marshalSpec encodes a spec as indented JSON, with "<>&" left alone.
func marshalSpec(spec *cdispec.Spec) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(spec); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// validateAsCDI makes the checks cdi.ReadSpec makes of a parsed spec, with
// the library's own validators, so that a runtime loads what we write.
func validateAsCDI(spec *cdispec.Spec) error {
	err := func() error {
		if err := cdispec.ValidateVersion(spec); err != nil {
			return err
		}
		vendor, class := parser.ParseQualifier(spec.Kind)
		if err := parser.ValidateVendorName(vendor); err != nil {
			return err
		}
		if err := parser.ValidateClassName(class); err != nil {
			return err
		}
		if len(spec.Annotations) > 0 {
			// The library's annotation checks are internal to it; none of
			// our specs carries annotations.
			return errors.New("spec annotations are not supported")
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
			return err
		}
		for _, d := range spec.Devices {
			if err := parser.ValidateDeviceName(d.Name); err != nil {
				return fmt.Errorf("device %q: %w", d.Name, err)
			}
			if len(d.Annotations) > 0 {
				return fmt.Errorf("device %q: annotations are not supported", d.Name)
			}
			if emptyEdits(d.ContainerEdits) {
				return fmt.Errorf("device %q: empty device edits", d.Name)
			}
			if err := (&cdiapi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
				return fmt.Errorf("device %q: %w", d.Name, err)
			}
		}
		return nil
	}()
	if err != nil {
		return fmt.Errorf("rejected by the CDI library's validation: %w", err)
	}
	return nil
}

// emptyEdits is what the CDI library refuses as a device's edits.
func emptyEdits(e cdispec.ContainerEdits) bool {
	return len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Hooks) == 0 && len(e.Mounts) == 0 &&
		len(e.NetDevices) == 0 && e.IntelRdt == nil && len(e.AdditionalGIDs) == 0
}
