// SPDX-License-Identifier: MIT
//
// sroce engine objects.  Each verbs object embeds the rdma-core struct it is
// handed out as, first, so the static-inline data path of <infiniband/verbs.h>
// (ibv_post_send, ibv_poll_cq, ibv_wr_*) reaches sroce through the function
// pointers stored in it.
//
// Lock order, the one place it is written: a thread holding a lock takes
// only locks below it.  Each lock's field says what it guards.
//
//   g_nics_mu (nic.cpp)           a device's NIC made or released; never
//                                 taken by a NIC's own threads, which
//                                 releasing joins
//   Nic::bind_mu_                 the address's socket made once
//     Nic::qp_alloc_mu_           QP and SRQ numbers handed out
//   Nic::rx_mu_                   the receive path's buffers and state
//   Nic::objects_mu               no QP or MR freed while packets are
//                                 dispatched or timers fire
//   Qp::mu                        the QP: attributes, queues, each role's
//                                 state; a packet batch is built under it
//   Qp::tx_mu                     the QP's packets leave in the order they
//                                 were built: taken before Qp::mu is let
//                                 go (send_and_unlock), then alone
//     PeerSocket::mu              a connected socket's IP ID counter
//                                 (UdpPort; UdpPort::peers_mu_ above it)
//     MemPort's wire, then        the in-memory wire (port_mem.cpp)
//       MemPort::mu_
//   Srq::mu                       the shared receive queue
//   Cq::mu                        completions; never held while receiving
//                                 (poll_cq leaves it before app_progress)
//   leaves                        Mw::mu, MrTable::mu_, Context::async_mu,
//                                 MapsFile::mu (persist.cpp; only tried)
//
// Registries taken with no engine lock held, each above only leaves:
// g_ctx_mu (verbs.cpp, then Context::async_mu), g_pds_mu (import.cpp),
// g_xrcd_mu (srq.cpp).  ThreadSanitizer checks the order in the tsan build.
#pragma once

#include "config.hpp"
#include "congestion.hpp"
#include "persist.hpp"
#include "wire.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <string>
#include <thread>
#include <vector>

namespace sroce {

class Nic;

constexpr int kMaxDevices = 64;
constexpr uint32_t kMaxQps = 4096;
constexpr uint32_t kQpnBase = 0x11; // QPN 0 and 1 are the special QPs
constexpr uint32_t kMaxSrqs = 4096;
constexpr uint32_t kMaxTmTags = 64;  // tagged buffers per tag-matching SRQ
constexpr uint32_t kMaxRndvHdr = 64; // TMH + RVH, with room to spare
constexpr int kMaxMcGroups = 32;     // multicast groups per device and process
constexpr int kMaxMcAttach = 1024;   // QPs attached to one group
constexpr uint32_t kSrqnBase = 0x100;
constexpr uint32_t kMaxWr = 16384;
constexpr uint32_t kMaxSge = 32;
constexpr uint32_t kMaxInline = 1024;
constexpr uint32_t kMaxCqe = 1 << 20;
constexpr uint32_t kMaxRdAtomic = 128;
constexpr uint64_t kMaxMsgSize = 1ull << 31;
constexpr uint32_t kVendorId = 0xFFFFFF; // no OUI: same value Linux rxe reports
constexpr int kMaxGids = 16;             // populated GID entries, at most
// Entries the GID table reports, as Linux rxe: the rest are empty, so
// programs can probe for free indices (ibv_query_gid_ex says ENODATA).
constexpr int kGidTblLen = 1024;
// Completion timestamps and ibv_query_rt_values_ex count nanoseconds of
// CLOCK_MONOTONIC: a "core clock" of 1 GHz, given in kHz.
constexpr uint64_t kCoreClockKhz = 1000000;

// A port's GID table, as the kernel's GID cache keeps rxe's: entry 0 the
// link-local GID the MAC makes, then the net device's addresses (IPv4
// ones mapped, then IPv6 ones), all RoCE v2.  An address that goes leaves
// its entry empty, and one that comes takes the first empty entry, so the
// index of an address a program has chosen never changes under it.  Read
// by the verbs, changed by the progress threads (Nic::watch_gids).
class GidTable {
  public:
    // A device with one address: the MAC's link-local GID and that address.
    void set_fixed(const ibv_gid &deflt, const IpAddr &addr);
    // The table for `addrs` (in the kernel's order) after the one it holds,
    // keeping the entries of addresses still there; true if it changed.
    bool update(const ibv_gid &deflt, const std::vector<IpAddr> &addrs);
    // Entry `index`; false for an empty one.
    bool get(uint32_t index, ibv_gid *gid) const;
    // One past the last entry that is not empty.
    uint32_t size() const;
    // Counts the changes, so that each NIC posts IBV_EVENT_GID_CHANGE once.
    uint64_t generation() const { return gen_.load(std::memory_order_acquire); }

