// SPDX-License-Identifier: MIT
//
// Completion queues and completion channels.
#include "nic.hpp"
#include "provider.h"
#include "sroce.hpp"

#include <cerrno>
#include <ctime>
#include <memory>
#include <sys/socket.h>
#include <unistd.h>

namespace sroce {
namespace {

uint64_t clock_ns(clockid_t clk) {
    timespec t;
    clock_gettime(clk, &t);
    return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

// Queues an event of `cq` (called with cq->mu held; channel->mu nests in it).
void channel_add(CompChannel *ch, Cq *cq) {
    std::lock_guard<std::mutex> g(ch->mu);
    if (cq->events_queued++) return;
    cq->next_event = nullptr;
    if (ch->last) {
        ch->last->next_event = cq;
    } else {
        ch->first = cq;
        // The queue was empty: the token goes in.
        char token = 1;
        (void)!send(ch->wr_fd, &token, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    ch->last = cq;
}

// Takes `cq` out of its channel's queue with all its events (ch->mu held).
void channel_remove(CompChannel *ch, Cq *cq) {
    if (!cq->events_queued) return;
    cq->events_queued = 0;
    Cq *prev = nullptr;
    for (Cq *c = ch->first; c != cq; c = c->next_event)
        prev = c;
    (prev ? prev->next_event : ch->first) = cq->next_event;
    if (ch->last == cq) ch->last = prev;
    if (!ch->first) {
        // Take the token back, unless a reader holds it: that reader finds
        // the queue empty and waits again.
        char token;
        (void)!recv(ch->ch.fd, &token, 1, MSG_DONTWAIT);
    }
}

} // namespace

bool Cq::push(const ibv_wc &wc, bool solicited, const ibv_wc_tm_info *t) {
    std::lock_guard<std::mutex> g(mu);
    uint32_t size = uint32_t(ring.size());
    if (count == size) {
        overflow = true;
        return false;
    }
    uint32_t slot = (head + count) % size;
    ring[slot] = wc;
    if (!ts.empty()) ts[slot] = clock_ns(CLOCK_MONOTONIC);
    if (!wallclock.empty()) wallclock[slot] = clock_ns(CLOCK_REALTIME);
    if (!tm.empty()) tm[slot] = t ? *t : ibv_wc_tm_info{};
    count++;
    if (armed && channel && (!solicited_only || solicited || wc.status != IBV_WC_SUCCESS)) {
        armed = false;
        channel_add(channel, this);
    }
    return true;
}

void Cq::forget_qp(uint32_t qp_num) {
    std::lock_guard<std::mutex> g(mu);
    uint32_t size = uint32_t(ring.size()), kept = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t from = (head + i) % size, to = (head + kept) % size;
        if (ring[from].qp_num == qp_num) continue;
        ring[to] = ring[from];
        if (!ts.empty()) ts[to] = ts[from];
        if (!wallclock.empty()) wallclock[to] = wallclock[from];
        if (!tm.empty()) tm[to] = tm[from];
        kept++;
    }
    count = kept;
}

namespace {

// The oldest completion; caller holds cq->mu and has checked count.
const ibv_wc &pop(Cq *cq) {
    const ibv_wc &wc = cq->ring[cq->head];
    cq->head = (cq->head + 1) % uint32_t(cq->ring.size());
    cq->count--;
    return wc;
}

int take(Cq *cq, int n, ibv_wc *wc) {
    std::lock_guard<std::mutex> g(cq->mu);
    int k = 0;
    while (k < n && cq->count)
        wc[k++] = pop(cq);
    return k;
}

// ibv_cq_ex polling: the current completion becomes the next one.
int advance(Cq *cq) {
    if (!cq->count) return ENOENT;
    if (!cq->ts.empty()) cq->cur_ts = cq->ts[cq->head];
    if (!cq->wallclock.empty()) cq->cur_wallclock = cq->wallclock[cq->head];
    if (!cq->tm.empty()) cq->cur_tm = cq->tm[cq->head];
    cq->cur = pop(cq);
    cq->cqx.wr_id = cq->cur.wr_id;
    cq->cqx.status = cq->cur.status;
    return 0;
}

int poll_cq(ibv_cq *ibcq, int n, ibv_wc *wc) {
    Cq *cq = to_cq(ibcq);
    int k = take(cq, n, wc);
    // An application polling an empty CQ is waiting for packets: receiving
    // them in this thread saves the progress thread's wake-up, which on a
    // busy machine can wait for a whole scheduler tick.
    if (!k && n > 0 && cq->ctx->nic->app_progress()) k = take(cq, n, wc);
    return k;
}

int req_notify_cq(ibv_cq *ibcq, int solicited_only) {
    Cq *cq = to_cq(ibcq);
    std::lock_guard<std::mutex> g(cq->mu);
    cq->armed = true;
    cq->solicited_only = solicited_only != 0;
    return 0;
}

// ibv_cq_ex polling: start_poll takes the CQ lock, end_poll releases it.
int start_poll(ibv_cq_ex *cqx, ibv_poll_cq_attr *attr) {
    if (attr && attr->comp_mask) return EINVAL;
    Cq *cq = reinterpret_cast<Cq *>(cqx);
    cq->mu.lock();
    if (!cq->count) {
        // Receive without the CQ lock: dispatching pushes to this CQ.
        cq->mu.unlock();
        if (!cq->ctx->nic->app_progress()) return ENOENT;
        cq->mu.lock();
    }
    int err = advance(cq);
    if (err) cq->mu.unlock(); // end_poll is not called after a failed start
    return err;
}

int next_poll(ibv_cq_ex *cqx) {
    return advance(reinterpret_cast<Cq *>(cqx));
}

void end_poll(ibv_cq_ex *cqx) {
    reinterpret_cast<Cq *>(cqx)->mu.unlock();
}

Cq *cur(ibv_cq_ex *c) {
    return reinterpret_cast<Cq *>(c);
}
ibv_wc_opcode read_opcode(ibv_cq_ex *c) {
    return cur(c)->cur.opcode;
}
uint32_t read_vendor_err(ibv_cq_ex *c) {
    return cur(c)->cur.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex *c) {
    return cur(c)->cur.byte_len;
}
__be32 read_imm_data(ibv_cq_ex *c) {
    return cur(c)->cur.imm_data;
}
uint32_t read_qp_num(ibv_cq_ex *c) {
    return cur(c)->cur.qp_num;
}
uint32_t read_src_qp(ibv_cq_ex *c) {
    return cur(c)->cur.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex *c) {
    return cur(c)->cur.wc_flags;
}
uint32_t read_slid(ibv_cq_ex *c) {
    return cur(c)->cur.slid;
}
uint8_t read_sl(ibv_cq_ex *c) {
    return cur(c)->cur.sl;
}
void read_tm_info(ibv_cq_ex *c, ibv_wc_tm_info *tm_info) {
    *tm_info = cur(c)->cur_tm;
}
uint8_t read_dlid_path_bits(ibv_cq_ex *c) {
    return cur(c)->cur.dlid_path_bits;
}
uint64_t read_completion_ts(ibv_cq_ex *c) {
    return cur(c)->cur_ts;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex *c) {
    return cur(c)->cur_wallclock;
}

Cq *make_cq(Context *ctx, int cqe, void *cq_context, ibv_comp_channel *channel) {
    if (cqe < 1 || uint32_t(cqe) > kMaxCqe) {
        errno = EINVAL;
        return nullptr;
    }
    if (channel && channel->context != &ctx->vctx.context) {
        errno = EINVAL;
        return nullptr;
    }
    Cq *cq = new Cq;
    cq->ctx = ctx;
    cq->ring.resize(size_t(cqe) + 1);
    ibv_cq_ex &x = cq->cqx;
    x.context = &ctx->vctx.context;
    x.channel = channel;
    x.cq_context = cq_context;
    x.cqe = cqe;
    pthread_mutex_init(&x.mutex, nullptr);
    pthread_cond_init(&x.cond, nullptr);
    x.start_poll = start_poll;
    x.next_poll = next_poll;
    x.end_poll = end_poll;
    x.read_opcode = read_opcode;
    x.read_vendor_err = read_vendor_err;
    x.read_byte_len = read_byte_len;
    x.read_imm_data = read_imm_data;
    x.read_qp_num = read_qp_num;
    x.read_src_qp = read_src_qp;
    x.read_wc_flags = read_wc_flags;
    x.read_slid = read_slid;
    x.read_sl = read_sl;
    x.read_dlid_path_bits = read_dlid_path_bits;
    cq->channel = reinterpret_cast<CompChannel *>(channel);
    if (channel) channel->refcnt++;
    return cq;
}

} // namespace

// Installed into each context's ops by verbs.cpp.
int cq_poll(ibv_cq *cq, int n, ibv_wc *wc) {
    return poll_cq(cq, n, wc);
}
int cq_req_notify(ibv_cq *cq, int solicited_only) {
    return req_notify_cq(cq, solicited_only);
}

ibv_cq_ex *create_cq_ex(ibv_context *ibctx, ibv_cq_init_attr_ex *attr) try {
    constexpr uint64_t kSupported =
        IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
        IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
        IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;
    // A CQ is only ever polled under its lock, so single-threaded use needs
    // nothing; overruns are always reported.
    constexpr uint32_t kFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    // Invalid sizes and vectors first: EINVAL whatever else is asked (as
    // the kernel checks them).
    if (attr->cqe < 1 || attr->cqe > kMaxCqe ||
        attr->comp_vector >= uint32_t(ibctx->num_comp_vectors)) {
        errno = EINVAL;
        return nullptr;
    }
    if (attr->wc_flags & ~kSupported || attr->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
        ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~kFlags))) {
        errno = EOPNOTSUPP;
        return nullptr;
    }
    Cq *cq = make_cq(to_ctx(ibctx), int(attr->cqe), attr->cq_context, attr->channel);
    if (!cq) return nullptr;
    if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) {
        cq->ts.resize(cq->ring.size());
        cq->cqx.read_completion_ts = read_completion_ts;
    }
    if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) {
        cq->wallclock.resize(cq->ring.size());
        cq->cqx.read_completion_wallclock_ns = read_completion_wallclock_ns;
    }
    if (attr->wc_flags & IBV_WC_EX_WITH_TM_INFO) {
        cq->tm.resize(cq->ring.size());
        cq->cqx.read_tm_info = read_tm_info;
    }
    return &cq->cqx;
} catch (const std::bad_alloc &) {
    return out_of_memory<ibv_cq_ex *>(nullptr);
}

} // namespace sroce

