#!/usr/bin/env bash
# test/vm/test-vm.sh — the whole VM tier, as `make test-vm` runs it: the runner's self-test
# (host), the smoke suite (one guest boot), every vm-tagged Go test (one more boot), the
# systemd unit's tests (test/vm/systemd, a third boot with systemd as PID 1) and the power cut
# under a cache device (powercut.sh: two boots, QEMU killed with SIGKILL between). Every part
# runs even when an earlier one failed; prints each part's wall time and a closing
# "vm: N passed, M failed" line; exits non-zero on any failure. TALLY=FILE collects per-part counts
# for `make test`'s total line, and "FAILED part what" lines for its recap.
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

part "runner self-test (host)" env TALLY="$tally" "$here/selftest.sh"
part "smoke suite (guest)" smoke
part "Go tests tagged vm (guest)" env TALLY="$tally" "$here/gotest.sh"
part "Go tests of the systemd unit (guest, systemd as PID 1)" env TALLY="$tally" VM_INIT=systemd "$here/gotest.sh"
part "power cut under a cache device (two guest boots, QEMU killed between)" env TALLY="$tally" "$here/powercut.sh"

read -r p f s < <(awk '$1 != "FAILED" {p+=$2; f+=$3; s+=$4} END {print p+0, f+0, s+0}' "$tally")
if [ -n "${TALLY:-}" ]; then cat "$tally" >>"$TALLY"; fi
echo "=== vm tier: $((${EPOCHREALTIME%.*} - t_start)) s wall in all"
echo "vm: $p passed, $f failed, $s skipped"
exit $rc
exit
}
