#!/usr/bin/env bash
# test/vm/selftest.sh — host-side checks of the runner itself (run by `make test-vm`):
#   1. the guest command's exit status and output come back unchanged (quoting survives);
#   2. a hung guest is killed at VM_TIMEOUT, reported as such, exit status 124;
#   3. a guest that dies without returning the command's status is a VM failure, exit status 125;
#   4. SIGTERM to the runner kills its QEMU;
#   5. a guest that dies before its command starts is booted again (up to VM_BOOTS), never after;
# and after each, no QEMU of that run is left (found by its unique -name, so QEMUs that other
# people run on this machine are never looked at or touched).
# Prints PASS/FAIL per check and "N passed, M failed"; TALLY=FILE appends "vm-self P F 0" and a
# "FAILED vm-self what" line per failure.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
run=$here/run.sh
passed=0
failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vm-selftest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ok() { passed=$((passed + 1)); echo "PASS $*"; }
fails=()
bad() { failed=$((failed + 1)); fails+=("$*"); echo "FAIL $*"; }
qemu_of() { pgrep -f -- "-name $1 " >/dev/null; } # is this run's QEMU alive?
t_now() { echo "${EPOCHREALTIME%.*}"; }

# 1. exit status and output
id=vm-selftest-$$-exit
t0=$(t_now)
out=$(VM_RUN_ID=$id VM_RESULTS=$tmp/r1 "$run" sh -c 'printf "%s|" "$@"; exit 3' sh "a b" 'c$d' "'q'" 2>"$tmp/err1")
rc=$?
echo "  run.sh sh -c '... exit 3': exit $rc, output '$out' ($(($(t_now) - t0)) s)"
if [ $rc = 3 ] && [ "$out" = "a b|c\$d|'q'|" ]; then ok "a failing command fails the run with its exit code (3) and its output intact"
else bad "exit code/output passthrough: rc=$rc out='$out' stderr: $(tail -3 "$tmp/err1")"; fi
if qemu_of "$id"; then bad "QEMU of $id still running after the run"; else ok "no QEMU left after a normal run"; fi

# 2. timeout: the guest runs `sleep 1000`; the runner must kill it after VM_TIMEOUT seconds, which
# count from QEMU's start, boot included: at 15 s a slow host may kill it still booting, which
# is the same kill and the same report (run.sh never boots again after a timeout)
id=vm-selftest-$$-timeout
t0=$(t_now)
VM_RUN_ID=$id VM_TIMEOUT=15 VM_RESULTS=$tmp/r2 "$run" sleep 1000 >"$tmp/out2" 2>"$tmp/err2" &
pid=$!
seen=0
for _ in $(seq 200); do # poll up to 20 s for the QEMU to show up, so the check after means something
	if qemu_of "$id"; then seen=1; break; fi
	sleep 0.1
done
wait $pid
rc=$?
wall=$(($(t_now) - t0))
echo "  VM_TIMEOUT=15 run.sh sleep 1000: exit $rc after ${wall} s; stderr: $(grep -m1 TIMEOUT "$tmp/err2")"
if [ $rc = 124 ] && grep -q 'TIMEOUT' "$tmp/err2" && [ $wall -ge 15 ] && [ $wall -lt 45 ]; then
	ok "a hung guest is killed at VM_TIMEOUT and reported (exit 124)"
else bad "timeout: rc=$rc wall=${wall}s stderr: $(tail -3 "$tmp/err2")"; fi
if [ $seen = 1 ] && ! qemu_of "$id"; then ok "QEMU was running during the hang and is gone after the timeout"
else bad "QEMU seen during the run: $seen; still running after: $(pgrep -af -- "-name $id " || echo no)"; fi

