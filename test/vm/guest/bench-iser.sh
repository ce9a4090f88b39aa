#!/usr/bin/env bash
# test/vm/guest/bench-iser.sh — inside the VM: fio against ONE LIO RAM LUN on ONE soft-RoCE portal,
# reached five ways at once (issue 6, acceptance 5; issue 37's VM rows):
#   iser-blk-iser       iser-blk attach --nbd /dev/nbd0 --target iser://…  --cache off
#   iser-blk-tcp        iser-blk attach --nbd /dev/nbd1 --target iscsi://… --cache off
#   kernel-iser         open-iscsi with an iser iface (the kernel's ib_iser), /dev/sdX
#   iser-blk-ublk-tcp   iser-blk attach --ublk --target iscsi://… --cache off, /dev/ublkb0
#   iser-blk-ublk-tcp-workers   the same with --ublk-workers-only, /dev/ublkb1 (issue 37's A/B)
#   iser-blk-ublk-iser  iser-blk attach --ublk --target iser://… --cache off, /dev/ublkb3
#   kernel-tcp          open-iscsi over TCP (the kernel's iscsi_tcp), /dev/sdY: what a user would
#                       pick instead of iser-blk to mount a remote LUN
# and two floors, for the bounds of issue 37's rows (test/bench/vm_iser.py):
#   iser-blk-ublk-mem   iser-blk attach --ublk --target mem://… --cache off, /dev/ublkb2: a ublk
#                       gateway whose backend costs nothing (served on the ring thread)
#   kernel-ram          the kernel's RAM disk (brd), /dev/ram0: the block layer and one copy, no
#                       network and no SCSI
# After each repetition's runs, what a MiB sent over loopback TCP from one process to another
# costs the sender and the receiver goes to OUTDIR/tcp-<rep>.txt.
# Jobs (fio, direct=1, libaio, time-based): 1 MiB sequential write QD8, 1 MiB sequential read QD8,
# 4 KiB random read QD32, 4 KiB random read QD1 (its p50 of the total latency, submission
# included). Loops: repetition (outer), job, system
# (inner), so the systems of one job run back to back under the same machine load. Each run also
# reports the whole guest's CPU time per I/O (/proc/stat, all vCPUs, idle and iowait excluded):
# the gateway, the kernel's initiator and LIO's target all run in it, so it compares what each
# way of reaching the LUN costs the machine.
#
#   bench-iser.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N]
#                        [--systems A,B] [--jobs A,B] [--sched] [--ab-gomaxprocs N]
#
# --systems and --jobs run only those (all of them are still set up, so the guest is the same).
# --sched traces every context switch and wake-up of each run (tracefs sched:sched_switch and
# sched_wakeup; the whole trace in .json.trace.gz) and writes .json.sched: per I/O, the switches
# into each task (named by its command, CPU and worker numbers dropped; swapper is the idle
# task). The kept trace also holds the system calls the gateways enter (raw_syscalls:sys_enter for
# tasks named iser-blk), which test/bench/sched_threads.py counts per I/O. Tracing slows every
# switch and call: a --sched run's speeds are not comparable with an untraced run's.
# --ab-gomaxprocs N attaches the two ublk gateways over LIO once more with GOMAXPROCS=N in their
# environment (systems iser-blk-ublk-tcp-pN on /dev/ublkb4 and iser-blk-ublk-iser-pN on
# /dev/ublkb5), so that a change of the runtime's processor count is measured side by side (odd
# repetitions run the gateway first, even ones its variant).
# Writes OUTDIR/<rep>-<job>-<system>.json (fio's JSON) and .json.cpu (the guest's CPU µs per I/O),
# .json.ctr (per I/O: the guest's context switches, the soft-RoCE device's packets sent and
# received, and for the iser-blk iSER gateways their verbs counters from `iser-blk status --json`),
# OUTDIR/env.txt (guest details),
# OUTDIR/<system>.log (the iser-blk gateways' logs) and prints one line per run:
#   RUN rep=R job=J sys=S iops=… mibps=… load=…
# Needs ISERBLK_BIN (the CLI) and a guest with ~2 GiB (VM_MEM=3072): the LUN, the RAM disk and the
# mem:// device live in guest RAM.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
. "$here/lib.sh"

