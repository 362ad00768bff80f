#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# scripts/kernel-pick.sh, the choice of the Debian kernel that the rxe patch
# series are built for and the qemu guest boots, fed the package lists of
# mirrors caught in the middle of an update (no apt, no network): the
# newest version with source, headers and image together wins, an image
# without headers or headers without an image of the same ABI never do.
# Then, informational, what this host's package lists offer today.
#
# Usage: test_kernel_pick.sh BUILD-DIR
# ctest: TIMEOUT=120 LABELS=setup
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
sroce_init "${1:?usage: test_kernel_pick.sh BUILD-DIR}"
pick=$here/../../scripts/kernel-pick.sh
export SROCE_KERNEL_FLAVOUR=amd64

# expect NAME SERIES WANT [ARGS...] <<<LISTS: WANT is the expected output,
# or "error: TEXT" for a failure whose message contains TEXT.
expect() {
	local name=$1 series=$2 want=$3 got rc=0
	shift 3
	got=$(bash "$pick" --from - "$@" "$series" 2>&1) || rc=$?
	if [[ $want == error:* ]]; then
		if ((rc != 0)) && [[ $got == *"${want#error: }"* ]]; then
			pass "$name: no choice ($got)"
		else
			fail "$name" "wanted a failure saying '${want#error: }', got (exit $rc): $got"
		fi
	elif ((rc == 0)) && [[ $got == "$want" ]]; then
		pass "$name: $(head -n1 <<<"$got")"
	else
		fail "$name" "wanted '$want', got (exit $rc): $got"
	fi
}

# The mirror of 2026-11-28: the source of the new upload (-3) before its
# headers and image.
expect "source newer than headers and image" 6.1 \
	"6.1.192-2 6.1.0-56-amd64 linux-image-6.1.0-56-amd64" <<'EOF'
linux-source-6.1 6.1.192-3
linux-source-6.1 6.1.192-2
linux-source-6.1 6.1.176-1
linux-headers-6.1.0-56-amd64 6.1.192-2
linux-headers-6.1.0-50-amd64 6.1.176-1
linux-image-6.1.0-56-amd64 6.1.192-2
linux-image-6.1.0-56-amd64-unsigned 6.1.192-2
linux-image-6.1.0-50-amd64 6.1.176-1
EOF

# Later the same day: headers and the unsigned image of -3, the signed
# image still to come (it is signed after the build).
expect "unsigned image before the signed one" 6.1 \
	"6.1.192-3 6.1.0-57-amd64 linux-image-6.1.0-57-amd64-unsigned" <<'EOF'
linux-source-6.1 6.1.192-3
linux-source-6.1 6.1.192-2
linux-headers-6.1.0-57-amd64 6.1.192-3
linux-headers-6.1.0-56-amd64 6.1.192-2
linux-image-6.1.0-57-amd64-unsigned 6.1.192-3
linux-image-6.1.0-56-amd64 6.1.192-2
EOF

expect "signed image preferred" 6.1 \
	"6.1.192-3 6.1.0-57-amd64 linux-image-6.1.0-57-amd64" <<'EOF'
linux-image-6.1.0-57-amd64-unsigned 6.1.192-3
linux-image-6.1.0-57-amd64 6.1.192-3
linux-headers-6.1.0-57-amd64 6.1.192-3
linux-source-6.1 6.1.192-3
EOF

# Headers of the new upload but only the old image: the modules would be
# built for a kernel the guest cannot boot.
expect "headers without their image" 6.1 \
	"6.1.192-2 6.1.0-56-amd64 linux-image-6.1.0-56-amd64" <<'EOF'
linux-source-6.1 6.1.192-3
linux-source-6.1 6.1.192-2
linux-headers-6.1.0-57-amd64 6.1.192-3
linux-headers-6.1.0-56-amd64 6.1.192-2
linux-image-6.1.0-56-amd64 6.1.192-2
EOF

# The image of the new ABI before its headers, and other flavours and
# series that must not be taken for ours.
expect "other flavours, debug packages and series ignored" 6.1 \
	"6.1.192-2 6.1.0-56-amd64 linux-image-6.1.0-56-amd64" <<'EOF'
