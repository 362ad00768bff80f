/* SPDX-License-Identifier: MIT */
/*
 * Reliable datagram endpoints over connections made on demand.
 *
 * An RDM endpoint's name (its address in peers' AVs) is a listener's
 * IP:port.  The first operation toward a peer opens a hidden connected
 * endpoint to that peer's listener and returns -FI_EAGAIN until it is up;
 * a CM thread accepts peers' connections and follows their state.  All of
 * an endpoint's operations to one peer go over one connection, so the
 * persistence scope of FI_COMMIT - endpoint, peer, key - is the QP's, as
 * Intel's libfabric persistent-memory proposal (version 0.63) has it.
 * Simultaneous connections need no tie-break: each side sends on the first
 * of them that came up, and receives on any.
 *
 * Receives go to a shared receive queue that every connection's QP uses,
 * so a receive posted before any peer connects matches whichever sends
 * first.  libfabric's ofi_rxm, which could layer RDM over pmof's MSG
 * endpoints, drops FI_COMMIT; this does not.
 *
 * With FI_TAGGED the queue holds the provider's buffers instead, and every
 * message is matched in software (pmof_tagged.c); both ends of a
 * connection must agree on that, which the hello says.
 */
#include "pmof.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ receives */

static struct pmof_op *srx_get(struct pmof_rdm *rdm) {
    uint32_t i;

    if (!rdm->rx_free_count) return NULL;
    i = rdm->rx_free[--rdm->rx_free_count];
    return &rdm->rx_ops[i];
}

static void srx_put(struct pmof_rdm *rdm, struct pmof_op *op) {
    pmof_lock(&rdm->rx_lock);
    rdm->rx_free[rdm->rx_free_count++] = (uint32_t)(op - rdm->rx_ops);
    pmof_unlock(&rdm->rx_lock);
}

/* Connections are only ever added at the head (with release) and freed at
 * close, so completions walk the list without the lock. */
struct pmof_conn *pmof_rdm_conn_by_qpn(struct pmof_rdm *rdm, uint32_t qpn) {
    struct pmof_conn *c = __atomic_load_n(&rdm->conns, __ATOMIC_ACQUIRE);

    while (c && c->qpn != qpn)
        c = c->next;
    return c;
}

fi_addr_t pmof_rdm_src_addr(struct pmof_rdm *rdm, struct pmof_conn *c) {
    fi_addr_t a = c ? __atomic_load_n(&c->addr, __ATOMIC_RELAXED) : FI_ADDR_NOTAVAIL;

    if (!c || !rdm->av) return a;
    /* Removed since it was found (and maybe inserted again, at another
     * index): the peer's fi_addr is whatever the AV says now. */
    unsigned gen = atomic_load_explicit(&rdm->av->removals, memory_order_relaxed);
    if (__atomic_load_n(&c->addr_gen, __ATOMIC_RELAXED) != gen) {
        __atomic_store_n(&c->addr_gen, gen, __ATOMIC_RELAXED);
        a = FI_ADDR_NOTAVAIL;
    }
    if (a == FI_ADDR_NOTAVAIL) {
        /* Also a peer the application inserted after it connected. */
        a = pmof_av_find(rdm->av, (struct sockaddr *)&c->peer);
        __atomic_store_n(&c->addr, a, __ATOMIC_RELAXED);
    }
    return a;
}

bool pmof_rdm_complete(struct pmof_rdm *rdm, const struct ibv_wc *wc, struct pmof_cq_entry *out,
                       struct pmof_cntr **cntr) {
    struct pmof_op *op = (struct pmof_op *)(uintptr_t)wc->wr_id;
    struct pmof_conn *c;
    bool report = op->report;

    if (op->bounce) return pmof_tagged_recv_complete(rdm, op, wc, out, cntr);
    c = pmof_rdm_conn_by_qpn(rdm, wc->qp_num);
    memset(out, 0, sizeof(*out));
    out->op_context = op->context;
    out->flags = FI_MSG | FI_RECV;
    out->buf = op->buf;
    out->src_addr = pmof_rdm_src_addr(rdm, c);
    *cntr = rdm->cntrs[PMOF_CNTR_RECV];
    if (wc->status != IBV_WC_SUCCESS) {
        out->err = pmof_wc_errno(wc->status);
        out->prov_errno = wc->status;
        out->len = op->len;
        report = true;
    } else {
        pmof_recv_entry(wc, out, rdm->cntrs, cntr);
        if (wc->opcode == IBV_WC_RECV) pmof_hmem_complete(&op->hmem, wc->byte_len);
    }
    srx_put(rdm, op);
    return report && !rdm->closing;
}

