/* SPDX-License-Identifier: MIT */
/* fabric_domain.*, domain.*, eq.*, cq.*, mr.*, av.*, cntr.*: the objects
 * around endpoints, each on its own. */
#include "fabtest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* ------------------------------------------------------------ fabric, domain */

static int t_fabric_domain(struct ft_run *r) {
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    int rc = fi_close(&d.fabric->fid);
    if (rc == 0) {
        /* The fabric is gone and the domain points into it: leak both
         * rather than touch freed memory. */
        d.fabric = NULL;
        d.domain = NULL;
        FT_EXPECT(!ft_is_pmof_prov(r->opts), "fi_close(fabric) with an open domain = 0");
        ft_note(r, "fi_close(fabric) with an open domain = 0, not -FI_EBUSY");
    } else {
        FT_EXPECT(rc == -FI_EBUSY, "fi_close(fabric) with an open domain = %d (%s)", rc,
                  fi_strerror(-rc));
    }
out:
    return ft_dom_close(r, &d, ret);
}

static int t_ops_open_unknown(struct ft_run *r) {
    struct ft_dom d;
    void *ops = NULL;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    int rc = fi_open_ops(&d.domain->fid, "pmof_fabtest_no_such_ops", 0, &ops, NULL);
    FT_EXPECT(rc == -FI_ENOSYS || rc == -FI_EINVAL,
              "fi_open_ops(unknown) = %d (%s), expected -FI_ENOSYS or -FI_EINVAL", rc,
              fi_strerror(-rc));
out:
    return ft_dom_close(r, &d, ret);
}

static ssize_t copy_from_hmem(void *dest, size_t size, enum fi_hmem_iface iface, uint64_t device,
                              const struct iovec *iov, size_t count, uint64_t offset) {
    (void)iface;
    (void)device;
    size_t done = 0;
    for (size_t i = 0; i < count && done < size; i++) {
        if (offset >= iov[i].iov_len) {
            offset -= iov[i].iov_len;
            continue;
        }
        size_t n = iov[i].iov_len - offset;
        if (n > size - done) n = size - done;
        memcpy((char *)dest + done, (char *)iov[i].iov_base + offset, n);
        done += n;
        offset = 0;
    }
    return (ssize_t)done;
}

static ssize_t copy_to_hmem(enum fi_hmem_iface iface, uint64_t device, const struct iovec *iov,
                            size_t count, uint64_t offset, const void *src, size_t size) {
    (void)iface;
    (void)device;
    size_t done = 0;
    for (size_t i = 0; i < count && done < size; i++) {
        if (offset >= iov[i].iov_len) {
            offset -= iov[i].iov_len;
            continue;
        }
        size_t n = iov[i].iov_len - offset;
        if (n > size - done) n = size - done;
        memcpy((char *)iov[i].iov_base + offset, (const char *)src + done, n);
        done += n;
        offset = 0;
    }
    return (ssize_t)done;
}

static int t_set_ops(struct ft_run *r) {
    struct fi_hmem_override_ops ops = {.size = sizeof(ops),
                                       .copy_from_hmem_iov = copy_from_hmem,
                                       .copy_to_hmem_iov = copy_to_hmem};
    struct fi_hmem_override_ops dummy = ops;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    int rc = fi_set_ops(&d.domain->fid, "pmof_fabtest_no_such_ops", 0, &dummy, NULL);
    FT_EXPECT(rc == -FI_ENOSYS, "fi_set_ops(unknown) = %d (%s), expected -FI_ENOSYS", rc,
              fi_strerror(-rc));
    rc = fi_set_ops(&d.domain->fid, FI_SET_OPS_HMEM_OVERRIDE, 0, &ops, NULL);
    if (rc == -FI_ENOSYS && !ft_is_pmof_prov(r->opts)) {
        ret = ft_skip(r, "fi_set_ops(%s) = -FI_ENOSYS on %s", FI_SET_OPS_HMEM_OVERRIDE,
                      r->opts->prov);
        goto out;
    }
    FT_EXPECT(!rc, "fi_set_ops(%s) = %d (%s)", FI_SET_OPS_HMEM_OVERRIDE, rc, fi_strerror(-rc));
out:
    return ft_dom_close(r, &d, ret);
}

/* ------------------------------------------------------------ eq */

static int eq_open(struct ft_run *r, struct ft_dom *d, enum fi_wait_obj wait, struct fid_eq **eq) {
    struct fi_eq_attr attr = {.size = 16, .wait_obj = wait};
    int ret = FT_OK;

    FT_CHK(fi_eq_open(d->fabric, &attr, eq, NULL));
out:
    return ret;
}

static int close_eq(struct ft_run *r, struct fid_eq *eq, int ret) {
    if (!eq) return ret;
    int rc = fi_close(&eq->fid);
    return rc ? ft_fail(r, "fi_close(eq) = %d (%s)", rc, fi_strerror(-rc)) : ret;
}

static int t_eq_open_close(struct ft_run *r) {
    static const enum fi_wait_obj waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_FD};
    struct ft_dom d;
    struct fid_eq *eq = NULL;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    for (size_t i = 0; i < sizeof(waits) / sizeof(waits[0]); i++) {
        FT_TRY(eq_open(r, &d, waits[i], &eq));
        ret = close_eq(r, eq, ret);
        eq = NULL;
        FT_TRY(ret);
    }
out:
    ret = close_eq(r, eq, ret);
    return ft_dom_close(r, &d, ret);
}

static int eq_write_notify(struct ft_run *r, struct fid_eq *eq, uint64_t data) {
    struct fi_eq_entry in = {.fid = &eq->fid, .context = eq, .data = data};
    int ret = FT_OK;

    ssize_t n = fi_eq_write(eq, FI_NOTIFY, &in, sizeof(in), 0);
    FT_EXPECT(n == (ssize_t)sizeof(in), "fi_eq_write = %zd, expected %zu", n, sizeof(in));
out:
    return ret;
}

static int eq_read_notify(struct ft_run *r, struct fid_eq *eq, uint64_t data, uint64_t flags) {
    struct fi_eq_entry out_e = {0};
    uint32_t ev = 0;
    int ret = FT_OK;

    ssize_t n = fi_eq_read(eq, &ev, &out_e, sizeof(out_e), flags);
    FT_EXPECT(n == (ssize_t)sizeof(out_e), "fi_eq_read = %zd (%s), expected %zu", n,
              n < 0 ? fi_strerror((int)-n) : "", sizeof(out_e));
    FT_EXPECT(ev == FI_NOTIFY, "event %u, expected FI_NOTIFY", ev);
    FT_EXPECT(out_e.fid == &eq->fid && out_e.context == eq && out_e.data == data,
              "entry read back differs from the one written");
out:
    return ret;
}

