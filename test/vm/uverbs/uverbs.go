// Package uverbs asks the kernel for verbs contexts and memory regions
// directly, over the uverbs write ABI: the step of ibv_open_device that the
// rdma cgroup charges one hca_handle, and ibv_reg_mr's pinning, which
// RLIMIT_MEMLOCK bounds. Containers in test/vm's guest run it (from the
// guest's test binaries) to show a limit holding, with the kernel's own
// errno, without rdma-core.
package uverbs

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
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
	header(cmd[:], cmdGetContext, unsafe.Sizeof(*resp))
	*(*uint64)(unsafe.Pointer(&cmd[8])) = uint64(uintptr(unsafe.Pointer(resp)))
	_, err = unix.Write(fd, cmd[:])
	if err == nil {
		*keep = append(*keep, int(resp[0]))
	}
	return err
}

// RegMR registers an n-byte memory region on path as ibv_reg_mr does,
// over the write ABI: a context, a protection domain, then REG_MR of
// anonymous memory with local write access. The kernel pins the pages and
// charges them against RLIMIT_MEMLOCK unless the process holds
// CAP_IPC_LOCK (ib_umem_get refuses with ENOMEM past the limit). It writes
// one line with the kernel's answer (and the process's VmPin once the
// region is registered) and returns 1 when refused.
func RegMR(w io.Writer, path string, n int) int {
	var keep []int
	defer func() {
		for _, fd := range keep {
			unix.Close(fd)
		}
	}()
	fail := func(step string, err error) int {
		fmt.Fprintf(w, "reg_mr %d bytes on %s: %s: %v\n", n, path, step, err)
		return 1
	}
	if err := getContext(path, &keep); err != nil {
		return fail("context", err)
	}
	fd := keep[0]
	// struct ib_uverbs_alloc_pd {response}; the kernel writes struct
	// ib_uverbs_alloc_pd_resp {pd_handle}.
	pd := new(uint32)
	var alloc [16]byte
	header(alloc[:], cmdAllocPD, unsafe.Sizeof(*pd))
	*(*uint64)(unsafe.Pointer(&alloc[8])) = uint64(uintptr(unsafe.Pointer(pd)))
	if _, err := unix.Write(fd, alloc[:]); err != nil {
		return fail("alloc_pd", err)
	}
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fail("mmap", err)
	}
	defer unix.Munmap(buf)
	// struct ib_uverbs_reg_mr {response, start, length, hca_va, pd_handle,
	// access_flags}; the kernel writes struct ib_uverbs_reg_mr_resp
	// {mr_handle, lkey, rkey}.
	resp := new([3]uint32)
	start := uint64(uintptr(unsafe.Pointer(&buf[0])))
	var reg [56]byte
	header(reg[:], cmdRegMR, unsafe.Sizeof(*resp))
	*(*uint64)(unsafe.Pointer(&reg[8])) = uint64(uintptr(unsafe.Pointer(resp)))
	*(*uint64)(unsafe.Pointer(&reg[16])) = start
	*(*uint64)(unsafe.Pointer(&reg[24])) = uint64(n)
	*(*uint64)(unsafe.Pointer(&reg[32])) = start // hca_va: the region's own address
	*(*uint32)(unsafe.Pointer(&reg[40])) = *pd
	*(*uint32)(unsafe.Pointer(&reg[44])) = accessLocalWrite
	if _, err := unix.Write(fd, reg[:]); err != nil {
		return fail("register", err)
	}
	runtime.KeepAlive(buf)
	fmt.Fprintf(w, "reg_mr %d bytes on %s: ok (lkey %#x), %s\n", n, path, resp[1], vmPin())
	return 0
}

// The write ABI's commands (enum ib_uverbs_write_cmds) and access flag.
const (
	cmdGetContext    = 0
	cmdRegMR         = 9
	accessLocalWrite = 1 // IB_ACCESS_LOCAL_WRITE
)

// header fills struct ib_uverbs_cmd_hdr {command, in_words, out_words}
// at the start of cmd: in_words counts the whole command, header included.
func header(cmd []byte, command uint32, respSize uintptr) {
	*(*uint32)(unsafe.Pointer(&cmd[0])) = command
	*(*uint16)(unsafe.Pointer(&cmd[4])) = uint16(len(cmd) / 4)
	*(*uint16)(unsafe.Pointer(&cmd[6])) = uint16(respSize / 4)
}

// vmPin is the VmPin line of /proc/self/status: the pages the process has
// pinned, which RLIMIT_MEMLOCK bounds.
func vmPin() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmPin:") {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	return "no VmPin in /proc/self/status"
}