static ssize_t rdm_post_recv(struct pmof_rdm *rdm, const struct iovec *iov, void **desc,
                             size_t count, fi_addr_t src, void *context, uint64_t flags) {
    struct ibv_sge sge[PMOF_IOV_LIMIT];
    struct ibv_recv_wr wr = {0}, *bad;
    struct pmof_op *op;
    size_t total;
    int n, ret;

    if (rdm->tg) {
        if (!rdm->enabled) return -FI_EOPBADSTATE;
        return pmof_tagged_recv(rdm, iov, desc, count, src, 0, 0, context, flags, false);
    }
    (void)src;
    struct iovec staged[PMOF_IOV_LIMIT];
    struct pmof_hmem_io hio;
    int sret = pmof_hmem_prepare(rdm->dom, &iov, desc, count, staged, false, &hio);
    if (sret) return sret;
    if (!rdm->srq) return -FI_EOPBADSTATE;
    if (count > PMOF_IOV_LIMIT || (count && !iov)) return -FI_EINVAL;
    n = pmof_fill_sge(iov, desc, count, sge, &total);
    if (n < 0) return n;
    pmof_lock(&rdm->rx_lock);
    op = srx_get(rdm);
    if (!op) {
        pmof_unlock(&rdm->rx_lock);
        return -FI_EAGAIN;
    }
    memset(op, 0, sizeof(*op));
    op->rdm = rdm;
    op->context = context;
    op->len = total;
    op->buf = count ? iov[0].iov_base : NULL;
    op->report = !rdm->rx_selective || (flags & FI_COMPLETION);
    op->hmem = hio;
    wr.wr_id = (uintptr_t)op;
    wr.sg_list = sge;
    wr.num_sge = (int)n;
    ret = ibv_post_srq_recv(rdm->srq, &wr, &bad);
    if (ret) rdm->rx_free[rdm->rx_free_count++] = (uint32_t)(op - rdm->rx_ops);
    pmof_unlock(&rdm->rx_lock);
    return ret ? pmof_errno(ret) : 0;
}

/* --------------------------------------------------------- connections */

static struct pmof_conn *conn_new(struct pmof_rdm *rdm, struct pmof_ep *ep,
                                  const struct sockaddr *peer, bool active) {
    struct pmof_conn *c = calloc(1, sizeof(*c));

    if (!c) return NULL;
    c->ep = ep;
    c->active = active;
    c->state = PMOF_CONN_CONNECTING;
    c->addr_gen = rdm->av ? atomic_load(&rdm->av->removals) : 0;
    c->addr = rdm->av ? pmof_av_find(rdm->av, peer) : FI_ADDR_NOTAVAIL;
    memcpy(&c->peer, peer, pmof_sockaddr_len(peer));
    c->qpn = ep->qp->qp_num;
    ep->rdm = rdm;
    ep->conn = c;
    c->next = rdm->conns;
    __atomic_store_n(&rdm->conns, c, __ATOMIC_RELEASE);
    return c;
}

/* A hidden MSG endpoint bound to the RDM endpoint's queues. */
static int open_conn_ep(struct pmof_rdm *rdm, struct fi_info *info, struct pmof_ep **out) {
    struct fid_ep *fid;
    struct pmof_ep *ep;
    int ret;

    ret = pmof_endpoint(&rdm->dom->domain_fid, info, &fid, rdm->ep_fid.fid.context);
    if (ret) return ret;
    ep = container_of(fid, struct pmof_ep, ep_fid);
    ep->rdm = rdm;
    ep->srq = rdm->srq;
    /* The CM thread and the application reach it at once. */
    ep->tx_lock.enabled = ep->rx_lock.enabled = true;
    ret = fi_ep_bind(fid, &rdm->cm_eq->eq_fid.fid, 0);
    if (!ret)
        ret = fi_ep_bind(fid, &rdm->tx_cq->cq_fid.fid,
                         FI_TRANSMIT | (rdm->tx_selective ? FI_SELECTIVE_COMPLETION : 0));
    if (!ret)
        ret = fi_ep_bind(fid, &rdm->rx_cq->cq_fid.fid,
                         FI_RECV | (rdm->rx_selective ? FI_SELECTIVE_COMPLETION : 0));
    for (int k = 0; !ret && k < PMOF_CNTR_KINDS; k++)
        if (rdm->cntrs[k]) ret = fi_ep_bind(fid, &rdm->cntrs[k]->cntr_fid.fid, pmof_cntr_flags[k]);
    if (!ret) ret = fi_enable(fid);
    if (ret) {
        if (ep->connreq) {
            /* The request stays the caller's, to reject. */
            ep->connreq->id->context = &ep->connreq->handle;
            ep->connreq = NULL;
            ep->id = NULL;
        }
        fi_close(&fid->fid);
        return ret;
    }
    *out = ep;
    return 0;
}

static uint32_t hello_flags(const struct pmof_rdm *rdm) {
    return rdm->tg ? PMOF_RDM_HELLO_HEADERS : 0;
}

/* The receive buffers are sized for it: a peer must not send more. */
static uint32_t hello_eager(const struct pmof_rdm *rdm) {
    return rdm->tg ? (uint32_t)pmof_params.eager_size : 0;
}

static int rdm_connect(struct pmof_rdm *rdm, const struct sockaddr_storage *peer) {
    struct fi_info *info = fi_dupinfo(rdm->msg_info);
    struct pmof_rdm_hello data = {.magic = PMOF_RDM_HELLO_MAGIC,
                                  .pid = (uint32_t)getpid(),
                                  .flags = hello_flags(rdm),
                                  .eager = hello_eager(rdm)};
    struct pmof_ep *ep;
    size_t len = pmof_sockaddr_len((const struct sockaddr *)peer);
    int ret;

    if (!info) return -FI_ENOMEM;
    free(info->dest_addr);
    info->dest_addr = malloc(len);
    if (!info->dest_addr) {
        fi_freeinfo(info);
        return -FI_ENOMEM;
    }
    memcpy(info->dest_addr, peer, len);
    info->dest_addrlen = len;
    /* The listener owns our address's port: connect from another. */
    if (info->src_addr) pmof_sockaddr_clear_port(info->src_addr);
    ret = open_conn_ep(rdm, info, &ep);
    fi_freeinfo(info);
    if (ret) return ret;
    if (!conn_new(rdm, ep, (const struct sockaddr *)peer, true)) {
        fi_close(&ep->ep_fid.fid);
        return -FI_ENOMEM;
    }
    memcpy(&data.name, &rdm->name, pmof_sockaddr_len((struct sockaddr *)&rdm->name));
    ret = fi_connect(&ep->ep_fid, NULL, &data, sizeof(data));
    if (ret) ep->conn->state = PMOF_CONN_DOWN;
    return ret;
}

