// SPDX-License-Identifier: MIT
/*
 * flush_example - make an RDMA WRITE durable at the target with IBTA FLUSH.
 *
 * One process plays both peers, each on its own device, with the two RC QPs
 * connected back to back (a real application exchanges the QP number, GID,
 * address and rkey out of band instead, as ibv_rc_pingpong does):
 *
 *   target     a file on /var/tmp, mapped MAP_SHARED and registered with
 *              IBV_ACCESS_FLUSH_PERSISTENT, so the device can make it durable;
 *   initiator  posts an unsignaled RDMA WRITE into it and a signaled
 *              FLUSH(IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE) of the same range,
 *              in one ibv_wr_start()/ibv_wr_complete() batch.
 *
 * The FLUSH covers every WRITE posted before it on the QP, so its successful
 * completion (IBV_WC_FLUSH) means the written bytes are in the file's
 * persistence domain: they survive a crash of the target.
 *
 * Build:  cc -o flush_example flush_example.c $(pkg-config --cflags --libs libibverbs-ext)
 * Run on two sroce links on loopback (see sroce(8); SROCE_CONFIG may name a
 * private link file instead):
 *         sroce link add sroce0 netdev lo addr 127.0.0.1
 *         sroce link add sroce1 netdev lo addr 127.0.0.2
 *         ./flush_example -i sroce0 -t sroce1
 */
#define _GNU_SOURCE /* getopt_long */
#include <infiniband/verbs_ext.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char message[] = "made durable by an RDMA FLUSH";

struct end {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    union ibv_gid gid;
    enum ibv_mtu mtu;
};

static void usage(FILE *out, const char *argv0) {
    fprintf(out,
            "Usage: %s [-i DEVICE] [-t DEVICE] [-g GID_INDEX] [-f FILE]\n"
            "Writes a message into FILE at the target device over RDMA and makes it\n"
            "durable with an IBTA FLUSH.\n"
            "  -i DEVICE     initiator device (default: the first one listed)\n"
            "  -t DEVICE     target device (default: the second one listed)\n"
            "  -g GID_INDEX  GID index of both ports (default 1, the IPv4 GID of RoCE)\n"
            "  -f FILE       target file, created or truncated to one page and kept\n"
            "                (default: a temporary file in /var/tmp, removed at exit)\n"
            "  -h, --help    print this help\n",
            argv0);
}

/* The device called name, or else the nth one listed. */
static struct ibv_device *pick(struct ibv_device **list, int n, const char *name, int nth) {
    for (int i = 0; i < n; i++)
        if (name ? !strcmp(ibv_get_device_name(list[i]), name) : i == nth) return list[i];
    if (name)
        fprintf(stderr, "no device %s\n", name);
    else
        fprintf(stderr, "only %d device(s) listed; name both with -i and -t\n", n);
    return NULL;
}

