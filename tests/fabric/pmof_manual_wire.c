/* SPDX-License-Identifier: MIT */
/*
 * pmof_manual_wire: a peer that speaks FI_COMMIT_MANUAL's control protocol
 * itself (verbs and rdma_cm, no libfabric) to a pmof target in the same
 * process, and sends it commit requests pmof's own initiator never would:
 * counts beyond what the message holds, ranges that wrap or lie outside the
 * target's regions, keys of no region, of a closed one, with a forged
 * FI_PMEM class.  fi_pmof(7): each is answered with an ACK whose status is
 * -FI_EINVAL (not a well-formed request) or -FI_EACCES (a range outside the
 * target's regions), the target's handler never sees it, and a valid
 * commit afterwards is acknowledged with 0 and its data is in place.
 *
 *   pmof_manual_wire [-a ADDR]       (under `sroce exec`, FI_PROVIDER_PATH
 *                                     naming the build's libfabric-glue)
 *
 * TAP output; exit 0 if every check passed, 77 if pmof offers no
 * FI_COMMIT_MANUAL info.  The messages are encoded here from the format
 * pmof_wire.c describes, not with the provider's encoders, so that the two
 * are checked against each other.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <netdb.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext_pmof.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 10000
#define REGION_LEN 65536

/* The control protocol (pmof_wire.h): a 24-byte header, little-endian
 *   0 u32 magic  4 u8 type  5 u8 version  6 u16 count
 *   8 u64 cookie  16 i32 status  20 u32 reserved
 * then `count` ranges {u64 addr, u64 len, u64 key}. */
#define WIRE_MAGIC 0x4d504d43u
#define WIRE_VERSION 1
#define WIRE_REQ 1
#define WIRE_ACK 2
#define WIRE_HDR 24
#define WIRE_RANGE 24
#define WIRE_SLOT 1024
#define WIRE_RECVS 8

/* CM private data: {user length, flags, control QP number (3 bytes)}. */
#define CM_COMMIT_MANUAL 1

static int tests_run, tests_failed;

