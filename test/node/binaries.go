package node

// Binaries of the node, built once and cached between runs: the kubelet
// (from the test module, which pins Kubernetes 1.37.2), containerd, ctr
// and the runc shim (go install, outside test/go.mod: containerd needs a
// newer grpc/otel than the Kubernetes graph), the CNI plugins and the
// sandbox's pause program. runc comes from the host, else is built into the
// cache too (debian.go).

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdma-dra/rdma-dra-driver/test/cluster"
)

// Versions of what the node runs.
const (
	KubeletVersion    = "v1.37.2"
	ContainerdVersion = "2.4.2"
	CNIVersion        = "v1.9.1"
	pauseVersion      = "1"
)

// Binaries are paths of the node's programs.
type Binaries struct {
	Kubelet, Containerd, Ctr, Shim string
	CNIDir                         string // bridge, host-local, loopback
	Pause                          string
	Runc                           string
}

// CacheDir holds the built binaries: $RDMA_NODE_CACHE, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/rdma-dra-driver/node.
func CacheDir() (string, error) {
	if d := os.Getenv("RDMA_NODE_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("node binary cache: %w", err)
	}
	return filepath.Join(base, "rdma-dra-driver", "node"), nil
}

// EnsureBinaries builds what is missing from the cache (the kubelet takes
// about 8 minutes cold on 2 cores, containerd about 2) and returns the
// paths. logf reports each build and how long it took.
func EnsureBinaries(logf func(string, ...any)) (*Binaries, error) {
	runc, err := runcPath(logf)
	if err != nil {
		return nil, err
	}
	b, err := buildBinaries(logf)
	if err != nil {
		return nil, err
	}
	b.Runc = runc
	return b, nil
}

// buildBinaries is EnsureBinaries without runc, which the host may have.
func buildBinaries(logf func(string, ...any)) (*Binaries, error) {
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	dirs := map[string]string{}
	for _, e := range []struct {
		name  string
		build func(dir string) error
	}{{kubeletEntry, buildKubelet}, {containerdEntry, buildContainerd}, {cniEntry, buildCNI}, {pauseEntry, buildPause}} {
		if dirs[e.name], err = cached(cache, e.name, logf, e.build); err != nil {
			return nil, err
		}
	}
	return &Binaries{
		Kubelet:    filepath.Join(dirs[kubeletEntry], "kubelet"),
		Containerd: filepath.Join(dirs[containerdEntry], "containerd"),
		Ctr:        filepath.Join(dirs[containerdEntry], "ctr"),
		Shim:       filepath.Join(dirs[containerdEntry], "containerd-shim-runc-v2"),
		CNIDir:     dirs[cniEntry],
		Pause:      filepath.Join(dirs[pauseEntry], "rdma-pause"),
	}, nil
}

// The cache's directories, one per build.
const (
	kubeletEntry    = "kubelet-" + KubeletVersion
	containerdEntry = "containerd-" + ContainerdVersion
	cniEntry        = "cni-plugins-" + CNIVersion
	pauseEntry      = "pause-" + pauseVersion
)

var cacheEntries = []string{kubeletEntry, containerdEntry, cniEntry, pauseEntry}

// allCached says whether every binary is in the cache already (a node
// that gets its binaries from elsewhere, e.g. test/vm's guest, needs no go).
func allCached() bool {
	cache, err := CacheDir()
	if err != nil {
		return false
	}
	for _, name := range cacheEntries {
		if _, err := os.Stat(filepath.Join(cache, name, ".complete")); err != nil {
			return false
		}
	}
	return true
}

// CacheFile is one file of the binary cache.
type CacheFile struct {
	Rel string // relative to the cache directory
	Src string // its path here
}

// CachedFiles builds what the cache lacks and lists its files, markers
// included: a copy of them, with RDMA_NODE_CACHE pointing at it, lets a
// node run where there is no go to build them (test/vm's guest).
func CachedFiles(logf func(string, ...any)) ([]CacheFile, error) {
	if _, err := buildBinaries(logf); err != nil {
		return nil, err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	var files []CacheFile
	for _, name := range cacheEntries {
		entries, err := os.ReadDir(filepath.Join(cache, name))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Type().IsRegular() {
				files = append(files, CacheFile{Rel: filepath.Join(name, e.Name()), Src: filepath.Join(cache, name, e.Name())})
			}
		}
	}
	return files, nil
}

