#!/usr/bin/env bash
# test/vm/run.sh — run one command as root inside a throw-away QEMU (TCG) guest that boots Debian's
# 6.12 kernel on top of THIS host's userland, and exit with the command's status.
#
#   test/vm/run.sh [--] CMD [ARGS...]          run CMD in the guest (cwd = the caller's cwd)
#   test/vm/run.sh go-test [PKG...] [-- FLAGS] build vm-tagged Go tests on the host, run them in
#                                              one guest (see test/vm/gotest.sh)
#
# Why this shape: the host kernel has no modules, nbd, ublk, RDMA or LIO, so those paths need a
# guest kernel; the host has no /dev/kvm, so QEMU emulates (TCG). The guest mounts the host's root
# read-only over 9p with a tmpfs overlay (every host tool and every binary built on the host runs
# inside, the project tree is at the same path), so nothing needs installing into an image.
#
# Exit status: the command's own status; 124 = the guest did not finish within VM_TIMEOUT and was
# killed; 125 = the VM itself failed (boot, mounts, QEMU) — both with a "run.sh:" line on stderr.
# A guest that dies before the command starts is booted again (VM_BOOTS), said on stderr.
# stdout and stderr of the command arrive merged on our stdout through the serial console.
#
# Environment (all optional):
#   VM_TIMEOUT   seconds each boot of the guest may live (boot included) default 1200
#   VM_CACHE     cache for the kernel .deb, its unpacked tree, initramfs default /var/tmp/iser-blk-vm
#   VM_MEM       guest RAM in MiB                                       default 1024
#   VM_SMP       guest vCPUs                                            default 2
#   VM_RESULTS   host dir shared read-write at the same path (ISERBLK_VM_RESULTS in the guest);
#                default: a fresh directory per run, removed afterwards unless the run failed
#   VM_RW        more host dirs shared read-write, ':'-separated
#   VM_ENV       names of more variables to pass into the guest (space-separated)
#   VM_DISKS     host files attached as virtio disks, ':'-separated; in the guest they are
#                /dev/disk/by-id/virtio-iserblk-disk1, -disk2, ... (the order given; no udev, so
#                run.sh makes those links) — a local SSD for the guest, or storage that survives
#                a killed guest (the host file keeps every write QEMU was handed)
#   VM_KERNEL_PKG Debian kernel package                                 default linux-image-6.12-amd64
#   VM_TB_MB     TCG translation cache MiB (QEMU's own default, 1 GiB, shows up as host RSS)  256
#   VM_RUN_ID    a name for this VM (QEMU's -name; lets a caller find its own QEMU with pgrep -f)
#   VM_VERBOSE   1 = show kernel messages on the console
#   VM_KERNEL_ARGS guest kernel arguments added to ours; replaces the default, empty = none   default mitigations=off
#   VM_BOOTS     boots tried when the guest dies before the command starts      default 3
#   VM_SELFTEST_FAIL_BOOTS  selftest.sh only: init fails the first N boots on purpose    default 0
#   VM_INIT      bash (default): the command runs under bash as PID 1, no udev, no systemd;
#                systemd: the host's /lib/systemd/systemd (252) boots as PID 1 to a target that
#                runs the command as the service iserblk-vm-job (stdout on the console), so the
#                command can use systemctl and journalctl; udev, timers and the host's own
#                daemons (iscsid, open-iscsi, tgt, timesyncd) are masked
# In the guest: ISERBLK_IN_VM=1, ISERBLK_VM_GUEST_DIR (the guest helper scripts),
# ISERBLK_VM_RESULTS, ISERBLK_ROOT (the module root), ISERBLK_BIN if set on the host.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)

usage() { sed -n '2,7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
case "${1:-}" in
go-test) shift; exec "$here/gotest.sh" "$@" ;;
-h | --help) usage; exit 0 ;;
--) shift ;;
esac
[ $# -gt 0 ] || { usage >&2; exit 2; }

VM_TIMEOUT=${VM_TIMEOUT:-1200}
VM_CACHE=${VM_CACHE:-/var/tmp/iser-blk-vm}
VM_MEM=${VM_MEM:-1024}
VM_SMP=${VM_SMP:-2}
VM_RW=${VM_RW:-}
VM_ENV=${VM_ENV:-}
VM_KERNEL_PKG=${VM_KERNEL_PKG:-linux-image-6.12-amd64}
VM_TB_MB=${VM_TB_MB:-256}
VM_VERBOSE=${VM_VERBOSE:-0}
VM_INIT=${VM_INIT:-bash}

log() { echo "run.sh: $*" >&2; }
die() { log "VM failure: $*"; exit 125; }
case "$VM_TIMEOUT" in '' | *[!0-9]*) die "VM_TIMEOUT must be a number of seconds" ;; esac
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, 9p export of /)"
case "$VM_INIT" in
bash) ;;
systemd) [ -x /lib/systemd/systemd ] || die "VM_INIT=systemd: no /lib/systemd/systemd on this host (package systemd)" ;;
*) die "VM_INIT must be bash or systemd" ;;
esac

