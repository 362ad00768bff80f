// SPDX-License-Identifier: MIT
//
// A test persistence domain for crash-consistency tests (docs/design.md §5).
//
// The engine reports every range it makes durable to a hook
// (sroce_set_persist_hook).  Domain copies those bytes from the live target
// MR into a shadow image, so the shadow holds exactly what was explicitly
// persisted: what would survive power loss.  "Power off" is a copy of the
// shadow taken at a random moment while traffic runs; each copy is an
// independent power-failure experiment, checked against what the initiator
// had been promised when it was taken:
//   (1) every record covered by a durability point (a FLUSH) whose
//       completion had been polled is there, byte for byte;
//   (2) the commit word never names a record that is not durable in the same
//       image (log append, then commit record);
//   (3) bytes no operation wrote are zero, and no byte of a record is
//       anything but zero or its own value.
//
// The workload is a Plan: a list of operations whose kinds come from one
// table (kKinds), so a new verb (write-commit, ordered or with immediate
// data) is a new Kind, a row saying how to post it and what its completion
// promises, and a line in the generator.
#pragma once

#include "persist_log.hpp"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <fcntl.h>
#include <limits>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace crash {

using rctest::Clock;
using namespace std::chrono_literals;

// Sanitized code copies and compares memory many times slower; races do not
// need volume, so those builds run smaller logs and fewer power-offs.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Power-offs a run waits for, spread over it (RunOpts::min_power_offs).
inline constexpr uint64_t kMinPowerOffs = kSanitized ? 60 : 300;

inline std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strf(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// splitmix64: every choice of a run follows from its seed, whatever the
// standard library's distributions do.
class Rng {
  public:
    explicit Rng(uint64_t seed) : s_(seed) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }
    uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); } // inclusive
    bool chance(double p) { return double(next() >> 11) / double(1ull << 53) < p; }

  private:
    uint64_t s_;
};

// ---------------------------------------------------------------------------
// The persistence domain

struct DomainStats {
    uint64_t ranges = 0;  // hook calls with a range inside the attached MR
    uint64_t bytes = 0;   // bytes those calls made durable
    uint64_t foreign = 0; // ranges outside the attached MR (ignored)
    uint64_t fences = 0;  // (nullptr, 0): a bare fence, nothing made durable
};

class Domain {
  public:
    // The engine reads the hook on every persist; install it once, before
    // any device is opened, and leave it (the MR it shadows is switched with
    // attach/detach while no traffic runs).
    void install() { sroce_set_persist_hook(&Domain::hook, this); }
    void uninstall() { sroce_set_persist_hook(nullptr, nullptr); }

    // Starts shadowing [base, base+len), initially all zero: a fresh file
    // holds zeros, and nothing else has been made durable yet.
    void attach(const uint8_t *base, size_t len) {
        std::lock_guard<std::mutex> g(mu_);
        base_ = base;
        len_ = len;
        shadow_.assign(len, 0);
        stats_ = {};
        fences_.store(0, std::memory_order_relaxed);
    }
    void detach() {
        std::lock_guard<std::mutex> g(mu_);
        base_ = nullptr;
        len_ = 0;
    }

    // Power off: what survives is the shadow at this instant.  Returns
    // whether the power failed in the middle of persisting a range.
    bool power_off(std::vector<uint8_t> &out) {
        waiting_.store(true, std::memory_order_relaxed);
        std::lock_guard<std::mutex> g(mu_);
        waiting_.store(false, std::memory_order_relaxed);
        out.resize(shadow_.size());
        if (!shadow_.empty()) std::memcpy(out.data(), shadow_.data(), shadow_.size());
        return copying_.load(std::memory_order_relaxed);
    }

    // A range is being persisted right now (a power-off aimed at the middle
    // of a flush waits for this).
    bool copying() const { return copying_.load(std::memory_order_relaxed); }

    DomainStats stats() {
        std::lock_guard<std::mutex> g(mu_);
        DomainStats s = stats_;
        s.fences = fences_.load(std::memory_order_relaxed);
        return s;
    }

  private:
    // Persistence of a range is not atomic in real hardware either: a power
    // failure in the middle of a flush leaves part of it on the medium.  So
    // the range is copied a page at a time, letting a power-off land between
    // pages.  Nothing may be assumed about such a range until its
    // completion has been polled, and the checker must accept any mix.
    static constexpr size_t kPiece = 4096;

    static void hook(void *ctx, const void *addr, size_t len) {
        static_cast<Domain *>(ctx)->persisted(static_cast<const uint8_t *>(addr), len);
    }

    void persisted(const uint8_t *p, size_t len) {
        if (p == nullptr || len == 0) {
            fences_.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        size_t off, end;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto lo = reinterpret_cast<uintptr_t>(base_), hi = lo + len_;
            auto a = reinterpret_cast<uintptr_t>(p), b = a + len;
            if (base_ == nullptr || b <= lo || a >= hi) {
                stats_.foreign++;
                return;
            }
            off = std::max(a, lo) - lo;
            end = std::min(b, hi) - lo;
            stats_.ranges++;
            stats_.bytes += end - off;
            copying_.store(true, std::memory_order_relaxed);
        }
        while (off < end) {
            // A mutex is not fair: without stepping aside, this thread would
            // take it back before a waiting power-off ever got it.
            while (waiting_.load(std::memory_order_relaxed))
                std::this_thread::yield();
            size_t next = std::min(end, (off / kPiece + 1) * kPiece);
            std::lock_guard<std::mutex> g(mu_);
            if (base_ == nullptr || next > len_) { // detached under traffic: a test bug
                copying_.store(false, std::memory_order_relaxed);
                return;
            }
            std::memcpy(shadow_.data() + off, base_ + off, next - off);
            off = next;
            if (off == end) copying_.store(false, std::memory_order_relaxed);
        }
    }

