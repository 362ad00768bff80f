// SPDX-License-Identifier: MIT
//
// libFuzzer target for the receive path: each input is one datagram that
// goes through wire::parse() and icrc_verify(), then into a live QP's
// responder or completer: RC, UC, UD, RC on a shared receive queue, or an
// XRC target QP, with memory regions and memory windows (types 1 and 2).
//
// The first two input bytes steer the harness (see Control and Target), so
// the fuzzer does not have to rediscover what a random packet can never
// contain: the QPN of the QP, the PSN it expects, a valid rkey, the Q_Key,
// the XRC SRQ number, a correct ICRC.  The rest is the UDP payload, sent
// from the connected peer's address to the device address and processed by
// the engine's own progress thread; the harness waits until that thread has
// finished with it, so a crash is charged to the right input.
//
// Oracle, besides the sanitizers: every packet sroce sends back must parse
// and carry a valid ICRC.
#include "icrc.hpp"
#include "nic.hpp"
#include "provider.h"
#include "sroce.hpp"
#include "transport.hpp"
#include "wire.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sched.h>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace sroce;

// Private to the fuzz target, so it can run alongside the unit tests.
constexpr const char *kDevName = "sroce_fuzz";
constexpr const char *kDevAddr = "127.0.5.1";
constexpr const char *kPeerAddr = "127.0.5.2";
constexpr uint32_t kPeerQpn = 0x000777;
constexpr size_t kBufLen = 64 << 10;
constexpr size_t kMaxDatagram = 4200;
constexpr uint32_t kQueueDepth = 64;

enum Control : uint8_t {
    kKeepIcrc = 1 << 0,    // send the ICRC as given rather than the correct one
    kOwnQp = 1 << 1,       // our QPN, and our rkey / a VA inside our MR in RETH and AtomicETH
    kExpectedPsn = 1 << 2, // the PSN the responder expects, or the completer waits for
    kResetQp = 1 << 3,     // start from a freshly connected QP
    kPostSend = 1 << 4,    // post a request first; bits 5-6 choose its kind
    kPostRecv = 1 << 7,
};

// Second byte: which QP the packet is for, and what RETH / AtomicETH / IETH
// name when aimed.
enum Target : uint8_t {
    kTargetMask = 7,     // 0 RC, 1 UC, 2 UD, 3 RC on an SRQ, 4 XRC target, 5 RC with
                         // selective repeat agreed; others RC
    kAimWindow = 1 << 3, // a memory window's rkey instead of the MR's
    // Sent as a run (wire-protocol.md §1.1): 2 + bits 5-6 copies, PSN + i
    // and IP ID i, as one UDP_SEGMENT send that reaches sroce coalesced.
    kRun = 1 << 4,
    kRunShortLast = 1 << 7, // the run's last copy 4 bytes shorter
};
enum Kind { kRc, kUc, kUd, kRcSrq, kXrc, kKinds };
constexpr uint8_t kTargetRcSelective = 5;
constexpr uint32_t kQkey = 0x1234567;

struct Harness {
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq *cq = nullptr;
    ibv_qp *qps[kKinds] = {};
    ibv_qp *qp = nullptr; // the QP of the current input
    Kind kind = kRc;
    ibv_srq *srq = nullptr, *xsrq = nullptr;
    ibv_xrcd *xrcd = nullptr;
    ibv_ah *peer_ah = nullptr;
    ibv_mw *mw1 = nullptr, *mw2 = nullptr;
    ibv_mr *mr = nullptr;
    uint8_t *buf = nullptr;
    // What our own WRITEs and SENDs carry: memory no input can write, as the
    // verbs contract asks of a source until its WR completes (an input that
    // changed it mid-send would be a bad ICRC of the harness's making).
    ibv_mr *src_mr = nullptr;
    uint8_t src[4096] = {};
    Nic *nic = nullptr;
    int peer = -1;
    in_addr_t dev_addr = 0, peer_addr = 0;
    sockaddr_in dev_sa{};
};

