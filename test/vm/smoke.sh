#!/usr/bin/env bash
# test/vm/smoke.sh — the VM tier's smoke suite, run INSIDE the guest (test/vm/run.sh test/vm/smoke.sh).
# It proves the guest has every kernel path the project's VM tests rely on, using only Linux's and
# Debian's own tools, so it is also the reference later tests compare iser-blk against:
#   kernel nbd and ublk present; soft-RoCE ACTIVE; an LIO target reachable over iSCSI/TCP and over
#   iSER through open-iscsi (login, 16 MiB O_DIRECT write/read/compare, logout); LIO CHAP + mutual
#   CHAP on an ACL (right secrets log in, a wrong one is refused); with SMOKE_TGT=1 (needs
#   VM_MEM=2048), tgt's iSER target with its initiator-name ACL.
# One PASS/FAIL line per check, then "N passed, M failed" alone on a line; exit 1 on any failure.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
G=${ISERBLK_VM_GUEST_DIR:-$here/guest}
[ "${ISERBLK_IN_VM:-}" = 1 ] || { echo "smoke.sh runs inside the VM: test/vm/run.sh test/vm/smoke.sh" >&2; exit 2; }

passed=0
failed=0
t0=${EPOCHREALTIME/./}
work=$(mktemp -d /run/smoke.XXXXXX)
elapsed() { local t=${EPOCHREALTIME/./}; printf '%5.1fs' "$(((t - t0) / 100000))e-1"; }

# check NAME CMD [ARGS...]: run CMD with its output in a log; PASS or FAIL with the log's tail
check() {
	local name=$1 log=$work/log
	shift
	if "$@" >"$log" 2>&1; then
		passed=$((passed + 1))
		echo "PASS [$(elapsed)] $name"
	else
		failed=$((failed + 1))
		echo "FAIL [$(elapsed)] $name"
		sed 's/^/    | /' "$log" | tail -25
	fi
}

# kvget FILE KEY: a value from a helper's KEY=VALUE output
kvget() { sed -n "s/^$2=//p" "$1" | tail -1; }

# --- kernel block drivers ------------------------------------------------------------------------
nbd_ok() { "$G/modules.sh" nbd && [ -b /dev/nbd0 ]; }
check "/dev/nbd0 exists after modprobe nbd" nbd_ok
ublk_ok() { "$G/modules.sh" ublk && [ -c /dev/ublk-control ]; }
check "/dev/ublk-control exists after modprobe ublk_drv" ublk_ok

# --- soft-RoCE -----------------------------------------------------------------------------------
rxe_ok() {
	"$G/rxe-up.sh" >"$work/rxe.kv" || return 1
	cat "$work/rxe.kv"
	grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state &&
		rdma link show rxe0/1 | grep -q 'state ACTIVE' &&
		ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE
}
check "rxe0 is ACTIVE (soft-RoCE on a dummy netdev)" rxe_ok

# --- LIO over TCP and iSER, with open-iscsi --------------------------------------------------------
lio_ok() {
	"$G/lio-target.sh" --backstore rd --size-mib 64 >"$work/lio.kv" || return 1
	cat "$work/lio.kv"
	[ "$(kvget "$work/lio.kv" LIO_ISER)" = 1 ] &&
		[ "$(cat "$(kvget "$work/lio.kv" LIO_BACKSTORE)/../../../iscsi/$(kvget "$work/lio.kv" LIO_IQN)/tpgt_1/np/$(kvget "$work/lio.kv" LIO_PORTAL)/iser")" = 1 ]
}
check "LIO target: 64 MiB RAM LUN, TCP + iSER on one portal" lio_ok
IQN=$(kvget "$work/lio.kv" LIO_IQN)
PORTAL=$(kvget "$work/lio.kv" LIO_PORTAL)

