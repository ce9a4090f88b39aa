#!/usr/bin/env bash
# The Prometheus rules iser-blk ships (contrib/prometheus): `promtool check rules` on every rules
# file and `promtool test rules` on every *_test.yml beside them, and every Grafana dashboard's
# queries (contrib/grafana/*.json) parsed by promtool as recording rules; each file one check. Prints
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
# A dashboard's queries, with Grafana's variables given values, as rules promtool parses.
dashboard_rules() { # dashboard.json rules.yml
  python3 - "$1" >"$2" <<'PY'
import json, re, sys
def exprs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            else:
                yield from exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from exprs(v)
found = list(exprs(json.load(open(sys.argv[1]))))
if not found:
    sys.exit("no queries in " + sys.argv[1])
print("groups:\n  - name: dashboard\n    rules:")
for i, e in enumerate(found):
    e = re.sub(r"\$__(rate_)?interval", "5m", e)
    e = re.sub(r"\$\{?\w+\}?", ".*", e)
    print(f"      - record: dashboard:query{i}\n        expr: {json.dumps(e)}")
PY
}
check_dashboard() { dashboard_rules "$1" "$2" && promtool check rules "$2" >/dev/null; }
for f in contrib/grafana/*.json; do
  rules=$(mktemp "${TMPDIR:-/tmp}/dashboard.XXXXXX.yml")
  check dashboard "$f" check_dashboard "$f" "$rules"
  rm -f "$rules"
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