Harness h;

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_rx: %s: %s\n", what, strerror(errno));
    exit(1);
}

in_addr_t ip4(const char *s) {
    in_addr a{};
    inet_pton(AF_INET, s, &a);
    return a.s_addr;
}

void modify(ibv_qp_attr &a, int mask) {
    if (int rc = sroce_modify_qp(h.qp, &a, mask)) {
        errno = rc;
        die("modify_qp");
    }
}

void to_init(ibv_qp_attr &a) {
    a = {};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    modify(a, mask | (h.kind == kUd ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS));
}

// Brings the current QP from any state to RTS, connected to the peer.
void connect_qp() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    modify(a, IBV_QP_STATE);
    to_init(a);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    int mask = IBV_QP_STATE;
    if (h.kind != kUd) {
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = kPeerQpn;
        a.rq_psn = 0xFFFFF0; // close to the wrap
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xFF;
        std::memcpy(a.ah_attr.grh.dgid.raw + 12, &h.peer_addr, 4);
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    }
    if (h.kind == kRc || h.kind == kRcSrq || h.kind == kXrc) {
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    modify(a, mask);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x000100;
    a.timeout = 0; // no retransmission timer: the fuzzer's packets drive everything
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (h.kind == kRc || h.kind == kRcSrq)
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    if (h.kind == kXrc) mask |= IBV_QP_TIMEOUT;
    modify(a, mask);
}

