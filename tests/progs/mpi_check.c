// SPDX-License-Identifier: MIT
//
// mpi_check: an MPI ping-pong, allreduces and alltoalls whose every result
// is checked.
//
//   mpirun -np N mpi_check [--no-rma] [--no-alltoall]   (N even, at least 2)
//
// Ping-pong: rank r talks to rank r^1.  For each size (1 byte to 1 MiB, so
// both the eager and the rendezvous protocols of the transport are used) the
// even rank sends a pattern, the odd rank checks it and answers with the
// pattern of the next iteration, which the even rank checks in turn.
// Allreduce: MPI_SUM and MPI_MAX over every rank's vector, small (one
// message) and 2 MiB, compared with the closed-form results.
// Alltoall (unless --no-alltoall): every rank sends every rank a block
// (64 B and 256 KiB) whose pattern names the pair; each received block is
// checked.
// One-sided (unless --no-rma): every rank MPI_Puts a pattern into the next
// rank's window and MPI_Gets one from the previous rank's, between
// MPI_Win_fences (8 B to 1 MiB), then every rank adds to a counter in rank
// 0's window with MPI_Accumulate and MPI_Fetch_and_op under a shared
// MPI_Win_lock; the windows and the fetched values are checked.
//
// Rank 0 prints one line per check.  Exit status: 0 success, 1 usage error
// (an odd number of ranks), 2 out of memory, 3 a mismatch on some rank.
// MPI's own errors abort the job (MPI_ERRORS_ARE_FATAL), which mpirun
// reports as non-zero.

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

enum { EXIT_USAGE = 1, EXIT_NOMEM = 2, EXIT_MISMATCH = 3 };

static uint8_t pattern(size_t size, int iter, size_t i) {
    return (uint8_t)(i * 251u + (size_t)iter * 13u + size * 7u + 3u);
}

static int check(const uint8_t *buf, size_t size, int iter, int rank) {
    for (size_t i = 0; i < size; i++) {
        if (buf[i] != pattern(size, iter, i)) {
            fprintf(stderr, "mpi_check: rank %d: %zu-byte message %d differs at byte %zu\n", rank,
                    size, iter, i);
            return 1;
        }
    }
    return 0;
}

static void fill(uint8_t *buf, size_t size, int iter) {
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(size, iter, i);
}

// Returns the number of bad messages this rank received.
static int pingpong(int rank, size_t size, int iters, double *usec) {
    int partner = rank ^ 1, bad = 0;
    uint8_t *buf = malloc(size);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, EXIT_NOMEM);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        if (rank % 2 == 0) {
            fill(buf, size, 2 * it);
            MPI_Send(buf, (int)size, MPI_BYTE, partner, it, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, partner, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad += check(buf, size, 2 * it + 1, rank);
        } else {
            MPI_Recv(buf, (int)size, MPI_BYTE, partner, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad += check(buf, size, 2 * it, rank);
            fill(buf, size, 2 * it + 1);
            MPI_Send(buf, (int)size, MPI_BYTE, partner, it, MPI_COMM_WORLD);
        }
    }
    *usec = (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
    free(buf);
    return bad;
}

// Returns the number of wrong elements of the result on this rank.
static int allreduce(int rank, int nranks, int count) {
    int64_t *in = malloc(sizeof *in * (size_t)count);
    int64_t *sum = malloc(sizeof *sum * (size_t)count);
    int64_t *max = malloc(sizeof *max * (size_t)count);
    int bad = 0;
    if (!in || !sum || !max) MPI_Abort(MPI_COMM_WORLD, EXIT_NOMEM);
    for (int i = 0; i < count; i++)
        in[i] = (int64_t)rank * 1000003 + i;
    MPI_Allreduce(in, sum, count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(in, max, count, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    int64_t ranks_sum = (int64_t)nranks * (nranks - 1) / 2;
    for (int i = 0; i < count; i++) {
        int64_t want_sum = (int64_t)nranks * i + 1000003 * ranks_sum;
        int64_t want_max = (int64_t)(nranks - 1) * 1000003 + i;
        if (sum[i] != want_sum || max[i] != want_max) {
            if (bad++ == 0)
                fprintf(stderr,
                        "mpi_check: rank %d: allreduce of %d: element %d is sum %" PRId64
                        " max %" PRId64 ", expected %" PRId64 " and %" PRId64 "\n",
                        rank, count, i, sum[i], max[i], want_sum, want_max);
        }
    }
    free(in);
    free(sum);
    free(max);
    return bad;
}

// Every rank sends every rank (itself too) a block of `block` bytes whose
// pattern names sender and receiver; returns the number of wrong blocks
// this rank received.  Times the exchange into *usec.
static int alltoall(int rank, int nranks, size_t block, double *usec) {
    uint8_t *out = malloc(block * (size_t)nranks);
    uint8_t *in = malloc(block * (size_t)nranks);
    int bad = 0;
    if (!out || !in) MPI_Abort(MPI_COMM_WORLD, EXIT_NOMEM);
    for (int to = 0; to < nranks; to++)
        fill(out + (size_t)to * block, block, rank * nranks + to);
    memset(in, 0, block * (size_t)nranks);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Alltoall(out, (int)block, MPI_BYTE, in, (int)block, MPI_BYTE, MPI_COMM_WORLD);
    *usec = (MPI_Wtime() - t0) * 1e6;
    for (int from = 0; from < nranks; from++) {
        bad += check(in + (size_t)from * block, block, from * nranks + rank, rank);
    }
    free(out);
    free(in);
    return bad;
}

// A rank's window: the bytes the previous rank puts, the bytes the next
// rank gets, then two counters for the passive-target updates.
struct window {
    MPI_Win win;
    uint8_t *base;
    size_t size;
};

static int64_t *counters(const struct window *w) {
    return (int64_t *)(w->base + 2 * w->size);
}

// Returns the number of wrong bytes and counters this rank saw.
static int one_sided(int rank, int nranks, size_t size) {
    struct window w = {.size = size};
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks, bad = 0;
    uint8_t *src = malloc(size), *got = malloc(size);
    if (!src || !got) MPI_Abort(MPI_COMM_WORLD, EXIT_NOMEM);
    MPI_Win_allocate((MPI_Aint)(2 * size + 2 * sizeof(int64_t)), 1, MPI_INFO_NULL, MPI_COMM_WORLD,
                     &w.base, &w.win);
    memset(w.base, 0, size);
    fill(w.base + size, size, 1000 + rank);
    counters(&w)[0] = counters(&w)[1] = 0;
    fill(src, size, 2000 + rank);

    MPI_Win_fence(0, w.win);
    MPI_Put(src, (int)size, MPI_BYTE, next, 0, (int)size, MPI_BYTE, w.win);
    MPI_Get(got, (int)size, MPI_BYTE, prev, (MPI_Aint)size, (int)size, MPI_BYTE, w.win);
    MPI_Win_fence(0, w.win);
    if (check(w.base, size, 2000 + prev, rank) || check(got, size, 1000 + prev, rank)) bad++;

    int64_t add = rank + 1, one = 1, before = -1;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, w.win);
    MPI_Accumulate(&add, 1, MPI_INT64_T, 0, (MPI_Aint)(2 * size), 1, MPI_INT64_T, MPI_SUM, w.win);
    MPI_Fetch_and_op(&one, &before, MPI_INT64_T, 0, (MPI_Aint)(2 * size + sizeof(int64_t)), MPI_SUM,
                     w.win);
    MPI_Win_unlock(0, w.win);
    // Each rank fetched a distinct value before its own increment.
    if (before < 0 || before >= nranks) {
        fprintf(stderr, "mpi_check: rank %d: MPI_Fetch_and_op fetched %" PRId64 "\n", rank, before);
        bad++;
    }
    int64_t mask = before >= 0 && before < 63 ? (int64_t)1 << before : 0, all = 0;
    MPI_Allreduce(&mask, &all, 1, MPI_INT64_T, MPI_BOR, MPI_COMM_WORLD);
    if (all != ((int64_t)1 << nranks) - 1) bad++;
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w.win);
        int64_t seen = counters(&w)[0];
        int64_t fetches = counters(&w)[1];
        MPI_Win_unlock(0, w.win);
        if (seen != (int64_t)nranks * (nranks + 1) / 2 || fetches != nranks) {
            fprintf(stderr,
                    "mpi_check: rank 0: counters %" PRId64 " and %" PRId64 ", expected %d and %d\n",
                    seen, fetches, nranks * (nranks + 1) / 2, nranks);
            bad++;
        }
    }
    MPI_Win_free(&w.win);
    free(src);
    free(got);
    return bad;
}

