#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# An install under a prefix chosen at install time, as a user without root
# makes one:
#   - `cmake --install BUILD --prefix DIR` writes only under DIR (its
#     manifest, and nothing new under /usr or /etc/sroce), the libfabric
#     provider in DIR/LIBDIR/libfabric;
#   - the tree, then moved elsewhere, works with PATH not naming its bin/
#     and no agent running: a program with the moved libsroce.so in
#     LD_PRELOAD starts the moved sroce as its agent (found beside the
#     library), and so does one under the moved `sroce exec`;
#   - libfabric finds the moved provider through FI_PROVIDER_PATH, as the
#     README says.
#
# Usage: test_install_prefix.sh BUILD-DIR
# ctest: TIMEOUT=300 RESOURCE_LOCK=lo-127.0.27.1,lo-127.0.27.2
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_install_prefix.sh BUILD-DIR}"
require_cmds cmake ibv_devinfo ibv_rc_pingpong ss
require_loopback
# An agent of this test's own, which must not be running when the
# programs start.
private_agent

# --------------------------------------------------------------- install
prefix=$WORK/prefix
stamp=$WORK/stamp
touch "$stamp"
sleep 1 # file times have a resolution of their own
if ! cmake --install "$BUILD_DIR" --prefix "$prefix" >"$WORK/install.log" 2>&1; then
	cat "$WORK/install.log"
	die "cmake --install --prefix failed"
fi
manifest=$BUILD_DIR/install_manifest.txt
outside=$(grep -v "^$prefix/" "$manifest")
if [[ -z $outside ]]; then
	pass "cmake --install --prefix: all $(wc -l <"$manifest") files under the prefix"
else
	fail "cmake --install --prefix wrote outside the prefix" "$outside"
fi
# What a manifest would not list (install(CODE) writing elsewhere).
stray=$(find /usr /etc/sroce -xdev -cnewer "$stamp" ! -type d 2>/dev/null |
	grep -v -e '/__pycache__/' -e '\.pyc$' | head -n 20)
if [[ -z $stray ]]; then
	pass "nothing new under /usr or /etc/sroce"
else
	fail "the install wrote outside the prefix" "$stray"
fi

libdir=$(dirname "$(find "$prefix" -name 'libsroce.so.[0-9]' | head -n1)")
[[ -d $libdir ]] || die "no libsroce.so.N under $prefix"
libdir_rel=${libdir#"$prefix"/}
if [[ -f $libdir/libfabric/libpmof-fi.so ]]; then
	pass "the libfabric provider in PREFIX/$libdir_rel/libfabric"
else
	fail "no libpmof-fi.so in PREFIX/$libdir_rel/libfabric" "$(find "$prefix" -name 'libpmof-fi.so')"
fi
pc=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs libibverbs-ext 2>&1)
if [[ $pc == *"-I$prefix/include"* && $pc == *"-L$libdir"* ]]; then
	pass "pkg-config names the prefix: $pc"
else
	fail "pkg-config --cflags --libs libibverbs-ext: $pc"
fi

# ------------------------------------------------------------ relocated
moved=$WORK/moved
mv "$prefix" "$moved"
libdir=$moved/$libdir_rel
shim=$libdir/libsroce.so.0
[[ -x $moved/bin/sroce && -f $shim ]] || die "the moved tree lacks bin/sroce or $libdir_rel/libsroce.so.0"
export SROCE_CONFIG=$WORK/links.conf
"$moved/bin/sroce" --config "$SROCE_CONFIG" link add ip0 netdev lo addr 127.0.27.1 &&
	"$moved/bin/sroce" --config "$SROCE_CONFIG" link add ip1 netdev lo addr 127.0.27.2 ||
	die "sroce link add failed"
clean_path=/usr/sbin:/usr/bin:/sbin:/bin
unset SROCE_AGENT_BIN

# agent_from WHAT: checks that an agent runs now and is the moved sroce;
# stops it, so that the next step starts one again.
agent_from() {
	local pid exe
	pid=$("$moved/bin/sroce" agent status 2>/dev/null | sed -n 's/^  "pid": \([0-9][0-9]*\).*/\1/p')
	exe=$( [[ -n $pid ]] && readlink "/proc/$pid/exe")
	if [[ $exe == "$moved/bin/sroce" ]]; then
		pass "$1 started the moved sroce as the agent"
	else
		fail "$1: the agent is '${exe:-not running}', not $moved/bin/sroce" "$("$moved/bin/sroce" agent status 2>&1)"
	fi
	"$moved/bin/sroce" agent stop >/dev/null 2>&1 || true
}

"$moved/bin/sroce" agent stop >/dev/null 2>&1 || true
if "$moved/bin/sroce" agent status >/dev/null 2>&1; then
	die "an agent on socket $SROCE_AGENT_SOCKET runs already"
fi

# A pingpong pair with the moved library preloaded, PATH without its bin/.
next_port
env PATH=$clean_path LD_PRELOAD="$shim" timeout -k 5 60 \
	ibv_rc_pingpong -d ip0 -g 1 -n 200 -p "$PORT" >"$WORK/server.log" 2>&1 &
spid=$!
SROCE_BG_PIDS+=("$spid")
rc=0
if wait_listen "$PORT" "$spid"; then
	env PATH=$clean_path LD_PRELOAD="$shim" timeout -k 5 60 \
		ibv_rc_pingpong -d ip1 -g 1 -n 200 -p "$PORT" 127.0.27.1 >"$WORK/client.log" 2>&1 || rc=$?
else
	rc=1
fi
wait "$spid" || rc=$?
if ((rc == 0)) && grep -q '200 iters' "$WORK/client.log"; then
	pass "ibv_rc_pingpong with the moved libsroce.so preloaded: $(grep 'iters in' "$WORK/client.log")"
else
	fail "ibv_rc_pingpong with the moved libsroce.so preloaded (exit $rc)" \
		"$(tail -n 5 "$WORK/server.log" "$WORK/client.log")"
fi
agent_from "a preloading program"

# `sroce exec` of the moved tree.
out=$(env PATH=$clean_path "$moved/bin/sroce" exec -- ibv_devinfo -d ip0 2>&1)
if [[ $out == *PORT_ACTIVE* ]]; then
	pass "the moved sroce exec: ibv_devinfo -d ip0 shows the port active"
else
	fail "the moved sroce exec -- ibv_devinfo -d ip0" "$out"
fi
agent_from "a program under the moved sroce exec"

# The provider of the moved tree, through FI_PROVIDER_PATH.
if command -v fi_info >/dev/null; then
	out=$(env PATH=$clean_path FI_PROVIDER_PATH="$libdir/libfabric" FI_PROVIDER=pmof \
		"$moved/bin/sroce" exec -- fi_info -p pmof 2>&1)
	if [[ $out == *"provider: pmof"* ]]; then
		pass "fi_info finds the moved provider through FI_PROVIDER_PATH"
	else
		fail "fi_info -p pmof with FI_PROVIDER_PATH=$libdir/libfabric" "$(head -n 5 <<<"$out")"
	fi
	"$moved/bin/sroce" agent stop >/dev/null 2>&1 || true
else
	log "fi_info not installed (libfabric-bin): the provider is not tried"
fi
finish
