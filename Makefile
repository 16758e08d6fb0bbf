# sbx: `make demo` runs the main job on the embedded defaults; `make test`
# passes the tests. Both install what they need first (as root).
SHELL := /bin/bash
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
BIN := $(CURDIR)/bin
DEBS := busybox-static mmdebstrap iproute2 iptables tmux gcc jq chromium patch
export CGO_ENABLED := 0

.PHONY: all build deps install demo test python-deps python-test unit integration bench bench-quick soak soak-storage fleet-tools fleet-test vet fmt clean

all: build

## deps: install the Debian packages sbx needs (once; skipped when present),
## waiting up to APT_LOCK_WAIT seconds for another apt to let go of its lock
APT_LOCK_WAIT ?= 300
deps:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "==> installing Debian packages:$$missing"; \
		APT_LOCK_WAIT=$(APT_LOCK_WAIT) ./scripts/apt-install.sh $$missing >/dev/null; \
	else echo "==> Debian packages present: $(DEBS)"; fi

## build: sbx, sbxd, sbx-shim, sbx-agent, sbx-reaper and runsc (from the go.mod pin) into bin/
build: $(BIN)/runsc
	@echo "==> building sbx, sbxd, sbx-shim, sbx-controller and sbx-agent into bin/"
	@$(GO) build -o $(BIN)/sbx ./cmd/sbx
	@$(GO) build -o $(BIN)/sbxd ./cmd/sbxd
	@$(GO) build -o $(BIN)/sbx-shim ./cmd/sbx-shim
	@$(GO) build -o $(BIN)/sbx-controller ./cmd/sbx-controller
	@$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/sbx-agent ./cmd/sbx-agent
	@echo "==> building sbx-reaper (gcc, no libc) into bin/: init keeps an exec's timeout with it"
	@cmd/sbx-reaper/build.sh $(BIN)/sbx-reaper

## install: sbx, sbxd, sbx-shim, sbx-agent, sbx-reaper and runsc into $(PREFIX)/bin (on PATH), so
## that `sbxd &` and `sbx ...` work from anywhere
PREFIX ?= /usr/local
install: build
	@echo "==> installing sbx, sbxd, sbx-shim, sbx-agent, sbx-reaper and runsc into $(DESTDIR)$(PREFIX)/bin"
	@install -d $(DESTDIR)$(PREFIX)/bin
	@install -m 0755 $(BIN)/sbx $(BIN)/sbxd $(BIN)/sbx-shim $(BIN)/sbx-agent $(BIN)/sbx-reaper $(BIN)/runsc $(DESTDIR)$(PREFIX)/bin/

