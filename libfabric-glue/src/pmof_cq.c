/* SPDX-License-Identifier: MIT */
/*
 * Completion queues over verbs CQs.  Verbs completions are translated into
 * a ring when the application reads (or a counter progresses), which also
 * holds completions the provider makes itself (FI_COMMIT_MANUAL commits)
 * and keeps errors in order: fi_cq_read stops at an error with -FI_EAVAIL
 * until fi_cq_readerr takes it.
 */
#include "pmof.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define CQ_POLL_BATCH 16

static struct pmof_cq_entry *ring_at(struct pmof_cq *cq, size_t i) {
    return &cq->ring[(cq->ring_head + i) % cq->ring_size];
}

static int ring_grow(struct pmof_cq *cq) {
    size_t n = cq->ring_size * 2;
    struct pmof_cq_entry *r = malloc(n * sizeof(*r));

    if (!r) return -FI_ENOMEM;
    for (size_t i = 0; i < cq->ring_count; i++)
        r[i] = *ring_at(cq, i);
    free(cq->ring);
    cq->ring = r;
    cq->ring_size = n;
    cq->ring_head = 0;
    return 0;
}

static int ring_add(struct pmof_cq *cq, const struct pmof_cq_entry *e) {
    if (cq->ring_count == cq->ring_size) {
        int ret = ring_grow(cq);
        if (ret) return ret;
    }
    *ring_at(cq, cq->ring_count++) = *e;
    return 0;
}

/* Wakes whoever waits on the CQ; its eventfd exists once someone has. */
static void cq_kick(struct pmof_cq *cq) {
    uint64_t one = 1;
    int fd = atomic_load(&cq->wake_fd);

    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
        /* The counter is full: a wake-up is pending anyway. */
    }
}

