/* SPDX-License-Identifier: MIT */
/*
 * What pmof puts on the wire besides verbs traffic, and the parsers that
 * read it back from a peer: the header of CM private data, the RDM
 * connector's hello, the FI_COMMIT_MANUAL control messages, and the
 * headers of an FI_TAGGED endpoint's messages.  Kept free
 * of libfabric and verbs so that the fuzz target can take it alone; every
 * parser accepts any bytes and says no to what is not well formed.
 */
#ifndef PMOF_WIRE_H
#define PMOF_WIRE_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------- CM private data header */

/* A REQ carries 56 bytes of private data: {user length, flags}, the control
 * QP's number when the sender commits manually, then the application's. */
#define PMOF_CM_PRIVATE_MAX 56
#define PMOF_CM_HDR_LEN 2
#define PMOF_CM_QPN_LEN 3

enum pmof_cm_flags {
    PMOF_CM_COMMIT_MANUAL = 1 << 0, /* a control QP number follows */
};

struct pmof_cm_hdr {
    const uint8_t *user; /* the application's bytes (NULL if none) */
    size_t user_len;
    uint8_t flags;
    uint32_t ctl_qpn; /* with PMOF_CM_COMMIT_MANUAL */
};

/* The application's bytes an endpoint can send: 54, or 51 when the header
 * carries a control QP number. */
size_t pmof_cm_user_max(uint8_t flags);
/* 0, or -1 when `len` exceeds pmof_cm_user_max(flags). */
int pmof_cm_hdr_pack(uint8_t out[PMOF_CM_PRIVATE_MAX], size_t *outlen, const void *user, size_t len,
                     uint8_t flags, uint32_t ctl_qpn);
/* False (and an empty header) when the bytes are not ours; the CM may pad
 * private data, so `len` may exceed what was packed. */
bool pmof_cm_hdr_parse(const void *data, size_t len, struct pmof_cm_hdr *out);

/* ------------------------------------------------------- RDM hello */

/* The connector's name, as the user bytes of an RDM endpoint's REQ. */
#define PMOF_RDM_HELLO_MAGIC 0x504d4f46u /* "PMOF" */

/* The connector's message protocol (its endpoint's caps) and, headed, its
 * eager size: both ends of a connection must use the same. */
enum pmof_rdm_hello_flags {
    PMOF_RDM_HELLO_HEADERS = 1 << 0, /* every message carries a pmof_msg_hdr */
};
struct pmof_rdm_hello {
    uint32_t magic;
    uint32_t pid;
    struct sockaddr_in6 name; /* or a sockaddr_in in the first bytes */
    uint32_t flags;
    uint32_t eager; /* PMOF_RDM_HELLO_HEADERS: the largest eager message */
};

/* The name a hello carries, if it is one: an IPv4 or IPv6 socket address;
 * `flags` and `eager` get its protocol (only known flags are accepted). */
bool pmof_rdm_hello_parse(const void *data, size_t len, struct sockaddr_storage *name,
                          uint32_t *flags, uint32_t *eager);

/* ------------------------------------------------ headed messages (tags) */

/*
 * An RDM endpoint with FI_TAGGED sends every message with a header, and
 * receives every message into the provider's buffers, where it is matched
 * with the application's receives in software.  A message up to the eager
 * size travels behind its header; a larger one is announced by a
 * request-to-send naming the sender's memory, which the receiver reads
 * with RDMA READ once matched and then acknowledges with a FIN.
 */
#define PMOF_MSG_VERSION 1
#define PMOF_MSG_HDR_LEN 40
#define PMOF_MSG_SEG_LEN 24
#define PMOF_MSG_SEG_MAX 4
#define PMOF_MSG_CTRL_MAX (PMOF_MSG_HDR_LEN + PMOF_MSG_SEG_MAX * PMOF_MSG_SEG_LEN)
/* The longest message (libfabric's max_msg_size of the provider). */
#define PMOF_MSG_LEN_MAX (1ULL << 30)

enum pmof_msg_type {
    PMOF_MSG_EAGER = 1, /* the payload follows the header */
    PMOF_MSG_RTS = 2,   /* the payload is in the sender's segments */
    PMOF_MSG_FIN = 3,   /* receiver -> sender: the RTS's payload was read */
};

