package legacy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
)

// Plugin is the device plugin of one extended resource. Update, Allocate
// and Run may run concurrently.
type Plugin struct {
	cfg      Config
	socket   string // our socket's path
	kubelet  string // kubelet.sock's path
	cdiID    string // qualified CDI device name
	specPath string
	ids      []string // the advertised device IDs, sorted

	writeMu sync.Mutex // serializes spec writes (Update, repair in Allocate)

	mu      sync.Mutex // guards the fields below
	st      state
	changed chan struct{} // closed, and replaced, when st.healthy changes
	running bool          // Run is active
}

// state is what the last successful Update computed.
type state struct {
	updated bool
	healthy bool
	hcas    []string // usable HCAs' names; empty: nothing to hand out
	why     string   // when hcas is empty: why there is none
	// What the spec file holds: the device's edits and the spec-level ones.
	device, common cdispec.ContainerEdits
}

// New checks cfg and returns a plugin that advertises every ID Unhealthy
// until the first Update. It touches nothing on disk.
func New(cfg Config) (*Plugin, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ids := make([]string, cfg.Shares)
	for i := range ids {
		ids[i] = ShareID(i)
	}
	return &Plugin{
		cfg:      cfg,
		socket:   filepath.Join(cfg.DevicePluginDir, SocketName(cfg.ResourceName)),
		kubelet:  filepath.Join(cfg.DevicePluginDir, KubeletSocketName),
		cdiID:    cdi.QualifiedName(DeviceName),
		specPath: cfg.CDI.Path(SpecUID),
		ids:      ids,
		changed:  make(chan struct{}),
	}, nil
}

// ShareID is the i-th advertised device ID: hca-0000, hca-0001, ... The
// IDs are the same across restarts, so the kubelet's checkpoint of which
// pod holds which ID stays valid.
func ShareID(i int) string { return fmt.Sprintf("hca-%04d", i) }

// SocketPath is the plugin's socket.
func (p *Plugin) SocketPath() string { return p.socket }

// CDIDevice is the qualified CDI device name Allocate hands out.
func (p *Plugin) CDIDevice() string { return p.cdiID }

// Update takes a discovery pass: it writes the node-wide CDI spec when its
// content changed (or the file is missing) and, when health changed, sends
// the new device list on every ListAndWatch stream.
//
// The spec holds one device, DeviceName, with the DeviceEdits of every
// usable HCA in inventory order, and CommonEdits(inv.RDMACM, usable HCAs)
// as the spec-level edits. With no usable HCA the spec file is removed and
// Allocate fails saying why. On error (an HCA whose edits cannot be built,
// a write that fails) nothing changes: the old spec file, the old health,
// and Allocate keeps answering from them.
func (p *Plugin) Update(inv hca.Inventory) error {
	next, err := p.compute(inv)
	if err != nil {
		return err
	}
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	p.mu.Lock()
	cur := p.st
	p.mu.Unlock()
	if err := p.syncSpec(cur, next); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if next.healthy != p.st.healthy {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.st = next
	return nil
}

// compute builds the state of inv without touching the disk.
func (p *Plugin) compute(inv hca.Inventory) (state, error) {
	st := state{updated: true}
	var usable []hca.HCA
	var unusable []string
	for _, h := range inv.HCAs {
		if !h.Usable {
			unusable = append(unusable, h.Name+": "+h.UnusableReason)
			continue
		}
		usable = append(usable, h)
		st.hcas = append(st.hcas, h.Name)
		st.healthy = st.healthy || h.AnyPortActive()
	}
	edits, err := cdi.NodeEdits(usable, p.cfg.EditOptions)
	if err != nil {
		return state{}, fmt.Errorf("device plugin for %s: %w", p.cfg.ResourceName, err)
	}
	st.device.DeviceNodes, st.device.Env = edits.DeviceNodes, edits.Env
	st.device.Hooks = p.cfg.Hooks.of(st.hcas)
	if len(usable) == 0 {
		st.why = "the node has no HCAs"
		if len(unusable) > 0 {
			st.why = "no HCA is usable (" + strings.Join(unusable, "; ") + ")"
		}
		return st, nil
	}
	st.common = cdi.CommonEdits(inv.RDMACM, usable, p.cfg.EditOptions)
	return st, nil
}

// syncSpec makes the spec file hold next, writing only on change.
func (p *Plugin) syncSpec(cur, next state) error {
	if len(next.hcas) == 0 {
		if err := p.cfg.CDI.RemoveClaim(SpecUID); err != nil {
			return fmt.Errorf("device plugin for %s: %w", p.cfg.ResourceName, err)
		}
		return nil
	}
	if len(cur.hcas) > 0 && apiequality.Semantic.DeepEqual(cur.device, next.device) &&
		apiequality.Semantic.DeepEqual(cur.common, next.common) && p.specExists() {
		return nil
	}
	return p.writeSpec(next)
}

func (p *Plugin) writeSpec(st state) error {
	err := p.cfg.CDI.WriteClaim(SpecUID, st.common, []cdi.ClaimDevice{{Name: DeviceName, Edits: st.device}})
	if err != nil {
		return fmt.Errorf("device plugin for %s: %w", p.cfg.ResourceName, err)
	}
	return nil
}

func (p *Plugin) specExists() bool {
	_, err := os.Stat(p.specPath)
	return err == nil
}

// repairSpec writes the spec file again if it vanished since the last
// Update (a DRA driver's cleanup, a tmpfs wiped): a container given the CDI
// device must find it.
func (p *Plugin) repairSpec() error {
	if _, err := os.Stat(p.specPath); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	if len(st.hcas) == 0 || p.specExists() {
		return nil
	}
	return p.writeSpec(st)
}

// health returns the current health and the channel that is closed when
// it changes.
func (p *Plugin) health() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.healthy, p.changed
}

