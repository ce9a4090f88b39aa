# mk/vm.mk — the VM tier (test/vm): real kernel nbd, ublk, soft-RoCE and LIO/tgt iSER paths in a
# QEMU (TCG) guest booting Debian's 6.12 kernel on this host's userland. Included by the top-level
# Makefile; it also works alone: `make -f mk/vm.mk test-vm`. Needs root (apt-get, QEMU's 9p export
# of /); test/vm/run.sh installs the packages it needs. See docs/testing-vm.md.
#
#   make test-vm                    self-test of the runner, smoke suite, all vm-tagged Go tests,
#                                   the systemd unit's tests and the .deb's (TestDeb: dpkg -i, -r, -P) in a
#                                   guest with systemd as PID 1
#   make vm-systemd [VM_RUN=TestKill9]   only the systemd unit's tests (test/vm/systemd)
#   make vm-powercut                only the power cut under a cache device (test/vm/powercut.sh)
#   make vm-smoke                   only the smoke suite (one guest boot)
#   make vm-go-test [VM_PKG=./frontend/nbd] [VM_RUN=TestKernelAttach]   vm-tagged Go tests
#   make vm-run VM_CMD='dmesg | tail' [VM_INIT=systemd]                  any command in a guest
#   make bench-vm [BENCH_VM_ARGS='--reps 3 --runtime 15']   both benches below, one after the other
#                                   (never part of make test)
#   make bench-vm-iser              fio: iser-blk over iSER and over TCP vs the kernel's iSER
#                                   initiator, one LIO LUN (test/bench/vm-iser.sh)
#   make bench-vm-cachedev [BENCH_VM_CACHEDEV_ARGS=...]   issue #39's --cache-dev rows: cache off,
#                                   RAM write-back, --cache-dev over netem (test/bench/vm-cachedev.sh)

VM_DIR := test/vm
VM_PKG ?=
VM_RUN ?=
VM_CMD ?= uname -a
VM_INIT ?= bash

.PHONY: test-vm vm-smoke vm-selftest vm-go-test vm-systemd vm-powercut vm-run bench-vm bench-vm-iser bench-vm-cachedev

# TALLY (set by the top-level Makefile) collects the counts for `make test`'s total line.
test-vm:
	@$(if $(TALLY),mkdir -p $(dir $(TALLY)) && TALLY=$(abspath $(TALLY))) $(VM_DIR)/test-vm.sh

vm-smoke:
	@$(VM_DIR)/run.sh $(VM_DIR)/smoke.sh

vm-selftest:
	@$(VM_DIR)/selftest.sh

# build first: the Makefile exports ISERBLK_BIN=$(BIN), which gotest.sh uses as it is, so a
# binary older than the tree would be what the tests run
vm-go-test: build
	@$(VM_DIR)/run.sh go-test $(VM_PKG) $(if $(VM_RUN),-run '$(VM_RUN)') -v

vm-systemd: build
	@VM_INIT=systemd $(VM_DIR)/run.sh go-test ./test/vm/systemd $(if $(VM_RUN),-run '$(VM_RUN)') -v

vm-powercut: build
	@$(VM_DIR)/powercut.sh

vm-run:
	@VM_INIT=$(VM_INIT) $(VM_DIR)/run.sh bash -c '$(VM_CMD)'

# bench-vm measures, it does not test: each bench builds its own copy of the CLI. BENCH_VM_ARGS
# (--reps, --runtime, --ramp, --size-mib) goes to both unless BENCH_VM_CACHEDEV_ARGS is given.
BENCH_VM_ARGS ?=
BENCH_VM_CACHEDEV_ARGS ?= $(BENCH_VM_ARGS)
# one after the other even under make -j: two benches at once would measure each other
bench-vm:
	@test/bench/vm-iser.sh $(BENCH_VM_ARGS)
	@test/bench/vm-cachedev.sh $(BENCH_VM_CACHEDEV_ARGS)

bench-vm-iser:
	@test/bench/vm-iser.sh $(BENCH_VM_ARGS)

bench-vm-cachedev:
	@test/bench/vm-cachedev.sh $(BENCH_VM_CACHEDEV_ARGS)
