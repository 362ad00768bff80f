#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Builds a small bootable guest for the qemu tests from installed Debian
# packages only: the host's Debian kernel (/boot/vmlinuz-*, linux-image-amd64)
# and an initramfs holding busybox-static, the kernel modules a Linux rxe
# peer and an emulated NVDIMM need, and the user-space programs the tests run
# inside the guest (ibverbs-utils, perftest, rdmacm-utils, rdma, ndctl,
# mke2fs, pmem_check) with the shared libraries they load.
#
# Usage: build_guest.sh OUTDIR
# Prints the directory holding `vmlinuz`, `initrd.img` and `files.txt` (the
# initramfs's file list).  The result is cached under OUTDIR keyed by the
# kernel version and a hash of everything that goes into it (this script,
# init, guest-lib.sh, pmem_check.c, the kernel image and the versions of the
# packages copied), so a repeated run only prints the cached path.
# SROCE_VM_KERNEL=VERSION picks a kernel other than the newest one installed.
# SROCE_VM_MODULES=DIR adds the modules DIR/*.ko (rxe-patches/build.sh's
# output, built for that kernel) under lib/modules/VERSION/updates, where
# modprobe finds them before the kernel's own.
#
# Exits 77 when a needed package is missing (scripts/setup.sh installs them).
set -euo pipefail

