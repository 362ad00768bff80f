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
# @kernel:SERIES:PARTS@ stands for PARTS (source, headers, image) of one
# Debian kernel of SERIES, pinned to one version: the one installed when
# source, headers and image installed agree, else the newest the mirror
# offers all three of (scripts/kernel-pick.sh).  The patched modules load
# only into the kernel of their source's version, and the mirror publishes
# a new upload's source, headers and images hours or days apart.
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
  [clients]="ibverbs-utils rdmacm-utils perftest qperf libfabric-bin python3-pyverbs iproute2 ethtool"
  # ucx-utils: ucx_info lists the devices `sroce exec` shows (test_exec_discovery.sh),
  # ucx_perftest runs over them, and libucx-dev builds a UCP client and server that
  # connect through rdma_cm (test_fabric_clients.sh, like librpma and Open MPI).
  # librpma (archived upstream) may be missing from newer releases: optional.
  # Open MPI (with its OpenSHMEM) and MPICH, both over UCX; Open MPI stays the
  # default `mpirun` (its alternatives priority is the higher), MPICH is run
  # as mpiexec.mpich.
  # iperf3: TCP's incast on sroce-fabric, beside sroce's (fabric_matrix.py).
  [tools]="python3-scapy python3-matplotlib tshark nftables ucx-utils iperf3
    libucx-dev librpma-dev| openmpi-bin libopenmpi-dev mpich libmpich-dev"
  # The distribution's kernel as a Linux rxe peer and with an emulated NVDIMM
  # (tests/integration/test_rxe_interop.sh, test_vm_pmem.sh); on Debian 12
  # also its 6.12 kernel, whose rxe executes IBTA FLUSH (test_pmof_rxe.sh;
  # the guest boots the newest kernel installed).  Newer releases' default
  # kernel has it already.
  [vm]="qemu-system-x86 @kernel:6.1:image@|linux-image-amd64|linux-image-generic
    @kernel:6.12:image@|linux-image-6.12-amd64| busybox-static cpio kmod ndctl e2fsprogs"
  # rxe-patches/build.sh: the source of the kernel the vm group installs
  # (Debian 12: 6.1, and 6.12 for the stand-alone FLUSH fix) and headers of
  # the same upload, so the modules load into that kernel.  Newer releases
  # ship neither 6.1 nor the series' base: nothing to install there.
  [kernel]="@kernel:6.1:source,headers,image@| @kernel:6.12:source,headers,image@|
    git xz-utils perl bc libelf-dev rsync"
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
# installed NAME[=VERSION]
installed() {
  local st
  st=$(dpkg-query -W -f='${Status} ${Version}' "${1%%=*}" 2>/dev/null) || return 1
  [[ $st == "install ok installed "* ]] || return 1
  [[ $1 != *=* || ${st##* } == "${1#*=}" ]]
}
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

# The kernel of each series, "VERSION ABI IMAGE-PACKAGE" or empty when
# there is none, found once per package lists (pkgs_of_groups calls this
# outside the subshells that resolve entries, so that they see the result).
# kernel_note: what to say of each choice once the package lists are final.
declare -A kernel_pick=() kernel_note=()
pick_kernel() {
  local series=$1 got
  if [ -z "${kernel_pick[$series]+set}" ]; then
    if got=$(bash "$here/kernel-pick.sh" --installed "$series" 2>/dev/null); then
      kernel_pick[$series]=$got
      kernel_note[$series]="${got%% *} (${got#* }), installed"
    elif got=$(bash "$here/kernel-pick.sh" "$series" 2>&1); then
      kernel_pick[$series]=$got
      kernel_note[$series]="${got%% *} (${got#* }), the newest the mirror offers with source, headers and image"
    else
      kernel_pick[$series]=
      # Only a distribution that has the series at all needs telling.
      kernel_note[$series]=
      [[ $got == *"no linux-source-$series is offered"* ]] ||
        kernel_note[$series]="none (${got#kernel-pick.sh: }); its tests will skip"
    fi
  fi
}

# Prints the packages @kernel:SERIES:PARTS@ stands for, NAME=VERSION one per
# line; fails when the series has no consistent kernel here.
kernel_pkgs() {
  local spec=${1#@kernel:} series parts version abi img part
  spec=${spec%@}
  series=${spec%%:*}
  parts=${spec#*:}
  [ -n "${kernel_pick[$series]:-}" ] || return 1
  read -r version abi img <<<"${kernel_pick[$series]}"
  for part in ${parts//,/ }; do
    case $part in
    source) echo "linux-source-$series=$version" ;;
    headers) echo "linux-headers-$abi=$version" ;;
    image) echo "$img=$version" ;;
    esac
  done
}

# Prints the names an entry stands for on this distribution, one per line
# (nothing for an empty alternative); fails when the distribution knows none
# of its names.
resolve() {
  local entry=${1//@CLANG@/$clang} alt
  local -a alts
  IFS='|' read -r -a alts <<<"$entry"
  [[ $entry == *'|' ]] && alts+=("")
  for alt in "${alts[@]}"; do
    [ -n "$alt" ] || return 0
    if [[ $alt == @kernel:* ]]; then
      kernel_pkgs "$alt" && return 0
    elif installed "$alt" || available "$alt"; then
      echo "$alt"
      return 0
    fi
  done
  return 1
}

pkgs_of_groups() {
  local g p names
  unresolved=()
  pkgs=()
  for g in "${groups[@]}"; do
    for p in $(grep -o '@kernel:[0-9.]*:' <<<"${group[$g]}" | cut -d: -f2); do
      pick_kernel "$p"
    done
  done
  for g in "${groups[@]}"; do
    for p in ${group[$g]}; do
      if names=$(resolve "$p"); then
        [ -z "$names" ] || pkgs+=($names)
      else
        unresolved+=("$p")
      fi
    done
  done
  missing=()
  for p in "${pkgs[@]}"; do
    installed "$p" || missing+=("$p")
  done
}

export DEBIAN_FRONTEND=noninteractive
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
clang=$(clang_major)
pkgs_of_groups
# Before installing anything, fresh package lists: stale ones may not know
# some names yet, or offer versions the mirror no longer has.  The choice
# of a kernel is made again from them.
if [ $((${#unresolved[@]} + ${#missing[@]})) -gt 0 ] && is_root; then
  apt-get update -qq
  kernel_pick=() kernel_note=()
  clang=$(clang_major)
  pkgs_of_groups
fi
for series in "${!kernel_note[@]}"; do
  [ -z "${kernel_note[$series]}" ] || echo "setup.sh: kernel $series: ${kernel_note[$series]}" >&2
done
if [ "${#unresolved[@]}" -gt 0 ]; then
  echo "setup.sh: no package for: ${unresolved[*]}" >&2
  exit 1
fi

if [ "${#missing[@]}" -gt 0 ]; then
  is_root || { echo "setup.sh: need root to install: ${missing[*]}" >&2; exit 1; }
  # tshark asks whether non-root users may capture; the default (no) is what we want.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  # A kernel pinned to an older upload than the one installed is a downgrade.
  apt-get install -y -qq --no-install-recommends --allow-downgrades "${missing[@]}"
fi
# The clang runtime follows clang: when clang itself was just installed, its
# version may differ from the one guessed from the package lists.
if [[ " ${groups[*]} " == *" build "* ]] && [ "$(clang_major)" != "$clang" ]; then
  exec "$0" "$@"
fi
