// SPDX-License-Identifier: MIT
//
// Building blocks of the in-process transport tests: a link configuration
// with two sroce devices on loopback, two RC QPs (one per device, so each has
// its own NIC, socket and progress thread) connected back to back through
// public verbs, registered buffers with guard bytes, and CQ polling bounded by
// a deadline so an engine bug fails a test instead of hanging it.
#pragma once

#include "inet_sockets.hpp"

#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace rctest {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline constexpr Clock::duration kDeadline = 10s;
inline constexpr unsigned kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

inline uint32_t mtu_bytes(ibv_mtu m) {
    return 128u << int(m);
}

// Port 1's active MTU in bytes, or 0 if the port cannot be queried.
inline uint32_t active_mtu(ibv_context *ctx) {
    ibv_port_attr port{};
    return ibv_query_port(ctx, 1, &port) ? 0 : mtu_bytes(port.active_mtu);
}

// Which wire the devices are on: the in-memory one (SROCE_PORT=memory), on
// which the engine opens no socket, or the kernel's UDP on lo, for what
// only sockets show.
enum class Wire { kMemory, kUdp };

// Writes a link configuration naming two devices on lo and points
// SROCE_CONFIG at it.  The engine reads the file once, at the process's first
// ibv_get_device_list(), so this must come first; the file is removed once
// the list is built.  Fills dev[0], dev[1] or returns why not.
inline std::string find_devices(const char *name0, const char *addr0, const char *name1,
                                const char *addr1, ibv_device *dev[2], Wire wire = Wire::kMemory) {
    if (wire == Wire::kMemory) {
        setenv("SROCE_PORT", "memory", 1);
        expect_no_inet_sockets();
    } else {
        unsetenv("SROCE_PORT");
    }
    char path[] = "/tmp/sroce-rc-test-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return std::string("mkstemp: ") + std::strerror(errno);
    close(fd);
    {
        std::ofstream f(path);
        f << name0 << " netdev lo addr " << addr0 << "\n"
          << name1 << " netdev lo addr " << addr1 << "\n";
    }
    setenv("SROCE_CONFIG", path, 1);
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    unlink(path);
    if (!list) return std::string("ibv_get_device_list: ") + std::strerror(errno);
    dev[0] = dev[1] = nullptr;
    for (int i = 0; i < n; i++) {
        if (!std::strcmp(ibv_get_device_name(list[i]), name0)) dev[0] = list[i];
        if (!std::strcmp(ibv_get_device_name(list[i]), name1)) dev[1] = list[i];
    }
    // sroce devices outlive the list that names them.
    ibv_free_device_list(list);
    if (!dev[0] || !dev[1]) return "the configured sroce devices are not listed";
    return {};
}

// ibv_open_device(), waiting up to `patience` while another process (a test
// run from another build tree) still holds the device's address.
inline ibv_context *open_device(ibv_device *dev, Clock::duration patience = 60s) {
    auto end = Clock::now() + patience;
    for (;;) {
        ibv_context *c = ibv_open_device(dev);
        if (c || errno != EADDRINUSE || Clock::now() >= end) return c;
        std::this_thread::sleep_for(500ms);
    }
}

// Opens two sroce devices (at addresses unique to the test binary) before
// its tests and closes them after.  `before` runs first, for what must be in
// place before a device exists (fault injector settings, persistence hooks);
// `after` runs last.
class DevicePairEnv : public ::testing::Environment {
  public:
    DevicePairEnv(const char *name0, const char *addr0, const char *name1, const char *addr1,
                  ibv_context **ctx, std::function<void()> before = {},
                  std::function<void()> after = {}, Wire wire = Wire::kMemory)
        : names_{name0, name1}, addrs_{addr0, addr1}, ctx_(ctx), before_(std::move(before)),
          after_(std::move(after)), wire_(wire) {}
    void SetUp() override {
        if (before_) before_();
        ibv_device *dev[2];
        ASSERT_EQ(find_devices(names_[0], addrs_[0], names_[1], addrs_[1], dev, wire_), "");
        for (int i = 0; i < 2; i++) {
            ctx_[i] = open_device(dev[i]);
            ASSERT_NE(ctx_[i], nullptr) << std::strerror(errno);
        }
    }
    void TearDown() override {
        for (int i = 0; i < 2; i++) {
            if (ctx_[i]) {
                EXPECT_EQ(ibv_close_device(ctx_[i]), 0);
            }
            ctx_[i] = nullptr;
        }
        if (after_) after_();
    }

