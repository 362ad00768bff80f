// SPDX-License-Identifier: MIT
//
// pmem_check FILE [MIB]: maps FILE (created with MIB MiB, default 4) through
// libpmem, requires that libpmem treats the mapping as persistent memory
// (a DAX file mapped with MAP_SYNC), writes a pattern, persists it with
// pmem_persist(), maps the file again and verifies the pattern.  Prints a
// line ending in OK and exits 0 on success; exits 2 when the mapping is not
// persistent memory and 1 on any other failure.
#include <libpmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t pattern_byte(size_t i) {
    // Position-dependent, so a misplaced or stale page cannot pass.
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: pmem_check FILE [MIB]\n");
        return 1;
    }
    const char *path = argv[1];
    size_t len = (size_t)(argc == 3 ? strtoul(argv[2], NULL, 10) : 4) << 20;
    if (len == 0) {
        fprintf(stderr, "pmem_check: size must be at least 1 MiB\n");
        return 1;
    }

    size_t mapped = 0;
    int is_pmem = 0;
    uint8_t *p = pmem_map_file(path, len, PMEM_FILE_CREATE, 0600, &mapped, &is_pmem);
    if (p == NULL) {
        fprintf(stderr, "pmem_check: pmem_map_file(%s): %s\n", path, pmem_errormsg());
        return 1;
    }
    int range_pmem = pmem_is_pmem(p, mapped);
    printf("pmem_check: %s mapped %zu bytes, is_pmem=%d, pmem_is_pmem=%d\n", path, mapped, is_pmem,
           range_pmem);
    if (!is_pmem || !range_pmem) {
        fprintf(stderr, "pmem_check: %s is not persistent memory to libpmem\n", path);
        pmem_unmap(p, mapped);
        return 2;
    }

    for (size_t i = 0; i < mapped; i++)
        p[i] = pattern_byte(i);
    pmem_persist(p, mapped);
    // The non-temporal copy path as well: a second region written with
    // pmem_memcpy_persist must read back the same.
    size_t half = mapped / 2;
    pmem_memcpy_persist(p + half, p, half);
    if (pmem_unmap(p, mapped) != 0) {
        fprintf(stderr, "pmem_check: pmem_unmap: %s\n", pmem_errormsg());
        return 1;
    }

    p = pmem_map_file(path, 0, 0, 0, &mapped, &is_pmem);
    if (p == NULL) {
        fprintf(stderr, "pmem_check: remapping %s: %s\n", path, pmem_errormsg());
        return 1;
    }
    for (size_t i = 0; i < mapped; i++) {
        uint8_t want = pattern_byte(i < half ? i : i - half);
        if (p[i] != want) {
            fprintf(stderr, "pmem_check: byte %zu is 0x%02x after remapping, expected 0x%02x\n", i,
                    p[i], want);
            pmem_unmap(p, mapped);
            return 1;
        }
    }
    pmem_unmap(p, mapped);
    printf("pmem_check: wrote, persisted and verified %zu bytes: OK\n", mapped);
    return 0;
}
