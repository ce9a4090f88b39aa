#!/usr/bin/env bash
# test/vm/test-vm.sh — the whole VM tier, as `make test-vm` runs it: the runner's self-test
# (host), the smoke suite (one guest boot), every vm-tagged Go test, the systemd unit's tests
# (test/vm/systemd, a boot with systemd as PID 1) and the power cut under a cache device
# (powercut.sh: two boots, QEMU killed with SIGKILL between). Every part runs even when an
# earlier one failed; prints each part's wall time and a closing "vm: N passed, M failed" line;
# exits non-zero on any failure. TALLY=FILE collects per-part counts for `make test`'s total line,
# and "FAILED part what" lines for its recap.
#
# Two lanes, two guests at once (VM_LANES=2, the default on a host with 4 or more CPUs, one
# guest's 2 vCPUs each): a guest waits part of the tier (the kernel's 30 s NBD request timer after
# each kill -9, systemd's restart delays), and the second guest runs meanwhile. On a 2-CPU host
# the guests are busy enough to slow each other down about as much as the lanes save (measured:
# backend/iser/internal/rdma 582 s beside the other lane against 294 s alone, test/vm/cachedev
# 695 s against 364 s; the tier as a whole no shorter), so there the default is one lane. Lane one is the vm-tagged Go tests but those in
# VM_LANE2_PKGS (default ./test/vm/cachedev), its output live; lane two is the self-test, the
# smoke suite, VM_LANE2_PKGS, the systemd tier and the power cut, its output printed after lane
# one's (and written to a file named at the start while it runs). The guests share nothing but
# the host: each has its own kernel, LIO target, devices and tmpfs. VM_LANES=1 runs every part
# one after the other, as before.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
cd "$here/../.." || exit 2
tally=$(mktemp "${TMPDIR:-/tmp}/vm-tally.XXXXXX")
trap 'rm -f "$tally"' EXIT
rc=0
t_start=${EPOCHREALTIME%.*}
part() { # NAME CMD...: run one part, time it; a part that fails without counting a failure counts one
	local name=$1 t0=${EPOCHREALTIME%.*} st=0 before
	shift
	before=$(grep -c '^FAILED ' "$tally")
	echo "=== vm tier: $name"
	"$@" || st=$?
	echo "=== vm tier: $name: exit $st, $((${EPOCHREALTIME%.*} - t0)) s wall"
	[ $st = 0 ] && return
	rc=1
	if [ "$(grep -c '^FAILED ' "$tally")" = "$before" ]; then
		printf 'vm 0 1 0\nFAILED vm %s: exit %s without a counted failure (see its output)\n' "$name" "$st" >>"$tally"
	fi
}
smoke() {
	local log st line
	log=$(mktemp "${TMPDIR:-/tmp}/vm-smoke.XXXXXX")
	# run.sh's own stderr ("run.sh: VM failure: ...") goes into the log too: it is the diagnosis
	# when the guest dies (one that dies before the suite starts is booted again by run.sh)
	"$here/run.sh" "$here/smoke.sh" 2>&1 | tee "$log"
	st=${PIPESTATUS[0]}
	# count from the suite's own closing line; a VM that died before it counts as one failure,
	# recapped with the log's last lines
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
	if [ -n "$line" ]; then
		set -- $line
		echo "vm-smoke $1 $3 0" >>"$tally"
		sed -n 's/^FAIL \[ *[0-9.]*s\] /FAILED vm-smoke /p' "$log" >>"$tally"
	else
		echo "vm-smoke 0 1 0" >>"$tally"
		echo "FAILED vm-smoke the guest ended before the suite's closing line (run.sh exit $st); its last lines: $(grep -v '^ *$' "$log" | tail -4 | tr '\n' '|')" >>"$tally"
	fi
	rm -f "$log"
	return "$st"
}

lane2_pkgs=${VM_LANE2_PKGS-./test/vm/cachedev}
lanes=${VM_LANES:-}
if [ -z "$lanes" ]; then lanes=1; [ "$(nproc)" -ge 4 ] && lanes=2; fi
[ -n "$lane2_pkgs" ] || lanes=1
lane2_re='^('$(printf '%s\n' $lane2_pkgs | sed 's/[.]/[.]/g' | paste -sd '|')')$'

selftest() { part "runner self-test (host)" env TALLY="$tally" "$here/selftest.sh"; }
smoke_part() { part "smoke suite (guest)" smoke; }
systemd_part() { part "Go tests of the systemd unit (guest, systemd as PID 1)" env TALLY="$tally" VM_INIT=systemd "$here/gotest.sh"; }
powercut() { part "power cut under a cache device (two guest boots, QEMU killed between)" env TALLY="$tally" "$here/powercut.sh"; }

if [ "$lanes" = 1 ]; then
	selftest
	smoke_part
	part "Go tests tagged vm (guest)" env TALLY="$tally" "$here/gotest.sh"
	systemd_part
	powercut
else
	# lane two: its own tally (part() compares FAILED counts before and after a part, which the
	# other lane's lines would upset) and its own process group, so that an interrupted tier
	# takes its guests down too (run.sh kills its QEMU on SIGTERM)
	# Each guest runs slower beside the other (backend/iser/internal/rdma: 582 s against 294 s
	# alone), so a Go-test guest gets an hour rather than gotest.sh's 45 minutes.
	lane_timeout=${VM_TIMEOUT:-3600}
	lane2_log=$(mktemp "${TMPDIR:-/tmp}/vm-lane2.XXXXXX")
	lane2_tally=$(mktemp "${TMPDIR:-/tmp}/vm-tally2.XXXXXX")
	trap 'rm -f "$tally" "$lane2_tally" "$lane2_log"' EXIT
	echo "=== vm tier: two guests at once; lane two (self-test, smoke, $lane2_pkgs, systemd, power cut) prints after lane one, meanwhile: tail -f $lane2_log"
	set -m
	(
		tally=$lane2_tally rc=0
		selftest
		smoke_part
		part "Go tests tagged vm, lane two (guest): $lane2_pkgs" env TALLY="$tally" VM_TIMEOUT="$lane_timeout" "$here/gotest.sh" $lane2_pkgs
		systemd_part
		powercut
		exit $rc
	) </dev/null >"$lane2_log" 2>&1 &
	lane2=$!
	set +m
	trap 'kill -TERM -- -$lane2 2>/dev/null; rm -f "$tally" "$lane2_tally" "$lane2_log"' EXIT
	trap 'exit 143' TERM INT
	part "Go tests tagged vm (guest)" env TALLY="$tally" VM_GO_EXCLUDE="$lane2_re" VM_TIMEOUT="$lane_timeout" "$here/gotest.sh"
	wait "$lane2" || rc=1
	cat "$lane2_log"
	cat "$lane2_tally" >>"$tally"
fi

read -r p f s < <(awk '$1 != "FAILED" {p+=$2; f+=$3; s+=$4} END {print p+0, f+0, s+0}' "$tally")
if [ -n "${TALLY:-}" ]; then cat "$tally" >>"$TALLY"; fi
echo "=== vm tier: $((${EPOCHREALTIME%.*} - t_start)) s wall in all"
echo "vm: $p passed, $f failed, $s skipped"
exit $rc
exit
}
