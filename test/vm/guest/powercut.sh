#!/usr/bin/env bash
# test/vm/guest/powercut.sh — inside the VM: the two boots of the power-cut test (test/vm/powercut.sh
# runs them and kills the first one's QEMU).
#
#   powercut.sh write     boot 1: ext4 on disk1 holds the cache files; per frontend an LIO iblock
#                         LUN on its own disk, a gateway with --cache-dev on that ext4, ext4 on its
#                         device, and powercut-fs.py writing and fsyncing until the VM is killed;
#                         each log's written-back and dirty bytes in $R/log-FE (status --json)
#   powercut.sh verify    boot 2, the same disks: the same LIO LUNs, the same attach commands;
#                         each must recover its log, serve not fenced, fsck clean, hold every
#                         durable record, and after a detach the target alone (--cache off) must
#                         hold the same bytes. One "powercut: PASS FE ..." or "powercut: FAIL FE:
#                         why" line per frontend; exit 1 if any failed.
#
# Environment: POWERCUT_FRONTENDS (default "ublk nbd"): frontend k uses disk k+1, LIO port 3259+k;
# ISERBLK_BIN, the CLI; ISERBLK_VM_RESULTS, the host directory (9p) for the progress records and
# the gateways' logs. Disks: /dev/disk/by-id/virtio-iserblk-diskN (test/vm/run.sh VM_DISKS).
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
. "$here/lib.sh"
require_vm
phase=${1:-}
case "$phase" in write | verify) ;; *) die "usage: powercut.sh write|verify" ;; esac
[ -x "${ISERBLK_BIN:-}" ] || die "ISERBLK_BIN is not set or not executable"
R=${ISERBLK_VM_RESULTS:?}
read -r -a fes <<<"${POWERCUT_FRONTENDS:-ublk nbd}"
disk() { echo "/dev/disk/by-id/virtio-iserblk-disk$1"; }
cachefs=/mnt/pc-cache
rundir=/run/iserblk-powercut # tmpfs: gone with the power, as /run is on a real host

fe_args() { # FE: the frontend's own attach flags
	case "$1" in
	ublk) echo --ublk --queues 2 --depth 64 ;;
	nbd) echo --nbd /dev/nbd6 --connections 2 ;;
	*) die "unknown frontend $1" ;;
	esac
}

# --- common to both boots: the cache file system, modules, one LIO LUN per frontend --------------
"$here/modules.sh" lio "${fes[@]}" >/dev/null
mkdir -p "$cachefs" "$rundir"
if [ "$phase" = write ]; then mkfs.ext4 -q -F "$(disk 1)"; fi
mount "$(disk 1)" "$cachefs" # in boot 2 this replays its journal: what the guest synced is there
declare -A target
k=0
for fe in "${fes[@]}"; do
	k=$((k + 1))
	iqn=iqn.2003-01.org.linux-iscsi.iserblk-vm:powercut-$fe
	kvs=$("$here/lio-target.sh" --iqn "$iqn" --backstore block --file "$(readlink -f "$(disk $((k + 1)))")" \
		--no-iser --port $((3259 + k)))
	target[$fe]=iscsi://$(sed -n 's/^LIO_PORTAL=//p' <<<"$kvs")/$iqn/0
done

attach_args() { # FE: the one attach command of both boots
	# shellcheck disable=SC2046 # fe_args is a list of words
	echo --target "${target[$1]}" $(fe_args "$1") --name "pc-$1" --run-dir "$rundir" \
		--cache writeback --cache-size 64MiB --cache-dev "$cachefs/pc-$1.cache" --cache-dev-size 96MiB
}

