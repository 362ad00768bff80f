#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The project's test command: installs what is missing, builds, and runs
#   1. every test (unit and integration) in the default build,
#   2. the unit tests, the `sanitize` tests (the pmof provider's fabtests)
#      and the `all_builds` tests under AddressSanitizer +
#      UndefinedBehaviorSanitizer,
#   3. the same under ThreadSanitizer,
#   4. the libFuzzer targets briefly, when tests/fuzz has any,
#   5. that the run left no file in the source tree (outside build*/),
# then prints one line "N passed, N failed, N skipped" over all of them and
# exits non-zero if anything failed or did not build.
#
# Usage: scripts/test.sh [--no-setup] [--no-sanitizers] [--no-fuzz] [-- CTEST-ARGS...]
# CTEST-ARGS are added to the default-build run (e.g. -R real_clients).
# Sanitizer builds run no other integration test: those preload libsroce.so
# into uninstrumented programs, which a sanitizer runtime refuses.  The
# default build leaves the `sanitize` tests out: unsanitized, they repeat
# what test_pmof_provider does there.  `all_builds` tests run in all three.
set -euo pipefail
cd "$(dirname "$0")/.."

setup=1 sanitizers=1 fuzz=1
extra=()
while (($#)); do
	case $1 in
	--no-setup) setup=0 ;;
	--no-sanitizers) sanitizers=0 ;;
	--no-fuzz) fuzz=0 ;;
	--)
		shift
		extra=("$@")
		break
		;;
	-h | --help)
		awk 'NR > 3 && /^#/ { sub(/^# ?/, ""); print; next } NR > 3 { exit }' "$0"
		exit 0
		;;
	*)
		echo "test.sh: unknown option '$1' (see --help)" >&2
		exit 2
		;;
	esac
	shift
done

