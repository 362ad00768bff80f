#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Usage: check_pkgconfig.sh BUILD-DIR CC VERSION EXAMPLE.c HEADER-TEST.c
#
# Installs BUILD-DIR into a scratch prefix and checks libibverbs-ext.pc the way
# a user relies on it: valid, the project's version, and enough on its own to
# build the example and the strict C11 header test, with libsroce.so needed
# ahead of libibverbs.  Exits 77 (skipped) without pkg-config.
set -euo pipefail
build=${1:?usage: $0 BUILD-DIR CC VERSION EXAMPLE.c HEADER-TEST.c}
cc=$2 version=$3 example=$4 header_test=$5

command -v pkg-config >/dev/null || {
	echo "pkg-config is not installed"
	exit 77
}
work=$(mktemp -d "${TMPDIR:-/tmp}/verbs-ext-pc.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() {
	echo "FAIL: $*"
	exit 1
}

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
	{ cat "$work/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name libibverbs-ext.pc -path '*/pkgconfig/*')
[[ -n $pc ]] || fail "libibverbs-ext.pc was not installed"
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
echo "installed $pc"

pkg-config --validate libibverbs-ext || fail "pkg-config --validate"
got=$(pkg-config --modversion libibverbs-ext)
[[ $got == "$version" ]] || fail "version $got, expected $version"
pkg-config --print-requires libibverbs-ext | grep -qx 'libibverbs' || fail "Requires: libibverbs"
libdir=$(pkg-config --variable=libdir libibverbs-ext)
includedir=$(pkg-config --variable=includedir libibverbs-ext)
[[ $libdir == "$prefix"/* && $includedir == "$prefix"/* ]] ||
	fail "libdir $libdir or includedir $includedir is outside the install prefix"
for f in "$libdir/libsroce.so" "$includedir/infiniband/verbs_ext.h" \
	"$includedir/infiniband/verbs_ext_config.h"; do
	[[ -e $f ]] || fail "$f was not installed"
done
# Compressed as a distribution ships them; ibv_wr_flush(3) only where the
# rdma-core built against lacks it (it has its own page from 45 on).
pages=(ibv_wr_atomic_write.3 verbs_ext.7)
grep -q '^#define PMOF_VERBS_HAVE_UPSTREAM_FLUSH 1' "$includedir/infiniband/verbs_ext_config.h" ||
	pages+=(ibv_wr_flush.3)
for page in "${pages[@]}"; do
	[[ -n $(find "$prefix" -name "$page.gz" -path '*/man/*') ]] || fail "man page $page.gz was not installed"
done

read -ra flags <<<"$(pkg-config --cflags --libs libibverbs-ext)"
echo "pkg-config --cflags --libs libibverbs-ext: ${flags[*]}"
strict=(-std=c11 -Wall -Wextra -Werror -pedantic)
"$cc" "${strict[@]}" -o "$work/flush_example" "$example" "${flags[@]}" || fail "building the example"
"$cc" "${strict[@]}" -o "$work/header_test" "$header_test" "${flags[@]}" || fail "building the header test"

# DT_NEEDED order is symbol-lookup order: libsroce.so must come first.  With
# --as-needed the linker may leave libibverbs out altogether, every verb
# having been found in libsroce.so (which reaches libibverbs itself).
needed=$(readelf -d "$work/flush_example" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "flush_example needs: ${needed//$'\n'/ }"
sroce_at=$(grep -n '^libsroce\.so' <<<"$needed" | cut -d: -f1 || true)
verbs_at=$(grep -n '^libibverbs\.so' <<<"$needed" | cut -d: -f1 || true)
[[ -n $sroce_at ]] || fail "libsroce.so is not needed"
[[ -z $verbs_at || $sroce_at -lt $verbs_at ]] || fail "libibverbs is needed ahead of libsroce.so"

usage=$(LD_LIBRARY_PATH=$libdir "$work/flush_example" --help) || fail "flush_example --help"
grep -q '^Usage: ' <<<"$usage" || fail "flush_example --help printed no usage"
LD_LIBRARY_PATH=$libdir "$work/header_test" || fail "header test"
echo "ok"
