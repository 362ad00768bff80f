/* SPDX-License-Identifier: MIT */
/* Shared helpers: infos, endpoint pairs, progress and completion waits,
 * registered buffers and data patterns. */
#include "fabtest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ time */

uint64_t ft_now_us(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void ft_sleep_ms(unsigned ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

static bool timed_out(uint64_t start_us) {
    return ft_now_us() - start_us > (uint64_t)FT_TIMEOUT_MS * 1000u;
}

/* ------------------------------------------------------------ infos */

const char *ft_ep_name(enum fi_ep_type type) {
    return type == FI_EP_MSG ? "msg" : type == FI_EP_RDM ? "rdm" : "other";
}

bool ft_is_pmof_prov(const struct ft_opts *o) {
    size_t n = strcspn(o->prov, ";");

    return n == 4 && !strncmp(o->prov, "pmof", 4);
}

bool ft_strict(const struct ft_run *r) {
    return ft_is_pmof_prov(r->opts);
}

int ft_deviation(struct ft_run *r, bool bad, const char *fmt, ...) {
    char msg[256];
    va_list ap;

    if (!bad) return FT_OK;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (ft_strict(r)) return ft_fail(r, "%s", msg);
    ft_note(r, "%s deviation: %s", r->opts->prov, msg);
    return FT_OK;
}

struct fi_info *ft_hints(const struct ft_opts *o, enum fi_ep_type type) {
    struct fi_info *h = fi_allocinfo();

    if (!h) return NULL;
    h->ep_attr->type = type;
    h->caps = FI_MSG | FI_RMA;
    /* FI_RX_CQ_DATA: the remote CQ data tests post receives for it. */
    h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    h->fabric_attr->prov_name = strdup(o->prov);
    if (!h->fabric_attr->prov_name) {
        fi_freeinfo(h);
        return NULL;
    }
    return h;
}

int ft_getinfo(struct ft_run *r, const char *node, const char *service, uint64_t flags,
               const struct fi_info *hints, struct fi_info **info, int *rc) {
    *info = NULL;
    *rc = fi_getinfo(FT_API_VERSION, node, service, flags, (struct fi_info *)hints, info);
    if (*rc) return FT_OK;
    for (struct fi_info *i = *info; i; i = i->next) {
        const char *name = i->fabric_attr ? i->fabric_attr->prov_name : NULL;
        if (!name || strcmp(name, r->opts->prov)) {
            ft_fail(r, "fi_getinfo returned an info of provider '%s', not '%s'",
                    name ? name : "(null)", r->opts->prov);
            fi_freeinfo(*info);
            *info = NULL;
            return FT_FAIL;
        }
    }
    return FT_OK;
}

int ft_getinfo_ok(struct ft_run *r, const char *node, const char *service, uint64_t flags,
                  const struct fi_info *hints, struct fi_info **info) {
    int rc;

    if (ft_getinfo(r, node, service, flags, hints, info, &rc) != FT_OK) return FT_FAIL;
    if (rc)
        return ft_fail(r, "fi_getinfo(%s, %s, %s) = %d (%s)", node ? node : "NULL",
                       service ? service : "NULL", ft_ep_name(hints->ep_attr->type), rc,
                       fi_strerror(-rc));
    return FT_OK;
}

int ft_dom_open(struct ft_run *r, struct ft_dom *d) {
    struct fi_info *hints = ft_hints(r->opts, r->opts->ep_type);
    int ret = FT_OK;

    memset(d, 0, sizeof(*d));
    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &d->info));
    FT_CHK(fi_fabric(d->info->fabric_attr, &d->fabric, NULL));
    FT_CHK(fi_domain(d->fabric, d->info, &d->domain, NULL));
out:
    fi_freeinfo(hints);
    return ret;
}

static int close_fid(struct ft_run *r, struct fid *fid, const char *what, int ret) {
    if (!fid) return ret;
    int rc = fi_close(fid);
    if (rc) return ft_fail(r, "fi_close(%s) = %d (%s)", what, rc, fi_strerror(-rc));
    return ret;
}

