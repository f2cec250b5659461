package guest

// Discovery on the real kernel, attribute by attribute against the kernel's
// own tools: `rdma -j -d dev`, `rdma -j -d link`, `rdma system` (RDMA
// netlink), `ibv_devinfo -v` (verbs) and the device nodes in devtmpfs.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

type rdmaDev struct {
	Name         string `json:"ifname"`
	NodeType     string `json:"node_type"`
	NodeGUID     string `json:"node_guid"`
	SysImageGUID string `json:"sys_image_guid"`
	FW           string `json:"fw"`
}

type rdmaLink struct {
	Dev       string `json:"ifname"`
	Port      int    `json:"port"`
	State     string `json:"state"`
	PhysState string `json:"physical_state"`
	Netdev    string `json:"netdev"`
	LID       *int   `json:"lid"`
	SMLID     *int   `json:"sm_lid"`
}

// ibvDevice is one hca_id block of ibv_devinfo -v.
type ibvDevice struct {
	attrs map[string]string
	ports map[int]map[string]string
	gids  map[int]map[int]string // port -> index -> "addr, type"
}

var gidLine = regexp.MustCompile(`^GID\[\s*(\d+)\]:\s*(.*)$`)

func parseIbvDevinfo(out []byte) map[string]*ibvDevice {
	devs := map[string]*ibvDevice{}
	var cur *ibvDevice
	port := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if m := gidLine.FindStringSubmatch(line); m != nil && cur != nil {
			i, _ := strconv.Atoi(m[1])
			if cur.gids[port] == nil {
				cur.gids[port] = map[int]string{}
			}
			cur.gids[port][i] = m[2]
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch {
		case k == "hca_id":
			cur = &ibvDevice{attrs: map[string]string{}, ports: map[int]map[string]string{}, gids: map[int]map[int]string{}}
			devs[v] = cur
			port = 0
		case cur == nil:
		case k == "port":
			port, _ = strconv.Atoi(v)
			cur.ports[port] = map[string]string{}
		case port > 0:
			cur.ports[port][k] = v
		default:
			cur.attrs[k] = v
		}
	}
	return devs
}

// ibvSpeeds maps ibv_devinfo's active_speed code to the IB speed name the
// kernel's rate file uses.
var ibvSpeeds = map[string]string{"1": "SDR", "2": "DDR", "4": "QDR", "8": "FDR10", "16": "FDR", "32": "EDR",
	"64": "HDR", "128": "NDR", "256": "XDR"}

// code returns the number in parentheses at the end of "2.5 Gbps (1)".
func code(v string) string {
	i := strings.LastIndex(v, "(")
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(v[i+1:], ")")
}

func TestDiscoveryMatchesKernelTools(t *testing.T) {
	inGuest(t)
	inv, err := hca.NewDiscoverer(hca.WithNetlink(hca.HostNetlink("/sys"))).Discover()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range inv.Warnings {
		t.Logf("inventory warning: %s", w)
	}
	var devs []rdmaDev
	rdmaJSON(t, &devs, "-d", "dev", "show")
	var links []rdmaLink
	rdmaJSON(t, &links, "-d", "link", "show")
	ibv := parseIbvDevinfo(command(t, "ibv_devinfo", "-v"))

	var got, want []string
	for _, h := range inv.HCAs {
		got = append(got, h.Name)
	}
	for _, d := range devs {
		want = append(want, d.Name)
	}
	if !slices.Equal(got, want) || !slices.Equal(want, rdmaDevices()) {
		t.Fatalf("devices: discovery %v, rdma dev %v, /init made %v", got, want, rdmaDevices())
	}
	if ok, why := siwBuilt(); !ok {
		t.Run("siw0", func(t *testing.T) { t.Skip("siw.ko is missing from the guest: " + why) })
	}

	// rdma system: "netns shared copy-on-fork on".
	sys := strings.Fields(string(command(t, "rdma", "system", "show")))
	if len(sys) < 2 || sys[0] != "netns" {
		t.Fatalf("rdma system show: %q", sys)
	}
	if string(inv.NetnsMode) != sys[1] {
		t.Errorf("netns mode: discovery %q, rdma system %q", inv.NetnsMode, sys[1])
	}

	for i, h := range inv.HCAs {
		d, v := devs[i], ibv[h.Name]
		t.Run(h.Name, func(t *testing.T) { hcaMatchesKernelTools(t, h, d, v, links) })
	}
	if inv.RDMACM == nil || !inv.RDMACM.Exists {
		t.Errorf("rdma_cm: %+v, want /dev/infiniband/rdma_cm", inv.RDMACM)
	}
}

