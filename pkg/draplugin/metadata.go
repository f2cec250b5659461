package draplugin

// Device metadata (KEP-5304): per request of a claim, a JSON file the
// containers read under /var/run/kubernetes.io/dra-device-attributes, and a
// CDI spec that bind-mounts it.
//
// The driver writes them itself, in the kubeletplugin helper's layout (so a
// daemon of either kind, beside this one in a rolling update or after a
// rollback, finds and removes this one's files and the other way round),
// with two differences:
//   - no fsync (atomicfile.WithoutSync). The files are derived state: New
//     rewrites them from the checkpoint and the inventory at every start. A
//     SIGKILL loses nothing that reached the page cache, and a reboot
//     empties the CDI tmpfs anyway. The helper's writer fsyncs two files and
//     their directories per request, which made a prepare cost 1.35-1.8x a
//     minimal driver's.
//   - every file of ours is found again: unprepare removes a claim's temp
//     files with its files, and the sweep (start-up and every rescan tick)
//     removes those of claims the checkpoint does not hold, and temp files
//     a kill left, once old enough not to be another daemon's write in
//     progress.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/internal/atomicfile"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

const (
	// metadataSubdir is the helper's directory for metadata files under the
	// plugin data directory, one subdirectory per claim (namespace_name).
	metadataSubdir = "dra-device-metadata"
	metadataFile   = "metadata.json"
	tmpSuffix      = ".tmp"
)

// metadataFiles knows where a claim's metadata files go.
type metadataFiles struct {
	driver  string
	dataDir string // the plugin data directory
	cdiDir  string
}

func (m metadataFiles) root() string { return filepath.Join(m.dataDir, metadataSubdir) }

func (m metadataFiles) claimDir(namespace, name string) string {
	return filepath.Join(m.root(), namespace+"_"+name)
}

func (m metadataFiles) filePath(namespace, name, request string) string {
	return filepath.Join(m.claimDir(namespace, name), request, metadataFile)
}

// specPrefix starts the name of every metadata CDI spec of claim uid; the
// request and ".json" follow.
func (m metadataFiles) specPrefix(uid string) string { return m.driver + "_metadata_" + uid + "_" }

func (m metadataFiles) specPath(uid, request string) string {
	return filepath.Join(m.cdiDir, m.specPrefix(uid)+request+".json")
}

// baseRequest is the request a subrequest ("req/sub") belongs to: files
// are per request.
func baseRequest(request string) string {
	base, _, _ := strings.Cut(request, "/")
	return base
}

// write writes the metadata file and CDI spec of every request of claim c,
// from its prepared devices (kubeletplugin.Device.Metadata), and returns
// the metadata CDI device ID of each request.
func (m metadataFiles) write(c checkpoint.Claim, devices []kubeletplugin.Device) (map[string]string, error) {
	byRequest := map[string][]kubeletplugin.Device{}
	var order []string
	for _, dev := range devices {
		for _, r := range dev.Requests {
			if _, seen := byRequest[r]; !seen {
				order = append(order, r)
			}
			byRequest[r] = append(byRequest[r], dev)
		}
	}
	ids := map[string]string{}
	for _, r := range order {
		base := baseRequest(r)
		data, err := m.encode(c, r, byRequest[r])
		if err != nil {
			return nil, fmt.Errorf("device metadata of request %s: %w", r, err)
		}
		path := m.filePath(c.Namespace, c.Name, base)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("device metadata of request %s: %w", r, err)
		}
		if err := writeFile(path, data); err != nil {
			return nil, fmt.Errorf("device metadata of request %s: %w", r, err)
		}
		id, spec, err := m.spec(c, base, path)
		if err != nil {
			return nil, fmt.Errorf("device metadata CDI spec of request %s: %w", r, err)
		}
		if err := os.MkdirAll(m.cdiDir, 0o755); err != nil {
			return nil, fmt.Errorf("device metadata CDI spec of request %s: %w", r, err)
		}
		if err := writeFile(m.specPath(c.UID, base), spec); err != nil {
			return nil, fmt.Errorf("device metadata CDI spec of request %s: %w", r, err)
		}
		ids[base] = id
	}
	return ids, nil
}

// encode is the metadata file of one request: a stream of one object per
// API version, newest first (v1beta1 is the newest in Kubernetes 1.37).
func (m metadataFiles) encode(c checkpoint.Claim, request string, devices []kubeletplugin.Device) ([]byte, error) {
	md := metadatav1beta1.DeviceMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: metadatav1beta1.SchemeGroupVersion.String(), Kind: "DeviceMetadata"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID), Generation: 1},
		Requests:   []metadatav1beta1.DeviceMetadataRequest{{Name: request}},
	}
	if c.PodClaimName != "" {
		md.PodClaimName = &c.PodClaimName
	}
	for _, dev := range devices {
		out := metadatav1beta1.Device{Driver: m.driver, Pool: dev.PoolName, Name: dev.DeviceName}
		if dev.Metadata != nil {
			if len(dev.Metadata.Attributes) > 0 {
				out.Attributes = make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(dev.Metadata.Attributes))
				for k, v := range dev.Metadata.Attributes {
					out.Attributes[resourceapi.QualifiedName(k)] = v
				}
			}
			out.NetworkData = dev.Metadata.NetworkData
		}
		md.Requests[0].Devices = append(md.Requests[0].Devices, out)
	}
	data, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// spec is the CDI spec bind-mounting a request's metadata file where the