using namespace sroce;

extern "C" {

struct ibv_comp_channel *sroce_create_comp_channel(struct ibv_context *ctx) try {
    auto ch = std::make_unique<CompChannel>();
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0) return nullptr;
    ch->ch.context = ctx;
    ch->ch.fd = fds[0];
    ch->ch.refcnt = 0;
    ch->wr_fd = fds[1];
    return &ch.release()->ch;
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_comp_channel *>(nullptr);
}

int sroce_destroy_comp_channel(struct ibv_comp_channel *channel) {
    if (channel->refcnt) return EBUSY;
    auto *ch = reinterpret_cast<CompChannel *>(channel);
    close(ch->ch.fd);
    close(ch->wr_fd);
    delete ch;
    return 0;
}

struct ibv_cq *sroce_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                               struct ibv_comp_channel *channel, int comp_vector) try {
    if (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
        errno = EINVAL;
        return nullptr;
    }
    Cq *cq = make_cq(to_ctx(ctx), cqe, cq_context, channel);
    return cq ? reinterpret_cast<ibv_cq *>(&cq->cqx) : nullptr;
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_cq *>(nullptr);
}

int sroce_resize_cq(struct ibv_cq *ibcq, int cqe) try {
    Cq *cq = to_cq(ibcq);
    std::lock_guard<std::mutex> g(cq->mu);
    if (cqe < 1 || uint32_t(cqe) > kMaxCqe || uint32_t(cqe) < cq->count) return EINVAL;
    std::vector<ibv_wc> ring(size_t(cqe) + 1);
    std::vector<uint64_t> ts(cq->ts.empty() ? 0 : ring.size());
    std::vector<uint64_t> wallclock(cq->wallclock.empty() ? 0 : ring.size());
    std::vector<ibv_wc_tm_info> tm(cq->tm.empty() ? 0 : ring.size());
    uint32_t size = uint32_t(cq->ring.size());
    for (uint32_t i = 0; i < cq->count; i++) {
        uint32_t from = (cq->head + i) % size;
        ring[i] = cq->ring[from];
        if (!ts.empty()) ts[i] = cq->ts[from];
        if (!wallclock.empty()) wallclock[i] = cq->wallclock[from];
        if (!tm.empty()) tm[i] = cq->tm[from];
    }
    cq->ring.swap(ring);
    cq->tm.swap(tm);
    cq->ts.swap(ts);
    cq->wallclock.swap(wallclock);
    cq->head = 0;
    ibcq->cqe = cqe;
    return 0;
} catch (const std::bad_alloc &) {
    return ENOMEM;
}

