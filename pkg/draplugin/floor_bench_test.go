package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdma-dra/rdma-dra-driver/internal/drafloor"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
)

// benchDirs puts an env where a node has its directories: the CDI dir on a
// tmpfs (/var/run/cdi), the checkpoint and the plugin data (metadata
// files) on disk (/var/lib/kubelet). RDMA_DRA_BENCH_DISK names the disk
// directory (default /var/tmp; the Makefile's TMPDIR is a tmpfs),
// RDMA_DRA_BENCH_TMPFS the tmpfs one (default /dev/shm).
func benchDirs(b *testing.B, e *env) {
	disk := os.Getenv("RDMA_DRA_BENCH_DISK")
	if disk == "" {
		disk = "/var/tmp"
	}
	diskDir, err := os.MkdirTemp(disk, "rdma-dra-bench-")
	if err != nil {
		b.Skipf("no disk directory for the benchmark (%v); set RDMA_DRA_BENCH_DISK", err)
	}
	b.Cleanup(func() { os.RemoveAll(diskDir) })
	tmpfs := os.Getenv("RDMA_DRA_BENCH_TMPFS")
	if tmpfs == "" {
		tmpfs = "/dev/shm"
	}
	cdiDir, err := os.MkdirTemp(tmpfs, "rdma-dra-bench-cdi-")
	if err != nil {
		b.Skipf("no tmpfs directory for the CDI specs (%v); set RDMA_DRA_BENCH_TMPFS", err)
	}
	b.Cleanup(func() { os.RemoveAll(cdiDir) })
	e.cdiDir = cdiDir
	e.stateDir = filepath.Join(diskDir, "state")
	e.pluginDir = filepath.Join(diskDir, "plugins", driverName)
	e.registryDir = filepath.Join(diskDir, "plugins_registry")
	for _, d := range []string{e.stateDir, e.pluginDir, e.registryDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrepareVsFloor times, in one run and interleaved call by call,
// a prepare (and its unprepare) through the same helper and API server
// (the client-go fake) of:
//   - floor: drafloor.Driver;
//   - metadata: this driver as the daemon runs it: device metadata on (the
//     default), its files written by the driver, and the checkpoint not
//     fsynced (checkpoint.BootScoped: a reboot discards it anyway);
//   - no-metadata: the same with --device-metadata=false;
//   - metadata-fsync: metadata on, the checkpoint fsynced as before;
//   - helper-metadata: the helper's own metadata writer (what the driver
//     used before: two files and their directories fsync'd per request),
//     the checkpoint fsynced.
//
// It reports each one's p50 and p50 over the floor's ("x-floor").
func BenchmarkPrepareVsFloor(b *testing.B) {
	type variant struct {
		name string
		call func() (time.Duration, error)
		lat  []time.Duration
	}
	var variants []*variant
	base := newEnv(b)
	base.cfg.AllowNonHostNetwork = true
	benchDirs(b, base)

	// The floor, started as the env starts the driver.
	floorDir := filepath.Join(base.stateDir, "floor")
	if err := os.MkdirAll(floorDir, 0o755); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	floorPlugin := filepath.Join(filepath.Dir(base.pluginDir), "floor")
	if err := os.MkdirAll(floorPlugin, 0o755); err != nil {
		b.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, drafloor.Driver{Dir: floorDir, CDIKind: "rdma.dra.dev/hca"},
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(base.client),
		kubeletplugin.PluginDataDirectoryPath(floorPlugin), kubeletplugin.RegistrarDirectoryPath(base.registryDir),
		kubeletplugin.RegistrarSocketFilename("floor-reg.sock"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(helper.Stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(floorPlugin, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	floorClient := drapb.NewDRAPluginClient(conn)

	cycle := func(dra drapb.DRAPluginClient, c *resourceapi.ResourceClaim) func() (time.Duration, error) {
		req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref(c)}}
		unreq := &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref(c)}}
		return func() (time.Duration, error) {
			start := time.Now()
			resp, err := dra.NodePrepareResources(context.Background(), req)
			d := time.Since(start)
			if err == nil && resp.Claims[string(c.UID)].Error != "" {
				err = fmt.Errorf("%s", resp.Claims[string(c.UID)].Error)
			}
			if err != nil {
				return 0, err
			}
			if _, err := dra.NodeUnprepareResources(context.Background(), unreq); err != nil {
				return 0, err
			}
			return d, nil
		}
	}
	variants = append(variants, &variant{name: "floor", call: cycle(floorClient, base.claim("floor", nil, one("mlx5-0")))})

	for i, v := range []struct {
		name                  string
		metadata, help, fsync bool
	}{{"metadata", true, false, false}, {"no-metadata", false, false, false}, {"metadata-fsync", true, false, true}, {"helper-metadata", false, true, true}} {
		e := newEnv(b)
		e.client, e.cfg.AllowNonHostNetwork, e.cfg.DeviceMetadata = base.client, true, v.metadata
		if !v.fsync {
			e.deps.storeOpts = []checkpoint.Option{checkpoint.BootScoped()}
		}
		benchDirs(b, e)
		if v.help {
			e.deps.helperOpts = []kubeletplugin.Option{kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
				kubeletplugin.CDIDirectory(e.cdiDir)}
		}
		e.start()
		c := e.claim(v.name, nil, one(fmt.Sprintf("mlx5-%d", i+1)))
		variants = append(variants, &variant{name: v.name, call: cycle(e.dra, c)})
	}

	n := 0
	for b.Loop() {
		// Rotated, so no variant always follows the same one.
		for j := range variants {
			v := variants[(n+j)%len(variants)]
			d, err := v.call()
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			v.lat = append(v.lat, d)
		}
		n++
	}
	b.StopTimer()
	p50 := func(l []time.Duration) float64 {
		s := slices.Clone(l)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	floor := p50(variants[0].lat)
	for _, v := range variants {
		b.ReportMetric(p50(v.lat), v.name+"-p50-ms")
		if v.name != "floor" {
			b.ReportMetric(p50(v.lat)/floor, v.name+"-x-floor")
		}
	}
}
