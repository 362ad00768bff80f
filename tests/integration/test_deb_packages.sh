#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The Debian packages as a user of a clean Debian 12 or Debian 13 system gets
# them.  Packages are built for the release they are installed on:
#   - bookworm (Debian 12, rdma-core 44): with CPack on this host, from a
#     Release tree of its own (BUILD-DIR/deb-packages, configured as a
#     distribution would: -DCMAKE_INSTALL_PREFIX=/usr, warnings not errors;
#     kept for the next run);
#   - trixie (Debian 13, rdma-core 56): the same, inside a trixie root with
#     the build dependencies (kept in the cache with its build tree, so a
#     later run rebuilds only what changed).
# lintian checks each release's packages (the host's lintian for bookworm's,
# if scripts/setup.sh root installed it; the build root's for trixie's):
# errors fail the test, warnings are printed; LINTIAN_SUPPRESS says which
# tags are not ours to fix and why.  Then, for each release, a minbase root
# made with debootstrap from the mirror the host uses gets the packages with
# apt, which fetches their dependencies, and inside that root the test checks:
#   - with the runtime packages only (libsroce0, sroce): `sroce link add` into
#     the packaged /etc/sroce/links.conf on 127.0.16.1 and 127.0.16.2, that
#     `sroce exec` preloads the library under its soname, `ibv_devinfo` and an
#     `ibv_rc_pingpong` server and client pair over the two devices;
#   - then with libsroce-dev: that the other release's libsroce-dev is
#     refused beside this release's libibverbs-dev, and that its libibverbs-dev
#     dependency is bounded as its verbs_ext_config.h is (>= 44, << 45 on
#     bookworm; >= 45 on trixie); <infiniband/verbs_ext.h> builds as strict
#     C11 with `pkg-config --cflags libibverbs-ext`, and a program linked with
#     `pkg-config --libs` sees the devices without LD_PRELOAD;
#   - then with libfabric-pmof: the root's libfabric finds the provider in
#     its provider directory (/usr/lib/MULTIARCH/libfabric), with no
#     FI_PROVIDER_PATH (`fi_info -p pmof` under `sroce exec` lists both
#     devices), and a strict C11 program with <rdma/fi_ext_pmof.h>, linked
#     with -lfabric only, gets an answer from fi_pmof_query();
#   - the man pages (with man-db): all gzip -9n compressed, no file of ours
#     under another package's name with or without .gz, each of our pages
#     the one `man -aw` finds for its name, and `man -w ibv_wr_flush` the
#     page of libibverbs-dev where rdma-core >= 45 documents it (trixie), the
#     only one of that name, ours where it does not (bookworm).
#
# The roots share the host's network stack, so the devices are on the host's
# lo.  Cached in SROCE_DEB_CACHE (default /var/tmp/sroce-deb-test): the base
# roots (tarballs), apt's downloads and the build roots of other releases
# (BUILD-SUITE), so only the first run downloads and builds much; each run
# unpacks its install roots there too (roots/PID).  SROCE_DEB_SUITES
# (default "bookworm trixie") chooses the releases.  SROCE_DEB_DIR=DIR tests
# the .deb files in DIR/SUITE (or in DIR, for one release) instead of
# building them.  SROCE_DEB_MIRROR=URL overrides the mirror.  Skipped (77)
# only when a root cannot be made here: not root, no debootstrap, no mount
# namespace or no Debian mirror in the apt sources.
#
# Usage: test_deb_packages.sh BUILD-DIR
# ctest: TIMEOUT=3000 LABELS=slow RESOURCE_LOCK=lo-127.0.16.1,lo-127.0.16.2 PROCESSORS=2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${SROCE_DEB_CACHE:-/var/tmp/sroce-deb-test}
read -r -a SUITES <<<"${SROCE_DEB_SUITES:-bookworm trixie}"
# The release this host builds for; the others are built in a root.
HOST_SUITE=$(. /etc/os-release 2>/dev/null && [[ ${ID:-} == debian ]] && echo "${VERSION_CODENAME:-}")
HOST_SUITE=${HOST_SUITE:-bookworm}

