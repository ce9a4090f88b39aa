#!/usr/bin/env bash
# test/vm/guest/lio-target.sh — inside the VM: configure a Linux-IO (LIO) iSCSI target through
# plain configfs writes (no targetcli): one LUN backed by RAM (rd_mcp), a file (fileio) or a block
# device (iblock), one portal serving iSCSI/TCP and, on the same ip:port, iSER over soft-RoCE; open
# (demo mode), or restricted to initiator ACLs; optional CHAP and mutual CHAP. This is the reference target the
# project's initiator is compared against.
#
#   lio-target.sh [options]
#   lio-target.sh --teardown [--iqn IQN]      remove that target (default: the default IQN) and
#                                             its backstore
#   lio-target.sh --teardown-all              remove every LIO iSCSI target and backstore (the
#                                             VM Go-test runner does this between packages)
#
# Options:
#   --iqn IQN              target name            (default iqn.2003-01.org.linux-iscsi.iserblk-vm:target1)
#   --backstore rd|file|block  RAM, file or block-device LUN (default rd); block is iblock: the
#                          device's own write cache, SYNCHRONIZE CACHE a flush of it
#   --size-mib N           LUN size               (default 64)
#   --file PATH            fileio backing file    (default /run/iserblk-lio/<name>.img, sparse);
#                          with --backstore block the device (--size-mib is then its size)
#   --block-size N         logical block size 512|4096 (default: the backstore's, 512)
#   --addr IP              portal address         (default: rxe-up.sh's address, 192.168.77.1)
#   --port N               portal port            (default 3260)
#   --no-iser              TCP only (no soft-RoCE needed)
#   --acl INITIATOR_IQN    allow only this initiator (repeatable); without --acl any initiator may
#                          log in (generate_node_acls=1)
#   --chap USER:SECRET     require CHAP (initiator authenticates to the target): set on each ACL,
#                          or on the TPG when there are no ACLs
#   --mutual-chap USER:SECRET  mutual CHAP: the target's name and secret for the initiator to check
#   --write-protect        the LUN is read-only to initiators
#
# Prints KEY=VALUE lines: LIO_IQN LIO_ADDR LIO_PORT LIO_PORTAL LIO_LUN LIO_SIZE_BYTES
# LIO_BLOCK_SIZE LIO_ISER (1|0) LIO_BACKSTORE (configfs dir) [LIO_FILE] [RDMA_DEV] [LIO_ACLS].
# Secrets are never printed.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

iqn=iqn.2003-01.org.linux-iscsi.iserblk-vm:target1
backstore=rd
size_mib=64
file=
block_size=
addr=
port=3260
iser=1
acls=()
chap=
mutual=
write_protect=0
teardown=0
while [ $# -gt 0 ]; do
	case "$1" in
	--iqn) iqn=$2; shift 2 ;;
	--backstore) backstore=$2; shift 2 ;;
	--size-mib) size_mib=$2; shift 2 ;;
	--file) file=$2; shift 2 ;;
	--block-size) block_size=$2; shift 2 ;;
	--addr) addr=$2; shift 2 ;;
	--port) port=$2; shift 2 ;;
	--no-iser) iser=0; shift ;;
	--acl) acls+=("$2"); shift 2 ;;
	--chap) chap=$2; shift 2 ;;
	--mutual-chap) mutual=$2; shift 2 ;;
	--write-protect) write_protect=1; shift ;;
	--teardown) teardown=1; shift ;;
	--teardown-all) teardown=2; shift ;;
	*) die "unknown argument: $1 (see the header of $0)" ;;
	esac
done
require_vm

CFS=/sys/kernel/config/target
fabric=$CFS/iscsi/$iqn
TPG=$fabric/tpgt_1
# backstore object name: the IQN's last part, made configfs-safe
name=$(printf '%s' "${iqn##*:}" | tr -c 'A-Za-z0-9_-' '_')
case "$backstore" in
rd) hba=$CFS/core/rd_mcp_1 ;;
file) hba=$CFS/core/fileio_1 ;;
block) hba=$CFS/core/iblock_1 ;;
*) die "--backstore must be rd, file or block" ;;
esac
BS=$hba/$name

