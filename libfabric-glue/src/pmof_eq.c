/* SPDX-License-Identifier: MIT */
/*
 * Event queues: connection events from an rdma_cm event channel, the
 * provider's own events (FI_COMMIT_EVENT, errors) and fi_eq_write's, in one
 * order.  rdma_cm events are translated when read; those that concern the
 * provider only (route resolved, a connection's second half) produce
 * nothing.  FI_WAIT_FD (and UNSPEC) waits on an epoll set of the channel
 * and an eventfd that is readable while software entries are queued.
 */
#include "pmof.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static void eq_signal(struct pmof_eq *eq) {
    uint64_t one = 1;
    ssize_t r = write(eq->evfd, &one, sizeof(one));
    (void)r;
}

static void eq_unsignal(struct pmof_eq *eq) {
    uint64_t v;
    ssize_t r = read(eq->evfd, &v, sizeof(v));
    (void)r;
}

int pmof_eq_push(struct pmof_eq *eq, uint32_t event, const void *buf, size_t len, bool err) {
    struct pmof_eq_entry *e = malloc(sizeof(*e) + len);

    if (!e) return -FI_ENOMEM;
    e->event = event;
    e->err = err;
    e->len = len;
    if (len) memcpy(e->data, buf, len);
    pmof_lock(&eq->lock);
    if (!eq->queue.head) eq_signal(eq);
    pmof_slist_push(&eq->queue, &e->link);
    pmof_unlock(&eq->lock);
    return 0;
}

int pmof_eq_push_error(struct pmof_eq *eq, fid_t fid, void *context, int err, int prov_errno,
                       const void *err_data, size_t err_data_size) {
    struct {
        struct fi_eq_err_entry e;
        uint8_t data[256];
    } buf = {0};

    if (err_data_size > sizeof(buf.data)) err_data_size = sizeof(buf.data);
    buf.e.fid = fid;
    buf.e.context = context;
    buf.e.err = err;
    buf.e.prov_errno = prov_errno;
    buf.e.err_data_size = err_data_size;
    if (err_data_size) memcpy(buf.data, err_data, err_data_size);
    return pmof_eq_push(eq, 0, &buf, sizeof(buf.e) + err_data_size, true);
}

void pmof_eq_resignal(struct pmof_eq *eq) {
    if (!eq->queue.head) eq_unsignal(eq);
}

static struct pmof_eq_entry *eq_pop(struct pmof_eq *eq) {
    struct pmof_eq_entry *e = (struct pmof_eq_entry *)pmof_slist_pop(&eq->queue);

    if (e && !eq->queue.head) eq_unsignal(eq);
    return e;
}

/* Translates queued rdma_cm events until one reaches the software queue
 * or the channel is empty (eq->lock held). */
static int eq_pull_cm(struct pmof_eq *eq) {
    while (!eq->queue.head) {
        struct rdma_cm_event *ev;
        ssize_t ret;

        if (rdma_get_cm_event(eq->channel, &ev)) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return -FI_EAGAIN;
            return pmof_errno(errno);
        }
        /* Dispatch may push (which takes the lock): drop it meanwhile. */
        pmof_unlock(&eq->lock);
        ret = pmof_cm_dispatch(eq, ev);
        pmof_lock(&eq->lock);
        if (ret < 0) PMOF_WARN(FI_LOG_EQ, "CM event: %s\n", fi_strerror((int)-ret));
    }
    return 0;
}

static ssize_t eq_read(struct fid_eq *eq_fid, uint32_t *event, void *buf, size_t len,
                       uint64_t flags) {
    struct pmof_eq *eq = container_of(eq_fid, struct pmof_eq, eq_fid);
    struct pmof_eq_entry *e;
    ssize_t ret;

    if (flags & ~FI_PEEK) return -FI_EBADFLAGS;
    pmof_lock(&eq->lock);
    if (eq->channel) {
        ret = eq_pull_cm(eq);
        if (ret && ret != -FI_EAGAIN) goto out;
    }
    e = (struct pmof_eq_entry *)eq->queue.head;
    if (!e) {
        ret = -FI_EAGAIN;
        goto out;
    }
    if (e->err) {
        ret = -FI_EAVAIL;
        goto out;
    }
    if (len < e->len || (e->len && !buf)) {
        ret = -FI_ETOOSMALL;
        goto out;
    }
    if (event) *event = e->event;
    if (e->len) memcpy(buf, e->data, e->len);
    ret = (ssize_t)e->len;
    if (!(flags & FI_PEEK)) free(eq_pop(eq));
out:
    pmof_unlock(&eq->lock);
    return ret;
}

