package cdi

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

func node(name, hostRoot string, major, minor int64) *cdispec.DeviceNode {
	return &cdispec.DeviceNode{
		Path: "/dev/infiniband/" + name, HostPath: hostRoot + "/infiniband/" + name,
		Type: "c", Major: major, Minor: minor, Permissions: "rw",
	}
}

func TestDeviceEdits(t *testing.T) {
	noUverbs := ibHCA(0)
	noUverbs.Uverbs = nil
	zeroMajor := ibHCA(0)
	zeroMajor.Uverbs = &hca.CharDevice{Name: "uverbs0", Minor: 192}
	badName := ibHCA(0)
	badName.Uverbs = &hca.CharDevice{Name: "../uverbs0", Major: 231, Minor: 192}
	badMAD := ibHCA(0)
	badMAD.MAD[1].Major = 0
	odd := ibHCA(3)
	odd.Name = "rxe-eth0.100"

	tests := []struct {
		name    string
		h       hca.HCA
		opts    EditOptions
		want    cdispec.ContainerEdits
		wantErr string
	}{
		{
			name: "uverbs only, default host root",
			h:    ibHCA(0),
			want: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node("uverbs0", "/dev", 231, 192)}},
		},
		{
			name: "management devices, sorted by path",
			h:    ibHCA(0),
			opts: EditOptions{ManagementDevices: true, HostDevRoot: "/tmp/node/dev/"},
			want: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
				node("issm0", "/tmp/node/dev", 231, 64),
				node("umad0", "/tmp/node/dev", 231, 0),
				node("uverbs0", "/tmp/node/dev", 231, 192),
			}},
		},
		{
			name: "env",
			h:    ibHCA(1),
			opts: EditOptions{Env: true},
			want: cdispec.ContainerEdits{
				Env:         []string{"RDMA_DEVICE_MLX5_1=/dev/infiniband/uverbs1"},
				DeviceNodes: []*cdispec.DeviceNode{node("uverbs1", "/dev", 231, 193)},
			},
		},
		{
			name: "env of a name with punctuation",
			h:    odd,
			opts: EditOptions{Env: true},
			want: cdispec.ContainerEdits{
				Env:         []string{"RDMA_DEVICE_RXE_ETH0_100=/dev/infiniband/uverbs3"},
				DeviceNodes: []*cdispec.DeviceNode{node("uverbs3", "/dev", 231, 195)},
			},
		},
		{name: "no uverbs", h: noUverbs, wantErr: "HCA mlx5_0 has no uverbs device"},
		{name: "uverbs without number", h: zeroMajor, wantErr: "HCA mlx5_0: device uverbs0 has no device number"},
		{name: "uverbs name with a slash", h: badName, wantErr: `HCA mlx5_0: device node name "../uverbs0"`},
		{name: "MAD without number", h: badMAD, opts: EditOptions{ManagementDevices: true}, wantErr: "HCA mlx5_0: device umad0 has no device number"},
		{name: "MAD ignored unless asked", h: badMAD, want: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node("uverbs0", "/dev", 231, 192)}}},
		{name: "relative host root", h: ibHCA(0), opts: EditOptions{HostDevRoot: "node/dev"}, wantErr: `HCA mlx5_0: host dev root "node/dev" is not an absolute path`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DeviceEdits(tt.h, tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("edits (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDeviceEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"mlx5_0":      "RDMA_DEVICE_MLX5_0",
		"rocep22s0f1": "RDMA_DEVICE_ROCEP22S0F1",
		"siw-eth0":    "RDMA_DEVICE_SIW_ETH0",
		"irdma.1":     "RDMA_DEVICE_IRDMA_1",
	} {
		if got := DeviceEnvName(in); got != want {
			t.Errorf("DeviceEnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCommonEdits(t *testing.T) {
	downIB := ibHCA(1)
	downIB.Ports[0].State = "DOWN"
	dual := ibHCA(2)
	dual.Ports = append(dual.Ports, hca.Port{Number: 2, State: "ACTIVE", LinkLayer: hca.LinkLayerInfiniBand, RoCEv2GIDIndex: -1})

	tests := []struct {
		name   string
		rdmaCM *hca.CharDevice
		group  []hca.HCA
		opts   EditOptions
		want   cdispec.ContainerEdits
	}{
		{name: "nothing", want: cdispec.ContainerEdits{}},
		{
			name:   "rdma_cm only without env",
			rdmaCM: rdmaCM,
			group:  []hca.HCA{ibHCA(0)},
			opts:   EditOptions{HostDevRoot: "/sim/dev", ManagementDevices: true},
			want:   cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node("rdma_cm", "/sim/dev", 10, 58)}},
		},
		{
			name:  "env, group unsorted and repeated",
			group: []hca.HCA{ibHCA(1), ibHCA(0), ibHCA(1)},
			opts:  EditOptions{Env: true},
			want: cdispec.ContainerEdits{Env: []string{
				"NCCL_IB_HCA==mlx5_0,mlx5_1",
				"RDMA_DEVICES=mlx5_0,mlx5_1",
				"UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1",
			}},
		},
		{
			name:  "exact NCCL match: mlx5_1 and mlx5_10",
			group: []hca.HCA{ibHCA(10), ibHCA(1)},
			opts:  EditOptions{Env: true},
			want: cdispec.ContainerEdits{Env: []string{
				"NCCL_IB_HCA==mlx5_1,mlx5_10",
				"RDMA_DEVICES=mlx5_1,mlx5_10",
				"UCX_NET_DEVICES=mlx5_1:1,mlx5_10:1",
			}},
		},
		{
			name:  "UCX lists only active ports",
			group: []hca.HCA{ibHCA(0), downIB, dual},
			opts:  EditOptions{Env: true},
			want: cdispec.ContainerEdits{Env: []string{
				"NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2",
				"RDMA_DEVICES=mlx5_0,mlx5_1,mlx5_2",
				"UCX_NET_DEVICES=mlx5_0:1,mlx5_2:1,mlx5_2:2",
			}},
		},
		{
			name:  "UCX lists every port when none is active",
			group: []hca.HCA{downIB},
			opts:  EditOptions{Env: true},
			want: cdispec.ContainerEdits{Env: []string{
				"NCCL_IB_HCA==mlx5_1",
				"RDMA_DEVICES=mlx5_1",
				"UCX_NET_DEVICES=mlx5_1:1",
			}},
		},
		{
			name:  "an HCA without ports",
			group: []hca.HCA{{Name: "rxe0"}},
			opts:  EditOptions{Env: true},
			want:  cdispec.ContainerEdits{Env: []string{"NCCL_IB_HCA==rxe0", "RDMA_DEVICES=rxe0"}},
		},
		{name: "empty group sets no aggregate", opts: EditOptions{Env: true}, want: cdispec.ContainerEdits{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CommonEdits(tt.rdmaCM, tt.group, tt.opts)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("edits (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNCCLGIDIndex(t *testing.T) {
	iwarp := roceHCA(4, active(3))
	iwarp.NodeType = "RNIC"
	tests := []struct {
		name  string
		group []hca.HCA
		want  string // "" means unset
	}{
		{name: "one RoCE HCA", group: []hca.HCA{roceHCA(0, active(3))}, want: "3"},
		{name: "index 0 counts", group: []hca.HCA{roceHCA(0, active(0)), roceHCA(1, active(0))}, want: "0"},
		{name: "all RoCE agree", group: []hca.HCA{roceHCA(0, active(3)), roceHCA(1, active(3))}, want: "3"},
		{name: "RoCE disagree", group: []hca.HCA{roceHCA(0, active(3)), roceHCA(1, active(1))}},
		{name: "ports of one HCA disagree", group: []hca.HCA{roceHCA(0, active(3), active(5))}},
		{name: "no RoCE v2 GID", group: []hca.HCA{roceHCA(0, active(-1))}},
		{name: "one without RoCE v2 GID", group: []hca.HCA{roceHCA(0, active(3)), roceHCA(1, active(-1))}},
		{name: "mixed with InfiniBand", group: []hca.HCA{roceHCA(0, active(3)), ibHCA(1)}},
		{name: "InfiniBand only", group: []hca.HCA{ibHCA(0)}},
		{name: "iWARP", group: []hca.HCA{iwarp}},
		{name: "down port not used, ignored", group: []hca.HCA{roceHCA(0, active(3), down(-1)), roceHCA(1, down(1))}, want: "3"},
		{name: "all down, all ports agree", group: []hca.HCA{roceHCA(0, down(3)), roceHCA(1, down(3))}, want: "3"},
		{name: "all down, disagree", group: []hca.HCA{roceHCA(0, down(3)), roceHCA(1, down(2))}},
		{name: "RoCE without ports", group: []hca.HCA{{Name: "rxe0", Ports: nil}}},
		{name: "empty group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			for _, kv := range CommonEdits(nil, tt.group, EditOptions{Env: true}).Env {
				if v, ok := strings.CutPrefix(kv, "NCCL_IB_GID_INDEX="); ok {
					got = v
				}
			}
			if got != tt.want {
				t.Errorf("NCCL_IB_GID_INDEX = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCommonEditsEnvSorted(t *testing.T) {
	env := CommonEdits(rdmaCM, []hca.HCA{roceHCA(0, active(3))}, EditOptions{Env: true}).Env
	want := []string{"NCCL_IB_GID_INDEX=3", "NCCL_IB_HCA==mlx5_0", "RDMA_DEVICES=mlx5_0", "UCX_IB_GID_INDEX=3", "UCX_NET_DEVICES=mlx5_0:1"}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
}

// dualStack is an ACTIVE RoCE port with the GID table a ConnectX port on a
// dual-stack netdev has: link-local v1/v2, IPv4 v1/v2 at 2/3, global IPv6
// v1/v2 at 4/5. ipv4 false drops the IPv4 entries (an IPv6-only host).
func dualStack(ipv4 bool) hca.Port {
	p := hca.Port{State: "ACTIVE", RoCEv2GIDIndex: 5, GIDs: []hca.GID{
		{Index: 0, GID: "fe80:0000:0000:0000:a288:c2ff:fe3b:506a", Type: "IB/RoCE v1"},
		{Index: 1, GID: "fe80:0000:0000:0000:a288:c2ff:fe3b:506a", Type: "RoCE v2"},
		{Index: 4, GID: "2010:0200:0000:0002:a288:c2ff:fe3b:506a", Type: "IB/RoCE v1"},
		{Index: 5, GID: "2010:0200:0000:0002:a288:c2ff:fe3b:506a", Type: "RoCE v2"},
	}}
	if ipv4 {
		p.RoCEv2GIDIndex = 3
		p.GIDs = append(p.GIDs,
			hca.GID{Index: 2, GID: "0000:0000:0000:0000:0000:ffff:0ac8:010a", Type: "IB/RoCE v1"},
			hca.GID{Index: 3, GID: "0000:0000:0000:0000:0000:ffff:0ac8:010a", Type: "RoCE v2"})
	}
	return p
}

func TestGIDHintsByNetwork(t *testing.T) {
	dual := []hca.HCA{roceHCA(0, dualStack(true)), roceHCA(1, dualStack(true))}
	v6only := []hca.HCA{roceHCA(0, dualStack(false))}
	hostIndex := func(i string) []string { return []string{"NCCL_IB_GID_INDEX=" + i, "UCX_IB_GID_INDEX=" + i} }
	podFamily := func(f string) []string { return []string{"NCCL_IB_ADDR_FAMILY=" + f, "NCCL_IB_ROCE_VERSION_NUM=2"} }
	tests := []struct {
		name    string
		group   []hca.HCA
		network Network
		family  AddressFamily
		want    []string // the GID hints only
	}{
		{"host, auto: IPv4 first", dual, NetworkHost, FamilyAuto, hostIndex("3")},
		{"record without network is host", dual, "", FamilyAuto, hostIndex("3")},
		{"host, IPv4", dual, NetworkHost, FamilyIPv4, hostIndex("3")},
		{"host, IPv6: global, not link-local", dual, NetworkHost, FamilyIPv6, hostIndex("5")},
		{"host, auto on an IPv6-only port", v6only, NetworkHost, FamilyAuto, hostIndex("5")},
		{"host, IPv4 asked, port has none", v6only, NetworkHost, FamilyIPv4, nil},
		{"pod: no host index, NCCL picks by family", dual, NetworkPod, FamilyAuto, podFamily("AF_INET")},
		{"pod, IPv6 (the Lingjun mode)", dual, NetworkPod, FamilyIPv6, podFamily("AF_INET6")},
		{"pod, IPv4", v6only, NetworkPod, FamilyIPv4, podFamily("AF_INET")},
		{"mixed pods: no index either", dual, NetworkUnknown, FamilyIPv6, podFamily("AF_INET6")},
		{"InfiniBand: no GID hints in any mode", []hca.HCA{ibHCA(0)}, NetworkPod, FamilyIPv6, nil},
		{"InfiniBand on the host", []hca.HCA{ibHCA(0)}, NetworkHost, FamilyAuto, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, kv := range CommonEdits(nil, tt.group, EditOptions{Env: true, Network: tt.network, Family: tt.family}).Env {
				name, _, _ := strings.Cut(kv, "=")
				switch name {
				case EnvNCCLGIDIndex, EnvUCXGIDIndex, EnvNCCLAddrFamily, EnvNCCLRoCEVersion:
					got = append(got, kv)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GID hints (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHooks(t *testing.T) {
	const path = "/opt/rdma-dra-driver/bin/rdma-dra-hook"
	tests := []struct {
		name        string
		hook        *cdispec.Hook
		wantArgs    []string
		wantTimeout int
	}{
		{"netns", NetnsHook(path, "mlx5_0", false, []string{"10.0.0.5"}), []string{"rdma-dra-hook", "netns", "--device=mlx5_0"}, NetnsHookTimeout},
		{"netns with netdevs: found by the hook, never named", NetnsHook(path, "mlx5_0", true, []string{"10.0.0.5", "fd00::5"}),
			[]string{"rdma-dra-hook", "netns", "--device=mlx5_0", "--move-netdevs", "--node-ip=10.0.0.5", "--node-ip=fd00::5"}, NetnsHookTimeout},
		{"limit", LimitHook(path, "mlx5_0", 4, 0), []string{"rdma-dra-hook", "limit", "--device=mlx5_0", "--hca-handle=4", "--hca-object=max"}, HookTimeout},
		{"limit with its pods'", LimitHook(path, "mlx5_0", 4, 0, PodLimit{UID: "u-1", Handles: 6}, PodLimit{UID: AnyPod, Objects: 9}),
			[]string{"rdma-dra-hook", "limit", "--device=mlx5_0", "--hca-handle=4", "--hca-object=max", "--pod=u-1:6:max", "--pod=*:max:9"}, HookTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.hook
			if h.HookName != "createRuntime" || h.Path != path || h.Timeout == nil || *h.Timeout != tt.wantTimeout {
				t.Errorf("hook %+v, want createRuntime %s with timeout %d", h, path, tt.wantTimeout)
			}
			if diff := cmp.Diff(tt.wantArgs, h.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
}