    std::mutex mu_;
    const uint8_t *base_ = nullptr;
    size_t len_ = 0;
    std::vector<uint8_t> shadow_;
    DomainStats stats_;
    std::atomic<uint64_t> fences_{0};
    std::atomic<bool> waiting_{false}; // a power-off wants the mutex
    std::atomic<bool> copying_{false}; // set and cleared under mu_
};

// ---------------------------------------------------------------------------
// Operations

enum class Kind : uint8_t {
    kWrite,
    kAtomicWrite,
    kFlushRange,
    kFlushMr,
    kWriteCommit,        // the last piece of a record, as a write-commit
    kWriteCommitOrdered, // ... with IBV_WRITE_COMMIT_ORDERED
};

struct Op {
    Kind kind;
    uint8_t placement = IBV_FLUSH_PERSISTENT; // FLUSH
    uint64_t off = 0, len = 0;                // MR offsets: bytes placed, or range flushed
    uint64_t value = 0;                       // ATOMIC WRITE
    int32_t record = -1;                      // the record a WRITE is part of
    int32_t commit = -1;                      // the commit an ATOMIC WRITE is
    int32_t point = -1;                       // index among durability points
};

// Where a plan's offsets land: the source image on the initiator, the
// target MR on the responder.
struct Target {
    ibv_qp_ex *q;
    uint32_t lkey;
    uint64_t laddr; // source image, same layout as the target
    uint32_t rkey;
    uint64_t raddr; // target MR (iova = its address)
};

struct KindInfo {
    const char *name;
    // Adds the WQE to an open ibv_wr_start() batch (wr_id, wr_flags set).
    void (*post)(const Target &t, const Op &op);
    // A durability point: signaled, and its completion promises that every
    // byte placed before it (by this QP) inside covers() is durable.
    bool point;
    void (*covers)(const Op &op, uint64_t &lo, uint64_t &hi);
};

inline void no_cover(const Op &, uint64_t &lo, uint64_t &hi) {
    lo = hi = 0;
}

// Indexed by Kind.
inline constexpr KindInfo kKinds[] = {
    {"WRITE",
     [](const Target &t, const Op &op) {
         ibv_wr_rdma_write(t.q, t.rkey, t.raddr + op.off);
         ibv_wr_set_sge(t.q, t.lkey, t.laddr + op.off, uint32_t(op.len));
     },
     false, no_cover},
    {"ATOMIC WRITE",
     [](const Target &t, const Op &op) {
         ibv_wr_atomic_write(t.q, t.rkey, t.raddr + op.off, &op.value);
     },
     false, no_cover},
    {"FLUSH RANGE",
     [](const Target &t, const Op &op) {
         ibv_wr_flush(t.q, t.rkey, t.raddr + op.off, op.len, op.placement, IBV_FLUSH_RANGE);
     },
     true,
     [](const Op &op, uint64_t &lo, uint64_t &hi) {
         lo = op.off;
         hi = op.off + op.len;
     }},
    {"FLUSH MR",
     [](const Target &t, const Op &op) {
         // The address and length of an MR-selectivity FLUSH are ignored.
         ibv_wr_flush(t.q, t.rkey, 0, 0, op.placement, IBV_FLUSH_MR);
     },
     true,
     [](const Op &, uint64_t &lo, uint64_t &hi) {
         lo = 0;
         hi = std::numeric_limits<uint64_t>::max();
     }},
    // A write-commit promises this write and every earlier one on the QP to
    // the rkey (the harness has one MR): the whole MR, as far as placed.
    {"WRITE COMMIT",
     [](const Target &t, const Op &op) {
         ibv_wr_rdma_write_commit(t.q, t.rkey, t.raddr + op.off, 0);
         ibv_wr_set_sge(t.q, t.lkey, t.laddr + op.off, uint32_t(op.len));
     },
     true,
     [](const Op &, uint64_t &lo, uint64_t &hi) {
         lo = 0;
         hi = std::numeric_limits<uint64_t>::max();
     }},
    {"WRITE COMMIT ORDERED",
     [](const Target &t, const Op &op) {
         ibv_wr_rdma_write_commit(t.q, t.rkey, t.raddr + op.off, IBV_WRITE_COMMIT_ORDERED);
         ibv_wr_set_sge(t.q, t.lkey, t.laddr + op.off, uint32_t(op.len));
     },
     true,
     [](const Op &, uint64_t &lo, uint64_t &hi) {
         lo = 0;
         hi = std::numeric_limits<uint64_t>::max();
     }},
};

static_assert(std::size(kKinds) == size_t(Kind::kWriteCommitOrdered) + 1, "one row per Kind");

inline const KindInfo &info(Kind k) {
    return kKinds[size_t(k)];
}

// ---------------------------------------------------------------------------
// The plan: an append-only log with a commit word