static ssize_t eq_readerr(struct fid_eq *eq_fid, struct fi_eq_err_entry *buf, uint64_t flags) {
    struct pmof_eq *eq = container_of(eq_fid, struct pmof_eq, eq_fid);
    struct pmof_eq_entry *e;
    struct fi_eq_err_entry *src;
    size_t user_size;
    void *user_data;
    ssize_t ret;

    if (flags & ~FI_PEEK) return -FI_EBADFLAGS;
    if (!buf) return -FI_EINVAL;
    pmof_lock(&eq->lock);
    if (eq->channel) eq_pull_cm(eq);
    e = (struct pmof_eq_entry *)eq->queue.head;
    if (!e || !e->err) {
        ret = -FI_EAGAIN;
        goto out;
    }
    src = (struct fi_eq_err_entry *)e->data;
    /* Before 1.5 the entry ends at err_data, which is the provider's. */
    user_size = eq->fab->err_data_size ? buf->err_data_size : 0;
    user_data = eq->fab->err_data_size ? buf->err_data : NULL;
    buf->fid = src->fid;
    buf->context = src->context;
    buf->data = src->data;
    buf->err = src->err;
    buf->prov_errno = src->prov_errno;
    if (src->err_data_size && user_size && user_data) {
        /* The caller's buffer (libfabric >= 1.5). */
        buf->err_data_size = src->err_data_size < user_size ? src->err_data_size : user_size;
        memcpy(user_data, (uint8_t *)e->data + sizeof(*src), buf->err_data_size);
    } else if (src->err_data_size) {
        /* Ours, valid until the next readerr. */
        free(eq->err_data);
        eq->err_data = malloc(src->err_data_size);
        if (eq->err_data)
            memcpy(eq->err_data, (uint8_t *)e->data + sizeof(*src), src->err_data_size);
        buf->err_data = eq->err_data;
        if (eq->fab->err_data_size) buf->err_data_size = eq->err_data ? src->err_data_size : 0;
    } else if (eq->fab->err_data_size) {
        buf->err_data_size = 0;
    }
    ret = sizeof(*buf);
    if (!(flags & FI_PEEK)) free(eq_pop(eq));
out:
    pmof_unlock(&eq->lock);
    return ret;
}

static ssize_t eq_write(struct fid_eq *eq_fid, uint32_t event, const void *buf, size_t len,
                        uint64_t flags) {
    struct pmof_eq *eq = container_of(eq_fid, struct pmof_eq, eq_fid);
    int ret;

    (void)flags;
    if (len && !buf) return -FI_EINVAL;
    ret = pmof_eq_push(eq, event, buf, len, false);
    return ret ? ret : (ssize_t)len;
}

static int eq_wait(struct pmof_eq *eq, int timeout) {
    struct epoll_event ev;
    int n;

    if (eq->wait_obj == FI_WAIT_NONE) return -FI_ENOSYS;
    n = epoll_wait(eq->epfd, &ev, 1, timeout);
    if (n < 0) return errno == EINTR ? 0 : pmof_errno(errno);
    return n == 0 ? -FI_EAGAIN : 0;
}

static ssize_t eq_sread(struct fid_eq *eq_fid, uint32_t *event, void *buf, size_t len, int timeout,
                        uint64_t flags) {
    struct pmof_eq *eq = container_of(eq_fid, struct pmof_eq, eq_fid);
    uint64_t end = timeout >= 0 ? pmof_now_ms() + (uint64_t)timeout : 0;

    for (;;) {
        ssize_t ret = eq_read(eq_fid, event, buf, len, flags);
        int left = -1;

        if (ret != -FI_EAGAIN) return ret;
        if (timeout >= 0) {
            uint64_t now = pmof_now_ms();
            if (now >= end) return -FI_EAGAIN;
            left = (int)(end - now);
        }
        ret = eq_wait(eq, left);
        if (ret && ret != -FI_EAGAIN) return ret;
    }
}

static const char *eq_strerror(struct fid_eq *eq_fid, int prov_errno, const void *err_data,
                               char *buf, size_t len) {
    const char *s = prov_errno ? strerror(prov_errno) : "no provider error";

    (void)eq_fid, (void)err_data;
    if (buf && len) {
        strncpy(buf, s, len - 1);
        buf[len - 1] = '\0';
        return buf;
    }
    return s;
}

int pmof_eq_trywait(struct pmof_eq *eq) {
    int ret = 0;

    pmof_lock(&eq->lock);
    if (eq->queue.head) ret = -FI_EAGAIN;
    pmof_unlock(&eq->lock);
    if (!ret && eq->channel) {
        struct pollfd p = {.fd = eq->channel->fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) ret = -FI_EAGAIN;
    }
    return ret;
}

static int eq_control(struct fid *fid, int command, void *arg) {
    struct pmof_eq *eq = container_of(fid, struct pmof_eq, eq_fid.fid);

    switch (command) {
    case FI_GETWAIT:
        if (eq->wait_obj != FI_WAIT_FD) return -FI_ENODATA;
        *(int *)arg = eq->epfd;
        return 0;
    case FI_GETWAITOBJ:
        *(enum fi_wait_obj *)arg = eq->wait_obj;
        return 0;
    default:
        return -FI_ENOSYS;
    }
}

