/* SPDX-License-Identifier: MIT */
/*
 * Address vectors: a table of IP socket addresses, the names of RDM
 * endpoints (their listeners).  fi_addr_t is the index, for FI_AV_MAP as
 * for FI_AV_TABLE; a removed entry's index is not reused.
 */
#include "pmof.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool pmof_addr_equal(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, 16);
    }
    return false;
}

fi_addr_t pmof_av_find(struct pmof_av *av, const struct sockaddr *sa) {
    fi_addr_t found = FI_ADDR_NOTAVAIL;

    pmof_lock(&av->lock);
    for (size_t i = 0; i < av->count; i++) {
        if (av->used[i] && pmof_addr_equal((struct sockaddr *)&av->addrs[i], sa)) {
            found = i;
            break;
        }
    }
    pmof_unlock(&av->lock);
    return found;
}

bool pmof_av_get(struct pmof_av *av, fi_addr_t addr, struct sockaddr_storage *out) {
    bool ok;

    pmof_lock(&av->lock);
    ok = addr < av->count && av->used[addr];
    if (ok) *out = av->addrs[addr];
    pmof_unlock(&av->lock);
    return ok;
}

static int av_grow(struct pmof_av *av, size_t need) {
    size_t n = av->cap ? av->cap : 16;
    struct sockaddr_storage *a;
    bool *u;

    while (n < need)
        n *= 2;
    if (n == av->cap) return 0;
    a = realloc(av->addrs, n * sizeof(*a));
    if (!a) return -FI_ENOMEM;
    av->addrs = a;
    u = realloc(av->used, n * sizeof(*u));
    if (!u) return -FI_ENOMEM;
    memset(u + av->cap, 0, (n - av->cap) * sizeof(*u));
    av->used = u;
    av->cap = n;
    return 0;
}

static int av_insert(struct fid_av *av_fid, const void *addr, size_t count, fi_addr_t *fi_addr,
                     uint64_t flags, void *context) {
    struct pmof_av *av = container_of(av_fid, struct pmof_av, av_fid);
    size_t stride = av->addrlen, inserted = 0;
    const uint8_t *p = addr;
    /* fi_av(3): with FI_SYNC_ERR, context is an array of one error code
     * per address. */
    int *errs = flags & FI_SYNC_ERR ? context : NULL;

    if (flags & ~(FI_MORE | FI_SYNC_ERR)) return -FI_EBADFLAGS;
    if (count && !addr) return -FI_EINVAL;
    if ((flags & FI_SYNC_ERR) && count && !context) return -FI_EINVAL;
    pmof_lock(&av->lock);
    if (av_grow(av, av->count + count)) {
        pmof_unlock(&av->lock);
        return -FI_ENOMEM;
    }
    for (size_t i = 0; i < count; i++, p += stride) {
        const struct sockaddr *sa = (const void *)p;
        size_t len = pmof_sockaddr_len(sa);

        if (!len || len > stride) {
            if (fi_addr) fi_addr[i] = FI_ADDR_NOTAVAIL;
            if (errs) errs[i] = -FI_EINVAL;
            /* A table's indices follow the order of insertion, failed
             * addresses included: the index stays, unusable. */
            if (av->type == FI_AV_TABLE) {
                memset(&av->addrs[av->count], 0, sizeof(av->addrs[0]));
                av->used[av->count++] = false;
            }
            continue;
        }
        memset(&av->addrs[av->count], 0, sizeof(av->addrs[0]));
        memcpy(&av->addrs[av->count], sa, len);
        av->used[av->count] = true;
        if (fi_addr) fi_addr[i] = av->count;
        if (errs) errs[i] = 0;
        av->count++;
        inserted++;
    }
    pmof_unlock(&av->lock);
    return (int)inserted;
}

static int av_insertsvc(struct fid_av *av_fid, const char *node, const char *service,
                        fi_addr_t *fi_addr, uint64_t flags, void *context) {
    struct pmof_av *av = container_of(av_fid, struct pmof_av, av_fid);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    struct sockaddr_storage ss = {0};
    int ret;

    if (!node || !service) return -FI_EINVAL;
    hints.ai_family = av->addrlen == sizeof(struct sockaddr_in6) ? AF_INET6 : AF_INET;
    if (getaddrinfo(node, service, &hints, &ai)) {
        if (fi_addr) *fi_addr = FI_ADDR_NOTAVAIL;
        return 0;
    }
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    ret = av_insert(av_fid, &ss, 1, fi_addr, flags, context);
    return ret;
}

static int av_insertsym(struct fid_av *av, const char *node, size_t nodecnt, const char *service,
                        size_t svccnt, fi_addr_t *fi_addr, uint64_t flags, void *context) {
    (void)av, (void)node, (void)nodecnt, (void)service, (void)svccnt, (void)fi_addr, (void)flags,
        (void)context;
    return -FI_ENOSYS;
}

