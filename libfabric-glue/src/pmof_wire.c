/* SPDX-License-Identifier: MIT */
#include "pmof_wire.h"

#include <endian.h>
#include <netinet/in.h>
#include <string.h>

/* ------------------------------------------------- CM private data header */

size_t pmof_cm_user_max(uint8_t flags) {
    size_t n = PMOF_CM_PRIVATE_MAX - PMOF_CM_HDR_LEN;
    return (flags & PMOF_CM_COMMIT_MANUAL) ? n - PMOF_CM_QPN_LEN : n;
}

int pmof_cm_hdr_pack(uint8_t out[PMOF_CM_PRIVATE_MAX], size_t *outlen, const void *user, size_t len,
                     uint8_t flags, uint32_t ctl_qpn) {
    size_t off = PMOF_CM_HDR_LEN;

    if (len > pmof_cm_user_max(flags) || (len && !user)) return -1;
    out[0] = (uint8_t)len;
    out[1] = flags;
    if (flags & PMOF_CM_COMMIT_MANUAL) {
        /* QP numbers are 24 bits, as in the CM's own messages. */
        out[2] = (uint8_t)(ctl_qpn >> 16);
        out[3] = (uint8_t)(ctl_qpn >> 8);
        out[4] = (uint8_t)ctl_qpn;
        off += PMOF_CM_QPN_LEN;
    }
    if (len) memcpy(out + off, user, len);
    *outlen = off + len;
    return 0;
}

bool pmof_cm_hdr_parse(const void *data, size_t len, struct pmof_cm_hdr *out) {
    const uint8_t *d = data;
    size_t off = PMOF_CM_HDR_LEN;

    memset(out, 0, sizeof(*out));
    if (!d || len < PMOF_CM_HDR_LEN) return false;
    if (d[1] & ~PMOF_CM_COMMIT_MANUAL) return false; /* a flag we do not know */
    if (d[1] & PMOF_CM_COMMIT_MANUAL) {
        if (len < PMOF_CM_HDR_LEN + PMOF_CM_QPN_LEN) return false;
        out->ctl_qpn = (uint32_t)d[2] << 16 | (uint32_t)d[3] << 8 | d[4];
        if (!out->ctl_qpn) return false;
        off += PMOF_CM_QPN_LEN;
    }
    if (d[0] > len - off || d[0] > pmof_cm_user_max(d[1])) {
        out->ctl_qpn = 0;
        return false;
    }
    out->flags = d[1];
    out->user_len = d[0];
    out->user = d[0] ? d + off : NULL;
    return true;
}

/* ------------------------------------------------------------- RDM hello */

bool pmof_rdm_hello_parse(const void *data, size_t len, struct sockaddr_storage *name,
                          uint32_t *flags, uint32_t *eager) {
    struct pmof_rdm_hello h;

    if (!data || len < sizeof(h)) return false;
    memcpy(&h, data, sizeof(h));
    if (h.magic != PMOF_RDM_HELLO_MAGIC || (h.flags & ~(uint32_t)PMOF_RDM_HELLO_HEADERS))
        return false;
    *flags = h.flags;
    *eager = h.eager;
    memset(name, 0, sizeof(*name));
    if (h.name.sin6_family == AF_INET6) {
        memcpy(name, &h.name, sizeof(struct sockaddr_in6));
        return true;
    }
    if (h.name.sin6_family == AF_INET) {
        memcpy(name, &h.name, sizeof(struct sockaddr_in));
        return true;
    }
    return false;
}

/* ----------------------------------------------- manual-commit messages */

/*
 * Header, little-endian:
 *   0  u32 magic   4  u8 type   5  u8 version   6  u16 count
 *   8  u64 cookie  16 i32 status  20 u32 reserved (0)
 * then `count` ranges of {u64 addr, u64 len, u64 key}.
 */
static void put16(uint8_t *p, uint16_t v) {
    v = htole16(v);
    memcpy(p, &v, sizeof(v));
}
static void put32(uint8_t *p, uint32_t v) {
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}
static void put64(uint8_t *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}
static uint16_t get16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return le16toh(v);
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

static size_t encode_hdr(uint8_t *out, uint8_t type, uint16_t count, uint64_t cookie,
                         int32_t status) {
    put32(out, PMOF_MANUAL_MAGIC);
    out[4] = type;
    out[5] = PMOF_MANUAL_VERSION;
    put16(out + 6, count);
    put64(out + 8, cookie);
    put32(out + 16, (uint32_t)status);
    put32(out + 20, 0);
    return PMOF_MANUAL_HDR_LEN;
}

size_t pmof_manual_encode_req(uint8_t out[PMOF_MANUAL_MSG_MAX], uint64_t cookie,
                              const struct pmof_manual_range *ranges, uint32_t count) {
    size_t off;

    if (count > PMOF_MANUAL_IOV_MAX) count = PMOF_MANUAL_IOV_MAX;
    off = encode_hdr(out, PMOF_MANUAL_REQ, (uint16_t)count, cookie, 0);
    for (uint32_t i = 0; i < count; i++, off += PMOF_MANUAL_RANGE_LEN) {
        put64(out + off, ranges[i].addr);
        put64(out + off + 8, ranges[i].len);
        put64(out + off + 16, ranges[i].key);
    }
    return off;
}

size_t pmof_manual_encode_ack(uint8_t out[PMOF_MANUAL_MSG_MAX], uint64_t cookie, int32_t status) {
    return encode_hdr(out, PMOF_MANUAL_ACK, 0, cookie, status);
}

