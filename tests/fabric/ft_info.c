/* SPDX-License-Identifier: MIT */
/* getinfo.*: what fi_getinfo returns for the provider, against the rules of
 * fi_getinfo(3). */
#include "fabtest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Capabilities that select functionality; the others (FI_LOCAL_COMM,
 * FI_SOURCE, FI_RMA_PMEM...) a provider may add unasked (fi_getinfo(3)). */
#define FT_PRIMARY_CAPS                                                                            \
    (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_MULTICAST | FI_COLLECTIVE | FI_NAMED_RX_CTX |    \
     FI_DIRECTED_RECV | FI_VARIABLE_MSG | FI_HMEM | FI_READ | FI_WRITE | FI_RECV | FI_SEND |       \
     FI_REMOTE_READ | FI_REMOTE_WRITE)

#define FT_TEST_PORT "7471"

static struct fi_info *hints_for(struct ft_run *r) {
    return ft_hints(r->opts, r->opts->ep_type);
}

static int check_common(struct ft_run *r, const struct fi_info *i, const struct fi_info *hints) {
    int ret = FT_OK;

    FT_EXPECT(i->tx_attr && i->rx_attr && i->ep_attr && i->domain_attr && i->fabric_attr,
              "info with a NULL attribute structure");
    FT_EXPECT(i->ep_attr->type == hints->ep_attr->type, "info has endpoint type %d, asked %d",
              i->ep_attr->type, hints->ep_attr->type);
    FT_EXPECT(!(i->mode & ~hints->mode), "info mode %#llx has bits the hints lack: %#llx",
              (unsigned long long)i->mode, (unsigned long long)(i->mode & ~hints->mode));
    FT_EXPECT(i->fabric_attr->api_version == FT_API_VERSION || i->fabric_attr->api_version == 0,
              "info api_version %#x", i->fabric_attr->api_version);
out:
    return ret;
}