# start_gw TAG ARGS...: start `attach ARGS` with its output in $R/gw-TAG.{out,log}; sets gw_pid and
# gw_dev once it announced its device (within 2 minutes)
start_gw() {
	local tag=$1
	shift
	"$ISERBLK_BIN" attach "$@" >"$R/gw-$tag.out" 2>"$R/gw-$tag.log" &
	gw_pid=$!
	announced() { grep -q '^/dev/' "$R/gw-$tag.out" || ! kill -0 $gw_pid 2>/dev/null; }
	wait_until 120 "the gateway's device ($tag)" announced || return 1
	gw_dev=$(head -1 "$R/gw-$tag.out")
	case "$gw_dev" in /dev/*) ;; *) log "gateway $tag exited before announcing a device: $(tail -5 "$R/gw-$tag.log")"; return 1 ;; esac
}

if [ "$phase" = write ]; then
	pids=()
	for fe in "${fes[@]}"; do
		# shellcheck disable=SC2046
		start_gw "$fe-1" $(attach_args "$fe") || die "$fe: attach failed"
		mkfs.ext4 -q -F "$gw_dev"
		mkdir -p "/mnt/pc-$fe"
		mount "$gw_dev" "/mnt/pc-$fe"
		python3 "$here/powercut-fs.py" write "/mnt/pc-$fe/data" "$R/progress-$fe" &
		pids+=($!)
		log "$fe: $gw_dev on ext4, writing (progress in $R/progress-$fe)"
	done
	# the log's state for the host, which cuts the power only once each log has written data back
	# (the checkpoint moved: recovery starts mid-ring) and holds data the target does not have
	(
		while :; do
			for fe in "${fes[@]}"; do
				"$ISERBLK_BIN" status "pc-$fe" --run-dir "$rundir" --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)["cache"]["device"]
print(d["written_back_bytes"], d["dirty_bytes"])' >"$R/log-$fe.tmp" && mv "$R/log-$fe.tmp" "$R/log-$fe"
			done
			sleep 0.5 # a sampling period, not a synchronisation
		done
	) &
	echo "powercut: writing; the host cuts the power"
	# the workloads run until the VM dies; one that ends first failed
	wait -n "${pids[@]}" || true
	die "a workload ended before the power cut: $(tail -3 "$R"/gw-*-1.log)"
fi

# --- boot 2: verify --------------------------------------------------------------------------
# status_ok NAME: status --check passes and --json says ready, not fenced
status_ok() {
	"$ISERBLK_BIN" status "$1" --run-dir "$rundir" --json 2>/dev/null | python3 -c '
import json, sys
g = json.load(sys.stdin)["gateway"]
sys.exit(0 if g["state"] == "ready" and not g["fenced"] else 1)' &&
		"$ISERBLK_BIN" status "$1" --run-dir "$rundir" --check >/dev/null 2>&1
}
sum() { dd if="$1" bs=1M iflag=direct status=none | sha256sum | cut -d' ' -f1; }
fail() { echo "powercut: FAIL $fe: $*"; return 1; }

verify_fe() {
	local fe=$1 t0 ready_ms ready batches out vout journal sum_cd sum_plain mnt=/mnt/pc-$fe st
	t0=$(now_ms)
	# shellcheck disable=SC2046
	start_gw "$fe-2" $(attach_args "$fe") || fail "the same attach after the power cut did not serve: $(tail -5 "$R/gw-$fe-2.log" | tr '\n' '|')" || return
	ready_ms=$(($(now_ms) - t0))
	has_ready() { grep -q 'cache device ready' "$R/gw-$fe-2.log"; }
	wait_until 60 "cache device ready" has_ready || fail "no 'cache device ready' in the log" || return
	ready=$(grep -m1 'cache device ready' "$R/gw-$fe-2.log")
	batches=$(grep -oE '"batches recovered"[[:space:]]*[:=][[:space:]]*[0-9]+' <<<"$ready" | grep -oE '[0-9]+$' || true)
	[ -n "$batches" ] || fail "no batch count in: $ready" || return
	[ "$batches" -gt 0 ] || fail "recovered 0 batches: the power cut found nothing in the log (the test did not exercise it)" || return
	if grep -q 'NOT resuming\|fenced' "$R/gw-$fe-2.log"; then fail "fenced: $(grep -m1 'NOT resuming\|fenced' "$R/gw-$fe-2.log")" || return; fi
	wait_until 60 "status ready, not fenced" status_ok "pc-$fe" ||
		fail "status: $("$ISERBLK_BIN" status "pc-$fe" --run-dir "$rundir" 2>&1 | tr '\n' '|')" || return
	# ext4 replays its journal at mount; after that the file system must be clean
	mkdir -p "$mnt"
	mount "$gw_dev" "$mnt" || fail "mount $gw_dev failed: $(dmesg | tail -3 | tr '\n' '|')" || return
	umount "$mnt"
	out=$(fsck.ext4 -fn "$gw_dev" 2>&1) || fail "fsck.ext4 -fn $gw_dev: exit $?: $(tail -8 <<<"$out" | tr '\n' '|')" || return
	mount -o ro "$gw_dev" "$mnt" || fail "mount -o ro $gw_dev failed" || return
	vout=$(python3 "$here/powercut-fs.py" verify "$mnt/data" "$R/progress-$fe" 2>&1) && st=0 || st=$?
	umount "$mnt"
	[ $st = 0 ] || fail "durable records lost: $(tail -6 <<<"$vout" | tr '\n' '|')" || return
	# I/O errors and ext4 complaints name the device (its journal replay, "recovery complete", is
	# what a power cut leaves)
	out=$(dmesg | grep -w "${gw_dev##*/}" | grep -iE 'error|warning|corrupt|fail' || true)
	[ -z "$out" ] || fail "kernel log: $(tail -3 <<<"$out" | tr '\n' '|')" || return
	journal=no
	if dmesg | grep -w "${gw_dev##*/}" | grep -q 'recovery complete'; then journal=yes; fi
	sum_cd=$(sum "$gw_dev")
	"$ISERBLK_BIN" detach "pc-$fe" --run-dir "$rundir" >"$R/detach-$fe.log" 2>&1 ||
		fail "detach: $(tail -3 "$R/detach-$fe.log" | tr '\n' '|')" || return
	wait $gw_pid || fail "the gateway exited $? after detach: $(tail -3 "$R/gw-$fe-2.log" | tr '\n' '|')" || return
	# the target alone: the detach wrote the log back
	# shellcheck disable=SC2046
	start_gw "$fe-plain" --target "${target[$fe]}" $(fe_args "$fe") --cache off ||
		fail "attach --cache off: $(tail -3 "$R/gw-$fe-plain.log" | tr '\n' '|')" || return
	sum_plain=$(sum "$gw_dev")
	out=$(fsck.ext4 -fn "$gw_dev" 2>&1) && st=0 || st=$?
	kill -INT $gw_pid
	wait $gw_pid || true
	[ "$sum_plain" = "$sum_cd" ] || fail "the LUN through --cache off ($sum_plain) differs from what the cache-dev gateway served before detach ($sum_cd)" || return
	[ $st = 0 ] || fail "fsck.ext4 -fn of the target alone: exit $st" || return
	echo "powercut: PASS $fe: $batches batches recovered, device served ${ready_ms} ms after attach, not fenced, ext4 journal replayed: $journal, then fsck clean, files: $(tail -1 <<<"$vout"), the target alone matches after detach"
}

rc=0
for fe in "${fes[@]}"; do
	verify_fe "$fe" || rc=1
done
exit $rc
}