  private:
    const char *names_[2], *addrs_[2];
    ibv_context **ctx_;
    std::function<void()> before_, after_;
    Wire wire_;
};

// Deterministic bytes for buffer contents.
inline void fill_pattern(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = uint8_t(s >> 24);
    }
}

// A registered buffer.  Unregistered guard bytes on both sides let a test
// check that nothing was written outside the range it asked for.
class Buf {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr uint8_t kGuardByte = 0xA5;

    Buf(ibv_pd *pd, size_t len, unsigned access = kAllAccess)
        : mem_(len + 2 * kGuard, kGuardByte), len_(len) {
        if (pd) mr_ = ibv_reg_mr(pd, data(), std::max<size_t>(len, 1), int(access));
    }
    ~Buf() {
        if (mr_) ibv_dereg_mr(mr_);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;

    bool ok() const { return mr_ != nullptr; }
    ibv_mr *mr() const { return mr_; }
    uint8_t *data() { return mem_.data() + kGuard; }
    const uint8_t *data() const { return mem_.data() + kGuard; }
    size_t size() const { return len_; }
    uint64_t addr(size_t off = 0) const { return uint64_t(uintptr_t(data() + off)); }
    uint32_t lkey() const { return mr_->lkey; }
    uint32_t rkey() const { return mr_->rkey; }
    ibv_sge sge(size_t off, size_t len) const { return {addr(off), uint32_t(len), lkey()}; }
    void fill(uint64_t seed) { fill_pattern(data(), len_, seed); }
    void set(uint8_t v) { std::memset(data(), v, len_); }
    uint64_t &word(size_t off) { return *reinterpret_cast<uint64_t *>(data() + off); }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; i++)
            if (mem_[i] != kGuardByte || mem_[kGuard + len_ + i] != kGuardByte) return false;
        return true;
    }

  private:
    std::vector<uint8_t> mem_;
    size_t len_;
    ibv_mr *mr_ = nullptr;
};

// First byte where a and b differ over n bytes, for readable failures.
inline ::testing::AssertionResult same_bytes(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return ::testing::AssertionFailure()
                   << "byte " << i << " of " << n << " differs: " << unsigned(a[i])
                   << " != " << unsigned(b[i]);
    return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_bytes(const uint8_t *p, size_t n, uint8_t v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return ::testing::AssertionFailure() << "byte " << i << " of " << n << " is "
                                                 << unsigned(p[i]) << ", expected " << unsigned(v);
    return ::testing::AssertionSuccess();
}

// Lays [0, len) out in `parts` pieces across `buf` with `gap` untouched bytes
// between them (a scatter/gather list); zero-length pieces are left out.
inline std::vector<ibv_sge> spread(const Buf &buf, size_t len, int parts, size_t gap) {
    std::vector<ibv_sge> out;
    size_t off = 0;
    for (int i = 0; i < parts; i++) {
        size_t piece = len / size_t(parts) + (size_t(i) < len % size_t(parts) ? 1 : 0);
        if (!piece) continue;
        out.push_back(buf.sge(off, piece));
        off += piece + gap;
    }
    return out;
}

// The bytes a scatter/gather list covers, in order.
inline std::vector<uint8_t> gathered(const std::vector<ibv_sge> &sg) {
    std::vector<uint8_t> out;
    for (const ibv_sge &s : sg) {
        auto *p = reinterpret_cast<const uint8_t *>(uintptr_t(s.addr));
        out.insert(out.end(), p, p + s.length);
    }
    return out;
}

// Up to n completions, waiting at most `within` for all of them.
inline std::vector<ibv_wc> poll_n(ibv_cq *cq, size_t n, Clock::duration within = kDeadline) {
    std::vector<ibv_wc> out;
    out.reserve(n);
    auto end = Clock::now() + within;
    ibv_wc wc[32];
    unsigned idle = 0;
    while (out.size() < n) {
        int k = ibv_poll_cq(cq, int(std::min<size_t>(32, n - out.size())), wc);
        if (k < 0) {
            ADD_FAILURE() << "ibv_poll_cq returned " << k;
            break;
        }
        if (k > 0) {
            out.insert(out.end(), wc, wc + k);
            idle = 0;
            continue;
        }
        if (Clock::now() >= end) break;
        if (++idle > 100) std::this_thread::sleep_for(20us);
    }
    return out;
}

// Whatever arrives within `wait` (a test expecting silence checks it is empty).
inline std::vector<ibv_wc> drain(ibv_cq *cq, Clock::duration wait = 0ms) {
    std::vector<ibv_wc> out;
    auto end = Clock::now() + wait;
    ibv_wc wc[32];
    do {
        int k;
        while ((k = ibv_poll_cq(cq, 32, wc)) > 0)
            out.insert(out.end(), wc, wc + k);
        if (Clock::now() >= end) break;
        std::this_thread::sleep_for(200us);
    } while (true);
    return out;
}

// Expected fields of a work completion.  Only wr_id, status and qp_num are
// defined for an unsuccessful one.
struct Want {
    uint64_t wr_id = 0;
    ibv_wc_status status = IBV_WC_SUCCESS;
    ibv_wc_opcode opcode = IBV_WC_SEND;
    uint32_t qp_num = 0;
    int64_t byte_len = -1; // -1: not defined for this completion
    unsigned wc_flags = 0;
    uint32_t imm = 0; // host order; checked when wc_flags has IBV_WC_WITH_IMM
};

inline void expect_wc(const ibv_wc &wc, const Want &w) {
    EXPECT_EQ(wc.wr_id, w.wr_id);
    EXPECT_EQ(wc.status, w.status) << ibv_wc_status_str(wc.status) << " instead of "
                                   << ibv_wc_status_str(w.status) << " (wr_id " << wc.wr_id << ")";
    EXPECT_EQ(wc.qp_num, w.qp_num);
    if (w.status != IBV_WC_SUCCESS) return;
    EXPECT_EQ(wc.opcode, w.opcode);
    if (w.byte_len >= 0) {
        EXPECT_EQ(int64_t(wc.byte_len), w.byte_len);
    }
    EXPECT_EQ(wc.wc_flags, w.wc_flags);
    if (w.wc_flags & IBV_WC_WITH_IMM) {
        EXPECT_EQ(wc.imm_data, htonl(w.imm));
    }
}

// One completion, expected within the deadline.
inline void expect_one(ibv_cq *cq, const Want &w, Clock::duration within = kDeadline) {
    std::vector<ibv_wc> got = poll_n(cq, 1, within);
    ASSERT_EQ(got.size(), 1u) << "no completion for wr_id " << w.wr_id;
    expect_wc(got[0], w);
}

inline ibv_qp_state qp_state(ibv_qp *qp) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return ibv_qp_state(-1);
    return a.qp_state;
}

