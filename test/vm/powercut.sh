#!/usr/bin/env bash
# test/vm/powercut.sh — issue #39's power cut under a cache device (--cache-dev), run by
# `make test-vm`: a gateway's host loses power with its cache device file kept.
#
# Boot 1 (test/vm/guest/powercut.sh write, in the background): ext4 on disk1 holds the cache files;
# per frontend (ublk, nbd) an LIO iblock LUN on its own disk, a write-back gateway with
# --cache-dev on that ext4, ext4 on the gateway's device and a workload that creates and replaces
# files with fsync, recording each durable one in a progress file on a host directory (9p). This
# script waits until every frontend has POWERCUT_RECORDS durable records and its log has written
# data back (the checkpoint moved) and holds data the target has not got, then kills QEMU with
# SIGKILL: the gateways, the guest's page cache (the cache files' unsynced pages among it) and
# LIO die at once; the disks keep what the guest flushed (run.sh VM_DISKS: QEMU's writeback cache
# honours flushes).
# Boot 2 (guest/powercut.sh verify), the same disks: per frontend, the same attach command must
# recover the log (batches recovered > 0), serve not fenced, fsck.ext4 -fn clean after the journal
# replay, every durable record reads back, and after a detach the LUN alone (--cache off) holds
# the same bytes.
#
# Prints PASS/FAIL per frontend and "N passed, M failed"; TALLY=FILE appends "vm-powercut P F 0" and
# a "FAILED vm-powercut FE: why" line per failure. Environment: POWERCUT_RECORDS (default 200),
# POWERCUT_FRONTENDS (default "ublk nbd"), ISERBLK_BIN (built here when unset), VM_CACHE.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)
records=${POWERCUT_RECORDS:-200}
fes=${POWERCUT_FRONTENDS:-ublk nbd}
VM_CACHE=${VM_CACHE:-/var/tmp/iser-blk-vm}
mkdir -p "$VM_CACHE/jobs"
work=$(mktemp -d "$VM_CACHE/jobs/powercut.XXXXXX")
id=iserblk-powercut-$$
boot1=
passed=0
failed=0
fails=()
cleanup() {
	# our own boot 1, found by its unique QEMU -name, if this script ends before cutting it
	if [ -n "$boot1" ] && kill -0 "$boot1" 2>/dev/null; then
		cut
		wait "$boot1" 2>/dev/null
	fi
	if [ $failed = 0 ]; then rm -rf "$work"; else
		rm -f "$work"/*.img
		echo "powercut.sh: logs kept in $work"
	fi
}
trap cleanup EXIT
t_now() { echo "${EPOCHREALTIME%.*}"; }
# cut: SIGKILL to boot 1's QEMU, by the pid of the one process whose command line starts with
# QEMU and this run's unique -name (run.sh's supervisor then sees QEMU gone)
cut() {
	local p
	p=$(pgrep -f -- "^qemu-system-x86_64 -name $id-1 ") || return 1
	kill -KILL $p
}
finish() {
	echo "$passed passed, $failed failed"
	if [ -n "${TALLY:-}" ]; then
		echo "vm-powercut $passed $failed 0" >>"$TALLY"
		for f in "${fails[@]}"; do echo "FAILED vm-powercut $f" >>"$TALLY"; done
	fi
	[ $failed = 0 ]
	exit
}
fail_all() { # WHY: every frontend fails with this reason
	local fe
	for fe in $fes; do
		failed=$((failed + 1))
		fails+=("$fe: $1")
		echo "FAIL $fe: $1"
	done
	finish
}

# the CLI, as gotest.sh does: the one make exports, else built for this run
if [ -z "${ISERBLK_BIN:-}" ] || [ ! -x "$ISERBLK_BIN" ]; then
	GO=$(command -v go || echo /usr/local/go/bin/go)
	(cd "$root" && GOFLAGS=-buildvcs=false "$GO" build -o "$work/iser-blk" ./cmd/iser-blk) ||
		fail_all "building ./cmd/iser-blk failed"
	ISERBLK_BIN=$work/iser-blk
fi
export ISERBLK_BIN

# disk1: the cache files' ext4 (2 x 96 MiB); then one LUN per frontend
disks=$work/cache.img
truncate -s 256M "$work/cache.img"
for fe in $fes; do
	truncate -s 128M "$work/lun-$fe.img"
	disks+=:$work/lun-$fe.img
done
export VM_DISKS=$disks VM_RESULTS=$work/shared POWERCUT_FRONTENDS=$fes
export VM_ENV="${VM_ENV:+$VM_ENV }POWERCUT_FRONTENDS"
mkdir -p "$VM_RESULTS"

# --- boot 1: write until the power cut -------------------------------------------------------
t0=$(t_now)
VM_RUN_ID=$id-1 VM_TIMEOUT=600 "$here/run.sh" "$here/guest/powercut.sh" write >"$work/boot1.log" 2>&1 &
boot1=$!
durable() { # FE: complete "done" lines in its progress file
	[ -e "$VM_RESULTS/progress-$1" ] || { echo 0; return; }
	grep -c '^done .*[0-9]$' "$VM_RESULTS/progress-$1" || true
}
deadline=$(($(t_now) + 420))
while :; do
	enough=1
	for fe in $fes; do
		wb=0 dirty=0
		[ ! -s "$VM_RESULTS/log-$fe" ] || read -r wb dirty <"$VM_RESULTS/log-$fe"
		[ "$(durable "$fe")" -ge "$records" ] && [ "$wb" -gt 0 ] && [ "$dirty" -gt 0 ] || enough=0
	done
	[ $enough = 1 ] && break
	if ! kill -0 "$boot1" 2>/dev/null; then
		wait "$boot1"
		fail_all "boot 1 ended (run.sh exit $?) before $records durable records and a write-back per frontend; its last lines: $(grep -v '^ *$' "$work/boot1.log" | tail -5 | tr '\n' '|')"
	fi
	[ "$(t_now)" -lt "$deadline" ] ||
		fail_all "boot 1 did not reach $records durable records and a write-back per frontend in 420 s; its last lines: $(grep -v '^ *$' "$work/boot1.log" | tail -5 | tr '\n' '|')"
	sleep 0.2 # polling the progress files
done
# the power cut: SIGKILL to QEMU itself, found by this run's unique -name
cut || fail_all "no QEMU named $id-1 to kill"
wait "$boot1"
st=$?
cut_at=$(($(t_now) - t0))
at_cut=
for fe in $fes; do at_cut+=" $fe $(durable "$fe") (log: $(cat "$VM_RESULTS/log-$fe" 2>/dev/null | awk '{printf "%d KiB written back, %d KiB dirty", $1/1024, $2/1024}'))"; done
echo "powercut.sh: power cut after ${cut_at} s (run.sh exit $st, as a dead guest gives); durable records at the cut:$at_cut"
[ "$st" = 125 ] || fail_all "run.sh of the killed boot 1 exited $st, want 125 (the guest died without a status): $(tail -5 "$work/boot1.log" | tr '\n' '|')"

# --- boot 2: the same attach commands on the same disks --------------------------------------
t1=$(t_now)
VM_RUN_ID=$id-2 VM_TIMEOUT=600 "$here/run.sh" "$here/guest/powercut.sh" verify 2>&1 | tee "$work/boot2.log"
st=${PIPESTATUS[0]}
echo "powercut.sh: boot 2 took $(($(t_now) - t1)) s, run.sh exit $st"
for fe in $fes; do
	line=$(grep -E "^powercut: (PASS|FAIL) $fe:" "$work/boot2.log" | tail -1)
	case "$line" in
	"powercut: PASS $fe:"*)
		passed=$((passed + 1))
		echo "PASS $fe: ${line#powercut: PASS "$fe": } (durable records at the cut:$at_cut)"
		;;
	"powercut: FAIL $fe:"*)
		failed=$((failed + 1))
		fails+=("$fe: ${line#powercut: FAIL "$fe": }")
		echo "FAIL $fe: ${line#powercut: FAIL "$fe": }"
		;;
	*)
		failed=$((failed + 1))
		fails+=("$fe: boot 2 gave no verdict (run.sh exit $st); its last lines: $(grep -v '^ *$' "$work/boot2.log" | tail -4 | tr '\n' '|')")
		echo "FAIL $fe: boot 2 gave no verdict (run.sh exit $st)"
		;;
	esac
done
[ "$st" = 0 ] || [ $failed -gt 0 ] || { failed=1; fails+=("boot 2: run.sh exit $st with every frontend passed"); }
finish
}
