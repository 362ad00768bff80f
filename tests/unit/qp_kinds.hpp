// SPDX-License-Identifier: MIT
//
// Building blocks of the tests of UD, UC, SRQ and XRC QPs (on top of
// rc_pair.hpp): one side's PD, CQs and the QPs, SRQs and address handles a
// case makes, destroyed with it; state transitions per QP type; posting
// datagrams and SRQ receives; async events with a deadline.
#pragma once

#include "rc_pair.hpp"

#include <fcntl.h>
#include <poll.h>
#include <tuple>

namespace qpkinds {

using namespace rctest;

inline constexpr uint32_t kQkey = 0x11111111;

// One side of a test: PD, CQs and whatever QPs a case makes.
struct End {
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq *scq = nullptr, *rcq = nullptr;
    ibv_gid gid{};
    std::vector<ibv_qp *> qps;
    std::vector<ibv_srq *> srqs;
    std::vector<ibv_ah *> ahs;

    explicit End(ibv_context *c) : ctx(c) {
        EXPECT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
        pd = ibv_alloc_pd(ctx);
        scq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
        rcq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    }
    ~End() {
        for (ibv_ah *a : ahs)
            EXPECT_EQ(ibv_destroy_ah(a), 0);
        for (ibv_qp *q : qps)
            EXPECT_EQ(ibv_destroy_qp(q), 0);
        for (ibv_srq *s : srqs)
            EXPECT_EQ(ibv_destroy_srq(s), 0);
        EXPECT_EQ(ibv_destroy_cq(scq), 0);
        EXPECT_EQ(ibv_destroy_cq(rcq), 0);
        EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    }

    ibv_qp *qp(ibv_qp_type type, ibv_srq *srq = nullptr, uint32_t max_inline = 0) {
        ibv_qp_init_attr ia{};
        ia.qp_type = type;
        ia.send_cq = scq;
        ia.recv_cq = rcq;
        ia.srq = srq;
        ia.sq_sig_all = 1;
        ia.cap = {64, srq ? 0u : 64u, 4, 4, max_inline};
        ibv_qp *q = ibv_create_qp(pd, &ia);
        EXPECT_NE(q, nullptr) << std::strerror(errno);
        if (q) qps.push_back(q);
        return q;
    }

    ibv_srq *srq(uint32_t max_wr) {
        ibv_srq_init_attr sa{};
        sa.attr.max_wr = max_wr;
        sa.attr.max_sge = 2;
        ibv_srq *s = ibv_create_srq(pd, &sa);
        EXPECT_NE(s, nullptr) << std::strerror(errno);
        if (s) srqs.push_back(s);
        return s;
    }

