// SPDX-License-Identifier: MIT
//
// Memory windows, types 1 and 2 (IBTA 10.6.7): allocation, binding by
// ibv_bind_mw() (type 1) or a BIND_MW work request (type 2), invalidation by
// LOCAL_INV or a remote SEND WITH INVALIDATE (type 2), and the remote-access
// check that every rkey, of an MR or a window, goes through.
#include "nic.hpp"
#include "provider.h"
#include "transport.hpp"

#include <cerrno>
#include <new>

namespace sroce {
namespace {

Mw *window_of(Mr *entry) {
    return entry->window;
}

// Local write means nothing for a window; applications pass it anyway.
constexpr unsigned kWindowAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
                                   IBV_ACCESS_ZERO_BASED;

// Takes the window out of service; caller holds mw->mu.  A message in
// progress through it learns of it from the key table's epoch.
void unbind(Nic *nic, Mw *mw) {
    if (mw->bound && mw->parent) mw->parent->windows--;
    mw->bound = false;
    mw->parent = nullptr;
    mw->qp = nullptr;
    nic->mrs.changed();
}

} // namespace

Mr *window_parent(Mw *mw) {
    std::lock_guard<std::mutex> g(mw->mu);
    return mw->bound ? mw->parent : nullptr;
}

uint8_t *remote_access(Qp *qp, Pd *pd, uint32_t rkey, uint64_t va, uint64_t len, unsigned access,
                       Mr **mr) {
    Mr *e = qp->nic->mrs.lookup(rkey);
    if (!e || e->pd != pd) return nullptr;
    Mw *w = window_of(e);
    if (!w) {
        *mr = e;
        return mr_range(e, va, len, access);
    }
    std::lock_guard<std::mutex> g(w->mu);
    if (!w->bound || (w->ibmw.type == IBV_MW_TYPE_2 && w->qp != qp)) return nullptr;
    if ((w->access & access) != access) return nullptr;
    // A zero-based window is addressed from 0, others in the MR's space.
    uint64_t base = (w->access & IBV_ACCESS_ZERO_BASED) ? 0 : w->va;
    if (va < base || va - base > w->length || len > w->length - (va - base)) return nullptr;
    // The window, not the MR, grants the remote access.
    *mr = w->parent;
    return mr_range(w->parent, w->va + (va - base), len, 0);
}

ibv_wc_status mw_bind(Qp *qp, const SendWqe &wqe) {
    Mw *mw = wqe.mw;
    const ibv_mw_bind_info &b = wqe.bind;
    Pd *pd = qp->pd;
    // Still the MR the bind was posted with, or none: a bind queued behind
    // other work may run after the MR is gone (then it fails, as below).
    Mr *mr = b.mr ? qp->nic->mrs.lookup(wqe.bind_key) : nullptr;
    if (mr != reinterpret_cast<Mr *>(b.mr)) mr = nullptr;
    if (mw->entry.pd != pd || (b.mw_access_flags & ~kWindowAccess)) return IBV_WC_MW_BIND_ERR;
    // A bind may change only the consumer key of the window's rkey.
    if ((wqe.mw_rkey >> 8) != (mw->entry.key.load() >> 8)) return IBV_WC_MW_BIND_ERR;
    if (b.length) {
        if (!mr || mr->window || mr->pd != pd || !(mr->access & IBV_ACCESS_MW_BIND) ||
            !mr_range(mr, b.addr, b.length, 0))
            return IBV_WC_MW_BIND_ERR;
        // Remote write or atomic access through a window needs local write
        // access to the MR (IBTA 10.6.7.2.2).
        if ((b.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
            !(mr->access & IBV_ACCESS_LOCAL_WRITE))
            return IBV_WC_MW_BIND_ERR;
    }
    std::lock_guard<std::mutex> g(mw->mu);
    bool type2 = mw->ibmw.type == IBV_MW_TYPE_2;
    // A type 2 window must be invalidated before it is bound again.
    if (type2 && mw->bound) return IBV_WC_MW_BIND_ERR;
    unbind(qp->nic, mw);
    // A type 1 window bound with length 0 is the way to invalidate it.
    mw->bound = b.length || type2;
    if (mw->bound && mr) {
        mw->parent = mr;
        mr->windows++;
    } else {
        mw->bound = false;
    }
    mw->va = b.addr;
    mw->length = b.length;
    mw->access = b.mw_access_flags;
    mw->qp = type2 ? qp : nullptr;
    mw->entry.key.store(wqe.mw_rkey, std::memory_order_release);
    mw->ibmw.rkey = wqe.mw_rkey;
    return IBV_WC_SUCCESS;
}

// Invalidates the type 2 window `rkey` names, which must belong to `pd` (the
// QP's, or for an XRC receive QP the named SRQ's).  0 or an errno.
int invalidate_window(Qp *qp, Pd *pd, uint32_t rkey) {
    Mr *e = qp->nic->mrs.lookup(rkey);
    Mw *mw = e ? window_of(e) : nullptr;
    if (!mw || e->pd != pd) return EINVAL;
    std::lock_guard<std::mutex> g(mw->mu);
    if (mw->ibmw.type != IBV_MW_TYPE_2 || !mw->bound) return EINVAL;
    unbind(qp->nic, mw);
    return 0;
}

ibv_wc_status mw_local_invalidate(Qp *qp, uint32_t rkey) {
    return invalidate_window(qp, qp->pd, rkey) ? IBV_WC_LOC_QP_OP_ERR : IBV_WC_SUCCESS;
}

int invalidate_rkey(Qp *qp, Pd *pd, uint32_t rkey) {
    return invalidate_window(qp, pd, rkey);
}

void unbind_windows_of(Qp *qp) {
    qp->nic->mrs.for_each([qp](Mr *e) {
        if (Mw *w = window_of(e)) {
            std::lock_guard<std::mutex> g(w->mu);
            if (w->qp == qp) unbind(qp->nic, w);
        }
    });
}

ibv_mw *alloc_mw(ibv_pd *pd, ibv_mw_type type) try {
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
        errno = EINVAL;
        return nullptr;
    }
    Mw *mw = new (std::nothrow) Mw;
    if (!mw) {
        errno = ENOMEM;
        return nullptr;
    }
    mw->entry.pd = pd_root(pd);
    mw->entry.window = mw;
    if (!to_ctx(pd->context)->nic->mrs.insert(&mw->entry)) {
        delete mw;
        errno = ENOMEM;
        return nullptr;
    }
    ibv_mw &m = mw->ibmw;
    m.context = pd->context;
    m.pd = pd;
    m.type = type;
    m.rkey = mw->entry.key.load();
    m.handle = m.rkey;
    return &m;
} catch (const std::bad_alloc &) {
    return out_of_memory<ibv_mw *>(nullptr);
}

int dealloc_mw(ibv_mw *ibmw) {
    Mw *mw = reinterpret_cast<Mw *>(ibmw);
    Nic *nic = to_ctx(ibmw->context)->nic;
    {
        // Wait until the progress thread is not between lookup and use.
        std::lock_guard<std::mutex> g(nic->objects_mu);
        // A bind still waiting on a send queue would find the window gone.
        bool queued = false;
        nic->for_each_qp([mw, &queued](Qp *qp) {
            std::lock_guard<std::mutex> q(qp->mu);
            for (uint32_t i = qp->req.cur; i != qp->sq.head && !queued; i++)
                queued = qp->sq.at(i).opcode == IBV_WR_BIND_MW && qp->sq.at(i).mw == mw;
        });
        if (queued) return EBUSY;
        nic->mrs.erase(&mw->entry);
    }
    {
        std::lock_guard<std::mutex> g(mw->mu);
        unbind(nic, mw);
    }
    delete mw;
    return 0;
}

// ibv_bind_mw(): a type 1 bind, posted on the QP's send queue like any work
// request; the window's consumer key advances.
int bind_mw(ibv_qp *ibqp, ibv_mw *ibmw, ibv_mw_bind *mb) {
    if (ibmw->type != IBV_MW_TYPE_1 || ibmw->context != ibqp->context) return EINVAL;
    if (mb->bind_info.mr && mb->bind_info.mr->context != ibqp->context) return EINVAL;
    // The new rkey becomes the window's when the bind is carried out.
    uint32_t rkey = ibv_inc_rkey(ibmw->rkey);
    return req_post_local(to_qp(ibqp), IBV_WR_BIND_MW, mb->wr_id, unsigned(mb->send_flags),
                          reinterpret_cast<Mw *>(ibmw), rkey, &mb->bind_info);
}

} // namespace sroce
