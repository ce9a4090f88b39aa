#!/usr/bin/env bash
# Installs what building and testing iser-blk needs on a Debian 12 machine, idempotently:
# the Debian packages named in test/deps.txt (and the VM tier's own list, which test/vm/run.sh
# installs itself), and staticcheck. Runs as root (CI and the dev machines are root).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t pkgs < <(grep -v '^\s*#' test/deps.txt | awk 'NF{print $1}' | sort -u)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v staticcheck >/dev/null 2>&1 && [ ! -x "$(go env GOPATH)/bin/staticcheck" ]; then
  echo "deps: installing staticcheck"
  go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
echo "deps: ok"