// The commit word sits at MR offset 0 and holds (records << 32) | kCommitTag:
// "records [0, n) of the log are complete".  The tag makes a word that no
// ATOMIC WRITE produced (a torn or misplaced store) recognizable.
inline constexpr uint64_t kCommitOff = 0;
inline constexpr uint32_t kCommitTag = 0xC0117ED5;
inline constexpr uint64_t kLogStart = 64;

inline uint64_t commit_word(uint64_t records) {
    return (records << 32) | kCommitTag;
}

struct Record {
    uint64_t off, len;
    uint32_t first_op, last_op; // the ops placing it
    int32_t point = -1;         // the first durability point that covers it
    // An ordering promise: whenever any byte of this record is durable, so
    // are records [0, after) (what an ordered commit promises).  0: none.
    uint64_t after = 0;
};

struct Commit {
    uint32_t op;
    uint64_t records;
    int32_t point = -1; // the first durability point that covers the word
};

struct Plan {
    uint64_t mr_len = 0;
    std::vector<Op> ops;
    std::vector<Record> records; // in log (and offset) order
    std::vector<Commit> commits;
    std::vector<uint32_t> points; // op index of each durability point
    // Per point: the commit word, once that point's completion is polled,
    // names at least this many records.
    std::vector<uint64_t> promised_commit;
    // The source of every WRITE, laid out as the target: record bytes are
    // never zero, so a record that is there is told from one that is not.
    std::vector<uint8_t> image;

    std::string op_desc(size_t i) const {
        const Op &op = ops[i];
        std::string s = strf("op #%zu %s", i, info(op.kind).name);
        switch (op.kind) {
        case Kind::kWrite:
            return s +
                   strf(" MR[0x%" PRIx64 ", +%" PRIu64 ") of record %d", op.off, op.len, op.record);
        case Kind::kAtomicWrite:
            return s + strf(" commit word := %" PRIu64 " records", op.value >> 32);
        case Kind::kFlushRange:
            return s + strf(" MR[0x%" PRIx64 ", +%" PRIu64 ") %s", op.off, op.len,
                            placement_name(op.placement));
        case Kind::kFlushMr:
            return s + strf(" %s", placement_name(op.placement));
        case Kind::kWriteCommit:
        case Kind::kWriteCommitOrdered:
            return s +
                   strf(" MR[0x%" PRIx64 ", +%" PRIu64 ") of record %d", op.off, op.len, op.record);
        }
        return s;
    }
    std::string point_desc(int64_t p) const {
        if (p < 0) return "no durability point";
        return strf("point #%" PRId64 " (%s)", p, op_desc(points[size_t(p)]).c_str());
    }
    std::string record_desc(size_t r) const {
        const Record &rec = records[r];
        return strf("record %zu MR[0x%" PRIx64 ", +%" PRIu64 ") (ops #%u..#%u)", r, rec.off,
                    rec.len, rec.first_op, rec.last_op);
    }
    static const char *placement_name(uint8_t t) {
        switch (t) {
        case IBV_FLUSH_PERSISTENT:
            return "PERSISTENT";
        case IBV_FLUSH_GLOBAL:
            return "GLOBAL";
        default:
            return "GLOBAL|PERSISTENT";
        }
    }
};

// Builds a plan operation by operation and works out what each durability
// point promises: a record or a commit is promised by the first point
// after it whose covered range contains it whole.
class PlanBuilder {
  public:
    explicit PlanBuilder(uint64_t seed) : seed_(seed) {}

    // A record at [off, off+len), after every earlier one, written by one op
    // per piece; `cuts` (inside (0, len), ascending) start new pieces.  The
    // last piece is of kind `last` (a WRITE, or a verb whose completion
    // itself promises durability); `after` is its ordering promise.
    size_t record(uint64_t off, uint64_t len, const std::vector<uint64_t> &cuts = {},
                  Kind last = Kind::kWrite, uint64_t after = 0) {
        uint64_t prev_end = p_.records.empty() ? kLogStart : end_of(p_.records.back());
        EXPECT_GE(off, prev_end) << "records are appended";
        EXPECT_GT(len, 0u);
        size_t r = p_.records.size();
        if (p_.image.size() < off + len) p_.image.resize(off + len, 0);
        rctest::fill_pattern(p_.image.data() + off, len, seed_ * 1000003 + r);
        for (uint64_t i = off; i < off + len; i++)
            if (p_.image[i] == 0) p_.image[i] = uint8_t(1 + i % 255);
        // Known before its ops are added, so that a last piece that is a
        // durability point covers its own record.
        p_.records.push_back(
            {off, len, uint32_t(p_.ops.size()), uint32_t(p_.ops.size() + cuts.size()), -1, after});
        pending_records_.push_back(r);
        hi_ = std::max(hi_, off + len);
        uint64_t at = 0;
        for (size_t c = 0; c <= cuts.size(); c++) {
            uint64_t to = c < cuts.size() ? cuts[c] : len;
            Op op{.kind = c < cuts.size() ? Kind::kWrite : last};
            op.off = off + at;
            op.len = to - at;
            op.record = int32_t(r);
            add(op);
            at = to;
        }
        return r;
    }

