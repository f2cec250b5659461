package devices

import (
	"strconv"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// Metadata is what a container is told about one prepared HCA through the
// device metadata file (KEP-5304): every attribute the driver knows, those
// of its ResourceSlice (what the scheduler selected on) and those kept out
// of it (identity and diagnostics, see inSlice), plus what only matters at
// run time, each under the driver's domain:
//
//	uverbs                 /dev/infiniband/uverbs3, the node libibverbs opens
//	port<N>State           ACTIVE, DOWN, ...        (every port, not only the first)
//	port<N>PhysState       LinkUp, Polling, ...
//	port<N>LinkLayer       InfiniBand or Ethernet
//	port<N>RateGbps        the rate as the kernel reports it ("2.5" for SDR 1X)
//	port<N>Lid             InfiniBand ports only
//	port<N>RoceGidIndex    the host's RoCE v2 GID index, when it has one
//	port<N>Gid<I>          each non-empty GID, as the kernel prints it,
//	port<N>Gid<I>Type      its type ("RoCE v2"), when readable,
//	port<N>Gid<I>Netdev    and its netdev, when it has one
//	shareID                the share of a shared HCA
//
// The GID table is the one at prepare time: a pod on its own network gets
// its address's GIDs only once its network is set up.
//
// Keys are qualified names ("rdma.dra.dev/uverbs"), as the helper's
// kubeletplugin.DeviceMetadata takes them.
func Metadata(h hca.HCA, netns hca.NetnsMode, shareID string, opts Options) map[string]resourceapi.DeviceAttribute {
	out := map[string]resourceapi.DeviceAttribute{}
	for k, v := range newMapper(opts.driverName(), netns).deviceAttributes(&h, true) {
		out[string(k)] = v
	}
	domain := opts.driverName() + "/"
	put := func(name, v string) {
		if v != "" {
			v = truncate(v, resourceapi.DeviceAttributeMaxValueLength)
			out[domain+name] = resourceapi.DeviceAttribute{StringValue: &v}
		}
	}
	putInt := func(name string, v int64) {
		out[domain+name] = resourceapi.DeviceAttribute{IntValue: &v}
	}
	if h.Uverbs != nil {
		put("uverbs", "/dev/infiniband/"+h.Uverbs.Name)
	}
	for _, p := range h.Ports {
		port := "port" + strconv.Itoa(p.Number)
		put(port+"State", p.State)
		put(port+"PhysState", p.PhysState)
		put(port+"LinkLayer", string(p.LinkLayer))
		if p.RateGbps > 0 {
			put(port+"RateGbps", strconv.FormatFloat(p.RateGbps, 'f', -1, 64))
		}
		if p.LinkLayer == hca.LinkLayerInfiniBand {
			putInt(port+"Lid", int64(p.LID))
		}
		if p.RoCEv2GIDIndex >= 0 {
			putInt(port+"RoceGidIndex", int64(p.RoCEv2GIDIndex))
		}
		for _, g := range p.GIDs {
			gid := port + "Gid" + strconv.Itoa(g.Index)
			put(gid, g.GID)
			put(gid+"Type", g.Type)
			put(gid+"Netdev", g.Netdev)
		}
	}
	put("shareID", shareID)
	return out
}

// LegacyMetadata is the metadata of the legacy device, which stands for
// every usable HCA: hcas (their number) and, for each in order,
// hca<I> (the ibdev) and hca<I>Uverbs (its device node).
func LegacyMetadata(hcas []hca.HCA, opts Options) map[string]resourceapi.DeviceAttribute {
	domain := opts.driverName() + "/"
	n := int64(len(hcas))
	out := map[string]resourceapi.DeviceAttribute{domain + "hcas": {IntValue: &n}}
	for i, h := range hcas {
		name, key := h.Name, domain+"hca"+strconv.Itoa(i)
		out[key] = resourceapi.DeviceAttribute{StringValue: &name}
		if h.Uverbs != nil {
			path := "/dev/infiniband/" + h.Uverbs.Name
			out[key+"Uverbs"] = resourceapi.DeviceAttribute{StringValue: &path}
		}
	}
	return out
}