  private:
    mutable std::mutex mu_; // the entries (a leaf)
    ibv_gid gid_[kMaxGids] = {};
    bool used_[kMaxGids] = {};
    std::atomic<uint64_t> gen_{0};
};

// One configured link; lives for the whole process.
struct Device {
    ibv_device ibdev; // first: handed out as struct ibv_device *
    Link link;
    int index = 0;
    // Where the port sends from and receives; empty for a device that
    // follows its net device (a link without an address, as an rxe link
    // is): every address of the net device is then the port's, its GID
    // table lists them all, and a QP sends from its AV's sgid_index.
    IpAddr addr;
    bool follow = false;
    int ifindex = 0; // of link.netdev: the scope of link-local peers
    int ifmtu = 1500;
    ibv_mtu active_mtu = IBV_MTU_1024;
    uint8_t mac[6] = {};
    __be64 guid = 0;
    ibv_gid default_gid = {}; // the link-local GID the MAC makes
    GidTable gids;
    // On the in-memory wire (SROCE_PORT=memory, port_mem.hpp), not the
    // kernel's UDP: its port is always up, its MTU lo's.
    bool memory = false;
};

Device *to_dev(ibv_device *d);

// 0 when the device's port is up, else why not (link_down_reason()).
inline int port_down_reason(const Device &d) {
    return d.memory ? 0 : link_down_reason(d.link);
}

// The address of a peer or group the device can reach at `gid`: one of the
// port's own family (a RoCEv2 GID is an IP address; IPv4 ones mapped), or
// of either for a device that follows its net device.
inline bool gid_addr(const Device &d, const ibv_gid &gid, IpAddr *addr) {
    *addr = IpAddr::of_gid(gid.raw);
    return !addr->empty() && (d.follow || addr->is_v4() == d.addr.is_v4());
}

// The addresses a packet of `grh` (an AV's or an AH's) leaves from and goes
// to: its source the entry `sgid_index` names (a device with one address
// sends from it, whichever entry is named), its destination the GID, of
// the source's family — a route between the families does not exist, as
// rxe has it.  0 or EINVAL.
int path_addrs(const Device &d, const ibv_global_route &grh, IpAddr *src, IpAddr *dst);
int mtu_bytes(ibv_mtu m);

struct Qp;
struct Cq;
struct Mw;
struct Srq;

struct Context {
    verbs_context vctx; // first; vctx.context is what applications see
    Device *dev = nullptr;
    Nic *nic = nullptr;
    // The command FD's file: contexts imported from it (ibv_import_device)
    // share their objects with the one that made it.
    dev_t file_dev = 0;
    ino_t file_ino = 0;
    int async_rd = -1, async_wr = -1; // pipe: one byte per queued event, for poll(2)
    // Events live here rather than in the pipe so that destroying a QP or CQ
    // can withdraw the events that name it before the pointer dangles.
    std::mutex async_mu; // async_q (a leaf)
    std::deque<ibv_async_event> async_q;

    void post_event(const ibv_async_event &ev);
    // Drops queued events naming `obj` (a QP or CQ being destroyed).
    void forget_events(const void *obj);
};

inline Context *to_ctx(ibv_context *c) {
    return reinterpret_cast<Context *>(reinterpret_cast<uint8_t *>(c) -
                                       offsetof(verbs_context, context));
}

struct Pd {
    ibv_pd ibpd;
    // An imported PD (ibv_import_pd) is a handle of its own naming another
    // PD: protection checks compare roots.
    Pd *root = this;
    std::atomic<int> imports{0}; // a root's imported handles
};

inline Pd *pd_root(ibv_pd *p) {
    return p ? reinterpret_cast<Pd *>(p)->root : nullptr;
}
// The registry ibv_import_pd finds PDs in (import.cpp); false: no memory.
bool register_pd(Pd *pd);
void unregister_pd(Pd *pd);

struct Mr {
    ibv_mr ibmr;
    uint8_t *addr = nullptr; // host address of iova
    uint64_t iova = 0;
    size_t length = 0;
    unsigned access = 0;
    Pd *pd = nullptr;
    MemClass cls = MemClass::kVolatile; // how FLUSH makes this memory durable
    bool uncached = false;              // IBV_ACCESS_UNCACHED: non-temporal placement
    // The key lookups match: the MR's rkey, or a memory window's current
    // rkey (a bind changes its low 8 bits, the consumer key).
    std::atomic<uint32_t> key{0};
    std::atomic<int> windows{0}; // memory windows bound to this MR
    Mw *window = nullptr;        // set when this entry is a memory window's
    // An imported MR (ibv_import_mr) is a handle naming this MR; it is never
    // in the key table.
    Mr *imported_from = nullptr;
};

// A memory window: a key-table entry of its own that grants remote access
// to part of a parent MR while bound (IBTA 10.6.7).  Type 1 windows are bound
// with ibv_bind_mw() and stay usable by any QP of their PD; type 2 windows
// are bound by a BIND_MW work request, only for the QP that bound them, and
// invalidated by LOCAL_INV or a remote SEND WITH INVALIDATE.
struct Mw {
    ibv_mw ibmw; // first: handed out as struct ibv_mw *
    Mr entry;    // entry.pd: the window's PD; key: its rkey
    // The binding, changed by the requester and read by the responder:
    // guarded by `mu` (a leaf lock, taken under Qp::mu).
    std::mutex mu;
    bool bound = false;
    Mr *parent = nullptr;
    uint64_t va = 0, length = 0;
    unsigned access = 0;
    Qp *qp = nullptr; // type 2: the QP it was bound through
};

// An rkey/lkey is a table slot in bits 8..21, random bits above, and a
// consumer key in the low 8 bits (ibv_inc_rkey() changes only those), so
// keys are unguessable; lookups are lock-free reads of an atomic slot.
class MrTable {
  public:
    static constexpr uint32_t kSlots = 1 << 14;
    static uint32_t slot_of(uint32_t key) { return (key >> 8) & (kSlots - 1); }
    bool insert(Mr *mr); // assigns the key (and an MR's lkey/rkey)
    void erase(Mr *mr);
    Mr *lookup(uint32_t key) const {
        Mr *m = slots_[slot_of(key)].load(std::memory_order_acquire);
        return (m && m->key.load(std::memory_order_acquire) == key) ? m : nullptr;
    }
    template <class Fn>
    void for_each(Fn &&fn) {
        std::lock_guard<std::mutex> g(mu_);
        for (auto &s : slots_)
            if (Mr *m = s.load(std::memory_order_relaxed)) fn(m);
    }
    // Counts every change that can take memory away from a key: erase,
    // rereg, a window's bind, unbind or invalidation.  A message in
    // progress keeps the host addresses it checked at its first packet and
    // checks them again only when this moved (design.md §7.7), so
    // the common case costs one load per packet.
    uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
    void changed() { epoch_.fetch_add(1, std::memory_order_acq_rel); }

