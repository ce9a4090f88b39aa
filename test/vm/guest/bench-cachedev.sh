#!/usr/bin/env bash
# test/vm/guest/bench-cachedev.sh — inside the VM: issue #39's performance rows for --cache-dev
# (the persistent write-back log), three gateways side by side in front of ONE LIO RAM LUN over
# iSCSI/TCP, each on its own ublk device:
#   off    iser-blk attach --ublk --cache off
#   wb     iser-blk attach --ublk                     (default: the RAM write-back cache)
#   cd     iser-blk attach --ublk --cache-dev FILE    (the log in a file on the local disk's ext4)
#   local  no gateway: the same fio job on a file of the cache device's own ext4 (the baseline)
# The "local SSD" is the first VM disk (VM_DISKS; /dev/disk/by-id/virtio-iserblk-disk1), ext4,
# holding the cache file and the baseline's files. netem on lo adds --netem-ms (0.5) to every
# packet between gateway and target, each way (the portal's address is local, so its traffic
# runs over lo); the control sockets, ublk and postgres' unix sockets do not touch it.
#
# Each system gets two disjoint stretches of the LUN (device-mapper linear maps over its own ublk
# device, so nothing of one system's file system is ever reached through another's cache): RAW for
# the raw-device fio jobs, FS for ext4 + PostgreSQL. Jobs, per repetition (outer loop) and per job
# the systems in a fixed order (A B C A B C ...):
#   commit-4k-qd1    fio randwrite 4 KiB QD1 psync direct=1 fsync=1 (write clat + sync lat)  local off wb cd
#   seqwrite-1m-qd8  fio write 1 MiB QD8 libaio direct=1                                    off wb cd
#   randread-4k-qd32 fio randwrite 32 KiB over 64 MiB (so it sits in the log), then randread
#                    4 KiB QD32 libaio direct=1 over it, timed                              local off wb cd
#   pgbench          CHECKPOINT, then pgbench -c 4 -j 2 -T runtime -n (scale 10,
#                    synchronous_commit on) on ext4 on FS                                   off wb cd
# Before every timed run nothing is dirty: the write-back gateways get a FLUSH and the cache-dev
# gateway's log is waited for until it is written back (status --json), so no run pays for
# another's backlog.
#
#   bench-cachedev.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N] [--netem-ms MS]
#                     [--scale N] [--jobs a,b] [--no-diag] [--prefill]
#                     [--cd-flags 'MORE FLAGS'] [--read-runtime S]
#
# Writes OUTDIR/<rep>-<job>-<system>.json (fio JSON) or .txt (pgbench), status snapshots of the
# cache-dev gateway around its read job, OUTDIR/env.txt, the gateways' logs; prints
#   RUN rep=R job=J sys=S ... load=…
# Needs ISERBLK_BIN, VM_DISKS with one disk, and VM_MEM ≥ 4096 (the LUN lives in guest RAM).
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

out=${1:?usage: bench-cachedev.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N] [--netem-ms MS] [--scale N] [--jobs a,b]}
shift
runtime=10
ramp=0
reps=3
raw_mib=192 # each system's raw stretch
fs_mib=448  # each system's ext4 (pgbench scale 10 is ~170 MiB, plus up to max_wal_size of WAL)
netem_ms=0.5
scale=10
clients=4
read_mib=64
only_jobs=
diag=1
prefill=0
cd_flags=
read_runtime=
while [ $# -gt 0 ]; do
	case "$1" in
	--runtime) runtime=$2; shift 2 ;;
	--ramp) ramp=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--size-mib) raw_mib=$2; shift 2 ;;
	--netem-ms) netem_ms=$2; shift 2 ;;
	--scale) scale=$2; shift 2 ;;
	--jobs) only_jobs=$2; shift 2 ;;
	--no-diag) diag=0; shift ;;
	--prefill) prefill=1; shift ;;
	--cd-flags) cd_flags=$2; shift 2 ;;
	--read-runtime) read_runtime=$2; shift 2 ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm
bin=${ISERBLK_BIN:?ISERBLK_BIN must name the iser-blk CLI}
disk=/dev/disk/by-id/virtio-iserblk-disk1
[ -b "$disk" ] || die "no $disk: run with VM_DISKS=/host/file (the local disk for the cache device)"
mkdir -p "$out"

