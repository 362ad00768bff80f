// SPDX-License-Identifier: MIT
//
// Shared receive queues (basic and XRC), XRC domains and address handles:
// the objects a QP refers to for receive WQEs or destinations.
#include "nic.hpp"
#include "no_destructor.hpp"
#include "provider.h"
#include "transport.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <new>
#include <sys/stat.h>

namespace sroce {
namespace {

int check_srq_attr(const ibv_srq_attr &a) {
    if (a.max_wr == 0 || a.max_wr > kMaxWr || a.max_sge == 0 || a.max_sge > kMaxSge) return EINVAL;
    return 0;
}

Srq *make_srq(Context *ctx, Pd *pd, ibv_srq_attr &a, void *srq_context) {
    if (int err = check_srq_attr(a)) {
        errno = err;
        return nullptr;
    }
    // Its number comes from the address's slot, as a QP's does.
    if (int err = ctx->nic->ensure_socket()) {
        errno = err;
        return nullptr;
    }
    Srq *srq = new (std::nothrow) Srq;
    if (!srq) {
        errno = ENOMEM;
        return nullptr;
    }
    try {
        srq->rq.init(a.max_wr, a.max_sge);
    } catch (const std::bad_alloc &) {
        delete srq;
        errno = ENOMEM;
        return nullptr;
    }
    srq->ctx = ctx;
    srq->pd = pd;
    ibv_srq &s = srq->ibsrq;
    s.context = &ctx->vctx.context;
    s.srq_context = srq_context;
    s.pd = pd ? &pd->ibpd : nullptr;
    pthread_mutex_init(&s.mutex, nullptr);
    pthread_cond_init(&s.cond, nullptr);
    // The SRQ number names it in XRC packets; every SRQ has one.
    srq->srq_num = ctx->nic->add_srq(srq);
    if (!srq->srq_num) {
        delete srq;
        errno = ENOMEM;
        return nullptr;
    }
    s.handle = srq->srq_num;
    // The limit given at creation is not armed (ibv_create_srq(3)).
    a.srq_limit = 0;
    return srq;
}

// XRC domains opened on a file are shared by every open of that file in the
// process; the kernel shares them between processes too, which a user-space
// device cannot.
struct InodeKey {
    dev_t dev;
    ino_t ino;
    auto operator<=>(const InodeKey &) const = default;
};
using XrcdFiles = std::map<std::pair<Context *, InodeKey>, std::pair<Xrcd *, int>>;
std::mutex g_xrcd_mu;
// Never destroyed (no_destructor.hpp): other threads may open and close
// domains while exit() runs.
XrcdFiles &xrcd_files() noexcept {
    static NoDestructor<XrcdFiles> m;
    return *m;
}

} // namespace

ibv_srq *create_srq_ex(ibv_context *ibctx, ibv_srq_init_attr_ex *attr) try {
    constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                                IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
                                IBV_SRQ_INIT_ATTR_TM;
    if (attr->comp_mask & ~kKnown) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    ibv_srq_type type =
        (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
    if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ibctx) {
        errno = EINVAL;
        return nullptr;
    }
    bool xrc = type == IBV_SRQT_XRC;
    if (xrc && (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd ||
                attr->xrcd->context != ibctx || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ||
                !attr->cq || attr->cq->context != ibctx)) {
        errno = EINVAL;
        return nullptr;
    }
    bool tm = type == IBV_SRQT_TM;
    if (tm &&
        (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TM) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ||
         !attr->cq || attr->cq->context != ibctx || !attr->tm_cap.max_num_tags ||
         attr->tm_cap.max_num_tags > kMaxTmTags || attr->tm_cap.max_ops > kMaxTmTags)) {
        errno = EINVAL;
        return nullptr;
    }
    Srq *srq = make_srq(to_ctx(ibctx), pd_root(attr->pd), attr->attr, attr->srq_context);
    if (!srq) return nullptr;
    srq->type = type;
    if (tm) {
        srq->tags.resize(attr->tm_cap.max_num_tags);
        srq->cq = to_cq(attr->cq);
    }
    if (xrc) {
        srq->xrcd = reinterpret_cast<Xrcd *>(attr->xrcd);
        srq->xrcd->refs++;
        srq->cq = to_cq(attr->cq);
    }
    return &srq->ibsrq;
} catch (const std::bad_alloc &) {
    return out_of_memory<ibv_srq *>(nullptr);
}

int srq_num(ibv_srq *ibsrq, uint32_t *num) {
    Srq *srq = to_srq(ibsrq);
    if (srq->type != IBV_SRQT_XRC) return EOPNOTSUPP;
    *num = srq->srq_num;
    return 0;
}