struct PairOpts {
    ibv_mtu mtu = IBV_MTU_1024;
    uint32_t send_wr = 64, recv_wr = 64;
    uint32_t send_sge = 4, recv_sge = 4;
    uint32_t max_inline = 0;
    unsigned a_access = kAllAccess, b_access = kAllAccess; // QP access flags
    uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7;
    uint8_t min_rnr_timer = 1; // 10 us
    uint8_t rd_atomic = 16;
    bool sq_sig_all = true;
    int cqe = 4096;
    bool qp_ex = false;          // QPs from ibv_create_qp_ex with every RC send op
    uint64_t extra_send_ops = 0; // e.g. IBV_QP_EX_WITH_RDMA_WRITE_COMMIT
    bool cq_ex = false;          // CQs from ibv_create_cq_ex
    uint64_t extra_wc_flags = 0; // e.g. IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    bool b_channel = false;      // B's receive CQ reports to a completion channel
    bool connect = true;         // bring both QPs to RTS
    // Start PSNs near the 24-bit wrap so ordinary traffic crosses it.
    uint32_t a_psn = 0xFFFFF0, b_psn = 0xFFFF80;
};

struct Side {
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_comp_channel *channel = nullptr;
    ibv_cq *scq = nullptr, *rcq = nullptr;
    ibv_cq_ex *scqx = nullptr, *rcqx = nullptr;
    ibv_qp *qp = nullptr;
    ibv_qp_ex *qpx = nullptr;
    ibv_gid gid{}; // the IPv4-mapped GID (index 1)
    uint32_t qpn() const { return qp->qp_num; }
};

inline int to_init(ibv_qp *qp, unsigned access) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = access;
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

// The path half of an RTR transition: the peer's GID (index 1, RoCE v2),
// QPN and first PSN.
inline ibv_qp_attr rtr_path(const ibv_gid &dgid, uint32_t dqpn, uint32_t rq_psn, ibv_mtu mtu) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dqpn;
    a.rq_psn = rq_psn;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    return a;
}
inline constexpr int kRtrPathMask =
    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;