// devices is the ListAndWatch response for a health. IDs carry no NUMA
// topology: each one stands for every HCA of the node.
func (p *Plugin) devices(healthy bool) *pluginapi.ListAndWatchResponse {
	h := pluginapi.Unhealthy
	if healthy {
		h = pluginapi.Healthy
	}
	resp := &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, len(p.ids))}
	for i, id := range p.ids {
		resp.Devices[i] = &pluginapi.Device{ID: id, Health: h}
	}
	return resp
}

// allocate answers one container request: the CDI device, and the same
// nodes and variables for runtimes without CDI: DeviceSpecs in spec order
// (each HCA's nodes, then rdma_cm), Envs from the same edits. Errors are
// gRPC statuses.
func (p *Plugin) allocate(req *pluginapi.ContainerAllocateRequest) (*pluginapi.ContainerAllocateResponse, error) {
	for _, id := range req.GetDevicesIds() {
		if _, ok := slices.BinarySearch(p.ids, id); !ok {
			return nil, status.Errorf(codes.InvalidArgument, "%s: device ID %q was never advertised (IDs are %s..%s)", p.cfg.ResourceName, id, p.ids[0], p.ids[len(p.ids)-1])
		}
	}
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	switch {
	case !st.updated:
		return nil, status.Errorf(codes.FailedPrecondition, "%s: the node's HCAs have not been discovered yet; retry once the driver has started", p.cfg.ResourceName)
	case len(st.hcas) == 0:
		return nil, status.Errorf(codes.FailedPrecondition, "%s: nothing to allocate: %s", p.cfg.ResourceName, st.why)
	}
	resp := &pluginapi.ContainerAllocateResponse{
		CdiDevices: []*pluginapi.CDIDevice{{Name: p.cdiID}},
	}
	if len(st.device.Hooks) > 0 {
		// Only the CDI device carries the hooks; nodes and variables
		// handed to the runtime directly would skip them. A runtime
		// without CDI then gets nothing: closed, not open.
		return resp, nil
	}
	for _, edits := range []cdispec.ContainerEdits{st.device, st.common} {
		for _, n := range edits.DeviceNodes {
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: n.HostPath, Permissions: n.Permissions})
		}
		for _, kv := range edits.Env {
			k, v, _ := strings.Cut(kv, "=")
			if resp.Envs == nil {
				resp.Envs = map[string]string{}
			}
			resp.Envs[k] = v
		}
	}
	return resp, nil
}
