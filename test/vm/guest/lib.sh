# shellcheck shell=bash
# test/vm/guest/lib.sh — sourced by the guest helpers (not run on its own).
# Conventions every helper follows: diagnostics go to stderr; results go to stdout as KEY=VALUE
# lines (values never contain newlines), so callers can `eval` them in bash or parse them in Go
# (test/vm/vmtest.ParseKV). Waiting is always polling a condition with a deadline, never a blind
# sleep.

guest_name=${0##*/}
log() { echo "$guest_name: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# require_vm refuses to run on the host: these scripts load modules, create netdevs and targets.
require_vm() {
	[ "${ISERBLK_IN_VM:-}" = 1 ] || die "runs only inside the test VM (test/vm/run.sh sets ISERBLK_IN_VM=1)"
	[ "$(id -u)" = 0 ] || die "needs root"
}

# now_ms prints the monotonic-enough wall clock in milliseconds.
now_ms() {
	local t=${EPOCHREALTIME/./}
	echo $((t / 1000))
}

# wait_until SECONDS WHAT CMD [ARGS...]: run CMD every 100 ms until it succeeds; fail with a message
# naming WHAT after SECONDS.
wait_until() {
	local secs=$1 what=$2
	shift 2
	local deadline=$(($(now_ms) + secs * 1000))
	until "$@"; do
		if [ "$(now_ms)" -ge "$deadline" ]; then
			log "timed out after ${secs}s waiting for $what"
			return 1
		fi
		sleep 0.1
	done
}

# kv KEY VALUE prints one result line.
kv() { printf '%s=%s\n' "$1" "$2"; }