int main(int argc, char **argv) {
    static const size_t sizes[] = {1, 4096, 65536, 1 << 20};
    int rank, nranks, bad = 0, total = 0;
    double usec;

    // A line at a time, so that a job killed while it hangs shows how far
    // it got.
    setvbuf(stdout, NULL, _IOLBF, 0);
    MPI_Init(&argc, &argv);
    int rma = 1, a2a = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-rma") == 0) rma = 0;
        if (strcmp(argv[i], "--no-alltoall") == 0) a2a = 0;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks < 2 || nranks % 2) {
        if (rank == 0)
            fprintf(stderr, "mpi_check: needs an even number of ranks, got %d\n", nranks);
        MPI_Finalize();
        return EXIT_USAGE;
    }

    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int iters = sizes[k] >= 65536 ? 10 : 100;
        int b = pingpong(rank, sizes[k], iters, &usec);
        MPI_Allreduce(&b, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        bad += b;
        if (rank == 0)
            printf("%s ping-pong %zu bytes x %d: %.1f us one way (rank 0 <-> 1)\n",
                   total ? "FAIL" : "ok", sizes[k], iters, usec);
    }
    static const int counts[] = {16, 262144};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int b = allreduce(rank, nranks, counts[k]);
        MPI_Allreduce(&b, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        bad += b;
        if (rank == 0)
            printf("%s allreduce sum and max of %d int64 over %d ranks\n", total ? "FAIL" : "ok",
                   counts[k], nranks);
    }
    static const size_t blocks[] = {64, 262144};
    for (size_t k = 0; a2a && k < sizeof blocks / sizeof blocks[0]; k++) {
        int b = alltoall(rank, nranks, blocks[k], &usec);
        MPI_Allreduce(&b, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        bad += b;
        if (rank == 0)
            printf("%s alltoall of %zu bytes per pair over %d ranks: %.1f us\n",
                   total ? "FAIL" : "ok", blocks[k], nranks, usec);
    }
    static const size_t rma_sizes[] = {8, 4096, 1 << 20};
    for (size_t k = 0; rma && k < sizeof rma_sizes / sizeof rma_sizes[0]; k++) {
        int b = one_sided(rank, nranks, rma_sizes[k]);
        MPI_Allreduce(&b, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        bad += b;
        if (rank == 0)
            printf("%s one-sided: MPI_Put and MPI_Get of %zu bytes between fences, "
                   "MPI_Accumulate and MPI_Fetch_and_op under a lock, %d ranks\n",
                   total ? "FAIL" : "ok", rma_sizes[k], nranks);
    }
    MPI_Finalize();
    return bad ? EXIT_MISMATCH : 0;
}
