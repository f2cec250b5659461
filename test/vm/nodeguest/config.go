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
}

// ConfigEnv names the guest file holding the Config.
const ConfigEnv = "RDMA_DRA_VM_NODE_CONFIG"

// HelperEnv runs a helper instead of the tests: "uverbs-contexts" asks for
// $N verbs contexts on $UVERBS (a container of the host test runs it).
const HelperEnv = "RDMA_DRA_VM_HELPER"