// ibv_post_srq_ops(): the tag list of a tag-matching SRQ.  Each operation
// takes effect at once, so its completion (when signaled) is pushed here.
int post_srq_ops(ibv_srq *ibsrq, ibv_ops_wr *op, ibv_ops_wr **bad_op) {
    Srq *srq = to_srq(ibsrq);
    if (srq->type != IBV_SRQT_TM) {
        *bad_op = op;
        return EINVAL;
    }
    std::lock_guard<std::mutex> g(srq->mu);
    for (; op; op = op->next) {
        ibv_wc wc{};
        wc.wr_id = op->wr_id;
        switch (op->opcode) {
        case IBV_WR_TAG_ADD: {
            auto it = std::find_if(srq->tags.begin(), srq->tags.end(),
                                   [](const Srq::Tag &t) { return !t.valid; });
            if (it == srq->tags.end() || op->tm.add.num_sge > 1 ||
                (op->tm.add.num_sge && !op->tm.add.sg_list)) {
                *bad_op = op;
                return it == srq->tags.end() ? ENOMEM : EINVAL;
            }
            Srq::Tag t;
            if (op->tm.add.num_sge) {
                const ibv_sge &s = op->tm.add.sg_list[0];
                uint8_t *host = check_lkey(srq->ctx->nic, srq->pd, s, IBV_ACCESS_LOCAL_WRITE);
                if (!host && s.length) {
                    *bad_op = op;
                    return EINVAL;
                }
                t.sge = {uintptr_t(host), s.length, s.lkey};
            }
            t.valid = true;
            t.tag = op->tm.add.tag;
            t.mask = op->tm.add.mask;
            t.wr_id = op->tm.add.recv_wr_id;
            *it = t;
            op->tm.handle = uint32_t(it - srq->tags.begin());
            wc.opcode = IBV_WC_TM_ADD;
            break;
        }
        case IBV_WR_TAG_DEL:
            if (op->tm.handle >= srq->tags.size() || !srq->tags[op->tm.handle].valid) {
                *bad_op = op;
                return EINVAL;
            }
            srq->tags[op->tm.handle].valid = false;
            wc.opcode = IBV_WC_TM_DEL;
            break;
        case IBV_WR_TAG_SYNC:
            // Software has caught up with the unexpected messages it counts.
            wc.opcode = IBV_WC_TM_SYNC;
            break;
        default:
            *bad_op = op;
            return EINVAL;
        }
        if (op->flags & IBV_OPS_SIGNALED) srq->cq->push(wc, false);
    }
    return 0;
}

int post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    Srq *srq = to_srq(ibsrq);
    std::lock_guard<std::mutex> g(srq->mu);
    return srq->rq.post(wr, bad_wr);
}

