#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Turns the patch series into RDMA modules for a Debian kernel, without
# rebuilding the kernel image (README.md in this directory):
#
#   1. extracts the RDMA part of the kernel source Debian ships
#      (/usr/src/linux-source-X.Y.tar.xz: drivers/infiniband/core and
#      sw/rxe, include/rdma, include/uapi/rdma, scripts/checkpatch.pl) into
#      a git tree, cached per source version;
#   2. applies the series with `git am`, so every patch must apply as mailed;
#   3. builds ib_core, ib_cm, iw_cm, rdma_cm, ib_umad, ib_uverbs, rdma_ucm and
#      rdma_rxe out of tree (M=) against /lib/modules/KVER/build, the patched
#      <rdma/*.h> ahead of the kernel's own, so their vermagic and the symbol
#      versions of everything they import are the kernel's;
#   4. with --each, builds after every patch too (each must build on its
#      own); with --checkpatch, runs the kernel's checkpatch.pl --strict on
#      every patch file (and on the test module's source);
#   5. with --test-module, builds test-module/ (a kernel consumer of the
#      series' work requests, for the tests; not part of the series) in the
#      same tree, into OUT/test-module/.
#
# Usage: build.sh [--series 6.1|6.12] [--kver KVER] [--out DIR] [--each]
#                 [--checkpatch] [--test-module] [--base-only] [-j N]
#   --series   which series (directory) and source: 6.1 (default) or 6.12
#   --kver     the kernel to build for (default: the newest installed whose
#              headers match the series, e.g. 6.1.0-56-amd64)
#   --out      where the modules go (default: ./rxe-modules-KVER); the
#              source tree is OUT/src, the build tree OUT/build
#   --base-only  build the unpatched source (the baseline for comparisons)
# Output: OUT/modules/*.ko and OUT/modules/Module.symvers; OUT/series.txt
# lists the patches applied.  Needs the kernel group of scripts/setup.sh
# (linux-source-6.1 / -6.12 and the matching linux-headers).
# SROCE_RXE_CACHE (default /var/tmp/sroce-rxe-patches) holds the extracts,
# and the modules of each series, source and kernel: a build without
# --each reuses them (the apply, checkpatch and symbol checks still run).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
series=6.1
kver=
out=
each=0
checkpatch=0
base_only=0
test_module=0
jobs=$(nproc)

die() {
	echo "build.sh: $*" >&2
	exit 1
}

while (($#)); do
	case $1 in
	--series) series=${2:?}; shift ;;
	--kver) kver=${2:?}; shift ;;
	--out) out=${2:?}; shift ;;
	--each) each=1 ;;
	--checkpatch) checkpatch=1 ;;
	--base-only) base_only=1 ;;
	--test-module) test_module=1 ;;
	-j) jobs=${2:?}; shift ;;
	-h | --help)
		sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument '$1' (--help)" ;;
	esac
	shift
done

case $series in
6.1 | 6.12) ;;
*) die "no series '$series' (6.1 or 6.12)" ;;
esac
tarball=/usr/src/linux-source-$series.tar.xz
[[ -r $tarball ]] || die "$tarball is missing: install linux-source-$series (scripts/setup.sh kernel)"
src_version=$(dpkg-query -W -f='${Version}' "linux-source-$series" 2>/dev/null) ||
	die "linux-source-$series is not installed as a package"

# The headers of the same Debian upload as the source: their Module.symvers
# holds the CRCs of the kernel the modules are for.
headers_version() {
	dpkg-query -W -f='${Version}' "linux-headers-$1" 2>/dev/null
}
if [[ -z $kver ]]; then
	shopt -s nullglob
	dirs=(/lib/modules/"$series".*/build)
	shopt -u nullglob
	for d in $(printf '%s\n' "${dirs[@]}" | sort -V -r); do
		k=$(basename "$(dirname "$d")")
		if [[ $(headers_version "$k") == "$src_version" ]]; then
			kver=$k
			break
		fi
	done
	[[ -n $kver ]] || die "no linux-headers-$series.* of version $src_version installed (scripts/setup.sh kernel)"
fi
kbuild=/lib/modules/$kver/build
[[ -e $kbuild/Makefile ]] || die "$kbuild is missing: install linux-headers-$kver"
hv=$(headers_version "$kver") || die "linux-headers-$kver is not installed as a package"
[[ $hv == "$src_version" ]] ||
	die "linux-headers-$kver is $hv but linux-source-$series is $src_version: the modules would not match the kernel"

