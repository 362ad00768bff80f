#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The Debian packages as a user of a clean Debian 12 system gets them.
# Builds them with CPack from a Release tree of its own (BUILD-DIR/deb-packages,
# configured as a distribution would: -DCMAKE_INSTALL_PREFIX=/usr, warnings not
# errors; kept for the next run), makes a bookworm root with debootstrap from
# the mirror the host uses, installs the packages there with apt, which fetches
# their dependencies, and inside that root checks:
#   - with the runtime packages only (libsroce0, sroce): `sroce link add` into
#     the packaged /etc/sroce/links.conf on 127.0.16.1 and 127.0.16.2, that
#     `sroce exec` preloads the library under its soname, `ibv_devinfo` and an
#     `ibv_rc_pingpong` server and client pair over the two devices;
#   - then with libsroce-dev: <infiniband/verbs_ext.h> builds as strict C11
#     with `pkg-config --cflags libibverbs-ext`, and a program linked with
#     `pkg-config --libs` sees the devices without LD_PRELOAD;
#   - then with libfabric-pmof: the root's libfabric finds the provider in
#     its provider directory, with no FI_PROVIDER_PATH (`fi_info -p pmof`
#     under `sroce exec` lists both devices), and a strict C11 program with
#     <rdma/fi_ext_pmof.h>, linked with -lfabric only, gets an answer from
#     fi_pmof_query().
#
# The root shares the host's network stack, so the devices are on the host's
# lo.  The base root (a tarball) and apt's downloads are cached in
# SROCE_DEB_CACHE (default /var/tmp/sroce-deb-test), so only the first run
# downloads much; each run unpacks its root there too (roots/PID).  SROCE_DEB_DIR=DIR tests the .deb files in DIR instead of
# building them; SROCE_DEB_MIRROR=URL overrides the mirror.  Skipped (77) only
# when a root cannot be made here: not root, no debootstrap, no mount namespace
# or no Debian mirror in the apt sources.
#
# Usage: test_deb_packages.sh BUILD-DIR
# ctest: TIMEOUT=1800 LABELS=slow RESOURCE_LOCK=lo-127.0.16.1,lo-127.0.16.2 PROCESSORS=2
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: $0 BUILD-DIR}"
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SUITE=bookworm
CACHE=${SROCE_DEB_CACHE:-/var/tmp/sroce-deb-test}

. "$(dirname "${BASH_SOURCE[0]}")/debroot.sh"
debroot_require
require_cmds ss
require_loopback

MIRROR=${SROCE_DEB_MIRROR:-$(debroot_find_mirror "$SUITE")}
[[ -n $MIRROR ]] || skip "no mirror serving $SUITE in /etc/apt/sources.list*"
log "mirror: $MIRROR"

# --------------------------------------------------------------- packages
DEBS=$WORK/debs
mkdir -p "$DEBS"
if [[ -n ${SROCE_DEB_DIR:-} ]]; then
	cp "$SROCE_DEB_DIR"/*.deb "$DEBS"/ || die "no .deb files in $SROCE_DEB_DIR"
else
	require_cmds cmake cpack dpkg-shlibdeps
	pkg_build=$BUILD_DIR/deb-packages
	start=$(now)
	if [[ ! -f $pkg_build/CMakeCache.txt ]]; then
		gen=()
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
	cp "$pkg_build"/*.deb "$DEBS"/
	log "packages built in $(elapsed "$start") s"
fi
for p in libsroce0 libsroce-dev sroce libfabric-pmof; do
	compgen -G "$DEBS/${p}_*.deb" >/dev/null || die "no $p package among: $(ls "$DEBS")"
done
for d in "$DEBS"/*.deb; do
	log "$(basename "$d"): Depends: $(dpkg-deb -f "$d" Depends)"
done

# -------------------------------------------------------------- base root
# A minbase root as debootstrap makes it, cached as a tarball per mirror.
debroot_lock "$CACHE"
mkdir -p "$CACHE/roots"
base=$(debroot_base "$SUITE" "$MIRROR" "$CACHE")
debroot_remove_stale "$CACHE/roots"
ROOT=$CACHE/roots/$$
rm -rf --one-file-system "$ROOT"
mkdir "$ROOT"
remove_root() {
	# Mounts live only in the namespaces of the chroot runs, which are gone
	# by now; --one-file-system guards against anything still mounted.
	[[ -n ${ROOT:-} && -d $ROOT ]] && rm -rf --one-file-system "$ROOT"
	_sroce_cleanup
}
trap remove_root EXIT
tar -C "$ROOT" -xf "$base"

debroot_apt_sources "$ROOT" "$MIRROR" "$SUITE"
mkdir -p "$ROOT/tmp/debs"
cp "$DEBS"/*.deb "$ROOT/tmp/debs/"

# ------------------------------------------------------------- the checks
# Run inside the root by bash, with the TCP port for ibv_rc_pingpong and the
# package version as arguments.
cat >"$ROOT/tmp/check.sh" <<'EOF'
set -uo pipefail
port=$1 version=$2
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

# The development package.
check "install libsroce-dev, gcc, pkg-config" \
	apt_install /tmp/debs/libsroce-dev_*.deb gcc libc6-dev pkg-config
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
check "libfabric-pmof ships libpmof-fi.so, fi_pmof(7) and its copyright" \
	bash -c "files=\$(dpkg -L libfabric-pmof) &&
		grep -q '/libfabric/libpmof-fi\.so\$' <<<\"\$files\" &&
		grep -qx /usr/share/man/man7/fi_pmof.7 <<<\"\$files\" &&
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

sroce agent stop 2>/dev/null
echo "$passed checks passed, $failed failed"
((failed == 0))
EOF

next_port
version=$(dpkg-deb -f "$(compgen -G "$DEBS/sroce_*.deb" | head -n1)" Version)
version=${version%-*}
start=$(now)
rc=0
DEBROOT_TIMEOUT=900 debroot_run "$ROOT" "$CACHE/apt-archives" -- \
	bash /tmp/check.sh "$PORT" "$version" || rc=$?
log "checks in the $SUITE root: $(elapsed "$start") s"
((rc == 0)) || die "checks in the $SUITE root failed (exit $rc)"
echo "Debian packages install and work on a clean $SUITE root"
