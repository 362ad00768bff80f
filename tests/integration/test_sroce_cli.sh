#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Drives the sroce(8) command line against a private configuration file and
# checks its output, the file it writes and its exit statuses (0 success,
# 1 failure, 2 usage error; exec passes the child's status through).
#
# Usage: test_sroce_cli.sh BUILD-DIR | PATH-TO-SROCE
# Exits 77 (ctest SKIP_RETURN_CODE) when the loopback interface is unusable.
set -euo pipefail

sroce=${1:?usage: test_sroce_cli.sh BUILD-DIR | PATH-TO-SROCE}
# ctest passes the build directory, as to every integration script.
if [[ -d $sroce ]]; then sroce=$sroce/tools/sroce/sroce; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A private file, so the test neither needs root nor touches the host's links.
export SROCE_CONFIG=$tmp/etc/sroce/links.conf
unset SROCE_SHIM LD_PRELOAD

failures=0
fail() {
	echo "FAIL: $*" >&2
	failures=$((failures + 1))
}

# Runs a command without tripping set -e; leaves rc, out and err behind.
run() {
	set +e
	"$@" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	set -e
	out=$(cat "$tmp/out")
	err=$(cat "$tmp/err")
}

# expect STATUS COMMAND...
expect() {
	local want=$1
	shift
	run "$@"
	if [[ $rc != "$want" ]]; then
		fail "'$*' exited $rc, expected $want; stderr: $err"
	fi
}

out_is() {
	[[ $out == "$1" ]] || fail "stdout was:"$'\n'"$out"$'\n'"expected:"$'\n'"$1"
}
out_has() {
	[[ $out == *"$1"* ]] || fail "stdout lacks '$1':"$'\n'"$out"
}
err_has() {
	[[ $err == *"$1"* ]] || fail "stderr lacks '$1':"$'\n'"$err"
}
err_is_ours() {
	[[ $err == "sroce: "* ]] || fail "stderr does not start with 'sroce: ': $err"
}

# Everything below assumes 127.0.0.1/8 on an up lo, which a fresh network
# namespace lacks.
if ! "$sroce" --config "$tmp/probe.conf" link add probe netdev lo addr 127.0.0.1 2>/dev/null; then
	echo "SKIP: loopback interface not usable" >&2
	exit 77
fi

# What `link show` must report for lo, computed the documented way.
lo_mtu=$(cat /sys/class/net/lo/mtu)
roce_mtu=0
for m in 256 512 1024 2048 4096; do
	if ((m <= lo_mtu - 20 - 8 - 12 - 28 - 4)); then roce_mtu=$m; fi
done
line0="link sroce0/1 state ACTIVE physical_state LINK_UP netdev lo mtu $roce_mtu cc off"
line1="link sroce1/1 state ACTIVE physical_state LINK_UP netdev lo addr 127.0.0.2 mtu $roce_mtu cc off"

# --- generic options and usage errors ---
expect 0 "$sroce" --version
[[ $out == "sroce "* ]] || fail "--version printed '$out'"
expect 0 "$sroce" -h
out_has "link"
out_has "exec"
expect 0 "$sroce" link add --help
out_has "netdev IF [addr IP]"
expect 2 "$sroce"
err_is_ours
expect 2 "$sroce" bogus
err_is_ours
expect 2 "$sroce" link bogus
expect 2 "$sroce" --no-such-option link
expect 2 "$sroce" link add
expect 2 "$sroce" link add sroce0
err_has "missing 'netdev IF'"
expect 2 "$sroce" link add sroce0 dev lo
err_has "unknown keyword 'dev'"
expect 2 "$sroce" link add sroce0 netdev lo addr
err_has "missing value after 'addr'"
expect 2 "$sroce" link del

# --- an empty (missing) configuration ---
expect 0 "$sroce" link show
out_is ""
expect 0 "$sroce" -j link show
out_is "[]"
[[ ! -e $SROCE_CONFIG ]] || fail "show created $SROCE_CONFIG"

# --- add ---
expect 0 "$sroce" link add sroce0 netdev lo
out_is ""
[[ -f $SROCE_CONFIG ]] || fail "add did not create $SROCE_CONFIG"
# Without an address the link follows its interface, as an rxe link does.
grep -qx 'sroce0 netdev lo' "$SROCE_CONFIG" || fail "a link without addr was written as: $(cat "$SROCE_CONFIG")"
expect 0 "$sroce" link add sroce1 netdev lo addr 127.0.0.2

