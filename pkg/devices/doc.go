// Package devices is the attribute contract of the driver: the one mapping
// from discovered HCAs (package hca) to resource.k8s.io/v1 devices.
//
// Everything a DeviceClass or a ResourceClaim can select on is decided here
// and documented in docs/attributes.md; a change to one is a change to both
// (a test checks that every attribute name is in the document). The daemon
// publishes [Resources] through kubeletplugin.Helper.PublishResources and
// `rdmactl discover -o yaml` prints [ResourceSlices]; both build their
// devices with [Devices], so what rdmactl shows is what the scheduler sees.
//
// The mapping is pure and deterministic: it reads nothing but its arguments
// (no sysfs, no clock), sorts its output, and gives the same result for the
// same HCAs in any order. It runs on the slow path only (start and rescans),
// never while a claim is prepared.
package devices