# Host packages: QEMU and the initramfs tools, plus everything the guest helpers run (the guest
# uses the host's userland, so this is how tools get into the guest).
host_pkgs=(qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 util-linux
	open-iscsi rdma-core ibverbs-providers ibverbs-utils rdmacm-utils
	e2fsprogs fio nbd-client nbdkit tgt)

mkdir -p "$VM_CACHE/debs" "$VM_CACHE/kernels" "$VM_CACHE/jobs"

# --- prepare (serialised between concurrent runs; everything after it runs in parallel) --------
exec 9>"$VM_CACHE/.prepare.lock"
flock -w 1200 9 || die "waited 20 min for $VM_CACHE/.prepare.lock"

apt_updated=0
apt_update() {
	[ $apt_updated = 1 ] && return 0
	apt-get update -qq >&2 || log "apt-get update failed (continuing with the lists we have)"
	apt_updated=1
}
missing=()
for p in "${host_pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# busybox must be the static one: it runs from the initramfs, without the host's libraries
if [ -x /bin/busybox ] && ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		-o DPkg::Lock::Timeout=300 "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
fi

# Kernel: resolve the meta package once (apt-cache costs ~1 s), download the .deb, unpack it with
# dpkg-deb -x — never installed on the host — and build modules.dep (dpkg-deb runs no postinst).
resolved_file=$VM_CACHE/kernels/$VM_KERNEL_PKG.resolved
pkg=$(cat "$resolved_file" 2>/dev/null || true)
if [ -z "$pkg" ] || [ ! -e "$VM_CACHE/kernels/$pkg/.ready" ]; then
	resolve() {
		local p=$1 dep
		for _ in 1 2 3; do
			dep=$(apt-cache depends "$p" 2>/dev/null |
				awk '$1=="Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
			[ -n "$dep" ] || break
			p=$dep
		done
		echo "$p"
	}
	pkg=$(resolve "$VM_KERNEL_PKG")
	if [ "$pkg" = "$VM_KERNEL_PKG" ] && ! apt-cache show "$pkg" >/dev/null 2>&1; then
		apt_update
		pkg=$(resolve "$VM_KERNEL_PKG")
	fi
	echo "$pkg" >"$resolved_file"
fi
kroot=$VM_CACHE/kernels/$pkg
if [ ! -e "$kroot/.ready" ]; then
	deb=$(ls "$VM_CACHE/debs/${pkg}_"*.deb 2>/dev/null | head -1 || true)
	if [ -z "$deb" ]; then
		log "downloading $pkg"
		(cd "$VM_CACHE/debs" && { apt-get download -q "$pkg" >&2 ||
			{ apt_update && apt-get download -q "$pkg" >&2; }; }) || die "cannot download $pkg"
		deb=$(ls "$VM_CACHE/debs/${pkg}_"*.deb | head -1)
	fi
	log "unpacking $(basename "$deb")"
	rm -rf "$kroot"
	mkdir -p "$kroot"
	dpkg-deb -x "$deb" "$kroot" || die "dpkg-deb -x $deb"
	kv=$(ls "$kroot/lib/modules")
	depmod -b "$kroot" "$kv" || die "depmod"
	touch "$kroot/.ready"
fi
kv=$(ls "$kroot/lib/modules")
vmlinuz=$kroot/boot/vmlinuz-$kv
[ -r "$vmlinuz" ] || die "no kernel image $vmlinuz"

# Initramfs: static busybox, the modules that 9p and overlay need (decompressed, for busybox
# insmod), and init.sh as /init. Named by the checksum of what goes in, so a run from another
# checkout (another init.sh) builds its own file instead of replacing this one under a guest
# that is about to boot (again) from it.
initrd_mods=(virtio_pci 9pnet_virtio 9p overlay)
want_sum=$( { cat "$here/init.sh"; echo "${initrd_mods[*]}"; sha256sum /bin/busybox; } | sha256sum | cut -c1-16)
initrd=$kroot/initrd-iserblk-$want_sum.cpio.gz
if [ ! -e "$initrd" ]; then
	log "building initramfs for $kv"
	t=$(mktemp -d "$VM_CACHE/initrd.XXXXXX")
	mkdir -p "$t"/{bin,dev,proc,sys,lower,rw,newroot,mods}
	cp /bin/busybox "$t/bin/busybox"
	for m in "${initrd_mods[@]}"; do
		modprobe -d "$kroot" -S "$kv" --show-depends "$m" || die "module $m not in $pkg"
	done | awk '$1=="insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
		name=$(basename "$ko")
		name=${name%.xz}; name=${name%.zst}; name=${name%.gz}
		case "$ko" in
		*.xz) xz -dc "$ko" >"$t/mods/$name" ;;
		*.zst) zstd -dcq "$ko" >"$t/mods/$name" ;;
		*.gz) gzip -dc "$ko" >"$t/mods/$name" ;;
		*) cp "$ko" "$t/mods/$name" ;;
		esac
		echo "$name" >>"$t/mods/order"
	done
	install -m 755 "$here/init.sh" "$t/init"
	(cd "$t" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.tmp"
	mv "$initrd.tmp" "$initrd"
	# other checkouts' images, unused for a day
	find "$kroot" -maxdepth 1 -name 'initrd-iserblk*.cpio.gz' ! -name "$(basename "$initrd")" -mtime +0 -delete 2>/dev/null || true
	rm -rf "$t"
fi
touch "$initrd" # its mtime says when it was last used (the clean-up above)
exec 9>&- # release the prepare lock (and keep it away from QEMU)

# runs killed with SIGKILL cannot clean up after themselves: drop their leftovers after a day
find "$VM_CACHE/jobs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true

# --- the job: environment, cwd, the command quoted for bash -----------------------------------
job=$(mktemp -d "$VM_CACHE/jobs/job.XXXXXX")
run_id=${VM_RUN_ID:-iserblk-vm-$(basename "$job")}
own_results=0
if [ -z "${VM_RESULTS:-}" ]; then
	VM_RESULTS=$(mktemp -d "$VM_CACHE/jobs/results.XXXXXX")
	own_results=1
fi
mkdir -p "$VM_RESULTS"
VM_RESULTS=$(cd "$VM_RESULTS" && pwd -P)

qpid=
cleanup() {
	local rc=$?
	# the supervisor below leads QEMU's process group: while a boot runs, kill the whole group
	set +e
	if [ -n "$qpid" ]; then
		kill -KILL -- "-$qpid" 2>/dev/null
		wait "$qpid" 2>/dev/null
	fi
	rm -rf "$job"
	if [ $own_results = 1 ]; then
		if [ $rc = 0 ]; then rm -rf "$VM_RESULTS"; else log "guest results kept in $VM_RESULTS"; fi
	fi
	return $rc
}
trap cleanup EXIT
trap 'log "interrupted: killing the VM"; exit 130' INT
trap 'log "terminated: killing the VM"; exit 143' TERM HUP

{
	echo '#!/bin/bash'
	echo '# stage 2: PID 1 in the host userland; run the command, record its status, leave QEMU'
	if [ "$VM_INIT" = systemd ]; then
		# As PID 1 (from init.sh): give the guest's systemd its units in /run/systemd/system
		# (a runtime dir: nothing reaches the host) and become systemd. systemd boots to
		# iserblk-vm.target, whose service runs this
		# script again, not as PID 1: the part after this block.
		cat <<'EOS'
if [ $$ = 1 ]; then
	u=/run/systemd/system
	mkdir -p $u
	# what the host enables but a test guest must not start: udev (coldplug takes ~20 s under
	# TCG; the helpers load drivers themselves), the host's iSCSI and tgt daemons (the helpers
	# start their own), timers, time sync, first-boot and TPM steps
	for m in systemd-udevd.service systemd-udev-trigger.service systemd-udevd-control.socket \
		systemd-udevd-kernel.socket open-iscsi.service iscsid.service iscsid.socket tgt.service \
		timers.target systemd-timesyncd.service systemd-pstore.service systemd-firstboot.service \
		systemd-repart.service systemd-pcrphase.service systemd-pcrphase-sysinit.service \
		systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-sysusers.service \
		systemd-tmpfiles-setup.service modprobe@drm.service getty.target e2scrub_reap.service \
		postgresql.service prometheus.service; do
		ln -sf /dev/null $u/$m
	done
	cat >$u/iserblk-vm.target <<'EOU'
[Unit]
Description=iser-blk VM test guest (test/vm/run.sh VM_INIT=systemd)
Requires=basic.target
After=basic.target
Wants=iserblk-vm-job.service
AllowIsolate=yes
EOU
	cat >$u/iserblk-vm-job.service <<'EOU'
[Unit]
Description=iser-blk VM test job: the command test/vm/run.sh was given
After=basic.target
[Service]
Type=exec
ExecStart=/bin/bash /run/vm/job.sh
StandardInput=null
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
EOU
	# As arguments, not on the kernel command line: systemd reads that only when it does not
	# think it runs in a container, and this guest has the host's root (maybe a container's, with
	# its /.dockerenv). Its own log goes to the journal, not to the console the command writes.
	exec /lib/systemd/systemd --unit=iserblk-vm.target --show-status=no --log-target=journal-or-kmsg
fi
# systemd set the console up again (ONLCR): keep the output byte-identical
stty -F /dev/console -onlcr 2>/dev/null
EOS
	fi
	printf 'export PATH=%q HOME=/root TERM=dumb LANG=C.UTF-8 TMPDIR=/tmp\n' \
		"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin"
	printf 'export ISERBLK_IN_VM=1 ISERBLK_VM_GUEST_DIR=%q ISERBLK_VM_RESULTS=%q ISERBLK_ROOT=%q\n' \
		"$here/guest" "$VM_RESULTS" "$root"
	for v in $VM_ENV ISERBLK_BIN GOFLAGS GOTRACEBACK; do
		if [ -n "${!v+x}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
	done
	# configfs (LIO) exists only once its module is loaded
	echo 'modprobe configfs && { mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config; }'
	if [ -n "${VM_DISKS:-}" ]; then
		# VM_DISKS: no udev in the guest, so the by-id links a test names its disks by are made here
		cat <<'EOS'
modprobe virtio_blk
mkdir -p /dev/disk/by-id
for _ in $(seq 100); do ls /sys/block/vd* >/dev/null 2>&1 && break; sleep 0.1; done
for b in /sys/block/vd*; do
	[ -e "$b/serial" ] && ln -sf "../../${b##*/}" "/dev/disk/by-id/virtio-$(cat "$b/serial")"
done
EOS
	fi
	printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
	echo ': >/run/vm/booted || exit 1 # from here on, a death belongs to the command: never booted again'
	printf '('
	printf ' %q' "$@"
	echo ' ) </dev/null'
	cat <<'EOS'
echo $? >/run/vm/rc
dmesg >/run/vm/dmesg 2>/dev/null
sync
# leave through QEMU's isa-debug-exit port 0xf4 (no "reboot: Power down" line); sysrq is the fallback
printf '\001' | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
echo o >/proc/sysrq-trigger
sleep 30
EOS
} >"$job/job.sh"

# 9p shares: host root read-only, the job dir, and the read-write dirs at their host paths
# shellcheck disable=SC2054 # commas separate QEMU suboptions, not array elements
qargs=(-fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
	-fsdev "local,id=vmjob,path=$job,security_model=none"
	-device virtio-9p-pci,fsdev=vmjob,mount_tag=vmjob)
: >"$job/shares"
i=0
IFS=: read -r -a rwdirs <<<"$VM_RESULTS${VM_RW:+:$VM_RW}"
for d in "${rwdirs[@]}"; do
	[ -n "$d" ] || continue
	mkdir -p "$d"
	d=$(cd "$d" && pwd -P)
	case "$d" in *[[:space:],]*) die "read-write dir must not contain spaces or commas: $d" ;; esac
	i=$((i + 1))
	qargs+=(-fsdev "local,id=rw$i,path=$d,security_model=none" -device "virtio-9p-pci,fsdev=rw$i,mount_tag=rw$i")
	echo "rw$i $d" >>"$job/shares"
done
# VM_DISKS: each file a virtio-blk disk whose serial names it; QEMU's writeback cache honours the
# guest's flushes (fdatasync on the host file), so what the guest synced survives QEMU's death
IFS=: read -r -a vmdisks <<<"${VM_DISKS:-}"
n=0
for f in "${vmdisks[@]}"; do
	[ -n "$f" ] || continue
	[ -f "$f" ] || [ -b "$f" ] || die "VM_DISKS: no such file or block device: $f"
	case "$f" in *[[:space:],]*) die "VM_DISKS: path must not contain spaces or commas: $f" ;; esac
	n=$((n + 1))
	qargs+=(-drive "file=$f,format=raw,if=none,id=disk$n,cache=writeback,aio=threads"
		-device "virtio-blk-pci,drive=disk$n,serial=iserblk-disk$n")