out=${out:-$PWD/rxe-modules-$kver}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=${SROCE_RXE_CACHE:-/var/tmp/sroce-rxe-patches}
mkdir -p "$cache"

git_q() { git -c user.name=build.sh -c user.email=build@localhost -c advice.detachedHead=false "$@"; }

# --- 1. the base tree -----------------------------------------------------
base=$cache/base-$series-$src_version
if [[ ! -e $base/.complete ]]; then
	rm -rf "$base"
	mkdir -p "$base"
	top=linux-source-$series
	echo "build.sh: extracting the RDMA sources of linux-source-$series $src_version"
	tar -C "$base" --strip-components=1 -xJf "$tarball" --wildcards \
		"$top/drivers/infiniband/core/*" "$top/drivers/infiniband/sw/rxe/*" \
		"$top/include/rdma/*" "$top/include/uapi/rdma/*" \
		"$top/scripts/checkpatch.pl" "$top/scripts/spelling.txt" \
		"$top/scripts/const_structs.checkpatch"
	(
		cd "$base"
		git_q init -q
		git_q add -A
		git_q commit -q -m "linux-source-$series $src_version (RDMA subset)"
	)
	touch "$base/.complete"
fi

# --- 2. the series ----------------------------------------------------------
src=$out/src
rm -rf "$src"
git_q clone -q "$base" "$src"
patches=()
if ((!base_only)); then
	shopt -s nullglob
	patches=("$here/$series"/[0-9]*.patch) # globs sort by name
	shopt -u nullglob
	((${#patches[@]})) || die "no patches in $here/$series"
fi
: >"$out/series.txt"
for p in "${patches[@]}"; do
	if ! git_q -C "$src" am -q --keep-cr "$p" >"$out/am.log" 2>&1; then
		cat "$out/am.log" >&2
		die "$(basename "$p") does not apply"
	fi
	basename "$p" >>"$out/series.txt"
done

if ((checkpatch)) && ((${#patches[@]})); then
	# --no-tree: the extract lacks the files checkpatch takes as a tree's mark,
	# and the upstream history a Fixes: tag names.
	if ! perl "$src/scripts/checkpatch.pl" --no-tree --strict --quiet \
		--ignore FILE_PATH_CHANGES,UNKNOWN_COMMIT_ID "${patches[@]}" >"$out/checkpatch.log" 2>&1; then
		cat "$out/checkpatch.log" >&2
		die "checkpatch.pl --strict reports problems"
	fi
	echo "build.sh: checkpatch.pl --strict: ${#patches[@]} patches clean"
	if ((test_module)); then
		perl "$src/scripts/checkpatch.pl" --no-tree --strict --quiet -f \
			"$here/test-module/"*.c >"$out/checkpatch-module.log" 2>&1 || {
			cat "$out/checkpatch-module.log" >&2
			die "checkpatch.pl --strict reports problems in test-module/"
		}
	fi
fi

# --- 3. the modules ---------------------------------------------------------
bld=$out/build
# The build tree mirrors the source tree's layout: NOSTDINC_FLAGS comes
# before the kernel's include paths, so the patched <rdma/*.h> win; and
# include/trace makes the tracepoint headers' TRACE_INCLUDE_PATH
# (../../drivers/infiniband/core) resolve inside it.  sync_tree [with-test]:
# the test module uses the whole series' API, so only the last build has it.
sync_tree() {
	mkdir -p "$bld/drivers/infiniband" "$bld/include/uapi" "$bld/include/trace"
	local d
	for d in drivers/infiniband/core drivers/infiniband/sw/rxe include/rdma include/uapi/rdma; do
		mkdir -p "$bld/$d"
		# -c and no -t: a file whose content did not change keeps its
		# time stamp here, however often git rewrote it in the source
		# tree, and a changed one gets the time of the copy, so make
		# rebuilds only what a patch touched.  What make made beside the
		# sources (objects, modules, its dependency and command files)
		# is protected from --delete.  Else every build is a full one.
		rsync -rlc --delete --filter='P *.o' --filter='P *.ko' --filter='P *.mod' \
			--filter='P *.mod.c' --filter='P .*' --filter='P modules.order' \
			"$src/$d/" "$bld/$d/"
	done
	cat >"$bld/Kbuild" <<'EOF'
NOSTDINC_FLAGS += -I$(M)/include -I$(M)/include/uapi -I$(M)/include/trace
obj-m += drivers/infiniband/core/ drivers/infiniband/sw/rxe/
EOF
	if [[ ${1:-} == with-test ]]; then
		mkdir -p "$bld/test-module"
		rsync -a -c "$here/test-module/" "$bld/test-module/"
		echo 'obj-m += test-module/' >>"$bld/Kbuild"
	fi
}
build_modules() {
	sync_tree "$@"
	make -s -C "$kbuild" M="$bld" -j"$jobs" modules >"$out/make.log" 2>&1 || {
		tail -n 40 "$out/make.log" >&2
		return 1
	}
	# Warnings are errors here as in the kernel's own builds with W=e.
	if grep -E 'warning:' "$out/make.log" | grep -v 'Skipping BTF generation' >&2; then
		return 1
	fi
}

# Modules of the same series, source, kernel and build.sh are kept in the
# cache: a build without --each (which is about the steps, not the result)
# takes them from there.  The checks below run either way.
key=$({
	printf '%s\n' "$series" "$src_version" "$kver"
	cat "$0" "${patches[@]}" "$here/test-module/"*
} | sha256sum | cut -c1-16)
kept=$cache/modules-$series-$key
mods=$out/modules
rm -rf "$mods" "$out/test-module"
mkdir -p "$mods"
if ((!each)) && [[ -e $kept/.complete ]] && { ((!test_module)) || [[ -d $kept/test-module ]]; }; then
	cp "$kept/modules/"* "$mods/"
	if ((test_module)); then cp -r "$kept/test-module" "$out/"; fi
	echo "build.sh: modules built before from the same series, source and kernel ($kept)"
else
	if ((each)) && ((${#patches[@]} > 1)); then
		total=${#patches[@]}
		for ((i = total - 1; i >= 1; i--)); do
			git_q -C "$src" checkout -q "HEAD~$i"
			build_modules || die "the series does not build after $(sed -n "$((total - i))p" "$out/series.txt")"
			echo "build.sh: builds after $(sed -n "$((total - i))p" "$out/series.txt")"
			git_q -C "$src" checkout -q -
		done
	fi
	build_modules "$( ((test_module)) && echo with-test)" ||
		die "the modules do not build (see $out/make.log)"
	find "$bld/drivers" -name '*.ko' -exec cp {} "$mods/" \;
	if ((test_module)); then
		mkdir -p "$out/test-module"
		cp "$bld/test-module/"*.ko "$out/test-module/"
	fi
	cp "$bld/Module.symvers" "$mods/"
	# Made aside and moved in whole: another build may be reading it.
	rm -rf "$kept.$$"
	mkdir -p "$kept.$$"
	cp -r "$mods" "$kept.$$/modules"
	if ((test_module)); then cp -r "$out/test-module" "$kept.$$/"; fi
	touch "$kept.$$/.complete"
	rm -rf "$kept"
	mv -T "$kept.$$" "$kept"
fi
n=$(find "$mods" -name '*.ko' | wc -l)
((n == 8)) || die "expected 8 modules, built $n"
magic=$(modinfo -F vermagic "$mods/rdma_rxe.ko")
[[ $magic == "$kver "* ]] || die "rdma_rxe.ko has vermagic '$magic', not for $kver"
# The series keeps the kernel's symbol versions, so the kernel's other
# RDMA modules (hardware drivers, IPoIB, NFS over RDMA...) still load
# next to these: every export must carry the version the kernel's own
# Module.symvers gives it.
changed=$(join <(awk '{ print $2, $1 }' "$mods/Module.symvers" | sort) \
	<(awk '{ print $2, $1 }' "$kbuild/Module.symvers" | sort) | awk '$2 != $3 { print $1 }')
exports=$(wc -l <"$mods/Module.symvers")
if [[ -n $changed ]]; then
	while read -r sym; do echo "  $sym"; done <<<"$changed" >&2
	die "$(wc -l <<<"$changed") of $exports exports changed their symbol version"
fi
echo "build.sh: $n modules for $kver (${#patches[@]} patches) in $mods; all $exports exports keep the kernel's symbol versions"