// cached returns cache/name, building it first when absent. Concurrent
// test processes serialize on a lock file; a build goes to a temporary
// directory renamed into place, so a killed build leaves nothing usable.
func cached(cache, name string, logf func(string, ...any), build func(dir string) error) (string, error) {
	dir := filepath.Join(cache, name)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("node binary cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("node binary cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN) //nolint:errcheck
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir, nil // another process built it meanwhile
	}
	tmp, err := os.MkdirTemp(cache, "."+name+".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	logf("node: building %s into %s", name, dir)
	if err := build(tmp); err != nil {
		return "", fmt.Errorf("building %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return "", err
	}
	_ = os.RemoveAll(dir) // an incomplete leftover
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	logf("node: built %s in %s", name, time.Since(start).Round(time.Second))
	return dir, nil
}

// goCmd runs the go command in dir with a static, cgo-free environment.
func goCmd(dir string, env []string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, LastLines(string(out), 30))
	}
	return nil
}

// testModule is the test/ module's directory (it has the kubelet's replace block).
func testModule() string { return filepath.Join(cluster.RepoRoot(), "test") }

func buildKubelet(dir string) error {
	var ldflags []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ldflags = append(ldflags,
			"-X", pkg+".gitVersion="+KubeletVersion,
			"-X", pkg+".gitMajor=1",
			"-X", pkg+".gitMinor=37",
			"-X", pkg+".gitTreeState=clean")
	}
	return goCmd(testModule(), nil, "build", "-o", filepath.Join(dir, "kubelet"),
		"-ldflags", strings.Join(ldflags, " "), "k8s.io/kubernetes/cmd/kubelet")
}

func buildContainerd(dir string) error {
	const mod = "github.com/containerd/containerd/v2"
	v := "@v" + ContainerdVersion
	return goCmd(dir, []string{"GOBIN=" + dir, "GOFLAGS=-buildvcs=false"}, "install",
		"-tags", "no_btrfs,no_devmapper,no_zfs",
		"-ldflags", "-X "+mod+"/version.Version="+ContainerdVersion+" -X "+mod+"/version.Revision=v"+ContainerdVersion,
		mod+"/cmd/containerd"+v, mod+"/cmd/ctr"+v, mod+"/cmd/containerd-shim-runc-v2"+v)
}

func buildCNI(dir string) error {
	const mod = "github.com/containernetworking/plugins/plugins/"
	v := "@" + CNIVersion
	return goCmd(dir, []string{"GOBIN=" + dir, "GOFLAGS=-buildvcs=false"}, "install",
		mod+"main/bridge"+v, mod+"ipam/host-local"+v, mod+"main/loopback"+v)
}

func buildPause(dir string) error {
	return goCmd(testModule(), nil, "build", "-o", filepath.Join(dir, "rdma-pause"), "./cmd/rdma-pause")
}

// Check says why this machine cannot run a node (nil when it can): not
// root, no nsenter/unshare/ip, no go to build binaries the cache lacks, no
// runc and no way to build one, no static busybox and no way to fetch one.
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("a real node needs root (mount namespaces, cgroups, runc)")
	}
	tools := []string{"unshare", "nsenter", "ip"}
	if !allCached() {
		tools = append(tools, "go")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("a real node needs %s in PATH: %w", tool, err)
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		return fmt.Errorf("a real node needs cgroups: %w", err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		if why := canFetch("runc"); why != "" {
			return errors.New("a real node needs runc: " + why)
		}
	}
	// The workload image is made from a static busybox.
	if hostStaticBusybox() == "" {
		if why := canFetch("static busybox"); why != "" {
			return errors.New("a real node needs a static busybox: " + why)
		}
	}
	return nil
}

// LastLines is the last n lines of s, for error messages and logs.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
