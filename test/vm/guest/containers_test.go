package guest

// Claims prepared by the driver, their CDI specs injected into runc
// containers, and real RDMA transfers over Soft-RoCE from inside them.
//
// A transfer between rxe0 and rxe1 in one kernel fails on 6.1 (modify QP
// to RTR): both addresses are local, the route between them is lo, where
// there is no rxe, and rxe works only in the initial network namespace. So
// the cross-container transfer runs over one shared rxe (two claims on
// shares of rxe0), and in exclusive mode each container runs a transfer on
// its own device.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/test/poll"
)

const pingpongPort = 18515

// gidIndex is the RoCE v2 IPv4 GID index of an rxe device.
func gidIndex(t *testing.T, n *node, dev string) int {
	t.Helper()
	for _, h := range n.drv.Inventory().HCAs {
		if h.Name == dev && len(h.Ports) > 0 && h.Ports[0].RoCEv2GIDIndex >= 0 {
			return h.Ports[0].RoCEv2GIDIndex
		}
	}
	t.Fatalf("%s has no RoCE v2 GID with an address", dev)
	return 0
}

var throughput = regexp.MustCompile(`(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec`)

// pingpong runs the ibv_rc_pingpong server in container srv and the client
// in cli (each with its CDI devices) and asserts both moved the data.
func pingpong(t *testing.T, srv, cli *ctrSetup, serverIP string) {
	t.Helper()
	args := func(s *ctrSetup) []string {
		return []string{"ibv_rc_pingpong", "-d", s.dev, "-g", fmt.Sprint(s.gid), "-p", fmt.Sprint(pingpongPort), "-n", "500", "-s", "4096"}
	}
	var wg sync.WaitGroup
	var sres ctrResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sres, serr = runContainerErr(srv.id, withCDI(t, containerSpec(srv.id, args(srv)...), srv.cdiDir, srv.ids...), 60*time.Second)
	}()
	err := poll.Until(t.Context(), fmt.Sprintf("the server to listen on %d", pingpongPort), 20*time.Millisecond, 20*time.Second,
		func(context.Context) (bool, string, error) { return listening(pingpongPort), "", nil })
	if err != nil {
		wg.Wait()
		t.Fatalf("%v: %v\n%s", err, serr, sres.out)
	}
	cres := runContainer(t, cli.id, withCDI(t, containerSpec(cli.id, append(args(cli), serverIP)...), cli.cdiDir, cli.ids...), 60*time.Second)
	wg.Wait()
	if serr != nil {
		t.Fatal(serr)
	}
	for _, r := range []struct {
		who string
		res ctrResult
	}{{"server " + srv.id + " on " + srv.dev, sres}, {"client " + cli.id + " on " + cli.dev, cres}} {
		m := throughput.FindStringSubmatch(r.res.out)
		if r.res.exit != 0 || m == nil {
			t.Errorf("ibv_rc_pingpong %s: exit %d\n%s", r.who, r.res.exit, r.res.out)
			continue
		}
		t.Logf("ibv_rc_pingpong %s: %s bytes in %s s = %s Mbit/s", r.who, m[1], m[2], m[3])
	}
}

// rping: the same over the RDMA connection manager (/dev/infiniband/rdma_cm
// from the CDI spec): the client in one container pings the server in the
// other 10 times with data verification.
func rping(t *testing.T, srv, cli *ctrSetup, serverIP string) {
	t.Helper()
	var wg sync.WaitGroup
	var sres ctrResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sres, serr = runContainerErr(srv.id, withCDI(t, containerSpec(srv.id, "rping", "-s", "-a", serverIP, "-C", "10", "-V"), srv.cdiDir, srv.ids...), 60*time.Second)
	}()
	// rdma_cm listens outside /proc/net/tcp; the kernel lists its cm_ids.
	err := poll.Until(t.Context(), "the rping server to listen", 50*time.Millisecond, 20*time.Second,
		func(context.Context) (bool, string, error) { return cmListening(t, serverIP), "", nil })
	if err != nil {
		wg.Wait()
		t.Fatalf("%v: %v\n%s", err, serr, sres.out)
	}
	cres := runContainer(t, cli.id, withCDI(t, containerSpec(cli.id, "rping", "-c", "-a", serverIP, "-C", "10", "-V", "-v"), cli.cdiDir, cli.ids...), 60*time.Second)
	wg.Wait()
	if serr != nil {
		t.Fatal(serr)
	}
	pings := strings.Count(cres.out, "ping data: rdma-ping-")
	if cres.exit != 0 || sres.exit != 0 || pings != 10 {
		t.Errorf("rping: client exit %d with %d pings, server exit %d\nclient:\n%s\nserver:\n%s", cres.exit, pings, sres.exit, cres.out, sres.out)
		return
	}
	t.Logf("rping over rdma_cm between containers: %d verified pings", pings)
}