static int open_end(struct end *e, struct ibv_device *dev, int gid_index) {
    struct ibv_port_attr port;

    e->ctx = ibv_open_device(dev);
    if (!e->ctx) {
        fprintf(stderr, "ibv_open_device(%s): %s\n", ibv_get_device_name(dev), strerror(errno));
        return -1;
    }
    if (ibv_query_port(e->ctx, 1, &port) || ibv_query_gid(e->ctx, 1, gid_index, &e->gid)) {
        fprintf(stderr, "%s: cannot query port 1 or GID %d\n", ibv_get_device_name(dev), gid_index);
        return -1;
    }
    e->mtu = port.active_mtu;
    e->pd = ibv_alloc_pd(e->ctx);
    e->cq = e->pd ? ibv_create_cq(e->ctx, 16, NULL, NULL, 0) : NULL;
    if (!e->cq) {
        fprintf(stderr, "ibv_alloc_pd/ibv_create_cq: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Persistence at the target must be offered by the device, not assumed. */
static int supports_persistent_flush(struct end *e) {
    struct ibv_device_attr_ex attr;

    memset(&attr, 0, sizeof(attr));
    if (ibv_query_device_ex(e->ctx, NULL, &attr)) return 0;
    return (attr.device_cap_flags_ex & IB_UVERBS_DEVICE_FLUSH_PERSISTENT) != 0;
}

static struct ibv_qp *create_qp(struct end *e, uint64_t send_ops) {
    struct ibv_qp_init_attr_ex attr;

    memset(&attr, 0, sizeof(attr));
    attr.qp_type = IBV_QPT_RC;
    attr.send_cq = e->cq;
    attr.recv_cq = e->cq;
    attr.cap.max_send_wr = 4;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attr.pd = e->pd;
    attr.send_ops_flags = send_ops;
    return ibv_create_qp_ex(e->ctx, &attr);
}

/* RESET -> INIT -> RTR -> RTS, aimed at the peer's QP. */
static int connect_qp(struct end *e, const struct end *peer, int gid_index, unsigned access) {
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access;
    if (ibv_modify_qp(e->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = e->mtu < peer->mtu ? e->mtu : peer->mtu;
    a.dest_qp_num = peer->qp->qp_num;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1; /* FLUSH takes a responder resource, as a READ does */
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 64;
    if (ibv_modify_qp(e->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    /* A FLUSH to a file returns once msync(2) has: a busy disk can hold it
     * for longer than the retries of a short timeout (14: 67 ms, 8 tries),
     * and the requester would give up on a target that is only slow.
     * 18: about 1 s per try. */
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(e->qp, &a,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int wait_completion(struct ibv_cq *cq, struct ibv_wc *wc) {
    struct timespec start, now;

    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n) return n < 0 ? -1 : 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10) {
            fprintf(stderr, "no completion within 10 s\n");
            return -1;
        }
    }
}

static void close_end(struct end *e) {
    if (e->qp) ibv_destroy_qp(e->qp);
    if (e->mr) ibv_dereg_mr(e->mr);
    if (e->cq) ibv_destroy_cq(e->cq);
    if (e->pd) ibv_dealloc_pd(e->pd);
    if (e->ctx) ibv_close_device(e->ctx);
}

int main(int argc, char **argv) {
    static const struct option long_opts[] = {{"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    const char *init_name = NULL, *target_name = NULL, *path = NULL;
    char tmp_path[] = "/var/tmp/flush_example.XXXXXX";
    int gid_index = 1, fd = -1, ret = 1, n = 0, c;
    size_t size = (size_t)sysconf(_SC_PAGESIZE);
    struct end init, target;
    struct ibv_device **list = NULL;
    struct ibv_device *init_dev, *target_dev;
    char *file_mem = MAP_FAILED;
    char local[sizeof(message)], check[sizeof(message)];
    struct ibv_qp_ex *qpx;
    struct ibv_wc wc;

    while ((c = getopt_long(argc, argv, "i:t:g:f:h", long_opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            init_name = optarg;
            break;
        case 't':
            target_name = optarg;
            break;
        case 'g':
            gid_index = atoi(optarg);
            break;
        case 'f':
            path = optarg;
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr, argv[0]);
        return 2;
    }
    memset(&init, 0, sizeof(init));
    memset(&target, 0, sizeof(target));

    list = ibv_get_device_list(&n);
    if (!list) {
        perror("ibv_get_device_list");
        return 1;
    }
    init_dev = pick(list, n, init_name, 0);
    target_dev = pick(list, n, target_name, 1);
    if (!init_dev || !target_dev || open_end(&init, init_dev, gid_index) ||
        open_end(&target, target_dev, gid_index))
        goto out;
    if (!supports_persistent_flush(&target)) {
        fprintf(stderr, "%s does not support FLUSH to persistent memory\n",
                ibv_get_device_name(target_dev));
        goto out;
    }

    /* The target's memory: a file on a disk file system, not tmpfs (/tmp,
     * /dev/shm), since registration for persistence fails with EINVAL on
     * memory that cannot be made durable. */
    fd = path ? open(path, O_RDWR | O_CREAT | O_TRUNC, 0644) : mkstemp(tmp_path);
    if (fd < 0 || ftruncate(fd, (off_t)size)) {
        perror(path ? path : tmp_path);
        goto out;
    }
    file_mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (file_mem == MAP_FAILED) {
        perror("mmap");
        goto out;
    }
    memset(file_mem, 0, size);
    target.mr =
        ibv_reg_mr(target.pd, file_mem, size,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_PERSISTENT);
    if (!target.mr) {
        fprintf(stderr, "ibv_reg_mr(IBV_ACCESS_FLUSH_PERSISTENT): %s\n", strerror(errno));
        goto out;
    }
    memcpy(local, message, sizeof(message));
    init.mr = ibv_reg_mr(init.pd, local, sizeof(local), IBV_ACCESS_LOCAL_WRITE);
    if (!init.mr) {
        fprintf(stderr, "ibv_reg_mr: %s\n", strerror(errno));
        goto out;
    }

    init.qp = create_qp(&init, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_FLUSH);
    target.qp = create_qp(&target, IBV_QP_EX_WITH_RDMA_WRITE);
    if (!init.qp || !target.qp) {
        fprintf(stderr, "ibv_create_qp_ex: %s\n", strerror(errno));
        goto out;
    }
    /* The target QP, too, must allow the FLUSH placement type it will serve. */
    if (connect_qp(&init, &target, gid_index, 0) ||
        connect_qp(&target, &init, gid_index,
                   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_PERSISTENT)) {
        fprintf(stderr, "ibv_modify_qp: %s\n", strerror(errno));
        goto out;
    }

    qpx = ibv_qp_to_qp_ex(init.qp);
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = 0; /* no completion of its own: the FLUSH reports for it */
    ibv_wr_rdma_write(qpx, target.mr->rkey, (uintptr_t)file_mem);
    ibv_wr_set_sge(qpx, init.mr->lkey, (uintptr_t)local, sizeof(local));
    qpx->wr_id = 2;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_flush(qpx, target.mr->rkey, (uintptr_t)file_mem, sizeof(local), IBV_FLUSH_PERSISTENT,
                 IBV_FLUSH_RANGE);
    if ((errno = ibv_wr_complete(qpx))) {
        perror("ibv_wr_complete");
        goto out;
    }

    if (wait_completion(init.cq, &wc)) goto out;
    if (wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "FLUSH failed: %s\n", ibv_wc_status_str(wc.status));
        goto out;
    }
    if (wc.wr_id != 2 || wc.opcode != IBV_WC_FLUSH) {
        fprintf(stderr, "unexpected completion: wr_id %llu opcode %d\n",
                (unsigned long long)wc.wr_id, (int)wc.opcode);
        goto out;
    }
    /* Read back through the file, as any later reader of it would. */
    if (pread(fd, check, sizeof(check), 0) != (ssize_t)sizeof(check) ||
        memcmp(check, message, sizeof(message))) {
        fprintf(stderr, "the target file does not hold the message\n");
        goto out;
    }
    printf("%zu bytes written and flushed to persistence in %s: \"%s\"\n", sizeof(message),
           path ? path : tmp_path, check);
    ret = 0;

out:
    close_end(&init);
    close_end(&target);
    if (file_mem != MAP_FAILED) munmap(file_mem, size);
    if (fd >= 0) {
        close(fd);
        if (!path) unlink(tmp_path);
    }
    if (list) ibv_free_device_list(list);
    return ret;
}
