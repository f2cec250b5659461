package uverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ioctl ABI (include/uapi/rdma/rdma_user_ioctl_cmds.h,
// ib_user_ioctl_cmds.h): RDMA_VERBS_IOCTL carries struct
// ib_uverbs_ioctl_hdr (24 bytes) and its attributes (16 bytes each).
// UVERBS_METHOD_INVOKE_WRITE of UVERBS_OBJECT_DEVICE runs a write-ABI
// command; unlike write(2) it does not refuse a file opened under other
// credentials, which is how rdma-core's ibv_import_device uses a context
// handed over by another process.
const (
	rdmaVerbsIoctl    = 0xC0181B01 // _IOWR(0x1b, 1, 24 bytes)
	objectDevice      = 0          // UVERBS_OBJECT_DEVICE
	methodInvokeWrite = 0          // UVERBS_METHOD_INVOKE_WRITE
	attrCoreIn        = 0          // UVERBS_ATTR_CORE_IN
	attrCoreOut       = 1          // UVERBS_ATTR_CORE_OUT
	attrWriteCmd      = 2          // UVERBS_ATTR_WRITE_CMD
	cmdAllocPD        = 3          // IB_USER_VERBS_CMD_ALLOC_PD
)

// DriverRXE is Soft-RoCE's enum rdma_driver_id (ib_user_ioctl_verbs.h):
// the ioctl header must name the device's driver or the kernel answers
// EINVAL.
const DriverRXE = 14

// OpenContext opens path and asks for a verbs context on it (one
// hca_handle, charged to the caller's cgroup); the file is the caller's.
func OpenContext(path string) (int, error) {
	var keep []int
	if err := getContext(path, &keep); err != nil {
		for _, fd := range keep {
			unix.Close(fd)
		}
		return -1, err
	}
	return keep[0], nil
}

// PDs asks for n protection domains on fd, a uverbs file with a verbs
// context (its own or one handed over) of a device of driver (an enum
// rdma_driver_id: DriverRXE), holding them while fd is open.
// The kernel charges each PD, one hca_object, to the rdma cgroup of the
// calling process. It writes one line per PD, "<who> pd <i>: ok" or the
// kernel's refusal, and returns how many were refused.
func PDs(w io.Writer, who string, fd, n int, driver uint32) (failed int) {
	for i := 1; i <= n; i++ {
		if err := allocPD(fd, driver); err != nil {
			failed++
			fmt.Fprintf(w, "%s pd %d: %v\n", who, i, err)
			continue
		}
		fmt.Fprintf(w, "%s pd %d: ok\n", who, i)
	}
	return failed
}

func allocPD(fd int, driver uint32) error {
	resp := new([2]uint32) // struct ib_uverbs_alloc_pd_resp {pd_handle}
	var buf [24 + 3*16]byte
	le := binary.LittleEndian
	le.PutUint16(buf[0:], uint16(len(buf))) // length
	le.PutUint16(buf[2:], objectDevice)
	le.PutUint16(buf[4:], methodInvokeWrite)
	le.PutUint16(buf[6:], 3) // num_attrs
	le.PutUint32(buf[16:], driver)
	attr := func(i int, id, length uint16, data uint64) {
		a := buf[24+16*i:]
		le.PutUint16(a[0:], id)
		le.PutUint16(a[2:], length)
		le.PutUint64(a[8:], data)
	}
	attr(0, attrWriteCmd, 8, cmdAllocPD) // a constant: inline
	attr(1, attrCoreIn, 8, 0)            // struct ib_uverbs_alloc_pd {response}, inline; the answer goes to CORE_OUT
	attr(2, attrCoreOut, 4, uint64(uintptr(unsafe.Pointer(resp))))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), rdmaVerbsIoctl, uintptr(unsafe.Pointer(&buf[0])))
	runtime.KeepAlive(resp)
	if errno != 0 {
		return errno
	}
	return nil
}

// SendFD listens on the unix socket path, hands fd to the first peer that
// connects (SCM_RIGHTS) and returns when the peer closes its end.
func SendFD(path string, fd int) error {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	defer l.Close()
	c, err := l.AcceptUnix()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix([]byte{1}, unix.UnixRights(fd), nil); err != nil {
		return fmt.Errorf("sending the file: %w", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		return fmt.Errorf("waiting for the peer to close: %v", err)
	}
	return nil
}

// RecvFD connects to the unix socket path and returns the file sent there.
// The caller closes the connection (returned) when it is done with it.
func RecvFD(path string) (int, *net.UnixConn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return -1, nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(make([]byte, 1), oob)
	if err != nil {
		c.Close()
		return -1, nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		c.Close()
		return -1, nil, fmt.Errorf("no file in the message (%d control messages): %v", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		c.Close()
		return -1, nil, fmt.Errorf("no file in the message: %v", err)
	}
	return fds[0], c, nil
}

// WaitFIFO blocks until a writer opens the FIFO at path.
func WaitFIFO(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}
