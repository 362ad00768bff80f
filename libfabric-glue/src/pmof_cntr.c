/* SPDX-License-Identifier: MIT */
/*
 * Counters.  Completions reach a counter when its endpoints' CQs are
 * progressed, so reading or waiting on a counter progresses them.
 */
#include "pmof.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

void pmof_cntr_inc(struct pmof_cntr *c) {
    atomic_fetch_add(&c->value, 1);
}
void pmof_cntr_err(struct pmof_cntr *c) {
    atomic_fetch_add(&c->errors, 1);
}

int pmof_cntr_watch_cq(struct pmof_cntr *c, struct pmof_cq *cq) {
    int ret = 0;

    pmof_lock(&c->lock);
    for (size_t i = 0; i < c->ncqs; i++)
        if (c->cqs[i] == cq) goto out;
    if (c->ncqs == sizeof(c->cqs) / sizeof(c->cqs[0])) {
        ret = -FI_ENOSPC;
        goto out;
    }
    c->cqs[c->ncqs++] = cq;
out:
    pmof_unlock(&c->lock);
    return ret;
}

/* Progresses the watched CQs without holding the counter's lock, which
 * endpoints take while they are enabled. */
static void cntr_progress(struct pmof_cntr *c) {
    struct pmof_cq *cqs[sizeof(c->cqs) / sizeof(c->cqs[0])];
    size_t n;

    pmof_lock(&c->lock);
    n = c->ncqs;
    memcpy(cqs, c->cqs, n * sizeof(cqs[0]));
    pmof_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        pmof_cq_run_hooks(cqs[i]);
        pmof_cq_progress(cqs[i]);
    }
}

void pmof_cntr_unwatch_cq(struct pmof_cntr *c, struct pmof_cq *cq) {
    pmof_lock(&c->lock);
    for (size_t i = 0; i < c->ncqs; i++) {
        if (c->cqs[i] != cq) continue;
        c->cqs[i] = c->cqs[--c->ncqs];
        break;
    }
    pmof_unlock(&c->lock);
}

static uint64_t cntr_read(struct fid_cntr *fid) {
    struct pmof_cntr *c = container_of(fid, struct pmof_cntr, cntr_fid);
    cntr_progress(c);
    return atomic_load(&c->value);
}

static uint64_t cntr_readerr(struct fid_cntr *fid) {
    struct pmof_cntr *c = container_of(fid, struct pmof_cntr, cntr_fid);
    cntr_progress(c);
    return atomic_load(&c->errors);
}

static int cntr_add(struct fid_cntr *fid, uint64_t value) {
    atomic_fetch_add(&container_of(fid, struct pmof_cntr, cntr_fid)->value, value);
    return 0;
}

static int cntr_set(struct fid_cntr *fid, uint64_t value) {
    atomic_store(&container_of(fid, struct pmof_cntr, cntr_fid)->value, value);
    return 0;
}

static int cntr_adderr(struct fid_cntr *fid, uint64_t value) {
    atomic_fetch_add(&container_of(fid, struct pmof_cntr, cntr_fid)->errors, value);
    return 0;
}

static int cntr_seterr(struct fid_cntr *fid, uint64_t value) {
    atomic_store(&container_of(fid, struct pmof_cntr, cntr_fid)->errors, value);
    return 0;
}

static int cntr_wait(struct fid_cntr *fid, uint64_t threshold, int timeout) {
    struct pmof_cntr *c = container_of(fid, struct pmof_cntr, cntr_fid);
    uint64_t errors = atomic_load(&c->errors);
    uint64_t end = timeout >= 0 ? pmof_now_ms() + (uint64_t)timeout : 0;

    for (;;) {
        cntr_progress(c);
        if (atomic_load(&c->value) >= threshold) return 0;
        if (atomic_load(&c->errors) != errors) return -FI_EAVAIL;
        if (timeout >= 0 && pmof_now_ms() >= end) return -FI_ETIMEDOUT;
        sched_yield();
    }
}

int pmof_cntr_trywait(struct pmof_cntr *c) {
    (void)c;
    /* Counters wait by polling; nothing to arm. */
    return -FI_ENOSYS;
}

static int cntr_close(struct fid *fid) {
    struct pmof_cntr *c = container_of(fid, struct pmof_cntr, cntr_fid.fid);

    if (atomic_load(&c->refs)) return -FI_EBUSY;
    pmof_lock_destroy(&c->lock);
    atomic_fetch_sub(&c->dom->refs, 1);
    free(c);
    return 0;
}

static int cntr_control(struct fid *fid, int command, void *arg) {
    struct pmof_cntr *c = container_of(fid, struct pmof_cntr, cntr_fid.fid);

    if (command == FI_GETWAITOBJ) {
        *(enum fi_wait_obj *)arg = c->wait_obj;
        return 0;
    }
    return -FI_ENOSYS;
}

static struct fi_ops cntr_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = cntr_close,
    .bind = pmof_fid_bind_enosys,
    .control = cntr_control,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_cntr cntr_ops = {
    .size = sizeof(struct fi_ops_cntr),
    .read = cntr_read,
    .readerr = cntr_readerr,
    .add = cntr_add,
    .set = cntr_set,
    .wait = cntr_wait,
    .adderr = cntr_adderr,
    .seterr = cntr_seterr,
};

int pmof_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr, struct fid_cntr **out,
                   void *context) {
    struct pmof_domain *dom = container_of(domain, struct pmof_domain, domain_fid);
    struct pmof_cntr *c;

    if (!out) return -FI_EINVAL;
    if (attr) {
        if (attr->events != FI_CNTR_EVENTS_COMP) return -FI_ENOSYS;
        if (attr->flags) return -FI_EBADFLAGS;
        switch (attr->wait_obj) {
        case FI_WAIT_NONE:
        case FI_WAIT_UNSPEC:
        case FI_WAIT_YIELD:
            break;
        default:
            return -FI_ENOSYS;
        }
    }
    c = calloc(1, sizeof(*c));
    if (!c) return -FI_ENOMEM;
    c->dom = dom;
    c->wait_obj = attr && attr->wait_obj != FI_WAIT_UNSPEC ? attr->wait_obj : FI_WAIT_YIELD;
    pmof_lock_init(&c->lock, true);
    c->cntr_fid.fid.fclass = FI_CLASS_CNTR;
    c->cntr_fid.fid.context = context;
    c->cntr_fid.fid.ops = &cntr_fi_ops;
    c->cntr_fid.ops = &cntr_ops;
    atomic_fetch_add(&dom->refs, 1);
    *out = &c->cntr_fid;
    return 0;
}
