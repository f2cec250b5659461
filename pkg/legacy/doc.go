// Package legacy serves the extended resource rdma/hca through the kubelet's
// device-plugin API (v1beta1), so manifests written for Alibaba ACK's
// ack-rdma-device-plugin keep working next to the DRA driver:
//
//	resources:
//	  limits:
//	    rdma/hca: 1
//
// As with that plugin, the node advertises Shares device IDs (1000 by
// default, shown as "rdma/hca: 1k") and a container given any number of them
// gets ALL of the node's usable HCAs: every /dev/infiniband/uverbsN plus
// /dev/infiniband/rdma_cm, shared with every other such container. The IDs
// are tickets, not devices; they only bound how many containers the
// scheduler puts on the node. That is why this route is valid only with
// --sharing=shared, see ValidateMode.
//
// The flow in the daemon is
//
//	p, err := legacy.New(legacy.Config{DevicePluginDir: "/var/lib/kubelet/device-plugins", CDI: specs, EditOptions: opts})
//	err = p.Update(inv)  // after every discovery pass
//	err = p.Run(ctx)     // serves and (re-)registers until ctx ends
//
// What callers may rely on:
//
//   - One source of truth: Update computes the container edits once, with
//     package cdi (DeviceEdits of every usable HCA, CommonEdits over all of
//     them), and writes them as one node-wide CDI device, DeviceName
//     ("rdma.dra.dev/hca=all"). Allocate hands out that CDI device and, for
//     runtimes without CDI, the same device nodes as DeviceSpecs and the
//     same variables as Envs. A runtime that applies both ends up with the
//     same container: CDI injection replaces a device node of the same path
//     and sets the same values.
//     With Config.Hooks (the hostNetwork check, default limits, memlock) Allocate
//     answers with the CDI device alone: the hooks ride on it, and nodes
//     handed to the runtime directly would skip them.
//   - The spec file is written through cdi.SpecDir.WriteClaim under the
//     pseudo claim UID SpecUID, so it is atomic, checked by the CDI library
//     and deterministic, and it is rewritten only when its content changes.
//     A DRA driver sharing the directory must leave SpecUID alone when it
//     removes the specs of unknown claims; should the file vanish anyway,
//     the next Update or Allocate writes it again.
//   - Health is all or nothing: every ID is Healthy while at least one
//     usable HCA has an ACTIVE port, and Unhealthy otherwise, including
//     before the first Update.
//   - Run survives kubelet restarts: it polls the device-plugin directory
//     and, when kubelet.sock is recreated or its own socket removed, serves
//     on a fresh socket and registers again.
package legacy