size_t pmof_manual_encode_ping(uint8_t out[PMOF_MANUAL_MSG_MAX]) {
    return encode_hdr(out, PMOF_MANUAL_PING, 0, 0, 0);
}

bool pmof_manual_parse(const void *data, size_t len, struct pmof_manual_msg *out) {
    const uint8_t *d = data;
    uint16_t count;

    if (!d || len < PMOF_MANUAL_HDR_LEN) return false;
    if (get32(d) != PMOF_MANUAL_MAGIC || d[5] != PMOF_MANUAL_VERSION || get32(d + 20)) return false;
    count = get16(d + 6);
    out->type = d[4];
    out->cookie = get64(d + 8);
    out->status = (int32_t)get32(d + 16);
    out->count = count;
    switch (out->type) {
    case PMOF_MANUAL_REQ:
        if (!count || count > PMOF_MANUAL_IOV_MAX || out->status) return false;
        if (len != PMOF_MANUAL_HDR_LEN + (size_t)count * PMOF_MANUAL_RANGE_LEN) return false;
        for (uint16_t i = 0; i < count; i++) {
            const uint8_t *r = d + PMOF_MANUAL_HDR_LEN + (size_t)i * PMOF_MANUAL_RANGE_LEN;
            struct pmof_manual_range *o = &out->ranges[i];
            o->addr = get64(r);
            o->len = get64(r + 8);
            o->key = get64(r + 16);
            if (o->addr + o->len < o->addr) return false;
        }
        return true;
    case PMOF_MANUAL_ACK:
        return !count && out->status <= 0 && len == PMOF_MANUAL_HDR_LEN;
    case PMOF_MANUAL_PING:
        return !count && !out->status && len == PMOF_MANUAL_HDR_LEN;
    default:
        return false;
    }
}

bool pmof_manual_req_cookie(const void *data, size_t len, uint64_t *cookie) {
    const uint8_t *d = data;

    if (!d || len < PMOF_MANUAL_HDR_LEN || get32(d) != PMOF_MANUAL_MAGIC ||
        d[4] != PMOF_MANUAL_REQ || d[5] != PMOF_MANUAL_VERSION)
        return false;
    *cookie = get64(d + 8);
    return true;
}

/* ------------------------------------------------ headed messages (tags) */

/*
 * Header, little-endian:
 *   0  u8 type   1  u8 flags   2  u8 count   3  u8 version
 *   4  i32 status   8  u64 tag   16 u64 data   24 u64 len   32 u64 cookie
 * then (RTS) `count` segments of {u64 addr, u64 len, u32 rkey, u32 0}.
 */
size_t pmof_msg_encode(uint8_t out[PMOF_MSG_CTRL_MAX], const struct pmof_msg_hdr *h) {
    uint32_t count = h->type == PMOF_MSG_RTS ? h->count : 0;
    size_t off = PMOF_MSG_HDR_LEN;

    if (count > PMOF_MSG_SEG_MAX) count = PMOF_MSG_SEG_MAX;
    out[0] = h->type;
    out[1] = h->flags;
    out[2] = (uint8_t)count;
    out[3] = PMOF_MSG_VERSION;
    put32(out + 4, (uint32_t)h->status);
    put64(out + 8, h->tag);
    put64(out + 16, h->data);
    put64(out + 24, h->len);
    put64(out + 32, h->cookie);
    for (uint32_t i = 0; i < count; i++, off += PMOF_MSG_SEG_LEN) {
        put64(out + off, h->segs[i].addr);
        put64(out + off + 8, h->segs[i].len);
        put32(out + off + 16, h->segs[i].rkey);
        put32(out + off + 20, 0);
    }
    return off;
}

bool pmof_msg_parse(const void *data, size_t len, struct pmof_msg_hdr *out) {
    const uint8_t *d = data;
    uint64_t sum = 0;

    memset(out, 0, sizeof(*out));
    if (!d || len < PMOF_MSG_HDR_LEN || d[3] != PMOF_MSG_VERSION) return false;
    if (d[1] & ~(PMOF_MSG_TAGGED | PMOF_MSG_CQ_DATA)) return false;
    out->type = d[0];
    out->flags = d[1];
    out->count = d[2];
    out->status = (int32_t)get32(d + 4);
    out->tag = get64(d + 8);
    out->data = get64(d + 16);
    out->len = get64(d + 24);
    out->cookie = get64(d + 32);
    switch (out->type) {
    case PMOF_MSG_EAGER:
        return !out->count && !out->status && !out->cookie && out->len == len - PMOF_MSG_HDR_LEN;
    case PMOF_MSG_RTS:
        if (!out->count || out->count > PMOF_MSG_SEG_MAX || out->status) return false;
        if (len != PMOF_MSG_HDR_LEN + (size_t)out->count * PMOF_MSG_SEG_LEN) return false;
        for (uint32_t i = 0; i < out->count; i++) {
            const uint8_t *s = d + PMOF_MSG_HDR_LEN + (size_t)i * PMOF_MSG_SEG_LEN;
            struct pmof_msg_seg *o = &out->segs[i];
            o->addr = get64(s);
            o->len = get64(s + 8);
            o->rkey = get32(s + 16);
            if (get32(s + 20) || o->addr + o->len < o->addr || o->len > UINT64_MAX - sum)
                return false;
            sum += o->len;
        }
        return sum == out->len && out->len <= PMOF_MSG_LEN_MAX;
    case PMOF_MSG_FIN:
        return !out->count && out->status <= 0 && !out->flags && !out->tag && !out->data &&
               !out->len && len == PMOF_MSG_HDR_LEN;
    default:
        return false;
    }
}