linux-source-6.1 6.1.192-3
linux-source-6.1 6.1.192-2
linux-image-6.1.0-57-amd64 6.1.192-3
linux-headers-6.1.0-57-cloud-amd64 6.1.192-3
linux-headers-6.1.0-57-rt-amd64 6.1.192-3
linux-image-6.1.0-57-cloud-amd64 6.1.192-3
linux-image-6.1.0-57-amd64-dbg 6.1.192-3
linux-headers-6.12.117+deb12-amd64 6.1.192-3
linux-headers-6.1.0-56-amd64 6.1.192-2
linux-image-6.1.0-56-amd64 6.1.192-2
EOF

# dpkg's order, not the text's: ~ sorts before anything, 117 after 99.
expect "6.12 backports, in dpkg's version order" 6.12 \
	"6.12.117-1~deb12u1 6.12.117+deb12-amd64 linux-image-6.12.117+deb12-amd64" <<'EOF'
linux-source-6.12 6.12.99-1~deb12u1
linux-source-6.12 6.12.117-1~deb12u1
linux-source-6.12 6.12.115-2~deb12u1
linux-headers-6.12.99+deb12-amd64 6.12.99-1~deb12u1
linux-headers-6.12.117+deb12-amd64 6.12.117-1~deb12u1
linux-headers-6.12.115+deb12-amd64 6.12.115-2~deb12u1
linux-image-6.12.99+deb12-amd64 6.12.99-1~deb12u1
linux-image-6.12.117+deb12-amd64 6.12.117-1~deb12u1
linux-image-6.12.115+deb12-amd64 6.12.115-2~deb12u1
linux-headers-6.1.0-56-amd64 6.12.117-1~deb12u1
EOF

expect "every consistent set, newest first (--all)" 6.12 \
	"6.12.117-1 6.12.117+deb13-amd64 linux-image-6.12.117+deb13-amd64
6.12.117-1~deb12u1 6.12.117+deb12-amd64 linux-image-6.12.117+deb12-amd64" --all <<'EOF'
linux-source-6.12 6.12.117-1~deb12u1
linux-source-6.12 6.12.117-1
linux-headers-6.12.117+deb12-amd64 6.12.117-1~deb12u1
linux-headers-6.12.117+deb13-amd64 6.12.117-1
linux-image-6.12.117+deb12-amd64 6.12.117-1~deb12u1
linux-image-6.12.117+deb13-amd64 6.12.117-1
EOF

expect "no headers at all" 6.1 "error: but no linux-headers-6.1" <<'EOF'
linux-source-6.1 6.1.192-3
linux-image-6.1.0-57-amd64 6.1.192-3
EOF

expect "no version complete" 6.1 "error: no version has source, headers and image together" <<'EOF'
linux-source-6.1 6.1.192-3
linux-headers-6.1.0-56-amd64 6.1.192-2
linux-image-6.1.0-56-amd64 6.1.192-2
EOF

# Debian 13 ships no 6.1.
expect "series not offered" 6.1 "error: no linux-source-6.1 is offered" <<'EOF'
linux-source-6.12 6.12.117-1
linux-headers-6.12.117+deb13-amd64 6.12.117-1
linux-image-6.12.117+deb13-amd64 6.12.117-1
EOF

expect "not a series" 6 "error: is not a kernel series" </dev/null

# What this host's package lists offer (whatever the mirror serves today):
# a choice must name packages apt knows at that version.
if command -v apt-cache >/dev/null; then
	for s in 6.1 6.12; do
		if got=$(bash "$pick" "$s" 2>&1); then
			read -r version abi img <<<"$got"
			if [[ $(apt-cache madison "linux-source-$s" "linux-headers-$abi" "$img" 2>/dev/null |
				awk -F'|' -v v="$version" '{ gsub(/ /, "", $2) } $2 == v' | wc -l) -ge 3 ]]; then
				pass "this host's mirror, $s: $got"
			else
				fail "this host's mirror, $s" "picked '$got', which apt-cache madison does not list"
			fi
		else
			log "this host's mirror, $s: $got"
		fi
	done
fi
finish