    void flush_range(uint64_t off, uint64_t len, uint8_t placement = IBV_FLUSH_PERSISTENT) {
        Op op{.kind = Kind::kFlushRange, .placement = placement, .off = off, .len = len};
        hi_ = std::max(hi_, off + len);
        add(op);
    }
    void flush_mr(uint8_t placement = IBV_FLUSH_PERSISTENT) {
        add(Op{.kind = Kind::kFlushMr, .placement = placement});
    }
    // ATOMIC WRITE of the commit word.
    void commit(uint64_t records) {
        Op op{.kind = Kind::kAtomicWrite};
        op.off = kCommitOff;
        op.len = 8;
        op.value = commit_word(records);
        op.commit = int32_t(p_.commits.size());
        p_.commits.push_back({uint32_t(p_.ops.size()), records, -1});
        pending_commits_.push_back(p_.commits.size() - 1);
        add(op);
    }

    // Records [0, n) are each promised by a point already added.
    uint64_t promised_prefix() const {
        uint64_t n = 0;
        while (n < p_.records.size() && p_.records[n].point >= 0)
            n++;
        return n;
    }
    const Plan &plan() const { return p_; }

    Plan finish() {
        // Room past the last record for ranges "covering more", and a tail no
        // operation writes.
        p_.mr_len = (std::max(hi_, p_.image.size()) + 4096 + 4095) & ~uint64_t(4095);
        p_.image.resize(p_.mr_len, 0);
        p_.promised_commit.assign(p_.points.size(), 0);
        uint64_t best = 0;
        for (size_t pt = 0; pt < p_.points.size(); pt++) {
            for (const Commit &c : p_.commits)
                if (c.point == int32_t(pt)) best = std::max(best, c.records);
            p_.promised_commit[pt] = best;
        }
        return std::move(p_);
    }

  private:
    static uint64_t end_of(const Record &r) { return r.off + r.len; }

    void add(Op op) {
        size_t i = p_.ops.size();
        const KindInfo &k = info(op.kind);
        if (k.point) op.point = int32_t(p_.points.size());
        p_.ops.push_back(op);
        if (!k.point) return;
        p_.points.push_back(uint32_t(i));
        uint64_t lo, hi;
        k.covers(op, lo, hi);
        auto resolve = [&](auto &pending, auto covered) {
            pending.erase(std::remove_if(pending.begin(), pending.end(), covered), pending.end());
        };
        resolve(pending_records_, [&](size_t r) {
            Record &rec = p_.records[r];
            if (rec.last_op > i || rec.off < lo || end_of(rec) > hi) return false;
            rec.point = op.point;
            return true;
        });
        resolve(pending_commits_, [&](size_t c) {
            if (kCommitOff < lo || kCommitOff + 8 > hi) return false;
            p_.commits[c].point = op.point;
            return true;
        });
    }

    uint64_t seed_;
    Plan p_;
    uint64_t hi_ = kLogStart;
    std::vector<size_t> pending_records_, pending_commits_;
};

struct Shape {
    unsigned records = 2000;
    uint64_t max_record = 65536;
    unsigned max_pieces = 4;     // WRITEs per record
    unsigned max_per_flush = 4;  // records one FLUSH may cover
    double flush_chance = 0.55;  // after each record
    double commit_chance = 0.35; // after each FLUSH of records
    uint8_t placement = IBV_FLUSH_PERSISTENT;
    // Records whose last piece is a write-commit instead of a WRITE (half of
    // them ordered: durable only after every record before them).
    double commit_record_chance = 0;
};

// Sizes spread evenly over orders of magnitude (1 B ... max), with extra
// weight on the largest ones.
inline uint64_t record_size(Rng &r, uint64_t max) {
    if (r.chance(0.08)) return max;
    if (r.chance(0.12)) return r.range(1, max);
    uint64_t top = uint64_t(1) << r.below(17);
    return std::min(max, r.range(1, top));
}