// container looks for it, and its device ID.
func (m metadataFiles) spec(c checkpoint.Claim, request, hostPath string) (string, []byte, error) {
	containerPath := metadata.ResourceClaimFilePath(m.driver, c.Name, request)
	if c.PodClaimName != "" {
		if err := checkPodClaimName(c.PodClaimName); err != nil {
			return "", nil, err
		}
		containerPath = metadata.ResourceClaimTemplateFilePath(m.driver, c.PodClaimName, request)
	}
	name := c.UID + "_" + request
	spec := &cdispec.Spec{
		Kind: m.driver + "/metadata",
		Devices: []cdispec.Device{{
			Name: name,
			ContainerEdits: cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{
				HostPath: hostPath, ContainerPath: containerPath, Options: []string{"ro", "bind"},
			}}},
		}},
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", nil, err
	}
	spec.Version = v
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", nil, err
	}
	return m.driver + "/metadata=" + name, data, nil
}

// writeFile replaces path's content whole, through a temp file beside it
// named as the helper names its own (".<base>.<random>.tmp", so one sweep
// finds both), 0644 whatever the umask (containers read it). No fsync: see
// the top of this file.
func writeFile(path string, data []byte) error {
	return atomicfile.Write(path, data, atomicfile.WithMode(0o644), atomicfile.WithoutSync(),
		atomicfile.WithTempPattern("."+filepath.Base(path)+".*"+tmpSuffix))
}

// remove removes claim uid's metadata CDI specs and, unless keepDir (a
// prepared claim of the same namespace and name but another UID owns it),
// its metadata directory: temp files included. Nothing there is success.
func (m metadataFiles) remove(namespace, name, uid string, keepDir bool) error {
	entries, err := os.ReadDir(m.cdiDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("device metadata CDI specs: %w", err)
	}
	prefix := m.specPrefix(uid)
	for _, e := range entries {
		if n := strings.TrimLeft(e.Name(), "."); strings.HasPrefix(n, prefix) {
			if err := os.Remove(filepath.Join(m.cdiDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing a device metadata CDI spec: %w", err)
			}
		}
	}
	if keepDir || namespace == "" || name == "" {
		return nil
	}
	if err := os.RemoveAll(m.claimDir(namespace, name)); err != nil {
		return fmt.Errorf("removing the device metadata of claim %s/%s: %w", namespace, name, err)
	}
	return nil
}

// sweep removes what no prepared claim owns: metadata CDI specs of claims
// not in cp, metadata directories of no claim in cp, and temp files in
// both places, each once older than minAge (another daemon may be
// preparing it right now). It returns what it removed.
func (m metadataFiles) sweep(cp checkpoint.Checkpoint, now time.Time, minAge time.Duration) ([]string, error) {
	old := func(path string) bool {
		fi, err := os.Lstat(path)
		return err == nil && now.Sub(fi.ModTime()) >= minAge
	}
	dirs := map[string]bool{}
	for _, c := range cp.Claims {
		dirs[c.Namespace+"_"+c.Name] = true
	}
	var removed []string
	var errs []error
	drop := func(path string) {
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, err)
			return
		}
		removed = append(removed, path)
	}
	// Temp files of writes that never finished (ours and the helper's).
	dropTemps := func(dir string, prefix string) {
		names, err := atomicfile.RemoveStale(dir, func(n string) bool {
			return strings.HasPrefix(n, prefix) && strings.HasSuffix(n, tmpSuffix)
		}, now.Add(-minAge+1))
		for _, n := range names {
			removed = append(removed, filepath.Join(dir, n))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	dropTemps(m.cdiDir, "."+m.driver+"_metadata_")

	entries, err := os.ReadDir(m.cdiDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		n := e.Name()
		rest, ok := strings.CutPrefix(strings.TrimLeft(n, "."), m.driver+"_metadata_")
		if !ok || strings.HasPrefix(n, ".") || !old(filepath.Join(m.cdiDir, n)) {
			continue
		}
		// <uid>_<request>.json: UIDs have no "_".
		uid, _, ok := strings.Cut(rest, "_")
		if _, known := cp.Claims[uid]; ok && !known && strings.HasSuffix(n, ".json") {
			drop(filepath.Join(m.cdiDir, n))
		}
	}

	claims, err := os.ReadDir(m.root())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, c := range claims {
		dir := filepath.Join(m.root(), c.Name())
		if !dirs[c.Name()] {
			if old(dir) {
				drop(dir)
			}
			continue
		}
		requests, _ := os.ReadDir(dir)
		for _, r := range requests {
			if r.IsDir() {
				dropTemps(filepath.Join(dir, r.Name()), "."+metadataFile+".")
			}
		}
	}
	return removed, errors.Join(errs...)
}

// checkPodClaimName refuses a pod-claim-name annotation that is not a pod's
// claim name (a DNS label, as the API validates those): it becomes a path
// in the container, and anyone who creates a claim can set it.
func checkPodClaimName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("annotation %s=%q is not a pod claim name: %s", resourceapi.PodResourceClaimAnnotation, name, strings.Join(errs, "; "))
	}
	return nil
}
