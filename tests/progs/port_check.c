// SPDX-License-Identifier: MIT
//
// What a program sees of one port through the standard verbs API, for
// test_link_down.sh and test_gid_table.sh: one context of DEVICE stays open
// while the actions run in order, so a port that goes down or comes up, or
// an address that comes or goes, under a running program is seen as such a
// program sees it.
//
//   port_check DEVICE ACTION...
//     state          prints "state PORT_ACTIVE" (or PORT_DOWN, ...)
//     qp             creates an RC QP and takes it to RTS, connected to
//                    itself; prints "qp ok" or "qp STEP: strerror(errno)"
//     gids           prints the GID table as ibv_query_gid_table() gives it,
//                    "gid INDEX GID TYPE IFINDEX" per entry, then
//                    ibv_query_gid_ex() of the first empty index below 16:
//                    "empty INDEX ERRNO-NAME"
//     wait EVENT S   waits up to S seconds for the async event EVENT
//                    (PORT_ACTIVE, PORT_ERR, GID_CHANGE); prints "waiting
//                    EVENT" first and "event EVENT" or "no event EVENT" after
//
// Exit status 0 when every action could be carried out (a refused verb is
// a result, printed), 2 on a usage error or when the device cannot be
// opened, 1 when an awaited event did not come.
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *port_state_name(enum ibv_port_state s) {
    switch (s) {
    case IBV_PORT_DOWN:
        return "PORT_DOWN";
    case IBV_PORT_INIT:
        return "PORT_INIT";
    case IBV_PORT_ARMED:
        return "PORT_ARMED";
    case IBV_PORT_ACTIVE:
        return "PORT_ACTIVE";
    default:
        return "PORT_NOP";
    }
}

static int event_of(const char *name, enum ibv_event_type *ev) {
    if (!strcmp(name, "PORT_ACTIVE"))
        *ev = IBV_EVENT_PORT_ACTIVE;
    else if (!strcmp(name, "PORT_ERR"))
        *ev = IBV_EVENT_PORT_ERR;
    else if (!strcmp(name, "GID_CHANGE"))
        *ev = IBV_EVENT_GID_CHANGE;
    else
        return -1;
    return 0;
}

static void print_state(struct ibv_context *ctx) {
    struct ibv_port_attr a;
    int rc = ibv_query_port(ctx, 1, &a);

    if (rc)
        printf("state query: %s\n", strerror(rc));
    else
        printf("state %s\n", port_state_name(a.state));
}

static void print_gids(struct ibv_context *ctx) {
    struct ibv_gid_entry e[64];
    ssize_t n = ibv_query_gid_table(ctx, e, 64, 0);
    if (n < 0) {
        printf("gid table: %s\n", strerror((int)-n));
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char text[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, e[i].gid.raw, text, sizeof(text));
        printf("gid %u %s %s %u\n", e[i].gid_index, text,
               e[i].gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2" : "other", e[i].ndev_ifindex);
    }
    for (uint32_t i = 0; i < 16; i++) {
        struct ibv_gid_entry one;
        int rc = ibv_query_gid_ex(ctx, 1, i, &one, 0);
        if (!rc) continue;
        printf("empty %u %s\n", i, rc == ENODATA ? "ENODATA" : strerror(rc));
        break;
    }
}

// An RC QP to RTS, connected to itself: every step a port that is down can
// refuse is taken.
static void try_qp(struct ibv_context *ctx) {
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
    struct ibv_qp *qp = NULL;
    const char *step = "alloc_pd";
    int err = 0;

    if (!pd) {
        err = errno;
        goto out;
    }
    step = "create_cq";
    if (!cq) {
        err = errno;
        goto out;
    }
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC};
    init.cap.max_send_wr = init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    step = "create_qp";
    qp = ibv_create_qp(pd, &init);
    if (!qp) {
        err = errno;
        goto out;
    }
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    step = "modify_qp INIT";
    err =
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err) goto out;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 64;
    step = "query_gid";
    err = ibv_query_gid(ctx, 1, 1, &a.ah_attr.grh.dgid);
    if (err) goto out;
    step = "modify_qp RTR";
    err = ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err) goto out;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    step = "modify_qp RTS";
    err = ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
out:
    if (err)
        printf("qp %s: %s\n", step, strerror(err));
    else
        printf("qp ok\n");
    if (qp) ibv_destroy_qp(qp);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
}

static int wait_event(struct ibv_context *ctx, const char *name, int seconds) {
    enum ibv_event_type want;
    struct timespec start, now;

    if (event_of(name, &want)) return 2;
    printf("waiting %s\n", name);
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = seconds * 1000L -
                    ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000);
        struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) break;
        struct ibv_async_event ev;
        if (ibv_get_async_event(ctx, &ev)) break;
        enum ibv_event_type got = ev.event_type;
        ibv_ack_async_event(&ev);
        if (got == want) {
            printf("event %s\n", name);
            return 0;
        }
    }
    printf("no event %s\n", name);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DEVICE state|qp|gids|wait EVENT SECONDS...\n", argv[0]);
        return 2;
    }
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1])) ctx = ibv_open_device(list[i]);
    if (!ctx) {
        fprintf(stderr, "%s: cannot open %s: %s\n", argv[0], argv[1], strerror(errno));
        return 2;
    }
    int rc = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "state")) {
            print_state(ctx);
        } else if (!strcmp(argv[i], "qp")) {
            try_qp(ctx);
        } else if (!strcmp(argv[i], "gids")) {
            print_gids(ctx);
        } else if (!strcmp(argv[i], "wait") && i + 2 < argc) {
            int r = wait_event(ctx, argv[i + 1], atoi(argv[i + 2]));
            if (r == 2) {
                fprintf(stderr, "%s: unknown event %s\n", argv[0], argv[i + 1]);
                return 2;
            }
            rc |= r;
            i += 2;
        } else {
            fprintf(stderr, "%s: unknown action %s\n", argv[0], argv[i]);
            return 2;
        }
        fflush(stdout);
    }
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return rc;
}