int ft_dom_close(struct ft_run *r, struct ft_dom *d, int ret) {
    ret = close_fid(r, d->domain ? &d->domain->fid : NULL, "domain", ret);
    ret = close_fid(r, d->fabric ? &d->fabric->fid : NULL, "fabric", ret);
    if (d->info) fi_freeinfo(d->info);
    memset(d, 0, sizeof(*d));
    return ret;
}

int ft_require_pmof(struct ft_run *r, struct fid_domain *domain, struct fi_pmof_attr *attr) {
    memset(attr, 0, sizeof(*attr));
    attr->size = sizeof(*attr);
    int rc = fi_pmof_query(domain, attr);
    if (!rc) return FT_OK;
    if (rc == -FI_ENOSYS && !ft_is_pmof_prov(r->opts))
        return ft_skip(r, "not a pmof domain (fi_pmof_query: -FI_ENOSYS)");
    return ft_fail(r, "fi_pmof_query = %d (%s)", rc, fi_strerror(-rc));
}

/* ------------------------------------------------------------ progress */

static int cq_drain(struct ft_run *r, struct ft_cq *c) {
    struct fi_cq_tagged_entry e[16];

    while (c->cq && c->n < FT_CQ_BACKLOG) {
        size_t room = FT_CQ_BACKLOG - c->n;
        ssize_t n = fi_cq_read(c->cq, e, room < 16 ? room : 16);
        if (n == -FI_EAGAIN) return FT_OK;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            ssize_t rc = fi_cq_readerr(c->cq, &err, 0);
            if (rc == -FI_EAGAIN) continue;
            if (rc != 1) return ft_fail(r, "fi_cq_readerr(%s) = %zd", c->name, rc);
            c->q[c->n++] = (struct ft_comp){
                .is_err = true,
                .e = {err.op_context, err.flags, err.len, err.buf, err.data},
                .tag = err.tag,
                .err = err.err,
                .prov_errno = err.prov_errno,
                .olen = err.olen,
            };
            continue;
        }
        if (n < 0) return ft_fail(r, "fi_cq_read(%s) = %zd (%s)", c->name, n, fi_strerror((int)-n));
        for (ssize_t i = 0; i < n; i++)
            c->q[c->n++] = (struct ft_comp){
                .e = {e[i].op_context, e[i].flags, e[i].len, e[i].buf, e[i].data},
                .tag = e[i].tag,
            };
    }
    return FT_OK;
}

static int eq_drain(struct ft_run *r, struct ft_eq *q) {
    while (q->eq && q->n < FT_EQ_BACKLOG) {
        struct ft_eqev *ev = &q->q[q->n];
        memset(ev, 0, sizeof(*ev));
        ssize_t n = fi_eq_read(q->eq, &ev->event, ev->u.raw, sizeof(ev->u.raw), 0);
        if (n == -FI_EAGAIN) return FT_OK;
        if (n == -FI_EAVAIL) {
            ev->is_err = true;
            ev->err.err_data = ev->err_data;
            ev->err.err_data_size = sizeof(ev->err_data);
            n = fi_eq_readerr(q->eq, &ev->err, 0);
            if (n == -FI_EAGAIN) continue;
            if (n < 0) return ft_fail(r, "fi_eq_readerr(%s) = %zd", q->name, n);
            /* A provider may hand out its own buffer instead of ours. */
            if (ev->err.err_data != ev->err_data && ev->err.err_data) {
                size_t len = ev->err.err_data_size;
                if (len > sizeof(ev->err_data)) len = sizeof(ev->err_data);
                memcpy(ev->err_data, ev->err.err_data, len);
                ev->err.err_data_size = len;
            }
            if (!ev->err.err_data) ev->err.err_data_size = 0;
            q->n++;
            continue;
        }
        if (n < 0) return ft_fail(r, "fi_eq_read(%s) = %zd (%s)", q->name, n, fi_strerror((int)-n));
        ev->len = n;
        q->n++;
    }
    return FT_OK;
}