/* A connection whose QP failed (a dead peer) is down: the next operation
 * to that peer connects again (rdm->lock held).  One refused for its
 * message protocol stays refused. */
static bool conn_usable(struct pmof_conn *c) {
    if (c->state == PMOF_CONN_UP && c->ep->state != PMOF_EP_CONNECTED) c->state = PMOF_CONN_DOWN;
    return c->state == PMOF_CONN_UP;
}

/* Remembers the connection sends to `addr` use (rdm->lock held). */
static void send_conn_set(struct pmof_rdm *rdm, fi_addr_t addr, struct pmof_conn *c) {
    if (addr >= rdm->send_cap) {
        size_t n = rdm->send_cap ? rdm->send_cap : 64;
        struct pmof_conn **t;

        while (n <= addr)
            n *= 2;
        t = realloc(rdm->send_conn, n * sizeof(*t));
        if (!t) return; /* found by the scan next time */
        memset(t + rdm->send_cap, 0, (n - rdm->send_cap) * sizeof(*t));
        rdm->send_conn = t;
        rdm->send_cap = n;
    }
    rdm->send_conn[addr] = c;
}

/* The connection operations toward `addr` use: NULL with -FI_EAGAIN while
 * it is being made (the first call starts it). */
struct pmof_ep *pmof_rdm_conn(struct pmof_rdm *rdm, fi_addr_t addr, ssize_t *err) {
    struct sockaddr_storage peer;
    struct pmof_conn *c, *pending = NULL;
    struct pmof_ep *ep = NULL;

    pmof_lock(&rdm->lock);
    /* An address removed from the AV sends nowhere, even to a connection
     * still up: the cache of connections by fi_addr starts again. */
    unsigned gen = rdm->av ? atomic_load_explicit(&rdm->av->removals, memory_order_relaxed) : 0;
    if (gen != rdm->send_gen) {
        if (rdm->send_conn) memset(rdm->send_conn, 0, rdm->send_cap * sizeof(*rdm->send_conn));
        rdm->send_gen = gen;
    }
    if (addr < rdm->send_cap && rdm->send_conn[addr] && conn_usable(rdm->send_conn[addr])) {
        ep = rdm->send_conn[addr]->ep;
        goto out;
    }
    if (!rdm->av || !pmof_av_get(rdm->av, addr, &peer)) {
        *err = -FI_EINVAL;
        goto out;
    }
    for (c = rdm->conns; c && !ep; c = c->next) {
        if (!pmof_addr_equal((struct sockaddr *)&c->peer, (struct sockaddr *)&peer)) continue;
        if (c->state == PMOF_CONN_REFUSED) {
            *err = -FI_ECONNREFUSED;
            goto out;
        }
        if (conn_usable(c)) {
            ep = c->ep;
            __atomic_store_n(&c->addr_gen, gen, __ATOMIC_RELAXED);
            __atomic_store_n(&c->addr, addr, __ATOMIC_RELAXED);
            send_conn_set(rdm, addr, c);
        } else if (c->state == PMOF_CONN_CONNECTING) {
            pending = c;
        }
    }
    if (!ep && !pending) {
        *err = rdm_connect(rdm, &peer);
        if (*err == 0) *err = -FI_EAGAIN;
    } else if (!ep) {
        *err = -FI_EAGAIN;
    }
out:
    pmof_unlock(&rdm->lock);
    return ep;
}

static void on_connreq(struct pmof_rdm *rdm, struct fi_eq_cm_entry *entry, size_t len) {
    struct sockaddr_storage name;
    struct pmof_ep *ep;
    uint32_t flags, eager;
    int ret;

    /* The connector's name, which its AV entry for us will match. */
    if (len < sizeof(*entry) ||
        !pmof_rdm_hello_parse(entry->data, len - sizeof(*entry), &name, &flags, &eager)) {
        fi_reject(&rdm->pep->pep_fid, entry->info->handle, NULL, 0);
        fi_freeinfo(entry->info);
        return;
    }
    if (flags != hello_flags(rdm) || eager != hello_eager(rdm)) {
        if (flags != hello_flags(rdm))
            PMOF_WARN(FI_LOG_EP_CTRL,
                      "refused a peer whose endpoint %s FI_TAGGED: both ends of a connection "
                      "must agree on it\n",
                      (flags & PMOF_RDM_HELLO_HEADERS) ? "has" : "lacks");
        else
            PMOF_WARN(FI_LOG_EP_CTRL,
                      "refused a peer whose FI_PMOF_EAGER_SIZE is %u, not %u: both ends of a "
                      "connection must agree on it\n",
                      eager, hello_eager(rdm));
        fi_reject(&rdm->pep->pep_fid, entry->info->handle, PMOF_RDM_REJECT_PROTOCOL,
                  sizeof(PMOF_RDM_REJECT_PROTOCOL));
        fi_freeinfo(entry->info);
        return;
    }
    pmof_lock(&rdm->lock);
    ret = open_conn_ep(rdm, entry->info, &ep);
    if (ret) {
        pmof_unlock(&rdm->lock);
        PMOF_WARN(FI_LOG_EP_CTRL, "cannot accept a connection: %s\n", fi_strerror(-ret));
        fi_reject(&rdm->pep->pep_fid, entry->info->handle, NULL, 0);
        fi_freeinfo(entry->info);
        return;
    }
    fi_freeinfo(entry->info);
    if (!conn_new(rdm, ep, (struct sockaddr *)&name, false))
        fi_close(&ep->ep_fid.fid); /* rejects by destroying the request's id */
    else if (fi_accept(&ep->ep_fid, NULL, 0))
        ep->conn->state = PMOF_CONN_DOWN;
    pmof_unlock(&rdm->lock);
}

