# lock-janitor: build, test and demo on a real local control plane.
# Quick start:  make demo   |   make test
SHELL := /bin/bash
CARGO ?= cargo
# Tests mostly wait on the API server; run more of them than there are cores.
TEST_THREADS ?= 6

.PHONY: all setup build python-peer fabric8-peer java-peer testenv-build testenv-up testenv-down testenv-status test test-rust test-alerts test-chart test-docker test-compat lint demo chaos bench bench-scale bench-memory bench-takeover bench-scan bench-janitor bench-idle bench-optin soak release release-check push

all: build

build:
	$(CARGO) build --locked --workspace --all-targets

## Install what the tests need beyond Go and Rust (Debian packages, rustup parts).
setup:
	hack/setup.sh

## Build etcd, kube-apiserver, kube-controller-manager and helm into the cache (once per version).
testenv-build:
	testenv/build.sh >/dev/null

## The Python peer's venv (the official kubernetes client, pinned in
## testenv/peers/python/requirements.txt) in the cache; test-rust makes it too.
python-peer:
	hack/python-peer.sh

## The fabric8 peer (fabric8's Java client, pinned in testenv/peers/fabric8/pom.xml:
## its jars and the compiled elector) in the cache; test-rust builds it too.
fabric8-peer:
	hack/fabric8-peer.sh

## The Java peer's build (the official Kubernetes Java client, pinned in
## testenv/peers/java/pom.xml: its jars and Elector.class) in the cache;
## test-rust builds it too.
java-peer:
	hack/java-peer.sh java

## Start a control plane that outlives the command; prints `export KUBECONFIG=...`.
testenv-up: testenv-build
	$(CARGO) run --locked -q -p lock-janitor-testenv --bin testenv -- up

testenv-down:
	$(CARGO) run --locked -q -p lock-janitor-testenv --bin testenv -- down

testenv-status:
	$(CARGO) run --locked -q -p lock-janitor-testenv --bin testenv -- status

## Everything CI runs: lint, unit and end-to-end tests, alert rules, chart, Dockerfile build.
## Ends with a table of its phases and their seconds (hack/phases.sh).
TEST_PHASES := setup testenv-build lint test-rust test-alerts test-chart test-docker
test:
	@[ -n "$$LOCK_JANITOR_PHASES" ] || hack/phases.sh reset
	@trap 'hack/phases.sh table "make test: phases"' EXIT; \
	for p in $(TEST_PHASES); do \
	  hack/phases.sh run "$$p" $(MAKE) --no-print-directory "$$p" || exit $$?; \
	done

## The fast lane: the unit tests alone, no control plane (the judgement, the
## decisions, every freeing write on a mocked API server). Under a minute once built.
.PHONY: test-fast
test-fast:
	$(CARGO) test --locked --workspace --lib --bins -q

# hack/long-functions.py: no function in src/, examples/, testenv/src/ or
# testsupport/src/ over 100 lines (issue 47), but those in hack/long-functions.allow.
# hack/kind-locality.sh: each lock kind is its folder and its registration
# (src/kinds/mod.rs): taken out of a copy of the tree, the crate still builds.
lint: setup
	$(CARGO) fmt --all -- --check
	hack/long-functions.py
	CARGO=$(CARGO) hack/kind-locality.sh
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

# The unit tests, then tests/e2e (one shared control plane, TEST_THREADS) and
# tests/isolated (own control planes, ISOLATED_THREADS) side by side. The
# examples (benchmarks, demo, chaos) are checked by clippy and built by their
# own targets, not linked for the tests.
ISOLATED_THREADS ?= 2
test-rust: setup testenv-build
	TEST_THREADS=$(TEST_THREADS) ISOLATED_THREADS=$(ISOLATED_THREADS) CARGO=$(CARGO) hack/test-rust.sh

test-alerts: setup
	hack/test-alerts.sh

test-chart: testenv-build
	hack/test-chart.sh

test-docker: setup
	hack/docker-build-check.sh

## A compat subset of the end-to-end tests on each Kubernetes minor (builds each one's
## control plane once, about 7 minutes): make test-compat VERSIONS="v1.31.14 v1.37.2"
## (default: every versions.env K8S_VERSIONS). Not part of make test. docs/compatibility.md.
VERSIONS ?=
test-compat: setup
	VERSIONS="$(VERSIONS)" CARGO=$(CARGO) hack/test-compat.sh

## Release artifacts in dist/ for the version in Cargo.toml: archives for linux|darwin x
## amd64|arm64, checksums.txt, sbom.cdx.json, image/ (OCI layout, linux/amd64+arm64),
## the chart package and the krew manifest. Cross-compiled here, no Docker engine.
release: setup
	hack/release.sh

## Pushes dist/ (make release) to your registry: make push REGISTRY=<host>[/<path>]
## (PLAIN_HTTP=1 for one without TLS); prints the helm install command for it.
push: testenv-build
	hack/push.sh "$(REGISTRY)"

## Installs dist/ from a local OCI registry, for real: push the image and the chart,
## cosign sign + verify, helm install oci:// into a test control plane, digest check.
release-check: release testenv-build
	hack/release-check.sh

