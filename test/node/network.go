package node

// The node's network namespace, the API server's address as the node sees
// it, and the proxies that carry it.

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

// holderSh holds the node's namespaces (its header says its arguments).
//
//go:embed testdata/holder.sh
var holderSh string

// startNamespaces starts the holder: a shell in a new mount and network
// namespace that bind-mounts the work dir over the node's paths, brings up
// loopback with the node and service addresses, and waits for stdin to
// close. Components join its namespaces with nsenter.
func (n *Node) startNamespaces(sharedNetwork bool) error {
	svcIP, _, err := n.apiService()
	if err != nil {
		return err
	}
	shared := "0"
	if sharedNetwork {
		shared = "1"
	}
	args := []string{shared, n.IP, svcIP}
	for _, m := range [][2]string{{"var-lib", "/var/lib"}, {"var-log", "/var/log"}, {"run", "/run"}, {"opt", "/opt"}} {
		args = append(args, filepath.Join(n.Dir, m[0]), m[1])
	}
	// The kubelet sets these unless they already hold its values.
	for _, s := range []struct{ path, value string }{
		{"vm/overcommit_memory", "1"}, {"vm/panic_on_oom", "0"},
		{"kernel/panic", "10"}, {"kernel/panic_on_oops", "1"},
		{"kernel/keys/root_maxkeys", "1000000"}, {"kernel/keys/root_maxbytes", "25000000"},
	} {
		if _, err := os.Stat("/proc/sys/" + s.path); err != nil {
			continue
		}
		file := filepath.Join(n.Dir, "sysctl", strings.ReplaceAll(s.path, "/", "."))
		if err := os.WriteFile(file, []byte(s.value+"\n"), 0o644); err != nil {
			return err
		}
		args = append(args, file, "/proc/sys/"+s.path)
	}
	unshare := []string{"--mount", "--net"}
	if sharedNetwork {
		// The node's IP is already an address of the namespace.
		unshare = unshare[:1]
	}
	unshare = append(unshare, "--propagation", "private", "--", "/bin/sh", "-c", holderSh, "holder.sh")
	cmd := exec.Command("unshare", append(unshare, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := startOnLiveThread(cmd); err != nil {
		return fmt.Errorf("node namespaces (unshare): %w", err)
	}
	n.holder, n.holderIn, n.nsPid = cmd, in, cmd.Process.Pid
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		_ = cmd.Wait()
		return fmt.Errorf("node namespaces (unshare + mounts): %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	n.netns, err = newNetnsDialer(fmt.Sprintf("/proc/%d/ns/net", n.nsPid))
	return err
}

// apiService is the kubernetes Service's cluster IP and port: pods reach
// the API server there (in-cluster config), as kube-proxy would route it.
func (n *Node) apiService() (string, int, error) {
	var ip string
	var port int
	err := poll.Until(context.Background(), "the API server's default/kubernetes Service", 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		svc, err := n.cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if svc.Spec.ClusterIP == "" || len(svc.Spec.Ports) == 0 {
			return false, fmt.Sprintf("cluster IP %q, ports %v", svc.Spec.ClusterIP, svc.Spec.Ports), nil
		}
		ip, port = svc.Spec.ClusterIP, int(svc.Spec.Ports[0].Port)
		return true, "", nil
	})
	return ip, port, err
}

// startProxies connects the node's network namespace with the host's: the
// API server (host loopback) is reachable inside at 127.0.0.1:6443 (the
// kubelet) and at the kubernetes Service's address (pods); the kubelet's
// port is reachable from the host at IP:KubeletPort (the API server's
// pods/log, exec and port-forward).
func (n *Node) startProxies(ctx context.Context, sharedNetwork bool) error {
	api := strings.TrimPrefix(strings.TrimPrefix(n.cp.Config.Host, "https://"), "http://")
	svcIP, svcPort, err := n.apiService()
	if err != nil {
		return err
	}
	dialAPI := func() (net.Conn, error) { return net.DialTimeout("tcp", api, 5*time.Second) }
	for _, addr := range []string{"127.0.0.1:6443", net.JoinHostPort(svcIP, strconv.Itoa(svcPort))} {
		l, err := n.netns.listen(addr)
		if err != nil {
			return fmt.Errorf("node network: listening on %s for the API server: %w", addr, err)
		}
		n.listeners = append(n.listeners, l)
		go forward(l, dialAPI)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(n.IP, "0"))
	if err != nil {
		return fmt.Errorf("node network: a port on %s for the kubelet: %w", n.IP, err)
	}
	n.KubeletPort = l.Addr().(*net.TCPAddr).Port
	if sharedNetwork {
		// The kubelet listens on this very address itself.
		return l.Close()
	}
	n.listeners = append(n.listeners, l)
	kubelet := l.Addr().String()
	go forward(l, func() (net.Conn, error) { return n.netns.dial(kubelet) })
	return nil
}

// hostIP is the host's first global IPv4 address: the kubelet refuses a
// loopback node IP, and the API server dials the node's InternalIP.
func hostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", errors.New("the host has no global IPv4 address for the node's InternalIP")
}
