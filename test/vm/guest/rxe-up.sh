#!/usr/bin/env bash
# test/vm/guest/rxe-up.sh — inside the VM: bring up a soft-RoCE device (rdma_rxe) on a dummy netdev
# and wait, by polling the port state, until it is ACTIVE. Idempotent: a second call reuses what
# exists. rxe loops traffic to its own address back internally, so one dummy netdev is enough for
# an RDMA target and initiator in the same guest. The guest has no NIC (run.sh passes -nic none):
# the address exists only inside the VM.
#
#   rxe-up.sh [--netdev NAME] [--addr IP/PREFIX] [--dev RXE] [--timeout SECONDS]
#   rxe-up.sh --teardown [--netdev NAME] [--dev RXE]
#
# Defaults: --netdev rxedum0 --addr 192.168.77.1/24 --dev rxe0 --timeout 30.
# Prints: RDMA_DEV=rxe0 RDMA_PORT=1 RXE_NETDEV=rxedum0 RXE_ADDR=192.168.77.1
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

netdev=rxedum0
addr=192.168.77.1/24
dev=rxe0
timeout=30
teardown=0
while [ $# -gt 0 ]; do
	case "$1" in
	--netdev) netdev=$2; shift 2 ;;
	--addr) addr=$2; shift 2 ;;
	--dev) dev=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--teardown) teardown=1; shift ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm
case "$addr" in */*) ;; *) addr=$addr/24 ;; esac
ip=${addr%/*}

if [ $teardown = 1 ]; then
	rdma link delete "$dev" 2>/dev/null || true
	if [ "$(cat "/sys/class/net/$netdev/type" 2>/dev/null)" != "" ] &&
		ip -d link show "$netdev" 2>/dev/null | grep -qw dummy; then
		ip link del "$netdev"
	fi
	exit 0
fi

# rdma_ucm + ib_uverbs give userspace /dev/infiniband/{rdma_cm,uverbsN}
modprobe -a rdma_rxe rdma_ucm ib_uverbs dummy

if ! ip link show "$netdev" >/dev/null 2>&1; then
	ip link add "$netdev" type dummy
fi
ip -4 addr show dev "$netdev" | grep -qw "inet $ip" || ip addr add "$addr" dev "$netdev"
ip link set "$netdev" up

if [ ! -d "/sys/class/infiniband/$dev" ]; then
	rdma link add "$dev" type rxe netdev "$netdev"
fi

port_active() { grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null; }
wait_until "$timeout" "$dev port 1 to become ACTIVE" port_active ||
	die "$dev state: $(cat "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null || echo missing)"
have_nodes() { [ -c /dev/infiniband/rdma_cm ] && ls /dev/infiniband/uverbs* >/dev/null 2>&1; }
wait_until "$timeout" "/dev/infiniband/rdma_cm and uverbs nodes" have_nodes

log "$(rdma link show "$dev/1")"
kv RDMA_DEV "$dev"
kv RDMA_PORT 1
kv RXE_NETDEV "$netdev"
kv RXE_ADDR "$ip"
exit
}