  private:
    std::atomic<Mr *> slots_[kSlots] = {};
    std::atomic<uint64_t> epoch_{0};
    std::mutex mu_; // insertions and removals in slots_ (a leaf)
};

// Checks that [va, va+len) lies in the MR and the MR grants `access`;
// returns the host address or nullptr.
uint8_t *mr_range(const Mr *mr, uint64_t va, uint64_t len, unsigned access);
// The MR (not memory window) `key` names, if it belongs to `pd`.
Mr *lookup_mr(Nic *nic, Pd *pd, uint32_t key);
// A remote access through `rkey` by `qp`, whose checks use `pd`: the host
// address of [va, va+len) if an MR of the PD, or a window bound for the QP,
// covers it and grants `access`; nullptr otherwise.  *mr becomes the MR
// that holds the memory.
uint8_t *remote_access(Qp *qp, Pd *pd, uint32_t rkey, uint64_t va, uint64_t len, unsigned access,
                       Mr **mr);
// The host address of a local SGE whose lkey names an MR of `pd` that covers
// it and grants `access`, or nullptr.
uint8_t *check_lkey(Nic *nic, Pd *pd, const ibv_sge &s, unsigned access);
// Whether SGEs already translated to host addresses (by check_lkey) still
// lie in the MRs their lkeys name now, with `access`: false once one was
// deregistered, moved by rereg_mr or lost the access.
bool sges_still_registered(Nic *nic, Pd *pd, const ibv_sge *host_sge, uint32_t n, unsigned access);

// Calls fn(host_pointer, n) for the bytes [off, off+len) of a scatter/gather
// list whose addresses are host addresses (checked when posted); stops at
// the list's end.  Returns the bytes visited.
template <class Fn>
uint32_t sg_walk(const ibv_sge *sge, uint32_t nsge, uint32_t off, uint32_t len, Fn &&fn) {
    uint32_t done = 0;
    for (uint32_t i = 0; i < nsge && done < len; i++) {
        const ibv_sge &s = sge[i];
        if (off >= s.length) {
            off -= s.length;
            continue;
        }
        uint32_t take = std::min(s.length - off, len - done);
        fn(reinterpret_cast<uint8_t *>(uintptr_t(s.addr)) + off, take);
        done += take;
        off = 0;
    }
    return done;
}

// Copies `len` bytes into a scatter/gather list at byte offset `off`; false
// when the list ends first.
inline bool sg_copy_to(const ibv_sge *sge, uint32_t nsge, uint32_t off, const uint8_t *src,
                       uint32_t len) {
    return sg_walk(sge, nsge, off, len, [&src](uint8_t *p, uint32_t n) {
               std::memcpy(p, src, n);
               src += n;
           }) == len;
}

// A completion channel holds the CQs it has events for, as uverbs holds
// them in the kernel, so that destroying a CQ takes its events back.  Its
// socket pair carries one byte while the queue is non-empty (the token a
// reader takes and puts back if events remain): the application polls
// ch.fd, and a non-blocking read never depends on flags it set there.
struct CompChannel {
    ibv_comp_channel ch; // first; ch.fd is the reading end
    int wr_fd = -1;      // the writing end
    std::mutex mu;       // the queue below and the CQs' event counts
    Cq *first = nullptr, *last = nullptr;
};

struct Cq {
    ibv_cq_ex cqx; // first; ibv_cq is its prefix
    std::mutex mu; // the ring, its cursors and the arming below
    std::vector<ibv_wc> ring;
    uint32_t head = 0, count = 0;
    bool overflow = false;
    bool armed = false, solicited_only = false;
    CompChannel *channel = nullptr;
    // Under channel->mu: events not yet taken by ibv_get_cq_event, and the
    // next CQ in the channel's queue.
    uint32_t events_queued = 0;
    Cq *next_event = nullptr;
    // ibv_cq_ex polling cursor
    ibv_wc cur{};
    Context *ctx = nullptr;
    // IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK): when each completion
    // in `ring` was pushed (same index), in ns of CLOCK_MONOTONIC and
    // CLOCK_REALTIME; empty unless the CQ asked for them.
    std::vector<uint64_t> ts, wallclock;
    uint64_t cur_ts = 0, cur_wallclock = 0;
    // IBV_WC_EX_WITH_TM_INFO: the tag and application context of each
    // tag-matching completion (same index); empty unless asked for.
    std::vector<ibv_wc_tm_info> tm;
    ibv_wc_tm_info cur_tm{};