static void result(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void result(bool ok, const char *fmt, ...) {
    va_list ap;

    tests_run++;
    if (!ok) tests_failed++;
    printf("%s %d - ", ok ? "ok" : "not ok", tests_run);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void diag(const char *fmt, ...) {
    va_list ap;

    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static uint64_t now_ms(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void put16(uint8_t *p, uint16_t v) {
    v = htole16(v);
    memcpy(p, &v, sizeof(v));
}

static void put32(uint8_t *p, uint32_t v) {
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

static void put64(uint8_t *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}

static uint32_t get32(const uint8_t *p) {
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

struct range {
    uint64_t addr, len, key;
};

/* A REQ whose header says `count` and that carries `n` ranges. */
static size_t encode_req(uint8_t *out, uint64_t cookie, uint16_t count, const struct range *r,
                         size_t n) {
    size_t off = WIRE_HDR;

    put32(out, WIRE_MAGIC);
    out[4] = WIRE_REQ;
    out[5] = WIRE_VERSION;
    put16(out + 6, count);
    put64(out + 8, cookie);
    put32(out + 16, 0);
    put32(out + 20, 0);
    for (size_t i = 0; i < n; i++, off += WIRE_RANGE) {
        put64(out + off, r[i].addr);
        put64(out + off + 8, r[i].len);
        put64(out + off + 16, r[i].key);
    }
    return off;
}

/* ------------------------------------------------------------ the target */

#define SEEN_MAX 4

/* A handler that trusts what it is given, and a record of it. */
struct seen {
    atomic_int calls;
    size_t count;
    uint64_t flags;
    struct fi_rma_iov iov[SEEN_MAX];
};

static ssize_t record_handler(struct fid_eq *eq, uint64_t type, void *data, uint64_t len,
                              void *context) {
    struct seen *s = context;
    const struct fi_eq_commit_entry *ce = data;

    (void)eq;
    if (type == FI_COMMIT_EVENT && len == sizeof(*ce)) {
        s->count = ce->count;
        s->flags = ce->flags;
        memcpy(s->iov, ce->iov, (ce->count < SEEN_MAX ? ce->count : SEEN_MAX) * sizeof(*ce->iov));
    }
    atomic_fetch_add(&s->calls, 1);
    return 0;
}

struct target {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_eq *eq;
    struct fid_pep *pep;
    struct fid_ep *ep;
    struct fid_cq *cq;
    uint8_t *region, *closed;
    struct fid_mr *mr;
    uint64_t key, closed_key;
    uint16_t port;
    struct seen seen;
};

/* Reads the EQ until `event`; false (with a diagnostic) on anything else. */
static bool eq_wait(struct target *t, uint32_t event, struct fi_info **info) {
    uint8_t buf[sizeof(struct fi_eq_cm_entry) + 64];
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
    uint32_t ev;
    ssize_t n = fi_eq_sread(t->eq, &ev, buf, sizeof(buf), TIMEOUT_MS, 0);

    if (n == -FI_EAVAIL) {
        struct fi_eq_err_entry err = {0};
        fi_eq_readerr(t->eq, &err, 0);
        diag("EQ error %d (%s) waiting for event %u", err.err, fi_strerror(err.err), event);
        return false;
    }
    if (n < 0 || ev != event) {
        diag("fi_eq_sread = %zd (%s), event %u, waiting for %u", n, fi_strerror((int)-n),
             n < 0 ? 0 : ev, event);
        return false;
    }
    if (info) *info = e->info;
    return true;
}

static int target_open(struct target *t, const char *addr) {
    struct fi_info *hints = fi_allocinfo(), *list = NULL;
    struct fi_eq_attr ea = {.size = 64, .wait_obj = FI_WAIT_UNSPEC};
    struct sockaddr_storage ss;
    size_t alen = sizeof(ss);
    int ret;

    if (!hints) return -FI_ENOMEM;
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA | FI_COMMIT_MANUAL;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup("pmof");
    ret = fi_getinfo(FI_VERSION(1, 17), addr, NULL, FI_SOURCE, hints, &list);
    fi_freeinfo(hints);
    if (ret) return ret;
    /* The infos with FI_COMMIT_MANUAL come after those without. */
    for (struct fi_info *i = list; i && !t->info; i = i->next)
        if (i->mode & FI_COMMIT_MANUAL) t->info = fi_dupinfo(i);
    fi_freeinfo(list);
    if (!t->info) return -FI_ENODATA;
    ret = fi_fabric(t->info->fabric_attr, &t->fabric, NULL);
    if (!ret) ret = fi_eq_open(t->fabric, &ea, &t->eq, NULL);
    if (!ret) ret = fi_domain(t->fabric, t->info, &t->domain, NULL);
    if (!ret) ret = fi_passive_ep(t->fabric, t->info, &t->pep, NULL);
    if (!ret) ret = fi_pep_bind(t->pep, &t->eq->fid, 0);
    if (!ret) ret = fi_listen(t->pep);
    if (!ret) ret = fi_getname(&t->pep->fid, &ss, &alen);
    if (ret) return ret;
    t->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    /* A region peers may write, and one registered and closed again. */
    if (posix_memalign((void **)&t->region, 4096, REGION_LEN) ||
        posix_memalign((void **)&t->closed, 4096, 4096))
        return -FI_ENOMEM;
    memset(t->region, 0, REGION_LEN);
    ret = fi_mr_reg(t->domain, t->region, REGION_LEN,
                    FI_REMOTE_WRITE | FI_REMOTE_READ | FI_READ | FI_WRITE, 0, 0, 0, &t->mr, NULL);
    if (ret) return ret;
    t->key = fi_mr_key(t->mr);
    struct fid_mr *gone;
    ret = fi_mr_reg(t->domain, t->closed, 4096, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 0, 0, &gone,
                    NULL);
    if (ret) return ret;
    t->closed_key = fi_mr_key(gone);
    ret = fi_close(&gone->fid);
    if (ret) return ret;
    return (int)fi_eq_register_handler(t->eq, FI_COMMIT_EVENT, record_handler, &t->seen);
}

static int target_accept(struct target *t) {
    struct fi_cq_attr ca = {.size = 64, .format = FI_CQ_FORMAT_DATA};
    struct fi_info *req = NULL;
    int ret;

    if (!eq_wait(t, FI_CONNREQ, &req)) return -FI_EOTHER;
    ret = fi_endpoint(t->domain, req, &t->ep, NULL);
    fi_freeinfo(req);
    if (!ret) ret = fi_cq_open(t->domain, &ca, &t->cq, NULL);
    if (!ret) ret = fi_ep_bind(t->ep, &t->cq->fid, FI_TRANSMIT | FI_RECV);
    if (!ret) ret = fi_ep_bind(t->ep, &t->eq->fid, 0);
    if (!ret) ret = fi_enable(t->ep);
    if (!ret) ret = fi_accept(t->ep, NULL, 0);
    return ret;
}

static void target_close(struct target *t) {
    if (t->ep) fi_close(&t->ep->fid);
    if (t->cq) fi_close(&t->cq->fid);
    if (t->mr) fi_close(&t->mr->fid);
    if (t->pep) fi_close(&t->pep->fid);
    if (t->domain) fi_close(&t->domain->fid);
    if (t->eq) fi_close(&t->eq->fid);
    if (t->fabric) fi_close(&t->fabric->fid);
    fi_freeinfo(t->info);
    free(t->region);
    free(t->closed);
}

/* -------------------------------------------------------------- the peer */

struct peer {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *scq, *rcq; /* sends; the ACKs received */
    struct ibv_qp *qp, *ctl;
    struct ibv_mr *mr;
    uint8_t *buf; /* WIRE_RECVS receive slots, a send slot, the data */
    uint64_t wr_next;
};

#define PEER_SEND_OFF (WIRE_RECVS * WIRE_SLOT)
#define PEER_DATA_OFF (PEER_SEND_OFF + WIRE_SLOT)
#define PEER_BUF_LEN (PEER_DATA_OFF + 4096)
#define WR_RECV (1ULL << 32)

static bool cm_wait(struct peer *p, enum rdma_cm_event_type want, uint8_t *priv, size_t *priv_len) {
    struct rdma_cm_event *ev;

    if (rdma_get_cm_event(p->ch, &ev)) {
        diag("rdma_get_cm_event: %m");
        return false;
    }
    bool ok = ev->event == want;
    if (!ok)
        diag("rdma_cm event %s (status %d), waiting for %s", rdma_event_str(ev->event), ev->status,
             rdma_event_str(want));
    if (ok && priv) {
        *priv_len = ev->param.conn.private_data_len < 56 ? ev->param.conn.private_data_len : 56;
        memcpy(priv, ev->param.conn.private_data, *priv_len);
    }
    rdma_ack_cm_event(ev);
    return ok;
}

static int post_recv(struct peer *p, uint32_t slot) {
    struct ibv_sge sge = {(uintptr_t)(p->buf + slot * WIRE_SLOT), WIRE_SLOT, p->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WR_RECV | slot, .sg_list = &sge, .num_sge = 1}, *bad;

    return ibv_post_recv(p->ctl, &wr, &bad);
}

/* INIT, and for `dest` (0: the connection's own QP) RTR and RTS. */
static int qp_init(struct peer *p, struct ibv_qp *qp) {
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT};
    int mask;

    if (rdma_init_qp_attr(p->id, &qa, &mask)) return errno;
    qa.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    return ibv_modify_qp(qp, &qa, mask);
}

static int qp_ready(struct peer *p, struct ibv_qp *qp, uint32_t dest) {
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_RTR};
    int mask, ret;

    if (rdma_init_qp_attr(p->id, &qa, &mask)) return errno;
    if (dest) {
        /* The control QPs start at PSN 0 both ways. */
        qa.dest_qp_num = dest;
        qa.rq_psn = 0;
    }
    if (!qa.max_dest_rd_atomic) qa.max_dest_rd_atomic = 1;
    ret = ibv_modify_qp(qp, &qa, mask);
    if (ret) return ret;
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RTS;
    if (rdma_init_qp_attr(p->id, &qa, &mask)) return errno;
    if (dest) qa.sq_psn = 0;
    qa.rnr_retry = 7;
    return ibv_modify_qp(qp, &qa, mask | IBV_QP_RNR_RETRY);
}

static int peer_connect(struct peer *p, struct target *t, const char *addr) {
    struct ibv_qp_init_attr qia = {
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct addrinfo *src = NULL, *dst = NULL;
    char port[8];
    uint8_t priv[56];
    size_t priv_len = 0;
    int ret;

    snprintf(port, sizeof(port), "%u", t->port);
    if (getaddrinfo(addr, NULL, NULL, &src) || getaddrinfo(addr, port, NULL, &dst)) {
        ret = -FI_EINVAL;
        goto out;
    }
    p->ch = rdma_create_event_channel();
    if (!p->ch || rdma_create_id(p->ch, &p->id, NULL, RDMA_PS_TCP) ||
        rdma_resolve_addr(p->id, src->ai_addr, dst->ai_addr, TIMEOUT_MS) ||
        !cm_wait(p, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, NULL) ||
        rdma_resolve_route(p->id, TIMEOUT_MS) ||
        !cm_wait(p, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, NULL)) {
        ret = -FI_ECONNREFUSED;
        goto out;
    }
    p->pd = ibv_alloc_pd(p->id->verbs);
    p->scq = p->pd ? ibv_create_cq(p->id->verbs, 64, NULL, NULL, 0) : NULL;
    p->rcq = p->scq ? ibv_create_cq(p->id->verbs, 64, NULL, NULL, 0) : NULL;
    qia.send_cq = p->scq;
    qia.recv_cq = p->rcq;
    p->qp = p->rcq ? ibv_create_qp(p->pd, &qia) : NULL;
    p->ctl = p->qp ? ibv_create_qp(p->pd, &qia) : NULL;
    p->buf = aligned_alloc(4096, PEER_BUF_LEN);
    p->mr =
        p->buf && p->pd ? ibv_reg_mr(p->pd, p->buf, PEER_BUF_LEN, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!p->ctl || !p->mr) {
        ret = -FI_ENOMEM;
        goto out;
    }
    ret = qp_init(p, p->qp);
    if (!ret) ret = qp_init(p, p->ctl);
    for (uint32_t i = 0; !ret && i < WIRE_RECVS; i++)
        ret = post_recv(p, i);
    if (ret) goto out;
    uint8_t hdr[5] = {0, CM_COMMIT_MANUAL, (uint8_t)(p->ctl->qp_num >> 16),
                      (uint8_t)(p->ctl->qp_num >> 8), (uint8_t)p->ctl->qp_num};
    struct rdma_conn_param cp = {.private_data = hdr,
                                 .private_data_len = sizeof(hdr),
                                 .responder_resources = 1,
                                 .initiator_depth = 1,
                                 .flow_control = 1,
                                 .retry_count = 7,
                                 .rnr_retry_count = 7,
                                 .qp_num = p->qp->qp_num};
    if (rdma_connect(p->id, &cp)) {
        ret = -FI_ECONNREFUSED;
        goto out;
    }
    ret = target_accept(t);
    if (ret) goto out;
    /* The target names its control QP in its reply. */
    if (!cm_wait(p, RDMA_CM_EVENT_CONNECT_RESPONSE, priv, &priv_len) || priv_len < 5 ||
        !(priv[1] & CM_COMMIT_MANUAL)) {
        diag("the target's reply (%zu bytes) names no control QP", priv_len);
        ret = -FI_EOTHER;
        goto out;
    }
    uint32_t tctl = (uint32_t)priv[2] << 16 | (uint32_t)priv[3] << 8 | priv[4];
    ret = qp_ready(p, p->qp, 0);
    if (!ret) ret = qp_ready(p, p->ctl, tctl);
    if (!ret && rdma_establish(p->id)) ret = errno;
    if (!ret && !eq_wait(t, FI_CONNECTED, NULL)) ret = -FI_ENOTCONN;
out:
    if (src) freeaddrinfo(src);
    if (dst) freeaddrinfo(dst);
    return ret;
}

static void peer_close(struct peer *p) {
    if (p->id) rdma_disconnect(p->id);
    if (p->ctl) ibv_destroy_qp(p->ctl);
    if (p->qp) ibv_destroy_qp(p->qp);
    if (p->mr) ibv_dereg_mr(p->mr);
    if (p->scq) ibv_destroy_cq(p->scq);
    if (p->rcq) ibv_destroy_cq(p->rcq);
    if (p->pd) ibv_dealloc_pd(p->pd);
    if (p->id) rdma_destroy_id(p->id);
    if (p->ch) rdma_destroy_event_channel(p->ch);
    free(p->buf);
}

/* Waits for the completion of send `id`, or with WR_RECV of the next
 * receive, whose slot *slot gets and whose length *len; a failed one is
 * reported. */
static bool wait_wc(struct peer *p, uint64_t id, uint32_t *slot, uint32_t *len) {
    struct ibv_cq *cq = id == WR_RECV ? p->rcq : p->scq;
    uint64_t start = now_ms();
    struct ibv_wc wc;

    while (now_ms() - start < TIMEOUT_MS) {
        int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0) break;
        if (!n) {
            usleep(100);
            continue;
        }
        if (wc.status != IBV_WC_SUCCESS) {
            diag("work request %#llx failed: %s", (unsigned long long)wc.wr_id,
                 ibv_wc_status_str(wc.status));
            return false;
        }
        if (id == WR_RECV && (wc.wr_id & WR_RECV)) {
            *slot = (uint32_t)wc.wr_id;
            *len = wc.byte_len;
            return true;
        }
        if (wc.wr_id == id) return true;
        diag("unexpected completion %#llx", (unsigned long long)wc.wr_id);
        return false;
    }
    diag("no completion of %#llx within %d ms", (unsigned long long)id, TIMEOUT_MS);
    return false;
}

/* Sends `len` bytes on the control QP. */
static bool send_ctl(struct peer *p, const uint8_t *msg, size_t len) {
    struct ibv_sge sge = {(uintptr_t)(p->buf + PEER_SEND_OFF), (uint32_t)len, p->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ++p->wr_next,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;

    memcpy(p->buf + PEER_SEND_OFF, msg, len);
    return !ibv_post_send(p->ctl, &wr, &bad) && wait_wc(p, wr.wr_id, NULL, NULL);
}

/* The next ACK: true with its cookie and status if it is one. */
static bool recv_ack(struct peer *p, uint64_t *cookie, int32_t *status) {
    uint32_t slot, len;

    if (!wait_wc(p, WR_RECV, &slot, &len)) return false;
    const uint8_t *m = p->buf + slot * WIRE_SLOT;
    bool ok = len == WIRE_HDR && get32(m) == WIRE_MAGIC && m[4] == WIRE_ACK &&
              m[5] == WIRE_VERSION && !m[6] && !m[7] && !get32(m + 20);
    if (!ok) diag("a control message of %u bytes that is no ACK", len);
    *cookie = get64(m + 8);
    *status = (int32_t)get32(m + 16);
    return !post_recv(p, slot) && ok;
}

/* Sends a request and returns the status of its ACK (1: no ACK, or one
 * for another request). */
static int32_t request(struct peer *p, const uint8_t *msg, size_t len, uint64_t cookie) {
    uint64_t got;
    int32_t status;

    if (!send_ctl(p, msg, len) || !recv_ack(p, &got, &status)) return 1;
    if (got != cookie) {
        diag("ACK for cookie %#llx, expected %#llx", (unsigned long long)got,
             (unsigned long long)cookie);
        return 1;
    }
    return status;
}

/* An RDMA WRITE of `len` pattern bytes to the target, completed. */
static bool write_data(struct peer *p, uint64_t addr, uint64_t key, size_t len, uint8_t seed) {
    uint8_t *d = p->buf + PEER_DATA_OFF;
    struct ibv_sge sge = {(uintptr_t)d, (uint32_t)len, p->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ++p->wr_next,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr.rdma = {.remote_addr = addr, .rkey = (uint32_t)key}},
                       *bad;

    for (size_t i = 0; i < len; i++)
        d[i] = (uint8_t)(seed + i * 7);
    return !ibv_post_send(p->qp, &wr, &bad) && wait_wc(p, wr.wr_id, NULL, NULL);
}

/* ------------------------------------------------------------ the checks */

struct crafted {
    const char *what;
    uint16_t count; /* the header's */
    size_t n;       /* ranges sent */
    struct range r[3];
    int32_t status;
};

static void run(struct peer *p, struct target *t) {
    const uint64_t a = (uintptr_t)t->region, k = t->key, c = (uintptr_t)t->closed;
    /* fi_pmof(7): FI_PMEM is a class bit above the 32-bit rkey. */
    const uint64_t pmem = 1ULL << 32;
    struct range many[33];
    uint8_t msg[WIRE_SLOT];
    uint64_t cookie = 0x100;
    size_t len;

    for (int i = 0; i < 33; i++)
        many[i] = (struct range){a + 64 * (uint64_t)i, 64, k};
    const struct crafted bad[] = {
        {"a REQ of no ranges", 0, 0, {{0}}, -FI_EINVAL},
        {"a count of 3 with 2 ranges' bytes", 3, 2, {{a, 64, k}, {a + 64, 64, k}}, -FI_EINVAL},
        {"a count of 1 with 2 ranges' bytes", 1, 2, {{a, 64, k}, {a + 64, 64, k}}, -FI_EINVAL},
        {"a count of 65535 with 1 range's bytes", 65535, 1, {{a, 64, k}}, -FI_EINVAL},
        {"a range whose address + length wraps", 1, 1, {{a, UINT64_MAX - 16, k}}, -FI_EINVAL},
        {"a range past the region's end", 1, 1, {{a + REGION_LEN - 8, 16, k}}, -FI_EACCES},
        {"a range before the region", 1, 1, {{a - 4096, 64, k}}, -FI_EACCES},
        {"a key of no region", 1, 1, {{a, 64, k + 777}}, -FI_EACCES},
        {"a closed region's key", 1, 1, {{c, 64, t->closed_key}}, -FI_EACCES},
        {"a volatile region's key with FI_PMEM", 1, 1, {{a, 64, k | pmem}}, -FI_EACCES},
        {"a good range and a bad one", 2, 2, {{a, 64, k}, {a + 64, REGION_LEN, k}}, -FI_EACCES},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int before = atomic_load(&t->seen.calls);
        len = encode_req(msg, ++cookie, bad[i].count, bad[i].r, bad[i].n);
        int32_t st = request(p, msg, len, cookie);
        result(st == bad[i].status && atomic_load(&t->seen.calls) == before,
               "%s: ACK status %d (expected %d), handler called %d times", bad[i].what, st,
               bad[i].status, atomic_load(&t->seen.calls) - before);
    }
    /* 33 ranges, one more than a request may name (816 bytes: the
     * message still fits the target's receive slot). */
    int before = atomic_load(&t->seen.calls);
    len = encode_req(msg, ++cookie, 33, many, 33);
    int32_t st = request(p, msg, len, cookie);
    result(st == -FI_EINVAL && atomic_load(&t->seen.calls) == before,
           "33 ranges: ACK status %d (expected %d), handler called %d times", st, -FI_EINVAL,
           atomic_load(&t->seen.calls) - before);

    /* A message too short for a header is not answered (it has no cookie):
     * the next ACK is the next request's. */
    len = encode_req(msg, ++cookie, 1, many, 1);
    bool sent = send_ctl(p, msg, WIRE_HDR - 4);

    /* A valid commit: the data written first, then the request. */
    struct range ok = {a + 4096, 1000, k};
    before = atomic_load(&t->seen.calls);
    bool wrote = sent && write_data(p, ok.addr, ok.key, ok.len, 0x3c);
    len = encode_req(msg, ++cookie, 1, &ok, 1);
    st = wrote ? request(p, msg, len, cookie) : 1;
    bool exact = atomic_load(&t->seen.calls) == before + 1 && t->seen.count == 1 &&
                 t->seen.iov[0].addr == ok.addr && t->seen.iov[0].len == ok.len &&
                 t->seen.iov[0].key == ok.key && t->seen.flags == FI_COMMIT;
    result(st == 0 && exact,
           "a valid commit after the refused ones: ACK status %d, handler called %d times with "
           "%zu ranges, flags %#llx",
           st, atomic_load(&t->seen.calls) - before, t->seen.count,
           (unsigned long long)t->seen.flags);
    size_t diff = 0;
    while (diff < ok.len && t->region[4096 + diff] == (uint8_t)(0x3c + diff * 7))
        diff++;
    result(diff == ok.len && !t->region[4095] && !t->region[4096 + ok.len],
           "the committed data is in place byte for byte (%zu of %llu bytes match, neighbours "
           "untouched)",
           diff, (unsigned long long)ok.len);
}

int main(int argc, char **argv) {
    const char *addr = "127.0.0.1";
    struct target t = {0};
    struct peer p = {0};
    int opt, ret;

    while ((opt = getopt(argc, argv, "a:")) != -1) {
        if (opt != 'a') {
            fprintf(stderr, "usage: %s [-a ADDR]\n", argv[0]);
            return 2;
        }
        addr = optarg;
    }
    ret = target_open(&t, addr);
    if (ret == -FI_ENODATA) {
        printf("1..0 # skip pmof offers no FI_COMMIT_MANUAL info on %s\n", addr);
        target_close(&t);
        return 77;
    }
    if (ret) {
        printf("Bail out! the pmof target: %d (%s)\n", ret, fi_strerror(-ret));
        target_close(&t);
        return 1;
    }
    ret = peer_connect(&p, &t, addr);
    if (ret) {
        printf("Bail out! connecting the crafted peer to pmof: %d\n", ret);
    } else {
        run(&p, &t);
        printf("1..%d\n", tests_run);
    }
    peer_close(&p);
    target_close(&t);
    return ret || tests_failed ? 1 : 0;
}
