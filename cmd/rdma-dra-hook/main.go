// Command rdma-dra-hook is the OCI hook the driver names in per-claim CDI
// specs. The container runtime runs it while it creates a container
// (createRuntime: in the runtime's namespaces, after the container's
// cgroup exists and before its process runs), with the container's state
// on stdin.
//
//	rdma-dra-hook netns --device=mlx5_0 [--move-netdevs [--node-ip=10.0.0.5 ...]]
//
// moves the RDMA device (and its ports' netdevs, found by ifindex when the
// hook runs) into the container's network namespace, for nodes whose RDMA
// subsystem is in exclusive netns mode. A device already in that
// namespace (the pod's second container) is success; one in any other
// namespace is an error. A netdev carrying the node's default route or
// holding its InternalIP never moves. --netdev=<name>, from specs of
// older drivers, is checked against the kernel and implies --move-netdevs.
//
//	rdma-dra-hook limit --device=mlx5_0 --hca-handle=1 --hca-object=max [--pod=<uid>:<handles>:<objects>...]
//
// sets the container's rdma.max line for the device and reads it back;
// with --pod, also its pod's (the parent cgroup), to the entry of the
// pod's UID ("*": any pod). See limitPod.
//
//	rdma-dra-hook memlock --device=mlx5_0 [--bytes=unlimited|<n>]
//
// sets the container process's RLIMIT_MEMLOCK, soft and hard, so it can
// register memory regions without CAP_IPC_LOCK (see memlock.go).
//
//	rdma-dra-hook hostnet --device=mlx5_0 [--device=mlx5_1 ...]
//
// refuses a container that is not in the node's network namespace (the
// hostNetwork switch, checked at every container start; see hostnet.go).
//
// It fails closed: any error exits non-zero with a message naming the HCA
// (and the kernel's answer), and the runtime then refuses to start the
// container; a container never runs without its device or its limit. It
// imports nothing of Kubernetes and reads only its arguments, stdin,
// procfs, cgroupfs and the kernel's netlink answers.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/rdma-dra/rdma-dra-driver/pkg/rdmacg"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, deps{fs: rdmacg.FS{Root: "/"}, openNetns: openHostNetns, rlimit: sysPrlimit{}, log: os.Stderr}); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-dra-hook:", err)
		os.Exit(1)
	}
}

// deps is what the subcommands touch: cgroupfs, the kernel's network
// namespaces, and where to say what moved (the runtime's log of the hook).
type deps struct {
	fs        rdmacg.FS
	openNetns func(pid int) (netnsKernel, error)
	rlimit    rlimitSetter
	log       io.Writer // nil: discarded
}

const usage = "usage: rdma-dra-hook netns --device=<ibdev> [--move-netdevs] [--node-ip=<ip>]... | " +
	"limit --device=<ibdev> --hca-handle=<n|max> --hca-object=<n|max> [--pod=<uid|*>:<n|max>:<n|max>]... | " +
	"hostnet --device=<ibdev>... | memlock --device=<ibdev>... [--bytes=<n|unlimited>] (OCI state on stdin) | " +
	"install <host dir> [<CDI spec dir>]"

func run(args []string, stdin io.Reader, d deps) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "limit":
		return limit(args[1:], stdin, d.fs)
	case "netns":
		log := d.log
		if log == nil {
			log = io.Discard
		}
		return netns(args[1:], stdin, d.openNetns, log)
	case "hostnet":
		return hostnet(args[1:], stdin, d.openNetns)
	case "memlock":
		return memlock(args[1:], stdin, d.rlimit, d.log)
	case "install":
		return install(args[1:], os.Executable)
	}
	return fmt.Errorf("unknown command %q (want: netns, limit, hostnet, memlock, install)", args[0])
}

