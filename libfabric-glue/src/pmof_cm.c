/* SPDX-License-Identifier: MIT */
/*
 * Connection management over rdma_cm: passive endpoints, connect, accept,
 * reject, shutdown, and the translation of rdma_cm events into libfabric's
 * EQ events.
 *
 * The provider drives its QPs itself (INIT at fi_enable, RTR and RTS when
 * the connection is agreed), so both sides' FLUSH access is in place before
 * either can send.  Native commit opcodes are agreed through ECE: the
 * active side offers its QP's options, the passive side keeps what both
 * share and answers it, as librdmacm does for the QPs it drives.
 *
 * Private data carries a header {user length, flags[, control QP]} ahead
 * of the application's bytes (pmof_wire.h): the CM pads private data, so
 * the length would be lost without it, and a manual-commit endpoint names
 * its control QP there.
 */
#include "pmof.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ private data */

static int cm_data_pack(uint8_t *out, size_t *outlen, const void *param, size_t len, uint8_t flags,
                        uint32_t ctl_qpn) {
    return pmof_cm_hdr_pack(out, outlen, param, len, flags, ctl_qpn) ? -FI_EINVAL : 0;
}

/* The provider's header of a CM event's private data; empty when the
 * bytes are not a pmof peer's. */
static void cm_data_parse(const struct rdma_conn_param *p, struct pmof_cm_hdr *h) {
    pmof_cm_hdr_parse(p->private_data, p->private_data_len, h);
}

/* ------------------------------------------------------------------- ECE */

int pmof_ep_set_local_ece(struct pmof_ep *ep) {
    struct ibv_ece ece = {0};

    if (ibv_query_ece(ep->qp, &ece)) return 0; /* not a device with ECE: IBTA only */
    if (ep->connreq) {
        /* Passive: keep what the request offered and we have. */
        struct ibv_ece peer = ep->connreq->ece;
        if (peer.vendor_id != ece.vendor_id) {
            peer.vendor_id = ece.vendor_id;
            peer.options = 0;
        }
        if (ibv_set_ece(ep->qp, &peer) == 0) ibv_query_ece(ep->qp, &ece);
    }
    if (ece.vendor_id && rdma_set_local_ece(ep->id, &ece))
        PMOF_INFO(FI_LOG_EP_CTRL, "rdma_set_local_ece: %s\n", strerror(errno));
    return 0;
}

/* Active side, on the reply: the options the passive side kept. */
static void ece_from_reply(struct pmof_ep *ep) {
    struct ibv_ece mine = {0}, peer = {0};

    if (ibv_query_ece(ep->qp, &mine) || rdma_get_remote_ece(ep->id, &peer)) return;
    if (peer.vendor_id != mine.vendor_id) {
        /* A peer without ECE, or another vendor's: IBTA sequences. */
        peer.vendor_id = mine.vendor_id;
        peer.options = 0;
    }
    if (ibv_set_ece(ep->qp, &peer)) PMOF_INFO(FI_LOG_EP_CTRL, "ibv_set_ece: %s\n", strerror(errno));
}

/* ------------------------------------------------------- active endpoint */

static void conn_param(struct pmof_ep *ep, struct rdma_conn_param *p) {
    const struct ibv_device_attr *a = &ep->dom->dev_attr.orig_attr;

    memset(p, 0, sizeof(*p));
    p->private_data = ep->cm_data;
    p->private_data_len = (uint8_t)ep->cm_data_len;
    p->responder_resources = (uint8_t)(a->max_qp_rd_atom < 255 ? a->max_qp_rd_atom : 255);
    p->initiator_depth = (uint8_t)(a->max_qp_init_rd_atom < 255 ? a->max_qp_init_rd_atom : 255);
    p->flow_control = 1;
    p->retry_count = 7;
    p->rnr_retry_count = 7;
    p->qp_num = ep->qp->qp_num;
}

/* A manual endpoint offers its control QP; the passive side answers with
 * its own only if the request offered one, so both know whether the
 * connection commits manually. */
static uint8_t local_cm_flags(const struct pmof_ep *ep) {
    if (!ep->mctl) return 0;
    if (ep->connreq && !ep->connreq->peer_ctl_qpn) return 0;
    return PMOF_CM_COMMIT_MANUAL;
}