    // Returns false on overflow.
    bool push(const ibv_wc &wc, bool solicited, const ibv_wc_tm_info *tm = nullptr);
    // Removes the completions of QP `qp_num` that are still queued (a QP
    // reset or destroyed), keeping the others in order.
    void forget_qp(uint32_t qp_num);
};

inline Cq *to_cq(ibv_cq *c) {
    return reinterpret_cast<Cq *>(c);
}

// Send queue entry: the work request as posted (checked and resolved),
// then what a commit or tag matching adds, then the transport's progress.
struct SendWqe {
    uint64_t wr_id = 0;
    ibv_wr_opcode opcode = IBV_WR_SEND;
    unsigned flags = 0;
    uint32_t num_sge = 0;
    ibv_sge *sge = nullptr; // points into SendQueue::sge
    uint64_t mr_epoch = 0;  // the key table's epoch when its SGEs were checked
    uint32_t length = 0;    // total payload
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    __be32 imm = 0; // or the rkey to invalidate (SEND WITH INVALIDATE), in network order
    uint64_t compare_add = 0, swap = 0;
    uint8_t atomic_data[8] = {}; // ATOMIC WRITE payload, as the application gave it
    uint8_t flush_type = 0;      // FLUSH placement type (IBV_FLUSH_GLOBAL/PERSISTENT)
    uint8_t flush_level = 0;     // FLUSH selectivity (IBV_FLUSH_RANGE/MR)
    uint32_t commit_flags = 0;   // enum ibv_write_commit_flags of a native commit
    bool signaled = false;
    // UD destination, resolved when posted
    IpAddr ud_addr, ud_src;
    IpFields ud_ip; // what its GRH puts in the IP header
    uint32_t ud_qpn = 0, ud_qkey = 0;
    uint32_t xrc_srqn = 0; // XRC: the remote SRQ the message is for
    // BIND_MW: the window, its new rkey and the binding; LOCAL_INV: the rkey
    // (in `rkey`).
    Mw *mw = nullptr;
    uint32_t mw_rkey = 0;
    ibv_mw_bind_info bind{};
    // The key of bind.mr when posted: the bind finds the MR by it, as the
    // MR may be deregistered before the bind is carried out.
    uint32_t bind_key = 0;
    ibv_wc_status status = IBV_WC_SUCCESS; // a local error found when posting
    // A write-commit sent as an IBTA sequence is several WQEs: the inner ones
    // complete silently, the final one reports the commit.
    struct CommitPart {
        uint8_t part = 0;        // kCommitNone / kCommitInner / kCommitFinal
        bool suppressed = false; // an earlier part of its commit already reported
        uint32_t report_len = 0; // byte_len a commit's completion reports
    } commit;
    // Tag matching: a rendezvous's READ or the FIN that follows it, carried
    // out for the responder and never reported to the application.
    struct TmWork {
        uint8_t internal = 0; // kTmNone / kTmRead / kTmFin
        Srq *srq = nullptr;
        uint64_t wr_id = 0, tag = 0;
        uint32_t priv = 0;
        uint8_t fin[16] = {}; // the FIN's payload (a TMH)
    } tm;
    // Where the transport is with it (the requester's and completer's).
    struct Progress {
        bool started = false;
        uint32_t first_psn = 0;
        uint32_t npkts = 0;             // PSNs this WQE consumes
        uint32_t sent_pkts = 0;         // packets (re)transmitted so far in the current pass
        uint32_t read_next = 0;         // READ: index of the next response packet expected
        uint8_t flush_tx = 0;           // FLUSH: transmissions so far (saturating)
        uint8_t flush_forms = 0;        // FLUSH: kFlushIcrc* bits of the forms sent
        bool flush_last_legacy = false; // FLUSH: the latest transmission's form
        bool done = false;              // acknowledged
    } tx;
};

constexpr uint8_t kCommitNone = 0, kCommitInner = 1, kCommitFinal = 2;
// A peer's FLUSH ICRC form: unknown, IBTA's (confirmed: never send the other
// to it), or Linux rxe's legacy one (learned, still re-checked on retries).
constexpr uint8_t kFlushIcrcUnknown = 0, kFlushIcrcIbta = 1, kFlushIcrcLegacy = 2;
constexpr uint8_t kTmNone = 0, kTmRead = 1, kTmFin = 2;
// Work-request opcode of a native write-commit, never handed to rdma-core.
// It must lie inside the range of enum ibv_wr_opcode's values (0..15 in
// rdma-core 44): converting anything else to the enum is undefined in C++.
// 12 and 13 are unassigned (11 is DRIVER1, 14 FLUSH, 15 ATOMIC_WRITE).
constexpr ibv_wr_opcode kWrWriteCommit = ibv_wr_opcode(13);
static_assert(kWrWriteCommit != IBV_WR_DRIVER1 && kWrWriteCommit != IBV_WR_FLUSH &&
              kWrWriteCommit != IBV_WR_ATOMIC_WRITE);
// SendWqe::commit_flags bit (beside enum ibv_write_commit_flags): with immediate.
constexpr uint32_t kCommitImmFlag = 1u << 31;

// Bytes written but not yet made durable, per rkey, so a commit persists what
// it must (earlier writes to its rkey) and no more.
// Kept in the MR's own address space, not as host addresses: a commit
// after rereg_mr persists what the MR maps now.
struct DirtyRange {
    uint32_t rkey;   // the key the writes came through (an MR's or a window's)
    uint32_t mr_key; // the MR that holds the memory
    uint64_t lo, hi; // [lo, hi) in that MR's iova space
};

struct RecvWqe {
    uint64_t wr_id = 0;
    uint32_t num_sge = 0;
    // As posted.  The lkeys are checked when a message takes the WQE, as an
    // RNIC does: an MR may be re-registered in between.
    ibv_sge *sge = nullptr;
    uint32_t length = 0;
};

// Responder resource for replaying READ / ATOMIC duplicates.
struct RdResource {
    bool valid = false;
    bool atomic = false;   // replay the saved original value
    bool ack_only = false; // FLUSH / ATOMIC WRITE: replay the empty READ response
    uint32_t first_psn = 0, last_psn = 0;
    uint64_t va = 0;
    uint32_t rkey = 0, length = 0;
    uint64_t orig = 0;
};

// A ring of receive WQEs: a QP's own receive queue or a shared one.
struct RecvQueue {
    std::vector<RecvWqe> wqe;
    std::vector<ibv_sge> sge;
    uint32_t max_wr = 0, max_sge = 0;
    uint32_t head = 0, tail = 0; // posted / consumed counts
    bool empty() const { return head == tail; }
    uint32_t size() const { return head - tail; }
    RecvWqe &front() { return wqe[tail % max_wr]; }
    void init(uint32_t wr, uint32_t sges);
    // Appends a posted chain; ENOMEM when full, EINVAL for too many SGEs.
    int post(ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
};

struct Xrcd {
    ibv_xrcd ibxrcd;          // first: handed out as struct ibv_xrcd *
    std::atomic<int> refs{0}; // XRC SRQs and target QPs using it
};

struct Srq {
    ibv_srq ibsrq; // first: handed out as struct ibv_srq *
    std::mutex mu; // the queue, limit, error and tags: under Qp::mu, above Cq::mu
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    RecvQueue rq;
    uint32_t limit = 0; // armed limit: an event when fewer WQEs remain
    bool error = false;
    std::atomic<int> users{0}; // QPs attached
    // Tag matching (IBV_SRQT_TM): the tagged buffers ibv_post_srq_ops
    // added, by handle, and how many messages found none.
    struct Tag {
        bool valid = false;
        uint64_t tag = 0, mask = 0, wr_id = 0;
        ibv_sge sge{}; // host address, checked when added
    };
    std::vector<Tag> tags;
    // XRC SRQ
    ibv_srq_type type = IBV_SRQT_BASIC;
    Cq *cq = nullptr; // an XRC SRQ's completions go here
    Xrcd *xrcd = nullptr;
    uint32_t srq_num = 0;
};

inline Srq *to_srq(ibv_srq *s) {
    return reinterpret_cast<Srq *>(s);
}

inline IpFields ip_fields(const ibv_global_route &g) {
    return {g.flow_label & 0xFFFFF, g.traffic_class, g.hop_limit};
}

struct Ah {
    ibv_ah ibah; // first
    ibv_ah_attr attr{};
    IpAddr addr; // destination
    IpAddr src;  // source (path_addrs)
};

struct TxBatch;

// ibv_wr_* batch in progress on a QP (ibv_wr_start .. ibv_wr_complete).
// Per QP, as rdma-core defines it: a thread may have batches open on several
// QPs at once.
struct WrBatch {
    uint32_t pending = 0;
    int error = 0;
    uint32_t sge_slot = 0;            // the WQE ibv_wr_set_sge* fills
    uint32_t final_slot = UINT32_MAX; // the WQE reporting the current commit
};

// Attributes set by ibv_modify_qp.
struct QpAttr {
    ibv_qp_state state = IBV_QPS_RESET;
    unsigned access = 0;
    ibv_mtu path_mtu = IBV_MTU_1024;
    uint32_t mtu = 1024;
    uint32_t dest_qpn = 0;
    IpAddr dest_addr;
    IpAddr src_addr; // the AV's sgid_index's (path_addrs)
    ibv_ah_attr ah{};
    uint8_t timeout = 0, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 0;
    uint8_t max_rd_atomic = 1, max_dest_rd_atomic = 1;
    uint16_t pkey_index = 0;
    uint8_t port_num = 1;
    uint32_t qkey = 0;
    bool sq_draining = false;
};

// Request packets in flight beyond the oldest unacknowledged PSN; also how
// far past a gap a selective-repeat responder holds requests.
constexpr uint32_t kSendWindow = 1024;
// How long an ACK may wait for the request that answers what it
// acknowledges (Nic::deferred_acks_), and the gap after an ACK within which
// a request counts as such an answer (Qp::ack_hold_pays).
constexpr uint64_t kAckHoldNs = 20000;

// A selectively resent PSN and the highest PSN sent when it left: once the
// responder reports a packet beyond that mark, the resend was lost too.
struct ResendMark {
    uint32_t psn = UINT32_MAX;
    uint32_t mark = 0;
};

// The send queue: its WQEs as posted, and the two ends of the ring, apart
// from the requester's and the completer's state, as rxe keeps its rxe_sq
// apart from qp->req and qp->comp.  Posting appends at head; the completer
// retires from tail.
struct SendQueue {
    std::vector<SendWqe> wqe;
    std::vector<ibv_sge> sge;
    std::vector<uint8_t> inline_buf;
    uint32_t max_wr = 0, max_sge = 0, max_inline = 0;
    uint32_t cap_wr = 0; // what the application asked for (max_wr may be larger)
    bool sig_all = false;
    uint64_t ops_flags = 0; // ibv_qp_ex send_ops_flags
    uint32_t head = 0;      // next free slot (posted count)
    uint32_t tail = 0;      // oldest not completed
    // READ and ATOMIC WQEs sent and not retired: the requester takes one of
    // max_rd_atomic credits when it sends one, the completer gives it back.
    uint32_t rd_outstanding = 0;
    WrBatch batch; // the ibv_wr_* batch being posted
    SendWqe &at(uint32_t i) { return wqe[i % max_wr]; }
};

// Requester: transmission of the send queue's WQEs and the PSNs it hands
// out (req.cpp).
struct Requester {
    uint32_t cur = 0;      // next WQE to transmit
    uint32_t next_psn = 0; // next PSN to assign to a new WQE
    uint32_t pkts_since_ackreq = 0;
    // Tag matching: a rendezvous's READ has completed and its FIN waits for
    // a send queue slot (the READ's own is freed only after it completes).
    bool tm_fin_pending = false;
    uint8_t tm_fin[16] = {};
    // Selective repeat: the highest PSN sent, and per PSN of the window the
    // last selective resend (allocated at the first one).
    uint32_t max_sent_psn = 0;
    std::unique_ptr<ResendMark[]> resent;
};

// Completer: acknowledgements and retries (comp.cpp).
struct Completer {
    uint32_t una_psn = 0; // oldest unacknowledged PSN
    uint32_t last_nak_rewind = UINT32_MAX;
    // The round trip, for selective repeat's recovery timer (as TCP's RTO,
    // RFC 6298): one request at a time is timed from its first sending to
    // the acknowledgement that covers it, also when it was resent.  That
    // is never less than the round trip of the copy answered, only more:
    // safe for a timer meant not to resend too soon, and the only way to
    // measure a round trip above the timer's period (Karn's rule, which
    // drops such samples, would measure none).
    uint32_t rtt_psn = 0;
    uint64_t rtt_sent_ns = 0;            // 0: nothing timed
    uint64_t srtt_ns = 0, rttvar_ns = 0; // srtt_ns 0: no sample yet
};

// The requester's timers, which the requester arms when it sends and the
// completer stops when acknowledgements come (as rxe's qp->retrans_timer
// and qp->rnr_nak_timer, apart from either role's state).  0 = off.
struct QpTimers {
    uint64_t retransmit_at_ns = 0; // the oldest unacknowledged PSN is resent
    uint64_t rnr_at_ns = 0;        // an RNR NAK's back-off ends
    // Selective repeat: resends the oldest unacknowledged packet when the
    // responder has gone quiet about it (its SACKs or the resend were lost).
    uint64_t recovery_at_ns = 0;
    // What the timers and NAKs may still spend: timeouts and sequence NAKs
    // take from retries_left, RNR NAKs from rnr_left; an acknowledgement
    // that moves una refills both.
    uint32_t retries_left = 7, rnr_left = 7;
    uint32_t sr_backoff = 0; // selective repeat: doublings since the oldest PSN last advanced
    // Congestion control: the rate limiter holds the requester back until
    // then (congestion.hpp).
    uint64_t pace_at_ns = 0;
};

// Selective repeat at the responder: requests received past a gap, held
// (not dropped) until the gap is filled and then executed in PSN order.
struct HeldSlot {
    uint32_t psn = 0;
    uint16_t len = 0; // 0: empty
    bool legacy_icrc = false;
};
struct Reorder {
    std::unique_ptr<uint8_t[]> mem; // kSendWindow slots of slot_size bytes, at the first gap
    std::unique_ptr<HeldSlot[]> slots;
    uint32_t slot_size = 0;
    uint32_t held = 0;
    bool sack_due = false; // something arrived past the gap since the last SACK
    HeldSlot &slot(uint32_t psn) { return slots[psn % kSendWindow]; }
    uint8_t *data(uint32_t psn) { return mem.get() + size_t(psn % kSendWindow) * slot_size; }
};

// Responder: the receive side of the transport (resp.cpp).
struct Responder {
    RecvQueue rq; // unused when the QP has an SRQ
    uint32_t epsn = 0;
    uint32_t msn = 0;
    bool nak_sent = false;
    bool ack_pending = false;
    // The pending ACK tells the requester a gap was filled: never held back
    // (Nic::send_acks).
    bool ack_urgent = false;
    uint32_t ack_psn = 0;
    // The message in progress
    uint8_t in_msg = 0;        // 0, kOpSend or kOpWrite: multi-packet message in progress
    bool drop_msg = false;     // UC: the rest of a message that lost a packet is dropped
    uint32_t msg_offset = 0;   // bytes placed in the current message
    bool recv_taken = false;   // `recv` holds the receive WQE the current message consumes
    RecvWqe recv;              // a copy, so SRQ slots are free for reuse at once
    ibv_sge recv_sge[kMaxSge]; // its SGEs with host addresses, checked when taken
    Srq *recv_srq = nullptr;   // where `recv` came from (nullptr: the QP's own queue)
    bool recv_bad = false;     // an SGE of `recv` failed its lkey check
    uint64_t recv_epoch = 0;   // the key table's epoch when recv_sge was checked
    // Tag matching on a TM SRQ: what the message in progress is.
    uint8_t tm_mode = 0; // kTmMsg* (resp.cpp)
    uint32_t skip = 0;   // leading message bytes not placed (a matched EAGER's TMH)
    uint64_t tm_tag = 0, tm_wr_id = 0;
    uint32_t tm_priv = 0;
    uint64_t rvh_va = 0; // a matched rendezvous's source
    uint32_t rvh_rkey = 0, rvh_len = 0;
    // The WRITE in progress: where its next byte goes, as checked at the
    // FIRST packet (epoch `write_epoch` of the key table); when the table
    // changed since, the next packet checks its range again through
    // write_rkey at write_va, so no byte lands after a deregistration.
    uint8_t *write_ptr = nullptr;
    uint64_t write_va = 0;    // in the rkey's space
    uint64_t write_mr_va = 0; // the same byte in the MR's iova space
    uint64_t write_epoch = 0;
    uint64_t write_remaining = 0;
    uint32_t write_rkey = 0;
    uint32_t write_mr_key = 0;   // the MR behind write_rkey
    unsigned write_access = 0;   // what the message needs of it
    bool write_tracked = false;  // its MR keeps dirty ranges (not volatile)
    bool write_uncached = false; // its MR asked for non-temporal placement
    std::vector<RdResource> rd_res;
    uint32_t rd_res_next = 0;
    Reorder reorder;
};

// Write-commit state of a QP (both roles).
struct CommitState {
    uint8_t ceth = 0;    // CETH flags of the native commit being received
    bool in_msg = false; // the multi-packet write in progress is a commit
    std::vector<DirtyRange> dirty;
    // The peer declared native write-commit support (ibv_qp_set_commit_peer,
    // or ibv_set_ece with options that include it).
    bool peer_native = false;
    // ECE options agreed with the peer (ibv_set_ece); until then
    // ibv_query_ece offers this QP's own.
    bool ece_set = false;
    uint32_t ece_options = 0;
};

// rdma-core 44 and 45 append wr_atomic_write and wr_flush to ibv_qp_ex;
// built against older headers, a Qp has them right after its ibv_qp_ex, where
// programs built against newer ones look for them (struct ibv_qp_ex_flush).
struct QpExTail {
#if !PMOF_VERBS_HAVE_ATOMIC_WRITE
    void (*wr_atomic_write)(ibv_qp_ex *, uint32_t, uint64_t, const void *) = nullptr;
#endif
#if !PMOF_VERBS_HAVE_UPSTREAM_FLUSH
    void (*wr_flush)(ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t) = nullptr;
#endif
};

struct Qp {
    ibv_qp_ex qpx;                     // first; qpx.qp_base is the ibv_qp
    [[no_unique_address]] QpExTail ex; // right after qpx (empty with rdma-core >= 45)

