package nodeguest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
	"github.com/rdma-dra/rdma-dra-driver/test/node"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
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
	if cfg.Link != nil {
		if err := setUpLink(*cfg.Link); err != nil {
			t.Fatal(err)
		}
		t.Logf("link: %s on %s with %s, port ACTIVE, routes %v", cfg.Link.Address, cfg.Link.Rxe, cfg.Link.MAC, cfg.Link.Routes)
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
	if cfg.Link != nil {
		// ib_core fills the GID table from a work queue after the address.
		var facts map[string]string
		err := poll.Until(ctx, "the kernel's facts of "+cfg.Link.Rxe, 200*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
			var err error
			facts, err = linkFacts(*cfg.Link)
			return err == nil, fmt.Sprint(err), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: KernelFacts(cfg.Node)}, Data: facts}
		if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("publishing the kernel's view of %s: %v", cfg.Link.Rxe, err)
		}
		t.Logf("kernel's view of %s: %v", cfg.Link.Rxe, facts)
	}
	start := time.Now()
	n, err := node.Start(ctx, t, cp, node.Options{Name: cfg.Node, Images: cfg.Images, NoPivotRoot: true,
		SharedNetwork: cfg.SharedNetwork, PodCIDR: cfg.PodCIDR})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s Ready in the guest after %s", n.Name, time.Since(start).Round(100*time.Millisecond))
	// The host's test bounds the wait: it powers the guest off.
	var done *corev1.ConfigMap
	err = poll.Until(ctx, "the host to be done", time.Second, 24*time.Hour, func(ctx context.Context) (bool, string, error) {
		var err error
		done, err = client.CoreV1().ConfigMaps("default").Get(ctx, cfg.Done, metav1.GetOptions{})
		return err == nil, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the host is done after %s", time.Since(start).Round(100*time.Millisecond))
	if done.Data["failed"] == "true" {
		logNode(t, n)
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

// setUpLink addresses the NIC with the link's MAC, brings it up, routes
// the other guests' pod subnets over it (forwarding on) and makes an rxe
// on it, waiting for the rxe's port to be ACTIVE.
func setUpLink(l Link) error {
	nics, _ := filepath.Glob("/sys/class/net/*/address")
	netdev := ""
	for _, f := range nics {
		if b, err := os.ReadFile(f); err == nil && strings.EqualFold(strings.TrimSpace(string(b)), l.MAC) {
			netdev = filepath.Base(filepath.Dir(f))
		}
	}
	if netdev == "" {
		return fmt.Errorf("link %s: no NIC with MAC %s among %v", l.Address, l.MAC, nics)
	}
	for _, args := range [][]string{
		{"ip", "addr", "add", l.Address, "dev", netdev},
		{"ip", "link", "set", netdev, "up"},
		{"rdma", "link", "add", l.Rxe, "type", "rxe", "netdev", netdev},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("link %s: %s: %v: %s", l.Address, strings.Join(args, " "), err, out)
		}
	}
	for _, r := range l.Routes {
		if out, err := exec.Command("ip", "route", "add", r.CIDR, "via", r.Via, "dev", netdev).CombinedOutput(); err != nil {
			return fmt.Errorf("link %s: route to %s via %s: %v: %s", l.Address, r.CIDR, r.Via, err, out)
		}
	}
	if len(l.Routes) > 0 {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("link %s: forwarding to the pods: %w", l.Address, err)
		}
	}
	state := filepath.Join("/sys/class/infiniband", l.Rxe, "ports/1/state")
	err := poll.Until(context.Background(), state+" to say ACTIVE", 100*time.Millisecond, 10*time.Second, func(context.Context) (bool, string, error) {
		b, _ := os.ReadFile(state)
		return strings.Contains(string(b), "ACTIVE"), strings.TrimSpace(string(b)), nil
	})
	if err != nil {
		return fmt.Errorf("link %s: %w", l.Address, err)
	}
	return nil
}

// linkFacts is what sysfs says about the link's rxe: the values the
// driver's slice must show for it.
func linkFacts(l Link) (map[string]string, error) {
	dev := filepath.Join("/sys/class/infiniband", l.Rxe)
	read := func(rel string) string {
		b, _ := os.ReadFile(filepath.Join(dev, rel))
		return strings.TrimSpace(string(b))
	}
	word := func(rel string) string { // "4: ACTIVE" -> ACTIVE
		_, w, _ := strings.Cut(read(rel), ": ")
		return w
	}
	ip, _, err := net.ParseCIDR(l.Address)
	if err != nil {
		return nil, fmt.Errorf("link address %q: %w", l.Address, err)
	}
	v6 := ip.To16()
	var groups []string
	for i := 0; i < 16; i += 2 {
		groups = append(groups, fmt.Sprintf("%02x%02x", v6[i], v6[i+1]))
	}
	gid := strings.Join(groups, ":")
	facts := map[string]string{"ibdev": l.Rxe, "address": ip.String(), "gid": gid,
		"nodeGUID": read("node_guid"), "sysImageGUID": read("sys_image_guid"),
		"portState": word("ports/1/state"), "physState": word("ports/1/phys_state"),
		"linkLayer": read("ports/1/link_layer"), "rate": read("ports/1/rate"), "fwVer": read("fw_ver")}
	ports, _ := filepath.Glob(filepath.Join(dev, "ports", "*"))
	facts["ports"] = strconv.Itoa(len(ports))
	for i := 0; ; i++ {
		g := read(fmt.Sprintf("ports/1/gids/%d", i))
		if g == "" {
			break
		}
		if g == gid && read(fmt.Sprintf("ports/1/gid_attrs/types/%d", i)) == "RoCE v2" {
			facts["roceGIDIndex"] = strconv.Itoa(i)
			facts["netdev"] = read(fmt.Sprintf("ports/1/gid_attrs/ndevs/%d", i))
			break
		}
	}
	if facts["roceGIDIndex"] == "" {
		return nil, fmt.Errorf("%s: no RoCE v2 GID %s in its port 1's table", l.Rxe, gid)
	}
	uverbs, _ := filepath.Glob("/sys/class/infiniband_verbs/uverbs*/ibdev")
	for _, f := range uverbs {
		if b, _ := os.ReadFile(f); strings.TrimSpace(string(b)) == l.Rxe {
			facts["uverbs"] = filepath.Base(filepath.Dir(f))
		}
	}
	return facts, nil
}
