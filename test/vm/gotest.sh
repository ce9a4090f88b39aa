#!/usr/bin/env bash
# test/vm/gotest.sh — run the project's Go tests that carry the `vm` build tag inside ONE guest.
#
#   test/vm/gotest.sh [PKG...] [[--] TESTFLAGS...]
#   test/vm/run.sh go-test ./frontend/nbd -run TestKernelAttach      (the same thing)
#
# PKG are package paths such as ./frontend/nbd; default: every package with a _test.go file whose
# //go:build line mentions vm, found with grep, so a new VM test is picked up without registering
# it; the packages under test/vm/systemd need systemd as PID 1 and run only with VM_INIT=systemd,
# which runs only them (and counts them as tier vm-systemd instead of vm-go). TESTFLAGS are
# ordinary `go test` flags (-run X, -v, -timeout 5m, -count 1); they are passed
# to the test binaries as -test.* flags. The first argument that starts with '-' ends the packages.
#
# The tests are compiled on the host (`go test -c -tags vm`; the guest sees the host's files but
# has no writable Go cache), the CLI is built too and handed to the tests as ISERBLK_BIN unless that
# is set, then one guest runs every binary (test/vm/guest/gotest-run.sh), and the host turns their
# output into `go test -json` events for internal/testsummary, which prints the failures and a
# closing "vm-go: N passed, N failed, N skipped" line (vm-systemd: with VM_INIT=systemd).
#
# The systemd tier also gets the Debian package (make deb into the build directory) as
# ISERBLK_DEB unless that is set.
# Environment: VM_GO_EXCLUDE (an extended regex: found packages, as ./path, that match it are left
# out; test-vm.sh runs them in a second guest), VM_MEM (2048 here), VM_TIMEOUT (2700 here); VM_GO_RACE=1 builds with -race (slow under TCG); VM_GO_TIMEOUT per-binary timeout
# (default 25m: frontend/ublk's binary alone runs ~10 min under TCG on a loaded host); TALLY=FILE appends "vm-go PASSED FAILED SKIPPED" (vm-systemd ...) for `make test`'s total line
# and a "FAILED vm-go pkg.Test" line per failure for its recap;
# VM_* knobs go to run.sh. Exit status: 0 all passed; 1 a test or build failed; 124/125 as run.sh.
# One { } block: bash reads all of it before running, so an edit to this file while it runs
# cannot make the running copy execute shifted bytes.
{
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)
cd "$root"
GO=${GO:-go}
VM_CACHE=${VM_CACHE:-/var/tmp/iser-blk-vm}
# a 2 GiB guest for the Go tests: tests that start tgt's iSER target (backend/iser/internal/rdma) need it,
# because tgtd pins a 1 GiB buffer pool (see guest/tgt-target.sh)
export VM_MEM=${VM_MEM:-2048}
# every package runs in this one guest, each binary bounded by -test.timeout; the guest as a whole
# gets more than run.sh's default
export VM_TIMEOUT=${VM_TIMEOUT:-2700}

pkgs=()
flags=()
while [ $# -gt 0 ]; do
	case "$1" in
	--) shift; break ;;
	-*) break ;;
	*) pkgs+=("$1"); shift ;;
	esac
done
# go test flag spelling -> test binary spelling (-run X -> -test.run X)
for a in "$@"; do
	case "$a" in
	-test.*) flags+=("$a") ;;
	--*) flags+=("-test.${a#--}") ;;
	-*) flags+=("-test.${a#-}") ;;
	*) flags+=("$a") ;;
	esac
done
have_timeout=0
for a in "${flags[@]}"; do case "$a" in -test.timeout*) have_timeout=1 ;; esac; done
[ $have_timeout = 1 ] || flags+=("-test.timeout=${VM_GO_TIMEOUT:-25m}")