static void set_conn_state(struct pmof_rdm *rdm, fid_t fid, enum pmof_conn_state state) {
    struct pmof_ep *ep;

    if (!fid || fid->fclass != FI_CLASS_EP) return;
    ep = container_of(fid, struct pmof_ep, ep_fid.fid);
    pmof_lock(&rdm->lock);
    if (ep->conn) {
        ep->conn->state = state;
        if (state != PMOF_CONN_UP && ep->conn->addr < rdm->send_cap &&
            rdm->send_conn[ep->conn->addr] == ep->conn)
            rdm->send_conn[ep->conn->addr] = NULL;
    }
    pmof_unlock(&rdm->lock);
    if (state != PMOF_CONN_UP) pmof_tagged_conn_down(rdm, ep);
}

/* One CM event of the hidden endpoints; false once the EQ is empty. */
static bool rdm_cm_step(struct pmof_rdm *rdm) {
    // Room for the entry's flexible data[] member behind it.
    _Alignas(struct fi_eq_cm_entry) uint8_t buf[sizeof(struct fi_eq_cm_entry) + PMOF_CM_DATA_MAX];
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;
    uint32_t event;
    ssize_t n = fi_eq_read(&rdm->cm_eq->eq_fid, &event, buf, sizeof(buf), 0);

    if (n == -FI_EAVAIL) {
        struct fi_eq_err_entry err = {0};
        if (fi_eq_readerr(&rdm->cm_eq->eq_fid, &err, 0) > 0) {
            bool protocol =
                err.err == FI_ECONNREFUSED && err.err_data &&
                err.err_data_size >= sizeof(PMOF_RDM_REJECT_PROTOCOL) &&
                !memcmp(err.err_data, PMOF_RDM_REJECT_PROTOCOL, sizeof(PMOF_RDM_REJECT_PROTOCOL));
            if (protocol)
                PMOF_WARN(FI_LOG_EP_CTRL, "the peer refused the connection: one endpoint "
                                          "has FI_TAGGED, the other not\n");
            else
                PMOF_INFO(FI_LOG_EP_CTRL, "connection failed: %s\n", fi_strerror(err.err));
            set_conn_state(rdm, err.fid, protocol ? PMOF_CONN_REFUSED : PMOF_CONN_DOWN);
        }
        return true;
    }
    if (n < 0) return false;
    switch (event) {
    case FI_CONNREQ:
        on_connreq(rdm, e, (size_t)n);
        break;
    case FI_CONNECTED:
        set_conn_state(rdm, e->fid, PMOF_CONN_UP);
        break;
    case FI_SHUTDOWN:
        set_conn_state(rdm, e->fid, PMOF_CONN_DOWN);
        break;
    default:
        break;
    }
    return true;
}

static void *rdm_cm_thread(void *arg) {
    struct pmof_rdm *rdm = arg;
    /* Also the tagged work completions leave (READs and FINs to post), so
     * that a peer's send completes while this side's application does not
     * call in. */
    struct pollfd p[3] = {
        {.fd = rdm->cm_eq->epfd, .events = POLLIN},
        {.fd = rdm->stop_fd[0], .events = POLLIN},
        {.fd = pmof_tagged_work_fd(rdm), .events = POLLIN},
    };

    for (;;) {
        while (rdm_cm_step(rdm)) {
        }
        if (poll(p, p[2].fd >= 0 ? 3 : 2, -1) < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        if (p[2].fd >= 0 && p[2].revents) {
            pmof_tagged_work_ack(rdm);
            pmof_tagged_progress(rdm);
        }
    }
    return NULL;
}

/* ----------------------------------------------------------- data path */

static struct pmof_rdm *to_rdm(struct fid_ep *ep_fid) {
    return container_of(ep_fid, struct pmof_rdm, ep_fid);
}

static struct fi_ops rdm_fi_ops;

struct pmof_ep *pmof_ep_for(struct fid_ep *ep_fid, fi_addr_t addr, ssize_t *err) {
    *err = 0;
    if (ep_fid->fid.ops == &rdm_fi_ops) return pmof_rdm_conn(to_rdm(ep_fid), addr, err);
    return container_of(ep_fid, struct pmof_ep, ep_fid);
}

struct pmof_domain *pmof_ep_domain(struct fid_ep *ep_fid) {
    if (ep_fid->fid.ops == &rdm_fi_ops) return to_rdm(ep_fid)->dom;
    return container_of(ep_fid, struct pmof_ep, ep_fid)->dom;
}

uint64_t pmof_ep_op_flags(struct fid_ep *ep_fid) {
    if (ep_fid->fid.ops == &rdm_fi_ops) return to_rdm(ep_fid)->tx_op_flags;
    return container_of(ep_fid, struct pmof_ep, ep_fid)->tx_op_flags;
}

static ssize_t rdm_recvmsg(struct fid_ep *ep_fid, const struct fi_msg *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg) return -FI_EINVAL;
    return rdm_post_recv(to_rdm(ep_fid), msg->msg_iov, msg->desc, msg->iov_count, msg->addr,
                         msg->context, flags);
}