int ft_progress(struct ft_pair *p) {
    for (int i = 0; i < 2; i++) {
        struct ft_side *s = &p->s[i];
        if (cq_drain(p->r, &s->tx) || cq_drain(p->r, &s->rx) || eq_drain(p->r, &s->eq))
            return FT_FAIL;
    }
    return FT_OK;
}

static bool take_comp(struct ft_cq *c, void *ctx, struct ft_comp *out) {
    for (size_t i = 0; i < c->n; i++) {
        if (ctx && c->q[i].e.op_context != ctx) continue;
        *out = c->q[i];
        memmove(&c->q[i], &c->q[i + 1], (c->n - i - 1) * sizeof(c->q[0]));
        c->n--;
        return true;
    }
    return false;
}

int ft_wait_comp(struct ft_pair *p, struct ft_cq *cq, void *ctx, struct ft_comp *out) {
    uint64_t start = ft_now_us();

    while (!take_comp(cq, ctx, out)) {
        if (ft_progress(p)) return FT_FAIL;
        if (timed_out(start))
            return ft_fail(p->r, "timed out waiting for a completion (context %p) on %s", ctx,
                           cq->name);
    }
    return FT_OK;
}

static int comp_error(struct ft_run *r, const struct ft_cq *cq, const struct ft_comp *c) {
    return ft_fail(r, "error completion on %s: err %d (%s), prov_errno %d", cq->name, c->err,
                   fi_strerror(c->err), c->prov_errno);
}

int ft_expect_comp(struct ft_pair *p, struct ft_cq *cq, void *ctx, uint64_t flags, size_t len,
                   struct ft_comp *out) {
    struct ft_comp c;

    if (ft_wait_comp(p, cq, ctx, &c)) return FT_FAIL;
    if (out) *out = c;
    if (c.is_err) return comp_error(p->r, cq, &c);
    if ((c.e.flags & flags) != flags)
        return ft_fail(p->r, "completion on %s has flags %#llx, lacking %#llx", cq->name,
                       (unsigned long long)c.e.flags, (unsigned long long)(flags & ~c.e.flags));
    if (len != SIZE_MAX && c.e.len != len)
        return ft_fail(p->r, "completion on %s has len %zu, expected %zu", cq->name, c.e.len, len);
    return FT_OK;
}

int ft_expect_err(struct ft_pair *p, struct ft_cq *cq, void *ctx, struct ft_comp *out) {
    if (ft_wait_comp(p, cq, ctx, out)) return FT_FAIL;
    if (!out->is_err)
        return ft_fail(p->r, "expected an error completion on %s, got success (flags %#llx)",
                       cq->name, (unsigned long long)out->e.flags);
    return FT_OK;
}

int ft_expect_quiet(struct ft_pair *p, struct ft_cq *cq, unsigned ms, const char *what) {
    uint64_t start = ft_now_us();

    while (ft_now_us() - start < ms * 1000ull)
        if (ft_progress(p)) return FT_FAIL;
    if (cq->n)
        return ft_fail(p->r, "%s: unexpected %s completion on %s (context %p, flags %#llx)", what,
                       cq->q[0].is_err ? "error" : "", cq->name, cq->q[0].e.op_context,
                       (unsigned long long)cq->q[0].e.flags);
    return FT_OK;
}

int ft_wait_eq_any(struct ft_pair *p, struct ft_eq *eq, struct ft_eqev *out) {
    uint64_t start = ft_now_us();

    while (!eq->n) {
        if (ft_progress(p)) return FT_FAIL;
        if (timed_out(start))
            return ft_fail(p->r, "timed out waiting for an event on %s", eq->name);
    }
    *out = eq->q[0];
    out->err.err_data = out->err.err_data_size ? out->err_data : NULL;
    memmove(&eq->q[0], &eq->q[1], (eq->n - 1) * sizeof(eq->q[0]));
    eq->n--;
    return FT_OK;
}

