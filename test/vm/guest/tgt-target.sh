#!/usr/bin/env bash
# test/vm/guest/tgt-target.sh — inside the VM: run tgt (the userspace target, tgtd) with one
# file-backed LUN, reachable over iSER on soft-RoCE (--lld iser, the default) or iSCSI/TCP.
#
#   tgt-target.sh [--iqn IQN] [--tid N] [--size-mib N] [--file PATH] [--lld iser|iscsi]
#                 [--initiator IQN]... [--addr IP] [--tcp-port N]
#   tgt-target.sh --teardown                   stop tgtd (all its targets)
#
# Gotchas, both from Debian 12's tgt 1.0.85:
#  * its iSER login path refuses every initiator unless an initiator-NAME ACL names it (an
#    address ACL such as ALL is not enough; fixed upstream later). This script binds
#    --initiator-address ALL plus a name ACL for open-iscsi's initiator name and every --initiator
#    given, so pass the IQN your initiator logs in with.
#  * for iSER, tgtd allocates and registers (pins) a 1 GiB buffer pool (2048 x 512 KiB, fixed at
#    build time); in a 1 GiB guest that panics the kernel out of memory, so this script refuses to
#    start it with less than ~1.8 GiB of guest RAM: run the VM with VM_MEM=2048 or more.
#  * tgtd registers that pool on the first RDMA connection (~20 s under TCG); this script makes
#    one throw-away connection first, so a test's first login does not pay for it.
#  * tgtd's iSER listener is always port 3260 on every address (its `--iser port=` parser checks a
#    stale errno), so it cannot share a guest with LIO's iSER portal on 3260: move LIO
#    (lio-target.sh --port 3262) or tear it down first. Its TCP portal is put on --tcp-port (3261).
#
# Prints KEY=VALUE lines: TGT_IQN TGT_TID TGT_LUN (1; LUN 0 is tgt's controller) TGT_ADDR
# TGT_ISER_PORTAL TGT_TCP_PORTAL TGT_FILE TGT_SIZE_BYTES TGT_INITIATORS RDMA_DEV.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

iqn=iqn.2003-01.org.iserblk-vm:tgt1
tid=1
size_mib=64
file=
lld=iser
initiators=()
addr=
tcp_port=3261
teardown=0
while [ $# -gt 0 ]; do
	case "$1" in
	--iqn) iqn=$2; shift 2 ;;
	--tid) tid=$2; shift 2 ;;
	--size-mib) size_mib=$2; shift 2 ;;
	--file) file=$2; shift 2 ;;
	--lld) lld=$2; shift 2 ;;
	--initiator) initiators+=("$2"); shift 2 ;;
	--addr) addr=$2; shift 2 ;;
	--tcp-port) tcp_port=$2; shift 2 ;;
	--teardown) teardown=1; shift ;;
	*) die "unknown argument: $1 (see the header of $0)" ;;
	esac
done
require_vm
state=/run/iserblk-tgt
tgtd_up() { tgtadm --mode sys --op show >/dev/null 2>&1; }

if [ $teardown = 1 ]; then
	tgtd_up || exit 0
	pid=$(cat $state/tgtd.pid 2>/dev/null || true)
	tgtadm --mode sys --op delete --force >/dev/null 2>&1 || true
	if [ -n "$pid" ]; then
		# tgtd does not always leave on "sys delete"; unregistering its 1 GiB pool is slow under TCG
		kill -TERM "$pid" 2>/dev/null || true
		gone() { ! kill -0 "$pid" 2>/dev/null; }
		wait_until 20 "tgtd to exit on SIGTERM" gone || kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$state"
	exit 0
fi
case "$lld" in iser | iscsi) ;; *) die "--lld must be iser or iscsi" ;; esac
case "$size_mib" in '' | *[!0-9]*) die "--size-mib must be a number" ;; esac

