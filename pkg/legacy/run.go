package legacy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// registerTimeout bounds one Register call. The kubelet dials the plugin
// back and asks for its options before it answers.
const registerTimeout = 10 * time.Second

// Run serves the device-plugin API on SocketPath and registers with the
// kubelet at <DevicePluginDir>/kubelet.sock, until ctx ends; then it stops
// the server (ending every ListAndWatch stream), removes its socket and
// returns nil.
//
// A starting kubelet deletes every socket in its directory and creates a
// new kubelet.sock; it does not know the plugins registered with its
// predecessor. So every PollInterval Run looks at both files: when its own
// socket is gone or kubelet.sock is a new file (another inode, or another
// modification time, for a reused inode), it serves on a fresh socket and
// registers again. Polling, not inotify: a watch is lost when the directory
// is replaced (a remounted hostPath), inotify instances are a scarce
// per-user resource on busy nodes, and half a second is nothing next to a
// kubelet restart. While kubelet.sock is missing Run keeps serving and
// waits; a failed Register is retried at the next poll. Errors after the
// start are logged (once per distinct message), not returned.
//
// Run fails at once if it is already running, or if it cannot serve on its
// socket at the start (a missing directory, a non-socket file in the way).
func (p *Plugin) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return fmt.Errorf("device plugin for %s is already running", p.cfg.ResourceName)
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()

	logger := klog.FromContext(ctx).WithValues("resource", p.cfg.ResourceName, "socket", p.socket)
	first, err := p.serve()
	if err != nil {
		return err
	}
	r := &runState{cur: first}
	defer func() {
		if r.cur != nil {
			r.cur.stop()
		}
	}()
	logger.Info("Serving the device-plugin API", "shares", p.cfg.Shares, "cdiDevice", p.cdiID)
	ticker := time.NewTicker(p.cfg.PollInterval)
	defer ticker.Stop()
	for {
		p.reconcile(ctx, logger, r)
		select {
		case <-ctx.Done():
			logger.Info("Stopping the device-plugin API")
			return nil
		case <-ticker.C:
		}
	}
}

// runState is what Run knows between polls.
type runState struct {
	cur *instance
	// registered is the kubelet.sock we registered with; nil: none yet.
	registered fs.FileInfo
	lastErr    string
}

// report logs err unless it is the one logged last.
func (r *runState) report(logger klog.Logger, err error) {
	if msg := err.Error(); msg != r.lastErr {
		logger.Error(err, "Device plugin not registered; retrying")
		r.lastErr = msg
	}
}

// reconcile brings the server and the registration in line with the files
// in the device-plugin directory.
func (p *Plugin) reconcile(ctx context.Context, logger klog.Logger, r *runState) {
	if r.cur != nil && !r.cur.intact() {
		logger.Info("Plugin socket removed or server stopped (kubelet restart?); serving on a fresh socket")
		r.cur.stop()
		r.cur, r.registered = nil, nil
	}
	kubelet, err := os.Lstat(p.kubelet)
	if err != nil {
		kubelet = nil
		if !errors.Is(err, fs.ErrNotExist) {
			r.report(logger, fmt.Errorf("kubelet socket: %w", err))
		}
	}
	if kubelet != nil && r.registered != nil && !sameFile(kubelet, r.registered) {
		logger.Info("kubelet.sock was recreated (kubelet restart); serving on a fresh socket and registering again")
		if r.cur != nil {
			r.cur.stop()
		}
		r.cur, r.registered = nil, nil
	}
	if r.cur == nil {
		cur, err := p.serve()
		if err != nil {
			r.report(logger, err)
			return
		}
		r.cur = cur
	}
	if kubelet == nil || r.registered != nil {
		return
	}
	if err := p.register(ctx); err != nil {
		if ctx.Err() == nil {
			r.report(logger, err)
		}
		return
	}
	r.registered, r.lastErr = kubelet, ""
	logger.Info("Registered with the kubelet", "kubeletSocket", p.kubelet, "version", pluginapi.Version)
}

// register sends our RegisterRequest to the kubelet.
func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("device plugin for %s: kubelet socket %s: %w", p.cfg.ResourceName, p.kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.cfg.ResourceName,
		Options:      pluginOptions(),
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet at %s: %w", p.cfg.ResourceName, p.kubelet, err)
	}
	return nil
}

// instance is one gRPC server on one socket file.
type instance struct {
	srv  *grpc.Server
	path string
	info fs.FileInfo // of the socket file it created
	done chan struct{}
}

// serve starts a server on a fresh socket, replacing a stale one.
func (p *Plugin) serve() (*instance, error) {
	if err := removeStaleSocket(p.socket); err != nil {
		return nil, fmt.Errorf("device plugin for %s: %w", p.cfg.ResourceName, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("device plugin for %s: %w", p.cfg.ResourceName, err)
	}
	// Removal is ours to do, and only of our own file: on close the
	// listener would unlink whatever has the name by then.
	l.SetUnlinkOnClose(false)
	info, err := os.Lstat(p.socket)
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("device plugin for %s: socket vanished as it was made: %w", p.cfg.ResourceName, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &service{p: p})
	in := &instance{srv: srv, path: p.socket, info: info, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		_ = srv.Serve(l)
	}()
	return in, nil
}

// intact reports whether the server still serves on its own socket file.
func (in *instance) intact() bool {
	select {
	case <-in.done:
		return false
	default:
	}
	info, err := os.Lstat(in.path)
	return err == nil && sameFile(info, in.info)
}

// stop ends the server and its streams, and removes its socket if the file
// is still the one it made.
func (in *instance) stop() {
	in.srv.Stop()
	<-in.done
	if info, err := os.Lstat(in.path); err == nil && sameFile(info, in.info) {
		_ = os.Remove(in.path)
	}
}

// removeStaleSocket removes a socket left at path by an earlier run, and
// refuses to remove anything else.
func removeStaleSocket(path string) error {
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%s); not replacing it", path, info.Mode().Type())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the stale socket: %w", err)
	}
	return nil
}

// sameFile is os.SameFile plus the modification time, because a file
// deleted and created again may get the same inode number.
func sameFile(a, b fs.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}
