#!/usr/bin/env bash
# test/vm/guest/reset.sh — inside the VM: put the guest back into a clean state, as the VM Go-test
# runner does between packages (all packages share one guest). A package whose binary was killed
# by its -test.timeout never ran its t.Cleanup, and what it left (an LIO target under the default
# IQN, an iSCSI session, an attached nbd device, tgtd) would fail the next package's tests.
# Logs each thing it removes on stderr (so leaks are visible) and prints RESET_REMOVED=N.
# Soft-RoCE (rxe-up.sh) and iscsid stay: they are shared and idempotent.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"
require_vm
removed=0

# iSCSI sessions of the kernel initiator, then every node record
# (every iscsiadm call is bounded: a wedged iscsid must not keep the guest from its next package)
rc=0
sessions=$(timeout -k 5 20 iscsiadm -m session 2>/dev/null) || rc=$?
case $rc in
0 | 21) ;; # 21: no active sessions
124 | 137) log "warning: iscsiadm -m session did not return within 20 s: sessions not logged out" ;;
esac
if [ "$rc" = 0 ] && [ -n "$sessions" ]; then
	while read -r line; do log "logging out: $line"; removed=$((removed + 1)); done <<<"$sessions"
	timeout -k 5 60 iscsiadm -m node --logoutall=all >/dev/null 2>&1 || log "warning: logout failed"
fi
if command -v iscsiadm >/dev/null && [ -d /etc/iscsi/nodes ]; then
	timeout -k 5 30 iscsiadm -m node -o delete >/dev/null 2>&1 || true
fi

# kernel nbd devices still connected (a pid attribute exists while a client is attached)
for p in /sys/block/nbd*/pid; do
	[ -e "$p" ] || continue
	d=/dev/$(basename "$(dirname "$p")")
	log "disconnecting $d (client pid $(cat "$p" 2>/dev/null))"
	removed=$((removed + 1))
	timeout 20 nbd-client -d "$d" >/dev/null 2>&1 || log "warning: nbd-client -d $d failed"
done

# LIO targets and backstores
if [ -d /sys/kernel/config/target/iscsi ]; then
	n=$(find /sys/kernel/config/target/iscsi -mindepth 1 -maxdepth 1 \( -name 'iqn.*' -o -name 'eui.*' -o -name 'naa.*' \) | wc -l)
	if [ "$n" -gt 0 ] || ls -d /sys/kernel/config/target/core/*_[0-9]*/*/ >/dev/null 2>&1; then
		removed=$((removed + n))
		"$here/lio-target.sh" --teardown-all || log "warning: LIO teardown failed"
	fi
fi

# tgtd
if tgtadm --mode sys --op show >/dev/null 2>&1; then
	log "stopping tgtd"
	removed=$((removed + 1))
	"$here/tgt-target.sh" --teardown || log "warning: tgt teardown failed"
fi

kv RESET_REMOVED "$removed"
exit 0
}
