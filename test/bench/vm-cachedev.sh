#!/usr/bin/env bash
# test/bench/vm-cachedev.sh — `make bench-vm-cachedev` (and part of `make bench-vm`): issue #39's
# performance rows for --cache-dev, the persistent write-back log: --cache off, the default RAM
# write-back cache and --cache-dev side by side in ONE QEMU guest against one LIO RAM LUN over
# iSCSI/TCP with netem adding 0.5 ms each way, ublk frontend; the cache device's file system is a
# virtio disk backed by a host file in /dev/shm. Not part of `make test`: it measures, it does not
# pass or fail on figures.
#
#   test/bench/vm-cachedev.sh [--runtime S] [--ramp S] [--reps N] [--size-mib N] [--netem-ms MS]
#                             [--scale N] [--jobs commit-4k-qd1,seqwrite-1m-qd8,randread-4k-qd32,pgbench]
#
# Builds the CLI into a private directory (other work in the tree may be rebuilding bin/), runs
# test/vm/guest/bench-cachedev.sh in a guest (VM_MEM defaults to 4096 here: the LUN lives in
# guest RAM), then test/bench/vm_cachedev.py prints the goals table (medians of per-repetition
# ratios, min–max), writes summary.json and the commit-latency chart. Raw fio JSON, pgbench
# output, the gateways' logs and the table are kept in $BENCH_VM_OUT (default
# bin/bench-vm/<UTC time>-cachedev).
# The guest kernel keeps its default mitigations (VM_KERNEL_ARGS=; the test tiers turn them off).
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
cd "$root"
out=${BENCH_VM_OUT:-$root/bin/bench-vm/$(date -u +%Y%m%dT%H%M%SZ)-cachedev}
mkdir -p "$out"
out=$(cd "$out" && pwd -P)

echo "vm-cachedev: building the CLI into $out" >&2
go build -o "$out/iser-blk" ./cmd/iser-blk
{
	echo "host: $(uname -r), $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "host load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "tree: $(git describe --always --dirty 2>/dev/null || echo unknown)"
} >"$out/host.txt"

# the guest's "local SSD": a sparse host file in /dev/shm (QEMU cache=writeback: the guest's
# flushes become fdatasyncs of a tmpfs file)
disk=$(mktemp /dev/shm/iserblk-cachedev-disk.XXXXXX)
trap 'rm -f "$disk"' EXIT
truncate -s 2G "$disk"

export VM_MEM=${VM_MEM:-4096}
export VM_TIMEOUT=${VM_TIMEOUT:-3600}
export VM_RESULTS=$out
export VM_DISKS=$disk
export ISERBLK_BIN=$out/iser-blk
rc=0
VM_KERNEL_ARGS=${VM_KERNEL_ARGS-} test/vm/run.sh test/vm/guest/bench-cachedev.sh "$out/guest" "$@" | tee "$out/console.log" || rc=$?
echo "host load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/host.txt"
[ "$rc" = 0 ] || { echo "vm-cachedev: the guest run failed (status $rc); see $out/console.log" >&2; exit "$rc"; }

python3 test/bench/vm_cachedev.py "$out" | tee "$out/table.md"
echo >&2
cat "$out/host.txt" "$out/guest/env.txt" >&2
grep '^WARNINGS_' "$out/console.log" >&2 || true
echo "vm-cachedev: results in $out" >&2
exit 0
}
