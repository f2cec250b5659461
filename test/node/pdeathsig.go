package node

import (
	"os/exec"
	"runtime"
)

// Pdeathsig (SIGKILL) ends a node's processes with this test process; but
// the kernel sends it when the OS thread that started the child exits, not
// the process. Go ends a thread whose goroutine exits locked to it, as the
// netnsDialer's does at a node's Stop: a kubelet forked earlier on that
// thread by another node's goroutine was SIGKILLed in the middle of that
// node's test (two real nodes in parallel in test/e2e). So every child
// with Pdeathsig is started from one thread that lives as long as the
// process.
var starter = make(chan func())

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: this thread never exits
		for f := range starter {
			f()
		}
	}()
}

// startOnLiveThread is cmd.Start run on the starter thread.
func startOnLiveThread(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	starter <- func() { errc <- cmd.Start() }
	return <-errc
}