int pmof_cq_push(struct pmof_cq *cq, const struct pmof_cq_entry *e) {
    int ret = 0;

    pthread_mutex_lock(&cq->soft_lock);
    if (cq->soft_count == cq->soft_cap) {
        size_t n = cq->soft_cap ? cq->soft_cap * 2 : 16;
        struct pmof_cq_entry *t = realloc(cq->soft, n * sizeof(*t));
        if (t) {
            cq->soft = t;
            cq->soft_cap = n;
        } else {
            ret = -FI_ENOMEM;
        }
    }
    if (!ret) {
        cq->soft[cq->soft_count] = *e;
        __atomic_store_n(&cq->soft_count, cq->soft_count + 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&cq->soft_lock);
    if (!ret) cq_kick(cq);
    return ret;
}

/* Moves the provider's own entries into the ring (lock held). */
static int soft_drain(struct pmof_cq *cq) {
    int ret = 0;
    size_t i = 0;

    if (!__atomic_load_n(&cq->soft_count, __ATOMIC_RELAXED)) return 0;
    pthread_mutex_lock(&cq->soft_lock);
    for (; i < cq->soft_count && !ret; i++)
        ret = ring_add(cq, &cq->soft[i]);
    if (ret) i--;
    memmove(cq->soft, cq->soft + i, (cq->soft_count - i) * sizeof(*cq->soft));
    __atomic_store_n(&cq->soft_count, cq->soft_count - i, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&cq->soft_lock);
    return ret;
}

int pmof_cq_add_hook(struct pmof_cq *cq, struct pmof_rdm *rdm) {
    size_t n;
    int ret = 0;

    pthread_rwlock_wrlock(&cq->hooks_lock);
    n = atomic_load(&cq->nhooks);
    for (size_t i = 0; i < n; i++)
        if (cq->hooks[i] == rdm) goto out;
    if (n == cq->hooks_cap) {
        size_t cap = cq->hooks_cap ? 2 * cq->hooks_cap : 4;
        struct pmof_rdm **t = realloc(cq->hooks, cap * sizeof(*t));
        if (!t) {
            ret = -FI_ENOMEM;
            goto out;
        }
        cq->hooks = t;
        cq->hooks_cap = cap;
    }
    cq->hooks[n] = rdm;
    atomic_store(&cq->nhooks, n + 1);
out:
    pthread_rwlock_unlock(&cq->hooks_lock);
    return ret;
}

void pmof_cq_del_hook(struct pmof_cq *cq, struct pmof_rdm *rdm) {
    size_t n;

    pthread_rwlock_wrlock(&cq->hooks_lock);
    n = atomic_load(&cq->nhooks);
    for (size_t i = 0; i < n; i++) {
        if (cq->hooks[i] != rdm) continue;
        cq->hooks[i] = cq->hooks[n - 1];
        atomic_store(&cq->nhooks, n - 1);
        break;
    }
    pthread_rwlock_unlock(&cq->hooks_lock);
}

void pmof_cq_wake(struct pmof_cq *cq) {
    cq_kick(cq);
}

/* Work that completions left for endpoints reading this CQ (CQ lock not
 * held: the work posts, and posting may poll).  A CQ no tagged endpoint
 * uses takes no lock. */
static void run_hooks(struct pmof_cq *cq) {
    if (!atomic_load(&cq->nhooks)) return;
    pthread_rwlock_rdlock(&cq->hooks_lock);
    for (size_t i = 0; i < atomic_load(&cq->nhooks); i++)
        pmof_tagged_progress(cq->hooks[i]);
    pthread_rwlock_unlock(&cq->hooks_lock);
}

static bool hooks_pending(struct pmof_cq *cq) {
    bool pending = false;

    if (!atomic_load(&cq->nhooks)) return false;
    pthread_rwlock_rdlock(&cq->hooks_lock);
    for (size_t i = 0; i < atomic_load(&cq->nhooks) && !pending; i++)
        pending = pmof_tagged_has_work(cq->hooks[i]);
    pthread_rwlock_unlock(&cq->hooks_lock);
    return pending;
}

void pmof_cq_run_hooks(struct pmof_cq *cq) {
    run_hooks(cq);
}

/* Translates verbs completions into the ring (lock held). */
static int cq_poll_locked(struct pmof_cq *cq) {
    struct ibv_wc wc[CQ_POLL_BATCH];
    int n;

    if (soft_drain(cq)) return -FI_ENOMEM;
    do {
        n = ibv_poll_cq(cq->ibv, CQ_POLL_BATCH, wc);
        if (n < 0) return -FI_EIO;
        for (int i = 0; i < n; i++) {
            struct pmof_op *op = (struct pmof_op *)(uintptr_t)wc[i].wr_id;
            struct pmof_cq_entry e;
            struct pmof_cntr *cntr = NULL;
            bool report;

            if (!op) continue;
            report = op->rdm ? pmof_rdm_complete(op->rdm, &wc[i], &e, &cntr)
                             : pmof_ep_complete(op->ep, &wc[i], &e, &cntr);
            if (cntr) {
                if (wc[i].status == IBV_WC_SUCCESS)
                    pmof_cntr_inc(cntr);
                else
                    pmof_cntr_err(cntr);
            }
            if (report && ring_add(cq, &e)) return -FI_ENOMEM;
        }
    } while (n == CQ_POLL_BATCH);
    return 0;
}

int pmof_cq_progress(struct pmof_cq *cq) {
    int ret;

    pmof_lock(&cq->lock);
    ret = cq_poll_locked(cq);
    pmof_unlock(&cq->lock);
    return ret;
}

static void write_entry(struct pmof_cq *cq, void *buf, size_t i, const struct pmof_cq_entry *e) {
    switch (cq->format) {
    case FI_CQ_FORMAT_CONTEXT: {
        struct fi_cq_entry *o = (struct fi_cq_entry *)buf + i;
        o->op_context = e->op_context;
        break;
    }
    case FI_CQ_FORMAT_MSG: {
        struct fi_cq_msg_entry *o = (struct fi_cq_msg_entry *)buf + i;
        o->op_context = e->op_context;
        o->flags = e->flags;
        o->len = e->len;
        break;
    }
    case FI_CQ_FORMAT_DATA: {
        struct fi_cq_data_entry *o = (struct fi_cq_data_entry *)buf + i;
        o->op_context = e->op_context;
        o->flags = e->flags;
        o->len = e->len;
        o->buf = e->buf;
        o->data = e->data;
        break;
    }
    default: {
        struct fi_cq_tagged_entry *o = (struct fi_cq_tagged_entry *)buf + i;
        o->op_context = e->op_context;
        o->flags = e->flags;
        o->len = e->len;
        o->buf = e->buf;
        o->data = e->data;
        o->tag = e->tag;
        break;
    }
    }
}

static ssize_t cq_readfrom(struct fid_cq *cq_fid, void *buf, size_t count, fi_addr_t *src_addr) {
    struct pmof_cq *cq = container_of(cq_fid, struct pmof_cq, cq_fid);
    size_t n = 0;
    int ret;

    if (!buf && count) return -FI_EINVAL;
    run_hooks(cq);
    pmof_lock(&cq->lock);
    if (cq->ring_count < count) {
        ret = cq_poll_locked(cq);
        if (ret && !cq->ring_count) {
            pmof_unlock(&cq->lock);
            return ret;
        }
    }
    while (n < count && cq->ring_count) {
        const struct pmof_cq_entry *e = ring_at(cq, 0);
        if (e->err) break;
        write_entry(cq, buf, n, e);
        if (src_addr) src_addr[n] = e->src_addr;
        cq->ring_head = (cq->ring_head + 1) % cq->ring_size;
        cq->ring_count--;
        n++;
    }
    if (!n) {
        /* Only an error at the head is -FI_EAVAIL (count 0 reads none). */
        ssize_t r = cq->ring_count && ring_at(cq, 0)->err ? -FI_EAVAIL : -FI_EAGAIN;
        pmof_unlock(&cq->lock);
        return r;
    }
    pmof_unlock(&cq->lock);
    return (ssize_t)n;
}

static ssize_t cq_read(struct fid_cq *cq_fid, void *buf, size_t count) {
    return cq_readfrom(cq_fid, buf, count, NULL);
}

static ssize_t cq_readerr(struct fid_cq *cq_fid, struct fi_cq_err_entry *buf, uint64_t flags) {
    struct pmof_cq *cq = container_of(cq_fid, struct pmof_cq, cq_fid);
    const struct pmof_cq_entry *e;

    (void)flags;
    if (!buf) return -FI_EINVAL;
    run_hooks(cq);
    pmof_lock(&cq->lock);
    if (!cq->ring_count) cq_poll_locked(cq);
    if (!cq->ring_count || !ring_at(cq, 0)->err) {
        pmof_unlock(&cq->lock);
        return -FI_EAGAIN;
    }
    e = ring_at(cq, 0);
    buf->op_context = e->op_context;
    buf->flags = e->flags;
    buf->len = e->len;
    buf->buf = e->buf;
    buf->data = e->data;
    buf->tag = e->tag;
    buf->olen = e->olen;
    buf->err = e->err;
    buf->prov_errno = e->prov_errno;
    /* No error data: err_data_size is both the caller's buffer size
     * (libfabric >= 1.5) and what was written. */
    if (cq->dom->fab->err_data_size) buf->err_data_size = 0;
    cq->last_err = *e;
    cq->ring_head = (cq->ring_head + 1) % cq->ring_size;
    cq->ring_count--;
    pmof_unlock(&cq->lock);
    return 1;
}

/* Takes the domain channel's events, each waking its CQ (chan_lock held).
 * Acknowledged at once: a CQ may close as soon as the lock is free. */
static void take_events_locked(struct pmof_domain *dom) {
    struct ibv_cq *evcq;
    void *evctx;

    while (ibv_get_cq_event(dom->channel, &evcq, &evctx) == 0) {
        ibv_ack_cq_events(evcq, 1);
        cq_kick(evctx);
    }
}

static void take_events(struct pmof_domain *dom) {
    pthread_mutex_lock(&dom->chan_lock);
    take_events_locked(dom);
    pthread_mutex_unlock(&dom->chan_lock);
}

/* The CQ's eventfd, made by the first wait; a descriptor or -FI_E*. */
static int cq_wake_fd(struct pmof_cq *cq) {
    int fd = atomic_load(&cq->wake_fd);

    if (fd >= 0) return fd;
    pthread_mutex_lock(&cq->wait_lock);
    fd = atomic_load(&cq->wake_fd);
    if (fd < 0) {
        fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0)
            fd = pmof_errno(errno);
        else
            atomic_store(&cq->wake_fd, fd);
    }
    pthread_mutex_unlock(&cq->wait_lock);
    return fd;
}