# 3. the guest dies under the command (sysrq power-off: no exit status comes back): VM failure, 125
id=vm-selftest-$$-vmfail
VM_RUN_ID=$id VM_RESULTS=$tmp/r4 "$run" sh -c 'echo o >/proc/sysrq-trigger; sleep 60' >"$tmp/out4" 2>"$tmp/err4"
rc=$?
echo "  run.sh sh -c 'echo o >/proc/sysrq-trigger': exit $rc; stderr: $(grep -m1 'VM failure' "$tmp/err4")"
if [ $rc = 125 ] && grep -q 'VM failure' "$tmp/err4" && ! qemu_of "$id"; then
	ok "a guest that dies without an exit status is a VM failure (exit 125)"
else bad "VM failure: rc=$rc stderr: $(tail -3 "$tmp/err4")"; fi

# 4. SIGTERM to the runner while the guest runs
id=vm-selftest-$$-term
VM_RUN_ID=$id VM_RESULTS=$tmp/r3 "$run" sleep 1000 >"$tmp/out3" 2>"$tmp/err3" &
pid=$!
seen=0
for _ in $(seq 200); do
	if qemu_of "$id"; then seen=1; break; fi
	sleep 0.1
done
kill -TERM $pid
wait $pid
rc=$?
if [ $seen = 1 ] && [ $rc = 143 ] && ! qemu_of "$id"; then ok "SIGTERM to run.sh kills its QEMU (exit 143)"
else bad "SIGTERM: QEMU seen $seen, rc=$rc, left: $(pgrep -af -- "-name $id " || echo none)"; fi

# 5. the guest dies before its command starts (init fails on purpose): booted again, the command
# runs once; when every one of VM_BOOTS boots fails, a VM failure (125) and the command never ran
id=vm-selftest-$$-boot
out=$(VM_RUN_ID=$id VM_BOOTS=3 VM_SELFTEST_FAIL_BOOTS=1 VM_RESULTS=$tmp/r5 "$run" echo command-ran 2>"$tmp/err5")
rc=$?
echo "  VM_SELFTEST_FAIL_BOOTS=1 run.sh echo command-ran: exit $rc; stderr: $(grep -m1 'booting again' "$tmp/err5")"
# (the first boot's console shows init's "vm-init: failing this boot on purpose", unless the
# emulator's own boot Oops got there first: either way it is a boot that died)
if [ $rc = 0 ] && [ "$(grep -c '^command-ran$' <<<"$out")" = 1 ] &&
	grep -q 'booting again' "$tmp/err5" && ! qemu_of "$id"; then
	ok "a guest that dies before its command starts is booted again; the command runs once"
else bad "boot retry: rc=$rc out='$(tail -3 <<<"$out")' stderr: $(tail -3 "$tmp/err5")"; fi
id=vm-selftest-$$-noboot
out=$(VM_RUN_ID=$id VM_BOOTS=2 VM_SELFTEST_FAIL_BOOTS=2 VM_RESULTS=$tmp/r6 "$run" echo command-ran 2>"$tmp/err6")
rc=$?
echo "  VM_BOOTS=2 VM_SELFTEST_FAIL_BOOTS=2 run.sh echo command-ran: exit $rc; stderr: $(grep -m1 'VM failure' "$tmp/err6")"
if [ $rc = 125 ] && ! grep -q '^command-ran$' <<<"$out" && grep -q 'did not boot in 2 tries' "$tmp/err6" &&
	[ "$(grep -c 'booting again' "$tmp/err6")" = 1 ] && ! qemu_of "$id"; then
	ok "a guest that fails every boot is a VM failure (exit 125) after VM_BOOTS tries"
else bad "boot failures: rc=$rc out='$(tail -3 <<<"$out")' stderr: $(tail -3 "$tmp/err6")"; fi

echo "$passed passed, $failed failed"
if [ -n "${TALLY:-}" ]; then
	echo "vm-self $passed $failed 0" >>"$TALLY"
	for f in "${fails[@]}"; do printf 'FAILED vm-self %s\n' "${f//$'\n'/ }" >>"$TALLY"; done
fi
[ $failed = 0 ]
exit
}
