# sbx: `make demo` runs the main job on the embedded defaults; `make test`
# passes the tests. Both install what they need first (as root).
SHELL := /bin/bash
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
BIN := $(CURDIR)/bin
DEBS := busybox-static mmdebstrap iproute2 iptables tmux gcc jq chromium
export CGO_ENABLED := 0

.PHONY: all build deps install demo test python-deps python-test unit integration bench soak soak-storage fleet-tools fleet-test vet fmt clean

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

## build: sbx, sbxd, sbx-agent and runsc (from the go.mod pin) into bin/
build: $(BIN)/runsc
	@echo "==> building sbx, sbxd and sbx-agent into bin/"
	@$(GO) build -o $(BIN)/sbx ./cmd/sbx
	@$(GO) build -o $(BIN)/sbxd ./cmd/sbxd
	@$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/sbx-agent ./cmd/sbx-agent

## install: sbx, sbxd, sbx-agent and runsc into $(PREFIX)/bin (on PATH), so
## that `sbxd &` and `sbx ...` work from anywhere
PREFIX ?= /usr/local
install: build
	@echo "==> installing sbx, sbxd, sbx-agent and runsc into $(DESTDIR)$(PREFIX)/bin"
	@install -d $(DESTDIR)$(PREFIX)/bin
	@install -m 0755 $(BIN)/sbx $(BIN)/sbxd $(BIN)/sbx-agent $(BIN)/runsc $(DESTDIR)$(PREFIX)/bin/

# runsc is built with files of the pinned gVisor replaced by the patched
# copies in third_party/gvisor (third_party/gvisor/README.md says why: files
# of 2 GiB and more in disk snapshots, disk forks and cold-boot resumes; a
# memory capture that reads only the pages that hold data; one checkpoint
# at a time, a freeze from inside and sbxd's capture). Nothing else of
# gVisor is committed. Go refuses an -overlay of a file in the module cache,
# so the pinned module is copied once per version beside the Go build cache
# (~/.cache/sbx-gvisor/VERSION, 69 MB, outside the tree), a go.mod in bin/
# replaces the module with that copy, and -overlay swaps in the patched
# files. The build stops if a pinned file is not the one patched.
# RUNSC_PATCHES: gVisor's file, the patched copy, the pinned original.
RUNSC_PATCHES := \
	pkg/sentry/fsimpl/tmpfs/tar.go:third_party/gvisor/_tmpfs/tar.go:third_party/gvisor/tar.go.orig \
	pkg/sentry/pgalloc/save_restore.go:third_party/gvisor/_pgalloc/save_restore.go:third_party/gvisor/save_restore.go.orig \
	runsc/boot/restore.go:third_party/gvisor/_boot/restore.go:third_party/gvisor/restore.go.orig \
	pkg/sentry/kernel/task_signals.go:third_party/gvisor/_kernel/task_signals.go:third_party/gvisor/task_signals.go.orig
# RUNSC_ADDED: files sbx adds to gVisor (gVisor's path, sbx's file); the
# build stops if the pin brings a file of that name.
RUNSC_ADDED := \
	pkg/sentry/kernel/sbx_crash.go:third_party/gvisor/_kernel/sbx_crash.go \
	pkg/sentry/kernel/sbx_init.go:third_party/gvisor/_kernel/sbx_init.go
RUNSC_PATCH_FILES := $(foreach p,$(RUNSC_PATCHES),$(word 2,$(subst :, ,$(p))) $(word 3,$(subst :, ,$(p)))) \
	$(foreach p,$(RUNSC_ADDED),$(word 2,$(subst :, ,$(p))))
