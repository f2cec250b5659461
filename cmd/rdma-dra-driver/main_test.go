package main

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/draplugin"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
)

// TestEnvOverrides: only flagEnv's variables are read (the command line
// wins over them); a variable named like any other flag changes nothing.
func TestEnvOverrides(t *testing.T) {
	o := &options{}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--kubeconfig=/cli"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"NODE_NAME": "n1", "POD_UID": "uid-1", "KUBECONFIG": "/env",
		"DRIVER_NAME": "env.example", "ALLOW_NON_HOST_NETWORK": "true", "SHARING": "shared",
		"RESCAN_INTERVAL": "3s", "KUBELET_ROOT_DIR": "/k", "DEBUG": "1", "VERSION": "9",
	}
	if err := envOverrides(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if o.nodeName != "n1" || o.podUID != "uid-1" || o.kubeconfig != "/cli" {
		t.Errorf("node %q, pod UID %q, kubeconfig %q; want n1, uid-1 and /cli (the command line wins over KUBECONFIG)", o.nodeName, o.podUID, o.kubeconfig)
	}
	want := &options{}
	defaults := pflag.NewFlagSet("d", pflag.ContinueOnError)
	want.addFlags(defaults)
	fs.VisitAll(func(f *pflag.Flag) {
		if _, read := flagEnv[f.Name]; read {
			return
		}
		if d := defaults.Lookup(f.Name); d.Value.String() != f.Value.String() {
			t.Errorf("--%s = %q after the environment, want its default %q: only %v are read", f.Name, f.Value, d.Value, slices.Sorted(maps.Values(flagEnv)))
		}
	})
	fresh := pflag.NewFlagSet("t", pflag.ContinueOnError)
	(&options{}).addFlags(fresh)
	env = map[string]string{"NODE_NAME": ""}
	if err := envOverrides(fresh, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil || fresh.Lookup("node-name").Changed {
		t.Errorf("an empty NODE_NAME: err %v, changed %v; want it unset", err, fresh.Lookup("node-name").Changed)
	}
}

// TestSocketHealth: /healthz calls both gRPC services over their sockets,
// /readyz also wants the kubelet's registration.
func TestSocketHealth(t *testing.T) {
	dir := t.TempDir()
	spec, _ := hcatest.Preset("softroce")
	node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	pluginDir, registryDir := filepath.Join(dir, "plugins", "rdma.dra.dev"), filepath.Join(dir, "plugins_registry")
	for _, d := range []string{pluginDir, registryDir, filepath.Join(dir, "cdi")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vm01"}})
	d, err := draplugin.New(ctx, draplugin.Config{DriverName: "rdma.dra.dev", NodeName: "vm01", AllowNonHostNetwork: true}, draplugin.Deps{
		HCAs:       hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot)),
		SpecDir:    cdi.NewSpecDir(filepath.Join(dir, "cdi")),
		Checkpoint: checkpoint.NewStore(filepath.Join(pluginDir, "checkpoint.json")),
	})
	if err != nil {
		t.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, d, kubeletplugin.DriverName("rdma.dra.dev"), kubeletplugin.NodeName("vm01"),
		kubeletplugin.KubeClient(client), kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir), kubeletplugin.PluginSocket(draSocketName("")))
	if err != nil {
		t.Fatal(err)
	}
	check := &socketCheck{
		registrationSocket: filepath.Join(registryDir, "rdma.dra.dev-reg.sock"),
		draSocket:          filepath.Join(pluginDir, draSocketName("")),
		helper:             helper,
	}
	probe := func(h http.HandlerFunc) (int, string) {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("GET", "/", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := probe(check.serveHealthz); code != 200 {
		t.Errorf("healthz = %d %s", code, body)
	}
	if code, body := probe(check.serveReadyz); code != 503 || !strings.Contains(body, "not registered") {
		t.Errorf("readyz before registration = %d %s", code, body)
	}
	conn, err := dialUnix(check.registrationSocket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if code, body := probe(check.serveReadyz); code != 200 {
		t.Errorf("readyz after registration = %d %s", code, body)
	}
	helper.Stop()
	if code, body := probe(check.serveHealthz); code != 503 || !strings.Contains(body, "socket") {
		t.Errorf("healthz after the helper stopped = %d %s", code, body)
	}
}

func TestValidateModes(t *testing.T) {
	tests := []struct {
		sharing sharingMode
		legacy  legacyMode
		wantErr string
	}{
		{sharing: "exclusive", legacy: "off"},
		{sharing: "shared", legacy: "off"},
		{sharing: "shared", legacy: "device-plugin"},
		{sharing: "shared", legacy: "dra"},
		{sharing: "exclusive", legacy: "device-plugin", wantErr: "--legacy=device-plugin hands every HCA to every rdma/hca pod, so it needs --sharing=shared"},
		{sharing: "exclusive", legacy: "dra", wantErr: "--legacy=dra publishes one device that hands every HCA to every rdma/hca pod, so it needs --sharing=shared"},
		{sharing: "shared", legacy: "both", wantErr: "one route only"},
		{sharing: "sometimes", legacy: "off", wantErr: `--sharing="sometimes": want exclusive or shared`},
	}
	for _, tt := range tests {
		o := &options{sharing: tt.sharing, legacyRoute: tt.legacy, sharesPerHCA: 1000, legacyShares: 1000, hookPath: "/opt/rdma-dra-driver/bin/rdma-dra-hook"}
		err := validateModes(o)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("--sharing=%s --legacy=%s: err %v, want %q", tt.sharing, tt.legacy, err, tt.wantErr)
		}
	}
}