static int pack_local(struct pmof_ep *ep, const void *param, size_t len) {
    uint8_t flags = local_cm_flags(ep);

    return cm_data_pack(ep->cm_data, &ep->cm_data_len, param, len, flags, pmof_manual_qpn(ep));
}

static int ep_connect(struct fid_ep *ep_fid, const void *addr, const void *param, size_t len) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    int ret;

    if (!ep->eq) return -FI_ENOEQ;
    if (ep->state != PMOF_EP_IDLE || ep->connreq) return -FI_EOPBADSTATE;
    if (!ep->qp) {
        ret = fi_enable(ep_fid);
        if (ret) return ret;
    }
    ret = pack_local(ep, param, len);
    if (ret) return ret;
    ep->state = PMOF_EP_CONNECTING;
    if (addr && !ep->resolved) {
        /* Asynchronous now that the id is on the EQ's channel: route
         * resolution and rdma_connect follow in the EQ's progress. */
        if (rdma_resolve_addr(ep->id, ep->info->src_addr, (struct sockaddr *)addr,
                              pmof_params.cm_timeout_ms))
            ret = pmof_errno(errno);
    } else if (ep->resolved) {
        if (rdma_resolve_route(ep->id, pmof_params.cm_timeout_ms)) ret = pmof_errno(errno);
    } else {
        ret = -FI_EINVAL;
    }
    if (ret) ep->state = PMOF_EP_IDLE;
    return ret;
}

static int ep_accept(struct fid_ep *ep_fid, const void *param, size_t len) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    struct rdma_conn_param p;
    int ret;

    if (!ep->connreq) return -FI_EOPBADSTATE;
    if (!ep->eq) return -FI_ENOEQ;
    if (ep->state != PMOF_EP_IDLE) return -FI_EOPBADSTATE;
    if (!ep->qp) {
        ret = fi_enable(ep_fid);
        if (ret) return ret;
    }
    ret = pack_local(ep, param, len);
    if (ret) return ret;
    /* Ready to receive and send before the reply leaves. */
    ret = pmof_ep_qp_to_rts(ep);
    if (!ret && local_cm_flags(ep)) ret = pmof_manual_connect(ep, ep->connreq->peer_ctl_qpn);
    if (ret) return ret;
    conn_param(ep, &p);
    ep->state = PMOF_EP_ACCEPTING;
    if (rdma_accept(ep->id, &p)) {
        ret = pmof_errno(errno);
        ep->state = PMOF_EP_IDLE;
        return ret;
    }
    return 0;
}

static int ep_shutdown(struct fid_ep *ep_fid, uint64_t flags) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);

    if (flags) return -FI_EBADFLAGS;
    if (ep->state == PMOF_EP_SHUTDOWN) return 0;
    /* Outstanding requests are canceled (flushed to the CQ). */
    pmof_ep_qp_to_error(ep);
    ep->state = PMOF_EP_SHUTDOWN;
    if (rdma_disconnect(ep->id) && errno != EINVAL) return pmof_errno(errno);
    return 0;
}

static int getname_common(struct rdma_cm_id *id, void *addr, size_t *addrlen, bool peer) {
    struct sockaddr *sa = peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id);
    size_t len = pmof_sockaddr_len(sa);

    if (!addrlen) return -FI_EINVAL;
    if (!len) return -FI_EADDRNOTAVAIL;
    if (*addrlen < len) {
        *addrlen = len;
        return -FI_ETOOSMALL;
    }
    if (!addr) return -FI_EINVAL;
    memcpy(addr, sa, len);
    *addrlen = len;
    return 0;
}

static int ep_getname(fid_t fid, void *addr, size_t *addrlen) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);
    return getname_common(ep->id, addr, addrlen, false);
}

static int ep_getpeer(struct fid_ep *ep_fid, void *addr, size_t *addrlen) {
    struct pmof_ep *ep = container_of(ep_fid, struct pmof_ep, ep_fid);
    if (ep->state != PMOF_EP_CONNECTED && ep->state != PMOF_EP_ACCEPTING &&
        ep->state != PMOF_EP_CONNECTING)
        return -FI_ENOTCONN;
    return getname_common(ep->id, addr, addrlen, true);
}

