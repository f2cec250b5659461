// Package cdi turns RDMA HCAs into CDI (Container Device Interface) container
// edits and keeps one transient CDI spec file per prepared claim.
//
// It knows HCAs (package hca) and the CDI library, not Kubernetes: a claim is
// just a UID string here. The flow is
//
//	edits, err := cdi.DeviceEdits(h, opts)            // per HCA of the claim
//	common := cdi.CommonEdits(inv.RDMACM, group, opts) // once per claim
//	err = specs.WriteClaim(uid, common, []cdi.ClaimDevice{{Name: cdi.DeviceName(uid, dev, share), Edits: edits}})
//	// hand cdi.QualifiedName(name) to the kubelet as the CDI device ID
//
// The kubelet passes the IDs to the runtime, which loads every spec file of
// its CDI directories (containerd and CRI-O use this same CDI library),
// calls Cache.InjectDevices and so applies, for each injected device, the
// spec-level edits once per spec file plus the device's own edits.
//
// What callers may rely on:
//
//   - Device nodes are fully specified (type, major, minor, mode): the
//     runtime never needs to stat the host node, so a simulated node whose
//     /dev holds plain files works, and numbers always come from sysfs.
//   - Per-HCA variables (RDMA_DEVICE_<IBDEV>) never collide between claims.
//     Aggregate variables (RDMA_DEVICES, NCCL_IB_HCA, ...) do: the runtime
//     keeps the last value it applies, so every claim a container uses must
//     carry the same aggregate values. That is why CommonEdits takes the
//     group of HCAs the container sees, not just the claim's own.
//   - Output is deterministic: the same inputs give byte-identical files.
package cdi