// cmListening: `rdma res show cm_id` lists a LISTEN cm_id on addr.
func cmListening(t *testing.T, addr string) bool {
	t.Helper()
	var ids []struct {
		State   string `json:"state"`
		SrcAddr string `json:"src-addr"`
	}
	out, err := exec.Command("rdma", "-j", "res", "show", "cm_id").Output()
	if err != nil || json.Unmarshal(out, &ids) != nil {
		return false
	}
	for _, id := range ids {
		if id.State == "LISTEN" && strings.HasPrefix(id.SrcAddr, addr+":") {
			return true
		}
	}
	return false
}

type ctrSetup struct {
	id, dev string
	gid     int
	cdiDir  string
	ids     []string
}

// listInfiniband lists /dev/infiniband inside a container.
func listInfiniband(t *testing.T, id, cdiDir string, ids ...string) []string {
	t.Helper()
	r := runContainer(t, id, withCDI(t, containerSpec(id, "ls", "/dev/infiniband"), cdiDir, ids...), 30*time.Second)
	if r.exit != 0 {
		return nil
	}
	return strings.Fields(r.out)
}

// mustFail runs args in a container and asserts it fails with want in its
// output.
func mustFail(t *testing.T, what string, c *ctrSpec, want string) {
	t.Helper()
	r := runContainer(t, c.id, c.spec, 30*time.Second)
	if r.exit == 0 || !strings.Contains(r.out, want) {
		t.Errorf("%s: exit %d, output %q; want a failure saying %q", what, r.exit, r.out, want)
		return
	}
	t.Logf("%s: refused (exit %d): %s", what, r.exit, strings.TrimSpace(r.out))
}

func skipWithoutRunc(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/sbin/runc"); err != nil {
		t.Skipf("runc is not in the image: %v", err)
	}
}

// TestSharedRxeTransferBetweenContainers: two claims on shares of rxe0;
// each container holds only rxe0 (its uverbs node and rdma_cm, from the
// claim's CDI spec); ibv_rc_pingpong's server in one and client in the
// other move data over Soft-RoCE. A container without a claim sees no
// device and cannot open one.
func TestSharedRxeTransferBetweenContainers(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	n := startNode(t, nodeConfig{shares: 1000})
	a := n.claim("pingpong-server", []string{"rxe0"}, "11111111-aaaa-4aaa-8aaa-000000000001")
	b := n.claim("pingpong-client", []string{"rxe0"}, "11111111-aaaa-4aaa-8aaa-000000000002")
	ida, idb := n.prepare(a), n.prepare(b)
	t.Logf("CDI devices: server %v, client %v", ida, idb)
	uverbs := uverbsOf(t, n.drv.Inventory(), "rxe0")

	for _, c := range []struct {
		id  string
		ids []string
	}{{"server-ls", ida}, {"client-ls", idb}} {
		if got, want := listInfiniband(t, c.id, n.cdiDir, c.ids...), []string{"rdma_cm", uverbs}; !slices.Equal(got, want) {
			t.Errorf("%s: /dev/infiniband = %v, want %v (only its claim's device)", c.id, got, want)
		}
	}
	gid := gidIndex(t, n, "rxe0")
	pingpong(t,
		&ctrSetup{id: "server", dev: "rxe0", gid: gid, cdiDir: n.cdiDir, ids: ida},
		&ctrSetup{id: "client", dev: "rxe0", gid: gid, cdiDir: n.cdiDir, ids: idb}, "10.0.2.15")

	rping(t, &ctrSetup{id: "rping-server", cdiDir: n.cdiDir, ids: ida}, &ctrSetup{id: "rping-client", cdiDir: n.cdiDir, ids: idb}, "10.0.2.15")

	// The claim holds rxe0 only: rxe1 is not there to open.
	mustFail(t, "server container opening rxe1", &ctrSpec{"server-rxe1",
		withCDI(t, containerSpec("server-rxe1", "ibv_devinfo", "-d", "rxe1"), n.cdiDir, ida...)}, "IB device 'rxe1' wasn't found")
	refusedWithoutClaim(t)
	n.unprepare(a)
	n.unprepare(b)
}

