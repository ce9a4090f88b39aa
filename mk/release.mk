# mk/release.mk — what a release ships, and its checks (issue 36). Included by the top-level
# Makefile, whose VERSION, LDFLAGS, GO, SUMMARY and TALLY it uses.
#
#   make dist         dist/iser-blk-VERSION-linux-amd64-static (CGO_ENABLED=0: no RDMA, no shared
#                     libraries; iser:// exits 2) and -rdma (cgo: links libibverbs and librdmacm),
#                     and dist/SHA256SUMS. Built on linux/amd64 (the rdma build needs its cgo
#                     toolchain and rdma-core's headers: test/deps.txt).
#   make test-dist    make dist and make deb (mk/deb.mk) into bin/dist-test, then internal/buildinfo's
#                     dist-tagged tests: linkage, version --json of each, the static build refusing
#                     iser://; the .deb's files and modes (dpkg-deb), its unit's paths, Depends
#                     against dpkg-shlibdeps, no lintian error (tier dist)
#   make test-rules   promtool check/test rules on contrib/prometheus (tier rules; test/promrules.sh)

DIST      ?= dist
DIST_NAME  = iser-blk-$(VERSION)-linux-amd64
DIST_TEST := bin/dist-test

.PHONY: dist test-dist test-rules

dist:
	@test -n "$(VERSION)" || { echo "dist: the VERSION file is missing or empty" >&2; exit 1; }
	@mkdir -p $(DIST) && rm -f $(DIST)/iser-blk-*-linux-amd64-static $(DIST)/iser-blk-*-linux-amd64-rdma $(DIST)/SHA256SUMS
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -o $(DIST)/$(DIST_NAME)-static -trimpath -ldflags '$(LDFLAGS)' ./cmd/iser-blk
	CGO_ENABLED=1 GOOS=linux GOARCH=amd64 $(GO) build -o $(DIST)/$(DIST_NAME)-rdma -trimpath -ldflags '$(LDFLAGS)' ./cmd/iser-blk
	cd $(DIST) && sha256sum $(DIST_NAME)-static $(DIST_NAME)-rdma >SHA256SUMS

# A failed make dist or make deb counts as one failure of the tier (its tests need the files).
test-dist:
	@set -o pipefail; mkdir -p bin; \
	if $(MAKE) --no-print-directory dist deb DIST=$(DIST_TEST); then \
		ISERBLK_DIST=$(CURDIR)/$(DIST_TEST) $(GO) test -count=1 -tags dist -run '^TestDist' -json ./internal/buildinfo/ | $(SUMMARY) -tier dist -tally $(TALLY); \
	else printf 'dist 0 1 0\nFAILED dist make dist deb (see its output above)\n' >>$(TALLY); exit 1; fi

test-rules:
	@mkdir -p bin && TALLY=$(abspath $(TALLY)) test/promrules.sh