static int expect_eq_empty(struct ft_run *r, struct fid_eq *eq) {
    struct fi_eq_entry e;
    uint32_t ev;
    int ret = FT_OK;

    ssize_t n = fi_eq_read(eq, &ev, &e, sizeof(e), 0);
    FT_EXPECT(n == -FI_EAGAIN, "fi_eq_read on an empty EQ = %zd, expected -FI_EAGAIN", n);
out:
    return ret;
}

static int t_eq_write_read(struct ft_run *r) {
    struct ft_dom d;
    struct fid_eq *eq = NULL;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(eq_open(r, &d, FI_WAIT_UNSPEC, &eq));
    FT_TRY(eq_write_notify(r, eq, 0x1234567890abcdefULL));
    FT_TRY(eq_read_notify(r, eq, 0x1234567890abcdefULL, 0));
    FT_TRY(expect_eq_empty(r, eq));
out:
    ret = close_eq(r, eq, ret);
    return ft_dom_close(r, &d, ret);
}

static int eq_sread_timeout(struct ft_run *r, struct ft_dom *d, enum fi_wait_obj wait) {
    struct fid_eq *eq = NULL;
    struct fi_eq_entry e;
    uint32_t ev;
    int ret = FT_OK;

    FT_TRY(eq_open(r, d, wait, &eq));
    uint64_t t0 = ft_now_us();
    ssize_t n = fi_eq_sread(eq, &ev, &e, sizeof(e), 100, 0);
    uint64_t dt = ft_now_us() - t0;
    FT_EXPECT(n == -FI_EAGAIN, "fi_eq_sread(100 ms) on an empty EQ (wait %d) = %zd (%s)", wait, n,
              fi_strerror((int)-n));
    FT_EXPECT(dt >= 90000, "fi_eq_sread(100 ms) returned after %llu us", (unsigned long long)dt);
out:
    return close_eq(r, eq, ret);
}

static int eq_fd_readable(struct ft_run *r, struct ft_dom *d) {
    struct fid_eq *eq = NULL;
    int fd = -1, ret = FT_OK;

    FT_TRY(eq_open(r, d, FI_WAIT_FD, &eq));
    FT_CHK(fi_control(&eq->fid, FI_GETWAIT, &fd));
    FT_EXPECT(fd >= 0, "FI_GETWAIT gave fd %d", fd);
    FT_TRY(eq_write_notify(r, eq, 7));
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int n = poll(&pfd, 1, 1000);
    FT_EXPECT(n == 1 && (pfd.revents & POLLIN), "EQ fd not readable after a write (poll %d)", n);
    FT_TRY(eq_read_notify(r, eq, 7, 0));
out:
    return close_eq(r, eq, ret);
}

static int t_eq_sread_timeout(struct ft_run *r) {
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(eq_sread_timeout(r, &d, FI_WAIT_UNSPEC));
    FT_TRY(eq_sread_timeout(r, &d, FI_WAIT_FD));
    FT_TRY(eq_fd_readable(r, &d));
out:
    return ft_dom_close(r, &d, ret);
}

static int t_eq_readerr_empty(struct ft_run *r) {
    struct ft_dom d;
    struct fid_eq *eq = NULL;
    struct fi_eq_err_entry err = {0};
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(eq_open(r, &d, FI_WAIT_UNSPEC, &eq));
    ssize_t n = fi_eq_readerr(eq, &err, 0);
    FT_EXPECT(n == -FI_EAGAIN, "fi_eq_readerr without errors = %zd, expected -FI_EAGAIN", n);
out:
    ret = close_eq(r, eq, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_eq_peek(struct ft_run *r) {
    struct ft_dom d;
    struct fid_eq *eq = NULL;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(eq_open(r, &d, FI_WAIT_UNSPEC, &eq));
    FT_TRY(eq_write_notify(r, eq, 42));
    FT_TRY(eq_read_notify(r, eq, 42, FI_PEEK));
    FT_TRY(eq_read_notify(r, eq, 42, 0));
    FT_TRY(expect_eq_empty(r, eq));
out:
    ret = close_eq(r, eq, ret);
    return ft_dom_close(r, &d, ret);
}

/* ------------------------------------------------------------ cq */

static int close_cq(struct ft_run *r, struct fid_cq *cq, int ret) {
    if (!cq) return ret;
    int rc = fi_close(&cq->fid);
    return rc ? ft_fail(r, "fi_close(cq) = %d (%s)", rc, fi_strerror(-rc)) : ret;
}

static int cq_open_close(struct ft_run *r, struct ft_dom *d, enum fi_cq_format fmt,
                         enum fi_wait_obj wait) {
    struct fi_cq_attr attr = {.size = 64, .format = fmt, .wait_obj = wait};
    struct fid_cq *cq = NULL;
    int ret = FT_OK;

    int rc = fi_cq_open(d->domain, &attr, &cq, NULL);
    if (rc) cq = NULL;
    FT_EXPECT(!rc, "fi_cq_open(format %d, wait %d) = %d (%s)", fmt, wait, rc, fi_strerror(-rc));
    if (wait == FI_WAIT_FD) {
        int fd = -1;
        FT_CHK(fi_control(&cq->fid, FI_GETWAIT, &fd));
        FT_EXPECT(fd >= 0, "FI_GETWAIT gave fd %d", fd);
    }
out:
    return close_cq(r, cq, ret);
}

static int t_cq_formats(struct ft_run *r) {
    static const enum fi_cq_format fmts[] = {FI_CQ_FORMAT_UNSPEC, FI_CQ_FORMAT_CONTEXT,
                                             FI_CQ_FORMAT_MSG, FI_CQ_FORMAT_DATA,
                                             FI_CQ_FORMAT_TAGGED};
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++)
        FT_TRY(cq_open_close(r, &d, fmts[i], FI_WAIT_NONE));
out:
    return ft_dom_close(r, &d, ret);
}

static int t_cq_waits(struct ft_run *r) {
    static const enum fi_wait_obj waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_FD};
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    for (size_t i = 0; i < sizeof(waits) / sizeof(waits[0]); i++)
        FT_TRY(cq_open_close(r, &d, FI_CQ_FORMAT_CONTEXT, waits[i]));
out:
    return ft_dom_close(r, &d, ret);
}

static int cq_sread_timeout(struct ft_run *r, struct ft_dom *d, enum fi_wait_obj wait) {
    struct fi_cq_attr attr = {.size = 64, .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = wait};
    struct fi_cq_entry e;
    struct fid_cq *cq = NULL;
    int ret = FT_OK;

    FT_CHK(fi_cq_open(d->domain, &attr, &cq, NULL));
    uint64_t t0 = ft_now_us();
    ssize_t n = fi_cq_sread(cq, &e, 1, NULL, 100);
    uint64_t dt = ft_now_us() - t0;
    FT_EXPECT(n == -FI_EAGAIN, "fi_cq_sread(100 ms) on an empty CQ (wait %d) = %zd (%s)", wait, n,
              fi_strerror((int)-n));
    FT_EXPECT(dt >= 90000, "fi_cq_sread(100 ms) returned after %llu us", (unsigned long long)dt);
out:
    return close_cq(r, cq, ret);
}