## The janitor's main job on a local control plane: an evicted leader's lock is reclaimed and a waiting replica takes over.
demo: testenv-build
	$(CARGO) build --locked -q --bin lock-janitor
	$(CARGO) run --locked -q --example demo

## The long chaos run: random fates and faults, checked against the audit log; prints its seed (SEED=<n> replays). About 15 minutes.
## `make test` runs a short seeded one (tests/isolated/chaos.rs).
chaos: testenv-build
	$(CARGO) build --locked --release --bin lock-janitor --example chaos
	LOCK_JANITOR_BIN=$(CURDIR)/target/release/lock-janitor target/release/examples/chaos $(CHAOS_ARGS)

## The soak run: 300 opted-in locks of the three kinds under churn (a holder dies every 3 s and
## a new one takes its lock), renewed Leases renewing, two API server restarts and a killed
## leader; prints RSS, fds, threads, per-lock state and series and error counters every
## minute, then wrong writes (audit log), missed reclaims and RSS growth within a role after
## its minute 5, net of the per-lock reclaim series; exits 1 on any. The janitor is the
## image's musl build (a glibc build's arenas keep freed memory). SOAK_MINUTES=30 by default;
## not part of make test. docs/performance.md keeps a run.
SOAK_MINUTES ?= 30
soak: testenv-build janitor-musl
	$(CARGO) build --locked --release --example soak
	LOCK_JANITOR_BIN=$(CURDIR)/$(NODE_MUSL_BIN) SOAK_MINUTES=$(SOAK_MINUTES) target/release/examples/soak $(SOAK_ARGS)

## Benchmarks: they report numbers (not part of make test).
## make bench: memory, idle API load and reclaim latency at 0, 1,000 and 10,000 locks
## (the image's musl build); heap per lock by part; takeover time with the real
## operator-lib, alone and with the janitor; idle cost among 50,000 pods that hold
## no lock and a Lease judgement's peak memory (bench-idle, about 33 minutes).
bench: bench-scale bench-memory bench-takeover bench-idle

bench-scale: setup testenv-build
	hack/bench-scale.sh

bench-memory:
	$(CARGO) run --locked -q --release --example bench_memory

bench-takeover: testenv-build
	hack/bench-takeover.sh

bench-scan: testenv-build
	hack/bench-scan.sh

bench-janitor: testenv-build
	hack/bench-janitor.sh

bench-idle: testenv-build
	hack/bench-idle.sh

## The cost of --auto-opt-in among 20,000 bystander ConfigMaps and 2,000 renewed
## bystander Leases, with and without it (docs/performance.md, "Auto opt-in").
bench-optin: testenv-build
	hack/bench-optin.sh

## The optional real node (testenv/build-node.sh; root): kubelet, kube-scheduler,
## containerd, runc, CNI plugins, crictl built from Go modules beside the control plane.
## Not part of `make test`. See docs/real-node.md.
.PHONY: node-build node-up demo-node test-node janitor-musl bench-node
NODE_MUSL_BIN := target/x86_64-unknown-linux-musl/release/lock-janitor

node-build: testenv-build
	testenv/build-node.sh >/dev/null

janitor-musl: setup
	$(CARGO) build --locked --release --target x86_64-unknown-linux-musl --bin lock-janitor

## A control plane and a real node that outlive the command; `make testenv-down` stops both.
node-up: node-build janitor-musl
	$(CARGO) run --locked -q -p lock-janitor-testenv --bin testenv -- up --node --janitor-bin=$(CURDIR)/$(NODE_MUSL_BIN)

## The kubelet evicts a real operator-lib leader under memory pressure; the chart's janitor runs in real pods.
demo-node: node-build janitor-musl
	$(CARGO) build --locked -q --bin lock-janitor
	LOCK_JANITOR_MUSL_BIN=$(CURDIR)/$(NODE_MUSL_BIN) $(CARGO) run --locked -q --example demo_node

## End-to-end tests on the real node (tests/node.rs), one at a time: they fail, not skip, without it.
test-node: node-build janitor-musl
	LOCK_JANITOR_NODE=1 LOCK_JANITOR_MUSL_BIN=$(CURDIR)/$(NODE_MUSL_BIN) $(CARGO) test --locked --test node -- --test-threads=1 --show-output

## The janitor as deployed: the chart's pod with its shipped resources (a CPU
## request of 200m and no CPU limit, 192Mi of memory) on the real node, 10,000 locks, bursts of 100 and 1,000 deaths and 100
## Leases; its latency beside the same binary as a bare process and the floor, its CPU
## throttling and memory peak (with a re-list). Root; not part of `make test`.
## Then real kubelet evictions of operator-lib leaders under memory pressure, as shipped and
## with a priority class (--evictions N, default 3; 0 skips them).
## Smaller: make bench-node BENCH_NODE_ARGS="--locks 500 --bursts 20,50 --lease-burst 20 --evictions 3"
BENCH_NODE_ARGS ?=
bench-node: node-build janitor-musl
	$(CARGO) build --locked -q --release --example bench_node
	LOCK_JANITOR_MUSL_BIN=$(CURDIR)/$(NODE_MUSL_BIN) LOCK_JANITOR_BIN=$(CURDIR)/$(NODE_MUSL_BIN) \
	  LOCK_JANITOR_TEST_LOG=info target/release/examples/bench_node $(BENCH_NODE_ARGS)