static int t_basic(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK, n = 0;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    for (struct fi_info *i = info; i; i = i->next, n++) {
        FT_TRY(check_common(r, i, hints));
        FT_EXPECT((i->caps & (FI_MSG | FI_RMA)) == (FI_MSG | FI_RMA),
                  "info caps %#llx lack FI_MSG|FI_RMA", (unsigned long long)i->caps);
    }
    ft_note(r, "%d info(s), first domain '%s'", n, info->domain_attr->name);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* A capability the provider lacks must give -FI_ENODATA; one it has must be
 * in every info returned, never silently dropped. */
static int unsupported_cap(struct ft_run *r, uint64_t cap, const char *name, bool *refused) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK, rc;

    FT_EXPECT(hints, "out of memory");
    hints->caps |= cap;
    FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
    *refused = rc == -FI_ENODATA;
    if (*refused) goto out;
    FT_EXPECT(!rc, "fi_getinfo with %s = %d (%s), expected -FI_ENODATA", name, rc,
              fi_strerror(-rc));
    for (struct fi_info *i = info; i; i = i->next)
        FT_EXPECT(i->caps & cap, "fi_getinfo with %s returned an info without it", name);
    ft_note(r, "%s supported", name);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_caps_subset(struct ft_run *r) {
    const uint64_t want =
        FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    hints->caps = want;
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    for (struct fi_info *i = info; i; i = i->next) {
        uint64_t extra = i->caps & FT_PRIMARY_CAPS & ~want;
        FT_EXPECT(!extra, "info caps %#llx add unrequested primary caps %#llx",
                  (unsigned long long)i->caps, (unsigned long long)extra);
        FT_EXPECT((i->caps & want) == want, "info caps %#llx lack requested %#llx",
                  (unsigned long long)i->caps, (unsigned long long)(want & ~i->caps));
    }
    bool coll_refused, trig_refused;
    FT_TRY(unsupported_cap(r, FI_COLLECTIVE, "FI_COLLECTIVE", &coll_refused));
    FT_TRY(unsupported_cap(r, FI_TRIGGER, "FI_TRIGGER", &trig_refused));
    FT_EXPECT(coll_refused || trig_refused, "neither FI_COLLECTIVE nor FI_TRIGGER refused");
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_mode(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK, rc;

    FT_EXPECT(hints, "out of memory");
    hints->mode = 0;
    FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
    if (rc == -FI_ENODATA) {
        ft_note(r, "-FI_ENODATA: the provider needs some mode bit");
        goto out;
    }
    FT_EXPECT(!rc, "fi_getinfo(mode 0) = %d (%s)", rc, fi_strerror(-rc));
    for (struct fi_info *i = info; i; i = i->next)
        FT_EXPECT(!i->mode, "hints mode 0, info mode %#llx", (unsigned long long)i->mode);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* A provider that says FI_PROGRESS_AUTO for control must set connections
 * up without the application's help; pmof's FI_EP_MSG connections advance
 * in fi_eq_read, so it says FI_PROGRESS_MANUAL there and refuses hints
 * that insist on AUTO.  Other providers: whatever they offer must honour
 * hints asking for MANUAL or AUTO. */
static int t_control_progress(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK, rc;
    bool msg = r->opts->ep_type == FI_EP_MSG;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    enum fi_progress got = info->domain_attr->control_progress;
    ft_note(r, "control_progress %s",
            got == FI_PROGRESS_AUTO ? "FI_PROGRESS_AUTO" : "FI_PROGRESS_MANUAL");
    fi_freeinfo(info);
    info = NULL;
    if (ft_is_pmof_prov(r->opts))
        FT_EXPECT(got == (msg ? FI_PROGRESS_MANUAL : FI_PROGRESS_AUTO),
                  "control_progress %d for %s endpoints", got, msg ? "FI_EP_MSG" : "FI_EP_RDM");
    hints->domain_attr->control_progress = FI_PROGRESS_AUTO;
    FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
    if (ft_is_pmof_prov(r->opts) && msg)
        FT_EXPECT(rc == -FI_ENODATA,
                  "hints control_progress AUTO: fi_getinfo = %d, expected "
                  "-FI_ENODATA",
                  rc);
    for (struct fi_info *i = rc ? NULL : info; i; i = i->next)
        FT_EXPECT(i->domain_attr->control_progress == FI_PROGRESS_AUTO,
                  "hints control_progress AUTO, info %d", i->domain_attr->control_progress);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_mr_mode(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    int want = hints->domain_attr->mr_mode;
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    for (struct fi_info *i = info; i; i = i->next)
        FT_EXPECT(!(i->domain_attr->mr_mode & ~want), "info mr_mode %#x not within hints %#x",
                  i->domain_attr->mr_mode, want);
    ft_note(r, "mr_mode %#x", info->domain_attr->mr_mode);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_addr_format(struct ft_run *r) {
    struct fi_info *hints = NULL, *info = NULL;
    struct in_addr ip;
    int ret = FT_OK;

    if (inet_pton(AF_INET, r->opts->addr, &ip) != 1)
        return ft_skip(r, "%s is not an IPv4 address", r->opts->addr);
    hints = hints_for(r);
    FT_EXPECT(hints, "out of memory");
    hints->addr_format = FI_SOCKADDR_IN;
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    for (struct fi_info *i = info; i; i = i->next) {
        FT_EXPECT(i->addr_format == FI_SOCKADDR_IN, "addr_format %u", i->addr_format);
        FT_EXPECT(i->src_addr, "no src_addr");
        FT_EXPECT(i->src_addrlen == sizeof(struct sockaddr_in), "src_addrlen %zu", i->src_addrlen);
        FT_EXPECT(((struct sockaddr *)i->src_addr)->sa_family == AF_INET, "src_addr family %d",
                  ((struct sockaddr *)i->src_addr)->sa_family);
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* Whether `sa` holds the IP address `text`, and if port > 0, that port. */
static bool same_ip(const void *sa, size_t len, const char *text, int port) {
    const struct sockaddr *s = sa;
    uint8_t want[16];

    if (s->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = sa;
        return inet_pton(AF_INET, text, want) == 1 && !memcmp(&in->sin_addr, want, 4) &&
               (port <= 0 || ntohs(in->sin_port) == port);
    }
    if (s->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = sa;
        return inet_pton(AF_INET6, text, want) == 1 && !memcmp(&in6->sin6_addr, want, 16) &&
               (port <= 0 || ntohs(in6->sin6_port) == port);
    }
    return false;
}

static int t_src_node(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    for (struct fi_info *i = info; i; i = i->next) {
        FT_EXPECT(i->src_addr, "FI_SOURCE info without src_addr");
        FT_EXPECT(same_ip(i->src_addr, i->src_addrlen, r->opts->addr, 0),
                  "src_addr (family %d, %zu bytes) is not %s",
                  ((struct sockaddr *)i->src_addr)->sa_family, i->src_addrlen, r->opts->addr);
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_dest(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, FT_TEST_PORT, 0, hints, &info));
    for (struct fi_info *i = info; i; i = i->next) {
        FT_EXPECT(i->dest_addr, "info for node %s:%s has no dest_addr", r->opts->addr,
                  FT_TEST_PORT);
        FT_EXPECT(same_ip(i->dest_addr, i->dest_addrlen, r->opts->addr, atoi(FT_TEST_PORT)),
                  "dest_addr is not %s port %s", r->opts->addr, FT_TEST_PORT);
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int t_bad_version(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    int rc = fi_getinfo(FI_VERSION(99, 0), r->opts->addr, NULL, FI_SOURCE, hints, &info);
    FT_EXPECT(rc == -FI_ENOSYS || rc == -FI_ENODATA,
              "fi_getinfo(FI_VERSION(99,0)) = %d (%s), expected -FI_ENOSYS or -FI_ENODATA", rc,
              fi_strerror(-rc));
    FT_EXPECT(!info, "failed fi_getinfo still returned infos");
    ft_note(r, "%s", rc == -FI_ENOSYS ? "-FI_ENOSYS" : "-FI_ENODATA");
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

static int compare_dup(struct ft_run *r, const struct fi_info *a, const struct fi_info *b) {
    int ret = FT_OK;

    FT_EXPECT(a != b && a->ep_attr != b->ep_attr && a->domain_attr != b->domain_attr,
              "fi_dupinfo shares structures with the original");
    FT_EXPECT(a->caps == b->caps && a->mode == b->mode && a->addr_format == b->addr_format,
              "caps/mode/addr_format differ in the copy");
    FT_EXPECT(a->ep_attr->type == b->ep_attr->type &&
                  a->ep_attr->max_msg_size == b->ep_attr->max_msg_size,
              "ep_attr differs in the copy");
    FT_EXPECT(a->tx_attr->size == b->tx_attr->size &&
                  a->tx_attr->inject_size == b->tx_attr->inject_size &&
                  a->rx_attr->size == b->rx_attr->size,
              "tx/rx attributes differ in the copy");
    FT_EXPECT(a->domain_attr->mr_mode == b->domain_attr->mr_mode, "mr_mode differs in the copy");
    FT_EXPECT(!strcmp(a->fabric_attr->prov_name, b->fabric_attr->prov_name) &&
                  a->fabric_attr->prov_name != b->fabric_attr->prov_name,
              "prov_name not deep-copied");
    FT_EXPECT(!a->domain_attr->name == !b->domain_attr->name &&
                  (!a->domain_attr->name || !strcmp(a->domain_attr->name, b->domain_attr->name)),
              "domain name differs in the copy");
    FT_EXPECT(a->src_addrlen == b->src_addrlen &&
                  (!a->src_addr || (a->src_addr != b->src_addr &&
                                    !memcmp(a->src_addr, b->src_addr, a->src_addrlen))),
              "src_addr not deep-copied");
out:
    return ret;
}

static int t_dupinfo(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL, *dup = NULL, *blank = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &info));
    dup = fi_dupinfo(info);
    FT_EXPECT(dup, "fi_dupinfo = NULL");
    FT_TRY(compare_dup(r, info, dup));
    blank = fi_dupinfo(NULL);
    FT_EXPECT(blank && blank->ep_attr && blank->domain_attr, "fi_dupinfo(NULL) = no new info");
out:
    fi_freeinfo(blank);
    fi_freeinfo(dup);
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* The capabilities each side of an endpoint may carry (fi_getinfo(3),
 * "CAPABILITIES": primary caps and the secondary caps that apply to sending
 * or to receiving); domain-wide caps (FI_LOCAL_COMM, FI_REMOTE_COMM,
 * FI_SHARED_AV) belong to domain_attr->caps, never to a side. */
#define FT_PRIMARY_TX                                                                              \
    (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_MULTICAST | FI_NAMED_RX_CTX | FI_HMEM |          \
     FI_COLLECTIVE)
#define FT_PRIMARY_RX                                                                              \
    (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_DIRECTED_RECV | FI_VARIABLE_MSG | FI_HMEM |      \
     FI_COLLECTIVE)
#define FT_TX_ALLOWED                                                                              \
    (FT_PRIMARY_TX | FI_SEND | FI_READ | FI_WRITE | FI_TRIGGER | FI_FENCE | FI_RMA_PMEM)
#define FT_RX_ALLOWED                                                                              \
    (FT_PRIMARY_RX | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_RMA_PMEM | FI_SOURCE |        \
     FI_SOURCE_ERR | FI_RMA_EVENT | FI_MULTI_RECV | FI_TRIGGER)

/* Hints that ask for nothing but the provider and the endpoint type, with
 * every mode bit and every usual MR mode accepted: what a program probing
 * one attribute passes. */
static struct fi_info *bare_hints(struct ft_run *r) {
    struct fi_info *h = hints_for(r);

    if (!h) return NULL;
    h->caps = 0;
    h->mode = ~0ULL;
    h->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    return h;
}

/* The caps of one side of an endpoint stay within what that side can use,
 * and within the info's. */
static int check_side_caps(struct ft_run *r, const struct fi_info *i) {
    int ret = FT_OK;

    FT_EXPECT(!(i->tx_attr->caps & ~FT_TX_ALLOWED),
              "tx_attr caps %s carry %#llx, not a transmit cap",
              fi_tostr(&i->tx_attr->caps, FI_TYPE_CAPS),
              (unsigned long long)(i->tx_attr->caps & ~FT_TX_ALLOWED));
    FT_EXPECT(!(i->rx_attr->caps & ~FT_RX_ALLOWED), "rx_attr caps carry %#llx, not a receive cap",
              (unsigned long long)(i->rx_attr->caps & ~FT_RX_ALLOWED));
    FT_EXPECT(!(i->rx_attr->caps & ~i->caps), "rx_attr caps %#llx beyond the info's %#llx",
              (unsigned long long)i->rx_attr->caps, (unsigned long long)i->caps);
    FT_EXPECT(!(i->tx_attr->caps & ~i->caps), "tx_attr caps %#llx beyond the info's %#llx",
              (unsigned long long)i->tx_attr->caps, (unsigned long long)i->caps);
out:
    return ret;
}

/* Every combination of the primary capabilities: fi_getinfo(3) says a
 * provider supports what is asked or answers -FI_ENODATA; what it grants is
 * in the info and in the side of the endpoint that uses it. */
static int t_primary_caps(struct ft_run *r) {
    static const uint64_t bits[] = {FI_MSG,           FI_RMA,          FI_TAGGED, FI_ATOMIC,
                                    FI_MULTICAST,     FI_NAMED_RX_CTX, FI_HMEM,   FI_COLLECTIVE,
                                    FI_DIRECTED_RECV, FI_VARIABLE_MSG};
    const unsigned n = sizeof(bits) / sizeof(bits[0]);
    struct fi_info *hints = bare_hints(r), *info = NULL;
    int ret = FT_OK, granted = 0;

    FT_EXPECT(hints, "out of memory");
    for (unsigned set = 0; set < 1u << n; set++) {
        uint64_t want = 0;
        int rc;
        for (unsigned b = 0; b < n; b++)
            if (set & 1u << b) want |= bits[b];
        hints->caps = want;
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(caps %s) = %d (%s), expected 0 or -FI_ENODATA",
                  fi_tostr(&want, FI_TYPE_CAPS), rc, fi_strerror(-rc));
        granted++;
        for (struct fi_info *i = info; i; i = i->next) {
            FT_EXPECT((i->caps & want) == want, "caps %s asked, info caps %s",
                      fi_tostr(&want, FI_TYPE_CAPS), fi_tostr(&i->caps, FI_TYPE_CAPS));
            FT_EXPECT((i->tx_attr->caps & want & FT_PRIMARY_TX) == (want & FT_PRIMARY_TX),
                      "caps %#llx asked, tx_attr caps %#llx lack the transmit ones",
                      (unsigned long long)want, (unsigned long long)i->tx_attr->caps);
            FT_EXPECT((i->rx_attr->caps & want & FT_PRIMARY_RX) == (want & FT_PRIMARY_RX),
                      "caps %#llx asked, rx_attr caps %#llx lack the receive ones",
                      (unsigned long long)want, (unsigned long long)i->rx_attr->caps);
            FT_TRY(check_side_caps(r, i));
        }
        fi_freeinfo(info);
        info = NULL;
    }
    FT_EXPECT(granted, "no combination of primary caps granted, not even none");
    ft_note(r, "%d of %u combinations granted", granted, 1u << n);
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* The domain-wide caps, asked in domain_attr->caps, are granted there or
 * refused with -FI_ENODATA. */
static int t_domain_caps(struct ft_run *r) {
    static const uint64_t bits[] = {FI_LOCAL_COMM, FI_REMOTE_COMM, FI_SHARED_AV};
    struct fi_info *hints = bare_hints(r), *info = NULL;
    int ret = FT_OK;

    FT_EXPECT(hints, "out of memory");
    for (unsigned set = 0; set < 8; set++) {
        uint64_t want = 0;
        int rc;
        for (unsigned b = 0; b < 3; b++)
            if (set & 1u << b) want |= bits[b];
        hints->domain_attr->caps = want;
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(domain caps %#llx) = %d (%s)", (unsigned long long)want, rc,
                  fi_strerror(-rc));
        for (struct fi_info *i = info; i; i = i->next)
            FT_EXPECT((i->domain_attr->caps & want) == want, "domain caps %#llx asked, %#llx given",
                      (unsigned long long)want, (unsigned long long)i->domain_attr->caps);
        fi_freeinfo(info);
        info = NULL;
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* With no hints at all, every info of the provider keeps each side's caps
 * to that side (fi_getinfo(3): a NULL hints returns what is supported). */
static int t_no_hints(struct ft_run *r) {
    struct fi_info *info = NULL;
    int ret = FT_OK, mine = 0, rc;

    rc = fi_getinfo(FT_API_VERSION, NULL, NULL, 0, NULL, &info);
    FT_EXPECT(!rc, "fi_getinfo(no hints) = %d (%s)", rc, fi_strerror(-rc));
    for (struct fi_info *i = info; i; i = i->next) {
        if (!i->fabric_attr->prov_name || strcmp(i->fabric_attr->prov_name, r->opts->prov))
            continue;
        mine++;
        FT_TRY(check_side_caps(r, i));
        FT_EXPECT(i->src_addr && i->src_addrlen, "an info without a source address");
    }
    FT_EXPECT(mine, "no info of %s among those of every provider", r->opts->prov);
out:
    fi_freeinfo(info);
    return ret;
}

/* What an info offered with no hints, asked back as hints (its caps, the
 * common mode and MR modes), is granted: a provider does not refuse its
 * own answer. */
static int t_own_answer(struct ft_run *r) {
    struct fi_info *all = NULL, *hints = NULL, *info = NULL;
    const struct fi_info *mine = NULL;
    int ret = FT_OK, rc;

    rc = fi_getinfo(FT_API_VERSION, NULL, NULL, 0, NULL, &all);
    FT_EXPECT(!rc, "fi_getinfo(no hints) = %d (%s)", rc, fi_strerror(-rc));
    for (const struct fi_info *i = all; i && !mine; i = i->next)
        if (i->fabric_attr->prov_name && !strcmp(i->fabric_attr->prov_name, r->opts->prov) &&
            i->ep_attr->type == r->opts->ep_type)
            mine = i;
    if (!mine) {
        ret = ft_skip(r, "no %s endpoint of %s without hints", ft_ep_name(r->opts->ep_type),
                      r->opts->prov);
        goto out;
    }
    hints = hints_for(r);
    FT_EXPECT(hints, "out of memory");
    hints->caps = mine->caps;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
    FT_EXPECT(!rc, "caps %s, offered without hints, asked back: %d (%s)",
              fi_tostr(&mine->caps, FI_TYPE_CAPS), rc, fi_strerror(-rc));
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    fi_freeinfo(all);
    return ret;
}

/* MR modes, per fi_domain(3): the application lists the modes it can work
 * with and the provider needs only some of them, or answers -FI_ENODATA;
 * FI_MR_BASIC and FI_MR_SCALABLE (the 1.4 names) stand alone and come back
 * as asked. */
static int t_mr_mode_bits(struct ft_run *r) {
    static const int bits[] = {FI_MR_LOCAL,    FI_MR_RAW,        FI_MR_VIRT_ADDR, FI_MR_ALLOCATED,
                               FI_MR_PROV_KEY, FI_MR_MMU_NOTIFY, FI_MR_RMA_EVENT, FI_MR_ENDPOINT};
    const unsigned n = sizeof(bits) / sizeof(bits[0]);
    struct fi_info *hints = bare_hints(r), *info = NULL;
    int ret = FT_OK, granted = 0, rc;

    FT_EXPECT(hints, "out of memory");
    for (unsigned set = 0; set < 1u << n; set++) {
        int want = 0;
        for (unsigned b = 0; b < n; b++)
            if (set & 1u << b) want |= bits[b];
        hints->domain_attr->mr_mode = want;
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(mr_mode %#x) = %d (%s), expected 0 or -FI_ENODATA", want, rc,
                  fi_strerror(-rc));
        granted++;
        for (struct fi_info *i = info; i; i = i->next)
            FT_EXPECT(!(i->domain_attr->mr_mode & ~want), "mr_mode %#x asked, %#x needed", want,
                      i->domain_attr->mr_mode);
        fi_freeinfo(info);
        info = NULL;
    }
    FT_EXPECT(granted, "no combination of MR modes granted");
    /* FI_MR_BASIC and FI_MR_SCALABLE by value: libfabric 2 deprecates the
     * names (a warning wherever they are named), the ABI keeps the bits. */
    static const int legacy[] = {1 << 0, 1 << 1};
    for (unsigned k = 0; k < 2; k++) {
        hints->caps = FI_RMA;
        hints->domain_attr->mr_mode = legacy[k];
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(mr_mode %s) = %d (%s)", k ? "FI_MR_SCALABLE" : "FI_MR_BASIC", rc,
                  fi_strerror(-rc));
        for (struct fi_info *i = info; i; i = i->next)
            FT_EXPECT(i->domain_attr->mr_mode == legacy[k], "mr_mode %d asked, %d given", legacy[k],
                      i->domain_attr->mr_mode);
        fi_freeinfo(info);
        info = NULL;
    }
    ft_note(r, "%d of %u combinations granted", granted, 1u << n);
    /* pmof's tagged messages register what they need: an application that
     * asks for them alone (Open MPI's ofi MTL, with no MR mode) gets them. */
    if (ft_is_pmof_prov(r->opts) && r->opts->ep_type == FI_EP_RDM) {
        hints->caps = FI_TAGGED;
        hints->domain_attr->mr_mode = 0;
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        FT_EXPECT(!rc, "FI_TAGGED with no MR mode: %d (%s)", rc, fi_strerror(-rc));
        FT_EXPECT(!info->domain_attr->mr_mode, "FI_TAGGED with no MR mode: mr_mode %#x",
                  info->domain_attr->mr_mode);
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* fi_getinfo(3): "specifying a non-zero value for input hints indicates
 * that a provider must support the requested value or fail the operation
 * with -FI_ENODATA" (cq_data_size); and the mode bits an info keeps are the
 * application's, also when it sets FI_RX_CQ_DATA in rx_attr alone. */
static int t_cq_data_size(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *info = NULL;
    int ret = FT_OK, rc;

    FT_EXPECT(hints, "out of memory");
    /* 0: no FI_RX_CQ_DATA; 1: in rx_attr only; 2: in mode; 3: messages
     * alone, whose data needs no receive of its own (Open MPI's ofi MTL
     * asks so, for its tagged messages). */
    for (int variant = 0; variant < 4; variant++) {
        hints->mode = FI_CONTEXT | FI_CONTEXT2 | (variant == 2 ? FI_RX_CQ_DATA : 0);
        hints->rx_attr->mode = variant == 1 ? FI_RX_CQ_DATA : 0;
        hints->domain_attr->cq_data_size = 4;
        if (variant == 3) hints->caps = FI_MSG;
        FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
        if (variant == 3)
            FT_TRY(ft_deviation(r, rc == -FI_ENODATA,
                                "cq_data_size 4 for messages alone, without FI_RX_CQ_DATA: "
                                "-FI_ENODATA"));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(cq_data_size 4, variant %d) = %d (%s)", variant, rc,
                  fi_strerror(-rc));
        for (struct fi_info *i = info; i; i = i->next) {
            FT_TRY(check_common(r, i, hints));
            FT_EXPECT(i->domain_attr->cq_data_size >= 4,
                      "cq_data_size 4 asked (variant %d), %zu given", variant,
                      i->domain_attr->cq_data_size);
        }
        fi_freeinfo(info);
        info = NULL;
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

/* fi_getinfo(3), domain attributes: "output values will be greater than or
 * equal to requested input values". */
static int t_domain_limits(struct ft_run *r) {
    struct fi_info *hints = hints_for(r), *base = NULL, *info = NULL;
    int ret = FT_OK, rc;

    FT_EXPECT(hints, "out of memory");
    FT_TRY(ft_getinfo_ok(r, r->opts->addr, NULL, FI_SOURCE, hints, &base));
    const struct fi_domain_attr *b = base->domain_attr;
    const struct {
        const char *name;
        size_t offset, have;
    } limits[] = {
        {"cq_cnt", offsetof(struct fi_domain_attr, cq_cnt), b->cq_cnt},
        {"ep_cnt", offsetof(struct fi_domain_attr, ep_cnt), b->ep_cnt},
        {"cntr_cnt", offsetof(struct fi_domain_attr, cntr_cnt), b->cntr_cnt},
        {"mr_cnt", offsetof(struct fi_domain_attr, mr_cnt), b->mr_cnt},
        {"mr_iov_limit", offsetof(struct fi_domain_attr, mr_iov_limit), b->mr_iov_limit},
        {"max_err_data", offsetof(struct fi_domain_attr, max_err_data), b->max_err_data},
    };
    for (size_t k = 0; k < sizeof(limits) / sizeof(limits[0]); k++) {
        for (size_t ask = limits[k].have; ask <= limits[k].have + 1; ask++) {
            struct fi_domain_attr *h = hints->domain_attr;
            *(size_t *)(void *)((char *)h + limits[k].offset) = ask;
            FT_TRY(ft_getinfo(r, r->opts->addr, NULL, FI_SOURCE, hints, &info, &rc));
            *(size_t *)(void *)((char *)h + limits[k].offset) = 0;
            if (ask == limits[k].have)
                FT_EXPECT(!rc, "fi_getinfo(%s %zu, as offered) = %d (%s)", limits[k].name, ask, rc,
                          fi_strerror(-rc));
            else if (rc == -FI_ENODATA)
                continue;
            for (struct fi_info *i = info; i; i = i->next) {
                size_t got = *(size_t *)(void *)((char *)i->domain_attr + limits[k].offset);
                FT_TRY(ft_deviation(r, got < ask, "%s %zu asked, %zu given", limits[k].name, ask,
                                    got));
            }
            fi_freeinfo(info);
            info = NULL;
        }
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(base);
    fi_freeinfo(hints);
    return ret;
}

/* fi_getinfo(3): FI_RMA_PMEM "requires that FI_RMA be set". */
static int t_pmem_needs_rma(struct ft_run *r) {
    static const uint64_t asks[] = {FI_MSG, FI_TAGGED, FI_MSG | FI_RMA_PMEM, 0};
    struct fi_info *hints = bare_hints(r), *info = NULL;
    int ret = FT_OK, rc;

    FT_EXPECT(hints, "out of memory");
    for (size_t k = 0; k < sizeof(asks) / sizeof(asks[0]); k++) {
        hints->caps = asks[k];
        FT_TRY(ft_getinfo(r, NULL, NULL, 0, hints, &info, &rc));
        if (rc == -FI_ENODATA) continue;
        FT_EXPECT(!rc, "fi_getinfo(caps %#llx) = %d (%s)", (unsigned long long)asks[k], rc,
                  fi_strerror(-rc));
        for (struct fi_info *i = info; i; i = i->next) {
            FT_TRY(ft_deviation(r, (i->caps & FI_RMA_PMEM) && !(i->caps & FI_RMA),
                                "caps %#llx asked, info caps %#llx have FI_RMA_PMEM without FI_RMA",
                                (unsigned long long)asks[k], (unsigned long long)i->caps));
            FT_TRY(ft_deviation(r, (i->tx_attr->caps & FI_RMA_PMEM) && !(i->tx_attr->caps & FI_RMA),
                                "tx_attr caps %#llx have FI_RMA_PMEM without FI_RMA",
                                (unsigned long long)i->tx_attr->caps));
        }
        fi_freeinfo(info);
        info = NULL;
    }
out:
    fi_freeinfo(info);
    fi_freeinfo(hints);
    return ret;
}

const struct ft_test ft_info_tests[] = {
    {"getinfo.basic", t_basic},
    {"getinfo.caps_subset", t_caps_subset},
    {"getinfo.mode", t_mode},
    {"getinfo.mr_mode", t_mr_mode},
    {"getinfo.control_progress", t_control_progress},
    {"getinfo.addr_format", t_addr_format},
    {"getinfo.src_node", t_src_node},
    {"getinfo.dest", t_dest},
    {"getinfo.bad_version", t_bad_version},
    {"getinfo.dupinfo", t_dupinfo},
    {"getinfo.primary_caps", t_primary_caps},
    {"getinfo.domain_caps", t_domain_caps},
    {"getinfo.no_hints", t_no_hints},
    {"getinfo.own_answer", t_own_answer},
    {"getinfo.mr_mode_bits", t_mr_mode_bits},
    {"getinfo.cq_data_size", t_cq_data_size},
    {"getinfo.domain_limits", t_domain_limits},
    {"getinfo.pmem_needs_rma", t_pmem_needs_rma},
    {NULL, NULL},
};
