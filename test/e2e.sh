#!/usr/bin/env bash
# test/e2e.sh — make test-e2e: run the tests that carry the `e2e` build tag, and only those.
#
#   test/e2e.sh [GO TEST FLAGS...]        (make test-e2e passes -race -json)
#
# The packages are the ones with a _test.go file whose //go:build line mentions e2e, found with
# grep, so a new e2e test is picked up without registering it; -run names exactly the Test
# functions of those files. The unit tests of the same packages are not run again: building with
# -tags e2e changes no file outside test/e2e's own helpers, so they would be the unit tier's run a
# third time (and cost make test minutes under -race). Output is go test's, for internal/testsummary.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mapfile -t files < <(grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata \
	'^//go:build .*\be2e\b' . | sort)
if [ ${#files[@]} -eq 0 ]; then
	echo "e2e.sh: no file has the e2e build tag" >&2
	exit 1
fi
mapfile -t pkgs < <(printf '%s\n' "${files[@]}" | xargs -n1 dirname | sort -u)
tests=$(grep -hoE '^func Test[A-Za-z0-9_]+\(' "${files[@]}" | sed -E 's/^func (Test[A-Za-z0-9_]+)\(/\1/' | sort -u | paste -sd'|')
exec "$GO" test -count=1 -timeout 20m -tags e2e "$@" -run "^($tests)\$" "${pkgs[@]}"