/* check(r, d, wait) on one domain, for the wait objects fi_cq_sread
 * blocks on: FI_WAIT_FD and FI_WAIT_UNSPEC. */
static int on_blocking_waits(struct ft_run *r,
                             int (*check)(struct ft_run *, struct ft_dom *, enum fi_wait_obj)) {
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(check(r, &d, FI_WAIT_FD));
    FT_TRY(check(r, &d, FI_WAIT_UNSPEC));
out:
    return ft_dom_close(r, &d, ret);
}

static int t_cq_sread_timeout(struct ft_run *r) {
    return on_blocking_waits(r, cq_sread_timeout);
}

struct cq_waiter {
    struct fid_cq *cq;
    atomic_long ret; /* fi_cq_sread's result once it returned; 1 until then */
};

static void *cq_wait_forever(void *arg) {
    struct cq_waiter *w = arg;
    struct fi_cq_entry e;

    atomic_store(&w->ret, (long)fi_cq_sread(w->cq, &e, 1, NULL, -1));
    return NULL;
}

/* fi_cq(3): fi_cq_signal unblocks a thread waiting in fi_cq_sread, which
 * returns -FI_EAGAIN with nothing read, even with no timeout; a signal
 * given before the wait is not lost (libfabric's own CQ test signals
 * first, then reads with a 2 s timeout and wants it back within 1 s). */
static int cq_signal(struct ft_run *r, struct ft_dom *d, enum fi_wait_obj wait) {
    struct fi_cq_attr attr = {.size = 1, .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = wait};
    struct cq_waiter w = {.ret = 1};
    struct fi_cq_entry e;
    struct fid_cq *cq = NULL;
    pthread_t t;
    bool started = false;
    int ret = FT_OK;
    long woken;

    FT_CHK(fi_cq_open(d->domain, &attr, &cq, NULL));
    FT_CHK(fi_cq_signal(cq));
    uint64_t t0 = ft_now_us();
    ssize_t n = fi_cq_sread(cq, &e, 1, NULL, 2000);
    uint64_t dt = ft_now_us() - t0;
    FT_EXPECT(n == -FI_EAGAIN || n == -FI_ECANCELED,
              "fi_cq_sread after fi_cq_signal (wait %d) = %zd (%s)", wait, n, fi_strerror((int)-n));
    FT_EXPECT(dt < 1000000, "fi_cq_sread after fi_cq_signal (wait %d) took %llu us: signal lost",
              wait, (unsigned long long)dt);

    w.cq = cq;
    FT_EXPECT(!pthread_create(&t, NULL, cq_wait_forever, &w), "pthread_create");
    started = true;
    ft_sleep_ms(100); /* in fi_cq_sread by now, or soon: either way it must return */
    FT_CHK(fi_cq_signal(cq));
    for (int i = 0; i < 500 && atomic_load(&w.ret) == 1; i++)
        ft_sleep_ms(10);
    woken = atomic_load(&w.ret);
    FT_EXPECT(woken != 1,
              "a thread in fi_cq_sread(no timeout) (wait %d) still blocked 5 s after "
              "fi_cq_signal",
              wait);
    FT_EXPECT(woken == -FI_EAGAIN || woken == -FI_ECANCELED,
              "fi_cq_sread(no timeout) woken by fi_cq_signal (wait %d) = %ld (%s)", wait, woken,
              fi_strerror((int)-woken));
out:
    /* Still blocked: wake it the only other way, so it can be joined. */
    for (int i = 0; started && i < 100 && atomic_load(&w.ret) == 1; i++) {
        fi_cq_signal(cq);
        ft_sleep_ms(50);
    }
    if (!started) return close_cq(r, cq, ret);
    if (atomic_load(&w.ret) == 1) {
        pthread_detach(t); /* the CQ stays open under it */
        return ret;
    }
    pthread_join(t, NULL);
    return close_cq(r, cq, ret);
}

static int t_cq_signal(struct ft_run *r) {
    return on_blocking_waits(r, cq_signal);
}

/* Descriptors this process has open now. */
static size_t open_fds(void) {
    DIR *dir = opendir("/proc/self/fd");
    size_t n = 0;

    if (!dir) return 0;
    while (readdir(dir))
        n++;
    closedir(dir);
    return n > 2 ? n - 2 : 0; /* . and .. */
}

/* fi_domain(3) promises cq_cnt CQs and fi_cq(3) ties none to a file
 * descriptor: thousands open, whatever their wait object, while the process
 * has only a few descriptors left (libfabric's own unit test opens as many
 * as the domain allows).  Those that are waited on still time out, and
 * fi_cq_signal still wakes them. */
