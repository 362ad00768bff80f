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

    ibv_ah *ah(const ibv_gid &dgid) {
        ibv_ah_attr a{};
        a.is_global = 1;
        a.port_num = 1;
        a.grh.dgid = dgid;
        a.grh.sgid_index = 1;
        a.grh.hop_limit = 64;
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

// UC, RC and XRC QPs connected back to back.
inline void connect(ibv_qp *a, const End &ea, ibv_qp *b, const End &eb, bool rc) {
    ASSERT_EQ(to_init(a, kAllAccess), 0);
    ASSERT_EQ(to_init(b, kAllAccess), 0);
    if (a->qp_type == IBV_QPT_XRC_SEND) {
        // The sending half has no responder: no responder resources or RNR
        // timer at RTR (the kernel's table refuses them).
        ibv_qp_attr x{};
        x.qp_state = IBV_QPS_RTR;
        x.path_mtu = IBV_MTU_1024;
        x.dest_qp_num = b->qp_num;
        x.rq_psn = 100;
        x.ah_attr.is_global = 1;
        x.ah_attr.port_num = 1;
        x.ah_attr.grh.dgid = eb.gid;
        x.ah_attr.grh.sgid_index = 1;
        ASSERT_EQ(ibv_modify_qp(a, &x,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                    IBV_QP_RQ_PSN),
                  0);
        ASSERT_EQ(to_rtr(b, ea.gid, a->qp_num, 200, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rts(a, 200, 14, 7, 7, 4), 0);
        // The receiving half sends only responses: no retry counts either.
        x = {};
        x.qp_state = IBV_QPS_RTS;
        x.sq_psn = 100;
        x.timeout = 14;
        ASSERT_EQ(ibv_modify_qp(b, &x, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT), 0);
        return;
    }
    if (rc) {
        ASSERT_EQ(to_rtr(a, eb.gid, b->qp_num, 100, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rtr(b, ea.gid, a->qp_num, 200, IBV_MTU_1024, 4, 1), 0);
        ASSERT_EQ(to_rts(a, 200, 14, 7, 7, 4), 0);
        ASSERT_EQ(to_rts(b, 100, 14, 7, 7, 4), 0);
        return;
    }
    for (auto [q, gid, dqpn, psn] :
         {std::tuple{a, eb.gid, b->qp_num, 100u}, std::tuple{b, ea.gid, a->qp_num, 200u}}) {
        ibv_qp_attr x{};
        x.qp_state = IBV_QPS_RTR;
        x.path_mtu = IBV_MTU_1024;
        x.dest_qp_num = dqpn;
        x.rq_psn = psn;
        x.ah_attr.is_global = 1;
        x.ah_attr.port_num = 1;
        x.ah_attr.grh.dgid = gid;
        x.ah_attr.grh.sgid_index = 1;
        ASSERT_EQ(ibv_modify_qp(q, &x,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                    IBV_QP_RQ_PSN),
                  0);
    }
    for (auto [q, psn] : {std::pair{a, 200u}, std::pair{b, 100u}}) {
        ibv_qp_attr x{};
        x.qp_state = IBV_QPS_RTS;
        x.sq_psn = psn;
        ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    }
}

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
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = sg.empty() ? nullptr : sg.data();
    wr.num_sge = int(sg.size());
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