# the guest's init: bash (every package but test/vm/systemd/...) or systemd (only those)
tier=vm-go
systemd_pkgs='^\./test/vm/systemd(/|$)'
if [ "${VM_INIT:-bash}" = systemd ]; then tier=vm-systemd; fi
if [ ${#pkgs[@]} -eq 0 ]; then
	while read -r d; do
		d=./${d#./}
		if [ -n "${VM_GO_EXCLUDE:-}" ] && [[ $d =~ $VM_GO_EXCLUDE ]]; then
			continue # another guest runs it (test-vm.sh's second lane)
		fi
		if [ $tier = vm-systemd ]; then
			[[ $d =~ $systemd_pkgs ]] && pkgs+=("$d")
		else
			[[ $d =~ $systemd_pkgs ]] || pkgs+=("$d")
		fi
	done < <(grep -rlE --include='*_test.go' --exclude-dir=.git --exclude-dir=testdata \
		'^//go:build .*\bvm\b' . | xargs -r -n1 dirname | sort -u)
fi
if [ ${#pkgs[@]} -eq 0 ]; then
	echo "gotest.sh: no package has vm-tagged tests"
	echo "$tier: 0 passed, 0 failed, 0 skipped"
	exit 0
fi

mkdir -p "$VM_CACHE/gotest"
out=$(mktemp -d "$VM_CACHE/gotest/build.XXXXXX")
results=$(mktemp -d "$VM_CACHE/gotest/results.XXXXXX")
trap 'rm -rf "$out" "$results"' EXIT
race=()
[ "${VM_GO_RACE:-0}" = 1 ] && race=(-race)

# the CLI, for tests that run it (ISERBLK_BIN, see docs/CONVENTIONS.md)
if [ -n "${ISERBLK_BIN:-}" ] && [ ! -x "$ISERBLK_BIN" ]; then
	echo "gotest.sh: ISERBLK_BIN=$ISERBLK_BIN does not exist; building the CLI for this run instead"
	unset ISERBLK_BIN
fi
if [ -z "${ISERBLK_BIN:-}" ] && [ -d cmd/iser-blk ]; then
	if $GO build -o "$out/iser-blk" ./cmd/iser-blk; then
		export ISERBLK_BIN=$out/iser-blk
	else
		echo "gotest.sh: warning: building ./cmd/iser-blk failed; tests that need ISERBLK_BIN will fail"
	fi
fi

# the Debian package, for the systemd tier's TestDeb (make deb on the host: the guest's tree is
# read-only); the guest gets its path as ISERBLK_DEB
if [ $tier = vm-systemd ] && [ -z "${ISERBLK_DEB:-}" ]; then
	echo "gotest.sh: building the Debian package (make deb)"
	if make --no-print-directory deb DIST="$out/deb" >"$out/deb.log" 2>&1; then
		ISERBLK_DEB=$(echo "$out"/deb/iser-blk_*_amd64.deb)
		export ISERBLK_DEB
	else
		tail -20 "$out/deb.log"
		echo "gotest.sh: warning: make deb failed; TestDeb will fail"
	fi
fi
export VM_ENV="${VM_ENV:-} ISERBLK_DEB"

: >"$out/manifest"
build_failed=0
for p in "${pkgs[@]}"; do
	ip=$($GO list -tags vm -f '{{.ImportPath}}' "$p" 2>/dev/null) || ip=$p
	dir=$($GO list -tags vm -f '{{.Dir}}' "$p" 2>/dev/null) || dir=$root/${p#./}
	name=$(printf '%s' "$ip" | tr -c 'A-Za-z0-9_.-' '_')
	echo "gotest.sh: building $ip (tags vm${race:+, race})"
	if ! $GO test -c -tags vm "${race[@]}" -o "$out/$name.test" "$p" >"$out/$name.build" 2>&1; then
		cat "$out/$name.build"
		# the build failure becomes the package's FAIL in the summary
		{ cat "$out/$name.build"; echo "vm: build failed"; echo FAIL; } >"$results/$name.raw"
		echo "$ip" >"$results/$name.pkg"
		build_failed=1
		continue
	fi
	if [ ! -x "$out/$name.test" ]; then
		echo "gotest.sh: $ip has no vm test files; skipped"
		continue
	fi
	printf '%s\t%s\t%s\t%s\n' "$name" "$out/$name.test" "$dir" "$ip" >>"$out/manifest"
	echo "$ip" >"$results/$name.pkg"
done

vm_rc=0
if [ -s "$out/manifest" ]; then
	VM_RESULTS=$results "$here/run.sh" "$here/guest/gotest-run.sh" "$out/manifest" "$results" "${flags[@]}" || vm_rc=$?
fi

# raw test output -> go test -json events (test2json), a package that never ran -> a failure
for f in "$results"/*.pkg; do
	[ -e "$f" ] || continue
	name=$(basename "$f" .pkg)
	ip=$(cat "$f")
	if [ ! -e "$results/$name.raw" ]; then
		printf 'vm: not run (the VM run ended with status %s)\nFAIL\n' "$vm_rc" >"$results/$name.raw"
	fi
	$GO tool test2json -p "$ip" <"$results/$name.raw"
done >"$results/all.json"

summary_rc=0
if [ -d "$root/internal/testsummary" ]; then
	$GO run ./internal/testsummary -tier $tier ${TALLY:+-tally "$TALLY"} <"$results/all.json" || summary_rc=$?
else
	p=$(grep -c '"Action":"pass","Package":"[^"]*","Test"' "$results/all.json" || true)
	f=$(grep -c '"Action":"fail","Package":"[^"]*","Test"' "$results/all.json" || true)
	s=$(grep -c '"Action":"skip","Package":"[^"]*","Test"' "$results/all.json" || true)
	echo "$tier: $p passed, $f failed, $s skipped"
	[ "$f" = 0 ] || summary_rc=1
fi
case "$vm_rc" in 124 | 125) exit "$vm_rc" ;; esac
[ "$vm_rc" = 0 ] && [ "$summary_rc" = 0 ] && [ "$build_failed" = 0 ] || exit 1
exit
}
