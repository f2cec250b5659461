package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// The host-network check is the last gate of the hostNetwork switch: the
// driver names it in every CDI device it hands out while RDMA for pods off
// the host network is off (claims, shared claims, the legacy device, the
// device plugin's node-wide device). The kubelet prepares a claim once,
// for the pods reserved at that time, and the device plugin sees no pod at
// all; the container's start is the one moment every route passes, so
// that is where a container outside the node's network namespace is
// refused.

// hostNetSwitch names the switch in the refusal, so an operator knows what
// to change (and that it was meant).
const hostNetSwitch = "RDMA for pods that are not on the host network is disabled on this node " +
	"(driver flag --allow-non-host-network=false, Helm value allowNonHostNetwork)"

func hostnet(args []string, stdin io.Reader, open func(pid int) (netnsKernel, error)) error {
	fs := flag.NewFlagSet("hostnet", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var devices stringList
	fs.Var(&devices, "device", "ibdev the container gets (repeatable), for the message")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("hostnet: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("hostnet: unexpected arguments %q", fs.Args())
	}
	if len(devices) == 0 {
		return fmt.Errorf("hostnet: want at least one --device")
	}
	hcas := hcasNamed(devices)
	st, err := readState(stdin)
	if err != nil {
		return fmt.Errorf("%s: %w", hcas, err)
	}
	k, err := open(st.Pid)
	if err != nil {
		return fmt.Errorf("%s: cannot open the network namespace of %s (pid %d) to check the hostNetwork policy: %w", hcas, containerName(st), st.Pid, err)
	}
	defer k.close()
	same, err := k.sameNetns()
	if err != nil {
		return fmt.Errorf("%s: checking the hostNetwork policy for %s: %w", hcas, containerName(st), err)
	}
	if !same {
		return fmt.Errorf("%s: refused to %s: it is not on the host network (its network namespace is not the node's), and %s",
			hcas, containerName(st), hostNetSwitch)
	}
	return nil
}

// containerName is "container c of pod ns/name" from the annotations the
// CRI runtimes put on a container (containerd's, then CRI-O's), or the
// runtime's container ID when run by something else.
func containerName(st oci.State) string {
	for _, keys := range [][3]string{
		{"io.kubernetes.cri.container-name", "io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name"},
		{"io.kubernetes.container.name", "io.kubernetes.pod.namespace", "io.kubernetes.pod.name"},
	} {
		c, ns, pod := st.Annotations[keys[0]], st.Annotations[keys[1]], st.Annotations[keys[2]]
		if c != "" && pod != "" {
			return fmt.Sprintf("container %s of pod %s/%s", c, ns, pod)
		}
	}
	return "container " + st.ID
}

// hcasNamed is "HCA mlx5_0" or "HCAs mlx5_0, mlx5_1", for messages.
func hcasNamed(devices []string) string {
	if len(devices) > 1 {
		return "HCAs " + strings.Join(devices, ", ")
	}
	return "HCA " + strings.Join(devices, ", ")
}