// refusedWithoutClaim: a container without a claim has no RDMA device
// node; and with the node smuggled in but no device-cgroup rule (what the
// CDI spec adds), opening it is refused by the kernel.
func refusedWithoutClaim(t *testing.T) {
	t.Helper()
	mustFail(t, "container without a claim", &ctrSpec{"noclaim", containerSpec("noclaim", "ibv_devinfo", "-d", "rxe0")},
		"IB device 'rxe0' wasn't found")
	spec := containerSpec("noclaim-node", "ibv_devinfo", "-d", "rxe0")
	inv, err := hca.Discover()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range inv.HCAs {
		if h.Name == "rxe0" && h.Uverbs != nil {
			mode := os.FileMode(0o666)
			spec.Linux.Devices = append(spec.Linux.Devices, specsDevice(h.Uverbs.Name, int64(h.Uverbs.Major), int64(h.Uverbs.Minor), mode))
		}
	}
	mustFail(t, "container with rxe0's node but no cgroup rule", &ctrSpec{"noclaim-node", spec}, "Failed to open device")
}

// TestExclusiveClaimsEachTransferOnOwnDevice: exclusive claims give one
// container rxe0 and the other rxe1; each holds only its own device, runs
// a transfer on it (server and client inside), and cannot open the other's.
func TestExclusiveClaimsEachTransferOnOwnDevice(t *testing.T) {
	inGuest(t)
	skipWithoutRunc(t)
	n := startNode(t, nodeConfig{})
	inv := n.drv.Inventory()
	for i, c := range []struct{ dev, other, ip string }{{"rxe0", "rxe1", "10.0.2.15"}, {"rxe1", "rxe0", "10.0.3.15"}} {
		claim := n.claim("excl-"+c.dev, []string{c.dev})
		ids := n.prepare(claim)
		if got, want := listInfiniband(t, "ls-"+c.dev, n.cdiDir, ids...), []string{"rdma_cm", uverbsOf(t, inv, c.dev)}; !slices.Equal(got, want) {
			t.Errorf("container of %s: /dev/infiniband = %v, want %v", c.dev, got, want)
		}
		gid := gidIndex(t, n, c.dev)
		// The client starts once the server listens (the guest's /proc/net/tcp).
		script := shScript("pingpong-pair.sh", c.dev, strconv.Itoa(gid), strconv.Itoa(pingpongPort+1+i), c.ip)
		r := runContainer(t, "xfer-"+c.dev, withCDI(t, containerSpec("xfer-"+c.dev, script...), n.cdiDir, ids...), 60*time.Second)
		m := throughput.FindAllStringSubmatch(r.out, -1)
		if r.exit != 0 || len(m) != 2 {
			t.Errorf("transfer on %s in its container: exit %d\n%s", c.dev, r.exit, r.out)
		} else {
			t.Logf("ibv_rc_pingpong on %s inside one container: %s bytes in %s s = %s Mbit/s", c.dev, m[1][1], m[1][2], m[1][3])
		}
		mustFail(t, "container of "+c.dev+" opening "+c.other, &ctrSpec{"other-" + c.dev,
			withCDI(t, containerSpec("other-"+c.dev, "ibv_devinfo", "-d", c.other), n.cdiDir, ids...)}, "IB device '"+c.other+"' wasn't found")
		n.unprepare(claim)
	}
}

func uverbsOf(t *testing.T, inv hca.Inventory, dev string) string {
	t.Helper()
	for _, h := range inv.HCAs {
		if h.Name == dev && h.Uverbs != nil {
			return h.Uverbs.Name
		}
	}
	t.Fatalf("no uverbs device for %s", dev)
	return ""
}
