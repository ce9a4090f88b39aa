#!/usr/bin/env bash
# test/vm/guest/bench-iser.sh — inside the VM: fio against ONE LIO RAM LUN on ONE soft-RoCE portal,
# reached three ways at once (issue 6, acceptance 5):
#   iser-blk-iser   iser-blk attach --nbd /dev/nbd0 --target iser://…  --cache off
#   iser-blk-tcp    iser-blk attach --nbd /dev/nbd1 --target iscsi://… --cache off
#   kernel-iser     open-iscsi with an iser iface (the kernel's ib_iser), /dev/sdX
# Jobs (fio, direct=1, libaio, time-based): 1 MiB sequential write QD8, 1 MiB sequential read QD8,
# 4 KiB random read QD32. Loops: repetition (outer), job, system (inner), so the systems of one
# job run back to back under the same machine load.
#
#   bench-iser.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N]
#
# Writes OUTDIR/<rep>-<job>-<system>.json (fio's JSON), OUTDIR/env.txt (guest details),
# OUTDIR/<system>.log (the iser-blk gateways' logs) and prints one line per run:
#   RUN rep=R job=J sys=S iops=… mibps=… load=…
# Needs ISERBLK_BIN (the CLI) and a guest with ~1.5 GiB (VM_MEM=2048): the LUN lives in guest RAM.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

out=${1:?usage: bench-iser.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N]}
shift
runtime=15
ramp=0
reps=3
size_mib=256
while [ $# -gt 0 ]; do
	case "$1" in
	--runtime) runtime=$2; shift 2 ;;
	--ramp) ramp=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--size-mib) size_mib=$2; shift 2 ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm
bin=${ISERBLK_BIN:?ISERBLK_BIN must name the iser-blk CLI}
mkdir -p "$out"

pids=()
kernel_portal=
kernel_iqn=
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "$kernel_portal" ]; then
		"$here/open-iscsi.sh" logout --portal "$kernel_portal" --iqn "$kernel_iqn" --transport iser >/dev/null 2>&1 || true
	fi
	"$here/lio-target.sh" --teardown >/dev/null 2>&1 || true
}
trap cleanup EXIT

eval "$("$here/modules.sh" nbd)"
eval "$("$here/rxe-up.sh")"
eval "$("$here/lio-target.sh" --backstore rd --size-mib "$size_mib")"
log "LIO RAM LUN of $size_mib MiB at $LIO_PORTAL ($LIO_IQN), rxe $RDMA_DEV"

# attach NAME DEV URL: start an iser-blk gateway with the cache off; wait for it to print DEV
attach() {
	local name=$1 dev=$2 url=$3
	"$bin" attach --nbd "$dev" --target "$url" --cache off \
		--initiator-name "iqn.2025-01.io.iser-blk:bench-$name" \
		>"$out/$name.stdout" 2>"$out/$name.log" &
	pids+=($!)
	local pid=$!
	printed() { grep -qx "$dev" "$out/$name.stdout" || { kill -0 "$pid" 2>/dev/null || die "$name: iser-blk exited: $(tail -5 "$out/$name.log")"; false; }; }
	wait_until 180 "$name to attach $dev" printed
	log "$name: $url on $dev"
}
attach iser-blk-iser /dev/nbd0 "iser://$LIO_PORTAL/$LIO_IQN/$LIO_LUN"
attach iser-blk-tcp /dev/nbd1 "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN"
kernel_portal=$LIO_PORTAL
kernel_iqn=$LIO_IQN
eval "$("$here/open-iscsi.sh" login --portal "$LIO_PORTAL" --iqn "$LIO_IQN" --transport iser --lun "$LIO_LUN")"
log "kernel-iser: $ISCSI_DEV (session $ISCSI_SID)"
declare -A devs=([iser-blk-iser]=/dev/nbd0 [iser-blk-tcp]=/dev/nbd1 [kernel-iser]=$ISCSI_DEV)
systems=(iser-blk-iser iser-blk-tcp kernel-iser)

{
	echo "date: $(date -u +%FT%TZ)"
	echo "guest kernel: $(uname -r)"
	echo "guest vCPUs: $(nproc), RAM: $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
	echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "fio: $(fio --version)"
	echo "iser-blk: $("$bin" version 2>/dev/null || echo unknown)"
	echo "LUN: LIO rd_mcp $size_mib MiB, block size $LIO_BLOCK_SIZE, portal $LIO_PORTAL (rxe on a dummy netdev)"
	echo "kernel-iser: open-iscsi $(iscsiadm --version | awk '{print $NF}'), queue_depth $(cat "/sys/block/${ISCSI_DEV#/dev/}/device/queue_depth"), max_sectors_kb $(cat "/sys/block/${ISCSI_DEV#/dev/}/queue/max_sectors_kb")"
	echo "nbd max_sectors_kb: $(cat /sys/block/nbd0/queue/max_sectors_kb) (iser), $(cat /sys/block/nbd1/queue/max_sectors_kb) (tcp)"
	echo "fio: direct=1 ioengine=libaio time_based runtime=${runtime}s ramp_time=${ramp}s, $reps repetitions"
} >"$out/env.txt"
cat "$out/env.txt" >&2

# job NAME → fio arguments
declare -A jobs=(
	[seqwrite-1m-qd8]="--rw=write --bs=1M --iodepth=8"
	[seqread-1m-qd8]="--rw=read --bs=1M --iodepth=8"
	[randread-4k-qd32]="--rw=randread --bs=4k --iodepth=32 --randrepeat=0"
)
# writes first: the reads then read data that was written (not a never-touched RAM page)
order=(seqwrite-1m-qd8 seqread-1m-qd8 randread-4k-qd32)

for rep in $(seq 1 "$reps"); do
	for job in "${order[@]}"; do
		for sys in "${systems[@]}"; do
			f=$out/$rep-$job-$sys.json
			load=$(cut -d' ' -f1 /proc/loadavg)
			# shellcheck disable=SC2086 # the job's arguments are words
			fio --name="$job" --filename="${devs[$sys]}" --direct=1 --ioengine=libaio \
				${jobs[$job]} --time_based --runtime="$runtime" --ramp_time="$ramp" \
				--output-format=json --output="$f" >/dev/null ||
				die "fio $job on $sys (${devs[$sys]}) failed"
			python3 - "$f" "$rep" "$job" "$sys" "$load" <<-'EOF'
				import json, sys
				f, rep, job, sysname, load = sys.argv[1:]
				j = json.load(open(f))["jobs"][0]
				d = j["write"] if "write" in job else j["read"]
				print(f"RUN rep={rep} job={job} sys={sysname} iops={d['iops']:.1f} "
				      f"mibps={d['bw_bytes'] / 2**20:.1f} errors={j['error']} load={load}")
			EOF
		done
	done
done
# warnings from the gateways (command timeouts, reconnects) would make their figures suspect
for sys in iser-blk-iser iser-blk-tcp; do
	kv "WARNINGS_$sys" "$(grep -ciE '"level":"(warn|error)"|\bWARN|\bERROR' "$out/$sys.log" || true)"
done
exit 0
}