expect 1 "$sroce" link add sroce0 netdev lo addr 127.0.0.5
err_is_ours
err_has "link 'sroce0' already exists"
expect 1 "$sroce" link add sroce2 netdev lo addr 127.0.0.2
err_has "127.0.0.2 of link 'sroce2' is already used by link 'sroce1'"
expect 1 "$sroce" link add sroce2 netdev lo
err_has "interface lo of link 'sroce2' is already followed by link 'sroce0'"
expect 1 "$sroce" link add sroce2 netdev nosuchif0
err_is_ours
err_has "no such interface 'nosuchif0'"
expect 1 "$sroce" link add sroce2 netdev nosuchif0 addr 127.0.0.3
err_has "no such interface"
# 192.0.2.0/24 is reserved for documentation and never assigned.
expect 1 "$sroce" link add sroce2 netdev lo addr 192.0.2.1
err_has "not assigned to any local interface"
expect 1 "$sroce" link add sroce2 netdev lo addr 127.0.0.300
err_has "invalid address"
expect 1 "$sroce" link add 'bad/name' netdev lo addr 127.0.0.3
err_has "invalid link name"
[[ $(grep -c '^sroce' "$SROCE_CONFIG") == 2 ]] || fail "failed adds changed the file: $(cat "$SROCE_CONFIG")"

# --- show ---
expect 0 "$sroce" link show
out_is "$line0"$'\n'"$line1"
expect 0 "$sroce" link
out_is "$line0"$'\n'"$line1"
expect 0 "$sroce" link show sroce1
out_is "$line1"
expect 0 "$sroce" link show sroce1/1
out_is "$line1"
expect 1 "$sroce" link show nosuch
err_has "link 'nosuch' does not exist"

expect 0 "$sroce" link show -j
out_has '"ifname":"sroce0"'
out_has '"ifname":"sroce1"'
out_has '"addr":"127.0.0.2"'
out_has '"state":"ACTIVE"'
out_has "\"mtu\":$roce_mtu"
[[ $out == "["*"]" ]] || fail "JSON output is not an array: $out"
if command -v python3 >/dev/null; then
	python3 -c 'import json,sys; d=json.load(sys.stdin); assert [x["ifname"] for x in d] == ["sroce0","sroce1"], d' \
		<<<"$out" || fail "JSON output does not parse: $out"
fi
expect 0 "$sroce" --json link show sroce0
out_has '"ifname":"sroce0"'
[[ $out != *sroce1* ]] || fail "show NAME -j printed other links: $out"

# --- set: congestion control ---
expect 0 "$sroce" link set sroce1 cc dcqcn ai-rate 2.5 cnp-interval 20
out_is ""
expect 0 "$sroce" link show sroce1
out_is "${line1% cc off} cc dcqcn cnp-interval 20 ai-rate 2.5"
grep -qx 'sroce1 netdev lo addr 127.0.0.2 cc dcqcn cnp-interval 20 ai-rate 2.5' "$SROCE_CONFIG" ||
	fail "set wrote: $(cat "$SROCE_CONFIG")"
expect 0 "$sroce" -j link show sroce1
out_has '"cc":{"mode":"dcqcn","cnp-interval":20.0,"cnp-dscp":48.0,'
expect 0 "$sroce" link set sroce1 cc off
expect 0 "$sroce" link show sroce1
out_is "${line1} cnp-interval 20 ai-rate 2.5"
# Refused, each with its reason, and the file left as it was.
before=$(cat "$SROCE_CONFIG")
expect 2 "$sroce" link set sroce1
err_has "nothing to set"
expect 2 "$sroce" link set sroce1 cc
err_has "missing value after 'cc'"
expect 2 "$sroce" link set sroce1 cc maybe
err_has "unknown congestion control 'maybe' (expected dcqcn, off or default)"
expect 2 "$sroce" link set sroce1 stages 1.5
err_has "invalid stages '1.5' (stages, an integer from 0 to 100)"
expect 2 "$sroce" link set sroce1 cc dcqcn ai-rate 1 ai-rate 2
err_has "'ai-rate' given twice"
expect 2 "$sroce" link set sroce1 cc dcqcn cc off
err_has "'cc' given twice"
expect 2 "$sroce" link set sroce1 stages 3 cc default
err_has "'cc default' must come first"
expect 2 "$sroce" link set sroce1 mtu 1024
err_has "unknown keyword 'mtu'"
expect 1 "$sroce" link set nosuch cc off
err_has "link 'nosuch' does not exist"
[[ $(cat "$SROCE_CONFIG") == "$before" ]] || fail "refused sets changed the file: $(cat "$SROCE_CONFIG")"
expect 0 "$sroce" link set sroce1 cc default cc dcqcn ai-rate 2
expect 0 "$sroce" link show sroce1
[[ $out == *"cc dcqcn ai-rate 2" ]] || fail "cc default cc dcqcn ai-rate 2 gave: $out"
[[ $out != *cnp-interval* ]] || fail "cc default kept cnp-interval: $out"
expect 0 "$sroce" link set sroce1 cc default
expect 0 "$sroce" link show sroce1
out_is "$line1"