void setup() {
    char tmpl[] = "/tmp/sroce-fuzz-XXXXXX";
    if (!mkdtemp(tmpl)) die("mkdtemp");
    std::string conf = std::string(tmpl) + "/links.conf";
    std::ofstream(conf) << kDevName << " netdev lo addr " << kDevAddr << "\n";
    setenv("SROCE_CONFIG", conf.c_str(), 1);
    unsetenv("SROCE_FAULT");
    unsetenv("SROCE_BUSY_POLL");
    // One process, no agent: the fuzzer owns the address and every packet.
    setenv("SROCE_AGENT", "off", 1);

    h.dev_addr = ip4(kDevAddr);
    h.peer_addr = ip4(kPeerAddr);
    h.peer = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(wire::kRoceV2Port);
    sa.sin_addr.s_addr = h.peer_addr;
    if (h.peer < 0 || bind(h.peer, reinterpret_cast<sockaddr *>(&sa), sizeof sa) < 0)
        die("bind 127.0.5.2:4791");
    h.dev_sa = sa;
    h.dev_sa.sin_addr.s_addr = h.dev_addr;

    ibv_device **list = nullptr;
    int n = sroce_device_list(&list);
    ibv_device *dev = nullptr;
    for (int i = 0; i < n; i++)
        if (std::strcmp(list[i]->name, kDevName) == 0) dev = list[i];
    if (!dev) die("no sroce_fuzz device");
    h.ctx = sroce_open_device(dev);
    if (!h.ctx) die("open_device");
    std::filesystem::remove_all(tmpl);
    fcntl(h.ctx->async_fd, F_SETFL, fcntl(h.ctx->async_fd, F_GETFL) | O_NONBLOCK);
    h.nic = to_ctx(h.ctx)->nic;
    h.pd = sroce_alloc_pd(h.ctx);
    h.buf = static_cast<uint8_t *>(aligned_alloc(4096, kBufLen));
    if (!h.pd || !h.buf) die("alloc");
    std::memset(h.buf, 0x5A, kBufLen);
    h.mr = sroce_reg_mr(h.pd, h.buf, kBufLen, uint64_t(uintptr_t(h.buf)),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                            IBV_ACCESS_REMOTE_ATOMIC);
    std::memset(h.src, 0xC3, sizeof h.src);
    h.src_mr = sroce_reg_mr(h.pd, h.src, sizeof h.src, uint64_t(uintptr_t(h.src)), 0);
    h.cq = sroce_create_cq(h.ctx, 4096, nullptr, nullptr, 0);
    if (!h.mr || !h.src_mr || !h.cq) die("reg_mr / create_cq");
    ibv_srq_init_attr srq_attr{};
    srq_attr.attr = {kQueueDepth, 2, 0};
    h.srq = sroce_create_srq(h.pd, &srq_attr);
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;
    xa.oflags = O_CREAT;
    h.xrcd = ibv_open_xrcd(h.ctx, &xa);
    if (!h.srq || !h.xrcd) die("create_srq / open_xrcd");
    ibv_srq_init_attr_ex xs{};
    xs.attr = {kQueueDepth, 2, 0};
    xs.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                   IBV_SRQ_INIT_ATTR_CQ;
    xs.srq_type = IBV_SRQT_XRC;
    xs.pd = h.pd;
    xs.xrcd = h.xrcd;
    xs.cq = h.cq;
    h.xsrq = ibv_create_srq_ex(h.ctx, &xs);
    if (!h.xsrq) die("create XRC SRQ");
    const ibv_qp_type types[kKinds] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RC,
                                       IBV_QPT_XRC_RECV};
    for (int k = 0; k < kKinds; k++) {
        ibv_qp_init_attr_ex ia{};
        ia.send_cq = h.cq;
        ia.recv_cq = h.cq;
        ia.qp_type = types[k];
        ia.cap = {kQueueDepth, kQueueDepth, 2, 2, 0};
        ia.srq = k == kRcSrq ? h.srq : nullptr;
        ia.comp_mask = k == kXrc ? IBV_QP_INIT_ATTR_XRCD : IBV_QP_INIT_ATTR_PD;
        ia.pd = h.pd;
        ia.xrcd = h.xrcd;
        // Straight to the engine: ibv_create_qp_ex() would hand a QP with a
        // PD alone to libibverbs' ibv_create_qp, which is not the engine's here.
        h.qps[k] = verbs_get_ctx(h.ctx)->create_qp_ex(h.ctx, &ia);
        if (!h.qps[k]) die("create_qp");
        h.qp = h.qps[k];
        h.kind = Kind(k);
        connect_qp();
    }
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.sgid_index = 1;
    ah.grh.dgid.raw[10] = ah.grh.dgid.raw[11] = 0xFF;
    std::memcpy(ah.grh.dgid.raw + 12, &h.peer_addr, 4);
    h.peer_ah = sroce_create_ah(h.pd, &ah);
    h.mw1 = ibv_alloc_mw(h.pd, IBV_MW_TYPE_1);
    h.mw2 = ibv_alloc_mw(h.pd, IBV_MW_TYPE_2);
    if (!h.peer_ah || !h.mw1 || !h.mw2) die("create_ah / alloc_mw");
    h.qp = h.qps[kRc];
    h.kind = kRc;
}

// The windows cover the first half of the MR.  A type 2 window is bound to
// the RC QP and may be invalidated by a fuzzed SEND WITH INVALIDATE: bound
// again when needed.
void bind_windows() {
    ibv_mw_bind_info info{h.mr, uint64_t(uintptr_t(h.buf)), kBufLen / 2,
                          IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC};
    ibv_qp *rc = h.qps[kRc];
    if (!window_parent(reinterpret_cast<Mw *>(h.mw1))) {
        ibv_mw_bind b{0, 0, info};
        (void)ibv_bind_mw(rc, h.mw1, &b);
    }
    if (!window_parent(reinterpret_cast<Mw *>(h.mw2))) {
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_BIND_MW;
        wr.bind_mw.mw = h.mw2;
        wr.bind_mw.rkey = ibv_inc_rkey(h.mw2->rkey);
        wr.bind_mw.bind_info = info;
        ibv_send_wr *bad = nullptr;
        (void)ibv_post_send(rc, &wr, &bad);
    }
}