inline int to_rtr(ibv_qp *qp, const ibv_gid &dgid, uint32_t dqpn, uint32_t rq_psn, ibv_mtu mtu,
                  uint8_t max_dest_rd_atomic, uint8_t min_rnr_timer) {
    ibv_qp_attr a = rtr_path(dgid, dqpn, rq_psn, mtu);
    a.max_dest_rd_atomic = max_dest_rd_atomic;
    a.min_rnr_timer = min_rnr_timer;
    return ibv_modify_qp(qp, &a, kRtrPathMask | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

inline int to_rts(ibv_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt,
                  uint8_t rnr_retry, uint8_t max_rd_atomic) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = max_rd_atomic;
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

inline int to_state(ibv_qp *qp, ibv_qp_state s) {
    ibv_qp_attr a{};
    a.qp_state = s;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// Two connected RC QPs: A on the first device, B on the second.
class Pair {
  public:
    Side a, b;
    PairOpts o;

    Pair() = default;
    Pair(const Pair &) = delete;
    Pair &operator=(const Pair &) = delete;
    ~Pair() {
        destroy(a);
        destroy(b);
    }

    void setup(ibv_context *ca, ibv_context *cb, const PairOpts &opts) {
        o = opts;
        ASSERT_NO_FATAL_FAILURE(create(a, ca, false));
        ASSERT_NO_FATAL_FAILURE(create(b, cb, o.b_channel));
        if (!o.connect) return;
        ASSERT_EQ(to_init(a.qp, o.a_access), 0);
        ASSERT_EQ(to_init(b.qp, o.b_access), 0);
        ASSERT_EQ(to_rtr(a.qp, b.gid, b.qpn(), o.b_psn, o.mtu, o.rd_atomic, o.min_rnr_timer), 0);
        ASSERT_EQ(to_rtr(b.qp, a.gid, a.qpn(), o.a_psn, o.mtu, o.rd_atomic, o.min_rnr_timer), 0);
        ASSERT_EQ(to_rts(a.qp, o.a_psn, o.timeout, o.retry_cnt, o.rnr_retry, o.rd_atomic), 0);
        ASSERT_EQ(to_rts(b.qp, o.b_psn, o.timeout, o.retry_cnt, o.rnr_retry, o.rd_atomic), 0);
    }

    // Destroys B's QP early (the peer-gone tests).
    void destroy_b_qp() {
        if (b.qp) {
            ASSERT_EQ(ibv_destroy_qp(b.qp), 0);
        }
        b.qp = nullptr;
        b.qpx = nullptr;
    }

    // The peer's progress thread writes remote memory (WRITE, ATOMIC) and
    // reads it (READ) under its QP lock; the network that orders those
    // accesses with this thread's carries no happens-before edge a race
    // detector can see, so tests touching the peer's memory directly first
    // take and release that lock through ibv_query_qp.
    static void sync_with(const Side &s) {
        if (s.qp) qp_state(s.qp);
    }

  private:
    void create(Side &s, ibv_context *ctx, bool channel) {
        s.ctx = ctx;
        ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &s.gid), 0);
        s.pd = ibv_alloc_pd(ctx);
        ASSERT_NE(s.pd, nullptr);
        if (channel) {
            s.channel = ibv_create_comp_channel(ctx);
            ASSERT_NE(s.channel, nullptr);
        }
        if (o.cq_ex) {
            ibv_cq_init_attr_ex ca{};
            ca.cqe = uint32_t(o.cqe);
            ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                          IBV_WC_EX_WITH_SRC_QP | o.extra_wc_flags;
            s.scqx = ibv_create_cq_ex(ctx, &ca);
            ASSERT_NE(s.scqx, nullptr) << std::strerror(errno);
            ca.channel = s.channel;
            s.rcqx = ibv_create_cq_ex(ctx, &ca);
            ASSERT_NE(s.rcqx, nullptr) << std::strerror(errno);
            s.scq = ibv_cq_ex_to_cq(s.scqx);
            s.rcq = ibv_cq_ex_to_cq(s.rcqx);
        } else {
            s.scq = ibv_create_cq(ctx, o.cqe, nullptr, nullptr, 0);
            ASSERT_NE(s.scq, nullptr);
            s.rcq = ibv_create_cq(ctx, o.cqe, &s, s.channel, 0);
            ASSERT_NE(s.rcq, nullptr);
        }
        if (o.qp_ex) {
            ibv_qp_init_attr_ex ia{};
            ia.qp_type = IBV_QPT_RC;
            ia.send_cq = s.scq;
            ia.recv_cq = s.rcq;
            ia.sq_sig_all = o.sq_sig_all;
            ia.cap = {o.send_wr, o.recv_wr, o.send_sge, o.recv_sge, o.max_inline};
            ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            ia.pd = s.pd;
            ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                                IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_FLUSH |
                                IBV_QP_EX_WITH_ATOMIC_WRITE | o.extra_send_ops;
            s.qp = ibv_create_qp_ex(ctx, &ia);
            ASSERT_NE(s.qp, nullptr) << std::strerror(errno);
            s.qpx = ibv_qp_to_qp_ex(s.qp);
            ASSERT_NE(s.qpx, nullptr);
        } else {
            ibv_qp_init_attr ia{};
            ia.qp_type = IBV_QPT_RC;
            ia.send_cq = s.scq;
            ia.recv_cq = s.rcq;
            ia.sq_sig_all = o.sq_sig_all;
            ia.cap = {o.send_wr, o.recv_wr, o.send_sge, o.recv_sge, o.max_inline};
            s.qp = ibv_create_qp(s.pd, &ia);
            ASSERT_NE(s.qp, nullptr) << std::strerror(errno);
        }
    }

    static void destroy(Side &s) {
        if (s.qp) {
            EXPECT_EQ(ibv_destroy_qp(s.qp), 0);
        }
        if (s.scq) {
            EXPECT_EQ(ibv_destroy_cq(s.scq), 0);
        }
        if (s.rcq) {
            EXPECT_EQ(ibv_destroy_cq(s.rcq), 0);
        }
        if (s.channel) {
            EXPECT_EQ(ibv_destroy_comp_channel(s.channel), 0);
        }
        if (s.pd) {
            EXPECT_EQ(ibv_dealloc_pd(s.pd), 0);
        }
        s = Side{};
    }
};

// ---------------------------------------------------------------------------
// Posting

inline ibv_send_wr send_wr(uint64_t id, ibv_wr_opcode op, std::vector<ibv_sge> &sg,
                           unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.opcode = op;
    wr.sg_list = sg.empty() ? nullptr : sg.data();
    wr.num_sge = int(sg.size());
    wr.send_flags = flags;
    return wr;
}

inline int post(ibv_qp *qp, ibv_send_wr &wr) {
    ibv_send_wr *bad = nullptr;
    int rc = ibv_post_send(qp, &wr, &bad);
    if (rc) {
        EXPECT_EQ(bad, &wr);
    }
    return rc;
}

inline int post_send(ibv_qp *qp, uint64_t id, std::vector<ibv_sge> sg,
                     unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr = send_wr(id, IBV_WR_SEND, sg, flags);
    return post(qp, wr);
}

inline int post_send_imm(ibv_qp *qp, uint64_t id, std::vector<ibv_sge> sg, uint32_t imm,
                         unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr = send_wr(id, IBV_WR_SEND_WITH_IMM, sg, flags);
    wr.imm_data = htonl(imm);
    return post(qp, wr);
}

inline int post_rdma(ibv_qp *qp, uint64_t id, ibv_wr_opcode op, std::vector<ibv_sge> sg,
                     uint64_t raddr, uint32_t rkey, unsigned flags = IBV_SEND_SIGNALED,
                     uint32_t imm = 0) {
    ibv_send_wr wr = send_wr(id, op, sg, flags);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    wr.imm_data = htonl(imm);
    return post(qp, wr);
}

inline int post_atomic(ibv_qp *qp, uint64_t id, ibv_wr_opcode op, ibv_sge local, uint64_t raddr,
                       uint32_t rkey, uint64_t compare_add, uint64_t swap = 0,
                       unsigned flags = IBV_SEND_SIGNALED) {
    std::vector<ibv_sge> sg{local};
    ibv_send_wr wr = send_wr(id, op, sg, flags);
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = compare_add;
    wr.wr.atomic.swap = swap;
    return post(qp, wr);
}

inline ibv_recv_wr recv_wr(uint64_t id, std::vector<ibv_sge> &sg) {
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = sg.empty() ? nullptr : sg.data();
    wr.num_sge = int(sg.size());
    return wr;
}

inline int post_recv(ibv_qp *qp, uint64_t id, std::vector<ibv_sge> sg) {
    ibv_recv_wr wr = recv_wr(id, sg);
    ibv_recv_wr *bad = nullptr;
    int rc = ibv_post_recv(qp, &wr, &bad);
    if (rc) {
        EXPECT_EQ(bad, &wr);
    }
    return rc;
}

} // namespace rctest
