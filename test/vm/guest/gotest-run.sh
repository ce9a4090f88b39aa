#!/usr/bin/env bash
# test/vm/guest/gotest-run.sh — inside the VM: run the vm-tagged Go test binaries that
# test/vm/gotest.sh built on the host, one after another, each in its package directory (as
# `go test` does). Output streams to the console as `go test -v` would show it; each package's raw
# -test.v=test2json stream goes to RESULTS/NAME.raw for the host to turn into JSON events.
#
#   gotest-run.sh MANIFEST RESULTS [TESTFLAGS...]
# MANIFEST lines: NAME<TAB>BINARY<TAB>PKGDIR<TAB>IMPORTPATH. TESTFLAGS are -test.* flags.
# Exit status: 0 when every package passed, 1 otherwise.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
manifest=$1
results=$2
shift 2
[ "${ISERBLK_IN_VM:-}" = 1 ] || { echo "gotest-run.sh runs inside the VM" >&2; exit 2; }

rc=0
while IFS=$'\t' read -r name bin dir pkg; do
	[ -n "$name" ] || continue
	raw=$results/$name.raw
	start=${EPOCHREALTIME/./}
	# The binary runs in its own session, so whatever it leaves running (servers, daemons that
	# did not detach) can be killed afterwards. -test.v=test2json frames events with ^V markers
	# for test2json; strip them for people.
	sidfile=$results/$name.sid
	setsid bash -c 'echo $$ >"$1"; cd "$2" && exec "${@:3}"' _ "$sidfile" "$dir" "$bin" -test.v=test2json "$@" 2>&1 |
		tee "$raw" | tr -d '\026' | grep --line-buffered -v '^=== NAME'
	st=${PIPESTATUS[0]}
	sid=$(cat "$sidfile" 2>/dev/null)
	rm -f "$sidfile"
	if [ -n "$sid" ] && pgrep -s "$sid" >/dev/null; then
		echo "vm: killing what $pkg left running: $(pgrep -s "$sid" -d ' ' -l)"
		pkill -KILL -s "$sid"
	fi
	# the next package starts from a clean guest (targets, sessions, devices); bounded, so that a
	# teardown stuck in the kernel costs 300 s and a warning, not the guest's whole budget
	timeout -k 10 300 "$ISERBLK_VM_GUEST_DIR/reset.sh" >/dev/null 2>"$results/$name.reset" ||
		echo "vm: warning: reset after $pkg failed (exit $?)"
	if [ -s "$results/$name.reset" ]; then
		echo "vm: $pkg left state behind; removed:"
		sed 's/^/vm:   /' "$results/$name.reset"
	fi
	secs=$(((${EPOCHREALTIME/./} - start) / 10000))
	secs=$((secs / 100)).$(printf '%02d' $((secs % 100)))
	if [ "$st" = 0 ]; then
		printf 'ok  \t%s\t%ss\n' "$pkg" "$secs"
	else
		rc=1
		# a binary that died (panic, timeout, signal) may not have printed its own FAIL line:
		# make the package's failure explicit for test2json
		printf 'vm: test binary exited with status %s\nFAIL\n' "$st" >>"$raw"
		printf 'FAIL\t%s\t%ss\n' "$pkg" "$secs"
	fi
	echo "$st" >"$results/$name.status"
done <"$manifest"
exit $rc
exit
}