const char *ft_event_name(uint32_t event) {
    switch (event) {
    case FI_NOTIFY:
        return "FI_NOTIFY";
    case FI_CONNREQ:
        return "FI_CONNREQ";
    case FI_CONNECTED:
        return "FI_CONNECTED";
    case FI_SHUTDOWN:
        return "FI_SHUTDOWN";
    case FI_MR_COMPLETE:
        return "FI_MR_COMPLETE";
    case FI_AV_COMPLETE:
        return "FI_AV_COMPLETE";
    case FI_JOIN_COMPLETE:
        return "FI_JOIN_COMPLETE";
    case FI_COMMIT_EVENT:
        return "FI_COMMIT_EVENT";
    default:
        return "unknown event";
    }
}

int ft_wait_event(struct ft_pair *p, struct ft_eq *eq, uint32_t event, struct ft_eqev *out) {
    if (ft_wait_eq_any(p, eq, out)) return FT_FAIL;
    if (out->is_err)
        return ft_fail(p->r, "error event on %s while waiting for %s: err %d (%s)", eq->name,
                       ft_event_name(event), out->err.err, fi_strerror(out->err.err));
    if (out->event != event)
        return ft_fail(p->r, "event %s (%u) on %s, expected %s", ft_event_name(out->event),
                       out->event, eq->name, ft_event_name(event));
    return FT_OK;
}

int ft_wait_until(struct ft_pair *p, bool (*cond)(void *), void *arg, const char *what) {
    uint64_t start = ft_now_us();

    while (!cond(arg)) {
        if (ft_progress(p)) return FT_FAIL;
        if (timed_out(start)) return ft_fail(p->r, "timed out waiting for %s", what);
    }
    return FT_OK;
}

/* ------------------------------------------------------------ pairs */

static int open_cq(struct ft_pair *p, struct ft_side *s, struct ft_cq *c, size_t size) {
    struct fi_cq_attr attr = {
        .size = size, .format = FI_CQ_FORMAT_TAGGED, .wait_obj = p->cfg.cq_wait};
    int ret = FT_OK;
    struct ft_run *r = p->r;

    FT_CHK(fi_cq_open(s->domain, &attr, &c->cq, NULL));
out:
    return ret;
}

static int open_eq(struct ft_pair *p, struct ft_eq *q) {
    struct fi_eq_attr attr = {.size = 64, .wait_obj = FI_WAIT_UNSPEC};
    int ret = FT_OK;
    struct ft_run *r = p->r;

    FT_CHK(fi_eq_open(p->fabric, &attr, &q->eq, NULL));
out:
    return ret;
}

static int bind_side(struct ft_pair *p, struct ft_side *s) {
    int ret = FT_OK;
    struct ft_run *r = p->r;

    if (s->eq.eq) FT_CHK(fi_ep_bind(s->ep, &s->eq.eq->fid, 0));
    if (s->av) FT_CHK(fi_ep_bind(s->ep, &s->av->fid, 0));
    FT_CHK(fi_ep_bind(s->ep, &s->tx.cq->fid, FI_TRANSMIT | p->cfg.tx_bind_flags));
    FT_CHK(fi_ep_bind(s->ep, &s->rx.cq->fid, FI_RECV));
    if (s->wcntr) FT_CHK(fi_ep_bind(s->ep, &s->wcntr->fid, FI_WRITE));
    FT_CHK(fi_enable(s->ep));
out:
    return ret;
}

int ft_side_open_ep(struct ft_pair *p, struct ft_side *s, struct fi_info *info) {
    int ret = FT_OK;
    struct ft_run *r = p->r;
    bool rdm = info->ep_attr->type == FI_EP_RDM;

    s->info = info;
    FT_CHK(fi_domain(p->fabric, info, &s->domain, NULL));
    if (p->cfg.hmem)
        FT_CHK(fi_set_ops(&s->domain->fid, FI_SET_OPS_HMEM_OVERRIDE, 0, p->cfg.hmem, NULL));
    FT_TRY(open_cq(p, s, &s->tx, info->tx_attr->size));
    FT_TRY(open_cq(p, s, &s->rx, info->rx_attr->size));
    if (!s->eq.eq && (!rdm || p->cfg.rdm_eq)) FT_TRY(open_eq(p, &s->eq));
    if (rdm) {
        struct fi_av_attr av = {.type = info->domain_attr->av_type, .count = 4};
        FT_CHK(fi_av_open(s->domain, &av, &s->av, NULL));
    }
    if (p->cfg.write_cntr && s == &p->s[FT_CLI]) {
        struct fi_cntr_attr ca = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC};
        FT_CHK(fi_cntr_open(s->domain, &ca, &s->wcntr, NULL));
    }
    FT_CHK(fi_endpoint(s->domain, info, &s->ep, NULL));
    FT_TRY(bind_side(p, s));