ibv_xrcd *open_xrcd(ibv_context *ibctx, ibv_xrcd_init_attr *attr) try {
    constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if ((attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
        (attr->oflags & ~(O_CREAT | O_EXCL))) {
        errno = EINVAL;
        return nullptr;
    }
    int fd = (attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) ? attr->fd : -1;
    Context *ctx = to_ctx(ibctx);
    auto make = [ibctx]() -> Xrcd * {
        Xrcd *x = new (std::nothrow) Xrcd;
        if (!x) {
            errno = ENOMEM;
            return nullptr;
        }
        x->ibxrcd.context = ibctx;
        return x;
    };
    if (fd < 0) {
        // A private domain must be created, as the kernel requires.
        if (!(attr->oflags & O_CREAT)) {
            errno = EINVAL;
            return nullptr;
        }
        Xrcd *x = make();
        return x ? &x->ibxrcd : nullptr;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) return nullptr; // errno from fstat (EBADF)
    std::lock_guard<std::mutex> g(g_xrcd_mu);
    XrcdFiles &files = xrcd_files();
    auto key = std::make_pair(ctx, InodeKey{st.st_dev, st.st_ino});
    auto it = files.find(key);
    if (it != files.end()) {
        if ((attr->oflags & O_CREAT) && (attr->oflags & O_EXCL)) {
            errno = EEXIST;
            return nullptr;
        }
        it->second.second++;
        return &it->second.first->ibxrcd;
    }
    if (!(attr->oflags & O_CREAT)) {
        errno = ENOENT;
        return nullptr;
    }
    Xrcd *x = make();
    if (!x) return nullptr;
    files[key] = {x, 1};
    return &x->ibxrcd;
} catch (const std::bad_alloc &) {
    return out_of_memory<ibv_xrcd *>(nullptr);
}

int close_xrcd(ibv_xrcd *ibxrcd) {
    Xrcd *x = reinterpret_cast<Xrcd *>(ibxrcd);
    std::lock_guard<std::mutex> g(g_xrcd_mu);
    XrcdFiles &files = xrcd_files();
    for (auto it = files.begin(); it != files.end(); ++it) {
        if (it->second.first != x) continue;
        if (it->second.second > 1) {
            it->second.second--;
            return 0;
        }
        if (x->refs.load()) return EBUSY;
        files.erase(it);
        delete x;
        return 0;
    }
    if (x->refs.load()) return EBUSY;
    delete x;
    return 0;
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_srq *sroce_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr) try {
    Srq *srq = make_srq(to_ctx(pd->context), pd_root(pd), attr->attr, attr->srq_context);
    return srq ? &srq->ibsrq : nullptr;
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_srq *>(nullptr);
}

int sroce_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask) try {
    Srq *srq = to_srq(ibsrq);
    if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
    std::lock_guard<std::mutex> g(srq->mu);
    RecvQueue &q = srq->rq;
    uint32_t max_wr = q.max_wr;
    if (mask & IBV_SRQ_MAX_WR) {
        // Resizing keeps the posted WQEs; it cannot drop below them.
        if (attr->max_wr == 0 || attr->max_wr > kMaxWr || attr->max_wr < q.size()) return EINVAL;
        max_wr = attr->max_wr;
    }
    if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > max_wr) return EINVAL;
    if (max_wr != q.max_wr) {
        RecvQueue n;
        try {
            n.init(max_wr, q.max_sge);
        } catch (const std::bad_alloc &) {
            return ENOMEM;
        }
        for (uint32_t i = q.tail; i != q.head; i++) {
            RecvWqe w = q.wqe[i % q.max_wr];
            RecvWqe &d = n.wqe[n.head % n.max_wr];
            d = w;
            d.sge = &n.sge[size_t(n.head % n.max_wr) * n.max_sge];
            std::copy_n(w.sge, w.num_sge, d.sge);
            n.head++;
        }
        q = std::move(n);
    }
    if (mask & IBV_SRQ_LIMIT) srq->limit = attr->srq_limit;
    return 0;
} catch (const std::bad_alloc &) {
    return ENOMEM;
}

int sroce_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr) {
    Srq *srq = to_srq(ibsrq);
    std::lock_guard<std::mutex> g(srq->mu);
    attr->max_wr = srq->rq.max_wr;
    attr->max_sge = srq->rq.max_sge;
    attr->srq_limit = srq->limit;
    return 0;
}

int sroce_destroy_srq(struct ibv_srq *ibsrq) {
    Srq *srq = to_srq(ibsrq);
    if (srq->users.load()) return EBUSY;
    Nic *nic = srq->ctx->nic;
    {
        std::lock_guard<std::mutex> g(nic->objects_mu);
        nic->remove_srq(srq);
        // An XRC receive QP is no user of an SRQ, but may be in the middle
        // of a message whose WQE it took from this one: that WQE goes with it.
        nic->for_each_qp([srq](Qp *qp) {
            std::lock_guard<std::mutex> q(qp->mu);
            if (qp->resp.recv_taken && qp->resp.recv_srq == srq) {
                qp->resp.recv_taken = false;
                qp->resp.recv_srq = nullptr;
                qp->resp.in_msg = 0;
            }
        });
    }
    srq->ctx->forget_events(ibsrq);
    if (srq->xrcd) srq->xrcd->refs--;
    pthread_mutex_destroy(&ibsrq->mutex);
    pthread_cond_destroy(&ibsrq->cond);
    delete srq;
    return 0;
}

struct ibv_ah *sroce_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr) {
    // RoCE addresses are global: the GRH names the destination GID, an
    // IPv6 address or an IPv4-mapped one, of the port's family.
    IpAddr addr, src;
    const Device *dev = to_ctx(pd->context)->dev;
    if (!attr->is_global || attr->port_num != 1 || path_addrs(*dev, attr->grh, &src, &addr)) {
        errno = EINVAL;
        return nullptr;
    }
    Ah *ah = new (std::nothrow) Ah;
    if (!ah) {
        errno = ENOMEM;
        return nullptr;
    }
    ah->attr = *attr;
    ah->attr.grh.flow_label &= 0xFFFFF; // 20 bits, as RNICs take it
    ah->addr = addr;
    ah->src = src;
    ah->ibah.context = pd->context;
    ah->ibah.pd = pd;
    static std::atomic<uint32_t> handles{1};
    ah->ibah.handle = handles++;
    return &ah->ibah;
}

int sroce_destroy_ah(struct ibv_ah *ah) {
    delete reinterpret_cast<Ah *>(ah);
    return 0;
}

} // extern "C"
