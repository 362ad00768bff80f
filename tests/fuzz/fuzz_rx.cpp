// SPDX-License-Identifier: MIT
//
// libFuzzer target for the receive path: datagrams go through wire::parse()
// and icrc_verify(), then into a live QP's responder or completer: RC, UC,
// UD, RC on a shared receive queue, or an XRC target QP, with memory regions
// and memory windows (types 1 and 2) - and, between the datagrams, what an
// application does to that memory while a peer is writing into it.
//
// An input is a sequence of records (at most kMaxRecords, of which at most
// kMaxRemaps deregister or move memory), each starting with a kind byte
// whose low nibble says what it is (Record) and whose high nibble is the
// record's argument:
//   - a packet: three steering bytes (Control, Target, Aim), a big-endian
//     16-bit length, and that many bytes of UDP payload (fewer if the input
//     ends first).  The steering bytes spare the fuzzer what a random packet
//     can never contain: the QPN of the QP, the PSN it expects, a valid
//     rkey (of the volatile MR, the MR in the persistence domain, or a
//     window), the Q_Key, the XRC SRQ number, a correct ICRC; they also post
//     a request or a receive first, among them write-commit (native opcodes
//     or the IBTA sequence), FLUSH and ATOMIC WRITE, and may carry one of
//     the actions below out first;
//   - a packet for QP1 (the GSI QP, where CM MADs go): length and bytes as
//     above, with destination QPN 1 and the GSI Q_Key filled in;
//   - ibv_dereg_mr of an MR, then a fresh registration on other memory;
//   - ibv_rereg_mr changing an MR's access, or its translation (onto other
//     memory, in the persistence domain or not);
//   - memory windows bound, invalidated (LOCAL_INV, or a type 1 bind of
//     length 0), or deallocated and allocated again;
//   - a QP moved to the error or send-queue-drained state.
// Each packet goes from the connected peer's address to the device's over
// the in-memory wire (port_mem.hpp), and the device, which has no progress
// thread, handles it in the harness's own thread (Nic::poll_once) before the
// next record: no socket, no waiting, and a crash is charged to the right
// record.
//
// The memory: three MR slots, each on one buffer of a pool (Buf).  Slot 0
// is anonymous memory (volatile; FLUSH_GLOBAL), slot 1 a shared mapping of
// a file on storage (the persistence domain: FLUSH_GLOBAL and
// FLUSH_PERSISTENT; SROCE_FUZZ_PMEM_DIR, default /var/tmp, must not be
// tmpfs), slot 2 anonymous memory the windows are bound over.  The RC QP
// and the XRC target QP grant FLUSH access, the others do not, so both the
// FLUSH and commit paths and their refusals are reached.  Every input
// starts from the same registrations (each slot's MR with its home access,
// on memory of its class).
//
// Oracles, besides the sanitizers:
//   - every packet sroce sends back must parse, carry a valid ICRC and go to
//     the peer's QPN; a packet for QP1 is dropped, never delivered;
//   - once ibv_dereg_mr(), or an ibv_rereg_mr() that moves the translation,
//     returns, the old memory is poisoned for AddressSanitizer and
//     inaccessible (its protection key, or PROT_NONE) until a registration
//     takes it again, so any later byte read or written through a stale
//     pointer stops the run;
//     memory whose MR lost all access is poisoned, memory whose MR lost
//     every write access is read-only, and the windows' memory is poisoned
//     while no window is bound or about to be;
//   - every range sroce makes durable (its persist hook) lies inside memory
//     a registered MR maps now: a commit never flushes the memory an MR had
//     before it was deregistered or moved.
// With FUZZ_RX_TRACE set, each record and each packet sroce sends is told
// on stderr (to replay a crash: FUZZ_RX_TRACE=1 fuzz_rx CRASH_FILE); what
// the whole run reached is printed at exit.
#include "icrc.hpp"
#include "nic.hpp"
#include "port_mem.hpp"
#include "provider.h"
#include "sroce.hpp"
#include "transport.hpp"
#include "wire.hpp"

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <linux/magic.h>
#include <mutex>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sanitizer/asan_interface.h>
#include <sched.h>
#include <signal.h>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace sroce;

// Private to the fuzz target, so it can run alongside the unit tests.
constexpr const char *kDevName = "sroce_fuzz";
constexpr const char *kDevAddr = "127.0.5.1";
constexpr const char *kPeerAddr = "127.0.5.2";
constexpr const char *kDevAddr6 = "fd00:5::1";
constexpr const char *kPeerAddr6 = "fd00:5::2";
constexpr uint32_t kPeerQpn = 0x000777;
constexpr size_t kBufLen = 64 << 10;
constexpr size_t kMaxDatagram = 4200;
constexpr size_t kMaxInput = 16 << 10;
constexpr unsigned kMaxRecords = 16;
// Registrations (ibv_reg_mr, a rereg moving the translation) classify the
// memory by reading /proc/self/maps, about 2 ms here: bounded per input.
constexpr unsigned kMaxRemaps = 4;
constexpr uint32_t kQueueDepth = 64;

// Low nibble of a record's first byte; other values are skipped.
enum Record : uint8_t {
    kRecPacket,      // Control, Target, Aim, length (2), datagram; arg bit 0:
                     // payload filled up to the path MTU (fill_to_mtu)
    kRecQp1,         // length (2), datagram; arg bit 0: QPN and Q_Key as given,
                     // bit 1: ICRC as given
    kRecDereg,       // arg: slot (mod 3)
    kRecReregAccess, // arg bit 0: slot 0 or 1; bits 1-3: kAccessVariants
    kRecReregMove,   // arg bit 0: slot 0 or 1; bit 1: onto memory of the other
                     // class; bit 2: change the access too (home, minus
                     // FLUSH_PERSISTENT on volatile memory); bit 3: slot 2,
                     // with the windows bound as they are
    kRecWindows,     // arg bits 0-1: WindowAction
    kRecQpState,     // arg bits 0-2: Kind; bit 3: SQD rather than ERR
    kRecNone = 0xF,
};

enum Control : uint8_t {
    kKeepIcrc = 1 << 0,    // send the ICRC as given rather than the correct one
    kOwnQp = 1 << 1,       // our QPN, and our rkey / a VA inside our memory in RETH and AtomicETH
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
    kAimWindow = 1 << 3, // a memory window's rkey instead of an MR's
    // Sent as a run (wire-protocol.md §1.1): 2 + bits 5-6 copies, PSN + i
    // and IP ID i, as one UDP_SEGMENT send that reaches sroce coalesced.
    kRun = 1 << 4,
    kRunShortLast = 1 << 7, // the run's last copy 4 bytes shorter
};