/* FI_GETWAIT's descriptor: an epoll set of the domain's channel and the
 * CQ's eventfd, made on first request; a descriptor or -FI_E*. */
static int cq_epfd(struct pmof_cq *cq) {
    int wake = cq_wake_fd(cq), ep, ret;

    if (wake < 0) return wake;
    pthread_mutex_lock(&cq->wait_lock);
    ret = cq->epfd;
    if (ret < 0) {
        ep = epoll_create1(EPOLL_CLOEXEC);
        ret = ep < 0 ? pmof_errno(errno) : pmof_epoll_add(ep, cq->dom->channel->fd);
        if (!ret) ret = pmof_epoll_add(ep, wake);
        if (ret && ep >= 0) close(ep);
        if (!ret) ret = cq->epfd = ep;
    }
    pthread_mutex_unlock(&cq->wait_lock);
    return ret;
}

/* Arms the verbs CQ for the wait object; -FI_EAGAIN if completions are
 * already there (the application must read before it waits). */
int pmof_cq_trywait(struct pmof_cq *cq) {
    uint64_t v;
    int ret, fd;

    if (!cq->waitable) return -FI_EINVAL;
    fd = cq_wake_fd(cq);
    if (fd < 0) return fd;
    /* Other CQs' events wake them; this one's, like a software entry or a
     * signal, is what the wake-up read here announced, looked at below. */
    take_events(cq->dom);
    if (read(fd, &v, sizeof(v)) < 0) {
        /* Nothing pending. */
    }
    if (atomic_load(&cq->signalled)) return -FI_EAGAIN;
    pmof_lock(&cq->lock);
    if (cq->ring_count) {
        ret = -FI_EAGAIN;
        goto out;
    }
    if (ibv_req_notify_cq(cq->ibv, 0)) {
        ret = -FI_EIO;
        goto out;
    }
    ret = cq_poll_locked(cq);
    if (!ret && cq->ring_count) ret = -FI_EAGAIN;
out:
    pmof_unlock(&cq->lock);
    /* Completions may have left work to post, which no event would wake. */
    if (!ret && hooks_pending(cq)) ret = -FI_EAGAIN;
    return ret;
}

