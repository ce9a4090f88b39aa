# mk/deb.mk — the Debian package (issue 36). Included by the top-level Makefile, whose VERSION,
# LDFLAGS, GO and install recipe it uses; DIST is mk/release.mk's.
#
#   make deb    dist/iser-blk_VERSION_amd64.deb: the cgo (RDMA) binary at /usr/bin/iser-blk, the
#               unit at /usr/lib/systemd/system (its stop helper in /usr/lib/iser-blk), the udev
#               rule in /usr/lib/udev/rules.d, /usr/lib/modules-load.d/iser-blk.conf (nbd), man
#               pages, bash/zsh/fish completions, docs and copyright in /usr/share/doc/iser-blk,
#               /etc/iser-blk (0700) with example.conf.sample (0600, a conffile); maintainer
#               scripts in packaging/debian. Never the static binary (that is make dist's).
#
# The files are what `make install` stages under PREFIX=/usr with Debian's directories, so the
# package and make install cannot drift; packaging/mkdeb (its own Go module: nFPM v2 as a
# library, pinned in packaging/go.mod) turns the staged root into the package. Every time in it
# is the commit's (SOURCE_DATE_EPOCH), so two builds of one commit are the same bytes.
# Its checks: make test-dist (dpkg-deb's view, lintian, Depends against dpkg-shlibdeps) and the
# VM tier's TestDeb (dpkg -i, --version, modes, systemd sees the unit, dpkg -r and -P leave
# nothing behind).

DEB_NAME           = iser-blk_$(VERSION)_amd64.deb
DEB_ROOT          := bin/deb-root
DEB_BIN           := bin/deb-build/iser-blk
MKDEB             := bin/mkdeb
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
DEB_DIRS          := PREFIX=/usr SYSTEMDDIR=/usr/lib/systemd/system LIBEXECDIR=/usr/lib/iser-blk \
                     UDEVRULESDIR=/usr/lib/udev/rules.d MODULESLOADDIR=/usr/lib/modules-load.d \
                     ZSHCOMPDIR=/usr/share/zsh/vendor-completions

.PHONY: deb

deb:
	@test -n "$(VERSION)" || { echo "deb: the VERSION file is missing or empty" >&2; exit 1; }
	@test -n "$(SOURCE_DATE_EPOCH)" || { echo "deb: no commit time: set SOURCE_DATE_EPOCH" >&2; exit 1; }
	@mkdir -p $(DIST) $(dir $(DEB_BIN)) && rm -rf $(DEB_ROOT) $(DIST)/iser-blk_*_amd64.deb
	CGO_ENABLED=1 GOOS=linux GOARCH=amd64 $(GO) build -o $(DEB_BIN) -trimpath -buildmode=pie -ldflags '-s $(LDFLAGS)' ./cmd/iser-blk
	$(GO) build -C packaging -o $(abspath $(MKDEB)) ./mkdeb
	umask 022 && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(MAKE) --no-print-directory -o build install \
		BIN=$(DEB_BIN) DESTDIR=$(abspath $(DEB_ROOT)) $(DEB_DIRS) >/dev/null
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(MKDEB) -config packaging/nfpm.yaml -root $(DEB_ROOT) \
		-version $(VERSION) -o $(DIST)/$(DEB_NAME)
	@echo "deb: $(DIST)/$(DEB_NAME)"