static int ep_setname(fid_t fid, void *addr, size_t addrlen) {
    struct pmof_ep *ep = container_of(fid, struct pmof_ep, ep_fid.fid);

    if (!addr || addrlen < pmof_sockaddr_len(addr)) return -FI_EINVAL;
    if (ep->qp) return -FI_EOPBADSTATE;
    return rdma_bind_addr(ep->id, addr) ? pmof_errno(errno) : 0;
}

static int cm_listen_enosys(struct fid_pep *pep) {
    (void)pep;
    return -FI_ENOSYS;
}

static int cm_reject_enosys(struct fid_pep *pep, fid_t handle, const void *param, size_t len) {
    (void)pep, (void)handle, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int cm_join_enosys(struct fid_ep *ep, const void *addr, uint64_t flags, struct fid_mc **mc,
                          void *context) {
    (void)ep, (void)addr, (void)flags, (void)mc, (void)context;
    return -FI_ENOSYS;
}

static int cm_connect_enosys(struct fid_ep *ep, const void *addr, const void *param, size_t len) {
    (void)ep, (void)addr, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int cm_accept_enosys(struct fid_ep *ep, const void *param, size_t len) {
    (void)ep, (void)param, (void)len;
    return -FI_ENOSYS;
}

static int cm_shutdown_enosys(struct fid_ep *ep, uint64_t flags) {
    (void)ep, (void)flags;
    return -FI_ENOSYS;
}

static int cm_getpeer_enosys(struct fid_ep *ep, void *addr, size_t *addrlen) {
    (void)ep, (void)addr, (void)addrlen;
    return -FI_ENOSYS;
}

struct fi_ops_cm pmof_ep_cm_ops = {
    .size = sizeof(struct fi_ops_cm),
    .setname = ep_setname,
    .getname = ep_getname,
    .getpeer = ep_getpeer,
    .connect = ep_connect,
    .listen = cm_listen_enosys,
    .accept = ep_accept,
    .reject = cm_reject_enosys,
    .shutdown = ep_shutdown,
    .join = cm_join_enosys,
};

/* ------------------------------------------------------ passive endpoint */

static int pep_listen(struct fid_pep *pep_fid) {
    struct pmof_pep *pep = container_of(pep_fid, struct pmof_pep, pep_fid);

    if (!pep->id) return -FI_EOPBADSTATE; /* given to an active endpoint */
    if (!pep->eq) return -FI_ENOEQ;
    if (rdma_listen(pep->id, pep->backlog)) return pmof_errno(errno);
    pep->listening = true;
    return 0;
}

static int pep_reject(struct fid_pep *pep_fid, fid_t handle, const void *param, size_t len) {
    struct pmof_connreq *cr;
    uint8_t data[PMOF_CM_PRIVATE_MAX];
    size_t dlen;
    int ret;

    (void)pep_fid;
    if (!handle || handle->fclass != FI_CLASS_CONNREQ) return -FI_EINVAL;
    cr = container_of(handle, struct pmof_connreq, handle);
    ret = cm_data_pack(data, &dlen, param, len, 0, 0);
    if (ret) return ret;
    ret = rdma_reject(cr->id, data, (uint8_t)dlen) ? pmof_errno(errno) : 0;
    rdma_destroy_id(cr->id);
    free(cr);
    return ret;
}

static int pep_getname(fid_t fid, void *addr, size_t *addrlen) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);

    if (!pep->id) return -FI_EOPBADSTATE;
    return getname_common(pep->id, addr, addrlen, false);
}

static int pep_setname(fid_t fid, void *addr, size_t addrlen) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);

    if (!addr || addrlen < pmof_sockaddr_len(addr)) return -FI_EINVAL;
    if (!pep->id) return -FI_EOPBADSTATE;
    return rdma_bind_addr(pep->id, addr) ? pmof_errno(errno) : 0;
}

static struct fi_ops_cm pep_cm_ops = {
    .size = sizeof(struct fi_ops_cm),
    .setname = pep_setname,
    .getname = pep_getname,
    .getpeer = cm_getpeer_enosys,
    .connect = cm_connect_enosys,
    .listen = pep_listen,
    .accept = cm_accept_enosys,
    .reject = pep_reject,
    .shutdown = cm_shutdown_enosys,
    .join = cm_join_enosys,
};