    // Everything of the QP below but what says otherwise: attributes, the
    // queues, the requester's, completer's and responder's state.
    std::mutex mu;
    // Orders this QP's transmissions.  Packets are built under `mu`, which
    // is handed over to tx_mu for the send itself (see send_and_unlock), so
    // that a long sendmmsg() never holds up the receive path's use of `mu`
    // while packets still leave in the order they were built.
    std::mutex tx_mu;
    Context *ctx = nullptr;
    Nic *nic = nullptr;
    Cq *scq = nullptr, *rcq = nullptr;
    Srq *srq = nullptr;
    Pd *pd = nullptr; // the root of the QP's PD (none for an XRC receive QP)
    ibv_qp_type type = IBV_QPT_RC;
    Xrcd *xrcd = nullptr; // XRC target QPs

    QpAttr attr;
    SendQueue sq;
    Requester req;
    Completer comp;
    QpTimers timers;
    Responder resp;
    CommitState commit;
    QpCc cc;
    // Which ICRC form of FLUSH the peer takes (wire-protocol.md §4.4): learned
    // from the FLUSHes it sends (recv.cpp) and answers (comp.cpp), used by
    // the requester.
    uint8_t peer_flush_icrc = kFlushIcrcUnknown;
    // On the receive path's list of coalesced ACKs to send after this batch
    // (Nic::acks_): the dispatcher's, under Qp::mu; the responder only says
    // that an ACK is pending (Responder::ack_pending).
    bool ack_listed = false;
    // The coalesced ACK waits on Nic::deferred_acks_ for this QP's next
    // request to carry it (the dispatcher's, under Qp::mu; sent by
    // send_packet, or when due); and whether the QP has an entry there.
    bool ack_deferred = false;
    bool ack_deferred_listed = false;
    // Whether holding pays: the application has answered within
    // kAckHoldNs of an ACK (a ping-pong), and no held ACK has had to
    // go on its own since.  When the ACK last left (0: never).  Under Qp::mu.
    bool ack_hold_pays = false;
    uint64_t ack_sent_ns = 0;
    // Both peers resend selectively (IBV_COMMIT_CAP_SELECTIVE_REPEAT, agreed
    // in ECE, declared with ibv_qp_set_commit_peer or announced by both in
    // their packets): RC only.
    bool selective_repeat = false;
    // Agreed in ECE or declared; unlike an announcement it survives a reset.
    bool selective_repeat_declared = false;
    // What this end announces in its packets' BTH (wire::bth::announce;
    // RC QPs only) and what the peer's packets announced: learned by the
    // dispatcher, forgotten when the QP is reset, as the peer may change.
    uint8_t announce = 0;
    uint8_t peer_announced = 0;

