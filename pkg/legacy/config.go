package legacy

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
)

const (
	// DefaultResourceName is the resource ack-rdma-device-plugin serves.
	DefaultResourceName = "rdma/hca"
	// DefaultShares is how many IDs that plugin advertises ("1k").
	DefaultShares = 1000
	// MaxShares bounds Shares: far above any node's pod limit, and a
	// ListAndWatch response well below gRPC's 4 MiB message limit.
	MaxShares = 10000
	// DefaultPollInterval is how often Run checks the device-plugin
	// directory for a kubelet restart.
	DefaultPollInterval = 500 * time.Millisecond

	// KubeletSocketName is the kubelet's registration socket in
	// Config.DevicePluginDir.
	KubeletSocketName = "kubelet.sock"

	// SpecUID is the pseudo claim UID of the node-wide spec file in
	// Config.CDI: <dir>/rdma.dra.dev-hca_device-plugin.json. No DRA claim
	// has it: claim UIDs are UUIDs.
	SpecUID = "device-plugin"
	// DeviceName is the node-wide CDI device, every usable HCA; Allocate
	// hands out its qualified name, rdma.dra.dev/hca=all. "all" says what
	// the container gets, as nvidia.com/gpu=all does, and cannot clash with
	// a claim's devices, whose names start with the claim UID.
	DeviceName = "all"

	// maxSocketPath is the longest path a unix socket can have on Linux
	// (sun_path is 108 bytes, NUL included).
	maxSocketPath = 107
)

// Values of the daemon's --legacy and --sharing flags that ValidateMode
// knows.
const (
	LegacyOff          = "off"
	LegacyDevicePlugin = "device-plugin"
	SharingShared      = "shared"
)

// Config is what the daemon's flags decide.
type Config struct {
	// ResourceName is the extended resource served; DefaultResourceName
	// when empty. It must be an extended resource name the kubelet accepts
	// ("<domain>/<name>", not in kubernetes.io).
	ResourceName string
	// Shares is the number of device IDs advertised; DefaultShares when 0,
	// at most MaxShares.
	Shares int
	// DevicePluginDir is <kubelet-root>/device-plugins, an absolute path:
	// kubelet.sock is there, and so is the plugin's socket,
	// SocketName(ResourceName).
	DevicePluginDir string
	// CDI is where the node-wide spec file goes; required. It may be the
	// DRA driver's directory (see SpecUID).
	CDI *cdi.SpecDir
	// EditOptions are those of every HCA's edits: HostDevRoot as the
	// runtime sees the host's /dev, Env for the RDMA_DEVICE_*, RDMA_DEVICES
	// and NCCL/UCX variables (the daemon should set it: legacy pods expect
	// them), ManagementDevices for umad/issm.
	EditOptions cdi.EditOptions
	// PollInterval is how often Run looks for a kubelet restart;
	// DefaultPollInterval when 0.
	PollInterval time.Duration
	// Hooks, when HookPath is set, are the container-start hooks the
	// node-wide device carries (rdma-dra-hook at that host path).
	Hooks Hooks
}

// Hooks are what every container given the node-wide device runs before
// its process starts. The device plugin sees no pod (Allocate gets device
// IDs only), so the container's start is where its policies hold.
type Hooks struct {
	// HookPath is the host path of rdma-dra-hook; empty: no hooks.
	HookPath string
	// HostNetworkOnly refuses a container that is not on the host network
	// (--allow-non-host-network=false). Allocate then answers with the CDI
	// device alone: device nodes handed to the runtime directly would reach
	// a container that skips the check.
	HostNetworkOnly bool
	// HCAHandles and HCAObjects > 0 set every container's rdma.max on each
	// HCA (the node's default limits), and its pod's: the plugin is not told
	// the pod, so a pod gets them once, for all its containers together; 0
	// leaves that resource unlimited.
	HCAHandles, HCAObjects int64
	// Memlock is the RLIMIT_MEMLOCK every container gets ("unlimited" or
	// a byte count, as the hook takes it); empty: no memlock hook.
	Memlock string
}

// SocketName is the plugin socket's file name for a resource name: "/" and
// anything else not safe in a file name become "-", so rdma/hca gives
// rdma-hca.sock.
func SocketName(resourceName string) string {
	b := []byte(resourceName)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b) + ".sock"
}