jobs=$(nproc 2>/dev/null || echo 2)
total_passed=0 total_failed=0 total_skipped=0
stages=()
logdir=$(mktemp -d "${TMPDIR:-/tmp}/sroce-test-logs.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
t0=$SECONDS

banner() { printf '\n==== %s\n' "$*"; }

# untracked: every path of the tree git does not track, ignored or not, but
# the build directories (/build*/), one a line, sorted; nothing outside a git
# checkout.  Whatever appears in it during the run is an artefact a test or
# a program it ran left behind (a core file, a .btr backtrace, __pycache__).
untracked() {
	git rev-parse --git-dir &>/dev/null || return 0
	git status --porcelain -z --ignored=matching --untracked-files=all |
		tr '\0' '\n' | sed -n 's/^\(??\|!!\) //p' | { grep -v '^build[^/]*/' || true; } | LC_ALL=C sort
}
untracked >"$logdir/untracked.before"

# record STAGE PASSED FAILED SKIPPED SECONDS
record() {
	total_passed=$((total_passed + $2))
	total_failed=$((total_failed + $3))
	total_skipped=$((total_skipped + $4))
	stages+=("$(printf '%-22s %4d passed %4d failed %4d skipped %6ss' "$1" "$2" "$3" "$4" "$5")")
}

# build STAGE PRESET [TARGET...]: configures and builds (everything, or only
# the TARGETs); a failure is recorded as one failed test of the stage.
build() {
	local stage=$1 preset=$2 start=$SECONDS targets=()
	shift 2
	(($#)) && targets=(--target "$@")
	banner "$stage: configure + build (preset $preset${*:+, targets $*})"
	if cmake --preset "$preset" >"$logdir/$preset.configure.log" 2>&1 &&
		cmake --build --preset "$preset" "${targets[@]}" >"$logdir/$preset.build.log" 2>&1; then
		echo "built in $((SECONDS - start)) s"
		return 0
	fi
	cat "$logdir/$preset.configure.log"
	tail -n 100 "$logdir/$preset.build.log" 2>/dev/null || true
	echo "$stage: BUILD FAILED"
	record "$stage (build)" 0 1 0 $((SECONDS - start))
	return 1
}

# failure_tails STAGE BUILD-DIR: keeps, for the summary, the lines of each
# failing test that say what failed (a check's FAIL with the lines it
# printed after it, up to the next check; gtest's Failure) and its last
# lines.  --output-on-failure shows them where the test ended, in the
# middle of a long log that is often seen only by its head and its tail.
failure_tails() {
	local dir=$2/Testing/Temporary name out=$logdir/failing-test.out
	[[ -f $dir/LastTestsFailed.log && -f $dir/LastTest.log ]] || return 0
	while IFS= read -r name; do
		name=${name#*:}
		awk -v t="Test: $name" '
			!on && substr($0, length($0) - length(t) + 1) == t { on = 1; next }
			on && /^<end of output>$/ { exit }
			on { print }' "$dir/LastTest.log" >"$out"
		printf -- '--- %s: %s, what failed\n' "$1" "$name"
		awk '/^(ok|FAIL|SKIP) / || /^[0-9]+ checks passed/ { more = 0 }
			/^(FAIL|not ok)|Failure$|FAILED|[Ee]rror:/ { if (++n > 20) exit; more = 60; print; next }
			more > 0 { more--; print }' "$out"
		printf -- '--- %s: %s, its last lines\n' "$1" "$name"
		tail -n 25 "$out"
	done <"$dir/LastTestsFailed.log" >>"$logdir/failures"
}

# run_ctest STAGE BUILD-DIR CTEST-ARGS...: runs ctest and adds its counts.
run_ctest() {
	local stage=$1 dir=$2 start=$SECONDS log=$logdir/ctest.$1.log
	shift 2
	banner "$stage: ctest --test-dir $dir $*"
	local rc=0
	ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$jobs" "$@" 2>&1 | tee "$log" ||
		rc=$?
	local total failed skipped
	read -r failed total < <(sed -nE 's/.*tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\1 \2/p' "$log" | tail -n1) ||
		true
	skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)' "$log" || true)
	if [[ -z ${total:-} && $stage != default ]] && grep -q 'No tests were found' "$log"; then
		echo "$stage: no tests"
		record "$stage" 0 0 0 $((SECONDS - start))
		return
	fi
	if [[ -z ${total:-} ]]; then
		# ctest itself failed (no tests, bad arguments, crash): count it once.
		echo "$stage: ctest exited $rc without a summary"
		record "$stage" 0 1 0 $((SECONDS - start))
		return
	fi
	if ((rc != 0 && failed == 0)); then failed=1; fi
	((failed == 0)) || failure_tails "$stage" "$dir"
	record "$stage" $((total - failed - skipped)) "$failed" "$skipped" $((SECONDS - start))
}

if ((setup)); then
	banner "setup: Debian packages"
	bash scripts/setup.sh
fi

if build default default; then
	run_ctest default build -LE '^sanitize$' "${extra[@]}"
else
	echo "the default build failed; nothing else is built or tested" >&2
	sanitizers=0 fuzz=0
fi

if ((sanitizers)); then
	# halt_on_error: a sanitizer report must fail the test, not scroll by.
	export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
	export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
	export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
	# What the unit, sanitize and all_builds tests run: the unit tests with
	# the agent (sroce) and libsroce.so, the provider, its fabtest and crash
	# programs, and exit_busy.
	san_targets=(sroce_unit_tests pmof-fi pmof_fabtest pmof_crash_tests exit_busy)
	if build asan asan "${san_targets[@]}"; then
		run_ctest asan build-asan -L '^(unit|sanitize|all_builds)$'
	fi
	if build tsan tsan "${san_targets[@]}"; then
		run_ctest tsan build-tsan -L '^(unit|sanitize|all_builds)$'
	fi
fi

# The fuzz preset needs clang's libFuzzer; only worth building once targets
# exist.
if ((fuzz)) && compgen -G 'tests/fuzz/*.c*' >/dev/null; then
	if build fuzz fuzz sroce_fuzz_tests; then
		run_ctest fuzz build-fuzz -L fuzz
	fi
fi

banner "tree: nothing left in the source tree"
untracked >"$logdir/untracked.after"
left=$(LC_ALL=C comm -13 "$logdir/untracked.before" "$logdir/untracked.after")
if [[ -z $left ]]; then
	echo "no new untracked or ignored files outside build*/"
	record tree 1 0 0 0
else
	printf 'left in the tree by the run:\n%s\n' "$left"
	record tree 0 1 0 0
fi

if [[ -s $logdir/failures ]]; then
	banner "failures"
	cat "$logdir/failures"
fi

banner "summary ($((SECONDS - t0)) s)"
printf '%s\n' "${stages[@]}"
echo "$total_passed passed, $total_failed failed, $total_skipped skipped"
((total_failed == 0))