# What a distribution build of the packages needs (the top-level and
# component CMakeLists.txt; `file` and dpkg-shlibdeps for CPack), and lintian.
BUILD_DEPS="build-essential cmake ninja-build pkg-config file libibverbs-dev librdmacm-dev
	libpmem-dev libfabric-dev libisal-dev libcli11-dev nlohmann-json3-dev lintian"

# lintian tags that are not ours to fix, and why (the rest fail the test on
# errors, or are printed):
#   no-changelog: CPack writes no Debian changelog; the project's history
#     is its git log.
#   malformed-contact: the Maintainer field is SROCE_PACKAGE_CONTACT,
#     which whoever distributes the packages sets to their own address.
LINTIAN_SUPPRESS=no-changelog,malformed-contact

. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"
debroot_require
require_cmds ss tar md5sum
require_loopback

mirror_of() { # SUITE
	local m=${SROCE_DEB_MIRROR:-$(debroot_find_mirror "$1")}
	[[ -n $m ]] || skip "no mirror serving $1 in /etc/apt/sources.list*"
	echo "$m"
}
for suite in "${SUITES[@]}"; do
	log "$suite mirror: $(mirror_of "$suite")"
done

# lintian's options, and lintian_report SUITE LOG FAILED: prints what
# lintian said of SUITE's packages; the test fails at the end if it found
# errors (the roots are checked all the same).
lintian_args=(--fail-on error --display-level ">=warning" --suppress-tags "$LINTIAN_SUPPRESS")
LINTIAN_FAILED=()
lintian_report() { # SUITE LOG FAILED
	grep -v 'running with root privileges' "$2" | sed "s/^/  lintian $1| /"
	log "lintian: $1 packages: $(grep -c '^E:' "$2") errors, $(grep -c '^W:' "$2") warnings"
	(($3 == 0)) || LINTIAN_FAILED+=("$1")
}