out=${1:?usage: bench-iser.sh OUTDIR [--runtime S] [--ramp S] [--reps N] [--size-mib N] [--systems A,B] [--jobs A,B] [--sched] [--ab-gomaxprocs N]}
shift
runtime=15
ramp=0
reps=3
size_mib=256
only_systems=
only_jobs=
sched=0
ab_procs=
while [ $# -gt 0 ]; do
	case "$1" in
	--runtime) runtime=$2; shift 2 ;;
	--ramp) ramp=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--size-mib) size_mib=$2; shift 2 ;;
	--systems) only_systems=$2; shift 2 ;;
	--jobs) only_jobs=$2; shift 2 ;;
	--sched) sched=1; shift ;;
	--ab-gomaxprocs) ab_procs=$2; shift 2 ;;
	*) die "unknown argument: $1" ;;
	esac
done
require_vm
bin=${ISERBLK_BIN:?ISERBLK_BIN must name the iser-blk CLI}
mkdir -p "$out"

pids=()
declare -A gwpid # system → its gateway's PID, for the system-call counts
kernel_portal=
kernel_iqn=
tcp_initiator=iqn.2025-01.io.iser-blk:bench-kernel-tcp # a session of its own beside the iser one
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -n "$kernel_portal" ]; then
		"$here/open-iscsi.sh" logout --portal "$kernel_portal" --iqn "$kernel_iqn" --transport iser >/dev/null 2>&1 || true
		"$here/open-iscsi.sh" logout --portal "$kernel_portal" --iqn "$kernel_iqn" --transport tcp \
			--initiator "$tcp_initiator" >/dev/null 2>&1 || true
	fi
	"$here/lio-target.sh" --teardown >/dev/null 2>&1 || true
}
trap cleanup EXIT

eval "$("$here/modules.sh" nbd)"
eval "$("$here/modules.sh" ublk)"
eval "$("$here/rxe-up.sh")"
eval "$(BRD_SIZE_KIB=$((size_mib * 1024)) "$here/modules.sh" brd)"
eval "$("$here/lio-target.sh" --backstore rd --size-mib "$size_mib")"
log "LIO RAM LUN of $size_mib MiB at $LIO_PORTAL ($LIO_IQN), rxe $RDMA_DEV"