out:
    return ret;
}

/* Mode bits the pair needs the provider to keep (among the infos it
 * offers, the first that does): a provider may list the modes an
 * application accepts after the infos that need none.  A `plain` side
 * takes the first info that needs none of them, so that one end of a
 * connection can have a mode the other has not. */
#define FT_REQUIRED_MODES FI_COMMIT_MANUAL

static void pick_mode(struct fi_info **list, uint64_t mode, bool plain) {
    mode &= FT_REQUIRED_MODES;
    if (!mode || !*list) return;
    for (struct fi_info *fi = *list; fi; fi = fi->next) {
        if (plain ? (fi->mode & mode) != 0 : (fi->mode & mode) != mode) continue;
        struct fi_info *dup = fi_dupinfo(fi);
        if (!dup) return;
        fi_freeinfo(*list);
        *list = dup;
        return;
    }
}

int ft_pair_prepare(struct ft_run *r, struct ft_pair *p, const struct ft_pair_cfg *cfg) {
    int ret = FT_OK;

    memset(p, 0, sizeof(*p));
    p->r = r;
    if (cfg) p->cfg = *cfg;
    static const char *const names[2][4] = {
        {"server", "server tx CQ", "server rx CQ", "server EQ"},
        {"client", "client tx CQ", "client rx CQ", "client EQ"}};
    for (int i = 0; i < 2; i++) {
        p->s[i] = (struct ft_side){.name = names[i][0], .peer = FI_ADDR_UNSPEC, .next_key = 1};
        p->s[i].tx.name = names[i][1];
        p->s[i].rx.name = names[i][2];
        p->s[i].eq.name = names[i][3];
    }
    p->hints = ft_hints(r->opts, r->opts->ep_type);
    FT_EXPECT(p->hints, "out of memory");
    p->hints->mode |= p->cfg.mode;
    p->hints->caps |= p->cfg.caps;
    p->hints->tx_attr->op_flags = p->cfg.tx_op_flags;
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, p->hints, &p->info));
    if (r->opts->ep_type == FI_EP_RDM && p->cfg.plain[FT_CLI] != p->cfg.plain[FT_SRV]) {
        FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, p->hints, &p->rdm_cli_info));
        pick_mode(&p->rdm_cli_info, p->cfg.mode, p->cfg.plain[FT_CLI]);
    }
    pick_mode(&p->info, p->cfg.mode, p->cfg.plain[FT_SRV]);
    if (r->opts->ep_type == FI_EP_RDM && p->cfg.cli_caps_off) {
        fi_freeinfo(p->rdm_cli_info);
        p->rdm_cli_info = fi_dupinfo(p->info);
        FT_EXPECT(p->rdm_cli_info, "fi_dupinfo failed");
        p->rdm_cli_info->caps &= ~p->cfg.cli_caps_off;
        p->rdm_cli_info->tx_attr->caps &= ~p->cfg.cli_caps_off;
        p->rdm_cli_info->rx_attr->caps &= ~p->cfg.cli_caps_off;
    }
    FT_CHK(fi_fabric(p->info->fabric_attr, &p->fabric, NULL));
out:
    return ret;
}