// Third byte: which memory, and the flavour of the verbs sroce adds.
enum Aim : uint8_t {
    kAimPersistent = 1 << 0, // the MR in the persistence domain rather than the volatile one
    kPostNewVerb = 1 << 1,   // on the RC QP kPostSend's kinds are write-commit, FLUSH,
                             // ATOMIC WRITE and write-commit with immediate data
    kNativeCommit = 1 << 2,  // the RC QP's peer takes the native commit opcodes
    kCommitOrdered = 1 << 3, // IBV_WRITE_COMMIT_ORDERED; a FLUSH of the whole MR
    kCommitGlobal = 1 << 4,  // IBV_WRITE_COMMIT_GLOBAL; a FLUSH for global visibility
    // Bits 5-7: an action record carried out before the packet (kPreActions),
    // so that one changed byte puts a deregistration between two packets.
    kPreActionShift = 5,
};

enum Kind { kRc, kUc, kUd, kRcSrq, kXrc, kKinds };
// The control QP is set up as an RC QP without FLUSH access.
constexpr Kind kCtlKind = kRcSrq;
constexpr uint8_t kTargetRcSelective = 5;
constexpr uint32_t kQkey = 0x1234567;

enum WindowAction : uint8_t {
    kWindowsInvalidate,        // type 1 bound with length 0, type 2 LOCAL_INV (the control QP)
    kWindowsBind,              // bind those that are not bound
    kWindowsRealloc,           // ibv_dealloc_mw and ibv_alloc_mw
    kWindowsInvalidateInOrder, // type 2 LOCAL_INV on the RC QP, behind its requests
};

enum SlotId { kSlotVolatile, kSlotFile, kSlotWindows, kSlots };

// What Aim bits 5-7 do before the packet: {record kind, argument}.
constexpr uint8_t kPreActions[8][2] = {
    {kRecNone, 0},
    {kRecDereg, kSlotVolatile},
    {kRecDereg, kSlotFile},
    {kRecReregAccess, kSlotVolatile},      // all access revoked
    {kRecReregAccess, kSlotFile | 1 << 1}, // read-only
    {kRecReregMove, kSlotVolatile},
    {kRecReregMove, kSlotFile},
    {kRecWindows, kWindowsInvalidate},
};

constexpr unsigned kRemoteAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr unsigned kFlushAll = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;
constexpr unsigned kHomeAccess[kSlots] = {
    kRemoteAll | IBV_ACCESS_FLUSH_GLOBAL,
    kRemoteAll | kFlushAll,
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND,
};

// What kRecReregAccess sets (kHome: the slot's home access).
constexpr unsigned kHome = ~0u;
constexpr unsigned kAccessVariants[8] = {
    0,                      // nothing: poisoned
    IBV_ACCESS_REMOTE_READ, // read-only
    kRemoteAll,             // no FLUSH access
    kHome,                  // (| IBV_ACCESS_UNCACHED, below)
    kHome,                  // home
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_FLUSH_GLOBAL,
    IBV_ACCESS_REMOTE_READ | kFlushAll, // read-only, flushable
    IBV_ACCESS_REMOTE_WRITE,            // refused: no local write
};

// A buffer an MR may map.  What it may be used for right now: ASan poison
// reports instrumented reads and writes with their stack, the page
// protection catches the others (libpmem's non-temporal copies).  The
// protection is a memory protection key of the buffer's own where the CPU
// has them: the engine runs in the harness's thread, so the thread's key
// rights (one WRPKRU) protect the buffer as mprotect() would, without a
// system call and a TLB shootdown at every change.
enum class Prot : uint8_t {
    kLive,     // registered with some write access
    kReadOnly, // registered, readable only (PROT_READ, PKEY_DISABLE_WRITE)
    kNoAccess, // registered, nothing may touch it (poisoned, PROT_NONE)
    kFree,     // no MR maps it (poisoned, PROT_NONE)
};

struct Buf {
    uint8_t *p = nullptr;
    bool file = false; // in the persistence domain
    int owner = -1;    // the slot whose MR maps it
    uint64_t freed = 0;
    Prot prot = Prot::kLive;
    int pkey = -1; // its protection key, or -1: mprotect()
};
// Every slot may be on memory of either class and still find a free buffer.
constexpr size_t kVolatileBufs = kSlots + 1, kFileBufs = kSlots + 1;

struct MrSlot {
    ibv_mr *mr = nullptr;
    int buf = -1;
    unsigned access = 0; // as last set, optional bits included
};

struct Extent {
    uintptr_t lo = 0, hi = 0;
};

struct Harness {
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq *cq = nullptr;
    ibv_qp *qps[kKinds] = {};
    bool held[kKinds] = {}; // left in the state a record put it in
    ibv_qp *qp = nullptr;   // the QP of the current packet
    Kind kind = kRc;
    // Carries out local work requests (window binds and invalidations) at
    // once: it never sends, so nothing queues ahead of them.
    ibv_qp *ctl_qp = nullptr;
    ibv_srq *srq = nullptr, *xsrq = nullptr;
    ibv_xrcd *xrcd = nullptr;
    ibv_ah *peer_ah = nullptr;
    ibv_mw *mw1 = nullptr, *mw2 = nullptr;
    Buf bufs[kVolatileBufs + kFileBufs];
    MrSlot slots[kSlots];
    uint64_t clock = 0;
    unsigned remaps = 0; // deregistrations and moves in this input
    // The file behind the persistence domain's buffers.
    std::string pmem_dir, pmem_file;
    int pmem_fd = -1;
    uint8_t *pmem = nullptr;
    // What registered MRs map, for the persist hook on the progress thread.
    std::mutex extents_mu;
    Extent extents[kSlots];
    // What our own WRITEs and SENDs carry: memory no input can write, as the
    // verbs contract asks of a source until its WR completes (an input that
    // changed it mid-send would be a bad ICRC of the harness's making).
    ibv_mr *src_mr = nullptr;
    uint8_t src[4096] = {};
    Nic *nic = nullptr;
    // The device's and the peer's addresses: IPv4, or IPv6 under
    // FUZZ_RX_IPV6 (the same inputs then exercise the IPv6 header's ICRC,
    // GRH and addressing).
    IpAddr dev_addr, peer_addr;
    bool trace = false; // FUZZ_RX_TRACE: one line per record on stderr
    // What the run reached, printed at exit.
    struct {
        uint64_t packets = 0, qp1 = 0, deregs = 0, dereg_busy = 0, access = 0, access_refused = 0,
                 moves = 0, moves_refused = 0, windows = 0, qp_states = 0;
        std::atomic<uint64_t> persisted{0}, persisted_bytes{0}, fences{0};
    } stats;
};

Harness h;

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_rx: %s: %s\n", what, strerror(errno));
    exit(1);
}

