// Package nodeguest runs a real node inside test/vm's guest: containerd,
// runc and the kubelet of test/node on Debian's kernel, which has the rdma
// cgroup controller this machine's kernel lacks, registered with the
// control plane of the host test that booted the VM (TestVMNode). The host
// drives the cluster (the chart, claims, pods); the guest only keeps the
// node up until the host says it is done. Outside the VM every test skips.
package nodeguest

// Config is what the host test tells the guest, as JSON in ConfigEnv's file.
type Config struct {
	// Server is the host's API server as the guest reaches it
	// (https://10.0.2.2:<port>, QEMU's gateway to the host's loopback).
	Server string `json:"server"`
	// ServerName is the name its certificate is checked against (the
	// host's 127.0.0.1).
	ServerName string `json:"serverName"`
	CA         []byte `json:"ca"`
	Token      string `json:"token"`
	Node       string `json:"node"`
	// Images are OCI tarballs in the guest, imported into containerd.
	Images []string `json:"images"`
	// Done is the ConfigMap (default namespace) whose creation ends the node.
	Done string `json:"done"`
	// Link, when set, is the NIC of the private segment between two
	// guests, to be addressed and given an rxe before the node starts.
	Link *Link `json:"link,omitempty"`
	// SharedNetwork runs the node in the guest's own network namespace
	// (node.Options.SharedNetwork): hostNetwork pods then see Link.
	SharedNetwork bool `json:"sharedNetwork,omitempty"`
	// PodCIDR is the node's pod subnet (node.Options.PodCIDR); empty: the
	// node's default.
	PodCIDR string `json:"podCIDR,omitempty"`
}

// Link is a guest's NIC on the segment between the guests.
type Link struct {
	MAC     string `json:"mac"`     // finds the NIC, whatever the kernel named it
	Address string `json:"address"` // CIDR, e.g. 10.0.9.1/24
	Rxe     string `json:"rxe"`     // the Soft-RoCE device made on it
	// Routes reach the other guests' pod subnets over the link, as a
	// host-gw CNI routes them; the guest forwards IPv4 when there are any.
	Routes []Route `json:"routes,omitempty"`
}

// Route is a subnet and the link address of the guest that has it.
type Route struct {
	CIDR string `json:"cidr"`
	Via  string `json:"via"`
}

// ConfigEnv names the guest file holding the Config.
const ConfigEnv = "RDMA_DRA_VM_NODE_CONFIG"

// HelperEnv runs a helper instead of the tests: "uverbs-contexts" asks for
// $N verbs contexts on $UVERBS (a container of the host test runs it).
const HelperEnv = "RDMA_DRA_VM_HELPER"

// KernelFacts names the ConfigMap (default namespace) in which a guest with
// a Link publishes what its kernel says about the link's rxe, for the host
// to check the node's ResourceSlice against.
func KernelFacts(node string) string { return node + "-kernel" }