# runsc is built from the pinned gVisor with the patches in
# third_party/gvisor/patches applied, in order (third_party/gvisor/README.md
# says why each: files of 2 GiB and more in disk captures, a memory capture
# that reads only the pages that hold data, one checkpoint at a time,
# crashes held at their fault, an init nothing inside can stop, a checkpoint
# file opened before a restore that triggers nothing, a memory image that
# restores on another node, a host unix connection saved twice, a clone's
# process group as Linux gives it, a restore that loads pages on demand,
# the sentry's seccomp filter precompiled as bazel's build does, a first
# save that reads its pages with pread, a save that writes them from the
# memory file, and the rest the README lists: patch 18 adds a C helper,
# built here with gcc and run once before go build embeds it). Go builds
# nothing in the module cache it did not download, so the pinned module is
# copied once per version and set of patches beside the Go build cache
# (~/.cache/sbx-gvisor/VERSION-KEY, 69 MB, outside the tree; KEY covers the
# patches, $GOARCH and the C compiler's target and version), each patch is
# checked with --dry-run and applied there with no fuzz, and a go.mod in
# bin/ replaces the module with that copy. A patch that no longer applies
# (the pin moved) stops the build, saying which. Copies of other keys are
# kept: another worktree's go build may be reading one (each is 69 MB); a
# build removes only its key's leftovers of killed builds (.tmpPID,
# .oldPID whose PID is gone), never a copy or a tmp a live build writes.
RUNSC_PATCHES := $(sort $(wildcard third_party/gvisor/patches/*.patch))
$(BIN)/runsc: go.mod go.sum $(RUNSC_PATCHES) cmd/sbx-reaper/build.sh
	@echo "==> building runsc from the go.mod pin (gvisor.dev/gvisor/runsc) with third_party/gvisor's patches; about two minutes the first time"
	@set -e; command -v patch >/dev/null || { echo "runsc: the patches need patch(1): make deps installs it (apt-get install patch)"; exit 1; }; \
	$(GO) mod download gvisor.dev/gvisor; \
	dir=$$($(GO) list -m -f '{{.Dir}}' gvisor.dev/gvisor); \
	ver=$$($(GO) list -m -f '{{.Version}}' gvisor.dev/gvisor); \
	key=$$( (cat $(RUNSC_PATCHES) cmd/sbx-reaper/build.sh; echo "$$GOARCH"; $${CC:-gcc} -dumpmachine 2>/dev/null; $${CC:-gcc} -dumpfullversion 2>/dev/null) | sha256sum | cut -c1-12); \
	copy=$$(dirname "$$($(GO) env GOCACHE)")/sbx-gvisor/$$ver-$$key; \
	if [ ! -e "$$copy/.sbx-complete" ]; then \
		tmp="$$copy.tmp$$$$"; rm -rf "$$tmp"; mkdir -p "$$(dirname "$$copy")"; \
		cp -a "$$dir" "$$tmp"; chmod -R u+w "$$tmp"; \
		for p in $(RUNSC_PATCHES); do \
			if ! patch -d "$$tmp" -p1 -F0 -N --dry-run --quiet < "$$p" >/dev/null 2>&1; then \
				echo "runsc: $$p does not apply to gvisor $$ver: the pin moved; redo the patch as third_party/gvisor/README.md says:"; \
				patch -d "$$tmp" -p1 -F0 -N --dry-run < "$$p" | sed 's/^/    /' | head -20; rm -rf "$$tmp"; exit 1; \
			fi; \
			patch -d "$$tmp" -p1 -F0 -N --quiet --no-backup-if-mismatch < "$$p"; \
		done; \
		if [ -d "$$tmp/runsc/boot/filter/config/sbxprecompile" ]; then \
			echo "==> runsc: precompiling the sentry's seccomp filter for systrap (patch 11: bazel's build does, go build does not)"; \
			mkdir -p $(BIN); cp go.mod $(BIN)/.seccomp.mod; cp go.sum $(BIN)/.seccomp.sum; \
			echo "replace gvisor.dev/gvisor => $$tmp" >> $(BIN)/.seccomp.mod; \
			$(GO) run -modfile $(BIN)/.seccomp.mod gvisor.dev/gvisor/runsc/boot/filter/config/sbxprecompile "$$tmp/runsc/boot/filter/filter_precompiled.go" \
				|| { rm -rf "$$tmp"; exit 1; }; \
			rm -f $(BIN)/.seccomp.mod $(BIN)/.seccomp.sum; \
		fi; \
		um="$$tmp/runsc/cmd/sandboxsetup/sbxumount"; \
		if [ -f "$$um/umount.c" ]; then \
			echo "==> runsc: building its /proc umounter (patch 18: gcc, no libc; runsc embeds it)"; \
			cmd/sbx-reaper/build.sh "$$um/umount.bin" "$$um/umount.c" || { rm -rf "$$tmp"; exit 1; }; \
			host=$$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/'); \
			if [ -z "$$GOARCH" ] || [ "$$GOARCH" = "$$host" ]; then \
				"$$um/umount.bin" 2>/dev/null && rc=0 || rc=$$?; \
				[ $$rc = 1 ] || { echo "runsc: the /proc umounter $$um/umount.bin does not run here (exit $$rc, want its usage and 1)"; rm -rf "$$tmp"; exit 1; }; \
			fi; \
		fi; \
		touch "$$tmp/.sbx-complete"; \
		if ! mv -T "$$tmp" "$$copy" 2>/dev/null; then \
			if [ ! -e "$$copy/.sbx-complete" ]; then mv -T "$$copy" "$$copy.old$$$$" && mv -T "$$tmp" "$$copy"; fi; \
			rm -rf "$$tmp" "$$copy.old$$$$"; \
		fi; \
	fi; \
	for d in "$$copy".tmp* "$$copy".old*; do pid=$${d##*.tmp}; pid=$${pid##*.old}; \
		[ ! -e "$$d" ] || grep -qs '^State:[[:space:]]*[A-Y]' "/proc/$$pid/status" || rm -rf "$$d"; done; \
	mkdir -p $(BIN); cp go.mod $(BIN)/.runsc.mod; cp go.sum $(BIN)/.runsc.sum; \
	echo "replace gvisor.dev/gvisor => $$copy" >> $(BIN)/.runsc.mod; \
	$(GO) build -modfile $(BIN)/.runsc.mod -o $(BIN)/runsc gvisor.dev/gvisor/runsc

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }

## test: everything, against real runsc, namespaces and sbxd (as root), the
## fleet's tests against a real control plane (built once per pin by
## fleet-tools); the Python client's tests last
test: deps build fleet-tools vet
	@echo "==> running the tests (unit and integration, real runsc)"
	$(GO) test -count=1 -timeout 85m ./...
	@$(MAKE) --no-print-directory python-test

## soak-storage: issue 22's soak for 10 minutes (make test plays it for
## one): hostile sandboxes against the storage budget, sbxd's memory and
## restores; then an image layer of a million entries through sbxd
soak-storage: deps build
	@echo "==> soak: hostile sandboxes for $${SBX_SOAK:-10m} (TestSoak22)"
	SBX_SOAK=$${SBX_SOAK:-10m} $(GO) test -count=1 -timeout 60m -run '^TestSoak22$$' -v ./internal/e2e/
	@echo "==> soak: an image layer of a million entries through sbxd (TestImportFlatMemory)"
	SBX_SOAK=$${SBX_SOAK:-10m} $(GO) test -count=1 -timeout 60m -run '^TestImportFlatMemory$$' -v ./internal/e2e/

## fleet-tools: the fleet's control plane (issue 24): kube-apiserver,
## kubectl, etcd and the OCI registry, as tools/fleet pins them, built once
## per pin into a cache outside the tree (8 minutes here on 2 cores, cold);
## bin/.fleet-dir names it for scripts/fleet.sh
FLEET_KEY = $(shell cat tools/fleet/go.mod tools/fleet/go.sum | sha256sum | cut -c1-12)
fleet-tools:
	@set -e; dir=$$(dirname "$$($(GO) env GOCACHE)")/sbx-fleet/$(FLEET_KEY); mkdir -p $$dir $(BIN); \
	for p in k8s.io/kubernetes/cmd/kube-apiserver:kube-apiserver k8s.io/kubernetes/cmd/kubectl:kubectl \
		go.etcd.io/etcd/server/v3:etcd github.com/distribution/distribution/v3/cmd/registry:registry; do \
		pkg=$${p%%:*}; name=$${p##*:}; \
		if [ -x $$dir/$$name ]; then echo "==> fleet: $$name cached in $$dir"; continue; fi; \
		echo "==> fleet: building $$name ($$pkg) into $$dir; kube-apiserver takes minutes the first time"; \
		(cd tools/fleet && $(GO) build -o $$dir/$$name.tmp $$pkg) && mv $$dir/$$name.tmp $$dir/$$name; \
	done; echo $$dir > $(BIN)/.fleet-dir

## fleet-test: the fleet's tests against a real control plane and two real
## sbxd node agents (about a minute; `make test` runs them too, or skips
## them when bin/.fleet-dir is missing)
fleet-test: build fleet-tools
	$(GO) test -count=1 -timeout 10m -v -run '^TestFleet' ./internal/fleet/...

## python-deps: Debian's pytest for the system Python (once; skipped when present)
PYTHON := /usr/bin/python3
python-deps:
	@if dpkg -s python3-pytest >/dev/null 2>&1; then echo "==> Debian packages present: python3-pytest"; \
	else echo "==> installing Debian packages: python3-pytest"; \
		APT_LOCK_WAIT=$(APT_LOCK_WAIT) ./scripts/apt-install.sh python3-pytest >/dev/null; fi

## python-test: the Python client and pytest plugin (python/), against a real
## sbxd the session starts from bin/ and cleans up (as root)
python-test: python-deps build
	@echo "==> running the Python tests (python/tests, $(PYTHON) -m pytest, real sbxd)"
	cd python && $(PYTHON) -m pytest -p no:cacheprovider -q tests

## demo: start sbxd, build base, and walk through a sandbox's life
demo: deps build
	@./scripts/demo.sh

## bench: each figure beside raw runsc doing the same work
bench: deps build fleet-tools
	$(GO) test -run '^$$' -bench 'Create|Exec|MemoryFork' -benchtime 20x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'FleetCreate' -benchtime 10x -timeout 15m ./internal/fleet/e2e/
	$(GO) test -run '^$$' -bench 'CrossNodeResume' -benchtime 5x -timeout 20m ./internal/fleet/e2e/
	$(GO) test -run '^$$' -bench 'Place100' -benchtime 1x -timeout 15m ./internal/fleet/placement/
	$(GO) test -run '^$$' -bench 'Fork16|ForkShare|StopResume|Scp|PreviewProxy|SnapshotMove' -benchtime 3x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'Hunt' -benchtime 5x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'FlakeRateVsNaive' -benchtime 1x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'Explain' -benchtime 1x -timeout 30m ./internal/e2e/

## bench-quick: create (cold and from a warm pool), exec (client and CLI)
## and a memory fork 10x each, the memory 8 idle forks share (density) once,
## and a freeze 10x, each with its goal and met or MISSED (a few minutes)
bench-quick: deps build
	$(GO) test -run '^$$' -bench '^Benchmark(Create|CreateWarm|Exec|ExecCLI|ExecChannel|ExecCLIChannel|MemoryFork)$$' -benchtime 10x -timeout 15m ./internal/e2e/
	$(GO) test -run '^$$' -bench '^BenchmarkForkShare$$' -benchtime 1x -timeout 15m ./internal/e2e/
	$(GO) test -run '^$$' -bench '^BenchmarkFreeze$$' -benchtime 10x -timeout 15m ./internal/e2e/

## soak: the crash fuzz at 30 random instants of every operation (about an hour), and its table
soak: deps build
	@echo "==> crash fuzz: sbxd killed at 30 random instants of each operation, then restarted and checked"
	SBX_CRASH_OFFSETS=$${SBX_CRASH_OFFSETS:-30} SBX_CRASH_TABLE=$(CURDIR)/soak.txt $(GO) test -count=1 -run 'TestCrashFuzz' -timeout 180m ./internal/e2e/; \
		rc=$$?; cat $(CURDIR)/soak.txt 2>/dev/null; exit $$rc

clean:
	rm -rf $(BIN)