// withDefaults fills in defaults and checks cfg.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.ResourceName == "" {
		cfg.ResourceName = DefaultResourceName
	}
	if cfg.Shares == 0 {
		cfg.Shares = DefaultShares
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if err := checkResourceName(cfg.ResourceName); err != nil {
		return cfg, err
	}
	if cfg.Shares < 1 || cfg.Shares > MaxShares {
		return cfg, fmt.Errorf("device plugin for %s: shares %d out of range 1..%d", cfg.ResourceName, cfg.Shares, MaxShares)
	}
	if cfg.PollInterval < 0 {
		return cfg, fmt.Errorf("device plugin for %s: negative poll interval %s", cfg.ResourceName, cfg.PollInterval)
	}
	if h := cfg.Hooks; h.HookPath != "" && !filepath.IsAbs(h.HookPath) {
		return cfg, fmt.Errorf("device plugin for %s: hook path %q is not an absolute path", cfg.ResourceName, h.HookPath)
	}
	if h := cfg.Hooks; h.HookPath == "" && (h.HostNetworkOnly || h.HCAHandles > 0 || h.HCAObjects > 0 || h.Memlock != "") {
		return cfg, fmt.Errorf("device plugin for %s: the hostNetwork check, RDMA cgroup limits and memlock need the hook's host path", cfg.ResourceName)
	}
	if cfg.CDI == nil {
		return cfg, fmt.Errorf("device plugin for %s: no CDI spec directory", cfg.ResourceName)
	}
	if !filepath.IsAbs(cfg.DevicePluginDir) {
		return cfg, fmt.Errorf("device plugin for %s: device-plugin directory %q is not an absolute path", cfg.ResourceName, cfg.DevicePluginDir)
	}
	cfg.DevicePluginDir = filepath.Clean(cfg.DevicePluginDir)
	for _, name := range []string{SocketName(cfg.ResourceName), KubeletSocketName} {
		if p := filepath.Join(cfg.DevicePluginDir, name); len(p) > maxSocketPath {
			return cfg, fmt.Errorf("device plugin for %s: socket path %s is %d bytes, longer than the %d a unix socket allows", cfg.ResourceName, p, len(p), maxSocketPath)
		}
	}
	return cfg, nil
}

// checkResourceName refuses what the kubelet's Register refuses: native
// resource names and names that are not qualified names, also with the
// quota prefix "requests." in front.
func checkResourceName(name string) error {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return fmt.Errorf("resource name %q is not an extended resource name (<domain>/<name>, outside kubernetes.io)", name)
	}
	for _, n := range []string{name, "requests." + name} {
		if errs := validation.IsQualifiedName(n); len(errs) > 0 {
			return fmt.Errorf("resource name %q: %s", name, strings.Join(errs, "; "))
		}
	}
	return nil
}

// ValidateMode checks the daemon's --legacy and --sharing flags together.
// The device-plugin route gives every HCA to every container that asks for
// the resource, so the HCAs are shared by construction: it needs
// --sharing=shared. Other --legacy values and the values of --sharing are
// the daemon's to check; ValidateMode only refuses combinations that would
// break the promise of --sharing.
func ValidateMode(legacy, sharing string) error {
	if legacy != LegacyDevicePlugin {
		return nil
	}
	if sharing == SharingShared {
		return nil
	}
	if sharing == "" {
		sharing = "(unset)"
	}
	return errors.New("--legacy=device-plugin hands every HCA to every rdma/hca pod, so it needs --sharing=shared (the HCAs are shared), not --sharing=" +
		sharing + "; set --sharing=shared or use --legacy=off")
}

// of is the hooks of the node-wide device giving a container hcas, in the
// order they must run: the hostNetwork check before anything is set up.
func (h Hooks) of(hcas []string) []*cdispec.Hook {
	if h.HookPath == "" || len(hcas) == 0 {
		return nil
	}
	var out []*cdispec.Hook
	if h.HostNetworkOnly {
		out = append(out, cdi.HostNetworkHook(h.HookPath, hcas))
	}
	if h.HCAHandles > 0 || h.HCAObjects > 0 {
		for _, name := range hcas {
			out = append(out, cdi.LimitHook(h.HookPath, name, h.HCAHandles, h.HCAObjects, cdi.PodLimit{UID: cdi.AnyPod, Handles: h.HCAHandles, Objects: h.HCAObjects}))
		}
	}
	if h.Memlock != "" {
		out = append(out, cdi.MemlockHook(h.HookPath, hcas, h.Memlock))
	}
	return out
}
