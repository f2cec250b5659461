package v1alpha1

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/pkey"
)

// HcaConfig is the per-request configuration of the devices the driver
// prepares. Every field is optional; a nil field means "as configured
// earlier", and in the end the default (see Merge).
//
// TypeMeta is the apimachinery type rather than a local copy: the driver
// links apimachinery anyway, and it keeps the type registrable in a
// runtime.Scheme (say, for a validating webhook) without changing its shape.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type HcaConfig struct {
	metav1.TypeMeta `json:",inline"`

	// ManagementDevices also exposes every umadN and issmN of the HCA's
	// ports, for MAD tools such as ibstat or perfquery. Default false: they
	// allow sending management datagrams to the fabric.
	ManagementDevices *bool `json:"managementDevices,omitempty"`

	// Env sets the RDMA_DEVICES, NCCL_IB_HCA and UCX_NET_DEVICES hints in
	// the container. Default true.
	Env *bool `json:"env,omitempty"`

	// AddressFamily is the IP family RDMA traffic over RoCE uses, which
	// decides the GID the NCCL and UCX hints point at: a hostNetwork pod
	// gets the host's GID index of that family, a pod on its own network
	// gets NCCL_IB_ADDR_FAMILY so NCCL picks the GID of the pod's own
	// address. Default Auto: IPv4 where the port has an IPv4 GID, else
	// IPv6. Set IPv6 for clusters whose pods are IPv6-only (the ACK Lingjun
	// non-hostNetwork mode), best in the DeviceClass's config.
	AddressFamily *AddressFamily `json:"addressFamily,omitempty"`

	// PKey is the InfiniBand partition the claim's traffic uses, as a hex
	// P_Key ("0x8001"; the 0x8000 bit asks for full membership). Prepare
	// fails, naming the HCA, port and key, unless every port of every
	// allocated HCA has it in its P_Key table; NCCL_IB_PKEY (its index) and
	// UCX_IB_PKEY are then set. Default: none (the default partition).
	PKey *string `json:"pkey,omitempty"`

	// MoveNetdev also moves the HCA's netdevs (its Ethernet or IPoIB
	// interfaces) into the pod's network namespace with the RDMA device,
	// on nodes whose RDMA subsystem is in exclusive netns mode and for pods
	// without hostNetwork (a RoCE HCA's GIDs follow its netdev's
	// addresses). The host loses the interface until the pod's namespace
	// goes away. Only a DeviceClass may turn it on. The hook finds the
	// netdevs by identity when it moves them, and never moves one that
	// carries the host's default route or holds the Node's InternalIP
	// (refused at prepare and at the move). Default false; ignored where
	// no move happens.
	MoveNetdev *bool `json:"moveNetdev,omitempty"`

	// Memlock is the locked-memory limit (RLIMIT_MEMLOCK, soft and hard)
	// the node's hook gives each container that gets the devices, so it
	// registers memory regions without CAP_IPC_LOCK: "unlimited" or a
	// quantity of bytes ("256Mi"). A DeviceClass's value is the ceiling;
	// a claim may ask for less, never more. Default: the node's --memlock
	// (Helm value memlock, unlimited unless the admin changed it). The
	// pod's memory cgroup still bounds what is pinned.
	Memlock *string `json:"memlock,omitempty"`
}

// AddressFamily is an IP address family for RoCE traffic.
type AddressFamily string

// The values of HcaConfig.AddressFamily.
const (
	AddressFamilyAuto AddressFamily = "Auto"
	AddressFamilyIPv4 AddressFamily = "IPv4"
	AddressFamilyIPv6 AddressFamily = "IPv6"
)

// addressFamilies are the valid values, in the order error messages list them.
var addressFamilies = []AddressFamily{AddressFamilyAuto, AddressFamilyIPv4, AddressFamilyIPv6}

// DefaultHcaConfig returns the defaults, with every field set and the
// TypeMeta filled in. Each call returns a new value the caller may change.
func DefaultHcaConfig() *HcaConfig {
	return &HcaConfig{
		TypeMeta:          metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		ManagementDevices: ptr(false),
		Env:               ptr(true),
		AddressFamily:     ptr(AddressFamilyAuto),
		MoveNetdev:        ptr(false),
	}
}