// Sends the datagram(s) to the device - `seg` > 0: one segmentation-offload
// send of `count` packets of that size - and returns once the progress
// thread has dispatched them.
void inject(const uint8_t *p, size_t n, uint16_t seg = 0, unsigned count = 1) {
    uint64_t before = h.nic->stats.rx_pkts.load();
    iovec iov{const_cast<uint8_t *>(p), n};
    msghdr m{};
    m.msg_name = &h.dev_sa;
    m.msg_namelen = sizeof h.dev_sa;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) uint8_t ctl[CMSG_SPACE(sizeof seg)] = {};
    if (seg) {
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof seg);
        std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
    }
    if (sendmsg(h.peer, &m, 0) != ssize_t(n)) die("sendmsg");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (h.nic->stats.rx_pkts.load() < before + count) {
        if (std::chrono::steady_clock::now() > deadline) {
            fprintf(stderr, "fuzz_rx: datagram not received within 5 s\n");
            abort();
        }
        sched_yield();
    }
    // The progress thread counts a datagram while holding objects_mu and
    // keeps it until the batch, ACKs included, has been processed.
    std::lock_guard<std::mutex> g(h.nic->objects_mu);
}

// Everything sroce sends must be a well-formed packet with a valid ICRC.
void check_replies() {
    static uint8_t b[65536];
    for (;;) {
        sockaddr_in from{};
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(h.peer, b, sizeof b, 0, reinterpret_cast<sockaddr *>(&from), &fl);
        if (n < 0) return;
        wire::Packet pkt;
        wire::ParseError e = wire::parse(b, size_t(n), pkt);
        if (e != wire::ParseError::kOk) {
            fprintf(stderr, "fuzz_rx: sroce sent a malformed packet: %s\n",
                    wire::parse_error_str(e));
            abort();
        }
        Ipv4Header ip{from.sin_addr.s_addr, h.peer_addr, ntohs(from.sin_port), wire::kRoceV2Port};
        // The ID is the next of the connected socket's counter (or, from
        // port 4791, the packet's place in its send): solved for here.
        if (!icrc_verify(ip, b, size_t(n))) {
            // What it was, for a failure that the saved input alone (the
            // state before it matters) may not reproduce.
            fprintf(stderr,
                    "fuzz_rx: sroce sent a packet with a bad ICRC: %s, PSN %#x, %zd bytes, "
                    "payload %u\n",
                    pkt.info->name, pkt.psn, n, pkt.payload_len);
            abort();
        }
        if (pkt.qpn != kPeerQpn) {
            fprintf(stderr, "fuzz_rx: sroce sent to QPN %#x\n", pkt.qpn);
            abort();
        }
    }
}

void drain_completions() {
    ibv_wc wc[32];
    while (ibv_poll_cq(h.cq, 32, wc) > 0) {
    }
    ibv_async_event ev;
    while (sroce_get_async_event(h.ctx, &ev) == 0)
        sroce_ack_async_event(&ev);
}

