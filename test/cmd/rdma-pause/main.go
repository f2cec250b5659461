// Command rdma-pause is the pod sandbox's process on the test node (the
// role of registry.k8s.io/pause): it sleeps until SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
