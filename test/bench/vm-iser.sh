#!/usr/bin/env bash
# test/bench/vm-iser.sh — `make bench-vm`: iser-blk over iSER and over TCP (nbd, and ublk over TCP)
# vs the kernel's initiators (open-iscsi + ib_iser, open-iscsi + iscsi_tcp), side by side in ONE
# QEMU guest against one LIO RAM LUN on one soft-RoCE portal (issue 6, acceptance 5; issue 37's VM
# rows). Not part of `make test`: it measures, it does not pass or fail on figures.
#
#   test/bench/vm-iser.sh [--runtime S] [--ramp S] [--reps N] [--size-mib N]
#
# Builds the CLI into a private directory (other work in the tree may be rebuilding bin/; with
# BENCH_VM_BIN=FILE it copies that binary instead, to measure another tree's gateway with this
# tree's bench, e.g. a "before" for a change), runs
# test/vm/guest/bench-iser.sh in a guest (test/vm/run.sh; VM_MEM defaults to 3072 here because the
# LUN lives in guest RAM), then prints a Markdown table (test/bench/vm_iser.py): per job and system
# the median IOPS, MiB/s, QD1 p50 and the guest's CPU µs per I/O over the repetitions (min–max in
# brackets), and the ratios to the kernel initiator of the same transport.
# The guest kernel keeps its default mitigations (VM_KERNEL_ARGS=; the test tiers turn them off).
# Raw fio JSON, the gateways' logs and the table are kept in $BENCH_VM_OUT (default
# bin/bench-vm/<UTC time>).
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
if [ -n "${BENCH_VM_BIN:-}" ]; then # relative to where make was run, before the cd below
	BENCH_VM_BIN=$(realpath -e "$BENCH_VM_BIN") || { echo "vm-iser: BENCH_VM_BIN: no such file" >&2; exit 2; }
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
cd "$root"
out=${BENCH_VM_OUT:-$root/bin/bench-vm/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd -P)

if [ -n "${BENCH_VM_BIN:-}" ]; then
	gateway="$BENCH_VM_BIN: $("$BENCH_VM_BIN" version 2>/dev/null | head -1 || true)"
	echo "vm-iser: measuring $gateway" >&2
	cp "$BENCH_VM_BIN" "$out/iser-blk"
else
	echo "vm-iser: building the CLI into $out" >&2
	go build -o "$out/iser-blk" ./cmd/iser-blk
	gateway="built from the tree"
fi
{
	echo "host: $(uname -r), $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "host load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "tree: $(git describe --always --dirty 2>/dev/null || echo unknown)"
	echo "gateway: $gateway"
} >"$out/host.txt"

export VM_MEM=${VM_MEM:-3072}
export VM_TIMEOUT=${VM_TIMEOUT:-2400}
export VM_RESULTS=$out
export ISERBLK_BIN=$out/iser-blk
rc=0
VM_KERNEL_ARGS=${VM_KERNEL_ARGS-} test/vm/run.sh test/vm/guest/bench-iser.sh "$out/guest" "$@" | tee "$out/console.log" || rc=$?
echo "host load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/host.txt"
[ "$rc" = 0 ] || { echo "vm-iser: the guest run failed (status $rc); see $out/console.log" >&2; exit "$rc"; }

python3 "$root/test/bench/vm_iser.py" "$out" | tee "$out/table.md"
echo >&2
cat "$out/host.txt" "$out/guest/env.txt" >&2
grep '^WARNINGS_' "$out/console.log" >&2 || true
echo "vm-iser: results in $out" >&2
exit 0
}
