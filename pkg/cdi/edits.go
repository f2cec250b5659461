package cdi

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

const (
	// ContainerDevDir is where RDMA device nodes appear in a container:
	// libibverbs and librdmacm open them there, whatever the host layout.
	ContainerDevDir = "/dev/infiniband"
	// DefaultHostDevRoot is the host's /dev as the runtime sees it.
	DefaultHostDevRoot = "/dev"

	// nodeAccess is the device cgroup access: read and write, no mknod.
	nodeAccess = "rw"
	// rdmaCMName is fixed: librdmacm opens /dev/infiniband/rdma_cm by name.
	rdmaCMName = "rdma_cm"
)

// Variables set when EditOptions.Env is on.
const (
	// EnvDevicePrefix + the sanitized ibdev name is the per-HCA variable.
	EnvDevicePrefix = "RDMA_DEVICE_"
	EnvDevices      = "RDMA_DEVICES"
	EnvNCCLHCA      = "NCCL_IB_HCA"
	EnvNCCLGIDIndex = "NCCL_IB_GID_INDEX"
	EnvUCXDevices   = "UCX_NET_DEVICES"
	EnvUCXGIDIndex  = "UCX_IB_GID_INDEX"
	// EnvNCCLAddrFamily and EnvNCCLRoCEVersion steer NCCL's own GID choice
	// (NCCL 2.21 and later) where the host's index would be wrong.
	EnvNCCLAddrFamily  = "NCCL_IB_ADDR_FAMILY"
	EnvNCCLRoCEVersion = "NCCL_IB_ROCE_VERSION_NUM"
	// EnvNCCLPKey takes the P_Key's index in the port's table, EnvUCXPKey
	// the partition (the P_Key without its membership bit).
	EnvNCCLPKey = "NCCL_IB_PKEY"
	EnvUCXPKey  = "UCX_IB_PKEY"
)

// Network is how the containers of a claim reach the network. It decides
// whether the host's GID table is theirs: a GID index is a position in the
// port's table, and a pod on its own network has its address, and so its
// GID, at a different position than the host's.
type Network string

const (
	// NetworkHost: every pod of the claim uses hostNetwork.
	NetworkHost Network = "host"
	// NetworkPod: every pod of the claim has its own network namespace.
	NetworkPod Network = "pod"
	// NetworkUnknown: pods of both kinds, or they could not be looked up.
	NetworkUnknown Network = "unknown"
)

// AddressFamily is the IP family of RoCE traffic; see EditOptions. Not the
// API's type: pkg/cdi does not import the API (nor apimachinery), and Auto
// is the zero value here, as in the checkpoint; pkg/draplugin maps one to the
// other.
type AddressFamily string

const (
	// FamilyAuto prefers IPv4 GIDs and falls back to IPv6 ones.
	FamilyAuto AddressFamily = ""
	FamilyIPv4 AddressFamily = "IPv4"
	FamilyIPv6 AddressFamily = "IPv6"
)

// EditOptions says what the edits of an HCA include.
type EditOptions struct {
	// ManagementDevices also exposes the HCA's MAD devices (umadN, issmN),
	// which let a container run subnet-management and diagnostic tools.
	// CommonEdits ignores it.
	ManagementDevices bool
	// Env sets the environment hints described at DeviceEdits and
	// CommonEdits.
	Env bool
	// HostDevRoot is the absolute path of the host's /dev as the runtime
	// sees it: DefaultHostDevRoot when empty, or a simulated node's dev
	// root such as /tmp/node/dev. Only host paths use it; container paths
	// are always ContainerDevDir/<name>.
	HostDevRoot string
	// Network and Family shape the GID hints of CommonEdits; DeviceEdits
	// ignores them. An empty Network is NetworkHost, what the driver
	// assumed before it recorded the network.
	Network Network
	Family  AddressFamily
	// PKey, when set, is the claim's partition: its P_Key and its index in
	// the tables of every port of the claim's HCAs. It adds NCCL_IB_PKEY
	// and UCX_IB_PKEY (CommonEdits).
	PKey *hca.PKey
	// ShmSizeMiB > 0 mounts a tmpfs of that size at /dev/shm
	// (CommonEdits), replacing the runtime's.
	ShmSizeMiB int64
}

func (o EditOptions) hostDevRoot() string {
	if o.HostDevRoot == "" {
		return DefaultHostDevRoot
	}
	return filepath.Clean(o.HostDevRoot)
}

