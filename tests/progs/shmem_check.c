// SPDX-License-Identifier: MIT
//
// shmem_check: OpenSHMEM puts, gets, ordered signalling and atomics between
// processing elements, with every result checked.
//
//   oshrun -np N shmem_check        (N at least 2)
//
// PE p works with p+1 (next) and p-1 (prev), modulo N.
//   - put/get: for 8 B to 1 MiB, each PE shmem_putmem()s a pattern into the
//     next PE's symmetric buffer and shmem_getmem()s the previous PE's source
//     buffer; a non-blocking put (shmem_putmem_nbi + shmem_quiet) does the same
//     with the next iteration's pattern;
//   - signalling: data put, shmem_fence(), then a flag put; the next PE waits
//     on the flag with shmem_int_wait_until() and must then see the data;
//   - atomics on PE 0: fetch-add (each PE fetches a distinct earlier value
//     and the sum is exact), compare-and-swap (exactly one PE wins), swap
//     into the next PE, and an atomic fetch of the result.
//
// PE 0 prints one line per check.  Exit status: 0 success, 1 usage error,
// 2 out of memory, 3 a mismatch on some PE.

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shmem.h>

enum { EXIT_USAGE = 1, EXIT_NOMEM = 2, EXIT_MISMATCH = 3 };

// Symmetric data objects: the same address on every PE.
static long long sum_counter, fetch_counter, cas_owner = -1, swap_slot = -1;
static int flag;
static long long bad_total, bad_src;
static long psync[SHMEM_REDUCE_SYNC_SIZE];
static long long pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];

static uint8_t pattern(size_t size, int iter, size_t i) {
    return (uint8_t)(i * 251u + (size_t)iter * 13u + size * 7u + 3u);
}

static void fill(uint8_t *buf, size_t size, int iter) {
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(size, iter, i);
}

static int check(const char *what, const uint8_t *buf, size_t size, int iter, int me) {
    for (size_t i = 0; i < size; i++) {
        if (buf[i] != pattern(size, iter, i)) {
            fprintf(stderr, "shmem_check: PE %d: %s of %zu bytes differs at byte %zu\n", me, what,
                    size, i);
            return 1;
        }
    }
    return 0;
}

// Sums every PE's count of failures; all PEs see the sum.
static long long total(long long bad) {
    bad_src = bad;
    shmem_barrier_all();
    shmem_longlong_sum_to_all(&bad_total, &bad_src, 1, 0, 0, shmem_n_pes(), pwrk, psync);
    shmem_barrier_all();
    return bad_total;
}

static int put_get(int me, int npes, size_t size) {
    int next = (me + 1) % npes, prev = (me + npes - 1) % npes, bad = 0;
    uint8_t *dst = shmem_malloc(size), *src = shmem_malloc(size), *got = malloc(size);
    if (!dst || !src || !got) {
        fprintf(stderr, "shmem_check: PE %d: no memory for %zu bytes\n", me, size);
        exit(EXIT_NOMEM);
    }
    fill(src, size, me);
    memset(dst, 0, size);
    shmem_barrier_all();
    shmem_putmem(dst, src, size, next);
    shmem_getmem(got, src, size, prev);
    shmem_barrier_all();
    bad += check("shmem_putmem", dst, size, prev, me);
    bad += check("shmem_getmem", got, size, prev, me);

    fill(src, size, me + npes);
    shmem_barrier_all();
    shmem_putmem_nbi(dst, src, size, next);
    shmem_quiet();
    shmem_barrier_all();
    bad += check("shmem_putmem_nbi", dst, size, prev + npes, me);

    shmem_barrier_all();
    shmem_free(dst);
    shmem_free(src);
    free(got);
    return bad;
}

static int signalled(int me, int npes, size_t size) {
    int next = (me + 1) % npes, prev = (me + npes - 1) % npes, bad = 0;
    uint8_t *dst = shmem_malloc(size), *src = shmem_malloc(size);
    if (!dst || !src) exit(EXIT_NOMEM);
    memset(dst, 0, size);
    fill(src, size, 3 * npes + me);
    flag = 0;
    shmem_barrier_all();
    shmem_putmem(dst, src, size, next);
    shmem_fence();
    shmem_int_p(&flag, 1, next);
    shmem_int_wait_until(&flag, SHMEM_CMP_EQ, 1);
    bad += check("data put before the fence", dst, size, 3 * npes + prev, me);
    shmem_barrier_all();
    shmem_free(dst);
    shmem_free(src);
    return bad;
}

static int atomics(int me, int npes) {
    int next = (me + 1) % npes, bad = 0;
    long long before = shmem_longlong_atomic_fetch_add(&fetch_counter, 1, 0);
    shmem_longlong_atomic_add(&sum_counter, me + 1, 0);
    long long won = shmem_longlong_atomic_compare_swap(&cas_owner, -1, me, 0);
    long long old_slot = shmem_longlong_atomic_swap(&swap_slot, me, next);
    shmem_barrier_all();
    if (before < 0 || before >= npes) {
        fprintf(stderr, "shmem_check: PE %d: fetch-add fetched %lld\n", me, before);
        bad++;
    }
    if (old_slot != -1 || swap_slot != (me + npes - 1) % npes) {
        fprintf(stderr, "shmem_check: PE %d: swap returned %lld, slot holds %lld\n", me, old_slot,
                swap_slot);
        bad++;
    }
    long long sum = shmem_longlong_atomic_fetch(&sum_counter, 0);
    long long owner = shmem_longlong_atomic_fetch(&cas_owner, 0);
    long long fetches = shmem_longlong_atomic_fetch(&fetch_counter, 0);
    if (sum != (long long)npes * (npes + 1) / 2 || fetches != npes || owner < 0 || owner >= npes ||
        (won == -1) != (owner == me)) {
        fprintf(stderr,
                "shmem_check: PE %d: sum %lld, fetches %lld, owner %lld (this PE's CAS saw "
                "%lld)\n",
                me, sum, fetches, owner, won);
        bad++;
    }
    shmem_barrier_all();
    return bad;
}

int main(void) {
    static const size_t sizes[] = {8, 4096, 65536, 1 << 20};
    int bad = 0;
    long long t;

    for (size_t i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++)
        psync[i] = SHMEM_SYNC_VALUE;
    shmem_init();
    int me = shmem_my_pe(), npes = shmem_n_pes();
    if (npes < 2) {
        if (me == 0) fprintf(stderr, "shmem_check: needs at least 2 PEs, got %d\n", npes);
        shmem_finalize();
        return EXIT_USAGE;
    }
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int b = put_get(me, npes, sizes[k]);
        bad += b;
        t = total(b);
        if (me == 0)
            printf("%s put, get and non-blocking put of %zu bytes, %d PEs\n", t ? "FAIL" : "ok",
                   sizes[k], npes);
    }
    int b = signalled(me, npes, 65536);
    bad += b;
    t = total(b);
    if (me == 0)
        printf("%s 65536 bytes put, shmem_fence, flag put: data seen with the flag\n",
               t ? "FAIL" : "ok");
    b = atomics(me, npes);
    bad += b;
    t = total(b);
    if (me == 0)
        printf("%s atomics on PE 0: fetch-add, add, compare-and-swap, swap, fetch\n",
               t ? "FAIL" : "ok");
    shmem_finalize();
    return bad ? EXIT_MISMATCH : 0;
}
