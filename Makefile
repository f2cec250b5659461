# rdma-dra-driver: the two newcomer commands are `make demo` and `make test`.
GO        ?= go
BIN       ?= bin
# The release version is the VERSION file (CHANGELOG.md says when it
# changes); the chart's version and appVersion equal it (a test checks).
# The commit is git's, "-dirty" when the tree has changes. Both are linked
# into every binary (--version, the build_info metric).
VERSION   ?= $(shell cat $(CURDIR)/VERSION)
COMMIT    ?= $(shell c=$$(git -C $(CURDIR) rev-parse HEAD 2>/dev/null) && { git -C $(CURDIR) diff --quiet HEAD -- 2>/dev/null && echo $$c || echo $$c-dirty; })
LDFLAGS   := -X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.version=$(VERSION) -X github.com/rdma-dra/rdma-dra-driver/internal/buildinfo.commit=$(COMMIT)
IMAGE     ?= ghcr.io/rdma-dra/rdma-dra-driver:$(VERSION)
FUZZTIME  ?= 20s
STATICCHECK_VERSION ?= v0.8.2

# Simulated nodes are thousands of small files: on a disk-backed /tmp each
# create costs about 1 ms here, on tmpfs microseconds. Tests use tmpfs when
# there is one.
ifneq ($(wildcard /dev/shm/.),)
export TMPDIR ?= /dev/shm
endif

.PHONY: all build generate test test-unit test-e2e test-vm test-multinode demo bench bench-scale bench-scale-prefilter bench-podstart fuzz lint image docker-image clean

all: build

build:
	$(GO) build -ldflags="$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# Generated code (the config API's deepcopy) from the go:generate lines; the
# generators are tools of go.mod (go get -tool). A test fails when it is stale.
generate:
	$(GO) generate ./...

# Unit tests of the main module (race detector), then the end-to-end suite
# in test/, its own module with a real kube-apiserver (the first, cold build
# of k8s.io/kubernetes takes about 6 minutes on 2 cores), then the VM suite
# (a real kernel with Soft-RoCE in QEMU; skips, saying why, without QEMU),
# then the two-node VM suite.
test: test-unit test-e2e test-vm test-multinode

# go mod download first: TestGeneratedDeepCopyIsCurrent runs deepcopy-gen
# (a tool of go.mod) offline, so its modules must be in the cache.
# -parallel 8, not GOMAXPROCS (2 here): most of pkg/draplugin's tests wait
# about a second for the kubelet plugin helper's ResourceSlice informer
# (it checks for the sync once a second), so eight of them wait at once.
test-unit:
	$(GO) mod download
	$(GO) test -race -count=1 -parallel 8 ./...

# -parallel 4: test/e2e's tests, each with its own control plane and real
# node, mostly wait (test/e2e/main_test.go says what was measured).
test-e2e:
	cd test/helmrender && $(GO) test -count=1 ./...
	cd test && $(GO) test -count=1 -timeout 60m -parallel 4 $$($(GO) list ./... | grep -v /test/vm)

# Debian's kernel in QEMU (TCG) with Soft-RoCE and soft-iWARP: discovery
# against the kernel's tools, CDI-injected runc containers moving data over
# verbs, port-down taints (docs/vm.md). Packages are cached under
# ${XDG_CACHE_HOME:-~/.cache}/rdma-dra-driver/vm; VM_FLAGS=-v streams the console.
# The two-guest tests are test-multinode's.
test-vm:
	cd test && $(GO) test -count=1 -timeout 40m -skip '^(TestLinkBetweenGuests|TestMultiNode)$$' $(VM_FLAGS) ./vm/...

# Two QEMU guests as two real nodes of one cluster, joined by a private
# Ethernet segment with an rxe on each end: an Indexed Job's two ranks run
# perftest, rping and UCX between the nodes through devices the driver
# allocated, then node B's link goes down under a transfer; a second Job of
# restricted pods (non-root, no capabilities) on the pod network moves data
# between the nodes too (docs/vm.md). The `cross-guest:`/`cross-node:`
# summary lines come last.
test-multinode:
	@cd test && log=$$(mktemp) && \
	  { $(GO) test -count=1 -timeout 50m -v -run '^(TestLinkBetweenGuests|TestMultiNode)$$' $(VM_FLAGS) ./vm/ 2>&1; echo $$? > $$log.rc; } | tee $$log; \
	  echo "== test-multinode summary"; grep -E '^cross-(node|guest)( \(pod network, restricted\))?:' $$log; rc=$$(cat $$log.rc); rm -f $$log $$log.rc; exit $$rc