// hcaMatchesKernelTools holds h to rdma dev's d, ibv_devinfo's v, rdma
// link's links, sysfs and devtmpfs.
func hcaMatchesKernelTools(t *testing.T, h hca.HCA, d rdmaDev, v *ibvDevice, links []rdmaLink) {
	if v == nil {
		t.Fatalf("ibv_devinfo -v has no %s", h.Name)
	}
	if !h.Usable {
		t.Errorf("unusable: %s", h.UnusableReason)
	}
	for _, w := range h.Warnings {
		t.Errorf("warning on a real kernel's device: %s", w)
	}
	eq(t, "node type (rdma dev)", strings.ToLower(h.NodeType), d.NodeType)
	eq(t, "node GUID (rdma dev)", h.NodeGUID, d.NodeGUID)
	eq(t, "node GUID (ibv_devinfo)", h.NodeGUID, v.attrs["node_guid"])
	eq(t, "sys image GUID (rdma dev)", h.SysImageGUID, d.SysImageGUID)
	eq(t, "sys image GUID (ibv_devinfo)", h.SysImageGUID, v.attrs["sys_image_guid"])
	eq(t, "firmware (rdma dev, absent when the kernel has none)", h.FirmwareVer, d.FW)
	// libibverbs prints a device without a firmware version as 0.0.0.
	ibvFW := v.attrs["fw_ver"]
	if ibvFW == "0.0.0" {
		ibvFW = ""
	}
	eq(t, "firmware (ibv_devinfo, 0.0.0 meaning none)", h.FirmwareVer, ibvFW)
	transport := map[string]string{"CA": "InfiniBand (0)", "RNIC": "iWARP (1)"}[h.NodeType]
	eq(t, "transport (ibv_devinfo)", transport, v.attrs["transport"])
	if !h.Software {
		t.Errorf("not recognised as a software device")
	}
	eq(t, "port count (ibv_devinfo)", strconv.Itoa(len(h.Ports)), v.attrs["phys_port_cnt"])

	var netdevs []string
	for _, p := range h.Ports {
		if nd := portMatchesKernelTools(t, h, p, links, v); nd != "" {
			netdevs = append(netdevs, nd)
		}
	}
	for _, n := range netdevs {
		if !slices.Contains(h.Netdevs, n) {
			t.Errorf("netdevs: discovery %v lacks %s (rdma link)", h.Netdevs, n)
		}
	}
	if len(netdevs) > 0 {
		eq(t, "parent netdev", h.ParentNetdev, netdevs[0])
	}
	if h.Name != "siw0" {
		// rxe's own sysfs answer.
		parent, err := os.ReadFile("/sys/class/infiniband/" + h.Name + "/parent")
		if err != nil {
			t.Errorf("rxe parent file: %v", err)
		} else {
			eq(t, "parent netdev (sysfs parent)", h.ParentNetdev, strings.TrimSpace(string(parent)))
		}
	}

	// The verbs device node, as devtmpfs made it.
	if h.Uverbs == nil {
		t.Fatalf("no uverbs device")
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/infiniband/"+h.Uverbs.Name, &st); err != nil {
		t.Fatalf("uverbs node: %v", err)
	}
	maj, min := uint32(st.Rdev>>8&0xfff), uint32(st.Rdev&0xff|(st.Rdev>>12)&0xfff00)
	if maj != h.Uverbs.Major || min != h.Uverbs.Minor || !h.Uverbs.Exists {
		t.Errorf("uverbs %s: discovery %d:%d (exists %v), devtmpfs %d:%d", h.Uverbs.Name, h.Uverbs.Major, h.Uverbs.Minor, h.Uverbs.Exists, maj, min)
	}
	t.Logf("%s: %s %s, fw %q, guid %s, port 1 %s/%s %s %gGb/s (%s %s), netdev %v, %d GIDs, %s, MAD %d",
		h.Name, h.NodeType, h.Model, h.FirmwareVer, h.NodeGUID, h.Ports[0].State, h.Ports[0].PhysState,
		h.Ports[0].LinkLayer, h.Ports[0].RateGbps, h.Ports[0].Width, h.Ports[0].Speed, h.Netdevs,
		len(h.Ports[0].GIDs), h.Uverbs.Name, len(h.MAD))
}