systems=(off wb cd)
declare -A ublk_id=([off]=0 [wb]=1 [cd]=2)
declare -A flags=([off]="--cache off" [wb]="" [cd]="--cache-dev /mnt/local/lun.cache --cache-dev-size 1GiB${cd_flags:+ $cd_flags}")
declare -A pg_port=([off]=5433 [wb]=5434 [cd]=5435)
run_dir=/run/iser-blk-bench
local_mnt=/mnt/local
pids=()
maps=()
pg_started=()
cleanup() {
	set +e
	log "cleanup: netem, postgres, file systems, maps, gateways, target"
	tc qdisc del dev lo root 2>/dev/null
	for s in "${pg_started[@]}"; do
		runuser -u postgres -- pg_ctl -D "/mnt/pg-$s/data" -m fast -w stop >/dev/null 2>&1
		cp "/tmp/pg-$s/postgres.log" "$out/pg-$s.log" 2>/dev/null
	done
	for s in "${systems[@]}"; do mountpoint -q "/mnt/pg-$s" && umount "/mnt/pg-$s"; done
	for m in "${maps[@]}"; do dmsetup remove --noudevsync "$m" || log "cleanup: dmsetup remove $m failed"; done
	log "cleanup: device-mapper maps left: $(dmsetup ls 2>&1 | tr '\n' ' '); holders of the ublk disks: $(ls /sys/block/ublkb*/holders/ 2>&1 | tr '\n' ' ')"
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	# a stopping gateway writes its cache back first; give it time, then say who hangs
	gone() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }
	if ! wait_until 120 "the gateways to stop after SIGTERM" gone; then
		# say where they hang (Go prints every goroutine's stack on SIGQUIT into their logs), then end them
		log "cleanup: gateways still running 120 s after SIGTERM: $(ps -o pid=,args= -p "$(IFS=,; echo "${pids[*]}")" | cut -c1-80 | tr '\n' ';')"
		for p in "${pids[@]}"; do kill -QUIT "$p" 2>/dev/null; done
		wait_until 30 "the gateways to exit on SIGQUIT" gone || for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	fi
	umount "$local_mnt" 2>/dev/null
	"$here/lio-target.sh" --teardown >/dev/null 2>&1
	log "cleanup: done"
}
trap cleanup EXIT
export DM_DISABLE_UDEV=1 # no udev in the guest: dmsetup makes its nodes itself