head -c 16M /dev/urandom >"$work/pattern"
for transport in tcp iser; do
	login() {
		"$G/open-iscsi.sh" login --transport "$transport" --portal "$PORTAL" --iqn "$IQN" >"$work/ini.kv" || return 1
		cat "$work/ini.kv"
		# the session really uses the transport asked for
		iscsiadm -m session -P 1 | tee "$work/session" | grep -q "Iface Transport: $transport"
	}
	check "open-iscsi login over $transport" login
	dev=$(kvget "$work/ini.kv" ISCSI_DEV)
	rw() {
		[ -b "$dev" ] || { echo "no disk"; return 1; }
		echo "$dev: $(($(cat "/sys/block/${dev#/dev/}/size") * 512)) bytes, $(cat "/sys/block/${dev#/dev/}/device/model")"
		dd if="$work/pattern" of="$dev" bs=1M oflag=direct conv=fsync status=none &&
			dd if="$dev" of="$work/readback" bs=1M count=16 iflag=direct status=none &&
			cmp "$work/pattern" "$work/readback"
	}
	check "$transport: 16 MiB O_DIRECT write, read back, compare" rw
	logout() {
		"$G/open-iscsi.sh" logout --transport "$transport" --portal "$PORTAL" --iqn "$IQN" &&
			! iscsiadm -m session 2>/dev/null | grep -q "$IQN"
	}
	check "open-iscsi logout over $transport" logout
	rm -f "$work/readback"
	# the next transport must read what this one wrote: flip the pattern's first MiB
	head -c 1M /dev/urandom | dd of="$work/pattern" conv=notrunc status=none
done

# --- LIO CHAP + mutual CHAP on an initiator ACL (TCP) ---------------------------------------------
INI=iqn.2026-01.org.iserblk:smoke-chap
chap_target() {
	"$G/lio-target.sh" --iqn iqn.2003-01.org.linux-iscsi.iserblk-vm:chap --no-iser --port 3262 \
		--acl "$INI" --chap smokeuser:smoke-secret-1 --mutual-chap smoketarget:smoke-secret-2 >"$work/chap.kv"
}
check "LIO target with an ACL, CHAP and mutual CHAP" chap_target
CIQN=$(kvget "$work/chap.kv" LIO_IQN)
CPORTAL=$(kvget "$work/chap.kv" LIO_PORTAL)
chap_good() {
	"$G/open-iscsi.sh" login --portal "$CPORTAL" --iqn "$CIQN" --initiator "$INI" \
		--chap smokeuser:smoke-secret-1 --mutual-chap smoketarget:smoke-secret-2 >"$work/cini.kv" &&
		[ -b "$(kvget "$work/cini.kv" ISCSI_DEV)" ] &&
		"$G/open-iscsi.sh" logout --portal "$CPORTAL" --iqn "$CIQN" --initiator "$INI"
}
check "CHAP: the right secrets log in (and out)" chap_good
chap_bad() {
	local rc=0
	"$G/open-iscsi.sh" login --portal "$CPORTAL" --iqn "$CIQN" --initiator "$INI" \
		--chap smokeuser:wrong-secret-000 --timeout 20 || rc=$?
	case $rc in
	3) ;; # refused by the target
	0)
		echo "login with a wrong secret succeeded"
		"$G/open-iscsi.sh" logout --portal "$CPORTAL" --iqn "$CIQN" --initiator "$INI"
		return 1
		;;
	*) echo "login with a wrong secret failed with status $rc, not refused (3)"; return 1 ;;
	esac
}
check "CHAP: a wrong secret is refused" chap_bad
"$G/lio-target.sh" --teardown --iqn "$CIQN" || echo "warning: CHAP target teardown failed"

lio_down() {
	"$G/lio-target.sh" --teardown --iqn "$IQN" && [ ! -d "/sys/kernel/config/target/iscsi/$IQN" ]
}
check "LIO target teardown" lio_down

# --- tgt over iSER: opt-in (SMOKE_TGT=1 with VM_MEM=2048), because tgtd pins a 1 GiB buffer pool
# and the tier's default guest has 1 GiB. Its iSER listener is fixed to port 3260, so LIO's went first.
[ "${SMOKE_TGT:-0}" = 1 ] || { echo "$passed passed, $failed failed"; [ "$failed" = 0 ]; exit; }
tgt_ok() {
	"$G/tgt-target.sh" --size-mib 32 >"$work/tgt.kv" || return 1
	cat "$work/tgt.kv"
	TIQN=$(kvget "$work/tgt.kv" TGT_IQN)
	TPORTAL=$(kvget "$work/tgt.kv" TGT_ISER_PORTAL)
	"$G/open-iscsi.sh" login --transport iser --portal "$TPORTAL" --iqn "$TIQN" --lun 1 >"$work/tini.kv" || return 1
	tdev=$(kvget "$work/tini.kv" ISCSI_DEV)
	head -c 4M "$work/pattern" >"$work/tpattern"
	dd if="$work/tpattern" of="$tdev" bs=1M oflag=direct conv=fsync status=none &&
		cmp "$work/tpattern" "$(kvget "$work/tgt.kv" TGT_FILE)" -n 4194304 &&
		"$G/open-iscsi.sh" logout --transport iser --portal "$TPORTAL" --iqn "$TIQN"
}
check "tgt iSER target: open-iscsi login, 4 MiB write lands in its file, logout" tgt_ok
"$G/tgt-target.sh" --teardown || echo "warning: tgt teardown failed"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
exit
}