int ft_msg_listen(struct ft_pair *p) {
    int ret = FT_OK;
    struct ft_run *r = p->r;
    struct ft_side *s = &p->s[FT_SRV];

    FT_TRY(open_eq(p, &s->eq));
    FT_CHK(fi_passive_ep(p->fabric, p->info, &p->pep, NULL));
    FT_CHK(fi_pep_bind(p->pep, &s->eq.eq->fid, 0));
    FT_CHK(fi_listen(p->pep));
out:
    return ret;
}

static int pep_port(struct ft_pair *p, char *service, size_t len) {
    struct sockaddr_storage ss;
    size_t alen = sizeof(ss);
    int ret = FT_OK;
    struct ft_run *r = p->r;

    FT_CHK(fi_getname(&p->pep->fid, &ss, &alen));
    if (ss.ss_family == AF_INET)
        snprintf(service, len, "%u", ntohs(((struct sockaddr_in *)&ss)->sin_port));
    else if (ss.ss_family == AF_INET6)
        snprintf(service, len, "%u", ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    else
        FT_EXPECT(0, "passive endpoint name has address family %d", ss.ss_family);
out:
    return ret;
}

int ft_msg_client(struct ft_pair *p, const char *service, const void *param, size_t len) {
    char port[16];
    struct fi_info *info = NULL;
    int ret = FT_OK;
    struct ft_run *r = p->r;

    if (!service) {
        FT_TRY(pep_port(p, port, sizeof(port)));
        service = port;
    }
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, service, 0, p->hints, &info));
    pick_mode(&info, p->cfg.mode, p->cfg.plain[FT_CLI]);
    FT_EXPECT(info->dest_addr, "client info has no dest_addr");
    FT_TRY(ft_side_open_ep(p, &p->s[FT_CLI], info));
    FT_CHK(fi_connect(p->s[FT_CLI].ep, info->dest_addr, param, len));
out:
    if (info && p->s[FT_CLI].info != info) fi_freeinfo(info);
    return ret;
}

int ft_msg_accept(struct ft_pair *p, struct fi_info *connreq) {
    int ret = FT_OK;
    struct ft_run *r = p->r;

    FT_TRY(ft_side_open_ep(p, &p->s[FT_SRV], connreq));
    FT_CHK(fi_accept(p->s[FT_SRV].ep, NULL, 0));
out:
    return ret;
}

static int check_connected(struct ft_pair *p, struct ft_side *s) {
    struct ft_eqev ev;
    int ret = FT_OK;
    struct ft_run *r = p->r;

    FT_TRY(ft_wait_event(p, &s->eq, FI_CONNECTED, &ev));
    FT_EXPECT(ev.u.cm.fid == &s->ep->fid, "%s FI_CONNECTED fid %p, expected its endpoint %p",
              s->name, (void *)ev.u.cm.fid, (void *)&s->ep->fid);
    FT_EXPECT(ev.len == (ssize_t)sizeof(struct fi_eq_cm_entry),
              "%s FI_CONNECTED entry length %zd, expected %zu", s->name, ev.len,
              sizeof(struct fi_eq_cm_entry));
out:
    return ret;
}

static int msg_connect(struct ft_pair *p) {
    struct ft_eqev ev;
    int ret = FT_OK;

    FT_TRY(ft_msg_listen(p));
    FT_TRY(ft_msg_client(p, NULL, NULL, 0));
    FT_TRY(ft_wait_event(p, &p->s[FT_SRV].eq, FI_CONNREQ, &ev));
    FT_TRY(ft_msg_accept(p, ev.u.cm.info));
    FT_TRY(check_connected(p, &p->s[FT_SRV]));
    FT_TRY(check_connected(p, &p->s[FT_CLI]));
    p->connected = true;
out:
    return ret;
}