# -------------------------------------------------------------- packages
# build_on_host DIR: the packages of this host's release into DIR.
build_on_host() {
	local out=$1 pkg_build=$BUILD_DIR/deb-packages start gen=() rc=0
	require_cmds cmake cpack dpkg-shlibdeps file
	start=$(now)
	if [[ ! -f $pkg_build/CMakeCache.txt ]]; then
		command -v ninja >/dev/null && gen=(-G Ninja)
		cmake -S "$SRC_DIR" -B "$pkg_build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
			-DCMAKE_INSTALL_PREFIX=/usr -DSROCE_TESTS=OFF >"$WORK/configure.log" 2>&1 ||
			{ cat "$WORK/configure.log"; die "configuring $pkg_build failed"; }
	fi
	cmake --build "$pkg_build" -j2 >"$WORK/build.log" 2>&1 ||
		{ tail -n 50 "$WORK/build.log"; die "building $pkg_build failed"; }
	rm -f "$pkg_build"/*.deb
	(cd "$pkg_build" && cpack -G DEB) >"$WORK/cpack.log" 2>&1 ||
		{ cat "$WORK/cpack.log"; die "cpack failed"; }
	cp "$pkg_build"/*.deb "$out"/
	log "$HOST_SUITE packages built on this host in $(elapsed "$start") s"
	if command -v lintian >/dev/null; then
		start=$(now)
		lintian "${lintian_args[@]}" "$out"/*.deb >"$WORK/lintian-$HOST_SUITE.log" 2>&1 || rc=$?
		lintian_report "$HOST_SUITE" "$WORK/lintian-$HOST_SUITE.log" "$rc"
		log "lintian on this host: $(elapsed "$start") s"
	else
		log "lintian not installed (scripts/setup.sh root): the $HOST_SUITE packages are not linted"
	fi
}

# build_in_root SUITE DIR: the packages of SUITE into DIR, built in a root of
# SUITE kept in the cache (made afresh when its base changed, or a run broke
# off while making it), with BUILD_DEPS installed once and the build tree
# kept in /build.
build_in_root() {
	local suite=$1 out=$2 mirror base root start rc=0
	mirror=$(mirror_of "$suite")
	base=$(debroot_base "$suite" "$mirror" "$CACHE")
	root=$CACHE/build-$suite
	start=$(now)
	if [[ ! -d $root || "$(cat "$root.base" 2>/dev/null)" != "$base" ]]; then
		rm -f "$root.base"
		rm -rf --one-file-system "$root"
		mkdir -p "$root"
		tar -C "$root" -xf "$base"
		debroot_apt_sources "$root" "$mirror" "$suite"
		echo "$base" >"$root.base"
	fi
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	debroot_copy_source "$SRC_DIR" "$root/src"
	# Run inside: installs what is missing, configures once, builds, packs.
	cat >"$root/tmp/build.sh" <<'EOF'
set -euo pipefail
deps=$1
shift
export DEBIAN_FRONTEND=noninteractive
t=$(date +%s)
if [ "$(cat /var/lib/sroce-build-deps 2>/dev/null)" != "$deps" ]; then
	apt-get update -q >/tmp/apt.log 2>&1 &&
		apt-get install -y -q --no-install-recommends $deps >>/tmp/apt.log 2>&1 ||
		{ cat /tmp/apt.log; exit 1; }
	echo "$deps" >/var/lib/sroce-build-deps
	echo "build dependencies installed: $(($(date +%s) - t)) s"
fi
echo "libibverbs-dev $(dpkg-query -W -f '${Version}' libibverbs-dev)"
t=$(date +%s)
if [ ! -f /build/CMakeCache.txt ]; then
	cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
		-DSROCE_TESTS=OFF >/tmp/configure.log 2>&1 || { cat /tmp/configure.log; exit 1; }
fi
cmake --build /build -j2 >/tmp/build.log 2>&1 || { tail -n 50 /tmp/build.log; exit 1; }
rm -rf /build/*.deb /debs
(cd /build && cpack -G DEB) >/tmp/cpack.log 2>&1 || { cat /tmp/cpack.log; exit 1; }
mkdir /debs
cp /build/*.deb /debs/
echo "build and cpack: $(($(date +%s) - t)) s"
t=$(date +%s)
rc=0
lintian "$@" /debs/*.deb >/tmp/lintian.log 2>&1 || rc=$?
echo "lintian: $(($(date +%s) - t)) s"
exit $((rc == 0 ? 0 : 100))
EOF
	DEBROOT_TIMEOUT=2400 debroot_run "$root" "$CACHE/apt-archives" -- \
		bash /tmp/build.sh "$(tr -s ' \t\n' ' ' <<<"$BUILD_DEPS")" "${lintian_args[@]}" \
		>"$WORK/build-$suite.log" 2>&1 || rc=$?
	sed "s/^/  build $suite| /" "$WORK/build-$suite.log"
	((rc == 0 || rc == 100)) || die "building the $suite packages failed (exit $rc)"
	cp "$root"/debs/*.deb "$out"/
	log "$suite packages built in a $suite root in $(elapsed "$start") s"
	lintian_report "$suite" "$root/tmp/lintian.log" $((rc == 100))
}

debroot_lock "$CACHE"
mkdir -p "$CACHE/roots"
debroot_remove_stale "$CACHE/roots"
for suite in "${SUITES[@]}"; do
	debs=$WORK/debs/$suite
	mkdir -p "$debs"
	if [[ -n ${SROCE_DEB_DIR:-} ]]; then
		dir=$SROCE_DEB_DIR/$suite
		[[ -d $dir ]] || dir=$SROCE_DEB_DIR
		cp "$dir"/*.deb "$debs"/ || die "no .deb files in $dir"
	elif [[ $suite == "$HOST_SUITE" ]]; then
		build_on_host "$debs"
	else
		build_in_root "$suite" "$debs"
	fi
	for p in libsroce0 libsroce-dev sroce libfabric-pmof; do
		compgen -G "$debs/${p}_*.deb" >/dev/null || die "no $p package among: $(ls "$debs")"
	done
	for d in "$debs"/*.deb; do
		log "$suite $(basename "$d"): Depends: $(dpkg-deb -f "$d" Depends)"
	done
done

# ------------------------------------------------------------- the checks
# Run inside a root by bash, with the TCP port for ibv_rc_pingpong, the
# package version and the other release whose packages are in
# /tmp/other-debs as arguments.
cat >"$WORK/check.sh" <<'EOF'
set -uo pipefail
port=$1 version=$2 other_suite=${3:-}
export DEBIAN_FRONTEND=noninteractive
# The packaged agent, not one a program of the host's build tree started
# (the root shares the host's network namespace).
export SROCE_AGENT_SOCKET=sroce-deb-test-$$
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
check() { # check NAME CMD...: passes when CMD succeeds, else prints its output
	local name=$1 out
	shift
	if out=$("$@" 2>&1); then pass "$name"; else fail "$name: $out"; fi
}
apt_install() {
	apt-get install -y -q --no-install-recommends "$@" >/tmp/apt.log 2>&1 ||
		{ cat /tmp/apt.log; return 1; }
}

apt-get update -q >/tmp/apt-update.log 2>&1 || { cat /tmp/apt-update.log; exit 1; }
check "install libsroce0, sroce and ibverbs-utils" \
	apt_install /tmp/debs/libsroce0_*.deb /tmp/debs/sroce_*.deb ibverbs-utils
command -v sroce >/dev/null || { echo "sroce is not installed"; exit 1; }

shim=$(dpkg -L libsroce0 | grep '/libsroce\.so\.0$' || true)
check "libsroce0 ships the library under its soname" test -n "$shim"
check "no libsroce.so development link without libsroce-dev" \
	test ! -e "${shim%.0}"
check "/etc/sroce/links.conf is a conffile of libsroce0" \
	grep -qx /etc/sroce/links.conf /var/lib/dpkg/info/libsroce0.conffiles
check "sroce --version is $version" bash -c "sroce --version | grep -qw '$version'"

# The default configuration, the packaged file.
unset SROCE_CONFIG
check "sroce link add pkg0" sroce link add pkg0 netdev lo addr 127.0.16.1
check "sroce link add pkg1" sroce link add pkg1 netdev lo addr 127.0.16.2
check "links written to /etc/sroce/links.conf" grep -q '^pkg1 netdev lo addr 127.0.16.2$' /etc/sroce/links.conf
check "sroce link show: both ACTIVE" \
	bash -c "[ \$(sroce link show | grep -c 'state ACTIVE') = 2 ]"
check "sroce exec preloads $shim" \
	bash -c "sroce exec -- env | grep -qx 'LD_PRELOAD=$shim'"
check "sroce exec -- ibv_devinfo -d pkg0" \
	bash -c "out=\$(timeout 30 sroce exec -- ibv_devinfo -d pkg0 2>&1) &&
		grep -q 'hca_id:.*pkg0' <<<\"\$out\" && grep -q PORT_ACTIVE <<<\"\$out\" || { echo \"\$out\"; exit 1; }"

# ibv_rc_pingpong: the server on pkg0, the client on pkg1 once the server's
# TCP port listens (/proc/net/tcp: the root has no ss).
timeout 60 sroce exec -- ibv_rc_pingpong -d pkg0 -g 1 -n 200 -p "$port" >/tmp/server.log 2>&1 &
server=$!
hexport=$(printf ':%04X ' "$port")
for _ in $(seq 200); do
	grep -q "$hexport[0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
	kill -0 "$server" 2>/dev/null || break
	sleep 0.05
done
client_rc=0
timeout 60 sroce exec -- ibv_rc_pingpong -d pkg1 -g 1 -n 200 -p "$port" 127.0.0.1 >/tmp/client.log 2>&1 ||
	client_rc=$?
server_rc=0
wait "$server" || server_rc=$?
if ((client_rc == 0 && server_rc == 0)) && grep -q 'iters in' /tmp/client.log &&
	grep -q 'iters in' /tmp/server.log; then
	pass "ibv_rc_pingpong pkg0 <-> pkg1: $(grep 'iters in' /tmp/client.log)"
else
	fail "ibv_rc_pingpong (client exit $client_rc, server exit $server_rc)"
	echo "--- server"; cat /tmp/server.log; echo "--- client"; cat /tmp/client.log
fi

# The development package.  Its libibverbs-dev dependency is bounded as
# the generated verbs_ext_config.h is (packaging/CMakeLists.txt): the
# package built for another release (if this run built one) must not go in
# beside this release's libibverbs-dev.
if compgen -G "/tmp/other-debs/libsroce-dev_*.deb" >/dev/null; then
	check "$(basename /tmp/other-debs/libsroce-dev_*.deb) of $other_suite is refused here" \
		bash -c "! apt-get install -s -q /tmp/other-debs/libsroce-dev_*.deb >/tmp/apt-other.log 2>&1 &&
			grep -q 'libibverbs-dev' /tmp/apt-other.log || { cat /tmp/apt-other.log; exit 1; }"
fi
check "install libsroce-dev, gcc, pkg-config" \
	apt_install /tmp/debs/libsroce-dev_*.deb gcc libc6-dev pkg-config
ibverbs_dev=$(dpkg-query -W -f '${Version}' libibverbs-dev 2>/dev/null)
depends=$(dpkg-query -W -f '${Depends}' libsroce-dev 2>/dev/null)
if dpkg --compare-versions "$ibverbs_dev" ge 45; then
	check "libsroce-dev for libibverbs-dev $ibverbs_dev: Depends $depends" \
		bash -c "grep -q 'libibverbs-dev (>= 45)' <<<'$depends' && ! grep -q '<<' <<<'$depends'"
else
	check "libsroce-dev for libibverbs-dev $ibverbs_dev: Depends $depends" \
		grep -q 'libibverbs-dev (<< 45)' <<<"$depends"
fi
check "pkg-config --modversion libibverbs-ext is $version" \
	bash -c "[ \"\$(pkg-config --modversion libibverbs-ext)\" = '$version' ]"
cat >/tmp/header.c <<'C'
#include <infiniband/verbs_ext.h>
#include <stdio.h>
#include <string.h>

/* Lists the devices; the sroce ones are there only through libsroce. */
int main(void) {
    int n = 0, found = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    for (int i = 0; i < n; i++)
        found += strcmp(ibv_get_device_name(list[i]), "pkg0") == 0;
    if (list) ibv_free_device_list(list);
    printf("%d devices, pkg0 %s\n", n, found ? "found" : "missing");
    return found ? 0 : 1;
}
C
check "header builds: gcc -std=c11 -pedantic -Werror \$(pkg-config --cflags libibverbs-ext)" \
	bash -c 'gcc -std=c11 -Wall -Wextra -Werror -pedantic $(pkg-config --cflags libibverbs-ext) -c /tmp/header.c -o /tmp/header.o'
check "links with \$(pkg-config --libs libibverbs-ext)" \
	bash -c 'gcc /tmp/header.o -o /tmp/header $(pkg-config --libs libibverbs-ext)'
check "linked program sees pkg0 without LD_PRELOAD" \
	bash -c 'env -u LD_PRELOAD timeout 30 /tmp/header'

# The provider where the root's libfabric looks for providers by itself:
# FI_PROVIDER_PATH, which the build tree needs, is not set.
check "install libfabric-pmof, libfabric-bin, libfabric-dev" \
	apt_install /tmp/debs/libfabric-pmof_*.deb libfabric-bin libfabric-dev
check "libfabric-pmof ships /usr/lib/$(gcc -print-multiarch)/libfabric/libpmof-fi.so, fi_pmof(7) and its copyright" \
	bash -c "files=\$(dpkg -L libfabric-pmof) &&
		grep -qx /usr/lib/$(gcc -print-multiarch)/libfabric/libpmof-fi.so <<<\"\$files\" &&
		grep -qx /usr/share/man/man7/fi_pmof.7.gz <<<\"\$files\" &&
		grep -qx /usr/share/doc/libfabric-pmof/copyright <<<\"\$files\""
check "fi_info -p pmof without FI_PROVIDER_PATH lists pkg0 and pkg1" \
	bash -c "out=\$(env -u FI_PROVIDER_PATH timeout 30 sroce exec -- fi_info -p pmof 2>&1) &&
		grep -q 'provider: pmof' <<<\"\$out\" && grep -q 'domain: pkg0' <<<\"\$out\" &&
		grep -q 'domain: pkg1' <<<\"\$out\" || { echo \"\$out\"; exit 1; }"
cat >/tmp/pmof.c <<'C'
#include <rdma/fi_ext_pmof.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first pmof domain, and what fi_pmof_query() says of it: the
 * extensions reach the provider through libfabric alone. */
int main(void) {
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    struct fid_fabric *fabric = NULL;
    struct fid_domain *domain = NULL;
    struct fi_pmof_attr attr = {.size = sizeof(attr)};
    int rc = -1;

    if (!hints || !(hints->fabric_attr->prov_name = malloc(sizeof("pmof")))) return 1;
    memcpy(hints->fabric_attr->prov_name, "pmof", sizeof("pmof"));
    hints->ep_attr->type = FI_EP_MSG;
    /* The MR modes it can work with: none would get -FI_ENODATA. */
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    if (fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0 &&
        fi_fabric(info->fabric_attr, &fabric, NULL) == 0 &&
        fi_domain(fabric, info, &domain, NULL) == 0)
        rc = fi_pmof_query(domain, &attr);
    printf("%s: fi_pmof_query %d, commit_flags %#llx\n",
           info ? info->domain_attr->name : "no pmof domain", rc,
           (unsigned long long)attr.commit_flags);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return rc == 0 && (attr.commit_flags & FI_COMMIT) ? 0 : 1;
}
C
check "<rdma/fi_ext_pmof.h> builds: gcc -std=c11 -pedantic -Werror ... -lfabric" \
	gcc -std=c11 -Wall -Wextra -Werror -pedantic /tmp/pmof.c -o /tmp/pmof -lfabric
check "fi_pmof_query() reaches the packaged provider" \
	env -u FI_PROVIDER_PATH timeout 30 sroce exec -- /tmp/pmof

# Man pages: compressed as Debian wants them, and no name documented twice.
# man-db prefers NAME.3 to NAME.3.gz in one directory and shows either,
# whatever the other package: so pages are counted as files, and no file
# of ours may have the name of another package's, with or without .gz.
check "install man-db" apt_install man-db
pkgs="libsroce0 libsroce-dev sroce libfabric-pmof"
pages=$(dpkg -L $pkgs | grep '^/usr/share/man/man[1-8]/.' | sort -u)
check "man pages: $(wc -w <<<"$pages") of them" test -n "$pages"
check "man pages are gzip -9n compressed (no name, no time)" bash -c '
	for f in '"$(tr '\n' ' ' <<<"$pages")"'; do
		case $f in *.gz) ;; *) echo "$f: not compressed"; exit 1 ;; esac
		# Header: flags (byte 3) without FNAME, MTIME (bytes 4-7) zero, XFL
		# (byte 8) 2: the strongest compression.
		[ "$(od -An -tx1 -j3 -N6 "$f" | tr -d " \n")" = 000000000002 ] ||
			{ echo "$f: has a name or a time, or is not -9"; exit 1; }
		gzip -t "$f" || exit 1
	done'