static int av_remove(struct fid_av *av_fid, fi_addr_t *fi_addr, size_t count, uint64_t flags) {
    struct pmof_av *av = container_of(av_fid, struct pmof_av, av_fid);
    bool removed = false;
    int ret = 0;

    if (flags) return -FI_EBADFLAGS;
    if (count && !fi_addr) return -FI_EINVAL;
    pmof_lock(&av->lock);
    for (size_t i = 0; i < count; i++) {
        if (fi_addr[i] >= av->count || !av->used[fi_addr[i]]) {
            ret = -FI_EINVAL;
        } else {
            av->used[fi_addr[i]] = false;
            removed = true;
        }
    }
    pmof_unlock(&av->lock);
    /* fi_av(3): a removed fi_addr is invalid until an fi_av_insert returns
     * it again; endpoints drop what they kept of it. */
    if (removed) atomic_fetch_add(&av->removals, 1);
    return ret;
}

static int av_lookup(struct fid_av *av_fid, fi_addr_t fi_addr, void *addr, size_t *addrlen) {
    struct pmof_av *av = container_of(av_fid, struct pmof_av, av_fid);
    struct sockaddr_storage ss;
    size_t len;

    if (!addrlen || (*addrlen && !addr)) return -FI_EINVAL;
    if (!pmof_av_get(av, fi_addr, &ss)) return -FI_ENOENT;
    len = pmof_sockaddr_len((struct sockaddr *)&ss);
    /* A NULL buffer of size 0 asks only for the size. */
    if (*addrlen) memcpy(addr, &ss, len < *addrlen ? len : *addrlen);
    *addrlen = len;
    return 0;
}

const char *pmof_straddr(const void *addr, char *buf, size_t *len) {
    const struct sockaddr *sa = addr;
    char ip[INET6_ADDRSTRLEN] = "?";
    char tmp[96];
    int n;

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s = addr;
        inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
        n = snprintf(tmp, sizeof(tmp), "fi_sockaddr_in://%s:%u", ip, ntohs(s->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = addr;
        inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
        n = snprintf(tmp, sizeof(tmp), "fi_sockaddr_in6://[%s]:%u", ip, ntohs(s->sin6_port));
    } else {
        n = snprintf(tmp, sizeof(tmp), "fi_addr_unspec://");
    }
    if (buf && *len) {
        strncpy(buf, tmp, *len - 1);
        buf[*len - 1] = '\0';
    }
    *len = (size_t)n + 1;
    return buf;
}

static const char *av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len) {
    (void)av;
    return pmof_straddr(addr, buf, len);
}

static int av_set_enosys(struct fid_av *av, struct fi_av_set_attr *attr, struct fid_av_set **set,
                         void *context) {
    (void)av, (void)attr, (void)set, (void)context;
    return -FI_ENOSYS;
}

static int av_close(struct fid *fid) {
    struct pmof_av *av = container_of(fid, struct pmof_av, av_fid.fid);

    if (atomic_load(&av->refs)) return -FI_EBUSY;
    free(av->addrs);
    free(av->used);
    pmof_lock_destroy(&av->lock);
    atomic_fetch_sub(&av->dom->refs, 1);
    free(av);
    return 0;
}

static struct fi_ops av_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = av_close,
    .bind = pmof_fid_bind_enosys,
    .control = pmof_fid_control_enosys,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_av av_ops = {
    .size = sizeof(struct fi_ops_av),
    .insert = av_insert,
    .insertsvc = av_insertsvc,
    .insertsym = av_insertsym,
    .remove = av_remove,
    .lookup = av_lookup,
    .straddr = av_straddr,
    .av_set = av_set_enosys,
};

int pmof_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **out,
                 void *context) {
    struct pmof_domain *dom = container_of(domain, struct pmof_domain, domain_fid);
    struct pmof_av *av;

    if (!attr || !out) return -FI_EINVAL;
    if (attr->type != FI_AV_UNSPEC && attr->type != FI_AV_MAP && attr->type != FI_AV_TABLE)
        return -FI_EINVAL;
    if (attr->name || attr->flags & ~(FI_EVENT | FI_READ | FI_SYMMETRIC)) return -FI_ENOSYS;
    /* fi_av(3): read-only access is to a named AV that exists. */
    if (attr->flags & FI_READ) return -FI_EINVAL;
    if (attr->flags & FI_EVENT) return -FI_ENOSYS;
    av = calloc(1, sizeof(*av));
    if (!av) return -FI_ENOMEM;
    av->dom = dom;
    av->type = attr->type == FI_AV_UNSPEC ? FI_AV_TABLE : attr->type;
    /* fi_av(3): the type chosen for FI_AV_UNSPEC is returned in attr. */
    attr->type = av->type;
    av->addrlen = dom->info->addr_format == FI_SOCKADDR_IN6 ? sizeof(struct sockaddr_in6)
                                                            : sizeof(struct sockaddr_in);
    if (dom->info->addr_format == FI_SOCKADDR) av->addrlen = sizeof(struct sockaddr_in6);
    if (av_grow(av, attr->count ? attr->count : 16)) {
        free(av->addrs);
        free(av);
        return -FI_ENOMEM;
    }
    pmof_lock_init(&av->lock, true);
    av->av_fid.fid.fclass = FI_CLASS_AV;
    av->av_fid.fid.context = context;
    av->av_fid.fid.ops = &av_fi_ops;
    av->av_fid.ops = &av_ops;
    atomic_fetch_add(&dom->refs, 1);
    *out = &av->av_fid;
    return 0;
}
