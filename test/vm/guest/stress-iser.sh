#!/usr/bin/env bash
# test/vm/guest/stress-iser.sh — inside the VM: hunt for lost responses over iSER. Attaches an LIO
# RAM LUN over iSER with `iser-blk attach --nbd` (short --command-timeout, so a response that never
# arrives shows as a warning within seconds instead of a slow recovery), runs fio randrw with mixed
# 4 KiB–1 MiB requests at a high queue depth, RUNS times (the Go test TestStressNoLostResponse
# verifies data), and counts the
# gateway's warnings. Prints the soft-RoCE device counters (RNR NAKs, retries, sequence errors)
# before and after, and a goroutine dump of the gateway when something went wrong.
#
#   stress-iser.sh OUTDIR [--runs N] [--runtime S] [--iodepth N] [--rw MODE] [--bs RANGE]
#                         [--size-mib N] [--cache MODE] [--timeout DUR] [--ublk] [--canary]
#                         [-- EXTRA-ATTACH-FLAGS...]
# --canary also logs Linux's own iSER initiator (open-iscsi) in to the same target and leaves it
# idle: it pings the target every 5 s, and a "ping timeout" in the kernel log at the time of a
# gateway warning says the target or soft-RoCE stalled for everyone, not just for iser-blk.
# Defaults: 4 runs of 30 s, fio --rw=randrw --bsrange=4k-1m --iodepth=64, 256 MiB LUN, --cache off,
# --command-timeout 5s, nbd.
#
# Prints one line per run: RUN n=… ios=… mib=… errors=… warnings=… and at the end
# STRESS_IOS, STRESS_WARNINGS, STRESS_FIO_ERRORS as KEY=VALUE lines. Exit 1 when a fio run failed
# or the gateway logged a warning. Needs ISERBLK_BIN.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

out=${1:?usage: stress-iser.sh OUTDIR [options]}
shift
runs=4
runtime=30
iodepth=64
rw=randrw
bs=4k-1m
size_mib=256
cache=off
cmd_timeout=5s
ublk=0
canary=0
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--iodepth) iodepth=$2; shift 2 ;;
	--rw) rw=$2; shift 2 ;;
	--bs) bs=$2; shift 2 ;;
	--size-mib) size_mib=$2; shift 2 ;;
	--cache) cache=$2; shift 2 ;;
	--timeout) cmd_timeout=$2; shift 2 ;;
	--ublk) ublk=1; shift ;;
	--canary) canary=1; shift ;;
	--) shift; extra=("$@"); break ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm
bin=${ISERBLK_BIN:?ISERBLK_BIN must name the iser-blk CLI}
mkdir -p "$out"

pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [ "$canary" = 1 ]; then
		"$here/open-iscsi.sh" logout --portal "$LIO_PORTAL" --iqn "$LIO_IQN" --transport iser >/dev/null 2>&1 || true
	fi
	"$here/lio-target.sh" --teardown >/dev/null 2>&1 || true
}
trap cleanup EXIT

if [ $ublk = 1 ]; then
	"$here/modules.sh" ublk >/dev/null
else
	"$here/modules.sh" nbd >/dev/null
fi
eval "$("$here/rxe-up.sh")"
eval "$("$here/lio-target.sh" --backstore rd --size-mib "$size_mib")"
url="iser://$LIO_PORTAL/$LIO_IQN/$LIO_LUN"
if [ $canary = 1 ]; then
	eval "$("$here/open-iscsi.sh" login --portal "$LIO_PORTAL" --iqn "$LIO_IQN" --transport iser --lun "$LIO_LUN")"
	log "canary: the kernel's iSER initiator holds $ISCSI_DEV (idle, pinging every 5 s)"
fi

counters() {
	local d=/sys/class/infiniband/$RDMA_DEV/ports/1/hw_counters
	[ -d "$d" ] || return 0
	for f in "$d"/*; do printf '%s=%s ' "$(basename "$f")" "$(cat "$f")"; done
	echo
}
echo "rxe counters before: $(counters)"

if [ $ublk = 1 ]; then
	dev_args=(--ublk)
else
	dev_args=(--nbd /dev/nbd0)
fi
ISERBLK_LOG_JSON=0 "$bin" attach "${dev_args[@]}" --target "$url" --cache "$cache" \
	--command-timeout "$cmd_timeout" --initiator-name iqn.2025-01.io.iser-blk:stress "${extra[@]}" \
	>"$out/attach.stdout" 2>"$out/attach.log" &
pid=$!
printed() { [ -s "$out/attach.stdout" ] || { kill -0 "$pid" 2>/dev/null || die "iser-blk exited: $(tail -5 "$out/attach.log")"; false; }; }
wait_until 180 "the device" printed
dev=$(head -1 "$out/attach.stdout")
log "$url attached as $dev (cache $cache, command timeout $cmd_timeout)"

total_ios=0
fio_errors=0
for n in $(seq 1 "$runs"); do
	f=$out/fio-$n.json
	rc=0
	fio --name=stress --filename="$dev" --direct=1 --ioengine=libaio --rw="$rw" --bsrange="$bs" \
		--iodepth="$iodepth" --size="$((size_mib * 3 / 4))m" --time_based --runtime="$runtime" \
		--randrepeat=0 \
		--output-format=json --output="$f" >/dev/null 2>"$out/fio-$n.err" || rc=$?
	# (no process substitution: the guest has no /dev/fd)
	res=$(python3 - "$f" <<-'EOF'
		import json, sys
		try:
		    j = json.load(open(sys.argv[1]))["jobs"][0]
		    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
		    b = j["read"]["io_bytes"] + j["write"]["io_bytes"]
		    print(ios, round(b / 2**20), j["error"])
		except Exception:
		    print(0, 0, -1)
	EOF
	)
	read -r ios mib errs <<<"$res"
	[ "$rc" = 0 ] && [ "$errs" = 0 ] || fio_errors=$((fio_errors + 1))
	warns=$(grep -cE $'\t(WARN|ERROR)\t' "$out/attach.log" || true)
	total_ios=$((total_ios + ios))
	echo "RUN n=$n ios=$ios mib=$mib fio_rc=$rc errors=$errs warnings_so_far=$warns"
	echo "    rxe: $(counters)"
	[ "$rc" = 0 ] || sed 's/^/    fio: /' "$out/fio-$n.err" | tail -5
done
echo "rxe counters after: $(counters)"
warns=$(grep -cE $'\t(WARN|ERROR)\t' "$out/attach.log" || true)
if [ "$warns" != 0 ] || [ "$fio_errors" != 0 ]; then
	echo "queue pairs now:"
	rdma res show qp 2>&1 | sed 's/^/    /'
	echo "gateway warnings:"
	grep -E $'\t(WARN|ERROR)\t' "$out/attach.log" | head -40 | sed 's/^/    /'
	# where was everything? (Go prints every goroutine on SIGQUIT and exits)
	kill -QUIT "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	pid=
	echo "goroutine dump in $out/attach.log"
fi
if [ $canary = 1 ]; then
	kv STRESS_CANARY_PING_TIMEOUTS "$(dmesg | grep -c 'ping timeout' || true)"
	dmesg | grep -E 'ping timeout|conn error' | sed 's/^/    kernel: /' || true
fi
kv STRESS_IOS "$total_ios"
kv STRESS_WARNINGS "$warns"
kv STRESS_FIO_ERRORS "$fio_errors"
[ "$warns" = 0 ] && [ "$fio_errors" = 0 ]
}
