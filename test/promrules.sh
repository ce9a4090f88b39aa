#!/usr/bin/env bash
# The Prometheus rules iser-blk ships (contrib/prometheus): `promtool check rules` on every rules
# file and `promtool test rules` on every *_test.yml beside them, each file one check. Prints
# "rules: N passed, M failed" at the end; TALLY=FILE appends "rules N M 0" and a
# "FAILED rules FILE" line per failed file (make test's recap). promtool is Debian's prometheus
# package (test/deps.txt); without it every file fails.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=contrib/prometheus
pass=0; fail=0; failed=()
check() { # what file command...
  local what=$1 file=$2; shift 2
  if "$@"; then echo "ok   $what $file"; pass=$((pass+1))
  else echo "FAIL $what $file"; fail=$((fail+1)); failed+=("$what $file"); fi
}
shopt -s nullglob
for f in "$dir"/*.yml; do
  case $f in *_test.yml) continue ;; esac
  check check "$f" promtool check rules "$f"
done
for f in "$dir"/*_test.yml; do
  # promtool resolves rule_files relative to the test file
  check test "$f" promtool test rules "$f"
done
if [ $((pass + fail)) -eq 0 ]; then
  echo "FAIL no rules in $dir"; fail=1; failed+=("none found in $dir")
fi
if [ -n "${TALLY:-}" ]; then
  echo "rules $pass $fail 0" >> "$TALLY"
  for f in "${failed[@]}"; do echo "FAILED rules $f" >> "$TALLY"; done
fi
echo "rules: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