// The log-append-then-commit workload: records to fresh regions (some split
// into several WRITEs, some gaps left unwritten), FLUSHes covering exactly
// the pending records, covering more, or the whole MR, and now and then an
// ATOMIC WRITE of the commit word naming every record already flushed,
// followed (usually at once) by a FLUSH of the word.
inline Plan random_plan(uint64_t seed, const Shape &s) {
    Rng r(seed);
    PlanBuilder b(seed);
    uint64_t cur = kLogStart;
    std::vector<size_t> pending;
    for (unsigned i = 0; i < s.records; i++) {
        if (r.chance(0.15)) cur = (cur + 4095) & ~uint64_t(4095);
        if (r.chance(0.5)) cur += r.range(1, 300);
        uint64_t len = record_size(r, s.max_record);
        std::vector<uint64_t> cuts;
        if (len >= 2 && s.max_pieces > 1 && r.chance(0.3)) {
            uint64_t k = r.range(1, std::min<uint64_t>(s.max_pieces - 1, len - 1));
            while (cuts.size() < k) {
                uint64_t c = r.range(1, len - 1);
                if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
            }
            std::sort(cuts.begin(), cuts.end());
        }
        if (s.commit_record_chance > 0 && r.chance(s.commit_record_chance)) {
            bool ordered = r.chance(0.5);
            // An ordered commit promises: any byte of it durable => every
            // earlier record durable.  The promise covers the commit's own
            // bytes only, so an ordered record is that one write, uncut.
            size_t idx = b.plan().records.size();
            if (ordered) cuts.clear();
            b.record(cur, len, cuts, ordered ? Kind::kWriteCommitOrdered : Kind::kWriteCommit,
                     ordered ? idx : 0);
            cur += len;
            pending.clear(); // the commit covered them
            continue;
        }
        pending.push_back(b.record(cur, len, cuts));
        cur += len;
        bool last = i + 1 == s.records;
        if (!last && pending.size() < s.max_per_flush && !r.chance(s.flush_chance)) continue;

        const Record &first = b.plan().records[pending.front()];
        const Record &back = b.plan().records[pending.back()];
        uint64_t lo = first.off, hi = back.off + back.len;
        uint64_t pick = r.below(100);
        if (pick < 40) {
            b.flush_range(lo, hi - lo, s.placement);
        } else if (pick < 55) {
            for (size_t rec : pending) {
                const Record &x = b.plan().records[rec];
                b.flush_range(x.off, x.len, s.placement);
            }
        } else if (pick < 80) {
            uint64_t from = lo - r.below(std::min<uint64_t>(lo, 256 << 10) + 1);
            b.flush_range(from, hi + r.below(65537) - from, s.placement);
        } else {
            b.flush_mr(s.placement);
        }
        pending.clear();

        if (!last && !r.chance(s.commit_chance)) continue;
        b.commit(b.promised_prefix());
        // Sometimes the word is left for a later FLUSH to cover (one of the
        // whole MR, one reaching back to offset 0, or the next commit's).
        if (!last && r.chance(0.2)) continue;
        pick = r.below(100);
        if (pick < 50)
            b.flush_range(kCommitOff, 8, s.placement);
        else if (pick < 75)
            b.flush_range(kCommitOff, r.range(9, cur), s.placement);
        else
            b.flush_mr(s.placement);
    }
    b.flush_mr(s.placement);
    return b.finish();
}

// ---------------------------------------------------------------------------
// The checker

struct Report {
    static constexpr size_t kKeep = 12;
    uint64_t count = 0;
    std::vector<std::string> first;
    void add(std::string s) {
        if (first.size() < kKeep) first.push_back(std::move(s));
        count++;
    }
    std::string text() const {
        std::string s = strf("%" PRIu64 " violation(s)", count);
        for (const std::string &m : first)
            s += "\n  " + m;
        if (count > first.size()) s += "\n  ...";
        return s;
    }
};

struct PowerOff {
    uint64_t index; // n-th power-off of the run
    double t;       // seconds since the run started
    int64_t polled; // last point whose completion was polled before it (-1: none)
    uint64_t posted_points;
};

struct CheckStats {
    uint64_t images = 0;
    uint64_t torn_records = 0;  // part there, part not (a power-off mid-flush)
    uint64_t early_records = 0; // there before the completion promising them was polled
    uint64_t images_with_early = 0;
};

inline size_t first_nonzero(const uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        if (w) break;
    }
    for (; i < n; i++)
        if (p[i]) return i;
    return n;
}

class Checker {
  public:
    explicit Checker(const Plan &plan) : p_(plan), seen_full_(plan.records.size(), 0) {
        for (const Commit &c : plan.commits)
            commit_values_.push_back(c.records);
        std::sort(commit_values_.begin(), commit_values_.end());
    }

