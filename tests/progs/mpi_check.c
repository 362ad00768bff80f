// SPDX-License-Identifier: MIT
//
// mpi_check: an MPI ping-pong and allreduces whose every result is checked.
//
//   mpirun -np N mpi_check        (N even, at least 2)
//
// Ping-pong: rank r talks to rank r^1.  For each size (1 byte to 1 MiB, so
// both the eager and the rendezvous protocols of the transport are used) the
// even rank sends a pattern, the odd rank checks it and answers with the
// pattern of the next iteration, which the even rank checks in turn.
// Allreduce: MPI_SUM and MPI_MAX over every rank's vector, small (one
// message) and 2 MiB, compared with the closed-form results.
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

int main(int argc, char **argv) {
    static const size_t sizes[] = {1, 4096, 65536, 1 << 20};
    int rank, nranks, bad = 0, total = 0;
    double usec;

    MPI_Init(&argc, &argv);
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
    MPI_Finalize();
    return bad ? EXIT_MISMATCH : 0;
}
