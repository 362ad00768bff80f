// SPDX-License-Identifier: MIT
//
// What a program that never uses RDMA pays for having the sroce shim
// preloaded (test_preload_cost.sh): it starts THREADS threads that each make
// the libc calls the shim interposes (open, write, fstat, close on ordinary
// descriptors) and then wait until all are alive, and prints the resident
// memory and heap the threads added, and the cost of one interposed write()
// on /dev/null.  Run once plain and once under `sroce exec`, the difference
// is the shim's.
//
// Usage: thread_cost [THREADS]
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t all_alive, may_exit;
static int null_fd;

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static void *worker(void *arg) {
    (void)arg;
    char byte = 0;
    struct stat st;
    if (write(null_fd, &byte, 1) != 1) abort();
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || close(fd) != 0) abort();
    pthread_barrier_wait(&all_alive);
    pthread_barrier_wait(&may_exit);
    return NULL;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    if (n <= 0) {
        fprintf(stderr, "usage: %s [THREADS]\n", argv[0]);
        return 2;
    }
    null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd < 0) {
        perror("open /dev/null");
        return 1;
    }
    pthread_t *t = calloc((size_t)n, sizeof *t);
    pthread_attr_t attr;
    // Small stacks, so a thousand fit anywhere; what is measured is the
    // per-thread block beside the stack (TCB and static TLS), not the stack.
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_barrier_init(&all_alive, NULL, (unsigned)n + 1);
    pthread_barrier_init(&may_exit, NULL, (unsigned)n + 1);

    long rss0 = rss_kib();
    size_t heap0 = mallinfo2().uordblks;
    for (int i = 0; i < n; i++) {
        int err = pthread_create(&t[i], &attr, worker, NULL);
        if (err) {
            fprintf(stderr, "pthread_create: %s\n", strerror(err));
            return 1;
        }
    }
    pthread_barrier_wait(&all_alive);
    long rss1 = rss_kib();
    size_t heap1 = mallinfo2().uordblks;
    pthread_barrier_wait(&may_exit);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);

    enum { kCalls = 200000 };
    char byte = 0;
    double t0 = now_ns();
    for (int i = 0; i < kCalls; i++)
        if (write(null_fd, &byte, 1) != 1) abort();
    double per_write = (now_ns() - t0) / kCalls;

    printf("threads %d rss_kib %ld heap_bytes %zd write_ns %.1f\n", n, rss1 - rss0,
           (ssize_t)(heap1 - heap0), per_write);
    free(t);
    return 0;
}