    ibv_qp_state state() const { return attr.state; }
    bool in_error() const { return attr.state == IBV_QPS_ERR; }
    bool connected() const { return type == IBV_QPT_RC || type == IBV_QPT_UC || is_xrc(); }
    bool reliable() const { return type == IBV_QPT_RC || is_xrc(); }
    bool peer_native() const {
        return commit.peer_native || (peer_announced & wire::bth::kAnnounceNative);
    }
    // Declared, or announced by both ends.
    void agree_selective_repeat() {
        selective_repeat = selective_repeat_declared ||
                           (announce & peer_announced & wire::bth::kAnnounceSelectiveRepeat);
    }
    bool is_xrc() const { return type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV; }
};

// Requests answered by a response packet (READ RESPONSE, ATOMIC ACKNOWLEDGE)
// rather than an ACK: they take read/atomic credits and responder resources.
inline bool wr_needs_response(ibv_wr_opcode op) {
    return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
           op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_FLUSH || op == IBV_WR_ATOMIC_WRITE;
}
// Requests whose response carries no data (an empty READ RESPONSE ONLY).
inline bool wr_ack_only(ibv_wr_opcode op) {
    return op == IBV_WR_FLUSH || op == IBV_WR_ATOMIC_WRITE;
}

// The QP's entry points lie where rdma-core 45's ibv_qp_ex has them, whichever
// header this is built against: Qp (above) adds what the header lacks.
#if PMOF_VERBS_HAVE_UPSTREAM_FLUSH
static_assert(offsetof(ibv_qp_ex, wr_flush) ==
                      offsetof(ibv_qp_ex, wr_atomic_write) + sizeof(void *) &&
                  sizeof(ibv_qp_ex) == offsetof(ibv_qp_ex, wr_flush) + sizeof(void *),
              "ibv_qp_ex must end with wr_atomic_write, wr_flush as in rdma-core >= 45");
#elif PMOF_VERBS_HAVE_ATOMIC_WRITE
static_assert(sizeof(ibv_qp_ex) == offsetof(ibv_qp_ex, wr_atomic_write) + sizeof(void *),
              "wr_atomic_write must be the last member of rdma-core 44's ibv_qp_ex");
#else
static_assert(sizeof(ibv_qp_ex) == offsetof(ibv_qp_ex, wr_abort) + sizeof(void *),
              "wr_abort must be the last member of rdma-core < 44's ibv_qp_ex");
#endif

inline Qp *to_qp(ibv_qp *q) {
    return reinterpret_cast<Qp *>(q);
}
inline Qp *to_qp(ibv_qp_ex *q) {
    return reinterpret_cast<Qp *>(q);
}

uint64_t now_ns();
// Tests: now_ns() returns `ns` from now on, until set to 0 again; timers
// then fire only when the test moves the clock.
void set_fake_clock(uint64_t ns);

// Entry points called from C end in `catch (const std::bad_alloc &)`: an
// allocation failure (the one exception the engine's own code lets through)
// must come out as ENOMEM, never as std::terminate() in a C program.
template <class T>
T out_of_memory(T value) noexcept {
    errno = ENOMEM;
    return value;
}

} // namespace sroce
