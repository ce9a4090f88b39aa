#!/usr/bin/env bash
# test/vm/guest/open-iscsi.sh — inside the VM: drive Linux's own iSCSI initiator (open-iscsi +
# the kernel's iscsi_tcp / ib_iser) against a target, as the reference the project's initiator is
# compared with. There is no systemd or udev in the guest, so this starts iscsid itself and loads
# sd_mod (nothing would autoload it), then waits for the SCSI scan to attach the disk.
#
#   open-iscsi.sh name                           print ISCSI_INITIATOR=<this host's initiator IQN>
#   open-iscsi.sh login  --portal IP:PORT --iqn IQN [--transport tcp|iser] [--lun N]
#                        [--initiator IQN] [--chap USER:SECRET] [--mutual-chap USER:SECRET]
#                        [--timeout SECONDS]
#       prints ISCSI_DEV=/dev/sdX ISCSI_SID=N ISCSI_TRANSPORT=tcp|iser ISCSI_IFACE=NAME
#   open-iscsi.sh logout --portal IP:PORT --iqn IQN [--transport tcp|iser] [--initiator IQN]
#       logs out and deletes the node record; succeeds when there was no session
#
# --initiator logs in under another initiator name (an open-iscsi iface with iface.initiatorname),
# so ACL tests need not touch /etc/iscsi. --chap / --mutual-chap set the node's CHAP settings
# (node.session.auth.*). A login the target refuses (iscsiadm's exit status 24: an authentication
# or authorization failure) exits 3; one whose login request got no answer (iscsiadm's 11, "iSCSI
# PDU timed out": LIO over iSER may drop the connection instead of sending its refusal) exits 4;
# any other failure exits 1. All put iscsiadm's message on stderr. Every iscsiadm call that needs
# iscsid is bounded (--login by --timeout, default 60 s): one that does not return (iscsid not
# answering) fails with iscsid's state and the kernel's last lines on stderr, not a hang.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
# a failing command exits 1, never with its own status (-E: in functions too): iscsiadm's 3 and 4
# (NOMEM, TRANS) would read as our refused and unanswered
set -Eeuo pipefail
trap 'exit 1' ERR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cmd=${1:-}
[ $# -gt 0 ] && shift
portal=
iqn=
transport=tcp
lun=0
initiator=
chap=
mutual=
timeout=60
while [ $# -gt 0 ]; do
	case "$1" in
	--portal) portal=$2; shift 2 ;;
	--iqn) iqn=$2; shift 2 ;;
	--transport) transport=$2; shift 2 ;;
	--lun) lun=$2; shift 2 ;;
	--initiator) initiator=$2; shift 2 ;;
	--chap) chap=$2; shift 2 ;;
	--mutual-chap) mutual=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm

default_initiator() { sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi; }

start_iscsid() {
	modprobe -a iscsi_tcp ib_iser sd_mod
	mkdir -p /run/lock/iscsi /var/lib/iscsi /etc/iscsi/nodes /etc/iscsi/send_targets
	if ! iscsiadm -m session >/dev/null 2>&1 && ! pgrep -x iscsid >/dev/null; then
		# daemonizes; iscsiadm talks to it over its abstract unix socket. Its stdio goes to a file so
		# the daemon never holds our caller's pipes open (a Go exec.Cmd would wait for them).
		iscsid </dev/null >>/run/iserblk-iscsid.log 2>&1
	fi
	# ready when iscsiadm can reach it ("No active sessions" exits 21, which is fine)
	iscsid_up() {
		local rc=0
		iscsiadm -m session >/dev/null 2>&1 || rc=$?
		[ $rc = 0 ] || [ $rc = 21 ]
	}
	wait_until 20 "iscsid to answer" iscsid_up
}

# diagnose_iscsid logs what iscsid is doing when it does not answer: where it waits in the kernel,
# and the kernel's last lines (an iSCSI or iSER connection teardown that does not finish shows there).
# (iscsid runs as two processes, its logger and the daemon: both are shown.)
diagnose_iscsid() {
	local pids pid
	pids=$(pgrep -x iscsid) || log "iscsid is not running"
	for pid in $pids; do
		log "iscsid pid $pid: state $(ps -o stat=,wchan:40= -p "$pid" 2>/dev/null)"
		log "iscsid pid $pid kernel stack: $(tr '\n' ';' <"/proc/$pid/stack" 2>/dev/null)"
	done
	log "sessions: $(timeout 5 iscsiadm -m session 2>&1 | tr '\n' ';')"
	log "kernel: $(dmesg | tail -n 25 | tr '\n' ';')"
}

iface_name() {
	local n=iserblk-$transport
	if [ -n "$initiator" ]; then n=$n-$(printf '%s' "$initiator" | cksum | cut -d' ' -f1); fi
	echo "$n"
}