$(BIN)/runsc: go.mod go.sum $(RUNSC_PATCH_FILES)
	@echo "==> building runsc from the go.mod pin (gvisor.dev/gvisor/runsc) with third_party/gvisor's patches; about two minutes the first time"
	@set -e; $(GO) mod download gvisor.dev/gvisor; \
	dir=$$($(GO) list -m -f '{{.Dir}}' gvisor.dev/gvisor); \
	ver=$$($(GO) list -m -f '{{.Version}}' gvisor.dev/gvisor); \
	for p in $(RUNSC_PATCHES); do \
		IFS=: read -r file patch orig <<<"$$p"; \
		if ! cmp -s "$$dir/$$file" "$$orig"; then \
			echo "runsc: $$dir/$$file is not the file third_party/gvisor patched: the gVisor pin moved; redo the patch as third_party/gvisor/README.md says"; exit 1; \
		fi; \
	done; \
	for p in $(RUNSC_ADDED); do \
		IFS=: read -r file added <<<"$$p"; \
		if [ -e "$$dir/$$file" ]; then \
			echo "runsc: the gVisor pin has $$file, which sbx adds: the pin moved; redo the patch as third_party/gvisor/README.md says"; exit 1; \
		fi; \
	done; \
	copy=$$(dirname "$$($(GO) env GOCACHE)")/sbx-gvisor/$$ver; \
	if [ ! -e "$$copy/.sbx-complete" ]; then \
		rm -rf "$$copy" "$$copy.tmp$$$$"; mkdir -p "$$(dirname "$$copy")"; \
		cp -a "$$dir" "$$copy.tmp$$$$"; chmod -R u+w "$$copy.tmp$$$$"; touch "$$copy.tmp$$$$/.sbx-complete"; \
		mv -T "$$copy.tmp$$$$" "$$copy" 2>/dev/null || rm -rf "$$copy.tmp$$$$"; \
	fi; \
	mkdir -p $(BIN); cp go.mod $(BIN)/.runsc.mod; cp go.sum $(BIN)/.runsc.sum; \
	echo "replace gvisor.dev/gvisor => $$copy" >> $(BIN)/.runsc.mod; \
	sep=""; { printf '{"Replace":{'; for p in $(RUNSC_PATCHES); do \
		IFS=: read -r file patch orig <<<"$$p"; \
		printf '%s"%s":"%s"' "$$sep" "$$copy/$$file" "$(CURDIR)/$$patch"; sep=","; \
	done; for p in $(RUNSC_ADDED); do \
		IFS=: read -r file added <<<"$$p"; \
		printf '%s"%s":"%s"' "$$sep" "$$copy/$$file" "$(CURDIR)/$$added"; sep=","; \
	done; printf '}}\n'; } > $(BIN)/.runsc-overlay.json; \
	$(GO) build -modfile $(BIN)/.runsc.mod -overlay $(BIN)/.runsc-overlay.json -o $(BIN)/runsc gvisor.dev/gvisor/runsc

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above need formatting"; exit 1; }

## test: everything, against real runsc, namespaces and sbxd (as root); the
## Python client's tests last
test: deps build vet
	@echo "==> running the tests (unit and integration, real runsc)"
	$(GO) test -count=1 -timeout 80m ./...
	@$(MAKE) --no-print-directory python-test

## soak-storage: issue 22's soak for 10 minutes (make test plays it for
## one): hostile sandboxes against the storage budget, sbxd's memory and
## restores
soak-storage: deps build
	@echo "==> soak: hostile sandboxes for $${SBX_SOAK:-10m} (TestSoak22)"
	SBX_SOAK=$${SBX_SOAK:-10m} $(GO) test -count=1 -timeout 60m -run '^TestSoak22$$' -v ./internal/e2e/

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
bench: deps build
	$(GO) test -run '^$$' -bench 'Create|Exec|MemoryFork' -benchtime 20x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'Fork16|StopResume|Scp|PreviewProxy' -benchtime 3x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'Hunt' -benchtime 5x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'FlakeRateVsNaive' -benchtime 1x -timeout 30m ./internal/e2e/
	$(GO) test -run '^$$' -bench 'Explain' -benchtime 1x -timeout 30m ./internal/e2e/

## soak: the crash fuzz at 30 random instants of every operation (about an hour), and its table
soak: deps build
	@echo "==> crash fuzz: sbxd killed at 30 random instants of each operation, then restarted and checked"
	SBX_CRASH_OFFSETS=$${SBX_CRASH_OFFSETS:-30} SBX_CRASH_TABLE=$(CURDIR)/soak.txt $(GO) test -count=1 -run 'TestCrashFuzz' -timeout 180m ./internal/e2e/; \
		rc=$$?; cat $(CURDIR)/soak.txt 2>/dev/null; exit $$rc

clean:
	rm -rf $(BIN)
