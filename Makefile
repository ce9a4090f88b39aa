# iser-blk — the two commands that matter are `make demo` and `make test` (see README.md).
# Tiers: unit (go test, twice: as is and -cpu 1, tiers unit and unit-1cpu), py (the bench's
# Python and make test's own scripts, test/pyunit.py), fuzz (go test -fuzz, seconds
# each), e2e (root + tgtd/libnbd/fio on the host, build tag e2e), vm (QEMU guest with the 6.12
# kernel, build tag vm; mk/vm.mk), k8s (the Kubernetes manifests; mk/kubernetes.mk), bench.

SHELL     := /bin/bash
GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)
BIN       := bin/iser-blk
TALLY     := bin/test-tally
SUMMARY   := $(GO) run ./internal/testsummary
RACE      ?= -race
export ISERBLK_BIN := $(CURDIR)/$(BIN)
# The release version is kept in VERSION alone; builds stamp it, the revision and whether the tree
# was modified into internal/buildinfo (`iser-blk version`).
VERSION   := $(shell cat VERSION 2>/dev/null)
BUILDINFO := github.com/iser-blk/iser-blk/internal/buildinfo
LDFLAGS    = -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).revision=$(shell git rev-parse HEAD 2>/dev/null) \
             -X $(BUILDINFO).modified=$(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)

.PHONY: all build deps lint test test-unit test-py test-fuzz test-e2e test-vm demo bench clean tally-reset tally install

all: build

deps:
	@test/deps.sh

build:
	$(GO) build -o $(BIN) -ldflags '$(LDFLAGS)' ./cmd/iser-blk

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./...
	$(GO) vet -tags vm ./...
	$(GO) vet -tags dist ./internal/buildinfo/
	$(GO) vet -C packaging ./...
	$(GO) vet -C contrib/kubernetes ./...
	CGO_ENABLED=0 $(GO) build ./...
	staticcheck ./...
	staticcheck -tags e2e ./...
	cd packaging && staticcheck ./...
	cd contrib/kubernetes && staticcheck ./...
	@echo "lint: ok"

tally-reset:
	@mkdir -p bin && rm -f $(TALLY)

# Run alone, test-unit starts a fresh tally; under make test (IN_MAKE_TEST) it adds to lint's.
# The second pass runs every test again on one P (-cpu 1): the gateway sets GOMAXPROCS=1 on hosts
# of two CPUs or fewer, where goroutines run one at a time in the order the scheduler picks, and
# a test that assumes two run side by side passes on a CI machine and fails there. It runs without
# the race detector, which the first pass already ran over the same tests: what is given up is a
# race only the one-P schedule would reach, for 61 s instead of 158 s on a 2-core host, where
# make test has to stay under CI's hour.
test-unit: $(if $(IN_MAKE_TEST),,tally-reset)
	@set -o pipefail; rc=0; \
	$(GO) test $(RACE) -count=1 -json ./... | $(SUMMARY) -tier unit -tally $(TALLY) || rc=1; \
	$(GO) test -count=1 -cpu 1 -json ./... | $(SUMMARY) -tier unit-1cpu -tally $(TALLY) || rc=1; \
	exit $$rc

# test-py: the unit tests of the bench's Python (statistics, verdicts, /proc readers).
test-py:
	@mkdir -p bin && python3 test/pyunit.py --tally $(TALLY)

test-fuzz:
	@TALLY=$(CURDIR)/$(TALLY) test/fuzz.sh

# test-e2e runs the e2e-tagged tests only (test/e2e.sh): the unit tests of the same packages are
# the unit tier's, and running them a third time under -race cost make test minutes.
test-e2e: build
	@set -o pipefail; GO=$(GO) test/e2e.sh $(RACE) -json | $(SUMMARY) -tier e2e -tally $(TALLY)