/* Takes a pending fi_cq_signal, if there is one. */
static bool cq_take_signal(struct pmof_cq *cq) {
    return atomic_exchange(&cq->signalled, false);
}

/* Waits for an event or a signal: 0 to read the CQ again, 1 when
 * fi_cq_signal woke it, -FI_EAGAIN at the timeout, or an error.  Threads
 * waiting on several CQs of a domain all wake for an event of any: the
 * first takes the events, and the others look again. */
static int cq_wait(struct pmof_cq *cq, int timeout) {
    int ret = pmof_cq_trywait(cq);
    struct pollfd p[2] = {
        {.fd = cq->dom->channel->fd, .events = POLLIN},
        {.fd = atomic_load(&cq->wake_fd), .events = POLLIN},
    };

    if (ret == -FI_EAGAIN) {
        /* A rendezvous in flight finishes on the endpoint's other CQ too,
         * which no event of this one announces: look again shortly. */
        if (hooks_pending(cq)) poll(p, 2, timeout >= 0 && timeout < 1 ? timeout : 1);
        return cq_take_signal(cq) ? 1 : 0;
    }
    if (ret) return ret;
    ret = poll(p, 2, timeout);
    if (ret < 0) return errno == EINTR ? 0 : pmof_errno(errno);
    if (cq_take_signal(cq)) return 1;
    return ret == 0 ? -FI_EAGAIN : 0;
}

