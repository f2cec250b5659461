package nodeguest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/vm/uverbs"
)

func TestMain(m *testing.M) {
	if os.Getenv(HelperEnv) == "uverbs-contexts" {
		n, _ := strconv.Atoi(os.Getenv("N"))
		os.Exit(uverbs.Contexts(os.Stdout, os.Getenv("UVERBS"), n))
	}
	os.Exit(m.Run())
}

// TestNode starts the node, waits for the host's Done ConfigMap, and
// stops the node (test/node's teardown checks nothing is left running).
func TestNode(t *testing.T) {
	path := os.Getenv(ConfigEnv)
	if path == "" {
		t.Skip("not in TestVMNode's guest (" + ConfigEnv + " is missing from the environment): this test runs the node there")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// The node bind-mounts its own directories over these; an initramfs
	// has none of them, nor /var/run.
	for _, d := range []string{"/var/lib", "/var/log", "/opt"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat("/var/run"); os.IsNotExist(err) {
		if err := os.Symlink("../run", "/var/run"); err != nil {
			t.Fatal(err)
		}
	}
	rc := &rest.Config{Host: cfg.Server, BearerToken: cfg.Token, QPS: 50, Burst: 100,
		TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CA, ServerName: cfg.ServerName}}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cp := &cluster.ControlPlane{Config: rc, Client: client}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	n, err := node.Start(ctx, t, cp, node.Options{Name: cfg.Node, Images: cfg.Images, NoPivotRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s Ready in the guest after %s", n.Name, time.Since(start).Round(100*time.Millisecond))
	for {
		cm, err := client.CoreV1().ConfigMaps("default").Get(ctx, cfg.Done, metav1.GetOptions{})
		if err == nil {
			t.Logf("the host is done after %s", time.Since(start).Round(100*time.Millisecond))
			if cm.Data["failed"] == "true" {
				logNode(t, n)
			}
			return
		}
		time.Sleep(time.Second)
	}
}

// logNode prints what the host cannot fetch (the API server cannot dial
// this kubelet): the kubelet's and containerd's last lines and every
// container's log.
func logNode(t *testing.T, n *node.Node) {
	for _, c := range []string{"kubelet", "containerd"} {
		t.Logf("%s's last lines:\n%s", c, node.LastLines(n.Logs(c), 60))
	}
	logs, _ := filepath.Glob(filepath.Join(n.Dir, "var-log", "pods", "*", "*", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		t.Logf("%s:\n%s", strings.TrimPrefix(l, n.Dir), node.LastLines(string(b), 40))
	}
}
