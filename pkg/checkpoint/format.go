package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// currentVersion is the envelope version this code writes, and the highest
// it reads.
const currentVersion = 1

// ErrCorrupt is wrapped by Load's error when the file is unreadable as a
// checkpoint: not JSON, truncated, failing its checksum, or inconsistent.
// The file can then only be moved aside (see Store.Quarantine).
var ErrCorrupt = errors.New("corrupt checkpoint")

// encodeData is the data value as it goes into the file, indented to sit
// inside the envelope so a human can read the file.
func encodeData(cp Checkpoint) ([]byte, error) {
	return json.MarshalIndent(cp, "  ", "  ")
}

// encodeFile wraps data in the envelope. It is written by hand, not with
// encoding/json, so the data bytes land in the file exactly as hashed.
func encodeFile(data []byte) []byte {
	sum := sha256.Sum256(data)
	b := make([]byte, 0, len(data)+128)
	b = fmt.Appendf(b, "{\n  \"version\": %d,\n  \"checksum\": \"%x\",\n  \"data\": ", currentVersion, sum)
	b = append(b, data...)
	return append(b, "\n}\n"...)
}

// decodeFile reads a checkpoint file's contents. It returns the data bytes
// of a current-version file, nil for a migrated older one. Errors name
// path; all but a too-new version wrap ErrCorrupt.
func decodeFile(path string, b []byte) (Checkpoint, []byte, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%s: %w: %s", path, ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return Checkpoint{}, nil, corrupt("the file is empty")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return Checkpoint{}, nil, corrupt("not a JSON object (truncated?): %v", err)
	}
	if top == nil {
		return Checkpoint{}, nil, corrupt("not a JSON object, but null")
	}

	rawVersion, ok := top["version"]
	if !ok {
		if _, ok := top["checksum"]; ok {
			return Checkpoint{}, nil, corrupt(`it has a "checksum" but no "version"`)
		}
		if _, ok := top["data"]; ok {
			return Checkpoint{}, nil, corrupt(`it has "data" but no "version"`)
		}
		cp, err := migrate(0, b)
		if err != nil {
			return Checkpoint{}, nil, corrupt("version 0 (no envelope): %v", err)
		}
		if err := checkKeys(&cp); err != nil {
			return Checkpoint{}, nil, corrupt("%v", err)
		}
		return cp, nil, nil
	}

	var version int
	if err := json.Unmarshal(rawVersion, &version); err != nil {
		return Checkpoint{}, nil, corrupt(`"version" is %s, want an integer`, rawVersion)
	}
	// Before anything else: a newer version may hash or lay out data
	// differently, and must not be called corrupt (that would discard it).
	if version > currentVersion {
		return Checkpoint{}, nil, fmt.Errorf("%s: the checkpoint is format version %d, but this driver reads versions up to %d: it was written by a newer release; run that release, or move the file aside to start with no prepared claims", path, version, currentVersion)
	}
	if version < 1 {
		return Checkpoint{}, nil, corrupt(`"version" is %d; an envelope's version is at least 1`, version)
	}
	var sum string
	if err := json.Unmarshal(top["checksum"], &sum); err != nil || sum == "" {
		return Checkpoint{}, nil, corrupt(`"checksum" is missing or not a string`)
	}
	data := top["data"]
	if len(data) == 0 || string(data) == "null" {
		return Checkpoint{}, nil, corrupt(`"data" is missing`)
	}
	got := sha256.Sum256(data)
	if !strings.EqualFold(sum, hex.EncodeToString(got[:])) {
		return Checkpoint{}, nil, corrupt("checksum mismatch: the file records %s, its data hashes to %x", sum, got)
	}
	cp, err := migrate(version, data)
	if err != nil {
		return Checkpoint{}, nil, corrupt("data does not decode: %v", err)
	}
	if err := checkKeys(&cp); err != nil {
		return Checkpoint{}, nil, corrupt("%v", err)
	}
	return cp, data, nil
}

// checkKeys fills in a claim's missing UID from its key and rejects a
// claim filed under another UID or none.
func checkKeys(cp *Checkpoint) error {
	if cp.Claims == nil {
		cp.Claims = map[string]Claim{}
	}
	for uid, c := range cp.Claims {
		if uid == "" {
			return fmt.Errorf("claim %s/%s is under an empty key", c.Namespace, c.Name)
		}
		switch c.UID {
		case uid:
		case "":
			c.UID = uid
			cp.Claims[uid] = c
		default:
			return fmt.Errorf("the claim under key %q has UID %q", uid, c.UID)
		}
	}
	return nil
}

// migrate decodes the data of a file in format version into the current
// types. Each older layout keeps its own frozen types here, so changes to
// the current ones cannot break reading it.
func migrate(version int, raw json.RawMessage) (Checkpoint, error) {
	switch version {
	case 0:
		var claims map[string]claimV0
		if err := json.Unmarshal(raw, &claims); err != nil {
			return Checkpoint{}, err
		}
		cp := Checkpoint{Claims: make(map[string]Claim, len(claims))}
		for uid, old := range claims {
			c := Claim{UID: old.UID, Namespace: old.Namespace, Name: old.Name, PreparedAt: old.PreparedAt}
			for _, d := range old.Devices {
				c.Devices = append(c.Devices, Device{
					Request: d.Request, Pool: d.Pool, Device: d.Device, IBDev: d.IBDev,
					AdminAccess: d.AdminAccess, CDIDeviceIDs: d.CDIDeviceIDs,
					// The prototype always set the env hints and had no
					// management devices.
					Env: true,
				})
			}
			cp.Claims[uid] = c
		}
		return cp, nil
	case currentVersion:
		var cp Checkpoint
		err := json.Unmarshal(raw, &cp)
		return cp, err
	}
	return Checkpoint{}, fmt.Errorf("no migration from format version %d", version)
}

// claimV0 and deviceV0 are the prototype's records: written with
// json.Marshal(map[string]claimV0) of untagged structs, so with Go field
// names, no envelope and no checksum. The UID was sometimes left to the key.
type claimV0 struct {
	UID        string
	Namespace  string
	Name       string
	Devices    []deviceV0
	PreparedAt time.Time
}

type deviceV0 struct {
	Request      string
	Pool         string
	Device       string
	IBDev        string
	AdminAccess  bool
	CDIDeviceIDs []string
}