# attach NAME DEV URL [FRONTEND ARGS]: start an iser-blk gateway with the cache off (on nbd DEV
# unless frontend arguments are given); wait for it to print DEV. gw_env: more environment for it.
gw_env=()
attach() {
	local name=$1 dev=$2 url=$3
	shift 3
	local fe=("$@")
	[ ${#fe[@]} -gt 0 ] || fe=(--nbd "$dev")
	env ${gw_env[@]+"${gw_env[@]}"} "$bin" attach "${fe[@]}" --target "$url" --cache off \
		--initiator-name "iqn.2025-01.io.iser-blk:bench-$name" \
		>"$out/$name.stdout" 2>"$out/$name.log" &
	pids+=($!)
	local pid=$!
	gwpid[$name]=$pid
	printed() { grep -qx "$dev" "$out/$name.stdout" || { kill -0 "$pid" 2>/dev/null || die "$name: iser-blk exited: $(tail -5 "$out/$name.log")"; false; }; }
	wait_until 180 "$name to attach $dev" printed
	log "$name: $url on $dev"
}
attach iser-blk-iser /dev/nbd0 "iser://$LIO_PORTAL/$LIO_IQN/$LIO_LUN"
attach iser-blk-tcp /dev/nbd1 "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN"
kernel_portal=$LIO_PORTAL
kernel_iqn=$LIO_IQN
eval "$("$here/open-iscsi.sh" login --portal "$LIO_PORTAL" --iqn "$LIO_IQN" --transport iser --lun "$LIO_LUN")"
log "kernel-iser: $ISCSI_DEV (session $ISCSI_SID)"
kernel_iser_dev=$ISCSI_DEV
attach iser-blk-ublk-tcp /dev/ublkb0 "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" --ublk --ublk-id 0
# the same with every request through a worker goroutine, as before issue 37's ring path; a
# gateway built before that flag (a "before" measured with BENCH_VM_BIN) has no such system
workers_dev=
if "$bin" attach --help 2>&1 | grep -q -- --ublk-workers-only; then
	attach iser-blk-ublk-tcp-workers /dev/ublkb1 "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" --ublk --ublk-id 1 \
		--ublk-workers-only
	workers_dev=/dev/ublkb1
else
	log "iser-blk-ublk-tcp-workers: not set up, this iser-blk has no --ublk-workers-only"
fi
# the floor of a ublk gateway: the same queues and ring path, a backend that costs nothing
attach iser-blk-ublk-mem /dev/ublkb2 "mem://${size_mib}MiB" --ublk --ublk-id 2
attach iser-blk-ublk-iser /dev/ublkb3 "iser://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" --ublk --ublk-id 3
eval "$("$here/open-iscsi.sh" login --portal "$LIO_PORTAL" --iqn "$LIO_IQN" --transport tcp --lun "$LIO_LUN" \
	--initiator "$tcp_initiator")"
log "kernel-tcp: $ISCSI_DEV (session $ISCSI_SID)"
kernel_tcp_dev=$ISCSI_DEV
declare -A devs=([iser-blk-iser]=/dev/nbd0 [iser-blk-tcp]=/dev/nbd1 [kernel-iser]=$kernel_iser_dev
	[iser-blk-ublk-tcp]=/dev/ublkb0 [iser-blk-ublk-tcp-workers]=$workers_dev [kernel-tcp]=$kernel_tcp_dev
	[iser-blk-ublk-mem]=/dev/ublkb2 [kernel-ram]=$BRD_DEV [iser-blk-ublk-iser]=/dev/ublkb3)
systems=(iser-blk-iser iser-blk-ublk-iser kernel-iser iser-blk-tcp iser-blk-ublk-tcp ${workers_dev:+iser-blk-ublk-tcp-workers}
	kernel-tcp iser-blk-ublk-mem kernel-ram)
# the iser-blk gateways over iSER: their names (the device's base name) for `iser-blk status`
declare -A rdma_gw=([iser-blk-iser]=nbd0 [iser-blk-ublk-iser]=ublkb3)
if [ -n "$ab_procs" ]; then
	gw_env=("GOMAXPROCS=$ab_procs")
	attach "iser-blk-ublk-tcp-p$ab_procs" /dev/ublkb4 "iscsi://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" --ublk --ublk-id 4
	attach "iser-blk-ublk-iser-p$ab_procs" /dev/ublkb5 "iser://$LIO_PORTAL/$LIO_IQN/$LIO_LUN" --ublk --ublk-id 5
	gw_env=()
	devs[iser-blk-ublk-tcp-p$ab_procs]=/dev/ublkb4
	devs[iser-blk-ublk-iser-p$ab_procs]=/dev/ublkb5
	rdma_gw[iser-blk-ublk-iser-p$ab_procs]=ublkb5
	# each beside the gateway it varies, so that the two run under the same load (the order of
	# the two alternates with the repetition: rep_systems)
	# shellcheck disable=SC2207 # names are single words
	systems=($(for s in "${systems[@]}"; do
		echo "$s"
		case $s in iser-blk-ublk-tcp | iser-blk-ublk-iser) echo "$s-p$ab_procs" ;; esac
	done))
fi
# only SELECTED LIST: LIST without the words not in the comma-separated SELECTED ("": all)
only() {
	local sel=$1
	shift
	local w
	for w in "$@"; do
		if [ -z "$sel" ] || [[ ",$sel," == *",$w,"* ]]; then echo "$w"; fi
	done
}
if [ -n "$only_systems" ]; then
	for w in ${only_systems//,/ }; do [ -n "${devs[$w]:-}" ] || die "--systems: no system $w"; done
fi
# shellcheck disable=SC2207 # names are single words; the guest has no /dev/fd for mapfile < <(...)
systems=($(only "$only_systems" "${systems[@]}"))

{
	echo "date: $(date -u +%FT%TZ)"
	echo "guest kernel: $(uname -r)"
	echo "guest vCPUs: $(nproc), RAM: $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
	echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "fio: $(fio --version)"
	echo "iser-blk: $("$bin" version 2>/dev/null || echo unknown)"
	echo "LUN: LIO rd_mcp $size_mib MiB, block size $LIO_BLOCK_SIZE, portal $LIO_PORTAL (rxe on a dummy netdev)"
	for k in kernel-iser kernel-tcp; do
		d=${devs[$k]#/dev/}
		echo "$k: open-iscsi $(iscsiadm --version | awk '{print $NF}'), queue_depth $(cat "/sys/block/$d/device/queue_depth"), max_sectors_kb $(cat "/sys/block/$d/queue/max_sectors_kb")"
	done
	echo "ublk max_sectors_kb: $(cat /sys/block/ublkb0/queue/max_sectors_kb)"
	echo "kernel-ram: brd $size_mib MiB, max_sectors_kb $(cat "/sys/block/${BRD_DEV#/dev/}/queue/max_sectors_kb"); iser-blk-ublk-mem: mem://${size_mib}MiB"
	echo "nbd max_sectors_kb: $(cat /sys/block/nbd0/queue/max_sectors_kb) (iser), $(cat /sys/block/nbd1/queue/max_sectors_kb) (tcp)"
	echo "fio: direct=1 ioengine=libaio time_based runtime=${runtime}s ramp_time=${ramp}s, $reps repetitions"
} >"$out/env.txt"
cat "$out/env.txt" >&2

# job NAME → fio arguments
declare -A jobs=(
	[seqwrite-1m-qd8]="--rw=write --bs=1M --iodepth=8"
	[seqread-1m-qd8]="--rw=read --bs=1M --iodepth=8"
	[randread-4k-qd32]="--rw=randread --bs=4k --iodepth=32 --randrepeat=0"
	[randread-4k-qd1]="--rw=randread --bs=4k --iodepth=1 --randrepeat=0"
)
# writes first: the reads then read data that was written (not a never-touched RAM page)
order=(seqwrite-1m-qd8 seqread-1m-qd8 randread-4k-qd32 randread-4k-qd1)
if [ -n "$only_jobs" ]; then
	for w in ${only_jobs//,/ }; do [ -n "${jobs[$w]:-}" ] || die "--jobs: no job $w"; done
fi
# shellcheck disable=SC2207
order=($(only "$only_jobs" "${order[@]}"))

# rwcalls PID: read- and write-class system calls of PID so far, all its threads (/proc/PID/io
# syscr + syscw: read, readv, recvmsg, write, writev, sendmsg, ... on sockets and eventfds;
# io_uring_enter and epoll waits are not among them)
rwcalls() { awk '/^sysc[rw]:/ {s += $2} END {print s + 0}' "/proc/$1/io"; }

# busy_ticks: the guest's CPU time so far in clock ticks, all vCPUs, without idle and iowait
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }

# counters SYSTEM: one JSON object of the counters each run reports per I/O, so far: the guest's
# context switches (/proc/stat ctxt), the soft-RoCE device's packets (hw_counters sent_pkts,
# rcvd_pkts: every initiator's iSER traffic crosses it) and, for an iser-blk iSER gateway, its
# verbs counters (status --json's rdma part)
counters() {
	local hw=/sys/class/infiniband/$RDMA_DEV/ports/1/hw_counters rdma=null
	if [ -n "${rdma_gw[$1]:-}" ]; then
		rdma=$("$bin" status --json "${rdma_gw[$1]}" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin).get("rdma")))') ||
			rdma=null # the table then shows no verbs counters for the run
	fi
	printf '{"ctxt": %s, "sent_pkts": %s, "rcvd_pkts": %s, "rdma": %s}\n' \
		"$(awk '/^ctxt/ {print $2}' /proc/stat)" "$(cat "$hw/sent_pkts" 2>/dev/null || echo null)" \
		"$(cat "$hw/rcvd_pkts" 2>/dev/null || echo null)" "$rdma"
}

# tcp_cost FILE: what moving a MiB over loopback TCP from one process to another costs the guest,
# into FILE as "SEND RECV" µs of CPU per MiB: the sending thread's (its system calls include
# the loopback delivery) and the receiving thread's, 512 MiB in 256 KiB writes into a 256 KiB
# buffer. A gateway's written bytes leave its memory like the sender's (the kernel allocates
# socket pages, zeroed where init_on_alloc is on, as in Debian's kernel, and copies into them);
# read data arrives like the receiver's. iscsi_tcp does neither: it sends and receives the
# request's own pages.
tcp_cost() {
	python3 - "$1" <<-'EOF'
		import socket, sys, threading, time
		total, chunk = 512 << 20, 256 << 10
		ls = socket.socket()
		ls.bind(('127.0.0.1', 0))
		ls.listen(1)
		rx_cpu = []
		def rx():
		    c, _ = ls.accept()
		    t0 = time.thread_time()
		    buf = memoryview(bytearray(chunk))
		    n = 0
		    while n < total:
		        k = c.recv_into(buf)
		        if k == 0:
		            break
		        n += k
		    rx_cpu.append(time.thread_time() - t0)
		t = threading.Thread(target=rx)
		t.start()
		s = socket.create_connection(ls.getsockname())
		data = b'\xa5' * chunk
		t0 = time.thread_time()
		for _ in range(total // chunk):
		    s.sendall(data)
		tx = time.thread_time() - t0
		t.join()
		mib = total >> 20
		open(sys.argv[1], 'w').write(f"{tx * 1e6 / mib:.1f} {rx_cpu[0] * 1e6 / mib:.1f}\n")
	EOF
	log "a MiB over loopback TCP between two processes: $(cat "$1") µs of CPU (send, receive)"
}

# sched_start / sched_stop / sched_save FILE: with --sched, trace the context switches and wake-ups
# between start and stop (tracefs; the per-CPU buffers are sized for a QD1 run of a minute), then
# tally them into FILE, whose first line says whether any event was lost. Stopped before the
# counters are read, so that the guest's context switches in .ctr are the run's, not the tally's.
tracing=/sys/kernel/tracing
if [ "$sched" = 1 ]; then
	[ -d "$tracing/events" ] || mount -t tracefs nodev "$tracing"
	echo 65536 >"$tracing/buffer_size_kb"
	# the gateways' system calls too (all of them are named iser-blk; idle ones add a few per
	# second): sched_threads.py counts them per I/O
	echo 'comm == "iser-blk"' >"$tracing/events/raw_syscalls/sys_enter/filter"
fi
sched_start() {
	[ "$sched" = 1 ] || return 0
	echo 0 >"$tracing/tracing_on"
	echo >"$tracing/trace"
	echo 1 >"$tracing/events/sched/sched_switch/enable"
	echo 1 >"$tracing/events/sched/sched_wakeup/enable"
	echo 1 >"$tracing/events/raw_syscalls/sys_enter/enable"
	echo 1 >"$tracing/tracing_on"
}
sched_stop() {
	[ "$sched" = 1 ] || return 0
	echo 0 >"$tracing/tracing_on"
}
sched_save() {
	[ "$sched" = 1 ] || return 0
	echo "overrun $(awk '/^overrun:/ {s += $2} END {print s + 0}' "$tracing"/per_cpu/cpu*/stats)" >"$1"
	python3 "$here/../../bench/sched_threads.py" --tally "$tracing/trace" >>"$1"
	cat "$tracing/trace" | gzip -c >"${1%.switches}.trace.gz" # both events, for a closer look (through a pipe: gzip warns of a file whose size is not its content's, as tracefs reports it)
}

# rep_systems REP: the systems in the order repetition REP runs them: with --ab-gomaxprocs, an
# even repetition runs each variant before the gateway it varies
rep_systems() {
	local i=0 n=${#systems[@]}
	while [ "$i" -lt "$n" ]; do
		local s=${systems[$i]} next=${systems[$((i + 1))]:-}
		if [ -n "$ab_procs" ] && [ $(($1 % 2)) = 0 ] && [ "$next" = "$s-p$ab_procs" ]; then
			echo "$next"
			echo "$s"
			i=$((i + 2))
			continue
		fi
		echo "$s"
		i=$((i + 1))
	done
}

for rep in $(seq 1 "$reps"); do
	for job in "${order[@]}"; do
		# shellcheck disable=SC2207 # names are single words
		rep_order=($(rep_systems "$rep"))
		for sys in "${rep_order[@]}"; do
			f=$out/$rep-$job-$sys.json
			load=$(cut -d' ' -f1 /proc/loadavg)
			calls0=0
			[ -z "${gwpid[$sys]:-}" ] || calls0=$(rwcalls "${gwpid[$sys]}")
			ctr0=$(counters "$sys")
			t0=$(busy_ticks)
			sched_start
			# shellcheck disable=SC2086 # the job's arguments are words
			fio --name="$job" --filename="${devs[$sys]}" --direct=1 --ioengine=libaio \
				${jobs[$job]} --time_based --runtime="$runtime" --ramp_time="$ramp" --lat_percentiles=1 \
				--output-format=json --output="$f" >/dev/null ||
				die "fio $job on $sys (${devs[$sys]}) failed"
			sched_stop
			busy=$(($(busy_ticks) - t0))
			ctr1=$(counters "$sys")
			sched_save "$f.switches"
			if [ -n "${gwpid[$sys]:-}" ]; then # the gateway's read- and write-class system calls
				echo "$(($(rwcalls "${gwpid[$sys]}") - calls0))" >"$f.calls"
			fi
			python3 - "$f" "$rep" "$job" "$sys" "$load" "$busy" "$(getconf CLK_TCK)" "$ctr0" "$ctr1" <<-'EOF'
				import json, sys
				f, rep, job, sysname, load, busy, hz, ctr0, ctr1 = sys.argv[1:]
				j = json.load(open(f))["jobs"][0]
				d = j["write"] if "write" in job else j["read"]
				ios = max(d["total_ios"], 1)
				# total latency (submission + completion): a ublk device does part of its work
				# inside io_submit, where clat does not see it (lat_percentiles=1 below)
				lat = d["lat_ns"] if d.get("lat_ns", {}).get("percentile") else d["clat_ns"]
				p50 = lat.get("percentile", {}).get("50.000000", 0) / 1000
				# the ramp's I/O is not in total_ios but its CPU is in busy: a slight overstatement
				cpu = int(busy) / int(hz) * 1e6 / ios
				print(f"RUN rep={rep} job={job} sys={sysname} iops={d['iops']:.1f} "
				      f"mibps={d['bw_bytes'] / 2**20:.1f} p50us={p50:.1f} cpuus={cpu:.1f} "
				      f"errors={j['error']} load={load}")
				with open(f + ".cpu", "w") as o:  # the guest's CPU µs per I/O, for the host's table
				    o.write(f"{cpu:.3f}\n")
				# counters per I/O (the ramp's I/O is in them too, like the CPU's)
				def per_io(a, b):
				    if isinstance(a, dict) and isinstance(b, dict):
				        return {k: per_io(a[k], b[k]) for k in a if k in b}
				    return None if a is None or b is None else (b - a) / ios
				with open(f + ".ctr", "w") as o:
				    json.dump(per_io(json.loads(ctr0), json.loads(ctr1)), o)
				try:  # --sched: the switches into each task, per I/O
				    lines = open(f + ".switches").read().split("\n")
				except FileNotFoundError:
				    lines = None
				if lines is not None:
				    overrun = int(lines[0].split()[1])
				    into = {}
				    for l in lines[1:]:
				        if l.strip():
				            n, task = l.split(None, 1)
				            into[task] = into.get(task, 0) + int(n) / ios
				    with open(f + ".sched", "w") as o:
				        json.dump({"overrun": overrun, "into": into}, o)
				    top = sorted(into.items(), key=lambda kv: -kv[1])
				    print(f"SCHED rep={rep} job={job} sys={sysname} overrun={overrun} total={sum(into.values()):.2f} " +
				          " ".join(f"{k}={v:.2f}" for k, v in top if v >= 0.05))
			EOF
		done
	done
	tcp_cost "$out/tcp-$rep.txt"
done
# warnings from the gateways (command timeouts, reconnects) would make their figures suspect
for sys in iser-blk-iser iser-blk-tcp iser-blk-ublk-tcp ${workers_dev:+iser-blk-ublk-tcp-workers} iser-blk-ublk-mem \
	iser-blk-ublk-iser ${ab_procs:+iser-blk-ublk-tcp-p$ab_procs iser-blk-ublk-iser-p$ab_procs}; do
	kv "WARNINGS_$sys" "$(grep -ciE '"level":"(warn|error)"|\bWARN|\bERROR' "$out/$sys.log" || true)"
done
exit 0
}