# remove_tpg TPG_DIR: disable it, then remove ACLs, LUNs, portals and the TPG, innermost first
remove_tpg() {
	local tpg=$1 d
	echo 0 >"$tpg/enable" 2>/dev/null || true
	for d in "$tpg"/acls/*/; do
		[ -d "$d" ] || continue
		find "$d" -mindepth 2 -maxdepth 2 -type l -path '*/lun_*/*' -exec rm -f {} +
		rmdir "$d"lun_* 2>/dev/null || true
		rmdir "$d"
	done
	for d in "$tpg"/lun/lun_*/; do
		[ -d "$d" ] || continue
		find "$d" -maxdepth 1 -type l -exec rm -f {} +
		rmdir "$d"
	done
	rmdir "$tpg"/np/* 2>/dev/null || true
	rmdir "$tpg"
}

remove_target() { # FABRIC_DIR (…/iscsi/IQN)
	local fabric=$1 tpg
	[ -d "$fabric" ] || return 0
	for tpg in "$fabric"/tpgt_*; do
		[ -d "$tpg" ] && remove_tpg "$tpg"
	done
	rmdir "$fabric"
}

if [ $teardown = 2 ]; then
	[ -d $CFS/iscsi ] || exit 0
	for f in "$CFS"/iscsi/*; do
		case "${f##*/}" in iqn.* | eui.* | naa.*) log "removing target ${f##*/}"; remove_target "$f" ;; esac
	done
	# backstore objects (HBA dirs are TYPE_N; an object has an enable attribute), then the HBAs
	for o in "$CFS"/core/*_[0-9]*/*/; do
		[ -e "$o/enable" ] || continue
		log "removing backstore ${o%/}"
		rmdir "$o"
	done
	rmdir "$CFS"/core/*_[0-9]* 2>/dev/null || true
	rm -rf /run/iserblk-lio
	exit 0
fi
if [ $teardown = 1 ]; then
	[ -d $CFS ] || exit 0
	remove_target "$fabric"
	# backstores of this name (either kind); files we created go too
	for d in "$CFS"/core/rd_mcp_1/"$name" "$CFS"/core/fileio_1/"$name" "$CFS"/core/iblock_1/"$name"; do
		[ -d "$d" ] || continue
		rmdir "$d"
	done
	rm -f "/run/iserblk-lio/$name.img"
	exit 0
fi

case "$size_mib" in '' | *[!0-9]*) die "--size-mib must be a number" ;; esac
[ -z "$block_size" ] || [ "$block_size" = 512 ] || [ "$block_size" = 4096 ] ||
	die "--block-size must be 512 or 4096"
[ -d "$TPG" ] && die "target $iqn exists already (use --teardown first)"

# 1. modules: LIO core, the iSCSI fabric, iSER (ib_isert) and the backstores
modprobe -a configfs target_core_mod iscsi_target_mod target_core_file
[ "$backstore" != block ] || modprobe target_core_iblock
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
if [ $iser = 1 ]; then
	modprobe ib_isert
	rxe_vars=$("$here/rxe-up.sh" ${addr:+--addr "$addr"})
	rdma_dev=$(sed -n 's/^RDMA_DEV=//p' <<<"$rxe_vars")
	[ -n "$addr" ] || addr=$(sed -n 's/^RXE_ADDR=//p' <<<"$rxe_vars")
fi
if [ -z "$addr" ]; then
	# TCP only and no address given: use the same dummy netdev address as rxe-up.sh would
	addr=192.168.77.1
	modprobe dummy
	ip link show rxedum0 >/dev/null 2>&1 || ip link add rxedum0 type dummy
	ip -4 addr show dev rxedum0 | grep -qw "inet $addr" || ip addr add "$addr/24" dev rxedum0
	ip link set rxedum0 up
fi

# 2. backstore
size_bytes=$((size_mib * 1024 * 1024))
mkdir -p "$BS"
case "$backstore" in
rd)
	echo "rd_pages=$((size_bytes / $(getconf PAGESIZE)))" >"$BS/control"
	;;
file)
	if [ -z "$file" ]; then
		mkdir -p /run/iserblk-lio
		file=/run/iserblk-lio/$name.img
	fi
	truncate -s "$size_bytes" "$file"
	echo "fd_dev_name=$file,fd_dev_size=$size_bytes" >"$BS/control"
	;;
block)
	[ -b "$file" ] || die "--backstore block needs --file BLOCK_DEVICE"
	size_bytes=$(blockdev --getsize64 "$file")
	size_mib=$((size_bytes >> 20))
	echo "udev_path=$file" >"$BS/control"
	;;
esac
echo "iserblk-$name" >"$BS/wwn/vpd_unit_serial"
echo 1 >"$BS/enable"
if [ -n "$block_size" ]; then echo "$block_size" >"$BS/attrib/block_size"; fi
block_size=$(cat "$BS/attrib/block_size")
# let initiators see a volatile write cache, so SYNCHRONIZE CACHE and FUA are meaningful
echo 1 >"$BS/attrib/emulate_write_cache" 2>/dev/null || true

# 3. target, TPG 1, LUN 0 -> backstore, portal ip:port (TCP) with iSER on the same ip:port
mkdir -p "$TPG/lun/lun_0"
ln -s "$BS" "$TPG/lun/lun_0/$name"
NP=$TPG/np/$addr:$port
mkdir "$NP" || die "cannot listen on $addr:$port (in use?)"
if [ $iser = 1 ]; then
	echo 1 >"$NP/iser" || die "cannot enable iSER on $addr:$port"
fi

# 4. access: ACLs or demo mode; CHAP on the ACLs or on the TPG
set_auth() { # DIR: the auth directory of an ACL or of the TPG
	local dir=$1
	if [ -n "$chap" ]; then
		# printf, not echo: these attributes keep a trailing newline as part of the value
		printf '%s' "${chap%%:*}" >"$dir/userid"
		printf '%s' "${chap#*:}" >"$dir/password"
	fi
	if [ -n "$mutual" ]; then
		printf '%s' "${mutual%%:*}" >"$dir/userid_mutual"
		printf '%s' "${mutual#*:}" >"$dir/password_mutual"
	fi
}
[ -z "$mutual" ] || [ -n "$chap" ] || die "--mutual-chap needs --chap"
if [ -n "$chap" ]; then
	case "$chap" in *:?*) ;; *) die "--chap takes USER:SECRET" ;; esac
	echo 1 >"$TPG/attrib/authentication"
else
	echo 0 >"$TPG/attrib/authentication"
fi
if [ ${#acls[@]} -gt 0 ]; then
	echo 0 >"$TPG/attrib/generate_node_acls"
	for ini in "${acls[@]}"; do
		A=$TPG/acls/$ini
		mkdir "$A"
		mkdir "$A/lun_0"
		ln -s "$TPG/lun/lun_0" "$A/lun_0/mapped_lun"
		echo "$write_protect" >"$A/lun_0/write_protect"
		set_auth "$A/auth"
	done
else
	echo 1 >"$TPG/attrib/generate_node_acls"
	echo 1 >"$TPG/attrib/cache_dynamic_acls"
	echo "$write_protect" >"$TPG/attrib/demo_mode_write_protect"
	set_auth "$TPG/auth"
fi
echo 1 >"$TPG/enable"

log "target $iqn lun 0: $backstore ${size_mib} MiB, block $block_size, portal $addr:$port, iser=$iser${chap:+, CHAP}${mutual:+ + mutual}${acls[*]:+, ACLs: ${acls[*]}}"
kv LIO_IQN "$iqn"
kv LIO_ADDR "$addr"
kv LIO_PORT "$port"
kv LIO_PORTAL "$addr:$port"
kv LIO_LUN 0
kv LIO_SIZE_BYTES "$size_bytes"
kv LIO_BLOCK_SIZE "$block_size"
kv LIO_ISER "$iser"
kv LIO_BACKSTORE "$BS"
if [ "$backstore" = file ]; then kv LIO_FILE "$file"; fi
if [ $iser = 1 ]; then kv RDMA_DEV "$rdma_dev"; fi
if [ ${#acls[@]} -gt 0 ]; then kv LIO_ACLS "${acls[*]}"; fi
exit
}
