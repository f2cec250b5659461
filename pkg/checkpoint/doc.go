// Package checkpoint is the driver's on-disk record of prepared claims.
//
// Unprepare works from it alone after a restart (the claim may already be
// deleted from the API), and the driver compares it with the CDI specs to
// find stale ones. It must live on persistent storage, such as the plugin's
// directory under /var/lib/kubelet/plugins, never under /var/run/cdi, which
// is a tmpfs; BootID tells the driver when a reboot has emptied that.
//
// # On-disk format
//
//	{
//	  "version": 1,
//	  "checksum": "<sha256, hex, of the data value's bytes exactly as in the file>",
//	  "data": {
//	    "claims": {"<claim UID>": {"uid": ..., "devices": [...], ...}, ...}
//	  }
//	}
//
// The JSON names in the tags of Checkpoint, Claim and Device are the format.
// Claims are keyed, hence sorted, by UID, so equal checkpoints make equal
// files. The file is written mode 0600. Do not edit it by hand: the checksum
// covers the data bytes exactly, and a mismatch reads as corruption.
//
// # Compatibility
//
//   - Fields are only ever added, never renamed, retyped or given a new
//     meaning; a new field's zero value must mean what a file without it
//     meant.
//   - A file of an older release (fields missing) loads with zero values.
//   - A file of a newer release with the same version and unknown fields
//     loads. The next Save drops those fields, which is why an addition may
//     only be one whose absence is safe.
//   - A file with a higher version than this binary reads is an error
//     naming both versions, and the file is left alone: a downgrade across
//     a format change must not silently forget prepared claims.
//   - Every shape a commit ever wrote has a file in testdata/history that
//     the current code must load (TestLoadHistory).
//   - Version 0, the prototype's bare map of claims by UID (Go field names,
//     no envelope, no checksum), is migrated on Load; the next Save writes
//     the current version.
//
// # Corruption
//
// A file that does not parse, is truncated, or fails its checksum makes Load
// return an error wrapping ErrCorrupt and naming the file. The driver then
// calls Quarantine, which renames the file aside (never deletes it) for a
// human to look at, and starts with no prepared claims instead of
// crash-looping.
package checkpoint
