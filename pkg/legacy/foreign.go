package legacy

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// LegacyDRA is the route where a DeviceClass's extendedResourceName serves
// rdma/hca.
const LegacyDRA = "dra"

// ForeignAdvertiser explains why node's allocatable resourceName, put
// there by a device plugin other than this daemon's, is a problem for the
// chosen route and sharing mode; "" when it is not. With the device-plugin
// route the resource is this daemon's own.
//
// During a migration the old plugin (ACK's, Mellanox's) may still run:
//   - with the DRA route the scheduler sends rdma/hca pods of that node to
//     the device plugin, not to the legacy DeviceClass;
//   - in exclusive mode its pods get every HCA, so a claim's HCA is not
//     the claim's alone.
func ForeignAdvertiser(node *corev1.Node, resourceName, route, sharing string) string {
	if node == nil || route == LegacyDevicePlugin {
		return ""
	}
	q, ok := node.Status.Allocatable[corev1.ResourceName(resourceName)]
	if !ok || q.IsZero() {
		return ""
	}
	switch {
	case route == LegacyDRA:
		return fmt.Sprintf("node %s advertises %s=%s from a device plugin: the scheduler gives %s pods on this node to that plugin, not to the DeviceClass with extendedResourceName; remove the old device plugin (docs/migration.md)",
			node.Name, resourceName, q.String(), resourceName)
	case sharing != SharingShared:
		return fmt.Sprintf("node %s advertises %s=%s from another device plugin, whose pods typically get every HCA: claims here are not exclusive while it runs; remove it (docs/migration.md) or run --sharing=shared",
			node.Name, resourceName, q.String())
	}
	return ""
}