static int pep_bind(struct fid *fid, struct fid *bfid, uint64_t flags) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);
    struct pmof_eq *eq;

    (void)flags;
    if (!bfid || bfid->fclass != FI_CLASS_EQ) return -FI_EINVAL;
    if (pep->eq) return -FI_EINVAL;
    eq = container_of(bfid, struct pmof_eq, eq_fid.fid);
    if (!pep->id) return -FI_EOPBADSTATE;
    if (rdma_migrate_id(pep->id, eq->channel)) return pmof_errno(errno);
    pep->eq = eq;
    atomic_fetch_add(&eq->refs, 1);
    return 0;
}

static int pep_control(struct fid *fid, int command, void *arg) {
    (void)fid, (void)arg;
    /* Nothing to enable: listen does the work. */
    return command == FI_ENABLE ? 0 : -FI_ENOSYS;
}

static int pep_close(struct fid *fid) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);

    if (pep->id) rdma_destroy_id(pep->id);
    if (pep->eq) atomic_fetch_sub(&pep->eq->refs, 1);
    atomic_fetch_sub(&pep->fab->refs, 1);
    fi_freeinfo(pep->info);
    free(pep);
    return 0;
}

static int pep_setopt(fid_t fid, int level, int optname, const void *optval, size_t optlen) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);

    (void)optlen;
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (optname == FI_OPT_CM_DATA_SIZE) return -FI_EINVAL;
    (void)pep, (void)optval;
    return -FI_ENOPROTOOPT;
}

static int pep_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen) {
    struct pmof_pep *pep = container_of(fid, struct pmof_pep, pep_fid.fid);

    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_CM_DATA_SIZE) return -FI_ENOPROTOOPT;
    if (!optval || !optlen) return -FI_EINVAL;
    if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
    /* What a REQ to this listener may carry: the least of both kinds. */
    *(size_t *)optval =
        pmof_cm_user_max((pep->info->mode & FI_COMMIT_MANUAL) ? PMOF_CM_COMMIT_MANUAL : 0);
    *optlen = sizeof(size_t);
    return 0;
}

static struct fi_ops pep_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = pep_close,
    .bind = pep_bind,
    .control = pep_control,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_ep pep_base_ops;

struct pmof_pep *pmof_pep_of(struct fid *fid) {
    if (!fid || fid->fclass != FI_CLASS_PEP || fid->ops != &pep_fi_ops) return NULL;
    return container_of(fid, struct pmof_pep, pep_fid.fid);
}

int pmof_passive_ep(struct fid_fabric *fabric, struct fi_info *info, struct fid_pep **out,
                    void *context) {
    struct pmof_fabric *fab = container_of(fabric, struct pmof_fabric, fabric_fid);
    struct pmof_pep *pep;
    int ret;

    if (!info || !out) return -FI_EINVAL;
    if (info->ep_attr && info->ep_attr->type != FI_EP_MSG) return -FI_EINVAL;
    pep = calloc(1, sizeof(*pep));
    if (!pep) return -FI_ENOMEM;
    pep->info = fi_dupinfo(info);
    if (!pep->info) {
        free(pep);
        return -FI_ENOMEM;
    }
    pep->backlog = info->ep_attr && info->ep_attr->rx_ctx_cnt > 1 ? 1024 : 128;
    if (rdma_create_id(NULL, &pep->id, &pep->pep_fid.fid, RDMA_PS_TCP)) {
        ret = pmof_errno(errno);
        goto err;
    }
    if (info->src_addr && rdma_bind_addr(pep->id, info->src_addr)) {
        ret = pmof_errno(errno);
        goto err;
    }
    pep_base_ops = pmof_ep_base_ops_enosys;
    pep_base_ops.getopt = pep_getopt;
    pep_base_ops.setopt = pep_setopt;
    pep->fab = fab;
    pep->pep_fid.fid.fclass = FI_CLASS_PEP;
    pep->pep_fid.fid.context = context;
    pep->pep_fid.fid.ops = &pep_fi_ops;
    pep->pep_fid.ops = &pep_base_ops;
    pep->pep_fid.cm = &pep_cm_ops;
    atomic_fetch_add(&fab->refs, 1);
    *out = &pep->pep_fid;
    return 0;
err:
    if (pep->id) rdma_destroy_id(pep->id);
    fi_freeinfo(pep->info);
    free(pep);
    return ret;
}

