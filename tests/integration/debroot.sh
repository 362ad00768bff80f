# SPDX-License-Identifier: MIT
# shellcheck shell=bash
#
# Debian roots made with debootstrap for the tests that run the project on a
# clean Debian system (test_deb_packages.sh, test_trixie.sh).  Source it after
# lib.sh.  A root shares the host's network stack (so its programs reach the
# host's lo) but gets /proc, /sys and /dev only inside a private mount
# namespace of each chroot run, so nothing it mounts outlives the run.
#
#   debroot_require                        # skip (77) unless roots can be made here
#   MIRROR=$(debroot_find_mirror trixie)   # a mirror from the host's apt sources
#   debroot_lock CACHE                     # one run per cache at a time
#   base=$(debroot_base trixie "$MIRROR" CACHE)   # minbase tarball, made once
#   debroot_apt_sources ROOT "$MIRROR" trixie
#   debroot_run ROOT CACHE/apt-archives [SRC:DST...] -- CMD...
#   debroot_copy_source SRC-DIR ROOT/src   # the source tree, for a build inside

# Skips unless this host can make and enter roots.
debroot_require() {
	(($(id -u) == 0)) || skip "debootstrap and chroot need root"
	require_cmds debootstrap unshare chroot flock timeout
	unshare -m true 2>/dev/null || skip "cannot create a mount namespace here"
}

# debroot_find_mirror SUITE: the first Debian mirror of the host's apt sources
# (one-line or deb822) that lists SUITE; else the one that serves the host's
# own release, since a Debian mirror serves every suite.
debroot_find_mirror() {
	local suite=$1 own f found want
	own=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
	for want in "$suite" "$own"; do
		[[ -n $want ]] || continue
		found=$(for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
			/etc/apt/sources.list.d/*.sources; do
			[[ -f $f ]] || continue
			awk -v suite="$want" '
				function stanza() {
					if (!found && deb && uri != "" && ok) { print uri; found = 1; exit }
					deb = 0; uri = ""; ok = 0
				}
				/^[[:space:]]*#/ { next }
				/^deb[[:space:]]/ {
					line = $0
					gsub(/\[[^]]*\]/, "", line)
					split(line, w, " ")
					if (w[3] == suite) { print w[2]; found = 1; exit }
					next
				}
				/^Types:/ { for (j = 2; j <= NF; j++) if ($j == "deb") deb = 1 }
				/^URIs:/ { uri = $2 }
				/^Suites:/ { for (j = 2; j <= NF; j++) if ($j == suite) ok = 1 }
				/^[[:space:]]*$/ { stanza() }
				END { stanza() }
			' "$f"
		done | head -n1)
		[[ -n $found ]] && { echo "$found"; return 0; }
	done
	return 0
}

# debroot_lock CACHE: holds CACHE/lock (fd 9) until the script exits: runs
# from several checkouts share the cache and apt's download directory in it.
debroot_lock() {
	mkdir -p "$1/apt-archives/partial"
	exec 9>"$1/lock"
	flock 9
}

# debroot_base SUITE MIRROR CACHE: prints the path of a minbase root of SUITE
# as debootstrap makes it, a tarball in CACHE made on first use (per mirror).
debroot_base() {
	local suite=$1 mirror=$2 cache=$3 base fresh start
	base=$cache/$suite-minbase-$(printf '%s' "$mirror" | md5sum | cut -c1-8).tar
	if [[ ! -s $base ]]; then
		start=$(now)
		fresh=$cache/debootstrap.$$
		rm -rf --one-file-system "$fresh"
		# debootstrap mounts /proc and /sys inside the root; in a mount
		# namespace of its own those mounts vanish with it, whatever happens.
		if ! unshare -m --propagation private \
			debootstrap --variant=minbase "$suite" "$fresh" "$mirror" >"$WORK/debootstrap.log" 2>&1; then
			tail -n 30 "$WORK/debootstrap.log" >&2
			rm -rf --one-file-system "$fresh"
			die "debootstrap $suite from $mirror failed"
		fi
		tar -C "$fresh" -cf "$base.tmp" . && mv "$base.tmp" "$base"
		rm -rf --one-file-system "$fresh"
		log "debootstrap $suite: $(elapsed "$start") s"
	fi
	echo "$base"
}

# debroot_apt_sources ROOT MIRROR SUITE: apt inside the root uses the host's
# name server and the mirror, and skips the expiry check of Release files
# (mirrors that serve a frozen snapshot have expired ones).
debroot_apt_sources() {
	local root=$1 mirror=$2 suite=$3
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" \
		>"$root/etc/apt/sources.list"
	printf 'Acquire::Check-Valid-Until "false";\n' >"$root/etc/apt/apt.conf.d/90sroce-test"
}

# debroot_run ROOT ARCHIVES [SRC:DST...] -- CMD...: runs CMD in ROOT with a
# clean environment, in a private mount namespace where /proc, /sys, /dev,
# apt's download directory (ARCHIVES) and each SRC (at ROOT/DST) are mounted
# for the run only; killed after DEBROOT_TIMEOUT seconds (default 900).
debroot_run() {
	local root=$1 archives=$2
	shift 2
	local binds=()
	while (($# > 0)) && [[ $1 != -- ]]; do
		binds+=("$1")
		shift
	done
	[[ ${1:-} == -- ]] && shift
	# shellcheck disable=SC2016 # expanded by the inner bash
	timeout -k 10 "${DEBROOT_TIMEOUT:-900}" unshare -m --propagation private bash -c '
		set -e
		root=$1 archives=$2 nbinds=$3
		shift 3
		# The root a mount point of its own, as / is: programs that make
		# their own mount namespace (sroce exec) change the propagation of /.
		mount --bind "$root" "$root"
		mount -t proc proc "$root/proc"
		mount -t sysfs sysfs "$root/sys"
		mount --rbind /dev "$root/dev"
		mount --bind "$archives" "$root/var/cache/apt/archives"
		for ((i = 0; i < nbinds; i++)); do
			mkdir -p "$root/${1#*:}"
			mount --bind "${1%%:*}" "$root/${1#*:}"
			shift
		done
		exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
	' debroot "$root" "$archives" "${#binds[@]}" "${binds[@]}" "$@"
}

# Removes the roots under DIR of runs that were killed before they could
# remove theirs (named after the test's process id).
debroot_remove_stale() {
	local old
	for old in "$1"/*; do
		[[ -d $old && ${old##*/} =~ ^[0-9]+$ ]] || continue
		kill -0 "${old##*/}" 2>/dev/null || rm -rf --one-file-system "$old"
	done
}

# debroot_copy_source SRC DST [KEEP]: DST (emptied first, but for an entry
# named KEEP) becomes a copy of the source tree SRC as git sees it (tracked
# and untracked files, not ignored ones, so no build trees), with the files'
# times, so that a build tree kept in the root rebuilds only what changed; a
# tree without git is copied whole but for build*.
debroot_copy_source() {
	local src=$1 dst=$2 keep=(${3:+! -name "$3"})
	mkdir -p "$dst"
	find "$dst" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf --one-file-system {} +
	if git -C "$src" rev-parse --show-toplevel >/dev/null 2>&1; then
		# shellcheck disable=SC2016 # expanded by sh
		git -C "$src" ls-files -z --cached --others --exclude-standard |
			(cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
			tar -C "$src" --null -T - -cf - | tar -C "$dst" -xf -
	else
		tar -C "$src" --exclude='./build*' -cf - . | tar -C "$dst" -xf -
	fi
}