static int rdm_connect(struct ft_pair *p) {
    uint8_t name[2][256];
    size_t len[2] = {sizeof(name[0]), sizeof(name[1])};
    int ret = FT_OK;
    struct ft_run *r = p->r;

    for (int i = 0; i < 2; i++) {
        struct fi_info *info =
            fi_dupinfo(i == FT_CLI && p->rdm_cli_info ? p->rdm_cli_info : p->info);
        FT_EXPECT(info, "fi_dupinfo failed");
        FT_TRY(ft_side_open_ep(p, &p->s[i], info));
        FT_CHK(fi_getname(&p->s[i].ep->fid, name[i], &len[i]));
    }
    for (int i = 0; i < 2; i++) {
        int n = fi_av_insert(p->s[i].av, name[1 - i], 1, &p->s[i].peer, 0, NULL);
        FT_EXPECT(n == 1, "fi_av_insert(%s) = %d", p->s[i].name, n);
        FT_EXPECT(p->s[i].peer != FI_ADDR_NOTAVAIL, "fi_av_insert gave FI_ADDR_NOTAVAIL");
    }
out:
    return ret;
}

int ft_pair_open(struct ft_run *r, struct ft_pair *p, const struct ft_pair_cfg *cfg) {
    int ret = FT_OK;

    FT_TRY(ft_pair_prepare(r, p, cfg));
    if (r->opts->ep_type == FI_EP_MSG)
        FT_TRY(msg_connect(p));
    else
        FT_TRY(rdm_connect(p));
out:
    return ret;
}

static int close_side(struct ft_run *r, struct ft_side *s, int ret) {
    ret = close_fid(r, s->ep ? &s->ep->fid : NULL, "endpoint", ret);
    ret = close_fid(r, s->wcntr ? &s->wcntr->fid : NULL, "counter", ret);
    ret = close_fid(r, s->tx.cq ? &s->tx.cq->fid : NULL, "tx CQ", ret);
    ret = close_fid(r, s->rx.cq ? &s->rx.cq->fid : NULL, "rx CQ", ret);
    ret = close_fid(r, s->av ? &s->av->fid : NULL, "AV", ret);
    return ret;
}

int ft_pair_stop(struct ft_pair *p, int ret) {
    if (!p->r) return ret;
    for (int i = 0; i < 2; i++) {
        ret = close_fid(p->r, p->s[i].ep ? &p->s[i].ep->fid : NULL, "endpoint", ret);
        p->s[i].ep = NULL;
    }
    return ret;
}

int ft_pair_close(struct ft_pair *p, int ret) {
    struct ft_run *r = p->r;

    if (!r) return ret;
    /* Endpoints first: a connection's peer may still be sending. */
    ret = close_side(r, &p->s[FT_CLI], ret);
    ret = close_side(r, &p->s[FT_SRV], ret);
    ret = close_fid(r, p->pep ? &p->pep->fid : NULL, "passive endpoint", ret);
    for (int i = 0; i < 2; i++) {
        struct ft_side *s = &p->s[i];
        for (size_t k = 0; k < s->eq.n; k++)
            if (!s->eq.q[k].is_err && s->eq.q[k].event == FI_CONNREQ)
                fi_freeinfo(s->eq.q[k].u.cm.info);
        ret = close_fid(r, s->eq.eq ? &s->eq.eq->fid : NULL, "EQ", ret);
        ret = close_fid(r, s->domain ? &s->domain->fid : NULL, "domain", ret);
        if (s->info) fi_freeinfo(s->info);
    }
    ret = close_fid(r, p->fabric ? &p->fabric->fid : NULL, "fabric", ret);
    fi_freeinfo(p->info);
    fi_freeinfo(p->rdm_cli_info);
    fi_freeinfo(p->hints);
    memset(p, 0, sizeof(*p));
    return ret;
}

/* ------------------------------------------------------------ buffers */

uint64_t ft_request_key(struct ft_side *s) {
    return s->next_key++;
}

/* The files behind FI_PMEM regions stay linked while mapped (an unlinked
 * file is not durable) and are removed at exit. */
static char ft_pmem_paths[64][256];
static unsigned ft_pmem_count;

static void ft_pmem_cleanup(void) {
    for (unsigned i = 0; i < ft_pmem_count; i++)
        unlink(ft_pmem_paths[i]);
}