/* ------------------------------------------------------------- CM events */

/* FI_CONNREQ's info: the listener's, with this connection's addresses and
 * device, and the request as its handle. */
static struct fi_info *connreq_info(struct pmof_pep *pep, struct rdma_cm_event *ev,
                                    const struct pmof_cm_hdr *hdr) {
    struct fi_info *fi = fi_dupinfo(pep->info);
    struct pmof_connreq *cr = calloc(1, sizeof(*cr));
    struct sockaddr *local = rdma_get_local_addr(ev->id), *peer = rdma_get_peer_addr(ev->id);

    if (!fi || !cr) goto err;
    free(fi->src_addr);
    free(fi->dest_addr);
    fi->src_addr = malloc(pmof_sockaddr_len(local));
    fi->dest_addr = malloc(pmof_sockaddr_len(peer));
    if (!fi->src_addr || !fi->dest_addr) goto err;
    memcpy(fi->src_addr, local, pmof_sockaddr_len(local));
    memcpy(fi->dest_addr, peer, pmof_sockaddr_len(peer));
    fi->src_addrlen = pmof_sockaddr_len(local);
    fi->dest_addrlen = pmof_sockaddr_len(peer);
    fi->addr_format = local->sa_family == AF_INET ? FI_SOCKADDR_IN : FI_SOCKADDR_IN6;
    if (ev->id->verbs) {
        free(fi->domain_attr->name);
        fi->domain_attr->name = strdup(ibv_get_device_name(ev->id->verbs->device));
    }
    /* This info never passes through libfabric's core, which would fill
     * these in. */
    free(fi->fabric_attr->prov_name);
    fi->fabric_attr->prov_name = strdup(PMOF_NAME);
    fi->fabric_attr->prov_version = PMOF_PROV_VERSION;
    fi->fabric_attr->api_version = pmof_prov.fi_version;
    cr->handle.fclass = FI_CLASS_CONNREQ;
    cr->id = ev->id;
    cr->peer_flags = hdr->flags;
    cr->peer_ctl_qpn = hdr->ctl_qpn;
    if (rdma_get_remote_ece(ev->id, &cr->ece)) memset(&cr->ece, 0, sizeof(cr->ece));
    ev->id->context = &cr->handle;
    fi->handle = &cr->handle;
    return fi;
err:
    fi_freeinfo(fi);
    free(cr);
    return NULL;
}

static int push_cm_entry(struct pmof_eq *eq, uint32_t event, fid_t fid, struct fi_info *info,
                         const uint8_t *data, size_t len) {
    // The entry's flexible data[] member gets room behind it: a byte buffer,
    // not a struct that puts a member after a flexible array.
    _Alignas(struct fi_eq_cm_entry) uint8_t buf[sizeof(struct fi_eq_cm_entry) + PMOF_CM_DATA_MAX];
    struct fi_eq_cm_entry *e = (struct fi_eq_cm_entry *)buf;

    e->fid = fid;
    e->info = info;
    if (len) memcpy(e->data, data, len);
    return pmof_eq_push(eq, event, buf, sizeof(*e) + len, false);
}

static int on_connect_request(struct pmof_eq *eq, struct pmof_pep *pep, struct rdma_cm_event *ev) {
    struct pmof_cm_hdr h;
    struct fi_info *info;
    int ret;

    cm_data_parse(&ev->param.conn, &h);
    info = connreq_info(pep, ev, &h);
    if (!info) {
        rdma_reject(ev->id, NULL, 0);
        rdma_destroy_id(ev->id);
        return -FI_ENOMEM;
    }
    ret = push_cm_entry(eq, FI_CONNREQ, &pep->pep_fid.fid, info, h.user, h.user_len);
    if (ret) {
        struct pmof_connreq *cr = container_of(info->handle, struct pmof_connreq, handle);
        rdma_reject(ev->id, NULL, 0);
        rdma_destroy_id(ev->id);
        free(cr);
        info->handle = NULL;
        fi_freeinfo(info);
    }
    return ret;
}