dups=$(comm -12 <(for p in $pkgs; do dpkg -L "$p"; done | while read -r f; do
	[ -d "$f" ] || echo "${f%.gz}"; done | sort -u) \
	<(for l in /var/lib/dpkg/info/*.list; do
		case ${l##*/} in libsroce0.list | libsroce-dev.list | sroce.list | libfabric-pmof.list) ;;
		*) sed 's/\.gz$//' "$l" ;; esac
	done | sort -u))
check "no file of ours has another package's name, with or without .gz" \
	bash -c "[ -z '$dups' ] || { echo '$dups'; exit 1; }"
for f in $pages; do
	page=${f##*/} page=${page%.gz}
	name=${page%.*} section=${page##*.}
	# man -w follows a .so page to the page it names: one path either way.
	found=$(ls -d "${f%/*}/$page" "${f%/*}/$page".* 2>/dev/null)
	manw=$(man -aw "$section" "$name" 2>/dev/null)
	check "man $section $name: $f, the one page of that name, formats" \
		bash -c "[ '$found' = '$f' ] && [ \$(wc -l <<<'$manw') = 1 ] || { echo '$found' '$manw'; exit 1; }
			out=\$(man $section $name 2>&1 >/dev/null) && [ -z \"\$out\" ] &&
			man $section $name | grep -q . || { echo \"\$out\"; exit 1; }"
done
# ibv_wr_flush: rdma-core >= 45 documents it (ibv_wr_flush.3.gz, an alias
# of ibv_wr_post.3 in libibverbs-dev), and then it is that page alone.
if dpkg --compare-versions "$ibverbs_dev" ge 45; then want=libibverbs-dev; else want=libsroce-dev; fi
flush=$(man -w 3 ibv_wr_flush 2>/dev/null)
owner=$(dpkg -S "$flush" 2>/dev/null | cut -d: -f1)
check "man -w ibv_wr_flush: $flush of $owner (libibverbs-dev $ibverbs_dev: $want's)" \
	test "$owner" = "$want"
flush_pages=$(ls -d /usr/share/man/man3/ibv_wr_flush.3 /usr/share/man/man3/ibv_wr_flush.3.* 2>/dev/null)
check "one page for ibv_wr_flush: $(tr '\n' ' ' <<<"$flush_pages")" \
	test "$(wc -l <<<"$flush_pages")" = 1
# rdma-core's page draws troff's warnings of tables too wide for 80
# columns: not ours, so only the text is looked at.
check "man ibv_wr_flush formats" bash -c "man 3 ibv_wr_flush 2>/dev/null | grep -q ibv_wr_flush"

sroce agent stop 2>/dev/null
echo "$passed checks passed, $failed failed"
((failed == 0))
EOF


# check_in_root SUITE: a minbase root of SUITE as debootstrap makes it (a
# cached tarball per mirror) gets SUITE's packages and runs the checks.
check_in_root() {
	local suite=$1 mirror base other="" s version start rc=0
	mirror=$(mirror_of "$suite")
	base=$(debroot_base "$suite" "$mirror" "$CACHE")
	ROOT=$CACHE/roots/$$
	rm -rf --one-file-system "$ROOT"
	mkdir "$ROOT"
	tar -C "$ROOT" -xf "$base"
	debroot_apt_sources "$ROOT" "$mirror" "$suite"
	mkdir -p "$ROOT/tmp/debs" "$ROOT/tmp/other-debs"
	cp "$WORK/debs/$suite"/*.deb "$ROOT/tmp/debs/"
	for s in "${SUITES[@]}"; do
		[[ $s != "$suite" ]] || continue
		other=$s
		cp "$WORK/debs/$s"/libsroce-dev_*.deb "$ROOT/tmp/other-debs/"
		break
	done
	cp "$WORK/check.sh" "$ROOT/tmp/check.sh"
	next_port
	version=$(dpkg-deb -f "$(compgen -G "$WORK/debs/$suite/sroce_*.deb" | head -n1)" Version)
	version=${version%-*}
	start=$(now)
	DEBROOT_TIMEOUT=900 debroot_run "$ROOT" "$CACHE/apt-archives" -- \
		bash /tmp/check.sh "$PORT" "$version" "$other" >"$WORK/check-$suite.log" 2>&1 || rc=$?
	sed "s/^/  $suite| /" "$WORK/check-$suite.log"
	log "checks in the $suite root: $(elapsed "$start") s"
	rm -rf --one-file-system "$ROOT"
	((rc == 0)) || die "checks in the $suite root failed (exit $rc)"
}

remove_root() {
	# Mounts live only in the namespaces of the chroot runs, which are gone
	# by now; --one-file-system guards against anything still mounted.
	[[ -n ${ROOT:-} && -d $ROOT ]] && rm -rf --one-file-system "$ROOT"
	_sroce_cleanup
}
trap remove_root EXIT
for suite in "${SUITES[@]}"; do
	check_in_root "$suite"
done
((${#LINTIAN_FAILED[@]} == 0)) || die "lintian finds errors in the ${LINTIAN_FAILED[*]} packages"
echo "Debian packages install and work on clean ${SUITES[*]} roots"