done
append="console=ttyS0 panic=-1 net.ifnames=0 iserblk.kdir=$kroot"
[ "$VM_VERBOSE" = 1 ] || append+=" quiet loglevel=3"
# The guests run only our tests, so the kernel's speculative-execution mitigations (retpolines,
# RSB filling on every context switch) protect nothing there; under TCG they cost about 10 % of
# the time of test/vm/csi (228 s with mitigations=off against 253 and 255 s without, one
# run each on the same host). The benches set VM_KERNEL_ARGS= and measure the kernel as shipped.
append+=" ${VM_KERNEL_ARGS-mitigations=off}"
VM_BOOTS=${VM_BOOTS:-3}
case "$VM_BOOTS" in '' | *[!0-9]* | 0) die "VM_BOOTS must be a number of boots, 1 or more" ;; esac
VM_SELFTEST_FAIL_BOOTS=${VM_SELFTEST_FAIL_BOOTS:-0} # selftest.sh: fail this many boots on purpose
case "$VM_SELFTEST_FAIL_BOOTS" in '' | *[!0-9]*) die "VM_SELFTEST_FAIL_BOOTS must be a number" ;; esac

# --- boot -------------------------------------------------------------------------------------
# QEMU runs under a small supervisor that leads a new session (setsid), so QEMU never shares our
# process group and can always be killed as a group. The supervisor enforces VM_TIMEOUT and kills
# the group when this script disappears without running its trap (SIGKILL).
supervise='
runner=$1 timeout=$2 flag=$3; shift 3
"$@" </dev/null &
q=$!
while :; do
	sleep 1 &
	s=$!
	wait -n -p done_pid "$q" "$s"
	st=$?
	if [ "$done_pid" = "$q" ]; then kill "$s" 2>/dev/null; exit "$st"; fi
	if ! kill -0 "$runner" 2>/dev/null; then kill -KILL "$q"; exit 137; fi
	if [ "$SECONDS" -ge "$timeout" ]; then
		echo timeout >"$flag"
		kill -TERM "$q" 2>/dev/null
		for _ in 1 2 3 4 5 6; do kill -0 "$q" 2>/dev/null || exit 124; sleep 0.5; done
		kill -KILL "$q" 2>/dev/null
		exit 124
	fi
