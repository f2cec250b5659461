// Package uverbs asks the kernel for verbs contexts directly, over the
// uverbs write ABI: the step of ibv_open_device that the rdma cgroup
// charges one hca_handle. Containers in test/vm's guest run it (from the
// guest's test binaries) to show a limit holding without rdma-core.
package uverbs

import (
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Contexts opens path n times and asks for a verbs context on each,
// holding all of them until it returns. It writes one line per context
// with the kernel's answer and returns how many were refused.
func Contexts(w io.Writer, path string, n int) (failed int) {
	var keep []int
	defer func() {
		for _, fd := range keep {
			unix.Close(fd)
		}
	}()
	for i := 1; i <= n; i++ {
		if err := getContext(path, &keep); err != nil {
			failed++
			fmt.Fprintf(w, "context %d on %s: %v\n", i, path, err)
			continue
		}
		fmt.Fprintf(w, "context %d on %s: ok\n", i, path)
	}
	return failed
}

func getContext(path string, keep *[]int) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	*keep = append(*keep, fd)
	// struct ib_uverbs_cmd_hdr {command, in_words, out_words} then struct
	// ib_uverbs_get_context {response}; the kernel writes struct
	// ib_uverbs_get_context_resp {async_fd, num_comp_vectors} there.
	resp := new([2]uint32)
	var cmd [16]byte
	*(*uint32)(unsafe.Pointer(&cmd[0])) = 0 // IB_USER_VERBS_CMD_GET_CONTEXT
	*(*uint16)(unsafe.Pointer(&cmd[4])) = uint16(len(cmd) / 4)
	*(*uint16)(unsafe.Pointer(&cmd[6])) = uint16(unsafe.Sizeof(*resp) / 4)
	*(*uint64)(unsafe.Pointer(&cmd[8])) = uint64(uintptr(unsafe.Pointer(resp)))
	_, err = unix.Write(fd, cmd[:])
	if err == nil {
		*keep = append(*keep, int(resp[0]))
	}
	return err
}