enum pmof_msg_flags {
    PMOF_MSG_TAGGED = 1 << 0,  /* matched by tag; untagged ones in order */
    PMOF_MSG_CQ_DATA = 1 << 1, /* `data` is FI_REMOTE_CQ_DATA */
};

struct pmof_msg_seg {
    uint64_t addr, len;
    uint32_t rkey;
};

struct pmof_msg_hdr {
    uint8_t type, flags;
    uint32_t count;  /* RTS: segments */
    int32_t status;  /* FIN: 0, or the negative libfabric error of the read */
    uint64_t tag;    /* EAGER, RTS */
    uint64_t data;   /* EAGER, RTS with PMOF_MSG_CQ_DATA */
    uint64_t len;    /* EAGER, RTS: the message's length */
    uint64_t cookie; /* RTS: the sender's, echoed by the FIN */
    struct pmof_msg_seg segs[PMOF_MSG_SEG_MAX];
};

/* Little-endian; returns the header's length (the payload of an EAGER
 * follows it). */
size_t pmof_msg_encode(uint8_t out[PMOF_MSG_CTRL_MAX], const struct pmof_msg_hdr *h);
/* False unless `data` starts with one well-formed header whose lengths are
 * consistent with `len`: an EAGER's payload is exactly the rest, an RTS
 * has 1..PMOF_MSG_SEG_MAX segments that do not wrap and add up to its
 * length, at most PMOF_MSG_LEN_MAX, a FIN has a status of 0 or below;
 * flags, version and reserved bytes as defined. */
bool pmof_msg_parse(const void *data, size_t len, struct pmof_msg_hdr *out);

/* ----------------------------------------------- manual-commit messages */

/* A commit request names at most this many ranges (fi_commit's count). */
#define PMOF_MANUAL_IOV_MAX 32
#define PMOF_MANUAL_MAGIC 0x4d504d43u /* "CMPM" */
#define PMOF_MANUAL_VERSION 1
#define PMOF_MANUAL_HDR_LEN 24
#define PMOF_MANUAL_RANGE_LEN 24
#define PMOF_MANUAL_MSG_MAX (PMOF_MANUAL_HDR_LEN + PMOF_MANUAL_IOV_MAX * PMOF_MANUAL_RANGE_LEN)

enum pmof_manual_type {
    PMOF_MANUAL_REQ = 1,  /* initiator -> target: make these ranges durable */
    PMOF_MANUAL_ACK = 2,  /* target -> initiator: done, with a status */
    PMOF_MANUAL_PING = 3, /* either way: is the peer there?  (no answer) */
};

struct pmof_manual_range {
    uint64_t addr, len, key;
};

struct pmof_manual_msg {
    uint8_t type;
    uint64_t cookie; /* the initiator's, echoed by the ACK */
    int32_t status;  /* ACK: 0 or a negative libfabric error */
    uint32_t count;  /* REQ: ranges */
    struct pmof_manual_range ranges[PMOF_MANUAL_IOV_MAX];
};

/* Little-endian encoders; each returns the message's length. */
size_t pmof_manual_encode_req(uint8_t out[PMOF_MANUAL_MSG_MAX], uint64_t cookie,
                              const struct pmof_manual_range *ranges, uint32_t count);
size_t pmof_manual_encode_ack(uint8_t out[PMOF_MANUAL_MSG_MAX], uint64_t cookie, int32_t status);
size_t pmof_manual_encode_ping(uint8_t out[PMOF_MANUAL_MSG_MAX]);
/* False unless `data` is exactly one well-formed message: known type and
 * version, 1..PMOF_MANUAL_IOV_MAX ranges for a REQ (none otherwise), the
 * length those imply, ranges whose end does not wrap, an ACK status that is
 * 0 or negative. */
bool pmof_manual_parse(const void *data, size_t len, struct pmof_manual_msg *out);
/* For a message pmof_manual_parse refused: true, with its cookie, if it
 * starts with a REQ's header (magic, version, type), so that its sender
 * can be answered instead of waiting for an ACK that never comes. */
bool pmof_manual_req_cookie(const void *data, size_t len, uint64_t *cookie);

#ifdef __cplusplus
}
#endif

#endif /* PMOF_WIRE_H */
