#!/usr/bin/env bash
# test/vm/guest/modules.sh — inside the VM: load kernel modules on demand and wait for the device
# nodes they create. The guest has no udev, so device drivers are not autoloaded (filesystems and
# protocols are, through the kernel's modprobe helper).
#
#   modules.sh NAME...
#
#   nbd      nbd with nbds_max=$NBDS_MAX (16)      prints NBD_DEV=/dev/nbd0 NBDS_MAX=N
#   ublk     ublk_drv                               prints UBLK_CONTROL=/dev/ublk-control
#   brd      brd, rd_nr=1 rd_size=$BRD_SIZE_KIB (65536)   prints BRD_DEV=/dev/ram0
#   sd       sd_mod (disks of SCSI/iSCSI sessions)
#   rdma     rdma_rxe rdma_ucm ib_uverbs (soft-RoCE; see rxe-up.sh for the device)
#   lio      configfs, the LIO core, iSCSI fabric, iSER target, file/RAM backstores
#   iscsi    the initiator side: iscsi_tcp ib_iser sd_mod
#   any other word is passed to modprobe as a module name (ublk_drv, sd_mod, ... work too)
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_vm
[ $# -gt 0 ] || die "usage: modules.sh NAME... (see the header of $0)"

node_is() { test "$1" "$2"; } # node_is -b /dev/nbd0
for name in "$@"; do
	case "$name" in
	nbd)
		n=${NBDS_MAX:-16}
		modprobe nbd nbds_max="$n"
		wait_until 10 /dev/nbd0 node_is -b /dev/nbd0
		kv NBD_DEV /dev/nbd0
		kv NBDS_MAX "$(cat /sys/module/nbd/parameters/nbds_max)"
		;;
	ublk | ublk_drv)
		modprobe ublk_drv
		wait_until 10 /dev/ublk-control node_is -c /dev/ublk-control
		kv UBLK_CONTROL /dev/ublk-control
		;;
	brd)
		modprobe brd rd_nr=1 rd_size="${BRD_SIZE_KIB:-65536}"
		wait_until 10 /dev/ram0 node_is -b /dev/ram0
		kv BRD_DEV /dev/ram0
		;;
	sd | sd_mod) modprobe sd_mod ;;
	rdma) modprobe -a rdma_rxe rdma_ucm ib_uverbs ;;
	lio)
		modprobe -a configfs target_core_mod iscsi_target_mod ib_isert target_core_file target_core_iblock
		mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
		;;
	iscsi) modprobe -a iscsi_tcp ib_iser sd_mod ;;
	*) modprobe "$name" ;;
	esac
	log "loaded $name"
done
exit
}