eval "$("$here/modules.sh" ublk dm_mod sch_netem)"
lun_mib=$(( ${#systems[@]} * (raw_mib + fs_mib) ))
eval "$("$here/lio-target.sh" --backstore rd --size-mib "$lun_mib" --no-iser)"
log "LIO RAM LUN of $lun_mib MiB at $LIO_PORTAL ($LIO_IQN)"

# the local disk: ext4, holding the cache file and the baseline's files
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$disk"
mkdir -p "$local_mnt"
mount "$disk" "$local_mnt"

# --prefill: the cache file written with zeros before attach (formatted as a new device), so its
# blocks are written extents as after the ring's first lap; without it the gateway creates the
# file with fallocate, and the first write to each block converts an unwritten extent (ext4
# metadata: a journal commit in each fdatasync that covers one)
if [ "$prefill" = 1 ]; then
	dd if=/dev/zero of="$local_mnt/lun.cache" bs=1M count=1024 conv=fsync status=none
	log "cache file prefilled with zeros (1 GiB)"
fi

status_json() { "$bin" status "$1" --json --run-dir "$run_dir"; }

# attach SYS: start its gateway on /dev/ublkb<id>; wait for it to print the device
declare -A dev
attach() {
	local s=$1 d=/dev/ublkb${ublk_id[$1]}
	# shellcheck disable=SC2086 # the system's flags are words
	"$bin" attach --ublk --ublk-id "${ublk_id[$s]}" --name "$s" --run-dir "$run_dir" \
		--target "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" ${flags[$s]} \
		--initiator-name "iqn.2025-01.io.iser-blk:bench-$s" \
		>"$out/$s.stdout" 2>"$out/$s.log" &
	pids+=($!)
	local pid=$!
	printed() { grep -qx "$d" "$out/$s.stdout" || { kill -0 "$pid" 2>/dev/null || die "$s: iser-blk exited: $(tail -5 "$out/$s.log")"; false; }; }
	wait_until 300 "$s to attach $d" printed
	dev[$s]=$d
	log "$s: $d (${flags[$s]:-default flags})"
}

# linear NAME DEV START_MIB SIZE_MIB: a device-mapper map of DEV's stretch; prints its node
linear() {
	local name=$1 d=$2 start=$(($3 * 2048)) size=$(($4 * 2048)) node
	dmsetup create "$name" --noudevsync --table "0 $size linear $d $start" >&2
	node=/dev/$(dmsetup info -c --noheadings -o blkdevname "$name")
	wait_until 10 "$node" test -b "$node"
	echo "$node"
}

declare -A raw fs
i=0
for s in "${systems[@]}"; do
	attach "$s"
	base=$((i * (raw_mib + fs_mib)))
	raw[$s]=$(linear "bench-$s-raw" "${dev[$s]}" "$base" "$raw_mib")
	fs[$s]=$(linear "bench-$s-fs" "${dev[$s]}" $((base + raw_mib)) "$fs_mib")
	maps+=("bench-$s-raw" "bench-$s-fs") # here, not in linear: that runs in a subshell
	i=$((i + 1))
done

# PostgreSQL on ext4 on each system's FS stretch, unix sockets only (nothing of it crosses lo)
pgsql() { runuser -u postgres -- psql -X -q -h "/tmp/pg-$1" -p "${pg_port[$1]}" -d postgres -c "$2"; }
want() { [ -z "$only_jobs" ] || [[ ",$only_jobs," == *",$1,"* ]]; }
pg_systems=()
if want pgbench; then pg_systems=("${systems[@]}"); fi
for s in "${pg_systems[@]}"; do
	mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "${fs[$s]}"
	mkdir -p "/mnt/pg-$s" "/tmp/pg-$s"
	mount "${fs[$s]}" "/mnt/pg-$s"
	chown postgres: "/mnt/pg-$s" "/tmp/pg-$s"
	runuser -u postgres -- initdb -N -A trust -E UTF8 --locale=C -D "/mnt/pg-$s/data" >"$out/pg-$s.initdb" 2>&1 ||
		die "initdb on $s failed: $(tail -5 "$out/pg-$s.initdb")"
	cat >>"/mnt/pg-$s/data/postgresql.conf" <<-EOF
		port = ${pg_port[$s]}
		listen_addresses = ''
		unix_socket_directories = '/tmp/pg-$s'
		shared_buffers = 64MB
		dynamic_shared_memory_type = sysv
		synchronous_commit = on
		fsync = on
		max_wal_size = 128MB
		checkpoint_timeout = 30min
		autovacuum = off
	EOF
	# its log in /tmp: the postgres user cannot write the results share
	runuser -u postgres -- pg_ctl -D "/mnt/pg-$s/data" -l "/tmp/pg-$s/postgres.log" -w -t 300 start >/dev/null ||
		die "postgres on $s did not start: $(tail -5 "/tmp/pg-$s/postgres.log")"
	pg_started+=("$s")
	t0=$(now_ms)
	runuser -u postgres -- pgbench -i -q -s "$scale" -h "/tmp/pg-$s" -p "${pg_port[$s]}" postgres >"$out/pg-$s.init" 2>&1 ||
		die "pgbench -i on $s failed: $(tail -5 "$out/pg-$s.init")"
	pgsql "$s" CHECKPOINT
	log "$s: postgres on ${fs[$s]}, pgbench scale $scale initialised in $(( ($(now_ms) - t0) / 1000 )) s"
done

# netem: 0.5 ms on every packet of lo, i.e. each way between the gateways and the portal; the
# round trip is measured before and after (TCP connects to the portal: SYN out, SYN-ACK back)
connect_rtt() {
	python3 - "$LIO_ADDR" "$LIO_PORT" <<-'EOF'
		import socket, statistics, sys, time
		ts = []
		for _ in range(20):
		    s = socket.socket()
		    t = time.perf_counter()
		    s.connect((sys.argv[1], int(sys.argv[2])))
		    ts.append((time.perf_counter() - t) * 1e3)
		    s.close()
		print(f"{statistics.median(ts):.3f} ms median of 20 TCP connects (min {min(ts):.3f}, max {max(ts):.3f})")
	EOF
}
rtt0=$(connect_rtt)
tc qdisc add dev lo root netem delay "${netem_ms}ms"
rtt="$(connect_rtt) (without netem: $rtt0)"
log "netem on lo: $(tc qdisc show dev lo); round trip to the portal: $rtt"

{
	echo "date: $(date -u +%FT%TZ)"
	echo "guest kernel: $(uname -r)"
	echo "guest vCPUs: $(nproc), RAM: $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
	echo "fio: $(fio --version), pgbench: $(pgbench --version), postgres: $(postgres --version)"
	echo "iser-blk: $("$bin" version 2>/dev/null | head -1 || echo unknown)"
	echo "LUN: LIO rd_mcp $lun_mib MiB (LIO defaults, emulate_write_cache=1), block size $LIO_BLOCK_SIZE, iSCSI/TCP portal $LIO_PORTAL"
	echo "netem: tc qdisc add dev lo root netem delay ${netem_ms}ms -> $(tc qdisc show dev lo | head -1); TCP connect to the portal: $rtt"
	echo "frontend: ublk (--ublk, queues/depth default); per system a ${raw_mib} MiB raw stretch and a ${fs_mib} MiB ext4 stretch of the LUN (dm-linear)"
	echo "cache file: $([ "$prefill" = 1 ] && echo "written with zeros before attach (--prefill)" || echo "created by the gateway (fallocate)")"
	echo "systems: off = --cache off; wb = default (RAM write-back, --cache-size default: $(status_json wb | python3 -c 'import json,sys; print(json.load(sys.stdin)["cache"]["capacity_bytes"] >> 20)') MiB); cd = ${flags[cd]}"
	echo "local disk: $disk ($(blockdev --getsize64 "$disk") bytes, virtio, QEMU cache=writeback on a host file), ext4 at $local_mnt: cache file and baseline files"
	echo "pgbench: scale $scale, -c $clients -j 2 -T $runtime -n, synchronous_commit on, CHECKPOINT before each run"
	echo "fio: time_based runtime=${runtime}s (randread: ${read_runtime:-$runtime}s) ramp_time=${ramp}s, $reps repetitions"
} >"$out/env.txt"
cat "$out/env.txt" >&2

# settle: nothing dirty anywhere before a timed run
settle() {
	local s
	for s in wb cd; do blockdev --flushbufs "${dev[$s]}"; done
	cd_clean() { status_json cd | python3 -c '
import json, sys
c = json.load(sys.stdin)["cache"]
sys.exit(0 if c["dirty_bytes"] == 0 and c["device"]["dirty_bytes"] == 0 else 1)'; }
	wait_until 300 "the cache-dev log to be written back" cd_clean
}

# fio_run JSON FILE ARGS...: a timed fio job
fio_run() {
	local f=$1 file=$2
	shift 2
	fio --name=job --filename="$file" --direct=1 --time_based --runtime="$runtime" --ramp_time="$ramp" \
		"$@" --output-format=json --output="$f" >/dev/null
}

# snap NAME WHEN: the local ext4's journal counters (jbd2: commits and their average time) and,
# for the cache-dev gateway, its status (fdatasyncs, batches), beside a commit run
jbd2=/proc/fs/jbd2/$(basename "$(readlink -f "$disk")")-8/info
snap() {
	case "$1" in
	*-local | *-cd) cp "$jbd2" "$out/$1.jbd2.$2" ;;
	esac
	case "$1" in *-cd) status_json cd >"$out/$1.$2.json" ;; esac
}

summary() { # FILE REP JOB SYS LOAD
	python3 - "$@" <<-'EOF'
		import json, re, sys
		f, rep, job, sysname, load = sys.argv[1:]
		if f.endswith(".txt"):
		    m = re.search(r"tps = ([0-9.]+) \(without initial", open(f).read())
		    print(f"RUN rep={rep} job={job} sys={sysname} tps={m.group(1) if m else 'NONE'} load={load}")
		    sys.exit(0)
		j = json.load(open(f))["jobs"][0]
		d = j["read"] if "read" in job else j["write"]
		extra = ""
		if job.startswith("commit"):
		    w = j["write"]["clat_ns"]["percentile"]["50.000000"] / 1e3
		    s = j["sync"]["lat_ns"]["percentile"]["50.000000"] / 1e3
		    extra = f" write_p50_us={w:.0f} sync_p50_us={s:.0f}"
		print(f"RUN rep={rep} job={job} sys={sysname} iops={d['iops']:.1f} mibps={d['bw_bytes'] / 2**20:.1f}"
		      f"{extra} errors={j['error']} load={load}")
	EOF
}

for rep in $(seq 1 "$reps"); do
	if want commit-4k-qd1; then
		for s in local "${systems[@]}"; do
			settle
			f=$out/$rep-commit-4k-qd1-$s.json
			load=$(cut -d' ' -f1 /proc/loadavg)
			if [ "$s" = local ]; then file=$local_mnt/commit.fio; else file=${raw[$s]}; fi
			snap "$rep-commit-4k-qd1-$s" before
			fio_run "$f" "$file" --size="${raw_mib}M" --rw=randwrite --bs=4k --iodepth=1 --ioengine=psync \
				--fsync=1 --randrepeat=0 || die "fio commit on $s failed"
			snap "$rep-commit-4k-qd1-$s" after
			summary "$f" "$rep" commit-4k-qd1 "$s" "$load"
		done
	fi
	if want seqwrite-1m-qd8; then
		for s in "${systems[@]}"; do
			settle
			f=$out/$rep-seqwrite-1m-qd8-$s.json
			load=$(cut -d' ' -f1 /proc/loadavg)
			fio_run "$f" "${raw[$s]}" --size="${raw_mib}M" --rw=write --bs=1M --iodepth=8 --ioengine=libaio ||
				die "fio seqwrite on $s failed"
			summary "$f" "$rep" seqwrite-1m-qd8 "$s" "$load"
		done
	fi
	if want randread-4k-qd32; then
		for s in local "${systems[@]}"; do
			settle
			f=$out/$rep-randread-4k-qd32-$s.json
			if [ "$s" = local ]; then file=$local_mnt/read.fio; else file=${raw[$s]}; fi
			# 32 KiB random writes: under --cache-write-around (and not a sequential stream), so on
			# cd they land in the log; read back at once, within the log's 10 s before write-back
			fio --name=fill --filename="$file" --direct=1 --size="${read_mib}M" --rw=randwrite --bs=32k \
				--iodepth=8 --ioengine=libaio --output="$out/$rep-randread-fill-$s.txt" >/dev/null ||
				die "fio fill on $s failed"
			if [ "$s" = cd ]; then status_json cd >"$out/$rep-randread-4k-qd32-cd.before.json"; fi
			load=$(cut -d' ' -f1 /proc/loadavg)
			# --read-runtime: shorter than the log's 10 s before write-back, so that the whole
			# read finds the data in the log
			fio_run "$f" "$file" --size="${read_mib}M" --rw=randread --bs=4k --iodepth=32 --ioengine=libaio \
				--randrepeat=0 --runtime="${read_runtime:-$runtime}" || die "fio randread on $s failed"
			if [ "$s" = cd ]; then status_json cd >"$out/$rep-randread-4k-qd32-cd.after.json"; fi
			summary "$f" "$rep" randread-4k-qd32 "$s" "$load"
		done
	fi
	if want pgbench; then
		for s in "${systems[@]}"; do
			pgsql "$s" CHECKPOINT
			settle
			f=$out/$rep-pgbench-$s.txt
			load=$(cut -d' ' -f1 /proc/loadavg)
			runuser -u postgres -- pgbench -n -c "$clients" -j 2 -T "$runtime" -h "/tmp/pg-$s" -p "${pg_port[$s]}" \
				postgres >"$f" 2>&1 || die "pgbench on $s failed: $(tail -5 "$f")"
			summary "$f" "$rep" pgbench "$s" "$load"
		done
	fi
done
# Diagnostic pass, not in the table: the cache-dev commit job again under strace -T of the
# gateway's writes and fdatasyncs (ptrace slows the gateway, so only the syscalls' own durations
# count), to tell the log's fdatasync from the rest of a commit.
if want commit-4k-qd1 && [ "$diag" = 1 ]; then
	settle
	gw=${pids[2]}
	strace -f -T -qq -e trace=fdatasync,fsync,pwritev,pwritev2,pwrite64 -p "$gw" -o "$out/diag-strace-cd.txt" &
	st=$!
	traced() { # every thread of the gateway has strace as its tracer
		local t
		for t in /proc/"$gw"/task/*/status; do
			[ "$(awk '/^TracerPid:/ {print $2}' "$t")" = "$st" ] || return 1
		done
	}
	wait_until 60 "strace to attach to every thread of the gateway" traced
	fio_run "$out/diag-commit-4k-qd1-cd.json" "${raw[cd]}" --size="${raw_mib}M" --rw=randwrite --bs=4k \
		--iodepth=1 --ioengine=psync --fsync=1 --randrepeat=0 || die "fio diagnostic commit on cd failed"
	kill -INT "$st"
	wait "$st" 2>/dev/null || true
	log "diagnostic pass: strace of the cache-dev gateway in diag-strace-cd.txt"
fi
for s in "${systems[@]}"; do
	status_json "$s" >"$out/$s.status.json" || true
	kv "WARNINGS_$s" "$(grep -ciE '"level":"(warn|error)"|\bWARN|\bERROR' "$out/$s.log" || true)"
done
exit 0
}