static ssize_t rdm_recvv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src_addr, void *context) {
    return rdm_post_recv(to_rdm(ep_fid), iov, desc, count, src_addr, context,
                         to_rdm(ep_fid)->rx_op_flags);
}

static ssize_t rdm_recv(struct fid_ep *ep_fid, void *buf, size_t len, void *desc,
                        fi_addr_t src_addr, void *context) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return rdm_recvv(ep_fid, &iov, &desc, 1, src_addr, context);
}

#define RDM_CONN(rdm, addr)                                                                        \
    ssize_t err_ = 0;                                                                              \
    struct pmof_ep *cep = pmof_rdm_conn(rdm, addr, &err_);                                         \
    if (!cep) return err_

/* Every send of the endpoint: headed when it has FI_TAGGED. */
static ssize_t rdm_post_send(struct pmof_rdm *rdm, fi_addr_t dest, const struct iovec *iov,
                             void **desc, size_t count, uint64_t data, void *context,
                             uint64_t flags) {
    if (rdm->tg)
        return pmof_tagged_send(rdm, dest, iov, desc, count, 0, data, context, flags, false);
    RDM_CONN(rdm, dest);
    return pmof_post_send(cep, iov, desc, count, data, context, flags);
}

static ssize_t rdm_sendmsg(struct fid_ep *ep_fid, const struct fi_msg *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg) return -FI_EINVAL;
    return rdm_post_send(to_rdm(ep_fid), msg->addr, msg->msg_iov, msg->desc, msg->iov_count,
                         msg->data, msg->context, flags);
}

static ssize_t rdm_sendv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t dest_addr, void *context) {
    return rdm_post_send(to_rdm(ep_fid), dest_addr, iov, desc, count, 0, context,
                         to_rdm(ep_fid)->tx_op_flags & ~FI_REMOTE_CQ_DATA);
}

static ssize_t rdm_send(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                        fi_addr_t dest_addr, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rdm_sendv(ep_fid, &iov, &desc, 1, dest_addr, context);
}

static ssize_t rdm_senddata(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                            uint64_t data, fi_addr_t dest_addr, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rdm_post_send(to_rdm(ep_fid), dest_addr, &iov, &desc, 1, data, context,
                         to_rdm(ep_fid)->tx_op_flags | FI_REMOTE_CQ_DATA);
}

static ssize_t rdm_inject(struct fid_ep *ep_fid, const void *buf, size_t len, fi_addr_t dest_addr) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rdm_post_send(to_rdm(ep_fid), dest_addr, &iov, NULL, 1, 0, NULL, PMOF_INJECT);
}

static ssize_t rdm_injectdata(struct fid_ep *ep_fid, const void *buf, size_t len, uint64_t data,
                              fi_addr_t dest_addr) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rdm_post_send(to_rdm(ep_fid), dest_addr, &iov, NULL, 1, data, NULL,
                         PMOF_INJECT | FI_REMOTE_CQ_DATA);
}

static struct fi_ops_msg rdm_msg_ops = {
    .size = sizeof(struct fi_ops_msg),
    .recv = rdm_recv,
    .recvv = rdm_recvv,
    .recvmsg = rdm_recvmsg,
    .send = rdm_send,
    .sendv = rdm_sendv,
    .sendmsg = rdm_sendmsg,
    .inject = rdm_inject,
    .senddata = rdm_senddata,
    .injectdata = rdm_injectdata,
};

static uint64_t rdm_default_flags(struct pmof_rdm *rdm) {
    return rdm->tx_op_flags & ~(FI_REMOTE_CQ_DATA | FI_IMMED);
}

static ssize_t rdm_readmsg(struct fid_ep *ep_fid, const struct fi_msg_rma *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    RDM_CONN(to_rdm(ep_fid), msg->addr);
    return pmof_rma_read(cep, msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0].addr,
                         msg->rma_iov[0].key, msg->context, flags);
}

static ssize_t rdm_readv(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context) {
    RDM_CONN(to_rdm(ep_fid), src_addr);
    return pmof_rma_read(cep, iov, desc, count, addr, key, context, to_rdm(ep_fid)->tx_op_flags);
}

static ssize_t rdm_read(struct fid_ep *ep_fid, void *buf, size_t len, void *desc,
                        fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return rdm_readv(ep_fid, &iov, &desc, 1, src_addr, addr, key, context);
}

static ssize_t rdm_writemsg(struct fid_ep *ep_fid, const struct fi_msg_rma *msg, uint64_t flags) {
    flags &= ~PMOF_NO_COMPLETION;
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    if ((flags & FI_IMMED) && !(flags & FI_COMMIT)) return -FI_EINVAL;
    RDM_CONN(to_rdm(ep_fid), msg->addr);
    return pmof_rma_write(cep, msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0].addr,
                          msg->rma_iov[0].key, msg->data, msg->context, flags);
}

