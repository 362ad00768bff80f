#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Picks the Debian kernel the rxe patch series and the qemu guest use: the
# newest version of a kernel series (6.1, 6.12) for which the package mirror
# offers all three of the source (linux-source-SERIES), the headers of one
# ABI (linux-headers-ABI-FLAVOUR) and the image of that ABI
# (linux-image-ABI-FLAVOUR, or its -unsigned build), each at that very
# version.  The mirror moves with every security update and does not publish
# the three at once: on 2026-11-28 it served linux-source-6.1 6.1.192-3 while
# the newest headers and image were 6.1.192-2.  Modules built from one
# version's source load only into the kernel of the same version, so the
# newest source alone is no choice.
#
# Usage: kernel-pick.sh [--from FILE] [--all] SERIES
#          prints "VERSION ABI IMAGE-PACKAGE" for the newest consistent set
#          (--all: every consistent set, newest first); exits 1, saying why
#          on stderr, when there is none.  The candidates come from apt's
#          package lists, or with --from from FILE, lines "PACKAGE VERSION"
#          (the unit test's input; "-" reads stdin).  A set is only offered
#          when apt could install it (apt-get -s), unless --from is given.
#        kernel-pick.sh --packages SERIES
#          prints the packages to install, "NAME=VERSION" one per line:
#          source, headers and image of the pick.
#        kernel-pick.sh --installed SERIES
#          prints "VERSION ABI IMAGE-PACKAGE" when the installed source,
#          headers and image are of one version (what rxe-patches/build.sh and the guest
#          need), else exits 1 saying what is installed.
# FLAVOUR is the architecture's generic one (amd64 on amd64, arm64 on arm64);
# SROCE_KERNEL_FLAVOUR overrides it.
set -euo pipefail

die() {
	echo "kernel-pick.sh: $*" >&2
	exit 1
}

from= all=0 mode=pick
while (($#)); do
	case $1 in
	--from) from=${2:?}; shift ;;
	--all) all=1 ;;
	--packages) mode=packages ;;
	--installed) mode=installed ;;
	-h | --help)
		sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*) die "unknown option '$1' (--help)" ;;
	*) break ;;
	esac
	shift
done
series=${1:?usage: kernel-pick.sh [--from FILE] [--all|--packages|--installed] SERIES}
[[ $series =~ ^[0-9]+\.[0-9]+$ ]] || die "'$series' is not a kernel series (e.g. 6.1)"
flavour=${SROCE_KERNEL_FLAVOUR:-$(dpkg --print-architecture 2>/dev/null || echo amd64)}

# The ABI part of a headers or image package name of this series and flavour
# ("6.1.0-56-amd64", "6.12.117+deb12-amd64"); nothing for other flavours
# (cloud, rt), debug symbols, or another series (6.1 is not 6.12).
abi_re="^linux-(headers|image)-(${series//./\\.}\\.[^-]+(-[0-9]+)?-$flavour)(-unsigned)?\$"