void post_send(uint8_t kind) {
    if (h.kind == kXrc) return; // a receive-only QP
    Qp *qp = to_qp(h.qp);
    {
        std::lock_guard<std::mutex> g(qp->mu);
        if (qp->req.head - qp->req.tail >= kQueueDepth) return;
    }
    const ibv_sge from_src{uint64_t(uintptr_t(h.src)), 0, h.src_mr->lkey};
    ibv_sge sge = from_src;
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    uint64_t remote = 0x10000;
    switch (kind & 3) {
    case 0:
        wr.opcode = IBV_WR_RDMA_WRITE;
        sge.length = 2500; // three packets at MTU 1024
        break;
    case 1:
        wr.opcode = IBV_WR_RDMA_READ;
        sge = {uint64_t(uintptr_t(h.buf + 8192)), 0, h.mr->lkey};
        sge.length = 2500;
        break;
    case 2:
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        sge = {uint64_t(uintptr_t(h.buf + 16384)), 0, h.mr->lkey};
        sge.length = 8;
        wr.wr.atomic.remote_addr = remote;
        wr.wr.atomic.rkey = 1;
        wr.wr.atomic.compare_add = 1;
        break;
    default:
        wr.opcode = IBV_WR_SEND;
        sge.length = 100;
        break;
    }
    if (wr.opcode == IBV_WR_RDMA_WRITE || wr.opcode == IBV_WR_RDMA_READ) {
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = 1;
    }
    // What the transport carries: UC has no READ or atomics, UD sends only.
    if (h.kind == kUc && wr.opcode != IBV_WR_RDMA_WRITE) {
        wr.opcode = IBV_WR_SEND;
        sge = from_src;
        sge.length = 100;
    }
    if (h.kind == kUd) {
        wr.opcode = IBV_WR_SEND;
        sge = from_src;
        sge.length = 100;
        wr.wr.ud.ah = h.peer_ah;
        wr.wr.ud.remote_qpn = kPeerQpn;
        wr.wr.ud.remote_qkey = kQkey;
    }
    ibv_send_wr *bad = nullptr;
    (void)ibv_post_send(h.qp, &wr, &bad);
}