    void check(const std::vector<uint8_t> &img, const PowerOff &at, Report &rep) {
        stats.images++;
        std::string when = strf("power-off #%" PRIu64 " at %.3f s (after %s was polled; %" PRIu64
                                " of %zu points posted)",
                                at.index, at.t, p_.point_desc(at.polled).c_str(), at.posted_points,
                                p_.points.size());
        if (img.size() != p_.mr_len) {
            rep.add(when + strf(": image is %zu bytes, the MR %" PRIu64, img.size(), p_.mr_len));
            return;
        }
        const uint8_t *s = img.data();
        const uint8_t *e = p_.image.data();

        // The commit word.
        uint64_t w;
        std::memcpy(&w, s + kCommitOff, 8);
        uint64_t named = 0;
        if (w != 0) {
            named = w >> 32;
            if (uint32_t(w) != kCommitTag ||
                !std::binary_search(commit_values_.begin(), commit_values_.end(), named)) {
                rep.add(when + strf(": the commit word holds 0x%016" PRIx64
                                    ", which no ATOMIC WRITE of the plan wrote",
                                    w));
                named = 0;
            }
        }
        uint64_t promised = at.polled >= 0 ? p_.promised_commit[size_t(at.polled)] : 0;
        if (named < promised) {
            const Commit &c = *std::find_if(p_.commits.begin(), p_.commits.end(),
                                            [&](const Commit &x) { return x.records == promised; });
            rep.add(when + strf(": the commit word names %" PRIu64 " records, but %s was "
                                "promised durable by polled %s",
                                named, p_.op_desc(c.op).c_str(), p_.point_desc(c.point).c_str()));
        }
        if (named < max_named_)
            rep.add(when + strf(": the commit word went back from %" PRIu64 " records (an "
                                "earlier power-off) to %" PRIu64,
                                max_named_, named));
        max_named_ = std::max(max_named_, named);
        if (named > p_.records.size()) named = p_.records.size();

        // Records, and the unwritten bytes before and between them.
        uint64_t gap_from = kCommitOff + 8;
        uint64_t early = 0;
        uint64_t full_prefix = 0; // records [0, full_prefix) are all complete
        for (size_t r = 0; r < p_.records.size(); r++) {
            const Record &rec = p_.records[r];
            check_unwritten(s, gap_from, rec.off, when, rep);
            gap_from = rec.off + rec.len;

            bool full = std::memcmp(s + rec.off, e + rec.off, rec.len) == 0;
            bool promised_here = rec.point >= 0 && rec.point <= at.polled;
            if (rec.after > full_prefix && (full || first_nonzero(s + rec.off, rec.len) != rec.len))
                rep.add(when + strf(": %s is (partly) durable, but record %" PRIu64
                                    " is not, and it was ordered after records [0, %" PRIu64 ")",
                                    p_.record_desc(r).c_str(), full_prefix, rec.after));
            if (full) {
                seen_full_[r] = 1;
                if (!promised_here) early++;
                if (full_prefix == r) full_prefix++;
                continue;
            }
            // Every byte is zero or its own value; anything else came from
            // nowhere.
            size_t zero = 0, bad = rec.len;
            for (size_t i = 0; i < rec.len; i++) {
                uint8_t b = s[rec.off + i];
                if (b == 0)
                    zero++;
                else if (b != e[rec.off + i] && bad == rec.len)
                    bad = i;
            }
            if (bad != rec.len)
                rep.add(when + strf(": %s byte %zu (MR offset 0x%" PRIx64 ") is 0x%02x, which is "
                                    "neither its value 0x%02x nor zero",
                                    p_.record_desc(r).c_str(), bad, rec.off + bad, s[rec.off + bad],
                                    e[rec.off + bad]));
            if (zero != rec.len) stats.torn_records++;

            std::string why;
            if (promised_here)
                why = "durability was promised by polled " + p_.point_desc(rec.point);
            else if (r < named)
                why = strf("the commit word in the same image names %" PRIu64 " records", named);
            else if (seen_full_[r])
                why = "an earlier power-off had it complete (durable data was lost)";
            if (why.empty()) continue;
            size_t i = 0;
            while (s[rec.off + i] == e[rec.off + i])
                i++;
            rep.add(when +
                    strf(": %s is not durable: byte %zu (MR offset 0x%" PRIx64
                         ") is 0x%02x, expected 0x%02x (%zu of its bytes are "
                         "still zero); ",
                         p_.record_desc(r).c_str(), i, rec.off + i, s[rec.off + i], e[rec.off + i],
                         zero) +
                    why);
        }
        check_unwritten(s, gap_from, p_.mr_len, when, rep);
        stats.early_records += early;
        if (early) stats.images_with_early++;
    }

    CheckStats stats;

  private:
    void check_unwritten(const uint8_t *s, uint64_t from, uint64_t to, const std::string &when,
                         Report &rep) {
        if (to <= from) return;
        size_t i = first_nonzero(s + from, to - from);
        if (i == to - from) return;
        rep.add(when + strf(": MR offset 0x%" PRIx64 ", which no operation wrote, is 0x%02x "
                            "(unwritten span [0x%" PRIx64 ", 0x%" PRIx64 "))",
                            from + i, s[from + i], from, to));
    }

    const Plan &p_;
    std::vector<uint64_t> commit_values_;
    std::vector<uint8_t> seen_full_;
    uint64_t max_named_ = 0;
};

// The target MR: a shared mapping of a file on /var/tmp (ext4), which the
// engine classifies as durable through msync.
using rctest::FileMr;

// ---------------------------------------------------------------------------
// Running a plan

inline constexpr unsigned kFlushAccess = IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT;

struct RunOpts {
    uint64_t seed = 1;      // batching and power-off times
    unsigned gap_us = 1000; // power-offs come at random intervals up to this
    unsigned window = 6;    // durability points in flight at most
    uint32_t send_wr = 128; // send queue depth
    // Transport timeout exponent (4.096 us << n).  A FLUSH of a file-backed
    // MR runs msync on the target's progress thread, which answers nothing
    // meanwhile; on a loaded host one msync has been seen to take 200 ms,
    // so the requester must ride that out without exhausting retry_cnt.
    uint8_t timeout = 16;
    size_t stop_before = SIZE_MAX; // post ops [0, stop_before) only (must end with a point)
    // The final image is checked as if this point had been polled: a claim
    // beyond what completed is how a test proves the checker bites.
    int64_t claim = -2; // -2: the truth
    // The plan the checker believes, when it must differ from the one
    // executed (a negative control); nullptr: the executed plan.
    const Plan *believed = nullptr;
    bool native_commit = false; // declare the peer's native write-commit
    unsigned target_access = rctest::kAllAccess | kFlushAccess; // of the target MR
    Clock::duration stall = 30s; // no completion for this long fails the run
    uint64_t min_power_offs = 0; // posting waits for power-offs to keep up
};

struct RunResult {
    Report during; // violations found by power-offs while traffic ran
    Report final;  // and by the last one, after every completion
    CheckStats check;
    DomainStats domain;
    uint64_t ops = 0, points = 0, power_offs = 0, inflight_power_offs = 0;
    uint64_t mid_flush_power_offs = 0;
    uint64_t by_kind[std::size(kKinds)] = {};
    double seconds = 0;

