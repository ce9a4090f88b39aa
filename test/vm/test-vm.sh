#!/usr/bin/env bash
# test/vm/test-vm.sh — the whole VM tier, as `make test-vm` runs it: the runner's self-test
# (host), the smoke suite (one guest boot) and every vm-tagged Go test (one more boot). Every part
# runs even when an earlier one failed; prints each part's wall time and a closing
# "vm: N passed, M failed" line; exits non-zero on any failure. TALLY=FILE collects per-part counts
# for `make test`'s total line.
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
part() { # NAME CMD...: run one part, time it
	local name=$1 t0=${EPOCHREALTIME%.*} st=0
	shift
	echo "=== vm tier: $name"
	"$@" || st=$?
	echo "=== vm tier: $name: exit $st, $((${EPOCHREALTIME%.*} - t0)) s wall"
	[ $st = 0 ] || rc=1
}
smoke() {
	local log
	log=$(mktemp "${TMPDIR:-/tmp}/vm-smoke.XXXXXX")
	"$here/run.sh" "$here/smoke.sh" | tee "$log"
	local st=${PIPESTATUS[0]}
	# count from the suite's own closing line; a VM that died before it counts as one failure
	local line
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
	if [ -n "$line" ]; then
		set -- $line
		echo "vm-smoke $1 $3 0" >>"$tally"
	else
		echo "vm-smoke 0 1 0" >>"$tally"
	fi
	rm -f "$log"
	return "$st"
}

part "runner self-test (host)" env TALLY="$tally" "$here/selftest.sh"
part "smoke suite (guest)" smoke
part "Go tests tagged vm (guest)" env TALLY="$tally" "$here/gotest.sh"

read -r p f s < <(awk '{p+=$2; f+=$3; s+=$4} END {print p+0, f+0, s+0}' "$tally")
if [ -n "${TALLY:-}" ]; then cat "$tally" >>"$TALLY"; fi
echo "=== vm tier: $((${EPOCHREALTIME%.*} - t_start)) s wall in all"
[ "$rc" = 0 ] || [ "$f" != 0 ] || f=1 # a part failed without counting a failure
echo "vm: $p passed, $f failed, $s skipped"
exit $rc
exit
}
