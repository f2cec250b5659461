package checkpoint

import (
	"fmt"
	"slices"
	"time"
)

// Checkpoint is the set of claims the driver has prepared.
type Checkpoint struct {
	// Claims by claim UID; each Claim's UID equals its key. Load and Update
	// never hand out a nil map.
	Claims map[string]Claim `json:"claims"`
}

// Claim is one prepared claim: everything Unprepare and the recovery after
// a restart need, without asking the API server.
type Claim struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// PodClaimName is the claim's name in its pods' spec when a
	// ResourceClaimTemplate made it: the device metadata file's path in the
	// container depends on it, and a start-up rewrites that file.
	PodClaimName string `json:"podClaimName,omitempty"`
	// PodUIDs are the pods the claim was reserved for when prepared; for
	// information and grouping only, it is not kept up to date.
	PodUIDs []string `json:"podUIDs,omitempty"`
	// Network is how those pods reach the network: "host", "pod" or
	// "unknown" (see cdi.Network); empty in records written before it
	// existed, which then mean "host".
	Network string   `json:"network,omitempty"`
	Devices []Device `json:"devices,omitempty"`
	// BootID is the kernel's boot ID at prepare time. A different one
	// means the node rebooted, so the claim's CDI spec (on tmpfs) is gone
	// and must be rewritten.
	BootID string `json:"bootID,omitempty"`
	// PreparedAt is stored in UTC.
	PreparedAt time.Time `json:"preparedAt"`
}

// Device is one allocated device of a claim, as prepared.
// Process is what the containers of a device get beyond its nodes;
// embedded in Device, so its fields are Device's in the JSON.
type Process struct {
	// Memlock is the RLIMIT_MEMLOCK the hook gives the device's containers
	// ("unlimited" or a byte count), or "off" for no hook: the class's,
	// the claim's or the node's --memlock as prepare decided it. Empty in
	// records written before it existed, which mean the node's --memlock.
	Memlock string `json:"memlock,omitempty"`
	// ShmSizeMiB is HcaConfig.shmSizeMiB: the size of the container's
	// /dev/shm tmpfs; 0 for none.
	ShmSizeMiB int64 `json:"shmSizeMiB,omitempty"`
}

type Device struct {
	Request     string `json:"request"`           // request name, "request/subrequest" for a subrequest
	Pool        string `json:"pool"`              // ResourceSlice pool
	Device      string `json:"device"`            // DRA device name, e.g. mlx5-0
	IBDev       string `json:"ibdev"`             // kernel name, e.g. mlx5_0
	ShareID     string `json:"shareID,omitempty"` // empty unless the device is shared
	AdminAccess bool   `json:"adminAccess,omitempty"`
	// ManagementDevices and Env are the effective HcaConfig, kept so the
	// spec can be rewritten after a reboot without the claim.
	ManagementDevices bool `json:"managementDevices,omitempty"`
	Env               bool `json:"env,omitempty"`
	// Limits are the RDMA cgroup limits the claim consumed on a shared HCA;
	// nil when it asked for none.
	Limits *Limits `json:"limits,omitempty"`
	// PKey is HcaConfig.pkey as validated against the HCA's P_Key table;
	// nil when the claim asked for none.
	PKey *PKey `json:"pkey,omitempty"`
	// AddressFamily is HcaConfig.addressFamily; empty means Auto.
	AddressFamily string `json:"addressFamily,omitempty"`
	// MoveNetdev is HcaConfig.moveNetdev: where the HCA moves into the
	// pod's network namespace (exclusive netns mode), its netdevs go too.
	MoveNetdev bool `json:"moveNetdev,omitempty"`
	// Process is what the device's containers get beyond its nodes.
	Process
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// MovedHCA is the HCA as discovered at prepare, kept where the claim's
	// hook moves it into the pod's network namespace: while it is there the
	// host's sysfs does not list it, and a restarted daemon has only this to
	// publish it and rewrite the spec. Release 0.1.0 wrote hca.HCA's
	// untagged JSON here, which still loads (see HCA).
	MovedHCA *HCA `json:"movedHCA,omitempty"`
}

// PKey is a partition key and its index in the HCA's ports' tables. It is
// a type of its own, not hca.PKey, on purpose: its JSON is the on-disk
// format, which must not change when hca's types do (see HCA).
type PKey struct {
	Value uint16 `json:"value"`
	Index int    `json:"index"`
}

// Limits are a device's rdma.max values; 0 means not limited.
type Limits struct {
	HCAHandles int64 `json:"hcaHandles,omitempty"`
	HCAObjects int64 `json:"hcaObjects,omitempty"`
}

// clone returns a deep copy, with a non-nil Claims map, so the Store's copy
// and the callers' never share a map or slice.
func (cp Checkpoint) clone() Checkpoint {
	out := Checkpoint{Claims: make(map[string]Claim, len(cp.Claims))}
	for uid, c := range cp.Claims {
		c.PodUIDs = slices.Clone(c.PodUIDs)
		c.Devices = slices.Clone(c.Devices)
		for i := range c.Devices {
			c.Devices[i].CDIDeviceIDs = slices.Clone(c.Devices[i].CDIDeviceIDs)
			if k := c.Devices[i].PKey; k != nil {
				c.Devices[i].PKey = &PKey{Value: k.Value, Index: k.Index}
			}
			if l := c.Devices[i].Limits; l != nil {
				c.Devices[i].Limits = &Limits{HCAHandles: l.HCAHandles, HCAObjects: l.HCAObjects}
			}
			c.Devices[i].MovedHCA = c.Devices[i].MovedHCA.clone()
		}
		out.Claims[uid] = c
	}
	return out
}

// normalize makes cp what a Load of it will return: times in UTC without a
// monotonic reading. It checks that every claim is under its own UID.
func (cp *Checkpoint) normalize() error {
	if cp.Claims == nil {
		cp.Claims = map[string]Claim{}
	}
	for uid, c := range cp.Claims {
		if uid == "" || c.UID != uid {
			return fmt.Errorf("claim %s/%s is under key %q but has UID %q; they must be equal", c.Namespace, c.Name, uid, c.UID)
		}
		c.PreparedAt = c.PreparedAt.UTC()
		cp.Claims[uid] = c
	}
	return nil
}
