package node

// The containerd and kubelet configuration files.

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.Dir}, p...)...) }

// ContainerdSocket is containerd's socket as the host sees it.
func (n *Node) ContainerdSocket() string { return n.path("run", "containerd", "containerd.sock") }

func (n *Node) writeContainerdConfig(noPivotRoot bool, podCIDR string) error {
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "rdma-node",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": "/var/lib/cni/networks"}
  }]
}
`, podCIDR)
	if err := os.WriteFile(n.path("var-lib", "cni", "net.d", "10-rdma-node.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// Paths are as the node's mount namespace sees them.
	cfg := fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
# NRI would serve /run/nri: nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  # The sandbox's oom_score_adj -998 needs CAP_SYS_RESOURCE, which a
  # container-hosted test machine may lack: stay at containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
        NoPivotRoot = %t
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = "/var/lib/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, PauseImage, n.Bin.Runc, noPivotRoot, n.Bin.CNIDir)
	return os.WriteFile(n.path("etc", "containerd.toml"), []byte(cfg), 0o644)
}

func (n *Node) writeKubeletConfig(maxRestartPeriod time.Duration) error {
	// The kubelet's client: the API server through the namespace's proxy.
	ca, err := n.cp.ServingCA()
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["rdma-dra"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: ca}
	kc.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{Token: n.cp.Config.BearerToken}
	kc.Contexts["rdma-dra"] = &clientcmdapi.Context{Cluster: "rdma-dra", AuthInfo: "kubelet"}
	kc.CurrentContext = "rdma-dra"
	if err := clientcmd.WriteToFile(*kc, n.path("etc", "kubeconfig")); err != nil {
		return err
	}
	if err := os.WriteFile(n.path("etc", "resolv.conf"), []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: %s
# This machine has cgroups v1; the kubelet refuses them unless told.
failCgroupV1: false
failSwapOn: false
resolvConf: %s
# No eviction or image GC: the node runs on a test machine's disk, and
# the images are imported, not pulled.
evictionHard: {memory.available: "1Ki"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
containerLogMaxSize: 10Mi
`, n.IP, n.KubeletPort, n.cgroupRoot, n.path("etc", "resolv.conf"))
	if maxRestartPeriod > 0 {
		cfg += fmt.Sprintf("crashLoopBackOff: {maxContainerRestartPeriod: %s}\n", maxRestartPeriod)
	}
	return os.WriteFile(n.path("etc", "kubelet.yaml"), []byte(cfg), 0o644)
}
