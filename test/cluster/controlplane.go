// Package cluster runs a real Kubernetes 1.37 control plane in one process
// for the tests and `make demo`: an embedded etcd and kube-apiserver, the
// controllers and the scheduler. The node beside it is test/node's real
// kubelet, or none (tests that play the kubelet over the driver's sockets).
// Tests, `make demo` and a person with kubectl use the same code.
package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// TB is what the control plane needs from its caller: a *testing.T, or a
// Harness for commands.
type TB = ktesting.TB

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	Config *rest.Config
	Client kubernetes.Interface
	// Kubeconfig is a file a person can point kubectl at.
	Kubeconfig string

	etcd     *embed.Etcd
	teardown func()
}

// ControlPlaneOptions change the kube-apiserver for a real node.
type ControlPlaneOptions struct {
	// ServiceAccounts turns the ServiceAccount admission plugin on (pods
	// get a projected token, as in a real cluster); it needs
	// StartNodeControllers for the default ServiceAccount and the
	// kube-root-ca.crt ConfigMap.
	ServiceAccounts bool
	// ExtraFlags are appended to the kube-apiserver flags.
	ExtraFlags []string
}

// StartControlPlane starts etcd under dir and a kube-apiserver with every
// resource.k8s.io version served. Stop it with Stop (tb's cleanups do too).
func StartControlPlane(tb TB, dir string) (*ControlPlane, error) {
	return StartControlPlaneWith(tb, dir, ControlPlaneOptions{})
}

// StartControlPlaneWith is StartControlPlane with options.
func StartControlPlaneWith(tb TB, dir string, opts ControlPlaneOptions) (*ControlPlane, error) {
	etcd, endpoint, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{etcd: etcd}
	storage := storagebackend.NewDefaultConfig("/registry", nil)
	storage.Transport.ServerList = []string{endpoint}
	flags := []string{
		"--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
	}
	if !opts.ServiceAccounts {
		flags = append(flags, "--disable-admission-plugins=ServiceAccount")
	}
	flags = append(flags, opts.ExtraFlags...)
	server, err := kubeapiservertesting.StartTestServer(tb, &kubeapiservertesting.TestServerInstanceOptions{
		EnableCertAuth:         true,
		DisableInvariantChecks: true,
	}, flags, storage)
	if err != nil {
		etcd.Close()
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	cp.teardown = server.TearDownFn
	cp.Config = rest.CopyConfig(server.ClientConfig)
	cp.Config.QPS, cp.Config.Burst = 500, 1000
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		cp.Stop()
		return nil, err
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.Config); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

// Stop tears down the apiserver, then etcd.
func (cp *ControlPlane) Stop() {
	if cp.teardown != nil {
		cp.teardown()
		cp.teardown = nil
	}
	if cp.etcd != nil {
		cp.etcd.Close()
		cp.etcd = nil
	}
}

// startEtcd runs an embedded etcd on loopback ports chosen by the kernel.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = zapcore.ErrorLevel.String()
	client, err := freeURL()
	if err != nil {
		return nil, "", err
	}
	peer, err := freeURL()
	if err != nil {
		return nil, "", err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting etcd in %s: %w", dir, err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		etcd.Close()
		return nil, "", fmt.Errorf("etcd: %w", err)
	case <-time.After(30 * time.Second):
		etcd.Close()
		return nil, "", errors.New("etcd did not become ready in 30s")
	}
	return etcd, client.String(), nil
}

func freeURL() (*url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

// writeKubeconfig writes cfg as a kubeconfig file (bearer token and CA
// inline), readable by kubectl and by our driver's --kubeconfig.
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["rdma-dra"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		InsecureSkipTLSVerify:    cfg.Insecure,
		TLSServerName:            cfg.ServerName,
	}
	if len(cfg.CAData) == 0 && cfg.CAFile != "" {
		kc.Clusters["rdma-dra"].CertificateAuthority = cfg.CAFile
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["rdma-dra"] = &clientcmdapi.Context{Cluster: "rdma-dra", AuthInfo: "admin"}
	kc.CurrentContext = "rdma-dra"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*kc, path)
}