out=${1:?usage: build_guest.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

skip() {
	echo "SKIP: $*" >&2
	exit 77
}
die() {
	echo "build_guest: $*" >&2
	exit 1
}

# Kernel: the newest /boot/vmlinuz-* whose modules are installed.
kver=${SROCE_VM_KERNEL:-}
if [[ -z $kver ]]; then
	kver=$(for f in /boot/vmlinuz-*; do
		[[ -e $f && -d /lib/modules/${f#/boot/vmlinuz-}/kernel ]] && echo "${f#/boot/vmlinuz-}"
	done | sort -V | tail -n 1)
fi
[[ -n $kver && -r /boot/vmlinuz-$kver ]] ||
	skip "no readable Debian kernel in /boot with modules in /lib/modules (install linux-image-amd64)"
moddir=/lib/modules/$kver

# Programs copied into the guest (absolute paths after lookup).
progs=(ibv_devinfo ibv_devices ibv_rc_pingpong ibv_srq_pingpong ibv_uc_pingpong ibv_ud_pingpong
	ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat ib_atomic_bw ib_atomic_lat
	rping ucmatose cmtime rdma ndctl mke2fs)
need_pkgs=(busybox-static cpio kmod ibverbs-utils ibverbs-providers libibverbs1 perftest iproute2
	rdmacm-utils librdmacm1 ndctl e2fsprogs libpmem-dev)
for p in "${need_pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		skip "Debian package $p is not installed (run scripts/setup.sh)"
done
paths=()
for p in "${progs[@]}"; do
	f=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v "$p") || skip "$p not installed"
	paths+=("$f")
done
command -v depmod >/dev/null || skip "depmod (kmod) not installed"
cc=${CC:-cc}
command -v "$cc" >/dev/null || skip "no C compiler"

# The modules loaded at boot, before their dependencies are added.  The crc32
# and crc32c crypto drivers are reached through the crypto API by name
# (rdma_rxe's ICRC, ext4's metadata checksums), so no dependency names them.
# Nor does anything name rdma_ucm, the kernel's /dev/infiniband/rdma_cm that
# librdmacm opens (rdma_cm, the connection manager, comes with it).
modules=(virtio_pci virtio_net
	crc32_generic crc32-pclmul crc32c_generic crc32c-intel
	ib_core ib_uverbs rdma_rxe rdma_ucm
	libnvdimm nfit nd_pmem nd_btt dax_pmem device_dax
	ext4)

key_input() {
	echo "$kver"
	sha256sum "${BASH_SOURCE[0]}" "$here/init" "$here/guest-lib.sh" "$here/pmem_check.c" /boot/vmlinuz-"$kver"
	dpkg-query -W "${need_pkgs[@]}" libc6 libgcc-s1 linux-image-"$kver" 2>/dev/null || true
	"$cc" --version | head -n 1
	if [[ -n ${SROCE_VM_MODULES:-} ]]; then
		sha256sum "$SROCE_VM_MODULES"/*.ko
	fi
}
key=$(key_input | sha256sum | cut -c1-16)
dest=$out/guest-$kver-$key

mkdir -p "$out"
exec 9>"$out/.build.lock"
# Tests running in parallel build the guest once: the others wait here.
flock 9
if [[ -f $dest/initrd.img && -f $dest/vmlinuz ]]; then
	echo "$dest"
	exit 0
fi

stage=$(mktemp -d "$out/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,root,var/tmp}
mkdir -p "$root"/usr/{bin,sbin} "$root"/lib/x86_64-linux-gnu "$root"/lib64

# --- busybox, with one link per applet it has.
cp /bin/busybox "$root/bin/busybox"
for a in $("$root/bin/busybox" --list); do
	[[ $a == busybox ]] && continue
	[[ -e $root/bin/$a ]] || ln -s busybox "$root/bin/$a"
done

# --- kernel modules and their dependencies, found without modules.dep (the
# kernel package does not ship one): every .ko is indexed by its name, and
# `modinfo -F depends FILE` reads the dependencies from the object itself.
declare -A modfile
while IFS= read -r f; do
	n=${f##*/}
	n=${n%%.ko*}
	modfile[${n//-/_}]=$f
done < <(find "$moddir/kernel" -name '*.ko*')
declare -A builtin
while IFS= read -r f; do
	n=${f##*/}
	n=${n%%.ko*}
	builtin[${n//-/_}]=1
done <"$moddir/modules.builtin"

declare -A have
add_module() {
	local n=${1//-/_} d
	[[ -n ${have[$n]:-} || -n ${builtin[$n]:-} ]] && return 0
	[[ -n ${modfile[$n]:-} ]] || die "kernel module $1 not found in $moddir"
	have[$n]=1
	local f=${modfile[$n]}
	mkdir -p "$root/${f%/*}"
	cp "$f" "$root/$f"
	for d in $(modinfo -F depends "$f" | tr ',' ' '); do
		add_module "$d"
	done
}
for m in "${modules[@]}"; do
	add_module "$m"
done
if [[ -n ${SROCE_VM_MODULES:-} ]]; then
	mods=("$SROCE_VM_MODULES"/*.ko)
	[[ -e ${mods[0]} ]] || die "no modules in SROCE_VM_MODULES=$SROCE_VM_MODULES"
	for f in "${mods[@]}"; do
		magic=$(modinfo -F vermagic "$f")
		[[ $magic == "$kver "* ]] || die "${f##*/} is built for '${magic%% *}', the guest boots $kver"
	done
	mkdir -p "$root/$moddir/updates"
	cp "${mods[@]}" "$root/$moddir/updates/"
fi
cp "$moddir"/modules.{builtin,order} "$root/$moddir/"
[[ -f $moddir/modules.builtin.modinfo ]] && cp "$moddir/modules.builtin.modinfo" "$root/$moddir/"
depmod -b "$root" "$kver"
# Loaded in this order by init (modprobe pulls in the dependencies).
printf '%s\n' "${modules[@]}" >"$root/etc/guest-modules"

# --- user space: the programs, the rxe provider, and their ldd closure.
cp "$here/pmem_check.c" "$stage/"
"$cc" -O2 -Wall -Wextra -Werror -o "$stage/pmem_check" "$stage/pmem_check.c" -lpmem
cp "$stage/pmem_check" "$root/usr/bin/pmem_check"

libdir=/usr/lib/x86_64-linux-gnu
provider=$libdir/libibverbs/librxe-rdmav34.so
[[ -f $provider ]] || skip "$provider missing (ibverbs-providers)"
mkdir -p "$root/etc/libibverbs.d" "$root$libdir/libibverbs"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
cp -L "$provider" "$root$provider"

for f in "${paths[@]}"; do
	cp -L "$f" "$root/usr/bin/${f##*/}"
done
ln -s mke2fs "$root/usr/bin/mkfs.ext4"

# Copies every library ldd names for $@ to the same path in the guest.
copy_closure() {
	local lib
	while IFS= read -r lib; do
		[[ -e $root$lib ]] && continue
		mkdir -p "$root${lib%/*}"
		cp -L "$lib" "$root$lib"
	done < <(ldd "$@" 2>/dev/null | awk '
		$2 == "=>" && $3 ~ /^\// { print $3 }
		$1 ~ /^\// && $1 !~ /:$/ { print $1 }' | sort -u)
}
# ldd prints the whole closure of each file; the provider is named
# explicitly because libibverbs loads it with dlopen.
copy_closure "$root"/usr/bin/* "$root$provider"
# glibc loads libgcc_s with dlopen to unwind a thread that ends with
# pthread_exit (rping's, cmtime's), so no ldd names it either.  awk reads
# all of ldconfig's list: stopping early would kill ldconfig with SIGPIPE,
# an error under pipefail.
gcc_s=$(ldconfig -p | awk '$1 == "libgcc_s.so.1" && /x86-64/ && f == "" { f = $NF } END { print f }')
[[ -n $gcc_s ]] || skip "libgcc_s.so.1 not found (libgcc-s1)"
mkdir -p "$root${gcc_s%/*}"
cp -L "$gcc_s" "$root$gcc_s"
printf '%s\n' /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu >"$root/etc/ld.so.conf"
ldconfig -r "$root" 2>/dev/null || true

# --- the rest of a minimal system.
cp "$here/init" "$root/init"
chmod 755 "$root/init"
cp "$here/guest-lib.sh" "$root/etc/guest-lib.sh"
# The kernel opens /dev/console before init mounts devtmpfs.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
[[ -f /etc/mke2fs.conf ]] && cp /etc/mke2fs.conf "$root/etc/"

# What the guest already has, so that vm.sh adds only missing libraries.
(cd "$root" && find . \( -type f -o -type l \) | sed 's/^\.//' | LC_ALL=C sort) >"$stage/files.txt"
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) | gzip -1 >"$stage/initrd.img"
cp /boot/vmlinuz-"$kver" "$stage/vmlinuz"

mkdir -p "$stage/out"
mv "$stage/vmlinuz" "$stage/initrd.img" "$stage/files.txt" "$stage/out/"
echo "$kver" >"$stage/out/kernel-version"
rm -rf "$dest"
mv "$stage/out" "$dest"
# Guests built from older inputs are never used again.
for d in "$out"/guest-*; do
	[[ $d == "$dest" ]] || rm -rf "$d"
done
echo "$dest"
