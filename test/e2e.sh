#!/usr/bin/env bash
# test/e2e.sh — make test-e2e: run the tests that carry the `e2e` build tag, and only those.
#
#   test/e2e.sh [GO TEST FLAGS...]        (make test-e2e passes -race -json)
#
# The files are the module's _test.go files (git ls-files, as fuzz.sh finds its targets; nested
# modules such as packaging/ are left to their own tiers) whose //go:build line asks for e2e
# (`e2e`, `e2e || vm`; not `!e2e`), so a new e2e test is picked up without registering it; the
# packages are their directories and -run names exactly their Test functions. The unit tests of
# the same packages are not run again: building with -tags e2e changes no file outside test/e2e's
# own helpers, so they would be the unit tier's run a third time (and cost make test minutes
# under -race). Output is go test's, for internal/testsummary. Exit 1 without running anything
# when no e2e test is found: a tier that silently tests nothing would pass.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

# in_nested_module: is $1 (a file's path) inside a directory below the root that has a go.mod?
in_nested_module() {
	local d
	d=$(dirname "$1")
	while [ "$d" != . ]; do
		[ -f "$d/go.mod" ] && return 0
		d=$(dirname "$d")
	done
	return 1
}

files=()
while IFS= read -r f; do
	in_nested_module "$f" && continue
	head -5 "$f" | grep -qE '^//go:build (.*[^!A-Za-z0-9_])?e2e\b' && files+=("$f")
done < <(git ls-files --cached --others --exclude-standard '*_test.go' | sort)
if [ ${#files[@]} -eq 0 ]; then
	echo "e2e.sh: no _test.go file has the e2e build tag" >&2
	exit 1
fi
tests=$(grep -hoE '^func Test[A-Za-z0-9_]*\(' "${files[@]}" | sed -E 's/^func (Test[A-Za-z0-9_]*)\(/\1/' | sort -u | paste -sd'|' || true)
if [ -z "$tests" ]; then
	echo "e2e.sh: the e2e-tagged files (${files[*]}) have no Test function" >&2
	exit 1
fi
mapfile -t pkgs < <(printf '%s\n' "${files[@]}" | xargs -n1 dirname | sort -u | sed 's|^|./|')
exec "$GO" test -count=1 -timeout 20m -tags e2e "$@" -run "^($tests)\$" "${pkgs[@]}"