static ssize_t cq_sreadfrom(struct fid_cq *cq_fid, void *buf, size_t count, fi_addr_t *src_addr,
                            const void *cond, int timeout) {
    struct pmof_cq *cq = container_of(cq_fid, struct pmof_cq, cq_fid);
    uint64_t end = timeout >= 0 ? pmof_now_ms() + (uint64_t)timeout : 0;

    (void)cond;
    for (;;) {
        ssize_t ret = cq_readfrom(cq_fid, buf, count, src_addr);
        int left = -1;

        if (ret != -FI_EAGAIN) return ret;
        if (timeout >= 0) {
            uint64_t now = pmof_now_ms();
            if (now >= end) return -FI_EAGAIN;
            left = (int)(end - now);
        }
        /* fi_cq(3): a signalled thread returns with nothing read, even
         * when it would wait for ever; a signal before the wait counts. */
        if (!cq->waitable) {
            /* FI_WAIT_NONE and FI_WAIT_YIELD: poll, giving the CPU away. */
            if (cq_take_signal(cq)) return -FI_EAGAIN;
            sched_yield();
            continue;
        }
        ret = cq_wait(cq, left);
        if (ret == 1) return -FI_EAGAIN;
        if (ret && ret != -FI_EAGAIN) return ret;
    }
}

static ssize_t cq_sread(struct fid_cq *cq_fid, void *buf, size_t count, const void *cond,
                        int timeout) {
    return cq_sreadfrom(cq_fid, buf, count, NULL, cond, timeout);
}

static int cq_signal(struct fid_cq *cq_fid) {
    struct pmof_cq *cq = container_of(cq_fid, struct pmof_cq, cq_fid);

    atomic_store(&cq->signalled, true);
    cq_kick(cq);
    return 0;
}

static const char *cq_strerror(struct fid_cq *cq_fid, int prov_errno, const void *err_data,
                               char *buf, size_t len) {
    const char *s = ibv_wc_status_str((enum ibv_wc_status)prov_errno);

    (void)cq_fid, (void)err_data;
    if (buf && len) {
        strncpy(buf, s, len - 1);
        buf[len - 1] = '\0';
        return buf;
    }
    return s;
}

static int cq_control(struct fid *fid, int command, void *arg) {
    struct pmof_cq *cq = container_of(fid, struct pmof_cq, cq_fid.fid);

    switch (command) {
    case FI_GETWAIT: {
        int fd;

        if (!cq->waitable) return -FI_ENODATA;
        fd = cq_epfd(cq);
        if (fd < 0) return fd;
        *(int *)arg = fd;
        return 0;
    }
    case FI_GETWAITOBJ:
        *(enum fi_wait_obj *)arg = cq->wait_obj;
        return 0;
    default:
        return -FI_ENOSYS;
    }
}

static int cq_close(struct fid *fid) {
    struct pmof_cq *cq = container_of(fid, struct pmof_cq, cq_fid.fid);
    int ret;

    if (atomic_load(&cq->refs)) return -FI_EBUSY;
    if (cq->waitable) {
        /* Unacknowledged events keep ibv_destroy_cq waiting; and no event
         * of this CQ may be handed to it once it is gone. */
        pthread_mutex_lock(&cq->dom->chan_lock);
        take_events_locked(cq->dom);
    }
    ret = ibv_destroy_cq(cq->ibv);
    if (cq->waitable) pthread_mutex_unlock(&cq->dom->chan_lock);
    if (ret) return pmof_errno(ret);
    if (cq->epfd >= 0) close(cq->epfd);
    if (atomic_load(&cq->wake_fd) >= 0) close(atomic_load(&cq->wake_fd));
    pthread_mutex_destroy(&cq->wait_lock);
    pmof_lock_destroy(&cq->lock);
    pthread_mutex_destroy(&cq->soft_lock);
    pthread_rwlock_destroy(&cq->hooks_lock);
    atomic_fetch_sub(&cq->dom->refs, 1);
    free(cq->ring);
    free(cq->soft);
    free(cq->hooks);
    free(cq);
    return 0;
}