void *ft_map_durable(size_t len) {
    const char *dir = getenv("FT_PMEM_DIR");
    char *path;
    void *mem;
    int fd;

    if (ft_pmem_count == sizeof(ft_pmem_paths) / sizeof(ft_pmem_paths[0])) {
        ft_pmem_cleanup();
        ft_pmem_count = 0;
    }
    if (!ft_pmem_count) atexit(ft_pmem_cleanup);
    path = ft_pmem_paths[ft_pmem_count];
    snprintf(path, sizeof(ft_pmem_paths[0]), "%s/pmof_fabtest.XXXXXX", dir ? dir : "/var/tmp");
    fd = mkstemp(path);
    if (fd < 0) return NULL;
    ft_pmem_count++;
    if (ftruncate(fd, (off_t)len)) {
        close(fd);
        return NULL;
    }
    mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return mem == MAP_FAILED ? NULL : mem;
}

int ft_buf_alloc(struct ft_pair *p, struct ft_side *s, size_t len, uint64_t access, uint64_t flags,
                 struct ft_buf *b) {
    void *mem = NULL;
    int ret = FT_OK;
    struct ft_run *r = p->r;
    uint64_t mr_mode = s->info->domain_attr->mr_mode;

    memset(b, 0, sizeof(*b));
    if (flags & FI_PMEM) {
        /* Persistence can only be promised for memory that has it: a
         * provider refuses FI_PMEM on anonymous memory. */
        b->map_len = len ? len : 1;
        mem = ft_map_durable(b->map_len);
        FT_EXPECT(mem, "cannot map a file for a FI_PMEM region");
    } else {
        FT_EXPECT(!posix_memalign(&mem, 4096, len ? len : 1), "out of memory");
    }
    b->buf = mem;
    b->len = len;
    memset(b->buf, 0, len);
    FT_CHK(fi_mr_reg(s->domain, b->buf, len, access, 0, ft_request_key(s), flags, &b->mr, NULL));
    b->key = fi_mr_key(b->mr);
    FT_EXPECT(b->key != FI_KEY_NOTAVAIL, "fi_mr_key = FI_KEY_NOTAVAIL");
    b->desc = fi_mr_desc(b->mr);
    FT_EXPECT(b->desc || !(mr_mode & FI_MR_LOCAL), "fi_mr_desc = NULL with FI_MR_LOCAL");
    b->raddr = (mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)b->buf : 0;
out:
    return ret;
}

int ft_buf_free(struct ft_run *r, struct ft_buf *b) {
    int ret = close_fid(r, b->mr ? &b->mr->fid : NULL, "memory region", FT_OK);

    if (b->map_len)
        munmap(b->buf, b->map_len);
    else
        free(b->buf);
    memset(b, 0, sizeof(*b));
    return ret;
}

static uint8_t pattern_byte(size_t i, unsigned seed) {
    return (uint8_t)(seed * 131u + i * 7u + (i >> 8) * 13u + (i >> 16) + 1u);
}

void ft_fill(void *buf, size_t len, unsigned seed) {
    uint8_t *b = buf;

    for (size_t i = 0; i < len; i++)
        b[i] = pattern_byte(i, seed);
}

size_t ft_check(const void *buf, size_t len, unsigned seed) {
    const uint8_t *b = buf;

    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern_byte(i, seed)) return i;
    return len;
}

int ft_expect_pattern(struct ft_run *r, const void *buf, size_t len, unsigned seed,
                      const char *what) {
    size_t at = ft_check(buf, len, seed);

    if (at == len) return FT_OK;
    return ft_fail(r, "%s: byte %zu of %zu is %#x, expected %#x", what, at, len,
                   ((const uint8_t *)buf)[at], pattern_byte(at, seed));
}

size_t ft_sizes(const struct fi_info *info, size_t *sizes, size_t max) {
    static const size_t all[] = {1, 64, 4096, 65536, FT_MAX_SIZE};
    size_t limit = info->ep_attr->max_msg_size;
    size_t n = 0;

    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]) && n < max; i++)
        if (all[i] <= limit) sizes[n++] = all[i];
    if (limit < FT_MAX_SIZE && n < max && (!n || sizes[n - 1] != limit)) sizes[n++] = limit;
    return n;
}