    ibv_ah *ah(const ibv_gid &dgid, uint8_t tclass = 0, uint8_t hop_limit = 64,
               uint32_t flow_label = 0) {
        ibv_ah_attr a{};
        a.is_global = 1;
        a.port_num = 1;
        a.grh.dgid = dgid;
        a.grh.sgid_index = 1;
        a.grh.hop_limit = hop_limit;
        a.grh.traffic_class = tclass;
        a.grh.flow_label = flow_label;
        ibv_ah *h = ibv_create_ah(pd, &a);
        EXPECT_NE(h, nullptr) << std::strerror(errno);
        if (h) ahs.push_back(h);
        return h;
    }
};

inline int ud_to_rts(ibv_qp *qp, uint32_t qkey) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    if (int rc =
            ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
        return rc;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x123;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

// RTR without responder resources or RNR timer: UC, and XRC send QPs,
// which have no responder (the kernel's table refuses those attributes).
inline int to_rtr_path(ibv_qp *qp, const ibv_gid &dgid, uint32_t dqpn, uint32_t rq_psn) {
    ibv_qp_attr x = rtr_path(dgid, dqpn, rq_psn, IBV_MTU_1024);
    return ibv_modify_qp(qp, &x, kRtrPathMask);
}

// RTS with only the SQ PSN (UC), plus a timeout for an XRC receive QP, which
// sends responses only.
inline int to_rts_plain(ibv_qp *qp, uint32_t sq_psn, uint8_t timeout = 0) {
    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_RTS;
    x.sq_psn = sq_psn;
    x.timeout = timeout;
    return ibv_modify_qp(qp, &x, IBV_QP_STATE | IBV_QP_SQ_PSN | (timeout ? IBV_QP_TIMEOUT : 0));
}

// UC, RC and XRC (a: send QP, b: receive QP) QPs connected back to back.
inline void connect(ibv_qp *a, const End &ea, ibv_qp *b, const End &eb, bool rc) {
    ASSERT_EQ(to_init(a, kAllAccess), 0);
    ASSERT_EQ(to_init(b, kAllAccess), 0);
    if (a->qp_type == IBV_QPT_XRC_SEND) {
        ASSERT_EQ(to_rtr_path(a, eb.gid, b->qp_num, 100), 0);
        ASSERT_EQ(to_rtr(b, ea.gid, a->qp_num, 200, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rts(a, 200, 14, 7, 7, 4), 0);
        ASSERT_EQ(to_rts_plain(b, 100, 14), 0);
        return;
    }
    if (rc) {
        ASSERT_EQ(to_rtr(a, eb.gid, b->qp_num, 100, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rtr(b, ea.gid, a->qp_num, 200, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rts(a, 200, 14, 7, 7, 4), 0);
        ASSERT_EQ(to_rts(b, 100, 14, 7, 7, 4), 0);
        return;
    }
    ASSERT_EQ(to_rtr_path(a, eb.gid, b->qp_num, 100), 0);
    ASSERT_EQ(to_rtr_path(b, ea.gid, a->qp_num, 200), 0);
    ASSERT_EQ(to_rts_plain(a, 200), 0);
    ASSERT_EQ(to_rts_plain(b, 100), 0);
}

// An XRC setup: a domain on B's side with an XRC SRQ (completions on
// `cq`) and a receive QP, and a send QP on A's side; the QPs are not
// connected yet.
struct Xrc {
    ibv_xrcd *xrcd = nullptr;
    ibv_srq *srq = nullptr;
    uint32_t srqn = 0;
    ibv_qp *recv_qp = nullptr, *send_qp = nullptr;

    void make(End &a, End &b, ibv_cq *cq, uint32_t max_wr) {
        ibv_xrcd_init_attr xa{};
        xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        xa.fd = -1;
        xa.oflags = O_CREAT;
        xrcd = ibv_open_xrcd(b.ctx, &xa);
        ASSERT_NE(xrcd, nullptr) << std::strerror(errno);
        srq = xrc_srq(b, cq, max_wr);
        ASSERT_NE(srq, nullptr) << std::strerror(errno);
        ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
        ibv_qp_init_attr_ex ta{};
        ta.qp_type = IBV_QPT_XRC_RECV;
        ta.comp_mask = IBV_QP_INIT_ATTR_XRCD;
        ta.xrcd = xrcd;
        recv_qp = ibv_create_qp_ex(b.ctx, &ta);
        ASSERT_NE(recv_qp, nullptr) << std::strerror(errno);
        ibv_qp_init_attr_ex ia{};
        ia.qp_type = IBV_QPT_XRC_SEND;
        ia.comp_mask = IBV_QP_INIT_ATTR_PD;
        ia.pd = a.pd;
        ia.send_cq = a.scq;
        ia.cap = {16, 0, 1, 0, 0};
        ia.sq_sig_all = 1;
        send_qp = ibv_create_qp_ex(a.ctx, &ia);
        ASSERT_NE(send_qp, nullptr) << std::strerror(errno);
        a.qps.push_back(send_qp);
    }
    // Another XRC SRQ of the same domain.
    ibv_srq *xrc_srq(End &b, ibv_cq *cq, uint32_t max_wr) const {
        ibv_srq_init_attr_ex sa{};
        sa.attr = {max_wr, 1, 0};
        sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                       IBV_SRQ_INIT_ATTR_CQ;
        sa.srq_type = IBV_SRQT_XRC;
        sa.pd = b.pd;
        sa.xrcd = xrcd;
        sa.cq = cq;
        return ibv_create_srq_ex(b.ctx, &sa);
    }
    // Destroys what lives on B's side (the send QP belongs to A's End).
    void destroy() {
        if (recv_qp) {
            EXPECT_EQ(ibv_destroy_qp(recv_qp), 0);
        }
        if (srq) {
            EXPECT_EQ(ibv_destroy_srq(srq), 0);
        }
        if (xrcd) {
            EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
        }
        *this = Xrc{};
    }
};

inline int post_ud(ibv_qp *qp, uint64_t id, ibv_ah *ah, uint32_t qpn, uint32_t qkey,
                   std::vector<ibv_sge> sg, ibv_wr_opcode op = IBV_WR_SEND, uint32_t imm = 0) {
    ibv_send_wr wr = send_wr(id, op, sg);
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = qkey;
    wr.imm_data = htonl(imm);
    ibv_send_wr *bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
}

inline int post_srq(ibv_srq *srq, uint64_t id, std::vector<ibv_sge> sg) {
    ibv_recv_wr wr = recv_wr(id, sg);
    ibv_recv_wr *bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
}

// The next async event of a context, within `ms`.
inline bool next_event(ibv_context *ctx, ibv_async_event *ev, int ms = 1000) {
    int fl = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
    pollfd p{ctx->async_fd, POLLIN, 0};
    bool ok = poll(&p, 1, ms) == 1 && ibv_get_async_event(ctx, ev) == 0;
    fcntl(ctx->async_fd, F_SETFL, fl);
    if (ok) ibv_ack_async_event(ev);
    return ok;
}

} // namespace qpkinds