done'
# A guest that dies before its command starts (no $job/booted: stage 2 writes it just before the
# command) never ran the command, so it is booted again, up to VM_BOOTS times in all. Debian's
# 6.12 kernel under QEMU 7.2's multi-threaded TCG now and then takes "Oops: int3" in
# sched_clock_cpu while a static key is being patched at boot (seen 1 boot in 6 on a loaded
# 2-core host): the emulator's, not the test's.
# A death after the command started is the command's and is never retried; nor is a timeout (a
# guest that hangs before its command is killed at VM_TIMEOUT like any other, then exit 124).
boot=1
while :; do
	boot_append=$append
	[ "$boot" -gt "$VM_SELFTEST_FAIL_BOOTS" ] || boot_append+=" iserblk.failboot=1" # selftest.sh
	set +e
	setsid bash -c "$supervise" supervise $$ "$VM_TIMEOUT" "$job/timedout" \
		qemu-system-x86_64 -name "$run_id" \
		-machine q35 -accel "tcg,tb-size=$VM_TB_MB" -cpu max -smp "$VM_SMP" -m "$VM_MEM" \
		-kernel "$vmlinuz" -initrd "$initrd" -append "$boot_append" \
		-display none -serial stdio -monitor none -no-reboot -nic none \
		-device isa-debug-exit,iobase=0xf4,iosize=0x04 \
		"${qargs[@]}" &
	qpid=$!
	wait "$qpid"
	qrc=$?
	qpid=
	set -e
	if [ -s "$job/dmesg" ]; then cp "$job/dmesg" "$VM_RESULTS/vm-dmesg.log"; fi
	if [ -e "$job/timedout" ]; then
		log "TIMEOUT: the guest did not finish within VM_TIMEOUT=${VM_TIMEOUT}s; QEMU killed"
		exit 124
	fi
	[ ! -e "$job/booted" ] && [ ! -e "$job/rc" ] && [ "$boot" -lt "$VM_BOOTS" ] || break
	log "the guest died before its command started (boot $boot of at most $VM_BOOTS, QEMU exit status $qrc; the console above says why): booting again"
	boot=$((boot + 1))
done
[ -e "$job/booted" ] || die "the guest did not boot in $VM_BOOTS tries (QEMU exit status $qrc)"
[ -s "$job/rc" ] || die "the guest ended without the command's exit status (QEMU exit status $qrc)"
exit "$(cat "$job/rc")"
exit
}