ensure_iface() {
	local ifc=$1
	if ! iscsiadm -m iface -I "$ifc" >/dev/null 2>&1; then
		iscsiadm -m iface -I "$ifc" -o new >/dev/null
	fi
	iscsiadm -m iface -I "$ifc" -o update -n iface.transport_name -v "$transport" >/dev/null
	if [ -n "$initiator" ]; then
		iscsiadm -m iface -I "$ifc" -o update -n iface.initiatorname -v "$initiator" >/dev/null
	fi
}

# the session id and attached disk of our session (matched by target, portal and iface)
session_info() {
	iscsiadm -m session -P 3 2>/dev/null | awk -v iqn="$iqn" -v portal="$portal" -v ifc="$1" -v lun="$lun" '
		/^Target: / { t = $2 }
		/Current Portal: / { p = $3; sub(/,.*/, "", p) }
		/Iface Name: / { i = $3 }
		/SID: / { sid = $2 }
		/scsi[0-9]+ Channel [0-9]+ Id [0-9]+ Lun: / { l = $NF }
		/Attached scsi disk / {
			if (t == iqn && p == portal && i == ifc && l == lun) { print sid, $4; exit }
		}'
}

# the session id of our session, whether or not a disk is attached
session_sid() {
	iscsiadm -m session -P 1 2>/dev/null | awk -v iqn="$iqn" -v portal="$portal" -v ifc="$1" '
		/^Target: / { t = $2 }
		/Current Portal: / { p = $3; sub(/,.*/, "", p) }
		/Iface Name: / { i = $3 }
		/SID: / { if (t == iqn && p == portal && i == ifc) { print $2; exit } }'
}

case "$cmd" in
name)
	kv ISCSI_INITIATOR "$(default_initiator)"
	;;
login)
	[ -n "$portal" ] && [ -n "$iqn" ] || die "login needs --portal and --iqn"
	case "$transport" in tcp | iser) ;; *) die "--transport must be tcp or iser" ;; esac
	case "$portal" in *:*) ;; *) portal=$portal:3260 ;; esac
	start_iscsid
	ifc=$(iface_name)
	ensure_iface "$ifc"
	# a node record per (target, portal, iface); no discovery, so CHAP-protected discovery and a
	# duplicate record (which makes the second login fail with "session exists") cannot get in the way
	iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" -o new >/dev/null
	set_node() { iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" -o update -n "$1" -v "$2" >/dev/null; }
	if [ -n "$chap" ]; then
		set_node node.session.auth.authmethod CHAP
		set_node node.session.auth.username "${chap%%:*}"
		set_node node.session.auth.password "${chap#*:}"
	fi
	if [ -n "$mutual" ]; then
		set_node node.session.auth.username_in "${mutual%%:*}"
		set_node node.session.auth.password_in "${mutual#*:}"
	fi
	# fail fast in tests instead of open-iscsi's 120 s of retries
	set_node node.session.initial_login_retry_max 1
	set_node node.conn[0].timeo.login_timeout 15
	rc=0
	out=$(timeout -k 5 "$timeout" iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" --login 2>&1) || rc=$?
	if [ $rc != 0 ]; then
		case $rc in
		24) log "login to $iqn at $portal over $transport refused: $out" ;;
		11) log "login to $iqn at $portal over $transport got no answer: $out" ;;
		124 | 137)
			log "iscsiadm --login to $iqn at $portal did not return within ${timeout}s: $out"
			diagnose_iscsid
			# iscsid may still finish the login it was asked for: undo it (bounded too)
			timeout -k 5 30 iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" --logout >/dev/null 2>&1 || true
			;;
		*) log "login to $iqn at $portal over $transport failed (iscsiadm exit $rc): $out" ;;
		esac
		timeout -k 5 30 iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" -o delete >/dev/null 2>&1 || true
		case $rc in 24) exit 3 ;; 11) exit 4 ;; *) exit 1 ;; esac
	fi
	attached() {
		info=$(session_info "$ifc")
		[ -n "$info" ] && [ -b "/dev/${info#* }" ]
	}
	wait_until "$timeout" "the SCSI scan to attach LUN $lun of $iqn" attached ||
		die "logged in but no disk: $(iscsiadm -m session -P 3 2>&1 | tail -20)"
	kv ISCSI_DEV "/dev/${info#* }"
	kv ISCSI_SID "${info%% *}"
	kv ISCSI_TRANSPORT "$transport"
	kv ISCSI_IFACE "$ifc"
	;;
logout)
	[ -n "$portal" ] && [ -n "$iqn" ] || die "logout needs --portal and --iqn"
	case "$portal" in *:*) ;; *) portal=$portal:3260 ;; esac
	ifc=$(iface_name)
	timeout -k 5 60 iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" --logout >/dev/null 2>&1 || true
	timeout -k 5 30 iscsiadm -m node -T "$iqn" -p "$portal" -I "$ifc" -o delete >/dev/null 2>&1 || true
	gone() { [ -z "$(session_sid "$ifc")" ]; }
	wait_until 30 "the session to $iqn to end" gone
	;;
*)
	die "usage: open-iscsi.sh name|login|logout [options] (see the header of $0)"
	;;
esac
exit
}
