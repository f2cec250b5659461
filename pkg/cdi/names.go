package cdi

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// The CDI kind of every device this driver hands out.
const (
	Vendor = "rdma.dra.dev"
	Class  = "hca"
	Kind   = Vendor + "/" + Class
)

// DeviceName is the CDI device name of one device of a claim:
// "<claimUID>-<device>", or "<claimUID>-<device>-<shareID>" when shareID is
// set. It is deterministic, so a restarted driver rebuilds the names the
// kubelet already holds.
//
// Names of different claims never clash because a claim UID has a fixed
// shape (a UUID); devices of one claim differ in device or share ID. Two
// claims' specs defining one name would make the runtime drop the device
// from both.
//
// The result is always a valid CDI device name. Inputs as Kubernetes makes
// them (UUIDs, DNS-label device names) come out unchanged. Anything else
// (characters CDI does not allow, empty parts, a leading or trailing
// separator) is replaced by "_" and a hash of the raw inputs is appended,
// so different inputs still get different names (a 48-bit hash: a clash
// is not a practical concern).
func DeviceName(claimUID, device, shareID string) string {
	parts := []string{claimUID, device}
	if shareID != "" {
		parts = append(parts, shareID)
	}
	name := strings.Join(parts, "-")
	clean := claimUID != "" && device != "" && parser.ValidateDeviceName(name) == nil
	if clean {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		if !parser.IsAlphaNumeric(rune(c)) && !strings.ContainsRune("_-.:", rune(c)) {
			b[i] = '_'
		}
	}
	if len(b) == 0 || !parser.IsAlphaNumeric(rune(b[0])) {
		b = append([]byte("x"), b...)
	}
	sum := sha256.Sum256([]byte(claimUID + "\x00" + device + "\x00" + shareID))
	return string(b) + "-" + hex.EncodeToString(sum[:6])
}

// QualifiedName is the fully qualified CDI device ID of a device name, as
// the kubelet hands it to the runtime: "rdma.dra.dev/hca=<name>".
func QualifiedName(name string) string {
	return parser.QualifiedName(Vendor, Class, name)
}