// Validate reports what Decode would reject in a config built in code: a
// missing or wrong apiVersion or kind, or an unknown AddressFamily. Every
// combination of valid fields is valid.
func (c *HcaConfig) Validate() error {
	if c == nil {
		return errors.New("HcaConfig: no config")
	}
	if err := checkTypeMeta("apiVersion", c.APIVersion, APIVersion); err != nil {
		return err
	}
	if err := checkTypeMeta("kind", c.Kind, Kind); err != nil {
		return err
	}
	if c.AddressFamily != nil && !slices.Contains(addressFamilies, *c.AddressFamily) {
		return fmt.Errorf("addressFamily: want one of %s, got %q", listFamilies(), *c.AddressFamily)
	}
	if c.PKey != nil {
		if _, err := ParsePKey(*c.PKey); err != nil {
			return err
		}
	}
	if c.Memlock != nil {
		if _, err := ParseMemlock(*c.Memlock); err != nil {
			return fmt.Errorf("memlock: %w", err)
		}
	}
	return nil
}

// ParsePKey reads HcaConfig.PKey: 1 to 4 hex digits, with or without
// "0x", naming a partition (not the empty 0x0000/0x8000). The parser is
// pkg/hca/pkey's, the one that also reads the ports' tables.
func ParsePKey(s string) (uint16, error) {
	v, err := pkey.ParsePartition(s)
	if err != nil {
		return 0, fmt.Errorf("pkey: %w", err)
	}
	return v, nil
}

func listFamilies() string {
	q := make([]string, len(addressFamilies))
	for i, f := range addressFamilies {
		q[i] = strconv.Quote(string(f))
	}
	return strings.Join(q, ", ")
}

func checkTypeMeta(field, got, want string) error {
	switch got {
	case want:
		return nil
	case "":
		return fmt.Errorf("%s: missing; want %q", field, want)
	default:
		return fmt.Errorf("%s: want %q, got %q", field, want, got)
	}
}

// Merge returns the effective config of a chain of configs: the defaults,
// then each config in order, a set field replacing the earlier value and a
// nil field (or a nil config) leaving it. Pass the DeviceClass's configs
// before the claim's so the claim wins.
//
// The result has every field set and shares no pointer with the inputs.
// Every field but TypeMeta is a pointer (a test checks), so Merge needs no
// list of them.
func Merge(configs ...*HcaConfig) *HcaConfig {
	out := DefaultHcaConfig()
	dst := reflect.ValueOf(out).Elem()
	for _, c := range configs {
		if c == nil {
			continue
		}
		src := reflect.ValueOf(c.DeepCopy()).Elem()
		for i := range src.NumField() {
			if f := src.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
				dst.Field(i).Set(f)
			}
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// AdminOnlyFields are the HcaConfig fields a claim may not turn on by
// itself: only a DeviceClass's config (written by the cluster's admin)
// grants them. managementDevices hands out umad/issm, from which a pod can
// send management datagrams to the fabric or act as a subnet manager;
// moveNetdev takes the HCA's Ethernet or IPoIB interface away from the
// node. A claim may still turn them off, or repeat what its class grants.
//
// memlock is bounded rather than granted: a claim may lower what its class
// (or the node) gives, never raise it (Memlock.Exceeds).
//
// The other fields only shape what a container is told (env, addressFamily,
// pkey: NCCL_IB_PKEY is a hint, the partition table the subnet manager
// programs is the isolation), so a claim may set them. Limits are not
// config at all: a claim asks for capacity, the allocator bounds it by what
// the node publishes, and the node's defaults and --require-hca-limits are
// daemon flags.
var AdminOnlyFields = []string{"managementDevices", "moveNetdev"}

// BeyondGrant lists the admin-only fields (AdminOnlyFields) that c turns
// on although grant, the DeviceClass's merged config, does not.
func (c *HcaConfig) BeyondGrant(grant *HcaConfig) []string {
	if c == nil {
		return nil
	}
	on := func(p *bool) bool { return p != nil && *p }
	var out []string
	if on(c.ManagementDevices) && (grant == nil || !on(grant.ManagementDevices)) {
		out = append(out, "managementDevices")
	}
	if on(c.MoveNetdev) && (grant == nil || !on(grant.MoveNetdev)) {
		out = append(out, "moveNetdev")
	}
	return out
}