void post_recv() {
    ibv_sge sge{uint64_t(uintptr_t(h.buf + 32768)), 3000, h.mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    if (h.kind == kRcSrq || h.kind == kXrc) {
        Srq *srq = to_srq(h.kind == kXrc ? h.xsrq : h.srq);
        {
            std::lock_guard<std::mutex> g(srq->mu);
            if (srq->rq.size() >= kQueueDepth) return;
        }
        (void)ibv_post_srq_recv(&srq->ibsrq, &wr, &bad);
        return;
    }
    Qp *qp = to_qp(h.qp);
    {
        std::lock_guard<std::mutex> g(qp->mu);
        if (qp->resp.rq.head - qp->resp.rq.tail >= kQueueDepth) return;
    }
    (void)ibv_post_recv(h.qp, &wr, &bad);
}

// Points RETH / AtomicETH at our MR or a window, keeping the fuzzed offset
// and length; names the window in an IETH, our Q_Key in a DETH and our XRC
// SRQ in an XRCETH.
void aim(uint8_t *p, size_t n, bool window) {
    const wire::OpInfo &o = wire::op_info(p[0]);
    if (!o.name) return;
    ibv_mw *mw = h.kind == kRc ? h.mw2 : h.mw1;
    uint32_t rkey = window ? mw->rkey : h.mr->rkey;
    size_t span = window ? kBufLen / 2 : kBufLen;
    uint8_t off = o.reth ? o.reth : o.atomic_eth;
    if (off && size_t(off) + 12 <= n) {
        uint64_t va = wire::get64(p + off);
        wire::put64(p + off, uint64_t(uintptr_t(h.buf)) + (va & (span - 1)));
        wire::put32(p + off + 8, rkey);
    }
    if (o.ieth && size_t(o.ieth) + 4 <= n) wire::put32(p + o.ieth, mw->rkey);
    if (o.deth && size_t(o.deth) + 4 <= n) wire::put32(p + o.deth, kQkey);
    if (o.xrceth && size_t(o.xrceth) + 4 <= n) wire::put32(p + o.xrceth, to_srq(h.xsrq)->srq_num);
}

void teardown() {
    // Joins the progress thread before static destructors run under it.
    ibv_dealloc_mw(h.mw1);
    ibv_dealloc_mw(h.mw2);
    sroce_destroy_ah(h.peer_ah);
    for (ibv_qp *qp : h.qps)
        sroce_destroy_qp(qp);
    sroce_destroy_srq(h.srq);
    sroce_destroy_srq(h.xsrq);
    ibv_close_xrcd(h.xrcd);
    sroce_destroy_cq(h.cq);
    sroce_dereg_mr(h.mr);
    sroce_dereg_mr(h.src_mr);
    sroce_dealloc_pd(h.pd);
    sroce_close_device(h.ctx);
    free(h.buf);
    close(h.peer);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    setup();
    atexit(teardown);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > kMaxDatagram + 2) return 0;
    uint8_t ctl = data[0], target = data[1];
    h.kind = Kind((target & kTargetMask) < kKinds ? target & kTargetMask : kRc);
    h.qp = h.qps[h.kind];
    std::vector<uint8_t> pkt(data + 2, data + size);
    uint8_t *p = pkt.data();
    size_t n = pkt.size();

    // The codec alone, on the raw bytes.
    {
        wire::Packet parsed;
        (void)wire::parse(p, n, parsed);
        Ipv4Header ip{h.peer_addr, h.dev_addr, wire::kRoceV2Port, wire::kRoceV2Port};
        uint16_t id;
        (void)icrc_verify(ip, p, n, &id);
        // Linux rxe's FLUSH form, with the IP ID solved as for rxe's ports.
        ip.sport = uint16_t(0xC000 | target);
        (void)icrc_verify_flush_legacy(ip, p, n);
    }

    Qp *qp = to_qp(h.qp);
    bool reset = ctl & kResetQp;
    {
        std::lock_guard<std::mutex> g(qp->mu);
        reset =
            reset || qp->attr.state != IBV_QPS_RTS || qp->req.head - qp->req.tail >= kQueueDepth;
    }
    if (reset) connect_qp();
    {
        // Held requests and SELECTIVE ACKNOWLEDGEs (wire-protocol.md §5.6.1).
        std::lock_guard<std::mutex> g(qp->mu);
        qp->selective_repeat = (target & kTargetMask) == kTargetRcSelective;
    }
    if (target & kAimWindow) bind_windows();
    if (ctl & kPostRecv) post_recv();
    if (ctl & kPostSend) post_send(uint8_t(ctl >> 5));
    check_replies();

    if (n >= wire::kBthLen) {
        if (ctl & kOwnQp) {
            wire::put24(p + 5, h.qp->qp_num);
            aim(p, n, target & kAimWindow);
        }
        if (ctl & kExpectedPsn) {
            std::lock_guard<std::mutex> g(qp->mu);
            bool response = wire::op_info(p[0]).flags & wire::kOpResp;
            wire::put24(p + 9, response ? qp->comp.una_psn : qp->resp.epsn);
        }
        if (!(ctl & kKeepIcrc) && n >= wire::kBthLen + wire::kIcrcLen) {
            Ipv4Header ip{h.peer_addr, h.dev_addr, wire::kRoceV2Port, wire::kRoceV2Port};
            icrc_store(p + n - wire::kIcrcLen, icrc_compute(ip, p, n));
        }
    }
    if ((target & kRun) && n >= wire::kBthLen + wire::kIcrcLen + 4) {
        unsigned count = 2 + ((target >> 5) & 3);
        std::vector<uint8_t> run;
        for (unsigned i = 0; i < count; i++) {
            size_t len = (i + 1 == count && (target & kRunShortLast)) ? n - 4 : n;
            size_t at = run.size();
            run.insert(run.end(), p, p + len);
            uint8_t *q = run.data() + at;
            wire::put24(q + 9, (wire::get24(p + 9) + i) & wire::kPsnMask);
            if (!(ctl & kKeepIcrc)) {
                Ipv4Header ip{h.peer_addr, h.dev_addr, wire::kRoceV2Port, wire::kRoceV2Port,
                              uint16_t(i)};
                icrc_store(q + len - wire::kIcrcLen, icrc_compute(ip, q, len));
            }
        }
        inject(run.data(), run.size(), uint16_t(n), count);
    } else {
        inject(p, n);
    }
    check_replies();
    drain_completions();
    return 0;
}