static ssize_t rdm_writev(struct fid_ep *ep_fid, const struct iovec *iov, void **desc, size_t count,
                          fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context) {
    RDM_CONN(to_rdm(ep_fid), dest_addr);
    return pmof_rma_write(cep, iov, desc, count, addr, key, 0, context,
                          rdm_default_flags(to_rdm(ep_fid)));
}

static ssize_t rdm_write(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                         fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return rdm_writev(ep_fid, &iov, &desc, 1, dest_addr, addr, key, context);
}

static ssize_t rdm_writedata(struct fid_ep *ep_fid, const void *buf, size_t len, void *desc,
                             uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                             void *context) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    RDM_CONN(to_rdm(ep_fid), dest_addr);
    return pmof_rma_write(cep, &iov, &desc, 1, addr, key, data, context,
                          rdm_default_flags(to_rdm(ep_fid)) | FI_REMOTE_CQ_DATA);
}

static ssize_t rdm_inject_write(struct fid_ep *ep_fid, const void *buf, size_t len,
                                fi_addr_t dest_addr, uint64_t addr, uint64_t key) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    RDM_CONN(to_rdm(ep_fid), dest_addr);
    return pmof_rma_write(cep, &iov, NULL, 1, addr, key, 0, NULL,
                          rdm_default_flags(to_rdm(ep_fid)) | PMOF_INJECT);
}

static ssize_t rdm_injectdata_write(struct fid_ep *ep_fid, const void *buf, size_t len,
                                    uint64_t data, fi_addr_t dest_addr, uint64_t addr,
                                    uint64_t key) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    RDM_CONN(to_rdm(ep_fid), dest_addr);
    return pmof_rma_write(cep, &iov, NULL, 1, addr, key, data, NULL,
                          rdm_default_flags(to_rdm(ep_fid)) | PMOF_INJECT | FI_REMOTE_CQ_DATA);
}

static struct fi_ops_rma rdm_rma_ops = {
    .size = sizeof(struct fi_ops_rma),
    .read = rdm_read,
    .readv = rdm_readv,
    .readmsg = rdm_readmsg,
    .write = rdm_write,
    .writev = rdm_writev,
    .writemsg = rdm_writemsg,
    .inject = rdm_inject_write,
    .writedata = rdm_writedata,
    .injectdata = rdm_injectdata_write,
};

static ssize_t rdm_commit(struct fi_pmof_ep_ops *ops, const struct fi_rma_iov *iov, size_t count,
                          fi_addr_t dest_addr, uint64_t flags, void *context) {
    struct pmof_rdm *rdm = container_of(ops, struct pmof_rdm, pmof_ops);

    if (!count || !iov) return -FI_EINVAL;
    RDM_CONN(rdm, dest_addr);
    return pmof_commit_ep(cep, iov, count, flags, context);
}

/* ------------------------------------------------------------ the object */

static int rdm_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
    struct pmof_rdm *rdm = container_of(fid, struct pmof_rdm, ep_fid.fid);

    if (!bfid) return -FI_EINVAL;
    if (rdm->enabled) return -FI_EOPBADSTATE;
    switch (bfid->fclass) {
    case FI_CLASS_AV:
        if (rdm->av) return -FI_EINVAL;
        rdm->av = container_of(bfid, struct pmof_av, av_fid.fid);
        atomic_fetch_add(&rdm->av->refs, 1);
        return 0;
    case FI_CLASS_EQ:
        if (rdm->user_eq) return -FI_EINVAL;
        rdm->user_eq = container_of(bfid, struct pmof_eq, eq_fid.fid);
        atomic_fetch_add(&rdm->user_eq->refs, 1);
        return 0;
    case FI_CLASS_CQ: {
        struct pmof_cq *cq = container_of(bfid, struct pmof_cq, cq_fid.fid);
        if (flags & ~(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION)) return -FI_EBADFLAGS;
        if ((flags & FI_TRANSMIT) && rdm->tx_cq) return -FI_EINVAL;
        if ((flags & FI_RECV) && rdm->rx_cq) return -FI_EINVAL;
        if (flags & FI_TRANSMIT) {
            rdm->tx_cq = cq;
            rdm->tx_selective = flags & FI_SELECTIVE_COMPLETION;
            atomic_fetch_add(&cq->refs, 1);
        }
        if (flags & FI_RECV) {
            rdm->rx_cq = cq;
            rdm->rx_selective = flags & FI_SELECTIVE_COMPLETION;
            atomic_fetch_add(&cq->refs, 1);
        }
        return 0;
    }
    case FI_CLASS_CNTR:
        return pmof_bind_cntr(rdm->cntrs, container_of(bfid, struct pmof_cntr, cntr_fid.fid),
                              flags);
    default:
        return -FI_ENOSYS;
    }
}

