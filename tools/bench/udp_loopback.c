// udp_loopback: the ceiling for any transport built on kernel UDP sockets on
// this host.  Measures one-way streaming throughput and ping-pong latency of
// plain UDP datagrams between two threads over loopback, so sroce's numbers
// can be compared against it in the same run.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int udp_socket(const char *addr, uint16_t port, struct sockaddr_in *sa) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return -1;
    int buf = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    inet_pton(AF_INET, addr, &sa->sin_addr);
    if (bind(fd, (struct sockaddr *)sa, sizeof *sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

struct args {
    size_t size;
    long iters;
    int fd;
    struct sockaddr_in peer;
    double seconds;
    long received;
};

static void *bw_receiver(void *p) {
    struct args *a = p;
    char *buf = malloc(a->size);
    struct timeval tv = {0, 200000};
    setsockopt(a->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    double t0 = 0;
    for (;;) {
        ssize_t r = recv(a->fd, buf, a->size, 0);
        if (r < 0) break; // sender finished and the socket went quiet
        if (a->received++ == 0) t0 = now_s();
        a->seconds = now_s() - t0;
    }
    free(buf);
    return NULL;
}

static void *pong(void *p) {
    struct args *a = p;
    char *buf = malloc(a->size);
    for (long i = 0; i < a->iters; i++) {
        if (recv(a->fd, buf, a->size, 0) < 0) break;
        sendto(a->fd, buf, a->size, 0, (struct sockaddr *)&a->peer, sizeof a->peer);
    }
    free(buf);
    return NULL;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    size_t size = 1472;
    long iters = 200000;
    const char *mode = "bw";
    int c;
    while ((c = getopt(argc, argv, "s:n:m:h")) != -1) {
        switch (c) {
        case 's':
            size = strtoul(optarg, NULL, 0);
            break;
        case 'n':
            iters = strtol(optarg, NULL, 0);
            break;
        case 'm':
            mode = optarg;
            break;
        default:
            fprintf(stderr, "usage: udp_loopback [-m bw|lat] [-s BYTES] [-n COUNT]\n");
            return 2;
        }
    }
    if (size < 1 || size > 65507 || iters < 1) {
        fprintf(stderr, "udp_loopback: size must be 1..65507 and count positive\n");
        return 2;
    }
    struct sockaddr_in sa_a, sa_b;
    int a = udp_socket("127.0.0.1", 0, &sa_a), b = udp_socket("127.0.0.1", 0, &sa_b);
    if (a < 0 || b < 0) {
        perror("udp_loopback: socket");
        return 1;
    }
    socklen_t l = sizeof sa_a;
    getsockname(a, (struct sockaddr *)&sa_a, &l);
    l = sizeof sa_b;
    getsockname(b, (struct sockaddr *)&sa_b, &l);
    char *buf = calloc(1, size);
    pthread_t t;
    if (!strcmp(mode, "bw")) {
        struct args ra = {size, iters, b, sa_a, 0, 0};
        pthread_create(&t, NULL, bw_receiver, &ra);
        usleep(10000);
        for (long i = 0; i < iters; i++) {
            while (sendto(a, buf, size, 0, (struct sockaddr *)&sa_b, sizeof sa_b) < 0 &&
                   errno == ENOBUFS)
                ;
        }
        pthread_join(t, NULL);
        double gbps =
            ra.seconds > 0 ? (double)ra.received * (double)size * 8 / ra.seconds / 1e9 : 0;
        printf("udp_loopback bw: size %zu sent %ld received %ld (%.1f%%) %.3f Gb/s %.1f MB/s\n",
               size, iters, ra.received, 100.0 * (double)ra.received / (double)iters, gbps,
               gbps * 1e3 / 8);
    } else if (!strcmp(mode, "lat")) {
        struct args pa = {size, iters, b, sa_a, 0, 0};
        pthread_create(&t, NULL, pong, &pa);
        double *rtt = malloc(sizeof(double) * (size_t)iters);
        for (long i = 0; i < iters; i++) {
            double t0 = now_s();
            sendto(a, buf, size, 0, (struct sockaddr *)&sa_b, sizeof sa_b);
            if (recv(a, buf, size, 0) < 0) break;
            rtt[i] = (now_s() - t0) * 1e6;
        }
        pthread_join(t, NULL);
        qsort(rtt, (size_t)iters, sizeof(double), cmp_double);
        double sum = 0;
        for (long i = 0; i < iters; i++)
            sum += rtt[i];
        // perftest reports half the round trip as latency; so do we.
        printf("udp_loopback lat: size %zu iters %ld t_min %.2f t_typical %.2f t_avg %.2f "
               "t_99 %.2f usec (one way = RTT/2)\n",
               size, iters, rtt[0] / 2, rtt[iters / 2] / 2, sum / (double)iters / 2,
               rtt[(long)((double)iters * 0.99)] / 2);
        free(rtt);
    } else {
        fprintf(stderr, "udp_loopback: unknown mode %s\n", mode);
        return 2;
    }
    free(buf);
    return 0;
}