// portMatchesKernelTools holds h's port p to rdma link and ibv_devinfo and
// returns its netdev as rdma link names it.
func portMatchesKernelTools(t *testing.T, h hca.HCA, p hca.Port, links []rdmaLink, v *ibvDevice) string {
	var l *rdmaLink
	for i := range links {
		if links[i].Dev == h.Name && links[i].Port == p.Number {
			l = &links[i]
		}
	}
	vp := v.ports[p.Number]
	if l == nil || vp == nil {
		t.Errorf("port %d: rdma link %v, ibv_devinfo %v", p.Number, l, vp)
		return ""
	}
	pre := fmt.Sprintf("port %d ", p.Number)
	eq(t, pre+"state (rdma link)", p.State, l.State)
	// ibv_devinfo: each attribute it reports (siw has no phys_state).
	ibvEq := func(what, key, want string, conv func(string) string) {
		t.Helper()
		v, ok := vp[key]
		if !ok || v == "" {
			t.Logf("%s%s: not reported by ibv_devinfo", pre, what)
			return
		}
		eq(t, pre+what+" (ibv_devinfo)", want, conv(v))
	}
	word := func(v string) string { return strings.Fields(v)[0] }
	ibvEq("state", "state", "PORT_"+p.State, word)
	eq(t, pre+"phys state (rdma link)", normPhys(p.PhysState), normPhys(l.PhysState))
	ibvEq("phys state", "phys_state", normPhys(p.PhysState), func(v string) string { return normPhys(word(v)) })
	ibvEq("link layer", "link_layer", string(p.LinkLayer), func(v string) string { return v })
	ibvEq("width", "active_width", p.Width, word)
	ibvEq("speed", "active_speed", p.Speed, func(v string) string { return ibvSpeeds[code(v)] })
	if sp, w := vp["active_speed"], vp["active_width"]; sp != "" && w != "" {
		lane, _ := strconv.ParseFloat(word(sp), 64)
		lanes, _ := strconv.Atoi(strings.TrimSuffix(word(w), "X"))
		if p.RateGbps != lane*float64(lanes) {
			t.Errorf("%srate: discovery %v Gb/s, ibv_devinfo %s x %s", pre, p.RateGbps, w, sp)
		}
	}
	ibvEq("LID", "port_lid", strconv.Itoa(p.LID), func(v string) string { return v })
	ibvEq("SM LID", "sm_lid", strconv.Itoa(p.SMLID), func(v string) string { return v })
	eq(t, pre+"netdev (rdma link, RDMA netlink)", p.Netdev, l.Netdev)
	if h.NodeType == "RNIC" && len(v.gids[p.Number]) == 0 {
		// ibv_devinfo prints no GIDs for iWARP; the kernel makes
		// the GID from the netdev's MAC, which ip reports.
		iwarpGIDs(t, pre, p.GIDs, l.Netdev)
	} else {
		compareGIDs(t, pre, p.GIDs, v.gids[p.Number], h.NodeType == "RNIC")
	}
	return l.Netdev
}

func eq(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: discovery %q, kernel %q", what, got, want)
	}
}

// normPhys makes "LinkUp" and "LINK_UP" comparable.
func normPhys(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// compareGIDs: ibv_devinfo -v prints "GID[  1]: ::ffff:10.0.2.15, RoCE v2"
// for each used slot (RoCE) or the address alone (iWARP).
func compareGIDs(t *testing.T, pre string, gids []hca.GID, ibv map[int]string, iwarp bool) {
	t.Helper()
	seen := map[int]bool{}
	for _, g := range gids {
		seen[g.Index] = true
		s, ok := ibv[g.Index]
		if !ok {
			t.Errorf("%sGID %d %s: not in ibv_devinfo", pre, g.Index, g.GID)
			continue
		}
		addr, typ, _ := strings.Cut(s, ",")
		if !net.ParseIP(g.GID).Equal(net.ParseIP(strings.TrimSpace(addr))) {
			t.Errorf("%sGID %d: discovery %s, ibv_devinfo %s", pre, g.Index, g.GID, addr)
		}
		if typ = strings.TrimSpace(typ); typ != "" && !iwarp && typ != g.Type {
			t.Errorf("%sGID %d type: discovery %q, ibv_devinfo %q", pre, g.Index, g.Type, typ)
		}
	}
	for i, s := range ibv {
		if !seen[i] {
			t.Errorf("%sGID %d %s: in ibv_devinfo, not in discovery", pre, i, s)
		}
	}
}

// iwarpGIDs: an iWARP port has one GID, its netdev's MAC followed by zeros.
func iwarpGIDs(t *testing.T, pre string, gids []hca.GID, netdev string) {
	t.Helper()
	var links []struct {
		Name    string `json:"ifname"`
		Address string `json:"address"`
	}
	if err := json.Unmarshal(command(t, "ip", "-j", "link", "show", netdev), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j link show %s: %v %v", netdev, links, err)
	}
	mac, err := net.ParseMAC(links[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	want := make(net.IP, 16)
	copy(want, mac)
	if len(gids) != 1 || gids[0].Index != 0 || !net.ParseIP(gids[0].GID).Equal(want) {
		t.Errorf("%sGIDs: discovery %+v, want one, %s's MAC %s (ip link)", pre, gids, netdev, mac)
	}
}