static struct fi_ops cq_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = cq_close,
    .bind = pmof_fid_bind_enosys,
    .control = cq_control,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_cq cq_ops = {
    .size = sizeof(struct fi_ops_cq),
    .read = cq_read,
    .readfrom = cq_readfrom,
    .readerr = cq_readerr,
    .sread = cq_sread,
    .sreadfrom = cq_sreadfrom,
    .signal = cq_signal,
    .strerror = cq_strerror,
};

int pmof_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **out,
                 void *context) {
    struct pmof_domain *dom = container_of(domain, struct pmof_domain, domain_fid);
    struct ibv_comp_channel *channel = NULL;
    struct pmof_cq *cq;
    size_t size;
    int ret = -FI_ENOMEM;

    if (!attr || !out) return -FI_EINVAL;
    if (attr->flags & ~FI_AFFINITY) return -FI_EBADFLAGS;
    switch (attr->format) {
    case FI_CQ_FORMAT_UNSPEC:
    case FI_CQ_FORMAT_CONTEXT:
    case FI_CQ_FORMAT_MSG:
    case FI_CQ_FORMAT_DATA:
    case FI_CQ_FORMAT_TAGGED:
        break;
    default:
        return -FI_ENOSYS;
    }
    switch (attr->wait_obj) {
    case FI_WAIT_NONE:
    case FI_WAIT_UNSPEC:
    case FI_WAIT_FD:
    case FI_WAIT_YIELD:
        break;
    default:
        return -FI_ENOSYS;
    }
    if (attr->wait_cond != FI_CQ_COND_NONE) return -FI_ENOSYS;
    size = attr->size ? attr->size : PMOF_DEF_CQ_SIZE;
    if (size > (size_t)dom->dev_attr.orig_attr.max_cqe) return -FI_EINVAL;
    cq = calloc(1, sizeof(*cq));
    if (!cq) return -FI_ENOMEM;
    cq->epfd = -1;
    atomic_init(&cq->wake_fd, -1);
    cq->format = attr->format == FI_CQ_FORMAT_UNSPEC ? FI_CQ_FORMAT_CONTEXT : attr->format;
    cq->wait_obj = attr->wait_obj == FI_WAIT_UNSPEC ? FI_WAIT_FD : attr->wait_obj;
    cq->ring_size = size;
    cq->ring = calloc(size, sizeof(*cq->ring));
    if (!cq->ring) goto err;
    pmof_lock_init(&cq->lock, true);
    pthread_mutex_init(&cq->soft_lock, NULL);
    pthread_rwlock_init(&cq->hooks_lock, NULL);
    pthread_mutex_init(&cq->wait_lock, NULL);
    if (cq->wait_obj == FI_WAIT_FD) {
        channel = pmof_domain_channel(dom);
        if (!channel) goto err_errno;
        cq->waitable = true;
    }
    cq->ibv = ibv_create_cq(dom->verbs, (int)size, cq, channel, 0);
    if (!cq->ibv) goto err_errno;
    cq->dom = dom;
    cq->cq_fid.fid.fclass = FI_CLASS_CQ;
    cq->cq_fid.fid.context = context;
    cq->cq_fid.fid.ops = &cq_fi_ops;
    cq->cq_fid.ops = &cq_ops;
    atomic_fetch_add(&dom->refs, 1);
    *out = &cq->cq_fid;
    return 0;
err_errno:
    ret = pmof_errno(errno ? errno : EIO);
err:
    if (cq->ring) {
        pthread_mutex_destroy(&cq->soft_lock);
        pthread_rwlock_destroy(&cq->hooks_lock);
        pthread_mutex_destroy(&cq->wait_lock);
    }
    free(cq->ring);
    free(cq);
    return ret;
}
