package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// socketCheck proves liveness the way the kubelet would notice a hang: it
// calls both gRPC services over their unix sockets.
type socketCheck struct {
	registrationSocket string
	draSocket          string
	helper             *kubeletplugin.Helper
}

func (c *socketCheck) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reg, err := dialUnix(c.registrationSocket)
	if err != nil {
		return err
	}
	defer reg.Close()
	if _, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		return fmt.Errorf("registration socket %s: %w", c.registrationSocket, err)
	}
	dra, err := dialUnix(c.draSocket)
	if err != nil {
		return err
	}
	defer dra.Close()
	if _, err := drapb.NewDRAPluginClient(dra).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("DRA socket %s: %w", c.draSocket, err)
	}
	return nil
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// serveHealthz: both sockets answer.
func (c *socketCheck) serveHealthz(w http.ResponseWriter, r *http.Request) {
	if err := c.check(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// serveReadyz: healthy, and the kubelet has accepted the registration.
func (c *socketCheck) serveReadyz(w http.ResponseWriter, r *http.Request) {
	err := c.check(r.Context())
	if err == nil {
		switch st := c.helper.RegistrationStatus(); {
		case st == nil:
			err = errors.New("the kubelet has not registered the plugin yet")
		case !st.PluginRegistered:
			err = fmt.Errorf("the kubelet refused the registration: %s", st.Error)
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}