    uint64_t violations() const { return during.count + final.count; }
    std::string summary(const Plan &plan) const {
        uint64_t bytes = 0;
        for (const Record &r : plan.records)
            bytes += r.len;
        std::string kinds;
        for (size_t k = 0; k < std::size(kKinds); k++)
            kinds += strf("%s%" PRIu64 " %s", k ? ", " : "", by_kind[k], kKinds[k].name);
        return strf("%zu records (%.1f MiB in a %.1f MiB MR), %" PRIu64 " ops (%s), %" PRIu64
                    " durability points; %" PRIu64 " power-offs (%" PRIu64
                    " with points in flight, %" PRIu64 " in the middle of a flush, %" PRIu64
                    " with records durable before their completion, %" PRIu64
                    " torn records seen); hook: %" PRIu64 " ranges, %.1f MiB, %" PRIu64
                    " fences; %.2f s",
                    plan.records.size(), double(bytes) / 1048576, double(plan.mr_len) / 1048576,
                    ops, kinds.c_str(), points, power_offs, inflight_power_offs,
                    mid_flush_power_offs, check.images_with_early, check.torn_records,
                    domain.ranges, double(domain.bytes) / 1048576, domain.fences, seconds);
    }
};

// Runs `plan` through `ini` while a second thread powers the domain off at
// random moments and checks each image against what had been promised.
// `target` is the target's memory (plan.mr_len bytes), which the domain
// shadows.  Completions must come in posting order (one send queue), so
// "which durability points were polled" is one number: the last polled.
//
// The initiator is any type with
//   size_t post(const Plan &, size_t first, size_t n, std::string &failure)
//       posts ops [first, first+n) (a point signaled, the rest not) and
//       returns how many it could (the rest wait for room);
//   int poll(uint64_t *ids, int max, std::string &failure)
//       returns the op indices of up to `max` completed points (-1: failed).
// so the same workload and checks run through verbs or through libfabric.
template <class Initiator>
void drive_plan(Domain &dom, Initiator &ini, const uint8_t *target, const Plan &plan,
                const RunOpts &o, RunResult &res) {
    const Plan &believed = o.believed ? *o.believed : plan;
    Checker checker(believed);
    size_t end = std::min(o.stop_before, plan.ops.size());
    size_t npoints = 0;
    for (size_t i = 0; i < end; i++)
        if (info(plan.ops[i].kind).point) npoints++;
    if (end > 0) {
        ASSERT_TRUE(info(plan.ops[end - 1].kind).point)
            << "a run must end with a durability point, or its last WQEs never report";
    }

    dom.attach(target, plan.mr_len);
    auto t0 = Clock::now();
    std::atomic<int64_t> polled{-1};
    std::atomic<uint64_t> posted_points{0};
    std::atomic<bool> done{false};
    std::atomic<uint64_t> powered{0}; // power-offs checked so far
    auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

    std::thread power([&] {
        Rng r(o.seed ^ 0x5EED0FF5EED0FFull);
        std::vector<uint8_t> img;
        while (!done.load(std::memory_order_acquire)) {
            std::this_thread::sleep_for(std::chrono::microseconds(r.below(o.gap_us + 1)));
            // A quarter of the power-offs aim at the middle of a flush.
            if (r.chance(0.25)) {
                auto until = Clock::now() + 5ms;
                while (!dom.copying() && Clock::now() < until &&
                       !done.load(std::memory_order_relaxed))
                    std::this_thread::yield();
            }
            // The polled state is read first: whatever it names was
            // acknowledged, and so reported to the hook, before the image.
            PowerOff at{res.power_offs++, 0, polled.load(std::memory_order_acquire),
                        posted_points.load(std::memory_order_acquire)};
            if (dom.power_off(img)) res.mid_flush_power_offs++;
            at.t = seconds();
            if (at.posted_points > uint64_t(at.polled + 1)) res.inflight_power_offs++;
            checker.check(img, at, res.during);
            powered.fetch_add(1, std::memory_order_relaxed);
        }
    });

    Rng r(o.seed);
    size_t next = 0, retired = 0; // ops posted; ops known done (up to the last polled point)
    int64_t last = -1;
    auto progress = Clock::now();
    std::string failure;
    while (size_t(last + 1) < npoints) {
        // Post a batch of 1-8 ops, as far as the queue and the window allow.
        bool busy = false;
        // Hold back while power-offs lag behind the plan, so a slow host or
        // a sanitizer build still spreads min_power_offs over the run.
        bool paced = powered.load(std::memory_order_relaxed) * end < o.min_power_offs * next;
        if (paced) progress = Clock::now();
        if (next < end && !paced) {
            size_t batch = std::min<size_t>(r.range(1, 8), end - next);
            size_t n = 0;
            uint64_t pts = posted_points.load(std::memory_order_relaxed);
            while (n < batch && next + n - retired < o.send_wr - 1 &&
                   pts - uint64_t(last + 1) < o.window) {
                if (info(plan.ops[next + n].kind).point) pts++;
                n++;
            }
            if (n > 0) {
                size_t posted = ini.post(plan, next, n, failure);
                if (!failure.empty()) break;
                // Only the points actually posted are in flight.
                pts = posted_points.load(std::memory_order_relaxed);
                for (size_t i = next; i < next + posted; i++) {
                    res.by_kind[size_t(plan.ops[i].kind)]++;
                    if (info(plan.ops[i].kind).point) pts++;
                }
                next += posted;
                res.ops = next;
                busy = posted > 0;
                posted_points.store(pts, std::memory_order_release);
            }
        }
        uint64_t ids[16];
        int k = ini.poll(ids, 16, failure);
        if (k < 0) {
            // What was outstanding tells a transport failure's cause.
            failure += strf("; %.3f s into the run, %zu ops posted, from op %zu on:", seconds(),
                            next, retired);
            for (size_t i = retired; i < next; i++)
                failure += strf(" %s", info(plan.ops[i].kind).name);
            break;
        }
        for (int i = 0; i < k && failure.empty(); i++) {
            const Op *op = ids[i] < end ? &plan.ops[ids[i]] : nullptr;
            if (!op || op->point != last + 1)
                failure = strf("completion for op %" PRIu64 " while point #%" PRId64
                               " was the next expected",
                               ids[i], last + 1);
            else {
                last = op->point;
                retired = size_t(ids[i]) + 1;
                polled.store(last, std::memory_order_release);
            }
        }
        if (!failure.empty()) break;
        if (k > 0) {
            progress = Clock::now();
        } else if (Clock::now() - progress > o.stall) {
            failure = strf("no completion for %.0f s; %" PRId64 " of %zu points polled, %zu ops "
                           "posted",
                           std::chrono::duration<double>(o.stall).count(), last + 1, npoints, next);
            break;
        } else if (!busy) {
            std::this_thread::sleep_for(20us);
        }
    }
    done.store(true, std::memory_order_release);
    power.join();
    res.points = uint64_t(last + 1);
    res.seconds = seconds();
    EXPECT_EQ(failure, "");

    // The last power-off: after everything completed (or as claimed).
    std::vector<uint8_t> img;
    dom.power_off(img);
    PowerOff at{res.power_offs++, seconds(), o.claim == -2 ? last : o.claim, posted_points.load()};
    checker.check(img, at, res.final);
    res.check = checker.stats;
    res.domain = dom.stats();
    dom.detach();
}