# test-vm is defined in mk/vm.mk; dist, test-dist and test-rules in mk/release.mk; deb in
# mk/deb.mk; man and completions in mk/cli.mk; test-k8s in mk/kubernetes.mk.
-include mk/*.mk

# tally: every tier appends "tier P F S" to $(TALLY), and "FAILED tier what" per failure. The
# failures are recapped above the total line (the first 12): a CI log is often read from its tail.
tally:
	@awk '$$1 == "FAILED" { if (++n <= 12) print "FAILED: " substr($$0, 8, 240); next } \
		{ p += $$2; f += $$3; s += $$4 } \
		END { if (n > 12) printf "FAILED: ... and %d more (see each tier above)\n", n - 12; \
		      printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' $(TALLY)

# make test: set up everything on a fresh Debian 12 machine, then every tier. Each tier runs even
# when an earlier one failed, so one run shows everything; the exit status is non-zero if any failed.
# lint and build count as one check each.
test: deps tally-reset
	@rc=0; \
	for c in lint build; do \
		if $(MAKE) --no-print-directory $$c IN_MAKE_TEST=1; then echo "$$c 1 0 0" >>$(TALLY); \
		else rc=1; printf '%s 0 1 0\nFAILED %s make %s (see its output above)\n' $$c $$c $$c >>$(TALLY); fi; \
	done; \
	$(MAKE) --no-print-directory test-unit IN_MAKE_TEST=1 || rc=1; \
	$(MAKE) --no-print-directory test-py || rc=1; \
	$(MAKE) --no-print-directory test-fuzz || rc=1; \
	$(MAKE) --no-print-directory test-e2e || rc=1; \
	$(MAKE) --no-print-directory test-vm || rc=1; \
	$(MAKE) --no-print-directory test-rules || rc=1; \
	$(MAKE) --no-print-directory test-k8s || rc=1; \
	$(MAKE) --no-print-directory test-dist || rc=1; \
	$(MAKE) --no-print-directory tally; \
	exit $$rc

demo: deps build
	@test/demo.sh

bench: deps build
	@test/bench/run.sh

# install: the binary, the systemd template unit and its stop helper, the udev rule that names
# the devices (contrib/udev; the paths in all three follow PREFIX), a modules-load.d entry that
# loads nbd at boot, the man pages (section 8, gzipped) and the bash, zsh and fish completions
# (both generated by the binary), an example gateway configuration and the docs. DESTDIR stages
# a package root (make deb stages its own with PREFIX=/usr and Debian's directories).
# uninstall removes exactly those files (a NAME.conf of yours, and the generated
# /etc/iser-blk/initiatorname, stay). Nothing is written into the tree: the VM tier runs
# `make -o build install` from the read-only tree in a guest.
PREFIX         ?= /usr/local
SYSTEMDDIR     ?= /etc/systemd/system
DOCDIR         ?= $(PREFIX)/share/doc/iser-blk
LIBEXECDIR     ?= $(PREFIX)/libexec/iser-blk
MANDIR         ?= $(PREFIX)/share/man
BASHCOMPDIR    ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR     ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR    ?= $(PREFIX)/share/fish/vendor_completions.d
UDEVRULESDIR   ?= /etc/udev/rules.d
MODULESLOADDIR ?= /etc/modules-load.d
UDEV_RULES     := $(wildcard contrib/udev/*.rules)
DOCS           := README.md CHANGELOG.md LICENSE $(wildcard docs/*.md)
UNITPATHS      := sed -e 's|/usr/local/bin/iser-blk|$(PREFIX)/bin/iser-blk|g' -e 's|/usr/local/libexec/iser-blk|$(LIBEXECDIR)|g'

install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/iser-blk
	install -d -m 0755 $(DESTDIR)$(SYSTEMDDIR) $(DESTDIR)$(LIBEXECDIR)
	$(UNITPATHS) contrib/systemd/iser-blk@.service > $(DESTDIR)$(SYSTEMDDIR)/iser-blk@.service
	chmod 0644 $(DESTDIR)$(SYSTEMDDIR)/iser-blk@.service
	$(UNITPATHS) contrib/systemd/iser-blk-unit-stop > $(DESTDIR)$(LIBEXECDIR)/iser-blk-unit-stop
	chmod 0755 $(DESTDIR)$(LIBEXECDIR)/iser-blk-unit-stop
	install -d -m 0755 $(DESTDIR)$(MODULESLOADDIR)
	install -m 0644 contrib/modules-load/iser-blk.conf $(DESTDIR)$(MODULESLOADDIR)/iser-blk.conf
	$(if $(UDEV_RULES),install -d -m 0755 $(DESTDIR)$(UDEVRULESDIR))
	$(foreach r,$(UDEV_RULES),$(UNITPATHS) $(r) > $(DESTDIR)$(UDEVRULESDIR)/$(notdir $(r)) && chmod 0644 $(DESTDIR)$(UDEVRULESDIR)/$(notdir $(r));)
	install -d -m 0755 $(DESTDIR)$(MANDIR)/man8
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN) gen-man "$$tmp"; \
	for f in "$$tmp"/*.8; do gzip -9n <"$$f" >"$(DESTDIR)$(MANDIR)/man8/$${f##*/}.gz"; chmod 0644 "$(DESTDIR)$(MANDIR)/man8/$${f##*/}.gz"; done; \
	echo "installed $$(ls "$$tmp" | wc -l) man pages in $(DESTDIR)$(MANDIR)/man8"
	install -d -m 0755 $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR)
	$(BIN) completion bash > $(DESTDIR)$(BASHCOMPDIR)/iser-blk
	$(BIN) completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_iser-blk
	$(BIN) completion fish > $(DESTDIR)$(FISHCOMPDIR)/iser-blk.fish
	chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/iser-blk $(DESTDIR)$(ZSHCOMPDIR)/_iser-blk $(DESTDIR)$(FISHCOMPDIR)/iser-blk.fish
	install -d -m 0700 $(DESTDIR)/etc/iser-blk
	install -m 0600 contrib/systemd/iser-blk.conf.example $(DESTDIR)/etc/iser-blk/example.conf.sample
	install -d -m 0755 $(DESTDIR)$(DOCDIR)
	install -m 0644 $(DOCS) $(DESTDIR)$(DOCDIR)/

.PHONY: uninstall
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/iser-blk $(DESTDIR)$(SYSTEMDDIR)/iser-blk@.service \
		$(DESTDIR)$(LIBEXECDIR)/iser-blk-unit-stop $(DESTDIR)/etc/iser-blk/example.conf.sample \
		$(DESTDIR)$(MODULESLOADDIR)/iser-blk.conf $(addprefix $(DESTDIR)$(UDEVRULESDIR)/,$(notdir $(UDEV_RULES))) \
		$(DESTDIR)$(MANDIR)/man8/iser-blk.8.gz $(DESTDIR)$(MANDIR)/man8/iser-blk-*.8.gz \
		$(DESTDIR)$(BASHCOMPDIR)/iser-blk $(DESTDIR)$(ZSHCOMPDIR)/_iser-blk $(DESTDIR)$(FISHCOMPDIR)/iser-blk.fish \
		$(addprefix $(DESTDIR)$(DOCDIR)/,$(notdir $(DOCS)))
	-rmdir $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)/etc/iser-blk 2>/dev/null

clean:
	rm -rf bin
