#!/usr/bin/env bash
# test/bench/vm-iser.sh — `make bench-vm`: iser-blk over iSER vs iser-blk over TCP vs the kernel's
# iSER initiator (open-iscsi + ib_iser), side by side in ONE QEMU guest against one LIO RAM LUN on
# one soft-RoCE portal (issue 6, acceptance 5). Not part of `make test`: it measures, it does not
# pass or fail on figures.
#
#   test/bench/vm-iser.sh [--runtime S] [--ramp S] [--reps N] [--size-mib N]
#
# Builds the CLI into a private directory (other work in the tree may be rebuilding bin/), runs
# test/vm/guest/bench-iser.sh in a guest (test/vm/run.sh; VM_MEM defaults to 2048 here because the
# LUN lives in guest RAM), then prints a Markdown table: per job and system the median IOPS and
# MiB/s over the repetitions (min–max in brackets) and the ratio of the medians to kernel-iser.
# Raw fio JSON, the gateways' logs and the table are kept in $BENCH_VM_OUT (default
# bin/bench-vm/<UTC time>).
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
cd "$root"
out=${BENCH_VM_OUT:-$root/bin/bench-vm/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd -P)

echo "vm-iser: building the CLI into $out" >&2
go build -o "$out/iser-blk" ./cmd/iser-blk
{
	echo "host: $(uname -r), $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "host load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "tree: $(git describe --always --dirty 2>/dev/null || echo unknown)"
} >"$out/host.txt"

export VM_MEM=${VM_MEM:-2048}
export VM_TIMEOUT=${VM_TIMEOUT:-2400}
export VM_RESULTS=$out
export ISERBLK_BIN=$out/iser-blk
rc=0
test/vm/run.sh test/vm/guest/bench-iser.sh "$out/guest" "$@" | tee "$out/console.log" || rc=$?
echo "host load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/host.txt"
[ "$rc" = 0 ] || { echo "vm-iser: the guest run failed (status $rc); see $out/console.log" >&2; exit "$rc"; }

python3 - "$out" <<'EOF' | tee "$out/table.md"
import glob, json, os, re, statistics, sys

out = sys.argv[1]
runs = {}  # (job, system) -> [(iops, MiB/s)]
for f in sorted(glob.glob(os.path.join(out, "guest", "*.json"))):
    m = re.match(r"(\d+)-(.+)-(iser-blk-iser|iser-blk-tcp|kernel-iser)\.json$", os.path.basename(f))
    if not m:
        continue
    _, job, system = m.groups()
    j = json.load(open(f))["jobs"][0]
    d = j["write"] if "write" in job else j["read"]
    runs.setdefault((job, system), []).append((d["iops"], d["bw_bytes"] / 2**20))

jobs = ["seqwrite-1m-qd8", "seqread-1m-qd8", "randread-4k-qd32"]
systems = ["iser-blk-iser", "iser-blk-tcp", "kernel-iser"]
reps = max((len(v) for v in runs.values()), default=0)
print(f"| job | system | IOPS median [min–max] | MiB/s median [min–max] | vs kernel-iser |")
print("| --- | --- | --- | --- | --- |")
for job in jobs:
    # the ratio is of the median MiB/s (at a fixed block size the same as of IOPS)
    ref = runs.get((job, "kernel-iser"))
    ref_mib = statistics.median(r[1] for r in ref) if ref else None
    for s in systems:
        v = runs.get((job, s))
        if not v:
            print(f"| {job} | {s} | – | – | – |")
            continue
        iops = [r[0] for r in v]
        mib = [r[1] for r in v]
        ratio = f"{statistics.median(mib) / ref_mib:.2f}×" if ref_mib else "–"
        print(f"| {job} | {s} | {statistics.median(iops):.1f} [{min(iops):.1f}–{max(iops):.1f}] | "
              f"{statistics.median(mib):.1f} [{min(mib):.1f}–{max(mib):.1f}] | {ratio} |")
print()
print(f"{reps} repetition(s) per cell.")
EOF
echo >&2
cat "$out/host.txt" "$out/guest/env.txt" >&2
grep '^WARNINGS_' "$out/console.log" >&2 || true
echo "vm-iser: results in $out" >&2
exit 0
}