func limit(args []string, stdin io.Reader, fsys rdmacg.FS) error {
	fs := flag.NewFlagSet("limit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	device := fs.String("device", "", "ibdev")
	handle := fs.String("hca-handle", "max", "hca_handle limit")
	object := fs.String("hca-object", "max", "hca_object limit")
	var pods podLimits
	fs.Var(&pods, "pod", "<pod uid|*>:<hca_handle>:<hca_object>, the pod's limit (repeated)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("limit: unexpected arguments %q", fs.Args())
	}
	l := rdmacg.Limit{Device: *device}
	var err error
	if l.HCAHandle, err = rdmacg.ParseValue(*handle); err != nil {
		return fmt.Errorf("limit: --hca-handle: %w", err)
	}
	if l.HCAObject, err = rdmacg.ParseValue(*object); err != nil {
		return fmt.Errorf("limit: --hca-object: %w", err)
	}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	st, err := readState(stdin)
	if err != nil {
		return fmt.Errorf("HCA %s, limit %s: %w", l.Device, l, err)
	}
	dir, err := fsys.Dir(st.Pid)
	if err != nil {
		return fmt.Errorf("HCA %s: cannot set rdma.max (%s) of container %s: %w", l.Device, l, st.ID, err)
	}
	if err := rdmacg.Set(dir, l); err != nil {
		return fmt.Errorf("HCA %s: cannot set rdma.max (%s) of container %s: %w", l.Device, l, st.ID, err)
	}
	if len(pods) == 0 {
		return nil // a spec of an older driver: the container's limit only
	}
	return limitPod(dir, l.Device, st.ID, pods)
}

// limitPod sets the rdma.max of the pod whose container has the cgroup
// dir (its parent) to the pod's limit for device: what every process of
// the pod, with a claim or not, may hold together. The kernel charges a
// verbs object to the cgroup of the process that creates it and checks
// every ancestor's limit, so a sidecar handed the container's uverbs file
// is bounded too. Every container and claim of the pod writes the same
// value, from the same arguments: a restart or a second container writes
// it again, nothing accumulates.
func limitPod(dir, device, container string, pods podLimits) error {
	podDir, uid, err := rdmacg.PodDir(dir)
	if err != nil {
		return fmt.Errorf("HCA %s: cannot set the pod's rdma.max of container %s: %w", device, container, err)
	}
	p, ok := pods.of(uid)
	if !ok {
		return fmt.Errorf("HCA %s: container %s is in pod %s, but the claim's limits were counted for pods %s only: "+
			"a pod that joined a shared claim after it was prepared has no share of it (give each pod its own claim, from a ResourceClaimTemplate)", device, container, uid, pods.uids())
	}
	l := rdmacg.Limit{Device: device, HCAHandle: p.handles, HCAObject: p.objects}
	if err := rdmacg.Set(podDir, l); err != nil {
		return fmt.Errorf("HCA %s: cannot set the pod's rdma.max (%s) in %s for container %s: %w", device, l, filepath.Join(podDir, "rdma.max"), container, err)
	}
	return nil
}

// podLimit is one --pod: the limits of pod uid ("*": any pod).
type podLimit struct {
	uid              string
	handles, objects int64
}

type podLimits []podLimit

func (p *podLimits) String() string { return fmt.Sprint(*p) }

// Set parses <uid|*>:<hca_handle>:<hca_object>.
func (p *podLimits) Set(s string) error {
	f := strings.Split(s, ":")
	if len(f) != 3 || f[0] == "" {
		return fmt.Errorf("%q is not <pod uid|*>:<hca_handle>:<hca_object>", s)
	}
	l := podLimit{uid: f[0]}
	var err error
	if l.handles, err = rdmacg.ParseValue(f[1]); err != nil {
		return fmt.Errorf("%q: hca_handle: %w", s, err)
	}
	if l.objects, err = rdmacg.ParseValue(f[2]); err != nil {
		return fmt.Errorf("%q: hca_object: %w", s, err)
	}
	*p = append(*p, l)
	return nil
}

func (p podLimits) of(uid string) (podLimit, bool) {
	for _, l := range p {
		if l.uid == uid || l.uid == "*" {
			return l, true
		}
	}
	return podLimit{}, false
}

func (p podLimits) uids() string {
	var out []string
	for _, l := range p {
		out = append(out, l.uid)
	}
	return strings.Join(out, ", ")
}

// readState decodes the container state the runtime writes to a hook's
// stdin; a hook without a live process has nothing to limit.
func readState(r io.Reader) (oci.State, error) {
	var st oci.State
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return st, fmt.Errorf("reading the OCI state on stdin: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("the OCI state on stdin is not JSON (is this run by a container runtime as a hook?): %w", err)
	}
	if st.Pid <= 0 {
		return st, fmt.Errorf("the OCI state of container %q has no process (pid %d): run it as a createRuntime hook", st.ID, st.Pid)
	}
	return st, nil
}
