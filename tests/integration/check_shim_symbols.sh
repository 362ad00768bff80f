#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Checks that libsroce.so (the libibverbs interposition shim) can stand in
# for libibverbs in unmodified binaries:
#   1. every libibverbs symbol+version (IBVERBS_*) imported by the checked
#      binaries is exported by the shim with the same version;
#   2. every function the shim exports carries the version the system
#      libibverbs exports it under, and is the default (@@) one whenever
#      libibverbs' is;
#   3. every function libibverbs exports by default under an IBVERBS_1.x
#      version is exported by the shim.
#
# Usage: check_shim_symbols.sh PATH/TO/libsroce.so [BINARY...]
# Without BINARY arguments the perftest and ibverbs-utils binaries below are
# checked.  LIBIBVERBS overrides the system libibverbs path.
# Exit status: 0 all present, 1 something missing or mismatched, 2 usage or
# environment error.
set -euo pipefail

usage() {
    echo "usage: $0 PATH/TO/libsroce.so [BINARY...]" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
shim=$1
shift
[[ -f $shim ]] || { echo "error: $shim: no such file" >&2; exit 2; }
command -v objdump >/dev/null || { echo "error: objdump (binutils) not found" >&2; exit 2; }

if [[ $# -gt 0 ]]; then
    binaries=("$@")
else
    binaries=(/usr/bin/ib_write_bw /usr/bin/ibv_rc_pingpong /usr/bin/ibv_devinfo /usr/bin/ibv_devices)
fi

libibverbs=${LIBIBVERBS:-}
if [[ -z $libibverbs ]]; then
    for candidate in /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib64/libibverbs.so.1 \
        /usr/lib/libibverbs.so.1; do
        if [[ -f $candidate ]]; then
            libibverbs=$candidate
            break
        fi
    done
fi

# Dynamic symbols of $1 as "name version kind" lines, kind being "import",
# "default" (name@@version) or "hidden" (name@version); only symbols with a
# libibverbs version.
versioned_symbols() {
    objdump -T "$1" | awk '
        NF >= 6 && $(NF - 1) ~ /IBVERBS_/ {
            name = $NF
            version = $(NF - 1)
            hidden = (version ~ /^\(/)
            gsub(/[()]/, "", version)
            if (name == version)
                next # the version definition itself
            kind = ($0 ~ /\*UND\*/) ? "import" : (hidden ? "hidden" : "default")
            print name, version, kind
        }' | sort -u
}

# Number of non-empty lines in $1.
count_lines() {
    if [[ -z $1 ]]; then echo 0; else grep -c . <<<"$1"; fi
}

shim_syms=$(versioned_symbols "$shim")
shim_exports=$(awk 'NF == 3 && $3 != "import" { print $1 "@" $2 }' <<<"$shim_syms" | sort -u)
status=0

echo "$(basename "$shim") exports $(count_lines "$shim_exports") versioned symbols"

# 1. Imports of the binaries.
checked=0
for bin in "${binaries[@]}"; do
    if [[ ! -f $bin ]]; then
        echo "warning: $bin not installed, skipped" >&2
        continue
    fi
    checked=$((checked + 1))
    imports=$(versioned_symbols "$bin" | awk '$3 == "import" { print $1 "@" $2 }')
    missing=$(comm -23 <(sort -u <<<"$imports") <(cat <<<"$shim_exports"))
    count=$(count_lines "$imports")
    if [[ -n $missing ]]; then
        status=1
        echo "FAIL $bin: $count libibverbs imports, missing from the shim:"
        sed 's/^/    /' <<<"$missing"
    else
        echo "ok   $bin: all $count libibverbs imports exported"
    fi
done
if [[ $checked -eq 0 ]]; then
    echo "error: none of the binaries to check is installed" >&2
    exit 2
fi

# 2 and 3. Agreement with the system libibverbs.
if [[ -z $libibverbs ]]; then
    echo "warning: system libibverbs not found, version agreement not checked" >&2
    exit "$status"
fi
ref_syms=$(versioned_symbols "$libibverbs" | awk '$3 != "import"')

# name -> version and kind of libibverbs' default export of that name, or
# of its only export when it has no default one.
mismatched=$(awk '
    NR == FNR {
        if (NF != 3) next
        if ($3 == "default" || !($1 in ref)) ref[$1] = $2 " " $3
        next
    }
    NF != 3 { next }
    # The project'\''s own interfaces: the verbs_ext.h verbs and test hooks.
    $2 ~ /^(IBVERBS_EXT_|SROCE_PRIVATE_)/ { next }
    !($1 in ref) { print "    " $1 "@" $2 ": not exported by libibverbs"; next }
    ref[$1] != $2 " " $3 {
        split(ref[$1], r, " ")
        print "    " $1 ($3 == "default" ? "@@" : "@") $2 ": libibverbs has " \
            $1 (r[2] == "default" ? "@@" : "@") r[1]
    }' <(cat <<<"$ref_syms") <(awk '$3 != "import"' <<<"$shim_syms"))
if [[ -n $mismatched ]]; then
    status=1
    echo "FAIL shim exports disagreeing with $libibverbs:"
    echo "$mismatched"
else
    echo "ok   every shim export has the symbol version libibverbs exports it under"
fi

uncovered=$(comm -23 \
    <(awk '$3 == "default" && $2 ~ /^IBVERBS_1\./ { print $1 "@" $2 }' <<<"$ref_syms" | sort -u) \
    <(cat <<<"$shim_exports"))
if [[ -n $uncovered ]]; then
    status=1
    echo "FAIL public libibverbs functions not exported by the shim:"
    sed 's/^/    /' <<<"$uncovered"
else
    echo "ok   every default IBVERBS_1.x function of libibverbs is exported"
fi

exit "$status"
