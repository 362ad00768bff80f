// SPDX-License-Identifier: MIT
//
// libFuzzer target for what the pmof libfabric provider reads from a peer
// (libfabric-glue/src/pmof_wire.c): the header of CM private data, the RDM
// connector's hello, the FI_COMMIT_MANUAL control messages (and the cookie
// read from a malformed request, to answer it) and the headers of an
// FI_TAGGED endpoint's messages.  The first byte picks the parser.
// The oracle is the sanitizers, plus: whatever a parser accepts is
// consistent with its input (user bytes inside it, a nonzero control QP
// when the flag says so, an address family it knows, a message that
// encodes back to the same bytes).
#include "pmof_wire.h"

#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0: {
        pmof_cm_hdr h;
        if (!pmof_cm_hdr_parse(in, n, &h)) {
            if (h.user || h.user_len || h.flags || h.ctl_qpn) abort();
            return 0;
        }
        if (h.user_len && (h.user < in || h.user + h.user_len > in + n)) abort();
        if (h.user_len > pmof_cm_user_max(h.flags)) abort();
        if (!(h.flags & PMOF_CM_COMMIT_MANUAL) != !h.ctl_qpn) abort();
        // Packing what was parsed gives the same prefix back.
        uint8_t out[PMOF_CM_PRIVATE_MAX];
        size_t len;
        if (pmof_cm_hdr_pack(out, &len, h.user, h.user_len, h.flags, h.ctl_qpn)) abort();
        if (len > n || std::memcmp(out, in, len)) abort();
        return 0;
    }
    case 1: {
        sockaddr_storage ss;
        uint32_t flags, eager;
        if (pmof_rdm_hello_parse(in, n, &ss, &flags, &eager) &&
            ((ss.ss_family != AF_INET && ss.ss_family != AF_INET6) ||
             (flags & ~uint32_t(PMOF_RDM_HELLO_HEADERS))))
            abort();
        return 0;
    }
    case 2: {
        // A header encodes back to the bytes it was parsed from; an EAGER's
        // payload is the rest of the input.
        pmof_msg_hdr h;
        if (!pmof_msg_parse(in, n, &h)) return 0;
        uint8_t out[PMOF_MSG_CTRL_MAX];
        size_t len = pmof_msg_encode(out, &h);
        if (len > n || std::memcmp(out, in, len)) abort();
        if (h.type == PMOF_MSG_EAGER ? h.len != n - len : len != n) abort();
        if (h.type == PMOF_MSG_RTS) {
            uint64_t sum = 0;
            for (uint32_t i = 0; i < h.count; i++)
                sum += h.segs[i].len;
            if (!h.count || h.count > PMOF_MSG_SEG_MAX || sum != h.len || h.len > PMOF_MSG_LEN_MAX)
                abort();
        }
        return 0;
    }
    default: {
        // The cookie of a malformed REQ, by which its sender is answered:
        // read only from a whole header, and a well-formed REQ's own.
        uint64_t cookie = 0;
        bool req = pmof_manual_req_cookie(in, n, &cookie);
        if (req && n < PMOF_MANUAL_HDR_LEN) abort();
        pmof_manual_msg m;
        if (!pmof_manual_parse(in, n, &m)) return 0;
        if ((m.type == PMOF_MANUAL_REQ) != req || (req && cookie != m.cookie)) abort();
        uint8_t out[PMOF_MANUAL_MSG_MAX];
        size_t len = m.type == PMOF_MANUAL_REQ
                         ? pmof_manual_encode_req(out, m.cookie, m.ranges, m.count)
                     : m.type == PMOF_MANUAL_ACK ? pmof_manual_encode_ack(out, m.cookie, m.status)
                                                 : pmof_manual_encode_ping(out);
        // A PING carries no cookie: only its header fields are compared.
        if (m.type == PMOF_MANUAL_PING) std::memcpy(out + 8, in + 8, 8);
        if (len != n || std::memcmp(out, in, n)) abort();
        return 0;
    }
    }
}