// DeviceEdits returns what one HCA adds to a container: its uverbs node,
// plus its MAD nodes when opts.ManagementDevices is set. Each node is
// ContainerDevDir/<name> in the container and <HostDevRoot>/infiniband/<name>
// on the host, a character device with the major and minor numbers
// discovery read from sysfs, and device cgroup access "rw". Nodes are
// sorted by path. The mode and owner are left to the runtime's CDI library:
// it copies the host node's mode (udev's: 0666 for uverbs and rdma_cm,
// 0600 for umad and issm) and makes the container's user, when not root,
// the node's owner (docs/security.md, "Device nodes").
//
// With opts.Env it also sets RDMA_DEVICE_<IBDEV>=/dev/infiniband/uverbsN,
// IBDEV being the ibdev name upper-cased with every character other than a
// letter or digit turned into "_" (mlx5_0 gives RDMA_DEVICE_MLX5_0). An
// ibdev name is unique on a node, so this variable never clashes between
// claims.
//
// It fails, naming the HCA, when the HCA has no uverbs device, when a node
// has no device number or a name that is not a plain file name, or when
// HostDevRoot is relative. Whether an HCA is usable at all (hca.HCA.Usable)
// is the caller's decision.
func DeviceEdits(h hca.HCA, opts EditOptions) (cdispec.ContainerEdits, error) {
	root := opts.hostDevRoot()
	if !filepath.IsAbs(root) {
		return cdispec.ContainerEdits{}, fmt.Errorf("HCA %s: host dev root %q is not an absolute path", h.Name, opts.HostDevRoot)
	}
	if h.Uverbs == nil {
		return cdispec.ContainerEdits{}, fmt.Errorf("HCA %s has no uverbs device (is ib_uverbs loaded?)", h.Name)
	}
	chars := []hca.CharDevice{*h.Uverbs}
	if opts.ManagementDevices {
		chars = append(chars, h.MAD...)
	}
	var edits cdispec.ContainerEdits
	for _, c := range chars {
		if err := checkCharDevice(c); err != nil {
			return cdispec.ContainerEdits{}, fmt.Errorf("HCA %s: %w", h.Name, err)
		}
		edits.DeviceNodes = append(edits.DeviceNodes, deviceNode(c.Name, c, root))
	}
	slices.SortFunc(edits.DeviceNodes, func(a, b *cdispec.DeviceNode) int { return strings.Compare(a.Path, b.Path) })
	if opts.Env {
		edits.Env = []string{DeviceEnvName(h.Name) + "=" + ContainerDevDir + "/" + h.Uverbs.Name}
	}
	return edits, nil
}

// DeviceEnvName is the name of the per-HCA variable of ibdev.
func DeviceEnvName(ibdev string) string {
	b := []byte(strings.ToUpper(ibdev))
	for i, c := range b {
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			b[i] = '_'
		}
	}
	return EnvDevicePrefix + string(b)
}

// CommonEdits returns the edits every device of a claim shares, to be the
// spec-level edits of the claim's spec file: the rdma_cm node (when rdmaCM
// is not nil; same node attributes as at DeviceEdits) and, with opts.Env,
// these aggregate hints over group, sorted by name:
//
//	NCCL_IB_HCA==mlx5_0,mlx5_1          "=" is NCCL's exact-match prefix: without it mlx5_1 also selects mlx5_10
//	RDMA_DEVICES=mlx5_0,mlx5_1          ibdev names, sorted, deduplicated
//	UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1   the group's ACTIVE ports; every port when none is active
//
// When every HCA of group is RoCE, also the GID hints, by opts.Network:
//
//	host:  NCCL_IB_GID_INDEX=3, UCX_IB_GID_INDEX=3
//	       the RoCE v2 GID index of opts.Family that every port listed in
//	       UCX_NET_DEVICES has; none when they disagree or have none, since
//	       the libraries' own choice is better than a wrong guess
//	pod, unknown:
//	       NCCL_IB_ADDR_FAMILY=AF_INET (AF_INET6 for FamilyIPv6),
//	       NCCL_IB_ROCE_VERSION_NUM=2
//	       no index: the host's positions are not the pod's, so NCCL picks
//	       the RoCE v2 GID of that family itself (UCX's auto choice likewise)
//
// group is the set of HCAs the container will see, which is the union over
// all claims the container uses. The runtime keeps the last value of a
// variable, so claims used together must be given the same group. An empty
// group sets no aggregate variables. opts.ManagementDevices is ignored.
//
// CommonEdits cannot fail; an rdmaCM without a device number is caught by
// SpecDir.WriteClaim.
func CommonEdits(rdmaCM *hca.CharDevice, group []hca.HCA, opts EditOptions) cdispec.ContainerEdits {
	var edits cdispec.ContainerEdits
	if rdmaCM != nil {
		edits.DeviceNodes = []*cdispec.DeviceNode{deviceNode(rdmaCMName, *rdmaCM, opts.hostDevRoot())}
	}
	if opts.Env {
		edits.Env = aggregateEnv(group, opts)
	}
	if opts.ShmSizeMiB > 0 {
		edits.Mounts = []*cdispec.Mount{ShmMount(opts.ShmSizeMiB)}
	}
	return edits
}