static int rdm_enable(struct pmof_rdm *rdm) {
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = rdm->rx_size, .max_sge = PMOF_IOV_LIMIT}};
    struct fi_eq_attr eqa = {.wait_obj = FI_WAIT_FD};
    struct fid_eq *eq;
    struct fid_pep *pep;
    size_t len = sizeof(rdm->name);
    int ret;

    if (rdm->enabled) return 0;
    if (!rdm->av) return -FI_ENOAV;
    if (!rdm->tx_cq || !rdm->rx_cq) return -FI_ENOCQ;
    /* Commit events of manual mode go to the endpoint's EQ. */
    if ((rdm->info->mode & FI_COMMIT_MANUAL) && !rdm->user_eq) return -FI_ENOEQ;
    rdm->srq = ibv_create_srq(rdm->dom->pd, &sa);
    if (!rdm->srq) return pmof_errno(errno);
    if (rdm->info->caps & PMOF_HEADED_CAPS) {
        ret = pmof_tagged_open(rdm);
        if (!ret) ret = pmof_tagged_fill_srq(rdm);
        if (!ret) ret = pmof_cq_add_hook(rdm->tx_cq, rdm);
        if (!ret) ret = pmof_cq_add_hook(rdm->rx_cq, rdm);
        if (ret) return ret;
    }
    ret = pmof_eq_open(&rdm->dom->fab->fabric_fid, &eqa, &eq, NULL);
    if (ret) return ret;
    rdm->cm_eq = container_of(eq, struct pmof_eq, eq_fid);
    ret = pmof_passive_ep(&rdm->dom->fab->fabric_fid, rdm->msg_info, &pep, NULL);
    if (ret) return ret;
    rdm->pep = container_of(pep, struct pmof_pep, pep_fid);
    ret = fi_pep_bind(pep, &eq->fid, 0);
    if (!ret) ret = fi_listen(pep);
    if (!ret) ret = fi_getname(&pep->fid, &rdm->name, &len);
    if (ret) return ret;
    if (pipe(rdm->stop_fd)) return pmof_errno(errno);
    pmof_pin_library();
    ret = pthread_create(&rdm->thread, NULL, rdm_cm_thread, rdm);
    if (ret) return pmof_errno(ret);
    rdm->thread_running = true;
    for (int k = 0; k < PMOF_CNTR_KINDS; k++) {
        if (!rdm->cntrs[k]) continue;
        bool tx = k == PMOF_CNTR_SEND || k == PMOF_CNTR_READ || k == PMOF_CNTR_WRITE;
        ret = pmof_cntr_watch_cq(rdm->cntrs[k], tx ? rdm->tx_cq : rdm->rx_cq);
        if (ret) return ret;
    }
    rdm->enabled = true;
    return 0;
}

static int rdm_control(struct fid *fid, int command, void *arg) {
    struct pmof_rdm *rdm = container_of(fid, struct pmof_rdm, ep_fid.fid);

    switch (command) {
    case FI_ENABLE:
        return rdm_enable(rdm);
    case FI_GETOPSFLAG:
    case FI_SETOPSFLAG:
        return pmof_ops_flag_control(&rdm->tx_op_flags, &rdm->rx_op_flags, command, arg);
    default:
        return -FI_ENOSYS;
    }
}

static int rdm_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                        void *context) {
    struct pmof_rdm *rdm = container_of(fid, struct pmof_rdm, ep_fid.fid);

    (void)context;
    if (flags) return -FI_EBADFLAGS;
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, FI_PMOF_EP_OPS_1)) return -FI_ENOSYS;
    *ops = &rdm->pmof_ops;
    return 0;
}

static int rdm_close(struct fid *fid) {
    struct pmof_rdm *rdm = container_of(fid, struct pmof_rdm, ep_fid.fid);
    struct pmof_conn *c;

    if (rdm->thread_running) {
        ssize_t w = write(rdm->stop_fd[1], "x", 1);
        (void)w;
        pthread_join(rdm->thread, NULL);
    }
    /* Before the connections go: another thread reading a shared CQ no
     * longer runs this endpoint's work. */
    if (rdm->tx_cq) pmof_cq_del_hook(rdm->tx_cq, rdm);
    if (rdm->rx_cq) pmof_cq_del_hook(rdm->rx_cq, rdm);
    rdm->closing = true;
    if (rdm->stop_fd[0] > 0) {
        close(rdm->stop_fd[0]);
        close(rdm->stop_fd[1]);
    }
    while ((c = rdm->conns)) {
        rdm->conns = c->next;
        c->ep->conn = NULL;
        fi_close(&c->ep->ep_fid.fid);
        free(c);
    }
    if (rdm->pep) fi_close(&rdm->pep->pep_fid.fid);
    if (rdm->cm_eq) fi_close(&rdm->cm_eq->eq_fid.fid);
    if (rdm->srq) ibv_destroy_srq(rdm->srq);
    pmof_tagged_close(rdm);
    if (rdm->av) atomic_fetch_sub(&rdm->av->refs, 1);
    if (rdm->user_eq) atomic_fetch_sub(&rdm->user_eq->refs, 1);
    if (rdm->tx_cq) atomic_fetch_sub(&rdm->tx_cq->refs, 1);
    if (rdm->rx_cq) atomic_fetch_sub(&rdm->rx_cq->refs, 1);
    for (int k = 0; k < PMOF_CNTR_KINDS; k++)
        if (rdm->cntrs[k]) atomic_fetch_sub(&rdm->cntrs[k]->refs, 1);
    free(rdm->send_conn);
    free(rdm->rx_ops);
    free(rdm->rx_free);
    pmof_lock_destroy(&rdm->lock);
    pmof_lock_destroy(&rdm->rx_lock);
    fi_freeinfo(rdm->msg_info);
    fi_freeinfo(rdm->info);
    atomic_fetch_sub(&rdm->dom->refs, 1);
    free(rdm);
    return 0;
}