# --- del ---
expect 0 "$sroce" link del sroce0
out_is ""
expect 0 "$sroce" link show
out_is "$line1"
expect 1 "$sroce" link del sroce0
err_is_ours
err_has "link 'sroce0' does not exist"
expect 1 "$sroce" link del nosuch

# --- --config overrides SROCE_CONFIG ---
other=$tmp/other/links.conf
expect 0 "$sroce" --config "$other" link add sroce9 netdev lo addr 127.0.0.9
grep -q '^sroce9 ' "$other" || fail "--config did not write $other"
! grep -q '^sroce9 ' "$SROCE_CONFIG" || fail "--config also wrote \$SROCE_CONFIG"
expect 0 "$sroce" link show --config "$other"
out_has "link sroce9/1"
[[ $out != *sroce1* ]] || fail "--config after the command was ignored: $out"

# --- a hand-broken file is reported with its line number ---
bad=$tmp/bad.conf
printf '# ok\nsroce0 netdev lo addr 127.0.0.300\n' >"$bad"
expect 1 "$sroce" --config "$bad" link show
err_has "$bad:2:"

# --- a link whose interface has gone away is DOWN and has no MTU ---
gone=$tmp/gone.conf
printf 'sroce5 netdev gone0 addr 127.0.0.5\n' >"$gone"
expect 0 "$sroce" --config "$gone" link show
out_is "link sroce5/1 state DOWN physical_state DISABLED netdev gone0 addr 127.0.0.5 cc off"
expect 0 "$sroce" --config "$gone" -j link show
out_has '"state":"DOWN"'
[[ $out != *mtu* ]] || fail "a link without interface reports an MTU: $out"

# --- exec ---
shim=$tmp/lib/libsroce.so
mkdir -p "${shim%/*}"
: >"$shim"
# The placeholder is not an ELF object, so ld.so complains on stderr and goes
# on; only stdout is checked.
export SROCE_SHIM=$shim
expect 0 "$sroce" exec -- env
grep -qx "LD_PRELOAD=$shim" <<<"$out" || fail "exec -- env: LD_PRELOAD is not $shim: $(grep LD_PRELOAD <<<"$out")"
expect 0 "$sroce" exec env
out_has "LD_PRELOAD=$shim"
expect 0 env LD_PRELOAD="$tmp/other.so" "$sroce" exec -- env
grep -qx "LD_PRELOAD=$shim:$tmp/other.so" <<<"$out" ||
	fail "existing LD_PRELOAD not kept after the shim: $(grep LD_PRELOAD <<<"$out")"
expect 0 "$sroce" --config "$other" exec -- env
grep -qx "SROCE_CONFIG=$other" <<<"$out" || fail "--config not passed to the child"
expect 7 "$sroce" exec -- sh -c 'exit 7'
expect 0 "$sroce" exec sh -c 'printf "%s\n" "$@"' sh -j --config x -- link
out_is $'-j\n--config\nx\n--\nlink'
expect 2 "$sroce" exec
expect 2 "$sroce" exec --
expect 127 "$sroce" exec -- /nonexistent/program
err_has "/nonexistent/program"
SROCE_SHIM=$tmp/missing.so expect 1 "$sroce" exec -- env
err_is_ours
err_has "SROCE_SHIM"
unset SROCE_SHIM

# --- exec from an installed layout: PREFIX/bin/sroce and the library under
# its soname in PREFIX/lib, as a runtime-only package has it (no
# libsroce.so development link) ---
inst=$tmp/inst
mkdir -p "$inst/bin" "$inst/lib"
cp "$sroce" "$inst/bin/sroce"
soname=$(cd "$(dirname "$sroce")/../../libibverbs-ext/shim" 2>/dev/null && ls libsroce.so.[0-9]* 2>/dev/null |
	grep -xE 'libsroce\.so\.[0-9]+' | head -n1 || true)
if [[ -n $soname ]]; then
	: >"$inst/lib/$soname"
	expect 0 "$inst/bin/sroce" exec -- env
	grep -qx "LD_PRELOAD=$inst/lib/$soname" <<<"$out" ||
		fail "installed exec does not preload $inst/lib/$soname: $(grep LD_PRELOAD <<<"$out")"
	# With the development link beside it, the soname is still preferred.
	ln -s "$soname" "$inst/lib/libsroce.so"
	expect 0 "$inst/bin/sroce" exec -- env
	grep -qx "LD_PRELOAD=$inst/lib/$soname" <<<"$out" ||
		fail "installed exec prefers libsroce.so over $soname: $(grep LD_PRELOAD <<<"$out")"
fi

if ((failures)); then
	echo "$failures check(s) failed" >&2
	exit 1
fi
echo "all sroce CLI checks passed"