# newest_first: sorts version strings (stdin) newest first, in dpkg's order.
newest_first() {
	local -a vs=() out=()
	local v i inserted
	mapfile -t vs
	for v in "${vs[@]}"; do
		inserted=0
		for i in "${!out[@]}"; do
			if dpkg --compare-versions "$v" gt "${out[$i]}"; then
				out=("${out[@]:0:i}" "$v" "${out[@]:i}")
				inserted=1
				break
			fi
		done
		((inserted)) || out+=("$v")
	done
	((${#out[@]} == 0)) || printf '%s\n' "${out[@]}"
}

# candidates: reads "PACKAGE VERSION" lines and prints every consistent set
# "VERSION ABI IMAGE-PACKAGE", newest version first (a signed image before
# an unsigned one).  Pure: what the unit test feeds.
candidates() {
	local name version abi
	local -A headers=() image=() sources=()
	while read -r name version _; do
		[[ -n $name && -n $version ]] || continue
		if [[ $name == "linux-source-$series" ]]; then
			sources[$version]=1
		elif [[ $name =~ $abi_re ]]; then
			abi=${BASH_REMATCH[2]}
			if [[ ${BASH_REMATCH[1]} == headers ]]; then
				[[ -n ${BASH_REMATCH[4]} ]] || headers["$version $abi"]=1
			elif [[ -z ${BASH_REMATCH[4]} || -z ${image["$version $abi"]:-} ]]; then
				image["$version $abi"]=$name
			fi
		fi
	done
	local v key
	while read -r v; do
		for key in "${!headers[@]}"; do
			if [[ ${key%% *} == "$v" && -n ${image[$key]:-} ]]; then
				echo "$v ${key#* } ${image[$key]}"
			fi
		done | sort -t' ' -k2,2Vr
	done < <(((${#sources[@]})) && printf '%s\n' "${!sources[@]}" | newest_first)
}

# What the mirror offers, as "PACKAGE VERSION" lines.
offered() {
	local names
	names=$(apt-cache pkgnames linux- 2>/dev/null | grep -E "$abi_re" || true)
	# shellcheck disable=SC2086 # one word per package name
	apt-cache madison "linux-source-$series" $names 2>/dev/null |
		awk -F'|' '{ gsub(/ /, "", $1); gsub(/ /, "", $2); print $1, $2 }' | sort -u
}

# Why nothing is consistent, in one line, from the same input.
explain() {
	local newest_src newest_hdr
	newest_src=$(awk -v s="linux-source-$series" '$1 == s { print $2 }' "$1" | newest_first | head -n1)
	newest_hdr=$(awk '$1 ~ /^linux-headers-/ { print $2 }' "$1" | newest_first | head -n1)
	if [[ -z $newest_src ]]; then
		echo "no linux-source-$series is offered"
	elif [[ -z $newest_hdr ]]; then
		echo "linux-source-$series $newest_src is offered, but no linux-headers-$series.*-$flavour"
	else
		echo "no version has source, headers and image together (newest source $newest_src, newest headers $newest_hdr)"
	fi
}

installed_version() {
	dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null |
		awk '/install ok installed/ { print $NF }' || true
}

if [[ $mode == installed ]]; then
	src=$(installed_version "linux-source-$series")
	[[ -n $src ]] || die "linux-source-$series is not installed"
	while read -r name; do
		[[ $name =~ $abi_re && ${BASH_REMATCH[1]} == headers ]] || continue
		abi=${BASH_REMATCH[2]}
		[[ $(installed_version "$name") == "$src" ]] || continue
		for img in "linux-image-$abi" "linux-image-$abi-unsigned"; do
			if [[ $(installed_version "$img") == "$src" ]]; then
				echo "$src $abi $img"
				exit 0
			fi
		done
	done < <(dpkg-query -W -f='${Package}\n' "linux-headers-$series.*" 2>/dev/null | sort -Vr)
	die "linux-source-$series $src is installed without headers and image of the same version"
fi

input=$(mktemp)
trap 'rm -f "$input"' EXIT
if [[ -n $from ]]; then
	if [[ $from == - ]]; then cat >"$input"; else cat -- "$from" >"$input"; fi
else
	offered >"$input"
fi

found=0
while read -r version abi img; do
	# The lists say a package exists; only apt knows whether its
	# dependencies (the headers' common part, kbuild) do too.
	if [[ -z $from ]] && ! apt-get -s -qq --allow-downgrades install "linux-source-$series=$version" \
		"linux-headers-$abi=$version" "$img=$version" >/dev/null 2>&1; then
		continue
	fi
	found=1
	case $mode in
	packages)
		printf '%s\n' "linux-source-$series=$version" "linux-headers-$abi=$version" "$img=$version"
		exit 0
		;;
	pick)
		echo "$version $abi $img"
		((all)) || exit 0
		;;
	esac
done < <(candidates <"$input")
((found)) || die "no consistent linux-$series kernel: $(explain "$input")"