static int eq_close(struct fid *fid) {
    struct pmof_eq *eq = container_of(fid, struct pmof_eq, eq_fid.fid);
    struct pmof_eq_entry *e;

    if (atomic_load(&eq->refs)) return -FI_EBUSY;
    /* Commits read but never acknowledged fail at their initiators. */
    pmof_manual_eq_release(eq, NULL, -FI_ECANCELED);
    while ((e = (struct pmof_eq_entry *)pmof_slist_pop(&eq->queue)))
        free(e);
    if (eq->channel) rdma_destroy_event_channel(eq->channel);
    close(eq->epfd);
    close(eq->evfd);
    free(eq->err_data);
    pmof_lock_destroy(&eq->lock);
    atomic_fetch_sub(&eq->fab->refs, 1);
    free(eq);
    return 0;
}

static int eq_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops,
                       void *context) {
    struct pmof_eq *eq = container_of(fid, struct pmof_eq, eq_fid.fid);

    (void)context;
    if (flags) return -FI_EBADFLAGS;
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, FI_PMOF_EQ_OPS_1)) return -FI_ENOSYS;
    *ops = &eq->pmof_ops;
    return 0;
}

static int eq_register_handler(struct fi_pmof_eq_ops *ops, uint64_t event_type,
                               fi_eq_event_handler_t handler, void *context) {
    struct pmof_eq *eq = container_of(ops, struct pmof_eq, pmof_ops);

    /* Commits are the only events the provider hands to a handler. */
    if (event_type != FI_COMMIT_EVENT) return -FI_ENOSYS;
    pmof_lock(&eq->lock);
    eq->commit_handler = handler;
    eq->commit_handler_ctx = handler ? context : NULL;
    pmof_unlock(&eq->lock);
    return 0;
}

static struct fi_ops eq_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = eq_close,
    .bind = pmof_fid_bind_enosys,
    .control = eq_control,
    .ops_open = eq_ops_open,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_eq eq_ops = {
    .size = sizeof(struct fi_ops_eq),
    .read = eq_read,
    .readerr = eq_readerr,
    .write = eq_write,
    .sread = eq_sread,
    .strerror = eq_strerror,
};

int pmof_eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **out,
                 void *context) {
    struct pmof_fabric *fab = container_of(fabric, struct pmof_fabric, fabric_fid);
    struct pmof_eq *eq;
    int ret;

    if (!attr || !out) return -FI_EINVAL;
    if (attr->flags & ~FI_WRITE) return -FI_EBADFLAGS;
    switch (attr->wait_obj) {
    case FI_WAIT_NONE:
    case FI_WAIT_UNSPEC:
    case FI_WAIT_FD:
        break;
    default:
        return -FI_ENOSYS;
    }
    eq = calloc(1, sizeof(*eq));
    if (!eq) return -FI_ENOMEM;
    eq->epfd = eq->evfd = -1;
    eq->wait_obj = attr->wait_obj == FI_WAIT_NONE ? FI_WAIT_NONE : FI_WAIT_FD;
    pmof_lock_init(&eq->lock, true);
    eq->channel = rdma_create_event_channel();
    if (!eq->channel) {
        ret = pmof_errno(errno);
        goto err;
    }
    if (fcntl(eq->channel->fd, F_SETFL, fcntl(eq->channel->fd, F_GETFL) | O_NONBLOCK)) {
        ret = pmof_errno(errno);
        goto err;
    }
    eq->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    eq->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (eq->evfd < 0 || eq->epfd < 0) {
        ret = pmof_errno(errno);
        goto err;
    }
    ret = pmof_epoll_add(eq->epfd, eq->evfd);
    if (!ret) ret = pmof_epoll_add(eq->epfd, eq->channel->fd);
    if (ret) goto err;
    eq->fab = fab;
    eq->eq_fid.fid.fclass = FI_CLASS_EQ;
    eq->eq_fid.fid.context = context;
    eq->eq_fid.fid.ops = &eq_fi_ops;
    eq->eq_fid.ops = &eq_ops;
    eq->pmof_ops.size = sizeof(eq->pmof_ops);
    eq->pmof_ops.register_handler = eq_register_handler;
    eq->pmof_ops.commit_ack = pmof_commit_ack;
    atomic_fetch_add(&fab->refs, 1);
    *out = &eq->eq_fid;
    return 0;
err:
    if (eq->channel) rdma_destroy_event_channel(eq->channel);
    if (eq->evfd >= 0) close(eq->evfd);
    if (eq->epfd >= 0) close(eq->epfd);
    pmof_lock_destroy(&eq->lock);
    free(eq);
    return ret;
}