# The demo: rdmactl on a simulated DGX H100 node, then the same node in an
# in-process Kubernetes 1.37 cluster running the Jobs of demo/specs (DRA and
# rdma/hca): on a real node (kubelet + containerd + runc, the chart's
# DaemonSet) as root, else slices and allocations only. DEMO_FLAGS=--keep leaves it
# up for kubectl; DEMO_LOG=file keeps the cluster's logs.
demo: build
	BIN=$(BIN) ./demo/run.sh
	cd test && $(GO) run ./cmd/rdma-demo $(DEMO_FLAGS) 2>$(or $(DEMO_LOG),/dev/null)

# The main module's benchmarks, then the kubelet's path through the real
# daemon against an in-process kube-apiserver (test/prepbench): the
# `prepare sustained:` and `prepare concurrency:` lines.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	cd test && $(GO) test -run '^$$' -bench 'BenchmarkPrepare(Sustained|Concurrent)$$' -benchtime=1x -timeout 30m ./prepbench

# The real kube-scheduler with SCALE_NODES simulated RDMA nodes (each 8 CX-7 +
# 2 BF-3, a GPU driver's 8 GPUs on the same PCIe roots, a one-attribute
# baseline driver): pods/s and p50/p99 per pod shape, ratios to the baseline.
SCALE_NODES ?= 100,1000
bench-scale:
	cd test && SCALE_NODES=$(SCALE_NODES) $(GO) test -run '^$$' -bench BenchmarkScheduling -benchtime=1x -timeout 60m ./scale

# The same with the allocator's driver prefilter prototype (test/scale/prefilter,
# proposed upstream in docs/performance.md): the anchor shapes only, against a
# patched copy of k8s.io/dynamic-resource-allocation. Nothing ships with it.
PREFILTER_DIR := $(TMPDIR)/rdma-dra-prefilter
bench-scale-prefilter:
	test/scale/prefilter/apply.sh "$$(cd test && $(GO) list -m -f '{{.Dir}}' k8s.io/dynamic-resource-allocation)" $(PREFILTER_DIR)/dra
	sed 's|^\(\s*k8s.io/dynamic-resource-allocation =>\).*|\1 $(PREFILTER_DIR)/dra|' test/go.mod >$(PREFILTER_DIR)/go.mod
	cp test/go.sum $(PREFILTER_DIR)/go.sum
	cd test && SCALE_NODES=$(SCALE_NODES) SCALE_SHAPES=$${SCALE_SHAPES:-baseline,gpu,one-hca,gpu-pair,gpu-hca-pair,gpu-swapped,one-hca-swapped,gpu-pair-swapped,gpu-hca-pair-swapped} \
		$(GO) test -modfile=$(PREFILTER_DIR)/go.mod -run '^$$' -bench BenchmarkScheduling -benchtime=1x -timeout 60m ./scale

# Pod create -> Running on the real node, by route (no device, DRA claim,
# rdma/hca via the device plugin and via extendedResourceName); root only.
bench-podstart:
	cd test && $(GO) test -run '^$$' -bench BenchmarkPodStart -benchtime=1x -timeout 30m ./scale

# Runs every fuzz target for $(FUZZTIME) each (go test takes one -fuzz target at a time).
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for t in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	    echo "== $$pkg $$t"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -version >/dev/null 2>&1; then \
	  $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...; \
	else echo "staticcheck $(STATICCHECK_VERSION) could not be installed from the module proxy; skipped"; fi

# The driver's image without Docker: static binaries in /usr/bin, written as
# an OCI image-layout tarball (`ctr -n k8s.io images import` loads it; the
# real-node tests run exactly this file).
IMAGE_TAR ?= $(BIN)/rdma-dra-driver-image.tar
image:
	rm -rf $(BIN)/image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w $(LDFLAGS)" -o $(BIN)/image/ ./cmd/...
	$(GO) run ./build/rdma-image --name $(IMAGE) --bin $(abspath $(BIN)/image) --out $(abspath $(IMAGE_TAR))

# The same image with a Docker engine (there is none on the development machines).
docker-image:
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

clean:
	rm -rf $(BIN)