// ShmMount is a memory-backed /dev/shm of sizeMiB: what the runtime's own
// is (nosuid, nodev, noexec, world-writable with the sticky bit), bigger.
// The CDI library removes the runtime's /dev/shm mount before adding it.
func ShmMount(sizeMiB int64) *cdispec.Mount {
	return &cdispec.Mount{HostPath: "shm", ContainerPath: "/dev/shm", Type: "tmpfs",
		Options: []string{"nosuid", "nodev", "noexec", "mode=1777", fmt.Sprintf("size=%dm", sizeMiB)}}
}

// aggregateEnv computes CommonEdits' variables, sorted by name.
func aggregateEnv(group []hca.HCA, opts EditOptions) []string {
	byName := map[string]hca.HCA{}
	for _, h := range group {
		byName[h.Name] = h
	}
	if len(byName) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(byName))

	// The ports UCX (and NCCL) should use.
	var active, all []hcaPort
	for _, n := range names {
		for _, p := range byName[n].Ports {
			all = append(all, hcaPort{n, p})
			if p.Active() {
				active = append(active, hcaPort{n, p})
			}
		}
	}
	ports := active
	if len(ports) == 0 {
		ports = all
	}

	list := strings.Join(names, ",")
	env := map[string]string{
		EnvDevices: list,
		EnvNCCLHCA: "=" + list,
	}
	if len(ports) > 0 {
		ucx := make([]string, len(ports))
		for i, p := range ports {
			ucx[i] = p.name + ":" + strconv.Itoa(p.p.Number)
		}
		env[EnvUCXDevices] = strings.Join(ucx, ",")
	}

	if k := opts.PKey; k != nil {
		env[EnvNCCLPKey] = strconv.Itoa(k.Index)
		env[EnvUCXPKey] = fmt.Sprintf("0x%04x", k.Value&0x7fff)
	}

	if allRoCE(names, byName) {
		switch opts.Network {
		case NetworkHost, "":
			if gid, ok := commonGIDIndex(ports, opts.Family); ok {
				env[EnvNCCLGIDIndex] = strconv.Itoa(gid)
				env[EnvUCXGIDIndex] = strconv.Itoa(gid)
			}
		default:
			env[EnvNCCLAddrFamily] = "AF_INET"
			if opts.Family == FamilyIPv6 {
				env[EnvNCCLAddrFamily] = "AF_INET6"
			}
			env[EnvNCCLRoCEVersion] = "2"
		}
	}

	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// hcaPort is a port and the name of its HCA.
type hcaPort struct {
	name string
	p    hca.Port
}

// allRoCE reports whether the group is non-empty and all RoCE.
func allRoCE(names []string, byName map[string]hca.HCA) bool {
	for _, n := range names {
		if byName[n].Transport() != hca.TransportRoCE {
			return false
		}
	}
	return len(names) > 0
}

// commonGIDIndex is the RoCE v2 GID index of family every port agrees on,
// if there is one.
func commonGIDIndex(ports []hcaPort, family AddressFamily) (int, bool) {
	if len(ports) == 0 {
		return 0, false
	}
	gid := roceV2Index(ports[0].p, family)
	for _, p := range ports {
		if roceV2Index(p.p, family) != gid {
			return 0, false
		}
	}
	return gid, gid >= 0
}

// roceV2Index is the lowest index of a RoCE v2 GID of family on p, or -1.
// An IPv6 GID must be routable (not link-local), as NCCL requires.
func roceV2Index(p hca.Port, family AddressFamily) int {
	if family == FamilyAuto {
		return p.RoCEv2GIDIndex
	}
	for _, g := range p.GIDs {
		if g.Type != "RoCE v2" {
			continue
		}
		a, err := netip.ParseAddr(g.GID)
		if err != nil {
			continue
		}
		if family == FamilyIPv4 && a.Is4In6() || family == FamilyIPv6 && !a.Is4In6() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() {
			return g.Index
		}
	}
	return -1
}