rdma_dev=
rxe_vars=$("$here/rxe-up.sh" ${addr:+--addr "$addr"})
rdma_dev=$(sed -n 's/^RDMA_DEV=//p' <<<"$rxe_vars")
[ -n "$addr" ] || addr=$(sed -n 's/^RXE_ADDR=//p' <<<"$rxe_vars")
modprobe -a rdma_ucm ib_uverbs

if [ "$lld" = iser ]; then
	mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
	[ "$mem_kib" -ge 1800000 ] ||
		die "tgt's iSER target pins a 1 GiB buffer pool; this guest has $((mem_kib / 1024)) MiB: run with VM_MEM=2048"
fi
mkdir -p $state
if ! tgtd_up; then
	# tgtd reserves 1 GiB of virtual memory for its iSER buffer pool (no hugepages here); a small
	# guest refuses that under the default overcommit heuristic and every iSER login then times out
	sysctl -qw vm.overcommit_memory=1
	# -f: stay in the foreground (we background it) and log to our file, not syslog
	setsid tgtd -f --iscsi "portal=$addr:$tcp_port" >$state/tgtd.log 2>&1 </dev/null &
	echo $! >$state/tgtd.pid
	wait_until 30 "tgtd to answer tgtadm (log: $state/tgtd.log)" tgtd_up ||
		die "tgtd did not start: $(tail -5 $state/tgtd.log)"
fi

size_bytes=$((size_mib * 1024 * 1024))
if [ -z "$file" ]; then file=$state/tid$tid.img; fi
truncate -s "$size_bytes" "$file"

tgtadm --lld "$lld" --mode target --op new --tid "$tid" --targetname "$iqn"
tgtadm --lld "$lld" --mode logicalunit --op new --tid "$tid" --lun 1 --backing-store "$file" --bstype rdwr
tgtadm --lld "$lld" --mode target --op bind --tid "$tid" --initiator-address ALL
default_ini=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi 2>/dev/null || true)
names=()
[ -z "$default_ini" ] || names+=("$default_ini")
names+=("${initiators[@]}")
for ini in "${names[@]}"; do
	tgtadm --lld "$lld" --mode target --op bind --tid "$tid" --initiator-name "$ini"
done

if [ "$lld" = iser ]; then
	# the RDMA CM listener is tgtd's own; wait until the kernel shows it
	listening() { rdma res show cm_id 2>/dev/null | grep -q 'state LISTEN.*:3260'; }
	wait_until 20 "tgtd's iSER listener on port 3260" listening ||
		die "no iSER listener: $(tail -5 $state/tgtd.log)"
	# tgtd sets up an RDMA device (and registers its 1 GiB pool: ~20 s under TCG) on the first
	# connection to it, which made first logins with a 30 s deadline time out. Pay that here with
	# one throw-away RDMA CM connection (rping); tgtd drops it as a malformed login.
	if [ ! -e $state/warm ]; then
		if timeout 180 rping -c -a "$addr" -p 3260 -C 1 -S 100 >$state/rping.log 2>&1; then
			touch $state/warm
		else
			log "warning: warming tgtd's RDMA device with rping failed: $(tail -2 $state/rping.log)"
		fi
	fi
fi
tcp_listening() { ss -ltnH "sport = :$tcp_port" | grep -q .; }
wait_until 20 "tgtd's TCP portal $addr:$tcp_port" tcp_listening

log "tgt target $iqn tid $tid lun 1: ${size_mib} MiB file $file, lld $lld, initiators: ${names[*]}"
kv TGT_IQN "$iqn"
kv TGT_TID "$tid"
kv TGT_LUN 1
kv TGT_ADDR "$addr"
kv TGT_ISER_PORTAL "$addr:3260"
kv TGT_TCP_PORTAL "$addr:$tcp_port"
kv TGT_FILE "$file"
kv TGT_SIZE_BYTES "$size_bytes"
kv TGT_INITIATORS "${names[*]}"
kv RDMA_DEV "$rdma_dev"
exit
}