int sroce_destroy_cq(struct ibv_cq *ibcq) {
    Cq *cq = to_cq(ibcq);
    cq->ctx->forget_events(ibcq);
    if (cq->channel) {
        // Events not yet taken go with the CQ, as uverbs drops them.
        std::scoped_lock g(cq->mu, cq->channel->mu);
        channel_remove(cq->channel, cq);
        cq->channel->ch.refcnt--;
    }
    pthread_mutex_destroy(&ibcq->mutex);
    pthread_cond_destroy(&ibcq->cond);
    delete cq;
    return 0;
}

int sroce_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) {
    auto *ch = reinterpret_cast<CompChannel *>(channel);
    for (;;) {
        // Blocks, or fails with EAGAIN, as the application set ch.fd.
        char token;
        if (read(ch->ch.fd, &token, 1) != 1) return -1;
        std::lock_guard<std::mutex> g(ch->mu);
        Cq *c = ch->first;
        if (!c) continue; // its CQ was destroyed: wait for the next token
        if (!--c->events_queued) {
            ch->first = c->next_event;
            if (!ch->first) ch->last = nullptr;
        }
        if (ch->first) (void)!send(ch->wr_fd, &token, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        *cq = reinterpret_cast<ibv_cq *>(&c->cqx);
        *cq_context = (*cq)->cq_context;
        return 0;
    }
}

void sroce_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
}

} // extern "C"