static int t_cq_many(struct ft_run *r) {
    enum { MANY = 3000, SPARE = 48, WAITED = 6 };
    static const enum fi_wait_obj waits[] = {FI_WAIT_UNSPEC, FI_WAIT_FD, FI_WAIT_NONE};
    struct fid_cq **cqs = calloc(MANY, sizeof(*cqs));
    struct rlimit old = {0}, low;
    size_t n = 0, want = 0;
    bool lowered = false, opened = false;
    struct ft_dom d;
    int ret = FT_OK, rc = 0;

    if (!cqs) return ft_fail(r, "out of memory");
    if (!ft_is_pmof_prov(r->opts)) {
        /* libfabric 1.17's tcp;ofi_rxm crashes when fi_cq_open runs out. */
        free(cqs);
        return ft_skip(r, "other providers keep descriptors per CQ");
    }
    FT_TRY(ft_dom_open(r, &d));
    opened = true;
    want = d.info->domain_attr->cq_cnt < MANY ? d.info->domain_attr->cq_cnt : MANY;
    FT_EXPECT(!getrlimit(RLIMIT_NOFILE, &old), "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    low = old;
    low.rlim_cur = (rlim_t)(open_fds() + SPARE);
    if (low.rlim_cur < old.rlim_cur) {
        FT_EXPECT(!setrlimit(RLIMIT_NOFILE, &low), "setrlimit(RLIMIT_NOFILE, %llu): %s",
                  (unsigned long long)low.rlim_cur, strerror(errno));
        lowered = true;
    }
    for (; n < want; n++) {
        struct fi_cq_attr attr = {
            .size = 16, .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = waits[n % 3]};
        rc = fi_cq_open(d.domain, &attr, &cqs[n], NULL);
        if (rc) break;
    }
    FT_TRY(ft_deviation(
        r, n < want, "fi_cq_open of CQ %zu of %zu (wait %d), %llu descriptors allowed, = %d (%s)",
        n + 1, want, waits[n % 3], (unsigned long long)low.rlim_cur, rc, fi_strerror(-rc)));
    for (size_t i = 0; i < WAITED && i < n; i++) {
        struct fi_cq_entry e;
        enum fi_wait_obj wait = waits[i % 3];
        if (wait == FI_WAIT_FD) {
            int fd = -1;
            FT_CHK(fi_control(&cqs[i]->fid, FI_GETWAIT, &fd));
            FT_EXPECT(fd >= 0, "FI_GETWAIT gave fd %d", fd);
        }
        ssize_t got = fi_cq_sread(cqs[i], &e, 1, NULL, 10);
        FT_EXPECT(got == -FI_EAGAIN, "fi_cq_sread(10 ms) on empty CQ %zu (wait %d) = %zd (%s)", i,
                  wait, got, fi_strerror((int)-got));
        FT_CHK(fi_cq_signal(cqs[i]));
        uint64_t t0 = ft_now_us();
        got = fi_cq_sread(cqs[i], &e, 1, NULL, 5000);
        FT_EXPECT(got == -FI_EAGAIN || got == -FI_ECANCELED,
                  "fi_cq_sread after fi_cq_signal on CQ %zu (wait %d) = %zd (%s)", i, wait, got,
                  fi_strerror((int)-got));
        FT_EXPECT(ft_now_us() - t0 < 1000000, "fi_cq_signal on CQ %zu (wait %d) was lost", i, wait);
    }
out:
    if (lowered) setrlimit(RLIMIT_NOFILE, &old);
    for (size_t i = 0; i < n; i++)
        ret = close_cq(r, cqs[i], ret);
    free(cqs);
    return opened ? ft_dom_close(r, &d, ret) : ret;
}

static int t_cq_readerr_empty(struct ft_run *r) {
    struct fi_cq_attr attr = {.size = 64, .format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
    struct fi_cq_err_entry err = {0};
    struct fi_cq_data_entry e;
    struct fid_cq *cq = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_CHK(fi_cq_open(d.domain, &attr, &cq, NULL));
    ssize_t n = fi_cq_read(cq, &e, 1);
    FT_EXPECT(n == -FI_EAGAIN, "fi_cq_read on an empty CQ = %zd, expected -FI_EAGAIN", n);
    n = fi_cq_readerr(cq, &err, 0);
    FT_EXPECT(n == -FI_EAGAIN, "fi_cq_readerr without errors = %zd, expected -FI_EAGAIN", n);
out:
    ret = close_cq(r, cq, ret);
    return ft_dom_close(r, &d, ret);
}

/* On a CQ endpoints are bound to, as an application would call it: ofi_rxm
 * (1.17) looks up the first bound endpoint and crashes on a bare CQ. */
static int t_cq_strerror(struct ft_run *r) {
    struct ft_pair p = {0};
    char buf[128];
    int ret = FT_OK;

    FT_TRY(ft_pair_open(r, &p, NULL));
    for (int prov_errno = 0; prov_errno < 3; prov_errno++) {
        const char *s = fi_cq_strerror(p.s[FT_CLI].rx.cq, prov_errno, NULL, buf, sizeof(buf));
        FT_EXPECT(s, "fi_cq_strerror(prov_errno %d) = NULL", prov_errno);
    }
out:
    return ft_pair_close(&p, ret);
}

/* ------------------------------------------------------------ mr */

#define FT_MR_ALL (FT_ACC_LOCAL | FT_ACC_REMOTE)

static int close_mr(struct ft_run *r, struct fid_mr *mr, int ret) {
    if (!mr) return ret;
    int rc = fi_close(&mr->fid);
    return rc ? ft_fail(r, "fi_close(mr) = %d (%s)", rc, fi_strerror(-rc)) : ret;
}

/* Keys, descriptors: what fi_mr_key/fi_mr_desc give must be usable. */
static int check_mr(struct ft_run *r, const struct ft_dom *d, struct fid_mr *mr) {
    int ret = FT_OK;

    FT_EXPECT(fi_mr_key(mr) != FI_KEY_NOTAVAIL, "fi_mr_key = FI_KEY_NOTAVAIL");
    FT_EXPECT(fi_mr_desc(mr) || !(d->info->domain_attr->mr_mode & FI_MR_LOCAL),
              "fi_mr_desc = NULL with FI_MR_LOCAL");
out:
    return ret;
}

static int t_mr_reg(struct ft_run *r) {
    static char buf[8192];
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_CHK(fi_mr_reg(d.domain, buf, sizeof(buf), FT_MR_ALL, 0, 1, 0, &mr, NULL));
    FT_TRY(check_mr(r, &d, mr));
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_regv(struct ft_run *r) {
    static char a[4096], b[4096];
    struct iovec iov[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    size_t count = d.info->domain_attr->mr_iov_limit >= 2 ? 2 : 1;
    if (count == 1) ft_note(r, "mr_iov_limit %zu: one iov", d.info->domain_attr->mr_iov_limit);
    FT_CHK(fi_mr_regv(d.domain, iov, count, FT_MR_ALL, 0, 2, 0, &mr, NULL));
    FT_TRY(check_mr(r, &d, mr));
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_regattr(struct ft_run *r) {
    static char buf[4096];
    struct iovec iov = {buf, sizeof(buf)};
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK, ctx;
    struct fi_mr_attr attr = {.mr_iov = &iov,
                              .iov_count = 1,
                              .access = FT_MR_ALL,
                              .requested_key = 3,
                              .context = &ctx,
                              .iface = FI_HMEM_SYSTEM};

    FT_TRY(ft_dom_open(r, &d));
    FT_CHK(fi_mr_regattr(d.domain, &attr, 0, &mr));
    FT_TRY(check_mr(r, &d, mr));
    FT_EXPECT(mr->fid.context == &ctx, "mr fid context %p, expected %p", mr->fid.context,
              (void *)&ctx);
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_key_desc(struct ft_run *r) {
    static char a[4096], b[4096];
    struct fid_mr *ma = NULL, *mb = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_CHK(fi_mr_reg(d.domain, a, sizeof(a), FT_MR_ALL, 0, 10, 0, &ma, NULL));
    FT_CHK(fi_mr_reg(d.domain, b, sizeof(b), FT_MR_ALL, 0, 11, 0, &mb, NULL));
    FT_TRY(check_mr(r, &d, ma));
    FT_TRY(check_mr(r, &d, mb));
    FT_EXPECT(fi_mr_key(ma) != fi_mr_key(mb), "two regions share key %#llx",
              (unsigned long long)fi_mr_key(ma));
    if (!(d.info->domain_attr->mr_mode & FI_MR_PROV_KEY))
        FT_EXPECT(fi_mr_key(ma) == 10 && fi_mr_key(mb) == 11,
                  "without FI_MR_PROV_KEY the keys are %#llx/%#llx, requested 10/11",
                  (unsigned long long)fi_mr_key(ma), (unsigned long long)fi_mr_key(mb));
    ft_note(r, "keys %#llx %#llx, desc %s", (unsigned long long)fi_mr_key(ma),
            (unsigned long long)fi_mr_key(mb), fi_mr_desc(ma) ? "set" : "NULL");
out:
    ret = close_mr(r, mb, ret);
    ret = close_mr(r, ma, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_zero_len(struct ft_run *r) {
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    int rc = fi_mr_reg(d.domain, NULL, 0, FT_MR_ALL, 0, 20, 0, &mr, NULL);
    if (rc) mr = NULL;
    ft_note(r, "fi_mr_reg(NULL, 0) = %d (%s)", rc, rc ? fi_strerror(-rc) : "success");
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_bad_access(struct ft_run *r) {
    static char buf[4096];
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    int rc = fi_mr_reg(d.domain, buf, sizeof(buf), 0, 0, 21, 0, &mr, NULL);
    if (rc) mr = NULL;
    FT_EXPECT(!rc || rc == -FI_EINVAL, "fi_mr_reg(access 0) = %d (%s)", rc, fi_strerror(-rc));
    ft_note(r, "fi_mr_reg(access 0) = %d", rc);
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

/* FI_PMEM on durable memory (a file mapping) succeeds; on anonymous
 * memory, which nothing can make persistent, pmof refuses it. */
static int t_mr_pmem(struct ft_run *r) {
    static char anon[4096];
    char *buf = ft_map_durable(4096);
    struct fi_pmof_attr attr;
    struct fid_mr *mr = NULL, *mr_anon = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    if (!buf) return ft_fail(r, "cannot map a file for a FI_PMEM region");
    FT_TRY(ft_dom_open(r, &d));
    int pm = ft_require_pmof(r, d.domain, &attr);
    int rc = fi_mr_reg(d.domain, buf, 4096, FT_MR_ALL, 0, 22, FI_PMEM, &mr, NULL);
    if (rc) mr = NULL;
    if (pm == FT_SKIP) {
        ret = ft_skip(r, "not a pmof domain; fi_mr_reg(FI_PMEM) = %d (%s)", rc,
                      rc ? fi_strerror(-rc) : "success");
        goto out;
    }
    FT_TRY(pm);
    /* An RNIC makes only persistent memory persistent (rxe: device DAX),
     * and says so; sroce emulates it on any file. */
    if (rc == -FI_EINVAL && !attr.native) {
        ret = ft_skip(r, "the device refuses FI_PMEM for a file that is not persistent memory");
        goto out;
    }
    FT_EXPECT(!rc, "fi_mr_reg(FI_PMEM) = %d (%s)", rc, fi_strerror(-rc));
    FT_EXPECT(attr.mr_flags & FI_PMEM, "fi_pmof_query mr_flags %#llx lack FI_PMEM",
              (unsigned long long)attr.mr_flags);
    rc = fi_mr_reg(d.domain, anon, sizeof(anon), FT_MR_ALL, 0, 23, FI_PMEM, &mr_anon, NULL);
    if (rc) mr_anon = NULL;
    FT_EXPECT(rc == -FI_EINVAL, "fi_mr_reg(FI_PMEM) of anonymous memory = %d, expected -FI_EINVAL",
              rc);
out:
    ret = close_mr(r, mr_anon, ret);
    ret = close_mr(r, mr, ret);
    munmap(buf, 4096);
    return ft_dom_close(r, &d, ret);
}

static int t_mr_close(struct ft_run *r) {
    static char buf[4096];
    struct fid_mr *mr = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    for (int i = 0; i < 3; i++) {
        FT_CHK(fi_mr_reg(d.domain, buf, sizeof(buf), FT_MR_ALL, 0, 30, 0, &mr, NULL));
        struct fid_mr *m = mr;
        mr = NULL;
        FT_CHK(fi_close(&m->fid));
    }
out:
    ret = close_mr(r, mr, ret);
    return ft_dom_close(r, &d, ret);
}

/* ------------------------------------------------------------ av */

/* An enabled RDM endpoint, only for its name. */
struct av_env {
    struct ft_dom d;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    uint8_t name[256];
    size_t namelen;
};

static int av_env_open(struct ft_run *r, struct av_env *e) {
    struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
    struct fi_av_attr aa = {.type = FI_AV_UNSPEC, .count = 4};
    int ret = FT_OK;

    memset(e, 0, sizeof(*e));
    if (r->opts->ep_type != FI_EP_RDM) return ft_skip(r, "AVs belong to RDM endpoints (-e rdm)");
    FT_TRY(ft_dom_open(r, &e->d));
    FT_CHK(fi_cq_open(e->d.domain, &ca, &e->cq, NULL));
    FT_CHK(fi_av_open(e->d.domain, &aa, &e->av, NULL));
    FT_CHK(fi_endpoint(e->d.domain, e->d.info, &e->ep, NULL));
    FT_CHK(fi_ep_bind(e->ep, &e->av->fid, 0));
    FT_CHK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV));
    FT_CHK(fi_enable(e->ep));
    e->namelen = sizeof(e->name);
    FT_CHK(fi_getname(&e->ep->fid, e->name, &e->namelen));
out:
    return ret;
}

static int av_env_close(struct ft_run *r, struct av_env *e, int ret) {
    struct fid *fids[] = {e->ep ? &e->ep->fid : NULL, e->av ? &e->av->fid : NULL,
                          e->cq ? &e->cq->fid : NULL};
    for (size_t i = 0; i < 3; i++) {
        if (!fids[i]) continue;
        int rc = fi_close(fids[i]);
        if (rc) ret = ft_fail(r, "fi_close = %d (%s)", rc, fi_strerror(-rc));
    }
    return ft_dom_close(r, &e->d, ret);
}

static int close_av(struct ft_run *r, struct fid_av *av, int ret) {
    if (!av) return ret;
    int rc = fi_close(&av->fid);
    return rc ? ft_fail(r, "fi_close(av) = %d (%s)", rc, fi_strerror(-rc)) : ret;
}

static int t_av_open(struct ft_run *r) {
    static const enum fi_av_type types[] = {FI_AV_TABLE, FI_AV_MAP};
    struct fid_av *av = NULL;
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    for (size_t i = 0; i < 2; i++) {
        struct fi_av_attr aa = {.type = types[i], .count = 8};
        FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
        ret = close_av(r, av, ret);
        av = NULL;
        FT_TRY(ret);
    }
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

static int av_roundtrip(struct ft_run *r, struct av_env *e, enum fi_av_type type) {
    struct fi_av_attr aa = {.type = type, .count = 8};
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    uint8_t back[256];
    size_t len = sizeof(back);
    char str[256];
    size_t slen = sizeof(str);
    struct fid_av *av = NULL;
    int ret = FT_OK;

    FT_CHK(fi_av_open(e->d.domain, &aa, &av, NULL));
    int n = fi_av_insert(av, e->name, 1, &fa, 0, NULL);
    FT_EXPECT(n == 1 && fa != FI_ADDR_NOTAVAIL, "fi_av_insert(own name, type %d) = %d", type, n);
    FT_CHK(fi_av_lookup(av, fa, back, &len));
    FT_EXPECT(len == e->namelen && !memcmp(back, e->name, len),
              "fi_av_lookup gave %zu bytes differing from the %zu inserted", len, e->namelen);
    str[0] = 0;
    FT_EXPECT(fi_av_straddr(av, e->name, str, &slen) && str[0], "fi_av_straddr gave nothing");
    FT_CHK(fi_av_remove(av, &fa, 1, 0));
out:
    return close_av(r, av, ret);
}

static int t_av_insert(struct ft_run *r) {
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    FT_TRY(av_roundtrip(r, &e, FI_AV_TABLE));
    FT_TRY(av_roundtrip(r, &e, FI_AV_MAP));
out:
    return av_env_close(r, &e, ret);
}

static int t_av_garbage(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = 8};
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    struct fid_av *av = NULL;
    uint8_t junk[256];
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    /* Longer than any address, so a provider reading its own address length
     * stays within it; the family is none there is. */
    memset(junk, 0xa5, sizeof(junk));
    FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
    int n = fi_av_insert(av, junk, 1, &fa, 0, NULL);
    FT_EXPECT(n < 0 || (n == 0 && fa == FI_ADDR_NOTAVAIL),
              "fi_av_insert(garbage) = %d, fi_addr %#llx", n, (unsigned long long)fa);
    ft_note(r, "fi_av_insert(garbage) = %d", n);
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_av(3) asks nothing of an AV before addresses go in: they may be
 * inserted before any endpoint exists, and after one is bound to it, as
 * libfabric's own AV test does with an endpoint that is never enabled. */
static int av_stages(struct ft_run *r, struct ft_dom *d, enum fi_av_type type) {
    struct fi_av_attr aa = {.type = type, .count = 8};
    struct fid_av *av = NULL;
    struct fid_ep *ep = NULL;
    fi_addr_t fa[4] = {FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL, FI_ADDR_NOTAVAIL};
    struct sockaddr_in sin[2];
    int ret = FT_OK, n;

    for (int i = 0; i < 2; i++) {
        memset(&sin[i], 0, sizeof(sin[i]));
        sin[i].sin_family = AF_INET;
        sin[i].sin_port = htons((uint16_t)(7500 + i));
        FT_EXPECT(inet_pton(AF_INET, r->opts->addr, &sin[i].sin_addr) == 1, "address %s",
                  r->opts->addr);
    }
    FT_CHK(fi_av_open(d->domain, &aa, &av, NULL));
    /* A table's indices are known in advance: fi_addr may be NULL there. */
    n = fi_av_insert(av, sin, 2, type == FI_AV_TABLE ? NULL : fa, 0, NULL);
    FT_EXPECT(n == 2, "fi_av_insert before any endpoint (%s) = %d (%s)",
              type == FI_AV_MAP ? "map" : "table", n, fi_strerror(-n));
    if (type == FI_AV_TABLE) fa[0] = 0, fa[1] = 1;
    FT_CHK(fi_endpoint(d->domain, d->info, &ep, NULL));
    FT_CHK(fi_ep_bind(ep, &av->fid, 0));
    for (int i = 0; i < 2; i++) /* two more peers, not the same again */
        sin[i].sin_port = htons((uint16_t)(7502 + i));
    n = fi_av_insert(av, sin, 2, fa + 2, 0, NULL);
    FT_EXPECT(n == 2, "fi_av_insert once bound to an endpoint not yet enabled = %d (%s)", n,
              fi_strerror(-n));
    for (int i = 0; i < 4; i++)
        FT_EXPECT(fa[i] != FI_ADDR_NOTAVAIL, "fi_addr %d not available", i);
    if (type == FI_AV_TABLE)
        FT_EXPECT(fa[2] == 2 && fa[3] == 3, "table indices %llu, %llu after 0 and 1",
                  (unsigned long long)fa[2], (unsigned long long)fa[3]);
out:
    if (ep && fi_close(&ep->fid)) ret = ft_fail(r, "fi_close(ep) failed");
    return close_av(r, av, ret);
}

/* Three addresses for a table: the endpoint's own name, a sockaddr of an
 * unknown family, and the name again with the next port. */
static void good_bad_good(const struct av_env *e, uint8_t *buf) {
    memcpy(buf, e->name, e->namelen);
    memset(buf + e->namelen, 0xa5, e->namelen);
    memcpy(buf + 2 * e->namelen, e->name, e->namelen);
    struct sockaddr_in *sin = (struct sockaddr_in *)(void *)(buf + 2 * e->namelen);
    sin->sin_port = htons((uint16_t)(ntohs(sin->sin_port) + 1));
}

/* fi_av(3): with FI_AV_UNSPEC "the AV type used will be returned through
 * the type field in fi_av_attr". */
static int t_av_unspec_type(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_UNSPEC, .count = 4};
    struct fid_av *av = NULL;
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
    FT_TRY(ft_deviation(r, aa.type != FI_AV_TABLE && aa.type != FI_AV_MAP,
                        "fi_av_open(FI_AV_UNSPEC) left the type %d", aa.type));
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_av(3): a table's addresses take "a pre-determined index" in order, so
 * fi_addr may be NULL and "the application must use ... fi_av_lookup to
 * learn which specific addresses failed": an address that fails keeps its
 * index, and the ones after it keep theirs. */
static int t_av_table_holes(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = 4};
    uint8_t in[3 * 256], back[256];
    struct fid_av *av = NULL;
    struct av_env e;
    size_t len;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    FT_EXPECT(e.namelen >= sizeof(struct sockaddr_in), "a name of %zu bytes", e.namelen);
    good_bad_good(&e, in);
    FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
    int n = fi_av_insert(av, in, 3, NULL, 0, NULL);
    FT_EXPECT(n == 2, "fi_av_insert(good, bad, good) into a table = %d, expected 2", n);
    len = sizeof(back);
    n = fi_av_lookup(av, 1, back, &len);
    FT_TRY(ft_deviation(r, n == 0, "fi_av_lookup of the failed address's index 1 succeeded"));
    len = sizeof(back);
    FT_CHK(fi_av_lookup(av, 2, back, &len));
    FT_TRY(ft_deviation(r, len != e.namelen || memcmp(back, in + 2 * e.namelen, len),
                        "index 2 does not hold the third address inserted"));
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_av(3): FI_SYNC_ERR reports each address's error in an array passed
 * as the context: 0 for those inserted. */
static int t_av_sync_err(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_MAP, .count = 4};
    fi_addr_t fa[3];
    uint8_t in[3 * 256];
    int errs[3] = {7, 7, 7};
    struct fid_av *av = NULL;
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    good_bad_good(&e, in);
    FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
    int n = fi_av_insert(av, in, 3, fa, FI_SYNC_ERR, errs);
    FT_TRY(ft_deviation(r, n != 2 || errs[0] || errs[1] >= 0 || errs[2],
                        "fi_av_insert(good, bad, good, FI_SYNC_ERR) = %d (%s), errors %d %d %d", n,
                        n < 0 ? fi_strerror(-n) : "inserted", errs[0], errs[1], errs[2]));
    if (n == 2)
        FT_EXPECT(fa[0] != FI_ADDR_NOTAVAIL && fa[1] == FI_ADDR_NOTAVAIL &&
                      fa[2] != FI_ADDR_NOTAVAIL,
                  "fi_addr %#llx %#llx %#llx", (unsigned long long)fa[0], (unsigned long long)fa[1],
                  (unsigned long long)fa[2]);
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_av(3): "An AV opened for read-only access must be named". */
static int t_av_read_unnamed(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = 4, .flags = FI_READ};
    struct fid_av *av = NULL;
    struct av_env e;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    int rc = fi_av_open(e.d.domain, &aa, &av, NULL);
    if (rc) av = NULL;
    FT_TRY(ft_deviation(r, rc == 0, "fi_av_open(FI_READ, no name) succeeded"));
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_av(3): fi_av_lookup truncates an address to the buffer and "addrlen
 * is set to the size of the buffer needed"; fi_av_straddr "returns a
 * pointer to buf", truncated and terminated, with the full length in len;
 * a removed address is not found. */
static int t_av_lookup_sizes(struct ft_run *r) {
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = 4};
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    uint8_t back[256];
    char str[5];
    struct fid_av *av = NULL;
    struct av_env e;
    size_t len;
    int ret = av_env_open(r, &e);

    FT_TRY(ret);
    FT_CHK(fi_av_open(e.d.domain, &aa, &av, NULL));
    FT_EXPECT(fi_av_insert(av, e.name, 1, &fa, 0, NULL) == 1, "fi_av_insert(own name)");
    memset(back, 0x5a, sizeof(back));
    len = 4;
    FT_CHK(fi_av_lookup(av, fa, back, &len));
    FT_EXPECT(len == e.namelen, "fi_av_lookup into 4 bytes set addrlen %zu, needed %zu", len,
              e.namelen);
    FT_EXPECT(!memcmp(back, e.name, 4) && back[4] == 0x5a,
              "fi_av_lookup into 4 bytes wrote other than the name's first 4");
    len = 0;
    FT_CHK(fi_av_lookup(av, fa, NULL, &len));
    FT_EXPECT(len == e.namelen, "fi_av_lookup(NULL, 0) set addrlen %zu, needed %zu", len,
              e.namelen);
    len = sizeof(str);
    const char *got = fi_av_straddr(av, e.name, str, &len);
    FT_EXPECT(got == str, "fi_av_straddr returned %p, not its buffer", (const void *)got);
    FT_EXPECT(strlen(str) == sizeof(str) - 1 && len > sizeof(str),
              "fi_av_straddr into 5 bytes: \"%s\", len %zu", str, len);
    FT_CHK(fi_av_remove(av, &fa, 1, 0));
    len = sizeof(back);
    FT_TRY(ft_deviation(r, fi_av_lookup(av, fa, back, &len) == 0,
                        "fi_av_lookup found a removed address"));
out:
    ret = close_av(r, av, ret);
    return av_env_close(r, &e, ret);
}

/* fi_cq(3), fi_av(3), fi_cntr(3): closing an object an endpoint is bound
 * to fails with -FI_EBUSY, and succeeds once the endpoint is gone. */
static int t_close_bound(struct ft_run *r) {
    struct fi_cntr_attr ca = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_NONE};
    struct fid_cntr *cntr = NULL;
    struct fid_ep *ep2 = NULL;
    struct av_env e;
    int ret, rc;

    /* libfabric 1.17's tcp;ofi_rxm crashes in fi_close of a bound CQ. */
    if (!ft_is_pmof_prov(r->opts)) return ft_skip(r, "held to pmof only");
    ret = av_env_open(r, &e);
    FT_TRY(ret);
    FT_CHK(fi_cntr_open(e.d.domain, &ca, &cntr, NULL));
    /* Bound before fi_enable in real use; fi_ep_bind after it is refused
     * by some providers, so a second endpoint takes the counter. */
    FT_CHK(fi_endpoint(e.d.domain, e.d.info, &ep2, NULL));
    rc = fi_ep_bind(ep2, &cntr->fid, FI_SEND);
    if (rc) {
        fi_close(&ep2->fid);
        ep2 = NULL;
        FT_CHK(rc);
    }
    struct fid *bound[] = {&e.cq->fid, &e.av->fid, &cntr->fid};
    const char *names[] = {"CQ", "AV", "counter"};
    for (int i = 0; i < 3; i++) {
        rc = fi_close(bound[i]);
        FT_EXPECT(rc == -FI_EBUSY, "fi_close(bound %s) = %d (%s), expected -FI_EBUSY", names[i], rc,
                  fi_strerror(-rc));
    }
    FT_CHK(fi_close(&ep2->fid));
    ep2 = NULL;
    FT_CHK(fi_close(&cntr->fid));
    cntr = NULL;
out:
    if (ep2) fi_close(&ep2->fid);
    if (cntr && fi_close(&cntr->fid)) ret = ft_fail(r, "fi_close(counter) failed");
    return av_env_close(r, &e, ret);
}

static int t_av_stages(struct ft_run *r) {
    struct ft_dom d;
    int ret = FT_OK;

    if (r->opts->ep_type != FI_EP_RDM) return ft_skip(r, "AVs belong to RDM endpoints (-e rdm)");
    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(av_stages(r, &d, FI_AV_TABLE));
    FT_TRY(av_stages(r, &d, FI_AV_MAP));
out:
    return ft_dom_close(r, &d, ret);
}

/* ------------------------------------------------------------ cntr */

static int close_cntr(struct ft_run *r, struct fid_cntr *c, int ret) {
    if (!c) return ret;
    int rc = fi_close(&c->fid);
    return rc ? ft_fail(r, "fi_close(cntr) = %d (%s)", rc, fi_strerror(-rc)) : ret;
}

/* FT_SKIP (recorded) when a non-pmof provider has no counters. */
static int cntr_open(struct ft_run *r, struct fid_domain *dom, enum fi_wait_obj wait,
                     struct fid_cntr **c) {
    struct fi_cntr_attr attr = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = wait};
    int rc = fi_cntr_open(dom, &attr, c, NULL);

    if (!rc) return FT_OK;
    *c = NULL;
    if (rc == -FI_ENOSYS && !ft_is_pmof_prov(r->opts))
        return ft_skip(r, "%s has no counters (fi_cntr_open: -FI_ENOSYS)", r->opts->prov);
    return ft_fail(r, "fi_cntr_open(wait %d) = %d (%s)", wait, rc, fi_strerror(-rc));
}

static int t_cntr_open(struct ft_run *r) {
    struct fid_cntr *c = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(cntr_open(r, d.domain, FI_WAIT_UNSPEC, &c));
    ret = close_cntr(r, c, ret);
    c = NULL;
    FT_TRY(ret);
    FT_TRY(cntr_open(r, d.domain, FI_WAIT_NONE, &c));
out:
    ret = close_cntr(r, c, ret);
    return ft_dom_close(r, &d, ret);
}

static int t_cntr_add_set(struct ft_run *r) {
    struct fid_cntr *c = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(cntr_open(r, d.domain, FI_WAIT_UNSPEC, &c));
    FT_EXPECT(fi_cntr_read(c) == 0 && fi_cntr_readerr(c) == 0, "a new counter is not 0");
    FT_CHK(fi_cntr_add(c, 5));
    FT_EXPECT(fi_cntr_read(c) == 5, "counter %llu after add 5",
              (unsigned long long)fi_cntr_read(c));
    FT_CHK(fi_cntr_set(c, 2));
    FT_EXPECT(fi_cntr_read(c) == 2, "counter %llu after set 2",
              (unsigned long long)fi_cntr_read(c));
    FT_CHK(fi_cntr_adderr(c, 3));
    FT_EXPECT(fi_cntr_readerr(c) == 3, "error counter %llu after adderr 3",
              (unsigned long long)fi_cntr_readerr(c));
    FT_CHK(fi_cntr_seterr(c, 0));
    FT_EXPECT(fi_cntr_readerr(c) == 0, "error counter not 0 after seterr 0");
    FT_CHK(fi_cntr_wait(c, 2, 100));
out:
    ret = close_cntr(r, c, ret);
    return ft_dom_close(r, &d, ret);
}

static int cntr_probe(struct ft_run *r) {
    struct fid_cntr *c = NULL;
    struct ft_dom d;
    int ret = FT_OK;

    FT_TRY(ft_dom_open(r, &d));
    FT_TRY(cntr_open(r, d.domain, FI_WAIT_UNSPEC, &c));
out:
    ret = close_cntr(r, c, ret);
    return ft_dom_close(r, &d, ret);
}

#define FT_CNTR_WRITES 8

static int t_cntr_writes(struct ft_run *r) {
    struct ft_pair_cfg cfg = {.write_cntr = true};
    struct fi_context2 ctx[FT_CNTR_WRITES];
    struct ft_buf src = {0}, dst = {0};
    struct ft_pair p = {0};
    int ret = cntr_probe(r);

    if (ret != FT_OK) return ret;
    FT_TRY(ft_pair_open(r, &p, &cfg));
    struct ft_side *c = &p.s[FT_CLI], *s = &p.s[FT_SRV];
    FT_TRY(ft_buf_alloc(&p, c, 4096, FT_ACC_LOCAL, 0, &src));
    FT_TRY(ft_buf_alloc(&p, s, 4096, FT_ACC_REMOTE, 0, &dst));
    for (int i = 0; i < FT_CNTR_WRITES; i++)
        FT_POST(&p, fi_write(c->ep, src.buf, 512, src.desc, c->peer, dst.raddr + 512 * i, dst.key,
                             &ctx[i]));
    FT_CHK(fi_cntr_wait(c->wcntr, FT_CNTR_WRITES, 5000));
    FT_EXPECT(fi_cntr_read(c->wcntr) == FT_CNTR_WRITES, "write counter %llu, expected %d",
              (unsigned long long)fi_cntr_read(c->wcntr), FT_CNTR_WRITES);
    FT_EXPECT(fi_cntr_readerr(c->wcntr) == 0, "write error counter %llu",
              (unsigned long long)fi_cntr_readerr(c->wcntr));
    for (int i = 0; i < FT_CNTR_WRITES; i++)
        FT_TRY(ft_expect_comp(&p, &c->tx, &ctx[i], FI_RMA | FI_WRITE, SIZE_MAX, NULL));
out:
    ret = ft_pair_stop(&p, ret);
    ret = ft_buf_free(r, &src) ? FT_FAIL : ret;
    ret = ft_buf_free(r, &dst) ? FT_FAIL : ret;
    return ft_pair_close(&p, ret);
}

const struct ft_test ft_object_tests[] = {
    {"fabric_domain.open_close", t_fabric_domain},
    {"domain.ops_open_unknown", t_ops_open_unknown},
    {"domain.set_ops", t_set_ops},
    {"eq.open_close", t_eq_open_close},
    {"eq.write_read", t_eq_write_read},
    {"eq.sread_timeout", t_eq_sread_timeout},
    {"eq.readerr_empty", t_eq_readerr_empty},
    {"eq.peek", t_eq_peek},
    {"cq.open_formats", t_cq_formats},
    {"cq.wait_objects", t_cq_waits},
    {"cq.sread_timeout", t_cq_sread_timeout},
    {"cq.readerr_empty", t_cq_readerr_empty},
    {"cq.signal", t_cq_signal},
    {"cq.many", t_cq_many},
    {"cq.strerror", t_cq_strerror},
    {"mr.reg", t_mr_reg},
    {"mr.regv", t_mr_regv},
    {"mr.regattr", t_mr_regattr},
    {"mr.key_desc", t_mr_key_desc},
    {"mr.zero_len", t_mr_zero_len},
    {"mr.bad_access", t_mr_bad_access},
    {"mr.pmem", t_mr_pmem},
    {"mr.close", t_mr_close},
    {"av.open", t_av_open},
    {"av.insert_lookup", t_av_insert},
    {"av.insert_garbage", t_av_garbage},
    {"av.insert_stages", t_av_stages},
    {"av.unspec_type", t_av_unspec_type},
    {"av.table_holes", t_av_table_holes},
    {"av.sync_err", t_av_sync_err},
    {"av.read_unnamed", t_av_read_unnamed},
    {"av.lookup_sizes", t_av_lookup_sizes},
    {"objects.close_bound", t_close_bound},
    {"cntr.open", t_cntr_open},
    {"cntr.add_set_read", t_cntr_add_set},
    {"cntr.write_wait", t_cntr_writes},
    {NULL, NULL},
};
