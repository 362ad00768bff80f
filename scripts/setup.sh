#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Installs every Debian package the project builds, tests or demos with.
# Idempotent: packages already present are skipped by apt-get.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config clang clang-format
  libclang-rt-14-dev
  libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest
  libpmem-dev libfabric-dev libfabric-bin
  libgtest-dev googletest libcli11-dev nlohmann-json3-dev zlib1g-dev libisal-dev
  python3 python3-scapy python3-matplotlib tshark
  # rdma-core's own test suite (tests/integration/test_rdma_core_suite.sh).
  python3-pyverbs
  iproute2 nftables
  # UCX's ucx_info: lists the devices `sroce exec` shows (test_exec_discovery.sh).
  ucx-utils
  # The qemu guest of tests/vm: Debian's kernel as a Linux rxe peer and with
  # an emulated NVDIMM (tests/integration/test_rxe_interop.sh, test_vm_pmem.sh).
  qemu-system-x86 linux-image-amd64 busybox-static cpio kmod ndctl e2fsprogs
  # A clean Debian root to install the project's packages into
  # (tests/integration/test_deb_packages.sh).
  debootstrap
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "setup.sh: need root to install: ${missing[*]}" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # tshark asks whether non-root users may capture; the default (no) is what we want.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