static int on_connect_response(struct pmof_eq *eq, struct pmof_ep *ep, struct rdma_cm_event *ev) {
    struct pmof_cm_hdr h;
    int ret;

    cm_data_parse(&ev->param.conn, &h);
    ep->peer_flags = h.flags;
    ece_from_reply(ep);
    ret = pmof_ep_qp_to_rts(ep);
    /* A peer that commits manually too answered with its control QP. */
    if (!ret && ep->mctl && (h.flags & PMOF_CM_COMMIT_MANUAL))
        ret = pmof_manual_connect(ep, h.ctl_qpn);
    if (ret || rdma_establish(ep->id)) {
        if (!ret) ret = pmof_errno(errno);
        ep->state = PMOF_EP_ERROR;
        pmof_ep_qp_to_error(ep);
        rdma_reject(ep->id, NULL, 0);
        return pmof_eq_push_error(eq, &ep->ep_fid.fid, ep->ep_fid.fid.context, -ret, 0, NULL, 0);
    }
    ep->state = PMOF_EP_CONNECTED;
    return push_cm_entry(eq, FI_CONNECTED, &ep->ep_fid.fid, NULL, h.user, h.user_len);
}

/* The connection will not come: posted receives are flushed to the CQ
 * (FI_ECANCELED) and the error reported on the EQ. */
static int ep_failed(struct pmof_eq *eq, struct pmof_ep *ep, int err, int prov_errno,
                     const void *data, size_t len) {
    ep->state = PMOF_EP_ERROR;
    pmof_ep_qp_to_error(ep);
    return pmof_eq_push_error(eq, &ep->ep_fid.fid, ep->ep_fid.fid.context, err, prov_errno, data,
                              len);
}

static int ep_event(struct pmof_eq *eq, struct pmof_ep *ep, struct rdma_cm_event *ev) {
    fid_t fid = &ep->ep_fid.fid;
    struct pmof_cm_hdr h;

    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        ep->resolved = true;
        if (rdma_resolve_route(ep->id, pmof_params.cm_timeout_ms))
            return ep_failed(eq, ep, errno, 0, NULL, 0);
        return 0;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        struct rdma_conn_param p;
        conn_param(ep, &p);
        if (rdma_connect(ep->id, &p)) return ep_failed(eq, ep, errno, 0, NULL, 0);
        return 0;
    }
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        return on_connect_response(eq, ep, ev);
    case RDMA_CM_EVENT_ESTABLISHED:
        /* The passive side, once the active side's RTU arrived. */
        if (ep->state == PMOF_EP_CONNECTED) return 0;
        ep->state = PMOF_EP_CONNECTED;
        cm_data_parse(&ev->param.conn, &h);
        return push_cm_entry(eq, FI_CONNECTED, fid, NULL, h.user, h.user_len);
    case RDMA_CM_EVENT_DISCONNECTED:
        if (ep->state != PMOF_EP_SHUTDOWN) {
            ep->state = PMOF_EP_SHUTDOWN;
            rdma_disconnect(ep->id);
        }
        return push_cm_entry(eq, FI_SHUTDOWN, fid, NULL, NULL, 0);
    case RDMA_CM_EVENT_REJECTED:
        cm_data_parse(&ev->param.conn, &h);
        return ep_failed(eq, ep, FI_ECONNREFUSED, ev->status, h.user, h.user_len);
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
        return ep_failed(eq, ep, ev->status == -ECONNREFUSED ? FI_ECONNREFUSED : FI_ETIMEDOUT,
                         -ev->status, NULL, 0);
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        return ep_failed(eq, ep, FI_ENODEV, 0, NULL, 0);
    default:
        return 0;
    }
}

ssize_t pmof_cm_dispatch(struct pmof_eq *eq, struct rdma_cm_event *ev) {
    struct fid *owner = ev->id->context;
    int ret = 0;

    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id) {
        struct fid *l = ev->listen_id->context;
        if (l && l->fclass == FI_CLASS_PEP)
            ret = on_connect_request(eq, container_of(l, struct pmof_pep, pep_fid.fid), ev);
        rdma_ack_cm_event(ev);
        return ret;
    }
    if (owner && owner->fclass == FI_CLASS_EP)
        ret = ep_event(eq, container_of(owner, struct pmof_ep, ep_fid.fid), ev);
    else if (owner && owner->fclass == FI_CLASS_CONNREQ && ev->event == RDMA_CM_EVENT_DISCONNECTED)
        ret = 0; /* a request the application never answered */
    rdma_ack_cm_event(ev);
    return ret;
}
