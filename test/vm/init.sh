#!/bin/busybox sh
# Stage 1 of the VM boot: /init of the initramfs that test/vm/run.sh builds. Runs under the static
# busybox. It mounts the host's root filesystem read-only over 9p with a tmpfs overlay on top (so
# every host tool and binary works in the guest and nothing the guest writes reaches the host),
# mounts the job share and the read-write shares, binds the unpacked Debian kernel's modules to
# /lib/modules/$(uname -r) and switch_root's into the overlay with the host's bash as PID 1 running
# the job script. switch_root, not chroot: the kernel's module autoloader runs /sbin/modprobe in
# the real root, which must be the host userland.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

fail() {
	echo "vm-init: $*"
	# leave through isa-debug-exit with status 2 -> qemu exits 5; run.sh reports a VM failure
	printf '\002' | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	poweroff -f
}

# selftest.sh's boot failure: run.sh must boot such a guest again (VM_SELFTEST_FAIL_BOOTS)
grep -q 'iserblk.failboot=1' /proc/cmdline && fail "failing this boot on purpose (iserblk.failboot=1)"

for m in $(cat /mods/order); do
	insmod "/mods/$m" || fail "insmod $m"
done

arg() {
	for w in $(cat /proc/cmdline); do
		case $w in "$1"=*) echo "${w#*=}" ;; esac
	done
}
kdir=$(arg iserblk.kdir)
kv=$(uname -r)
opts=trans=virtio,version=9p2000.L,msize=262144

mount -t 9p -o "ro,$opts,cache=loose" hostroot /lower || fail "mount 9p hostroot"
mount -t tmpfs -o mode=755 rw /rw || fail "mount tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "mount overlay"

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o gid=5,mode=620 devpts $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t tmpfs -o mode=755 run $R/run
mkdir -p $R/run/vm $R/run/lock
mount -t 9p -o "$opts" vmjob $R/run/vm || fail "mount 9p vmjob"

# read-write shares appear at their host paths ("TAG PATH" per line)
while read -r tag path; do
	mkdir -p "$R$path"
	mount -t 9p -o "$opts" "$tag" "$R$path" || fail "mount 9p $tag at $path"
done <$R/run/vm/shares

mkdir -p "$R/lib/modules/$kv"
mount --bind "$R$kdir/lib/modules/$kv" "$R/lib/modules/$kv" || fail "bind modules"
hostname iserblk-vm
ip link set lo up
stty -F /dev/console -onlcr 2>/dev/null # byte-identical output: no \r before \n
exec switch_root /newroot /bin/bash /run/vm/job.sh
