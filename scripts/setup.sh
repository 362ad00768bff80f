#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Installs the distribution packages the project builds, tests or demos with.
# Idempotent: packages already present are skipped.
#
# Usage: setup.sh [GROUP...]   (default: every group)
#   build    compilers, libraries and headers: building and the unit tests
#   clients  rdma-core's utilities, perftest, pyverbs and iproute2: the
#            programs the integration tests run over sroce
#   tools    packet capture and dissection, plots, nftables, and the
#            heavier third-party clients: UCX, librpma, Open MPI
#   vm       the qemu guest of tests/vm
#   kernel   the kernel sources and headers rxe-patches/build.sh builds the
#            patched RDMA modules from and against
#   root     debootstrap, for the tests that make a clean Debian root
#
# Package names differ between releases (Debian 12 and 13, Ubuntu 22.04 and
# 24.04): an entry "a|b|c" takes the first name the distribution has, an
# empty alternative means none is needed.  @CLANG@ stands for the major
# version of the clang that is (or is about to be) installed.
set -euo pipefail

declare -A group=(
  [build]="build-essential cmake ninja-build pkg-config clang clang-format
    libclang-rt-@CLANG@-dev|libclang-rt-dev|
    libibverbs-dev librdmacm-dev libpmem-dev libfabric-dev
    libgtest-dev googletest libcli11-dev nlohmann-json3-dev zlib1g-dev libisal-dev
    python3"
  # python3-pyverbs: rdma-core's own test suite (test_rdma_core_suite.sh).
  # ethtool: turns lo's segmentation offload off in a test's own namespace, so
  # a capture there holds the datagrams a wire would carry (lib.sh).
  [clients]="ibverbs-utils rdmacm-utils perftest libfabric-bin python3-pyverbs iproute2 ethtool"
  # ucx-utils: ucx_info lists the devices `sroce exec` shows (test_exec_discovery.sh),
  # ucx_perftest runs over them, and libucx-dev builds a UCP client and server that
  # connect through rdma_cm (test_fabric_clients.sh, like librpma and Open MPI).
  # librpma (archived upstream) may be missing from newer releases: optional.
  [tools]="python3-scapy python3-matplotlib tshark nftables ucx-utils
    libucx-dev librpma-dev| openmpi-bin libopenmpi-dev"
  # The distribution's kernel as a Linux rxe peer and with an emulated NVDIMM
  # (tests/integration/test_rxe_interop.sh, test_vm_pmem.sh); on Debian 12
  # also its 6.12 kernel, whose rxe executes IBTA FLUSH (test_pmof_rxe.sh;
  # the guest boots the newest kernel installed).  Newer releases' default
  # kernel has it already.
  [vm]="qemu-system-x86 linux-image-amd64|linux-image-generic linux-image-6.12-amd64|
    busybox-static cpio kmod ndctl e2fsprogs"
  # rxe-patches/build.sh: the source of the kernel the vm group installs
  # (Debian 12: 6.1, and 6.12 for the stand-alone FLUSH fix) and headers of
  # the same upload, so the modules load into that kernel.  Newer releases
  # ship neither 6.1 nor the series' base: nothing to install there.
  [kernel]="linux-source-6.1| linux-headers-amd64|linux-headers-generic
    linux-source-6.12| linux-headers-6.12-amd64| git xz-utils perl bc libelf-dev rsync"
  # A clean Debian root (test_deb_packages.sh, test_trixie.sh).
  [root]="debootstrap lintian"
)
all_groups=(build clients tools vm kernel root)

groups=("$@")
[ "${#groups[@]}" -gt 0 ] || groups=("${all_groups[@]}")
for g in "${groups[@]}"; do
  [ -n "${group[$g]+set}" ] || { echo "setup.sh: unknown group '$g' (${all_groups[*]})" >&2; exit 2; }
done

is_root() { [ "$(id -u)" -eq 0 ]; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# A real package with an installation candidate (not only a virtual name).
# Not grep -q: it stops reading at the first match, and under pipefail the
# SIGPIPE of a long record (libopenmpi-dev's) would read as "unavailable".
available() { apt-cache show --no-all-versions "$1" 2>/dev/null | grep '^Package:' >/dev/null; }

# Major version of the clang in use: the installed one, else the one the
# `clang` package would bring.
clang_major() {
  local v
  if command -v clang >/dev/null; then
    v=$(clang --version | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n1)
  else
    v=$(apt-cache depends clang 2>/dev/null | sed -n 's/^ *Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -n1)
  fi
  echo "${v:-0}"
}

# Prints the name an entry stands for on this distribution (nothing for an
# empty alternative); fails when the distribution knows none of its names.
resolve() {
  local entry=${1//@CLANG@/$clang} alt
  local -a alts
  IFS='|' read -r -a alts <<<"$entry"
  [[ $entry == *'|' ]] && alts+=("")
  for alt in "${alts[@]}"; do
    [ -n "$alt" ] || return 0
    if installed "$alt" || available "$alt"; then
      echo "$alt"
      return 0
    fi
  done
  return 1
}

pkgs_of_groups() {
  local g p name
  unresolved=()
  pkgs=()
  for g in "${groups[@]}"; do
    for p in ${group[$g]}; do
      if name=$(resolve "$p"); then
        [ -z "$name" ] || pkgs+=("$name")
      else
        unresolved+=("$p")
      fi
    done
  done
}

export DEBIAN_FRONTEND=noninteractive
updated=0
clang=$(clang_major)
pkgs_of_groups
# Package lists that are missing or stale do not know some names yet.
if [ "${#unresolved[@]}" -gt 0 ] && is_root; then
  apt-get update -qq
  updated=1
  clang=$(clang_major)
  pkgs_of_groups
fi
if [ "${#unresolved[@]}" -gt 0 ]; then
  echo "setup.sh: no package for: ${unresolved[*]}" >&2
  exit 1
fi

missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  is_root || { echo "setup.sh: need root to install: ${missing[*]}" >&2; exit 1; }
  [ "$updated" -eq 1 ] || apt-get update -qq
  # tshark asks whether non-root users may capture; the default (no) is what we want.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The clang runtime follows clang: when clang itself was just installed, its
# version may differ from the one guessed from the package lists.
if [[ " ${groups[*]} " == *" build "* ]] && [ "$(clang_major)" != "$clang" ]; then
  exec "$0" "$@"
fi