static struct fi_ops rdm_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = rdm_close,
    .bind = rdm_bind,
    .control = rdm_control,
    .ops_open = rdm_ops_open,
    .ops_set = pmof_fid_ops_set_enosys,
};

static int rdm_getname(fid_t fid, void *addr, size_t *addrlen) {
    struct pmof_rdm *rdm = container_of(fid, struct pmof_rdm, ep_fid.fid);
    size_t len = pmof_sockaddr_len((struct sockaddr *)&rdm->name);

    if (!addrlen) return -FI_EINVAL;
    if (!len) return -FI_EOPBADSTATE; /* named when enabled */
    if (*addrlen < len) {
        *addrlen = len;
        return -FI_ETOOSMALL;
    }
    if (!addr) return -FI_EINVAL;
    memcpy(addr, &rdm->name, len);
    *addrlen = len;
    return 0;
}

static struct fi_ops_cm rdm_cm_ops;
static struct fi_ops_ep rdm_base_ops;

static int rdm_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen) {
    (void)fid, (void)optname, (void)optval, (void)optlen;
    return level == FI_OPT_ENDPOINT ? -FI_ENOPROTOOPT : -FI_ENOPROTOOPT;
}

static ssize_t rdm_rx_size_left(struct fid_ep *ep_fid) {
    struct pmof_rdm *rdm = to_rdm(ep_fid);
    return rdm->tg ? (ssize_t)pmof_tagged_rx_left(rdm) : (ssize_t)rdm->rx_free_count;
}

static ssize_t rdm_tx_size_left(struct fid_ep *ep_fid) {
    return (ssize_t)to_rdm(ep_fid)->info->tx_attr->size;
}

int pmof_rdm_endpoint(struct pmof_domain *dom, struct fi_info *info, struct fid_ep **out,
                      void *context) {
    struct pmof_rdm *rdm = calloc(1, sizeof(*rdm));

    if (!rdm) return -FI_ENOMEM;
    rdm->dom = dom;
    rdm->info = fi_dupinfo(info);
    rdm->msg_info = fi_dupinfo(info);
    rdm->rx_size = info->rx_attr && info->rx_attr->size ? (uint32_t)info->rx_attr->size
                                                        : (uint32_t)pmof_params.rx_size;
    rdm->rx_ops = calloc(rdm->rx_size, sizeof(*rdm->rx_ops));
    rdm->rx_free = calloc(rdm->rx_size, sizeof(*rdm->rx_free));
    if (!rdm->info || !rdm->msg_info || !rdm->rx_ops || !rdm->rx_free) {
        fi_freeinfo(rdm->info);
        fi_freeinfo(rdm->msg_info);
        free(rdm->rx_ops);
        free(rdm->rx_free);
        free(rdm);
        return -FI_ENOMEM;
    }
    for (uint32_t i = 0; i < rdm->rx_size; i++)
        rdm->rx_free[i] = rdm->rx_size - 1 - i;
    rdm->rx_free_count = rdm->rx_size;
    /* The hidden connections' info: MSG, from this endpoint's address. */
    rdm->msg_info->ep_attr->type = FI_EP_MSG;
    /* Headed messages: the inject size the application has, behind the
     * header. */
    if ((info->caps & PMOF_HEADED_CAPS) && rdm->msg_info->tx_attr &&
        rdm->msg_info->tx_attr->inject_size + PMOF_MSG_HDR_LEN <= PMOF_INLINE_MAX)
        rdm->msg_info->tx_attr->inject_size += PMOF_MSG_HDR_LEN;
    free(rdm->msg_info->dest_addr);
    rdm->msg_info->dest_addr = NULL;
    rdm->msg_info->dest_addrlen = 0;
    rdm->tx_op_flags = info->tx_attr ? info->tx_attr->op_flags : 0;
    rdm->rx_op_flags = info->rx_attr ? info->rx_attr->op_flags : 0;
    pmof_lock_init(&rdm->lock, true);
    pmof_lock_init(&rdm->rx_lock, true);
    rdm_cm_ops = pmof_cm_ops_enosys;
    rdm_cm_ops.getname = rdm_getname;
    rdm_base_ops = pmof_ep_base_ops_enosys;
    rdm_base_ops.getopt = rdm_getopt;
    rdm_base_ops.rx_size_left = rdm_rx_size_left;
    rdm_base_ops.tx_size_left = rdm_tx_size_left;
    rdm->ep_fid.fid.fclass = FI_CLASS_EP;
    rdm->ep_fid.fid.context = context;
    rdm->ep_fid.fid.ops = &rdm_fi_ops;
    rdm->ep_fid.ops = &rdm_base_ops;
    rdm->ep_fid.cm = &rdm_cm_ops;
    rdm->ep_fid.msg = &rdm_msg_ops;
    rdm->ep_fid.rma = &rdm_rma_ops;
    rdm->ep_fid.tagged = (info->caps & FI_TAGGED) ? &pmof_tagged_ops : &pmof_tagged_ops_enosys;
    rdm->ep_fid.atomic = &pmof_atomic_ops;
    rdm->ep_fid.collective = &pmof_collective_ops_enosys;
    rdm->pmof_ops.size = sizeof(rdm->pmof_ops);
    rdm->pmof_ops.commit = rdm_commit;
    atomic_fetch_add(&dom->refs, 1);
    *out = &rdm->ep_fid;
    return 0;
}
