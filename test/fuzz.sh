#!/usr/bin/env bash
# Runs every `go test -fuzz` target in the module for FUZZTIME each (default 3s, which keeps make
# test under CI's hour; fuzz longer by hand: FUZZTIME=5m make test-fuzz). A target that finds a
# crasher fails the run; go writes the reproducer under testdata/fuzz/ of its package.
# Prints "fuzz: N passed, M failed" at the end; TALLY=FILE appends "fuzz N M 0" and a
# "FAILED fuzz ./pkg FuzzX" line per failure (make test's recap).
set -uo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-3s}
pass=0; fail=0; failed=()
log=$(mktemp "${TMPDIR:-/tmp}/fuzz.XXXXXX")
trap 'rm -f "$log"' EXIT
while IFS= read -r file; do
  dir=$(dirname "$file")
  tags=""
  head -3 "$file" | grep -q '^//go:build' && continue   # fuzz targets live in untagged files
  for fn in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
    corpus="$dir/testdata/fuzz/$fn"
    before=$(ls "$corpus" 2>/dev/null | sort)
    if go test $tags -run='^$' -fuzz="^${fn}\$" -fuzztime="$FUZZTIME" "./$dir" >"$log" 2>&1; then
      echo "ok   ./$dir $fn ($FUZZTIME)"; pass=$((pass+1))
    elif [ "$(ls "$corpus" 2>/dev/null | sort)" = "$before" ] &&
         grep -q '^    context deadline exceeded$' "$log" &&
         ! grep -qE 'panic:|Failing input|_test\.go:[0-9]+:' "$log"; then
      # Go <= 1.26's fuzz coordinator can report its own -fuzztime deadline as a failure
      # (golang/go#75804, fixed in 1.27): no input failed and no reproducer was written.
      echo "ok   ./$dir $fn ($FUZZTIME; the coordinator's end-of-fuzztime deadline race, no failing input)"
      pass=$((pass+1))
    else
      echo "FAIL ./$dir $fn"; tail -30 "$log"; fail=$((fail+1)); failed+=("./$dir $fn")
    fi
  done
done < <(git ls-files --cached --others --exclude-standard '*_test.go' | xargs grep -l '^func Fuzz' 2>/dev/null | sort)
if [ -n "${TALLY:-}" ]; then
  echo "fuzz $pass $fail 0" >> "$TALLY"
  for f in "${failed[@]}"; do echo "FAILED fuzz $f" >> "$TALLY"; done
fi
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
