# Skipper. `make up` and `make test` need root (namespaces, bridges, mounts).
SHELL := /bin/bash
.DEFAULT_GOAL := build

GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools
KUBE_VERSION := v1.37.2
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37
KUBE_TOOLS := etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl
CONTAINERD_VERSION := v2.4.2
CONTAINERD_LDFLAGS := -s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION:v%=%)
# Binaries of the main module: name -> package.
SKIPPER_BINS := skipper-controller skipper-noderouter skipper-echo skipper-agent
TEST_BINS    := skipper-cluster skipper-bench skipper-testpod
BUILD_FLAGS  := -trimpath -ldflags "-s -w"

.PHONY: image image-bins crictl coredns httpbin proto-breaking bench bench-scale bench-vip bench-burst bench-coldstart bench-hops bench-podstart bench-soak bpf-generate deps fuzz build build-bins kube containerd tools tools-bins generate verify test unit e2e up down lint clean
# One line per step on screen, the tools' own output in bin/log/<step>.log.
STEP := bash .ci/step

## deps: Debian packages and the bpffs mount the tests and the cluster need (root)
deps:
	@$(STEP) deps "installing Debian packages (.ci/install)" -- bash .ci/install

## build: the Skipper binaries and the local cluster's tools into bin/
build:
	@$(STEP) -p build "building Skipper" -- $(MAKE) --no-print-directory build-bins
build-bins:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -v $(BUILD_FLAGS) -o $(BIN)/ $(addprefix ./cmd/,$(SKIPPER_BINS))
	CGO_ENABLED=0 $(GO) build -v $(BUILD_FLAGS) -o $(BIN)/ $(addprefix ./tests/cmd/,$(TEST_BINS))
	cd tests/promql && CGO_ENABLED=0 $(GO) build -v $(BUILD_FLAGS) -o $(BIN)/ ./cmd/skipper-promql

## image: the Skipper image (the binaries of build at /<binary>, the Dockerfile's
## user and entrypoint), the sandbox ("pause") image, the cluster DNS (CoreDNS)
## image and the e2e tests' pod image, as an OCI image layout in bin/image,
## with go-containerregistry (no Docker, no base image; nested module
## tests/image); the local cluster's registry serves them
image: build coredns httpbin
	@$(STEP) -p image "building the Skipper, pause, CoreDNS and test pod images into bin/image" -- $(MAKE) --no-print-directory image-bins
image-bins:
	cd tests/image && CGO_ENABLED=0 $(GO) build -v $(BUILD_FLAGS) -o $(BIN)/ ./cmd/skipper-image ./cmd/skipper-pause
	$(BIN)/skipper-image build --bin $(BIN) --out $(BIN)/image

## kube: the Kubernetes multi-call binary from the nested module (cold: ~15 min)
kube: $(BIN)/kube
$(BIN)/kube: tests/kube/go.mod tests/kube/go.sum tests/kube/main.go
	@mkdir -p $(BIN)
	@$(STEP) -p kube "building Kubernetes $(KUBE_VERSION) from its Go modules (once, about 15 minutes on 2 cores)" -- \
		bash -c 'cd tests/kube && CGO_ENABLED=0 $(GO) build -v -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(BIN)/kube.tmp .'
	@mv $(BIN)/kube.tmp $(BIN)/kube
	@for t in $(KUBE_TOOLS); do ln -sf kube $(BIN)/$$t; done

## crictl: the CRI client (sigs.k8s.io/cri-tools), a tool of the nested module
## tests/kube, for the local cluster's containerd:
## `bin/crictl --runtime-endpoint unix://<a node's containerd.sock> ps`
CRICTL_VERSION := v1.37.0
crictl: $(BIN)/crictl
$(BIN)/crictl: tests/kube/go.mod tests/kube/go.sum
	@mkdir -p $(BIN)
	@$(STEP) -p crictl "building crictl $(CRICTL_VERSION) from its Go module (nested module tests/kube; about 2 minutes on 2 cores, seconds once cached)" -- \
		bash -c 'cd tests/kube && CGO_ENABLED=0 $(GO) build -v -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$(CRICTL_VERSION)" -o $(BIN)/crictl.tmp sigs.k8s.io/cri-tools/cmd/crictl'
	@mv $(BIN)/crictl.tmp $(BIN)/crictl

## containerd: containerd, its runc v2 shim and ctr, one multi-call binary from
## the nested module tests/containerd (cold: ~3 min on 2 cores). The shim and
## ctr are hard links: the shim re-executes /proc/self/exe, which a symlink
## would resolve to bin/containerd.
containerd: $(BIN)/containerd
$(BIN)/containerd: tests/containerd/go.mod tests/containerd/go.sum tests/containerd/main.go
	@mkdir -p $(BIN)
	@$(STEP) -p containerd "building containerd $(CONTAINERD_VERSION) from its Go module (once, about 3 minutes on 2 cores)" -- \
		bash -c 'cd tests/containerd && CGO_ENABLED=0 $(GO) build -v -trimpath -tags no_btrfs,no_devmapper,no_zfs -ldflags "$(CONTAINERD_LDFLAGS)" -o $(BIN)/containerd.tmp .'
	@mv $(BIN)/containerd.tmp $(BIN)/containerd
	@for t in containerd-shim-runc-v2 ctr; do ln -f $(BIN)/containerd $(BIN)/$$t; done

