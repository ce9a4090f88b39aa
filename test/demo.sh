#!/usr/bin/env bash
# make demo: start a private tgtd on 127.0.0.1 with a file-backed LUN, then show iser-blk doing its
# job against it: discover the target, print the LUN's identity and limits, serve it as an NBD
# export on a unix socket and let libnbd's tools write and read it through the gateway.
# Everything is torn down on exit, successful or not.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ISERBLK_BIN:-$PWD/bin/iser-blk}
PORT=${DEMO_PORT:-3270}
CTL=${DEMO_CONTROL_PORT:-7270}
IQN=iqn.2025-01.io.iser-blk:demo
SIZE_MB=${DEMO_SIZE_MB:-256}
work=$(mktemp -d /tmp/iser-blk-demo.XXXXXX)
pids=()

cleanup() {
  set +e
  # the gateway first (it flushes and logs out), then tgtd, which ignores SIGTERM while it
  # has targets configured: SIGKILL is its normal way out here, its LUN is a scratch file.
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    p=${pids[$i]}
    kill -0 "$p" 2>/dev/null || continue
    if [ "$p" = "${tgtd_pid:-}" ]; then kill -KILL "$p"; else kill -TERM "$p"; fi
    wait "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "starting tgtd on 127.0.0.1:$PORT (control port $CTL) with a ${SIZE_MB} MiB file-backed LUN"
truncate -s "${SIZE_MB}M" "$work/lun0.img"
tgtd -f -C "$CTL" --iscsi "portal=127.0.0.1:$PORT" >"$work/tgtd.log" 2>&1 &
tgtd_pid=$!; pids+=($tgtd_pid)
for _ in $(seq 100); do
  tgtadm -C "$CTL" --lld iscsi --mode sys --op show >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/tgtd.log"; echo "tgtd died"; exit 1; }
  sleep 0.1 # polling tgtd's control socket until it answers, bounded at 10 s
done
tgtadm -C "$CTL" --lld iscsi --mode target --op new --tid 1 --targetname "$IQN"
tgtadm -C "$CTL" --lld iscsi --mode logicalunit --op new --tid 1 --lun 1 --backing-store "$work/lun0.img" --bstype rdwr
tgtadm -C "$CTL" --lld iscsi --mode target --op bind --tid 1 --initiator-address ALL

step "iser-blk discover 127.0.0.1:$PORT"
"$BIN" discover "127.0.0.1:$PORT"

URL="iscsi://127.0.0.1:$PORT/$IQN/1"
step "iser-blk info $URL"
"$BIN" info "$URL"

if "$BIN" serve --help >/dev/null 2>&1; then
  SOCK="$work/nbd.sock"
  step "iser-blk serve --target $URL --listen unix://$SOCK"
  "$BIN" serve --target "$URL" --listen "unix://$SOCK" >"$work/serve.log" 2>&1 &
  spid=$!; pids+=($spid)
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; kill -0 $spid || { cat "$work/serve.log"; exit 1; }; sleep 0.1; done
  step "nbdinfo: what an NBD client sees"
  nbdinfo "nbd+unix:///?socket=$SOCK"
  step "nbdcopy: 64 MiB of random data in through the gateway, back out, compare"
  head -c 64M /dev/urandom >"$work/in.bin"
  nbdcopy --flush "$work/in.bin" "nbd+unix:///?socket=$SOCK"
  nbdcopy "nbd+unix:///?socket=$SOCK" "$work/out.bin"
  cmp -n $((64<<20)) "$work/in.bin" "$work/out.bin" && echo "byte-exact: 64 MiB written and read back through iser-blk"
  step "the same bytes, read straight from tgtd's backing file"
  cmp -n $((64<<20)) "$work/in.bin" "$work/lun0.img" && echo "the flushed data is on the target"
  kill -TERM $spid; wait $spid && echo "serve: clean shutdown (exit 0)"
fi
step "demo done"
