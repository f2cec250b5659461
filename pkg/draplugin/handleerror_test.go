package draplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/rdma-dra/rdma-dra-driver/pkg/cdi"
	"github.com/rdma-dra/rdma-dra-driver/pkg/checkpoint"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca"
	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/hcatest"
	"github.com/rdma-dra/rdma-dra-driver/pkg/kevents"
)

// countingPublisher records what it was asked to publish.
type countingPublisher struct{ calls int }

func (p *countingPublisher) PublishResources(context.Context, resourceslice.DriverResources) error {
	p.calls++
	return nil
}

func newTestDriver(t testing.TB) *Driver {
	d, _ := newTestDriverOn(t, 0, nil, nil)
	return d
}

// newTestDriverOn returns a driver on a simulated softroce node, following
// events if not nil, with its discoverer wrapped by wrap if not nil.
func newTestDriverOn(t testing.TB, portPoll time.Duration, events <-chan kevents.Event, wrap func(HCASource) HCASource) (*Driver, *hcatest.Node) {
	t.Helper()
	dir := t.TempDir()
	spec, _ := hcatest.Preset("softroce")
	node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	var inv HCASource = hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot))
	if wrap != nil {
		inv = wrap(inv)
	}
	d, err := New(context.Background(), Config{DriverName: "rdma.dra.dev", NodeName: "vm01", AllowNonHostNetwork: true,
		TaintUnhealthy: true, PortPollInterval: portPoll, RescanInterval: time.Hour}, Deps{
		HCAs:         inv,
		KernelEvents: events,
		SpecDir:      cdi.NewSpecDir(filepath.Join(dir, "cdi")),
		Checkpoint:   checkpoint.NewStore(filepath.Join(dir, "checkpoint.json")),
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, node
}

// TestHandleError: a refused publish (dropped fields, invalid slice) is
// counted and scheduled for a republish; a transient error is only counted.
func TestHandleError(t *testing.T) {
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceSlice"}, "vm01-0",
		field.ErrorList{field.Invalid(field.NewPath("spec", "devices").Index(0).Child("attributes"), "x", "bad")})
	tests := []struct {
		name      string
		err       error
		wantRetry bool
		wantKind  string
	}{
		{"invalid slice", fmt.Errorf("publish: %w", invalid), true, "publish"},
		{"dropped fields", &resourceslice.DroppedFieldsError{}, true, "publish"},
		{"recoverable", fmt.Errorf("%w: connection refused", kubeletplugin.ErrRecoverable), false, "publish"},
		{"other", errors.New("boom"), false, "other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDriver(t)
			p := &countingPublisher{}
			if err := d.SetPublisher(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			d.HandleError(context.Background(), tt.err, "publishing")
			select {
			case <-d.pub.retryCh:
				if !tt.wantRetry {
					t.Error("a transient error scheduled a republish")
				}
			default:
				if tt.wantRetry {
					t.Error("a refused publish was not scheduled for a republish")
				}
			}
			if tt.wantRetry {
				// The next publish goes out even though the inventory is unchanged.
				if err := d.pub.publish(context.Background()); err != nil || p.calls != 2 {
					t.Errorf("republish: err %v, %d publishes, want 2", err, p.calls)
				}
			}
			got, err := testutil.GetCounterMetricValue(d.metrics.backgroundErrors.WithLabelValues(tt.wantKind))
			if err != nil || got != 1 {
				t.Errorf("background_errors_total{kind=%q} = %v (%v), want 1", tt.wantKind, got, err)
			}
		})
	}
}

func TestMetricsExposed(t *testing.T) {
	d := newTestDriver(t)
	if err := d.SetPublisher(context.Background(), &countingPublisher{}); err != nil {
		t.Fatal(err)
	}
	families, err := d.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
		if f.GetName() == "rdma_dra_published_devices" && f.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Errorf("published_devices = %v, want 1 (rxe0)", f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "rdma_dra_published_devices") || !strings.Contains(got, "rdma_dra_publishes_total") {
		t.Errorf("metrics = %s", got)
	}
}

// TestFirstInventoryReachesTheShim: a node with no RDMA yet still hands its
// (empty) first inventory to OnInventory, so the device-plugin shim stops
// answering "not discovered yet".
func TestFirstInventoryReachesTheShim(t *testing.T) {
	dir := t.TempDir()
	spec, _ := hcatest.Preset("empty")
	node, err := hcatest.Build(filepath.Join(dir, "node"), spec)
	if err != nil {
		t.Fatal(err)
	}
	var seen []hca.Inventory
	_, err = New(context.Background(), Config{DriverName: "rdma.dra.dev", NodeName: "cpu01", AllowNonHostNetwork: true}, Deps{
		HCAs:        hca.NewDiscoverer(hca.WithSysfsRoot(node.SysfsRoot), hca.WithDevRoot(node.DevRoot)),
		SpecDir:     cdi.NewSpecDir(filepath.Join(dir, "cdi")),
		Checkpoint:  checkpoint.NewStore(filepath.Join(dir, "checkpoint.json")),
		OnInventory: func(inv hca.Inventory) { seen = append(seen, inv) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || len(seen[0].HCAs) != 0 {
		t.Fatalf("OnInventory saw %d inventories (%+v), want one empty", len(seen), seen)
	}
}
