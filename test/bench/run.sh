#!/usr/bin/env bash
# make bench: fio side by side against one tgtd LUN on /dev/shm. See test/bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v gnuplot >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
exec python3 test/bench/bench.py "$@"