## coredns: the local cluster's DNS (tests/cluster/dns), CoreDNS with only the
## plugins a cluster needs, from the nested module tests/coredns (cold: ~3 min
## on 2 cores)
coredns: $(BIN)/coredns
$(BIN)/coredns: tests/coredns/go.mod tests/coredns/go.sum tests/coredns/main.go
	@mkdir -p $(BIN)
	@$(STEP) -p coredns "building CoreDNS v1.15.0 from its Go module (once, about 3 minutes on 2 cores)" -- \
		bash -c 'cd tests/coredns && CGO_ENABLED=0 $(GO) build -v -trimpath -ldflags "-s -w" -o $(BIN)/coredns.tmp .'
	@mv $(BIN)/coredns.tmp $(BIN)/coredns

## httpbin: go-httpbin's own command, unchanged, from the nested module
## tests/httpbin (its image serves deploy/examples/protocols' Function)
httpbin: $(BIN)/go-httpbin
$(BIN)/go-httpbin: tests/httpbin/go.mod tests/httpbin/go.sum
	@mkdir -p $(BIN)
	@$(STEP) -p httpbin "building go-httpbin from its Go module" -- \
		bash -c 'cd tests/httpbin && CGO_ENABLED=0 $(GO) build -v -trimpath -ldflags "-s -w" -o $(BIN)/go-httpbin.tmp github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin'
	@mv $(BIN)/go-httpbin.tmp $(BIN)/go-httpbin

## tools: code generators pinned in go.mod's tool block, and buf (it carries the
## protobuf well-known types: no host protoc) pinned in the nested module
## proto/tools, kept out of the product's module graph
tools:
	@$(STEP) -p tools "building the code generators (controller-gen, bpf2go, protoc-gen-go(-grpc), buf)" -- \
		$(MAKE) --no-print-directory tools-bins
tools-bins:
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install -v tool
	cd proto/tools && GOBIN=$(TOOLS) $(GO) install -v tool

## bpf-generate: compile bpf/steer.c (clang-14, llvm-strip-14) into the committed bpf2go outputs
bpf-generate:
	$(GO) generate ./bpf

## generate: deepcopy, CRD, protobuf/gRPC code, BPF objects
generate: tools bpf-generate
	$(TOOLS)/controller-gen object paths=./controller/api/...
	$(TOOLS)/controller-gen crd:crdVersions=v1 paths=./controller/api/... output:crd:dir=./deploy/base/crd
	cd proto && PATH=$(TOOLS):$$PATH $(GO) generate ./...

## proto-breaking: fail if proto/ breaks wire compatibility with PROTO_BASE
## (a git ref, default main), with the buf pinned in proto/tools
PROTO_BASE ?= main
proto-breaking: tools
	cd proto && $(TOOLS)/buf breaking --against '../.git#ref=$(PROTO_BASE),subdir=proto'

## verify: regenerate and fail if the committed output differs
verify: generate
	@git diff --exit-code -- controller/api deploy/base/crd proto bpf || \
		{ echo "generated code is stale: run 'make generate' and commit" >&2; exit 1; }
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

## lint: go vet (the nested tests/kube module is only built: vetting it
## would type-check all of Kubernetes a second time); and every time.Sleep
## in a test says why it is no synchronisation, with a tag on its line or
## the line before: // sleep: load, // sleep: poll or // sleep: behaviour
## (waits for an event use poll.Until or testing/synctest instead)
SLEEP_TAG := sleep: (load|poll|behaviour)
lint:
	@git ls-files --cached --others --exclude-standard '*_test.go' | xargs awk 'FNR == 1 { above = "" } /time\.Sleep\(/ && !/$(SLEEP_TAG)/ && above !~ /$(SLEEP_TAG)/ { print FILENAME ":" FNR ": " $$0; bad = 1 } { above = /^[ \t]*\/\// ? $$0 : "" } END { exit bad }' || \
		{ echo "lint: time.Sleep in a test without a '// $(SLEEP_TAG)' tag (above)" >&2; exit 1; }
	$(GO) vet ./...
	cd tests/promql && $(GO) vet ./...
	cd tests/image && $(GO) vet ./...
	cd tests/benchplot && $(GO) vet ./...
	cd tests/fastproxy && $(GO) vet ./...
	cd tests/containerd && $(GO) vet ./...
	cd tests/coredns && $(GO) vet ./...