void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void trace(const char *fmt, ...) {
    if (!h.trace) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz_rx: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

// ---------------------------------------------------------------------------
// Memory

void set_prot(Buf &b, Prot want) {
    if (b.prot == want) return;
    if (b.prot == Prot::kNoAccess || b.prot == Prot::kFree)
        ASAN_UNPOISON_MEMORY_REGION(b.p, kBufLen);
    if (b.pkey >= 0) {
        unsigned rights = want == Prot::kLive       ? 0
                          : want == Prot::kReadOnly ? PKEY_DISABLE_WRITE
                                                    : PKEY_DISABLE_ACCESS;
        if (pkey_set(b.pkey, rights) != 0) die("pkey_set");
    } else {
        int prot = want == Prot::kLive       ? PROT_READ | PROT_WRITE
                   : want == Prot::kReadOnly ? PROT_READ
                                             : PROT_NONE;
        if (mprotect(b.p, kBufLen, prot) != 0) die("mprotect");
    }
    if (want == Prot::kNoAccess || want == Prot::kFree) ASAN_POISON_MEMORY_REGION(b.p, kBufLen);
    b.prot = want;
}

Buf &slot_buf(int s) {
    return h.bufs[h.slots[s].buf];
}

uint8_t *slot_mem(int s) {
    return slot_buf(s).p;
}

// The persist hook (persist.hpp): called on the progress thread for every
// range sroce makes durable.
void on_persist(void *, const void *addr, size_t len) {
    if (!addr || !len) { // a fence
        h.stats.fences++;
        return;
    }
    h.stats.persisted++;
    h.stats.persisted_bytes += len;
    auto lo = uintptr_t(addr);
    std::lock_guard<std::mutex> g(h.extents_mu);
    for (const Extent &e : h.extents)
        if (lo >= e.lo && lo < e.hi && len <= e.hi - lo) return;
    fprintf(stderr,
            "fuzz_rx: sroce made [%p, +%zu) durable, which no registered MR maps (memory of an "
            "MR deregistered or moved by ibv_rereg_mr)\n",
            addr, len);
    abort();
}

void publish_extents() {
    std::lock_guard<std::mutex> g(h.extents_mu);
    for (int s = 0; s < kSlots; s++) {
        const MrSlot &m = h.slots[s];
        h.extents[s] =
            m.mr ? Extent{uintptr_t(slot_mem(s)), uintptr_t(slot_mem(s)) + kBufLen} : Extent{};
    }
}

// The free buffer of the class that has been free longest.
int free_buf(bool file) {
    int best = -1;
    for (int i = 0; i < int(std::size(h.bufs)); i++) {
        const Buf &b = h.bufs[i];
        if (b.owner < 0 && b.file == file && (best < 0 || b.freed < h.bufs[best].freed)) best = i;
    }
    if (best < 0) {
        errno = ENOSPC;
        die("no free buffer");
    }
    return best;
}

void release_buf(int i) {
    Buf &b = h.bufs[i];
    b.owner = -1;
    b.freed = ++h.clock;
    set_prot(b, Prot::kFree);
}

// Whether a bind of a window is queued on `qp` and may yet take effect.
bool bind_pending(ibv_qp *ibqp) {
    Qp *qp = to_qp(ibqp);
    std::lock_guard<std::mutex> g(qp->mu);
    SendQueue &sq = qp->sq;
    for (uint32_t i = sq.tail; i != sq.head; i++)
        if (sq.at(i).opcode == IBV_WR_BIND_MW && !sq.at(i).tx.done) return true;
    return false;
}

// Whether the windows' memory can be reached through a window now or later
// without the harness binding one.
bool windows_live() {
    if (!h.mw1 || !h.mw2) return false; // still being set up
    return window_parent(reinterpret_cast<Mw *>(h.mw1)) ||
           window_parent(reinterpret_cast<Mw *>(h.mw2)) || bind_pending(h.ctl_qp) ||
           bind_pending(h.qps[kRc]);
}

// What the slot's memory may be used for, from its MR's access (and for
// the windows' memory, from the windows).
Prot wanted_prot(int s) {
    if (s == kSlotWindows) return windows_live() ? Prot::kLive : Prot::kNoAccess;
    unsigned a = h.slots[s].access;
    if (a & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
        return Prot::kLive;
    return (a & IBV_ACCESS_REMOTE_READ) ? Prot::kReadOnly : Prot::kNoAccess;
}

void apply_prot(int s) {
    set_prot(slot_buf(s), wanted_prot(s));
}

// Registers slot `s` on buffer `b` with its home access.
void reg_slot(int s, int b) {
    Buf &buf = h.bufs[b];
    set_prot(buf, Prot::kLive);
    MrSlot &m = h.slots[s];
    m.mr = sroce_reg_mr(h.pd, buf.p, kBufLen, uint64_t(uintptr_t(buf.p)), kHomeAccess[s]);
    if (!m.mr)
        die(s == kSlotFile ? "registering file-backed memory with FLUSH_PERSISTENT access"
                           : "reg_mr");
    buf.owner = s;
    m.buf = b;
    m.access = kHomeAccess[s];
    publish_extents();
    apply_prot(s);
}

// ibv_dereg_mr, then a fresh MR for the slot on another buffer.
void dereg_slot(int s) {
    MrSlot &m = h.slots[s];
    h.stats.deregs++;
    if (int err = sroce_dereg_mr(m.mr)) {
        h.stats.dereg_busy++;
        trace("dereg slot %d: %s", s, strerror(err)); // windows still bound (EBUSY)
        return;
    }
    m.mr = nullptr;
    int old = m.buf;
    publish_extents();
    release_buf(old);
    reg_slot(s, free_buf(s == kSlotFile)); // memory of the class its home access needs
    trace("dereg slot %d: buffer %d poisoned, now on buffer %d, rkey %#x", s, old, m.buf,
          m.mr->rkey);
}

// ibv_rereg_mr with IBV_REREG_MR_CHANGE_ACCESS.
bool rereg_access(int s, unsigned access) {
    MrSlot &m = h.slots[s];
    // Live before the call: the memory must be usable as soon as it returns.
    set_prot(slot_buf(s), Prot::kLive);
    int rc = sroce_rereg_mr(m.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, int(access));
    if (rc == 0) m.access = access;
    apply_prot(s);
    return rc == 0;
}

// ibv_rereg_mr with IBV_REREG_MR_CHANGE_TRANSLATION onto another buffer.
bool rereg_move(int s, bool file, bool change_access, unsigned access) {
    MrSlot &m = h.slots[s];
    int to = free_buf(file);
    set_prot(h.bufs[to], Prot::kLive);
    int flags = IBV_REREG_MR_CHANGE_TRANSLATION | (change_access ? IBV_REREG_MR_CHANGE_ACCESS : 0);
    int rc = sroce_rereg_mr(m.mr, flags, nullptr, h.bufs[to].p, kBufLen,
                            change_access ? int(access) : 0);
    if (rc != 0) {
        set_prot(h.bufs[to], Prot::kFree);
        return false;
    }
    int old = m.buf;
    h.bufs[to].owner = s;
    m.buf = to;
    if (change_access) m.access = access;
    publish_extents();
    release_buf(old);
    apply_prot(s);
    return true;
}

bool windows_astray();
void invalidate_windows();

// Every input starts with each slot's MR on memory of its class, with its
// home access, and no window bound over memory the windows' MR has left.
void restore_slots() {
    for (int s = 0; s < kSlots; s++) {
        MrSlot &m = h.slots[s];
        bool file = s == kSlotFile;
        if (slot_buf(s).file != file) {
            if (!rereg_move(s, file, true, kHomeAccess[s])) die("moving an MR back");
        } else if (m.access != kHomeAccess[s]) {
            if (!rereg_access(s, kHomeAccess[s])) die("restoring an MR's access");
        }
    }
    if (windows_astray()) invalidate_windows();
    apply_prot(kSlotWindows);
}

// A file on storage for the persistence domain (persist.cpp): a shared
// mapping of a regular file, which must keep its name while MRs map it.
// Directories left by runs that died (a crash found) are removed.
void make_pmem() {
    const char *base = getenv("SROCE_FUZZ_PMEM_DIR");
    if (!base || !*base) base = "/var/tmp";
    constexpr std::string_view kPrefix = "sroce-fuzz-rx.";
    if (DIR *d = opendir(base)) {
        while (dirent *e = readdir(d)) {
            std::string_view name = e->d_name;
            if (!name.starts_with(kPrefix)) continue;
            int pid = atoi(std::string(name.substr(kPrefix.size())).c_str());
            if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
                std::error_code ec;
                std::filesystem::remove_all(std::string(base) + "/" + std::string(name), ec);
            }
        }
        closedir(d);
    }
    struct statfs fs;
    if (statfs(base, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)) {
        fprintf(stderr,
                "fuzz_rx: %s is in memory; FLUSH_PERSISTENT needs a file on storage "
                "(set SROCE_FUZZ_PMEM_DIR)\n",
                base);
        exit(1);
    }
    std::string tmpl =
        std::string(base) + "/" + std::string(kPrefix) + std::to_string(getpid()) + ".XXXXXX";
    if (!mkdtemp(tmpl.data())) die("mkdtemp for the persistence domain");
    h.pmem_dir = tmpl;
    h.pmem_file = tmpl + "/pmem";
    h.pmem_fd = open(h.pmem_file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (h.pmem_fd < 0 || ftruncate(h.pmem_fd, off_t(kFileBufs * kBufLen)) != 0)
        die(h.pmem_file.c_str());
    void *p = mmap(nullptr, kFileBufs * kBufLen, PROT_READ | PROT_WRITE, MAP_SHARED, h.pmem_fd, 0);
    if (p == MAP_FAILED) die("mmap of the persistence domain");
    h.pmem = static_cast<uint8_t *>(p);
}

void make_memory() {
    make_pmem();
    size_t n = 0;
    for (size_t i = 0; i < kVolatileBufs; i++) {
        void *p =
            mmap(nullptr, kBufLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("mmap");
        std::memset(p, 0x5A, kBufLen);
        h.bufs[n++].p = static_cast<uint8_t *>(p);
    }
    for (size_t i = 0; i < kFileBufs; i++) {
        Buf &b = h.bufs[n++];
        b.p = h.pmem + i * kBufLen;
        b.file = true;
    }
    for (Buf &b : h.bufs) {
        // No key (a CPU or kernel without them, or all taken): mprotect().
        b.pkey = pkey_alloc(0, 0);
        if (b.pkey >= 0 && pkey_mprotect(b.p, kBufLen, PROT_READ | PROT_WRITE, b.pkey) != 0)
            die("pkey_mprotect");
        set_prot(b, Prot::kFree);
    }
    sroce_set_persist_hook(on_persist, nullptr);
    reg_slot(kSlotVolatile, free_buf(false));
    reg_slot(kSlotFile, free_buf(true));
    reg_slot(kSlotWindows, free_buf(false));
}

// ---------------------------------------------------------------------------
// QPs

void modify(ibv_qp *qp, ibv_qp_attr &a, int mask) {
    if (int rc = sroce_modify_qp(qp, &a, mask)) {
        errno = rc;
        die("modify_qp");
    }
}

// The RC QP and the XRC target take FLUSH and commits; the others refuse them.
unsigned qp_access(Kind kind) {
    unsigned a = kRemoteAll | IBV_ACCESS_MW_BIND;
    return kind == kRc || kind == kXrc ? a | kFlushAll : a;
}

// Brings `qp` from any state to RTS, connected to the peer.
void connect_qp(ibv_qp *qp, Kind kind) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    modify(qp, a, IBV_QP_STATE);
    a = {};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    a.qp_access_flags = qp_access(kind);
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    modify(qp, a, mask | (kind == kUd ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS));
    a = {};
    a.qp_state = IBV_QPS_RTR;
    mask = IBV_QP_STATE;
    if (kind != kUd) {
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = kPeerQpn;
        a.rq_psn = 0xFFFFF0; // close to the wrap
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.sgid_index = 1;
        std::memcpy(a.ah_attr.grh.dgid.raw, h.peer_addr.raw, 16);
        mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    }
    if (kind == kRc || kind == kRcSrq || kind == kXrc) {
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    modify(qp, a, mask);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0x000100;
    a.timeout = 0; // no retransmission timer: the fuzzer's packets drive everything
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (kind == kRc || kind == kRcSrq)
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    if (kind == kXrc) mask |= IBV_QP_TIMEOUT;
    modify(qp, a, mask);
}

// Connects the QP again if asked to, or if it left RTS (unless a record
// put it where it is) or its send queue is full.
void ready_qp(Kind kind, bool force) {
    Qp *qp = to_qp(h.qps[kind]);
    bool reset = force;
    {
        std::lock_guard<std::mutex> g(qp->mu);
        reset = reset || (qp->attr.state != IBV_QPS_RTS && !h.held[kind]) ||
                qp->sq.head - qp->sq.tail >= kQueueDepth;
    }
    if (reset) {
        connect_qp(h.qps[kind], kind);
        h.held[kind] = false;
    }
}

// An input starts with no message in progress, no request outstanding, no
// request held past a gap and no range waiting for a commit from the inputs
// before it: whatever it makes the engine write or persist, it shows, so a
// crash replays from the input alone.
void settle_qps() {
    for (int k = 0; k < kKinds; k++) {
        Qp *qp = to_qp(h.qps[k]);
        bool busy;
        {
            std::lock_guard<std::mutex> g(qp->mu);
            busy = qp->attr.state != IBV_QPS_RTS || qp->resp.in_msg || qp->sq.head != qp->sq.tail ||
                   qp->resp.reorder.held || !qp->commit.dirty.empty();
        }
        if (busy) connect_qp(h.qps[k], Kind(k));
    }
}

ibv_qp *create_qp(ibv_qp_type type, Kind kind, ibv_srq *srq) {
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = h.cq;
    ia.recv_cq = h.cq;
    ia.qp_type = type;
    ia.cap = {kQueueDepth, kQueueDepth, 2, 2, 0};
    ia.srq = srq;
    ia.comp_mask = kind == kXrc ? IBV_QP_INIT_ATTR_XRCD : IBV_QP_INIT_ATTR_PD;
    ia.pd = h.pd;
    ia.xrcd = h.xrcd;
    if (kind == kRc) {
        // Everything an RC QP may post, the verbs of rdma-core >= 45 and
        // sroce's write-commit included.
        ia.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        ia.send_ops_flags =
            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
            IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
            IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
            IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV |
            IBV_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    }
    // Straight to the engine: ibv_create_qp_ex() would hand a QP with a
    // PD alone to libibverbs' ibv_create_qp, which is not the engine's here.
    ibv_qp *qp = verbs_get_ctx(h.ctx)->create_qp_ex(h.ctx, &ia);
    if (!qp) die("create_qp");
    connect_qp(qp, kind);
    return qp;
}

void setup() {
    h.trace = getenv("FUZZ_RX_TRACE") != nullptr;
    char tmpl[] = "/tmp/sroce-fuzz-XXXXXX";
    if (!mkdtemp(tmpl)) die("mkdtemp");
    std::string conf = std::string(tmpl) + "/links.conf";
    bool v6 = getenv("FUZZ_RX_IPV6") != nullptr;
    const char *dev_addr = v6 ? kDevAddr6 : kDevAddr, *peer_addr = v6 ? kPeerAddr6 : kPeerAddr;
    std::ofstream(conf) << kDevName << " netdev lo addr " << dev_addr << "\n";
    setenv("SROCE_CONFIG", conf.c_str(), 1);
    unsetenv("SROCE_FAULT");
    unsetenv("SROCE_BUSY_POLL");
    // The in-memory wire, driven from this thread: the device is the only
    // one at its address, and what it sends to the peer is kept for it.
    setenv("SROCE_PORT", "memory", 1);
    memwire::set_manual_progress(true);

    if (!IpAddr::parse(dev_addr, &h.dev_addr) || !IpAddr::parse(peer_addr, &h.peer_addr))
        die("addresses");
    memwire::listen(h.peer_addr);

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
    if (!h.pd) die("alloc_pd");
    make_memory();
    std::memset(h.src, 0xC3, sizeof h.src);
    h.src_mr = sroce_reg_mr(h.pd, h.src, sizeof h.src, uint64_t(uintptr_t(h.src)), 0);
    h.cq = sroce_create_cq(h.ctx, 4096, nullptr, nullptr, 0);
    if (!h.src_mr || !h.cq) die("reg_mr / create_cq");
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
    for (int k = 0; k < kKinds; k++)
        h.qps[k] = create_qp(types[k], Kind(k), k == kRcSrq ? h.srq : nullptr);
    h.ctl_qp = create_qp(IBV_QPT_RC, kCtlKind, nullptr);
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    ah.grh.sgid_index = 1;
    std::memcpy(ah.grh.dgid.raw, h.peer_addr.raw, 16);
    h.peer_ah = sroce_create_ah(h.pd, &ah);
    h.mw1 = ibv_alloc_mw(h.pd, IBV_MW_TYPE_1);
    h.mw2 = ibv_alloc_mw(h.pd, IBV_MW_TYPE_2);
    if (!h.peer_ah || !h.mw1 || !h.mw2) die("create_ah / alloc_mw");
    h.qp = h.qps[kRc];
    h.kind = kRc;
}

// ---------------------------------------------------------------------------
// Windows

// Both windows cover the windows' buffer.  Type 1 is bound through the
// control QP; type 2 through the RC QP, for which alone it grants access,
// and may be invalidated by a fuzzed SEND WITH INVALIDATE: bound again when
// needed.
void bind_windows() {
    set_prot(slot_buf(kSlotWindows), Prot::kLive); // before any bind can take effect
    ibv_mw_bind_info info{
        h.slots[kSlotWindows].mr, uint64_t(uintptr_t(slot_mem(kSlotWindows))), kBufLen,
        IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC};
    ibv_qp *rc = h.qps[kRc];
    if (!window_parent(reinterpret_cast<Mw *>(h.mw1)) && !bind_pending(h.ctl_qp)) {
        ibv_mw_bind b{0, IBV_SEND_SIGNALED, info};
        (void)ibv_bind_mw(h.ctl_qp, h.mw1, &b);
    }
    if (!window_parent(reinterpret_cast<Mw *>(h.mw2)) && !bind_pending(rc)) {
        ibv_send_wr wr{};
        wr.opcode = IBV_WR_BIND_MW;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.bind_mw.mw = h.mw2;
        wr.bind_mw.rkey = ibv_inc_rkey(h.mw2->rkey);
        wr.bind_mw.bind_info = info;
        ibv_send_wr *bad = nullptr;
        (void)ibv_post_send(rc, &wr, &bad);
    }
}

void local_invalidate(ibv_qp *qp, ibv_mw *mw) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.invalidate_rkey = mw->rkey;
    ibv_send_wr *bad = nullptr;
    (void)ibv_post_send(qp, &wr, &bad);
}

// The control QP completes everything at once; a failed WR leaves it in the
// error state.
void ready_ctl_qp() {
    Qp *c = to_qp(h.ctl_qp);
    std::unique_lock<std::mutex> g(c->mu);
    bool stale = c->attr.state != IBV_QPS_RTS || c->sq.head - c->sq.tail >= kQueueDepth;
    g.unlock();
    if (stale) connect_qp(h.ctl_qp, kCtlKind);
}

void invalidate_windows() {
    ready_ctl_qp();
    ibv_mw_bind b{};
    b.send_flags = IBV_SEND_SIGNALED;
    (void)ibv_bind_mw(h.ctl_qp, h.mw1, &b);
    local_invalidate(h.ctl_qp, h.mw2);
}

// Whether a window is bound elsewhere than over the windows' memory as it
// is now (the MR was moved, and an input starts).
bool windows_astray() {
    for (ibv_mw *ibmw : {h.mw1, h.mw2}) {
        Mw *mw = reinterpret_cast<Mw *>(ibmw);
        std::lock_guard<std::mutex> g(mw->mu);
        if (mw->bound && mw->va != uint64_t(uintptr_t(slot_mem(kSlotWindows)))) return true;
    }
    return false;
}

void windows_action(uint8_t arg) {
    h.stats.windows++;
    ready_ctl_qp();
    ready_qp(kRc, false); // where type 2 binds and in-order invalidations go
    switch (WindowAction(arg & 3)) {
    case kWindowsInvalidate:
        invalidate_windows();
        break;
    case kWindowsBind:
        bind_windows();
        break;
    case kWindowsRealloc:
        for (ibv_mw **mw : {&h.mw1, &h.mw2}) {
            ibv_mw_type type = (*mw)->type;
            if (ibv_dealloc_mw(*mw) != 0) continue; // a bind is still queued
            *mw = ibv_alloc_mw(h.pd, type);
            if (!*mw) die("alloc_mw");
        }
        break;
    case kWindowsInvalidateInOrder:
        local_invalidate(h.qps[kRc], h.mw2);
        break;
    }
    trace("windows %d: type 1 %s, type 2 %s", arg & 3,
          window_parent(reinterpret_cast<Mw *>(h.mw1)) ? "bound" : "unbound",
          window_parent(reinterpret_cast<Mw *>(h.mw2)) ? "bound" : "unbound");
}

// ---------------------------------------------------------------------------
// Packets

// Sends the datagram(s) to the device - `seg` > 0: one coalesced datagram
// of `count` packets of that size - and has the device handle them.
void inject(const uint8_t *p, size_t n, uint16_t seg = 0, unsigned count = 1) {
    uint64_t before = h.nic->stats.rx_pkts.load();
    if (!memwire::send(h.peer_addr, wire::kRoceV2Port, h.dev_addr, p, n, seg)) die("memwire::send");
    while (h.nic->poll_once() > 0) {
    }
    if (h.nic->stats.rx_pkts.load() < before + count) {
        fprintf(stderr, "fuzz_rx: the device did not receive the datagram\n");
        abort();
    }
}

// Everything sroce sends must be a well-formed packet with a valid ICRC.
void check_replies() {
    memwire::Packet sent;
    while (memwire::take(h.peer_addr, sent)) {
        const uint8_t *b = sent.bytes.data();
        ssize_t n = ssize_t(sent.bytes.size());
        wire::Packet pkt;
        wire::ParseError e = wire::parse(b, size_t(n), pkt);
        if (e != wire::ParseError::kOk) {
            fprintf(stderr, "fuzz_rx: sroce sent a malformed packet: %s\n",
                    wire::parse_error_str(e));
            abort();
        }
        // Checked with the ID the wire says it carries first.
        // A FLUSH may be resent in Linux rxe's form (wire-protocol.md §4.4).
        const IpHeader &ip = sent.ip;
        if (!icrc_verify(ip, b, size_t(n)) &&
            !(pkt.opcode == wire::kFlush && icrc_verify_flush_legacy(ip, b, size_t(n)))) {
            // What it was, for a failure that the saved input alone (the
            // state before it matters) may not reproduce.
            fprintf(stderr,
                    "fuzz_rx: sroce sent a packet with a bad ICRC: %s, PSN %#x, %zd bytes, "
                    "payload %u\n",
                    pkt.info->name, pkt.psn, n, pkt.payload_len);
            abort();
        }
        if (pkt.info->aeth)
            trace("  sroce sent %s, PSN %#x, syndrome %#x", pkt.info->name, pkt.psn,
                  pkt.syndrome());
        else
            trace("  sroce sent %s, PSN %#x", pkt.info->name, pkt.psn);
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
    // Looked at first: most inputs raise no event, and asking for one
    // costs a read(2) of the event pipe.
    Context *ctx = to_ctx(h.ctx);
    for (;;) {
        {
            std::lock_guard<std::mutex> g(ctx->async_mu);
            if (ctx->async_q.empty()) return;
        }
        ibv_async_event ev;
        if (sroce_get_async_event(h.ctx, &ev) != 0) return;
        sroce_ack_async_event(&ev);
    }
}

bool send_queue_full(Qp *qp) {
    std::lock_guard<std::mutex> g(qp->mu);
    return qp->sq.head - qp->sq.tail >= kQueueDepth;
}

// The verbs rdma-core >= 45 and sroce add, on the RC QP: write-commit (the
// native opcodes or the IBTA sequence, as the peer was declared), FLUSH,
// ATOMIC WRITE and write-commit with immediate data.
void post_new_verb(uint8_t kind, uint8_t aim) {
    Qp *qp = to_qp(h.qp);
    ibv_qp_ex *qx = &qp->qpx;
    const ibv_qp_commit_ops *ops = sroce_qp_to_commit_ops(qx);
    if (!ops || send_queue_full(qp)) return;
    uint32_t flags = ((aim & kCommitOrdered) ? IBV_WRITE_COMMIT_ORDERED : 0u) |
                     ((aim & kCommitGlobal) ? IBV_WRITE_COMMIT_GLOBAL : 0u);
    constexpr uint64_t kRemote = 0x10000;
    constexpr uint64_t kWord = 0x0123456789ABCDEF;
    ibv_wr_start(qx);
    qx->wr_id = 0;
    qx->wr_flags = IBV_SEND_SIGNALED;
    switch (kind & 3) {
    case 0:
        ops->wr_rdma_write_commit(qx, 1, kRemote, flags);
        ibv_wr_set_sge(qx, h.src_mr->lkey, uint64_t(uintptr_t(h.src)), 2500);
        break;
    case 1:
        ibv_wr_flush(qx, 1, kRemote, 4096,
                     (aim & kCommitGlobal) ? IBV_FLUSH_GLOBAL : IBV_FLUSH_PERSISTENT,
                     (aim & kCommitOrdered) ? IBV_FLUSH_MR : IBV_FLUSH_RANGE);
        break;
    case 2:
        ibv_wr_atomic_write(qx, 1, kRemote, &kWord);
        break;
    default:
        ops->wr_rdma_write_commit_imm(qx, 1, kRemote, flags, htonl(7));
        ibv_wr_set_sge(qx, h.src_mr->lkey, uint64_t(uintptr_t(h.src)), 100);
        break;
    }
    (void)ibv_wr_complete(qx);
}

void post_send(uint8_t kind) {
    if (h.kind == kXrc) return; // a receive-only QP
    if (send_queue_full(to_qp(h.qp))) return;
    uint8_t *mem = slot_mem(kSlotVolatile);
    uint32_t lkey = h.slots[kSlotVolatile].mr->lkey;
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
        sge = {uint64_t(uintptr_t(mem + 8192)), 2500, lkey};
        break;
    case 2:
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        sge = {uint64_t(uintptr_t(mem + 16384)), 8, lkey};
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
    ibv_sge sge{uint64_t(uintptr_t(slot_mem(kSlotVolatile) + 32768)), 3000,
                h.slots[kSlotVolatile].mr->lkey};
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

// Points RETH / AtomicETH at an MR or a window, keeping the fuzzed offset
// and length; names the type 2 window (the one a peer may invalidate, if
// bound for this QP) in an IETH, our Q_Key in a DETH and our XRC SRQ in an
// XRCETH.
void aim(uint8_t *p, size_t n, bool window, bool persistent) {
    const wire::OpInfo &o = wire::op_info(p[0]);
    if (!o.name) return;
    ibv_mw *mw = h.kind == kRc ? h.mw2 : h.mw1;
    int slot = window ? kSlotWindows : persistent ? kSlotFile : kSlotVolatile;
    uint32_t rkey = window ? mw->rkey : h.slots[slot].mr->rkey;
    uint8_t off = o.reth ? o.reth : o.atomic_eth;
    if (off && size_t(off) + 12 <= n) {
        uint64_t va = wire::get64(p + off);
        wire::put64(p + off, uint64_t(uintptr_t(slot_mem(slot))) + (va & (kBufLen - 1)));
        wire::put32(p + off + 8, rkey);
    }
    if (o.ieth && size_t(o.ieth) + 4 <= n) wire::put32(p + o.ieth, h.mw2->rkey);
    if (o.deth && size_t(o.deth) + 4 <= n) wire::put32(p + o.deth, kQkey);
    if (o.xrceth && size_t(o.xrceth) + 4 <= n) wire::put32(p + o.xrceth, to_srq(h.xsrq)->srq_num);
}

void fix_icrc(uint8_t *p, size_t n, uint16_t ip_id = 0) {
    if (n < wire::kBthLen + wire::kIcrcLen) return;
    IpHeader ip{h.peer_addr, h.dev_addr, wire::kRoceV2Port, wire::kRoceV2Port, ip_id};
    icrc_store(p + n - wire::kIcrcLen, icrc_compute(ip, p, n));
}

Kind kind_of(uint8_t target) {
    return Kind((target & kTargetMask) < kKinds ? target & kTargetMask : kRc);
}

// A packet record's argument bit 0: the payload becomes one path MTU of the
// QP, the bytes given first and a pattern after them, so that a FIRST or
// MIDDLE packet takes a few bytes of the input, not a kilobyte.
void fill_to_mtu(std::vector<uint8_t> &v, Kind kind) {
    wire::Packet pkt;
    if (wire::parse(v.data(), v.size(), pkt) != wire::ParseError::kOk ||
        !(pkt.info->hdrs & wire::kHasPayload))
        return;
    Qp *qp = to_qp(h.qps[kind]);
    uint32_t mtu;
    {
        std::lock_guard<std::mutex> g(qp->mu);
        mtu = qp->attr.mtu;
    }
    size_t hdr = size_t(pkt.payload - v.data());
    if (hdr + mtu + wire::kIcrcLen > kMaxDatagram) return;
    // Sized once: up to an MTU of filler per packet, byte by byte through
    // push_back, was a tenth of the harness's time.
    std::vector<uint8_t> out(hdr + mtu + wire::kIcrcLen); // the ICRC filled in unless kept
    std::copy(v.begin(), v.begin() + ptrdiff_t(hdr), out.begin());
    uint32_t given = std::min(pkt.payload_len, mtu);
    std::copy(pkt.payload, pkt.payload + given, out.begin() + ptrdiff_t(hdr));
    for (size_t i = hdr + given; i < hdr + mtu; i++)
        out[i] = uint8_t(i * 7);
    out[1] &= uint8_t(~0x30); // no pad count
    v = std::move(out);
}

void packet_record(uint8_t ctl, uint8_t target, uint8_t aim_bits, uint8_t *p, size_t n) {
    h.kind = kind_of(target);
    h.qp = h.qps[h.kind];

    // The codec alone, on the raw bytes.
    {
        wire::Packet parsed;
        (void)wire::parse(p, n, parsed);
        IpHeader ip{h.peer_addr, h.dev_addr, wire::kRoceV2Port, wire::kRoceV2Port};
        uint16_t id;
        (void)icrc_verify(ip, p, n, &id);
        // Linux rxe's FLUSH form, with the IP ID solved as for rxe's ports.
        ip.sport = uint16_t(0xC000 | target);
        (void)icrc_verify_flush_legacy(ip, p, n);
    }

    Qp *qp = to_qp(h.qp);
    ready_qp(h.kind, ctl & kResetQp);
    if (h.kind == kRc)
        sroce_qp_set_commit_peer(h.qp, (aim_bits & kNativeCommit) ? IBV_COMMIT_CAP_NATIVE : 0);
    {
        // Held requests and SELECTIVE ACKNOWLEDGEs (wire-protocol.md §5.6.1).
        std::lock_guard<std::mutex> g(qp->mu);
        qp->selective_repeat = (target & kTargetMask) == kTargetRcSelective;
    }
    if (target & kAimWindow) bind_windows();
    if (ctl & kPostRecv) post_recv();
    if (ctl & kPostSend) {
        if ((aim_bits & kPostNewVerb) && h.kind == kRc)
            post_new_verb(uint8_t(ctl >> 5), aim_bits);
        else
            post_send(uint8_t(ctl >> 5));
    }
    check_replies();

    if (n >= wire::kBthLen) {
        if (ctl & kOwnQp) {
            wire::put24(p + 5, h.qp->qp_num);
            aim(p, n, target & kAimWindow, aim_bits & kAimPersistent);
        }
        if (ctl & kExpectedPsn) {
            std::lock_guard<std::mutex> g(qp->mu);
            bool response = wire::op_info(p[0]).flags & wire::kOpResp;
            wire::put24(p + 9, response ? qp->comp.una_psn : qp->resp.epsn);
        }
        if (!(ctl & kKeepIcrc)) fix_icrc(p, n);
    }
    h.stats.packets++;
    const char *op = n ? wire::op_info(p[0]).name : "(empty)";
    trace("packet %s to QP kind %d, %zu bytes", op ? op : "of an unknown opcode", h.kind, n);
    if ((target & kRun) && n >= wire::kBthLen + wire::kIcrcLen + 4) {
        unsigned count = 2 + ((target >> 5) & 3);
        std::vector<uint8_t> run;
        for (unsigned i = 0; i < count; i++) {
            size_t len = (i + 1 == count && (target & kRunShortLast)) ? n - 4 : n;
            size_t at = run.size();
            run.insert(run.end(), p, p + len);
            uint8_t *q = run.data() + at;
            wire::put24(q + 9, (wire::get24(p + 9) + i) & wire::kPsnMask);
            if (!(ctl & kKeepIcrc)) fix_icrc(q, len, uint16_t(i));
        }
        inject(run.data(), run.size(), uint16_t(n), count);
    } else {
        inject(p, n);
    }
}

// QP1: with SROCE_AGENT=off nothing in the process serves it (the agent's
// CM does, fuzz_cm_state); what reaches the device is dropped, never given
// to one of its QPs.
void qp1_record(uint8_t arg, uint8_t *p, size_t n) {
    bool as_given = arg & 1;
    if (n >= wire::kBthLen && !as_given) {
        wire::put24(p + 5, 1);
        const wire::OpInfo &o = wire::op_info(p[0]);
        if (o.name && o.deth && size_t(o.deth) + 8 <= n) {
            wire::put32(p + o.deth, wire::kGsiQkey);
            wire::put24(p + o.deth + 5, 1); // from the peer's QP1
        }
    }
    if (!(arg & 2)) fix_icrc(p, n);
    const NicStats &s = h.nic->stats;
    auto dropped = [&s] { return s.rx_no_qp.load() + s.rx_bad_hdr.load() + s.rx_bad_icrc.load(); };
    uint64_t before = dropped();
    h.stats.qp1++;
    trace("QP1 packet, %zu bytes", n);
    inject(p, n);
    if (!as_given && dropped() == before) {
        fprintf(stderr, "fuzz_rx: a packet for QP1 was not dropped\n");
        abort();
    }
}

void qp_state_record(uint8_t arg) {
    Kind k = (arg & 7) < kKinds ? Kind(arg & 7) : kRc;
    ready_qp(k, false);
    ibv_qp_attr a{};
    a.qp_state = (arg & 8) ? IBV_QPS_SQD : IBV_QPS_ERR;
    int rc = sroce_modify_qp(h.qps[k], &a, IBV_QP_STATE);
    if (rc == 0) h.held[k] = true;
    h.stats.qp_states++;
    trace("QP kind %d to %s: %s", k, (arg & 8) ? "SQD" : "ERR", rc ? strerror(rc) : "done");
}

void rereg_access_record(uint8_t arg) {
    int s = arg & 1;
    unsigned v = (arg >> 1) & 7;
    unsigned access = kAccessVariants[v] == kHome ? kHomeAccess[s] : kAccessVariants[v];
    if (v == 3) access |= IBV_ACCESS_UNCACHED;
    bool ok = rereg_access(s, access);
    h.stats.access++;
    h.stats.access_refused += !ok;
    trace("rereg slot %d access %#x: %s", s, access, ok ? "done" : strerror(errno));
}

void rereg_move_record(uint8_t arg) {
    int s = (arg & 8) ? kSlotWindows : arg & 1;
    bool file = slot_buf(s).file != bool(arg & 2);
    unsigned access = kHomeAccess[s] & (file ? ~0u : ~unsigned(IBV_ACCESS_FLUSH_PERSISTENT));
    int from = h.slots[s].buf;
    bool ok = rereg_move(s, file, arg & 4, access);
    h.stats.moves++;
    h.stats.moves_refused += !ok;
    trace("rereg slot %d from buffer %d to %s buffer %d: %s", s, from, file ? "file" : "volatile",
          h.slots[s].buf, ok ? "done, old poisoned" : strerror(errno));
}

void print_stats() {
    auto &st = h.stats;
    fprintf(stderr,
            "fuzz_rx: %" PRIu64 " packets, %" PRIu64 " for QP1; %" PRIu64
            " deregistrations (%" PRIu64 " refused), %" PRIu64 " access changes (%" PRIu64
            " refused), %" PRIu64 " moves (%" PRIu64 " refused), %" PRIu64 " window and %" PRIu64
            " QP state changes; sroce made %" PRIu64 " ranges durable (%" PRIu64
            " bytes) and fenced %" PRIu64 " times\n",
            st.packets, st.qp1, st.deregs, st.dereg_busy, st.access, st.access_refused, st.moves,
            st.moves_refused, st.windows, st.qp_states, st.persisted.load(),
            st.persisted_bytes.load(), st.fences.load());
}

void teardown() {
    print_stats();
    // Joins the progress thread before static destructors run under it.
    ibv_dealloc_mw(h.mw1);
    ibv_dealloc_mw(h.mw2);
    sroce_destroy_ah(h.peer_ah);
    for (ibv_qp *qp : h.qps)
        sroce_destroy_qp(qp);
    sroce_destroy_qp(h.ctl_qp);
    sroce_destroy_srq(h.srq);
    sroce_destroy_srq(h.xsrq);
    ibv_close_xrcd(h.xrcd);
    sroce_destroy_cq(h.cq);
    for (MrSlot &m : h.slots)
        sroce_dereg_mr(m.mr);
    sroce_dereg_mr(h.src_mr);
    sroce_dealloc_pd(h.pd);
    sroce_close_device(h.ctx);
    sroce_set_persist_hook(nullptr, nullptr);
    for (Buf &b : h.bufs) {
        set_prot(b, Prot::kLive);
        if (!b.file) munmap(b.p, kBufLen);
    }
    munmap(h.pmem, kFileBufs * kBufLen);
    close(h.pmem_fd);
    std::error_code ec;
    std::filesystem::remove_all(h.pmem_dir, ec);
    memwire::reset();
}

// An action record; false if `kind` is none.
bool action(uint8_t kind, uint8_t arg) {
    switch (kind) {
    case kRecDereg:
        if (h.remaps++ < kMaxRemaps) dereg_slot(arg % 3);
        return true;
    case kRecReregAccess:
        rereg_access_record(arg);
        return true;
    case kRecReregMove:
        if (h.remaps++ < kMaxRemaps) rereg_move_record(arg);
        return true;
    case kRecWindows:
        windows_action(arg);
        return true;
    case kRecQpState:
        qp_state_record(arg);
        return true;
    default:
        return false;
    }
}

// Reads a 16-bit length and that many bytes (fewer if the input ends),
// advancing `at`; the datagram is a copy the harness may edit.
std::vector<uint8_t> take_datagram(const uint8_t *data, size_t size, size_t &at) {
    size_t len = 0;
    if (at + 2 <= size) len = size_t(data[at]) << 8 | data[at + 1];
    at = std::min(size, at + 2);
    len = std::min(len, size - at);
    std::vector<uint8_t> v(data + at, data + at + std::min(len, kMaxDatagram));
    at += len;
    return v;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    setup();
    atexit(teardown);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > kMaxInput) return 0;
    settle_qps();
    restore_slots();
    for (bool &held : h.held)
        held = false;
    size_t at = 0;
    h.remaps = 0;
    for (unsigned records = 0; at < size && records < kMaxRecords; records++) {
        uint8_t kind = data[at] & 0xF, arg = data[at] >> 4;
        at++;
        switch (kind) {
        case kRecPacket: {
            uint8_t steer[3] = {};
            for (uint8_t &b : steer)
                b = at < size ? data[at++] : 0;
            std::vector<uint8_t> pkt = take_datagram(data, size, at);
            if (arg & 1) fill_to_mtu(pkt, kind_of(steer[1]));
            const uint8_t *pre = kPreActions[steer[2] >> kPreActionShift];
            if (action(pre[0], pre[1])) {
                check_replies();
                drain_completions();
                apply_prot(kSlotWindows);
            }
            packet_record(steer[0], steer[1], steer[2], pkt.data(), pkt.size());
            break;
        }
        case kRecQp1: {
            std::vector<uint8_t> pkt = take_datagram(data, size, at);
            qp1_record(arg, pkt.data(), pkt.size());
            break;
        }
        default:
            if (!action(kind, arg)) continue; // not a record: skipped
        }
        check_replies();
        drain_completions();
        apply_prot(kSlotWindows);
    }
    return 0;
}
