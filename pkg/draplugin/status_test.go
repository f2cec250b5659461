package draplugin_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
)

// claims is where the env's driver writes claim status, or nil.
func (e *env) claims() resourceclient.ResourceClaimsGetter {
	if !e.deps.claimStatus {
		return nil
	}
	return e.client.ResourceV1()
}

// ourDevices polls the claim until its status.devices entries of this
// driver satisfy ok.
func (e *env) ourDevices(name string, ok func([]resourceapi.AllocatedDeviceStatus) bool) []resourceapi.AllocatedDeviceStatus {
	e.t.Helper()
	var ours []resourceapi.AllocatedDeviceStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := e.client.ResourceV1().ResourceClaims("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		ours = nil
		for _, d := range c.Status.Devices {
			if d.Driver == driverName {
				ours = append(ours, d)
			}
		}
		if ok(ours) {
			return ours
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("claim %s: status.devices of %s after 20 s: %+v", name, driverName, ours)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClaimStatus: a prepared RoCE HCA's claim shows its netdev (name, MAC
// from sysfs, the IPv4 address of its RoCE GIDs), Ready and LinkUp, and
// the ibdev in data; unprepare removes the entry. The simulated netdev is
// not in this process's network namespace, so the addresses come from the
// GID table.
func TestClaimStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deps.claimStatus = true
	e.start()
	c := e.claim("st", hostNetworkPod("p", true), one("mlx5-8"))
	e.mustPrepare(c)
	got := e.ourDevices("st", func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) > 0 })
	if len(got) != 1 || got[0].Pool != nodeName || got[0].Device != "mlx5-8" {
		t.Fatalf("status.devices %+v, want mlx5-8 of pool %s", got, nodeName)
	}
	st := got[0]
	mac, err := os.ReadFile(filepath.Join(e.node.SysfsRoot, "class", "net", "ens1f0np0", "address"))
	if err != nil {
		t.Fatal(err)
	}
	nd := st.NetworkData
	if nd == nil || nd.InterfaceName != "ens1f0np0" || nd.HardwareAddress != strings.TrimSpace(string(mac)) ||
		!slices.Equal(nd.IPs, []string{"10.0.0.1/32"}) {
		t.Errorf("networkData %+v, want ens1f0np0, MAC %s, 10.0.0.1/32", nd, strings.TrimSpace(string(mac)))
	}
	conds := map[string]metav1.Condition{}
	for _, cond := range st.Conditions {
		conds[cond.Type] = cond
	}
	if r := conds[draplugin.ConditionReady]; r.Status != metav1.ConditionTrue || r.Reason != draplugin.ReasonPrepared {
		t.Errorf("Ready condition %+v, want True, Prepared", r)
	}
	if l := conds[draplugin.ConditionLinkUp]; l.Status != metav1.ConditionTrue || l.Reason != draplugin.ReasonActive || !strings.Contains(l.Message, "LinkUp") {
		t.Errorf("LinkUp condition %+v, want True, PortActive, the physical state in the message", l)
	}
	var data map[string]any
	if st.Data == nil || json.Unmarshal(st.Data.Raw, &data) != nil || data["ibdev"] != "mlx5_8" || data["roceGIDIndex"] != float64(3) {
		t.Errorf("data %v, want ibdev mlx5_8 and roceGIDIndex 3", st.Data)
	}

	if r := e.unprepare(ref(c))[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	e.ourDevices("st", func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) == 0 })
}

// TestClaimStatusInfiniBand: an IB HCA's entry names its IPoIB netdev and
// 20-byte hardware address, with no addresses (IB GIDs carry none), and a
// port that is down makes LinkUp False with the state as the reason.
func TestClaimStatusInfiniBand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deps.claimStatus = true
	if err := e.node.SetPortState("mlx5_1", 1, "1: DOWN", "2: Polling"); err != nil {
		t.Fatal(err)
	}
	e.start()
	c := e.claim("ib", hostNetworkPod("p", true), one("mlx5-1"))
	e.mustPrepare(c)
	st := e.ourDevices("ib", func(d []resourceapi.AllocatedDeviceStatus) bool { return len(d) > 0 })[0]
	if nd := st.NetworkData; nd == nil || nd.InterfaceName == "" || strings.Count(nd.HardwareAddress, ":") != 19 || len(nd.IPs) != 0 {
		t.Errorf("networkData %+v, want the IPoIB netdev with a 20-byte address and no IPs", nd)
	}
	for _, cond := range st.Conditions {
		if cond.Type == draplugin.ConditionLinkUp && (cond.Status != metav1.ConditionFalse || cond.Reason != "PortDown") {
			t.Errorf("LinkUp %+v, want False, PortDown", cond)
		}
	}
}