## unit: tests that need no cluster (controller/, noderouter/, ...); the
## router's tests once more with --forwarder=h1 and --forwarder=nethttp
unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /tests/)
	SKIPPER_TEST_FORWARDER=h1 $(GO) test -race -count=1 ./noderouter/ ./noderouter/dataplane/
	SKIPPER_TEST_FORWARDER=nethttp $(GO) test -race -count=1 ./noderouter/ ./noderouter/dataplane/
	cd tests/promql && $(GO) test -count=1 ./...
	cd tests/image && $(GO) test -race -count=1 ./...
	cd tests/benchplot && $(GO) test -count=1 ./...
	cd tests/fastproxy && $(GO) test -race -count=1 ./...

## fuzz: every fuzz target (func Fuzz* in a _test.go of the main module) for
## FUZZTIME each, starting from its committed corpus in testdata/fuzz; the
## engine's own deadline flake is retried (see .ci/fuzz)
FUZZTIME ?= 5s
fuzz:
	GO=$(GO) bash .ci/fuzz $(FUZZTIME)

## e2e: tests against the local cluster (starts one if none runs; root)
e2e: build kube containerd crictl image
	$(GO) test -p 1 -count=1 -timeout 40m ./tests/...

## test: everything (root): verify, vet, unit, a short fuzz of every target, e2e
test: deps verify lint unit fuzz e2e

## bench-coldstart: first-call latency of 50 fresh Functions from a warm pool
## (needs a running cluster: make up in another shell)
bench-coldstart: build
	$(BIN)/skipper-bench coldstart -n 50

## bench-hops: the floor of bench-coldstart's first/second ratio: its hops
## as bare TCP round trips between idle do-nothing processes in the
## cluster's own network namespaces (needs a running cluster, root)
bench-hops: build
	$(BIN)/skipper-bench hops -n 40

## bench-burst: 30 new Functions called within 3 s against an autoscaled
## pool of 3 of its own: first calls served by a pod ready before the call,
## the pool's replicas as it grows and shrinks back (needs a running cluster)
bench-burst: build
	$(BIN)/skipper-bench burst -n 30 -spread 3s -pool-min 3

## bench-podstart: pod start as the kubelet does it (created -> Ready,
## p50/p90) for 30 bare pods from the echo pool's template, one at a time
## (needs a running cluster: make up in another shell)
bench-podstart: build
	$(BIN)/skipper-bench podstart -n 30

## bench-vip: a node-2 caller's connect+request latency via the BPF-steered
## VIP, via kube-proxy, and to the router directly (needs a running cluster)
bench-vip: build
	$(BIN)/skipper-bench vip -n 2000 -rounds 5

## bench: warm requests direct, through the router (node IP, BPF-steered VIP,
## kube-proxy) and through nginx, haproxy and fastproxy (a minimal fasthttp
## proxy, tests/fastproxy) beside it: wrk closed loop,
## fixed-rate open loop, proxy CPU per request; then the VIP per new
## connection (skipper-bench vip) and the router's allocations per request
## (BenchmarkProxyWarmServed); rewrites its section of
## docs/benchmarks.md and docs/bench/ (needs a running cluster: make up in
## another shell; root)
bench: build
	bash .ci/install-bench
	cd tests/benchplot && CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/ ./cmd/skipper-benchplot
	cd tests/fastproxy && CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/ .
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o $(BIN)/ ./tests/loopproxy
	$(GO) test -run '^$$' -bench 'ProxyWarmServed|CallerCheck' -benchmem -count 3 ./noderouter/dataplane/ ./noderouter/callers/ > $(BIN)/bench-allocs.txt
	$(BIN)/skipper-bench warm -allocs $(BIN)/bench-allocs.txt

## bench-scale: the router's and the controller's cost beyond the request
## path, in-process with synthetic assignments (no cluster; issue 14): heap
## and RSS per cached function at 10,000, report size and CPU per interval
## with 10,000 active functions, a new function's cost at 10,000; controller
## CPU per converge interval and heap per function at 1,000 and 10,000
bench-scale:
	$(GO) test -run '^$$' -bench 'ScaleRouterCache' -benchtime 1x -count 3 ./noderouter/
	$(GO) test -run '^$$' -bench 'ScaleRouter(Report|NewFunction)' -benchtime 20x -count 3 ./noderouter/
	$(GO) test -run '^$$' -bench 'ScaleConverge' -benchtime 20x -count 3 ./controller/

## bench-soak: 10 minutes of 500 Functions created and deleted while calls run;
## router and controller RSS and goroutines must end within 10% of the start
## (needs a running cluster; not part of make test)
bench-soak: build
	$(BIN)/skipper-bench soak

## up: the local cluster in the foreground with the demo function (root): real
## nodes (a kubelet and containerd each), images from make image
up: deps build kube containerd crictl image
	$(BIN)/skipper-cluster up

## down: stop the local cluster and remove everything it made (root)
down:
	@if [ -x $(BIN)/skipper-cluster ]; then $(BIN)/skipper-cluster down; \
	else CGO_ENABLED=0 $(GO) run ./tests/cmd/skipper-cluster down; fi

clean:
	rm -rf $(BIN)