// The verbs initiator: one QP's ibv_wr_* batch per post, its send CQ.
struct VerbsInitiator {
    Target t;
    ibv_cq *scq;

    size_t post(const Plan &plan, size_t first, size_t n, std::string &failure) {
        ibv_wr_start(t.q);
        for (size_t i = first; i < first + n; i++) {
            const Op &op = plan.ops[i];
            const KindInfo &k = info(op.kind);
            t.q->wr_id = i;
            t.q->wr_flags = k.point ? IBV_SEND_SIGNALED : 0;
            k.post(t, op);
        }
        int rc = ibv_wr_complete(t.q);
        if (rc)
            failure = strf("ibv_wr_complete of ops #%zu..#%zu: %s", first, first + n - 1,
                           std::strerror(rc));
        return rc ? 0 : n;
    }
    int poll(uint64_t *ids, int max, std::string &failure) {
        ibv_wc wc[16];
        int k = ibv_poll_cq(scq, std::min(max, 16), wc);
        if (k < 0) {
            failure = strf("ibv_poll_cq: %d", k);
            return -1;
        }
        for (int i = 0; i < k; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) {
                failure = strf("op %" PRIu64 " completed with %s", wc[i].wr_id,
                               ibv_wc_status_str(wc[i].status));
                return -1;
            }
            ids[i] = wc[i].wr_id;
        }
        return k;
    }
};

// Posts `plan` on a fresh RC pair (initiator on ctx_a, target on ctx_b)
// through verbs (drive_plan).
inline void run_plan(Domain &dom, ibv_context *ctx_a, ibv_context *ctx_b, const Plan &plan,
                     const RunOpts &o, RunResult &res) {
    rctest::Pair pair;
    rctest::PairOpts po;
    po.qp_ex = true;
    po.sq_sig_all = false;
    po.send_wr = o.send_wr;
    po.timeout = o.timeout;
    po.b_access = rctest::kAllAccess | kFlushAccess;
    po.extra_send_ops = IBV_QP_EX_WITH_RDMA_WRITE_COMMIT;
    ASSERT_NO_FATAL_FAILURE(pair.setup(ctx_a, ctx_b, po));
    if (o.native_commit) {
        ASSERT_EQ(ibv_qp_set_commit_peer(pair.a.qp, IBV_COMMIT_CAP_NATIVE), 0);
    }

    auto *src = const_cast<uint8_t *>(plan.image.data());
    ibv_mr *smr = ibv_reg_mr(pair.a.pd, src, plan.image.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(smr, nullptr) << std::strerror(errno);
    struct Dereg {
        ibv_mr *m;
        ~Dereg() { ibv_dereg_mr(m); }
    } smr_guard{smr};
    FileMr dst(plan.mr_len);
    ASSERT_NE(dst.data(), nullptr) << "mapping a file on /var/tmp: " << std::strerror(errno);
    ASSERT_NE(dst.reg(pair.b.pd, o.target_access), nullptr)
        << "registering the file-backed MR: " << std::strerror(errno);

    Target t{pair.a.qpx, smr->lkey, uint64_t(uintptr_t(src)), dst.mr()->rkey,
             uint64_t(uintptr_t(dst.data()))};
    VerbsInitiator ini{t, pair.a.scq};
    drive_plan(dom, ini, dst.data(), plan, o, res);
}

} // namespace crash