// checkCharDevice rejects what would make a wrong or host-dependent node.
func checkCharDevice(c hca.CharDevice) error {
	if c.Name == "" || c.Name == "." || c.Name == ".." || strings.ContainsAny(c.Name, "/\x00") {
		return fmt.Errorf("device node name %q is not a file name", c.Name)
	}
	if c.Major == 0 {
		return fmt.Errorf("device %s has no device number (major 0)", c.Name)
	}
	return nil
}

// deviceNode is the CDI node of c, named name: type and numbers set, the
// mode the host node's (see DeviceEdits).
func deviceNode(name string, c hca.CharDevice, root string) *cdispec.DeviceNode {
	return &cdispec.DeviceNode{
		Path:        ContainerDevDir + "/" + name,
		HostPath:    filepath.Join(root, "infiniband", name),
		Type:        "c",
		Major:       int64(c.Major),
		Minor:       int64(c.Minor),
		Permissions: nodeAccess,
	}
}

// NodeEdits is what a container gets when it is handed every HCA in hcas
// (the legacy rdma/hca routes): each HCA's DeviceEdits, in order.
func NodeEdits(hcas []hca.HCA, opts EditOptions) (cdispec.ContainerEdits, error) {
	var all cdispec.ContainerEdits
	for _, h := range hcas {
		edits, err := DeviceEdits(h, opts)
		if err != nil {
			return cdispec.ContainerEdits{}, err
		}
		all.DeviceNodes = append(all.DeviceNodes, edits.DeviceNodes...)
		all.Env = append(all.Env, edits.Env...)
	}
	return all, nil
}

// HookTimeout bounds the limit hook's run, in seconds: it only writes one file.
const HookTimeout = 10

// NetnsHookTimeout bounds the netns hook's run, in seconds: the kernel
// disassociates the device's users and re-registers it in the new namespace.
const NetnsHookTimeout = 30

// NetnsHook is the OCI createRuntime hook that moves an HCA (and, with
// moveNetdevs, the netdevs the kernel names for its ports when the hook
// runs, never names written now) into the container's network namespace,
// for pods without hostNetwork on nodes in exclusive RDMA netns mode. A
// netdev holding one of nodeIPs (the Node's InternalIPs) or carrying the
// default route stays. It must come before any other hook of the device.
func NetnsHook(hookPath, ibdev string, moveNetdevs bool, nodeIPs []string) *cdispec.Hook {
	args := []string{filepath.Base(hookPath), "netns", "--device=" + ibdev}
	if moveNetdevs {
		args = append(args, "--move-netdevs")
		for _, ip := range nodeIPs {
			args = append(args, "--node-ip="+ip)
		}
	}
	timeout := NetnsHookTimeout
	return &cdispec.Hook{HookName: "createRuntime", Path: hookPath, Args: args, Timeout: &timeout}
}

// LimitHook is the OCI createRuntime hook that sets a container's rdma.max
// for ibdev, handles and objects being 0 for "not limited". hookPath is the
// host path of rdma-dra-hook. The runtime runs it before the container's
// process starts and refuses the container if it fails. pods, when given,
// are the limits of the pods the container may be in: the hook also sets
// its pod's rdma.max (the cgroup above the container's) to its pod's.
func LimitHook(hookPath, ibdev string, handles, objects int64, pods ...PodLimit) *cdispec.Hook {
	args := []string{filepath.Base(hookPath), "limit", "--device=" + ibdev, "--hca-handle=" + limitValue(handles), "--hca-object=" + limitValue(objects)}
	for _, p := range pods {
		args = append(args, "--pod="+p.UID+":"+limitValue(p.Handles)+":"+limitValue(p.Objects))
	}
	timeout := HookTimeout
	return &cdispec.Hook{
		HookName: "createRuntime",
		Path:     hookPath,
		Args:     args,
		Timeout:  &timeout,
	}
}

// AnyPod as a PodLimit's UID stands for every pod (the device-plugin route,
// which is not told the pod).
const AnyPod = "*"

// PodLimit is the rdma.max of one pod's cgroup on an HCA: what all its
// processes may hold together, 0 for "not limited".
type PodLimit struct {
	UID              string
	Handles, Objects int64
}

func limitValue(n int64) string {
	if n <= 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}
