// SPDX-License-Identifier: MIT
//
// Helpers for tests of the persistence verbs: a log of what the engine made
// durable (through its test persistence hook) and file-backed memory regions.
#pragma once

#include "rc_pair.hpp"

#include <fcntl.h>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

extern "C" void sroce_set_persist_hook(void (*hook)(void *ctx, const void *addr, size_t len),
                                       void *ctx);

namespace rctest {

// Every range the engine made durable, with a probe taken at that moment.
struct PersistLog {
    struct Event {
        uintptr_t lo, hi;
        uint64_t probe; // the word at `probe_at` when this range was persisted
    };
    std::mutex mu;
    std::vector<Event> events;
    const uint64_t *probe_at = nullptr;

    static void hook(void *ctx, const void *addr, size_t len) {
        auto *l = static_cast<PersistLog *>(ctx);
        if (!addr || !len) return; // a bare fence
        std::lock_guard<std::mutex> g(l->mu);
        uint64_t probe = l->probe_at ? __atomic_load_n(l->probe_at, __ATOMIC_ACQUIRE) : 0;
        l->events.push_back({uintptr_t(addr), uintptr_t(addr) + len, probe});
    }
    void clear() {
        std::lock_guard<std::mutex> g(mu);
        events.clear();
    }
    // True when [p, p+n) lies within the union of the persisted ranges.
    bool covers(const void *p, size_t n) {
        std::lock_guard<std::mutex> g(mu);
        uintptr_t lo = uintptr_t(p), hi = lo + n;
        while (lo < hi) {
            uintptr_t best = lo;
            for (const Event &e : events)
                if (e.lo <= lo && e.hi > best) best = e.hi;
            if (best == lo) return false;
            lo = best;
        }
        return true;
    }
    bool touches(const void *p, size_t n) {
        std::lock_guard<std::mutex> g(mu);
        uintptr_t lo = uintptr_t(p), hi = lo + n;
        for (const Event &e : events)
            if (e.lo < hi && e.hi > lo) return true;
        return false;
    }
};

// A shared mapping of a file on /var/tmp (ext4 here): memory FLUSH and
// commits can make durable, and whose file shows what reached it.  `dir`
// picks another filesystem (/dev/shm: tmpfs, volatile).
class FileMr {
  public:
    explicit FileMr(size_t len, const char *dir = "/var/tmp") : len_(len) {
        std::string tmpl = std::string(dir) + "/sroce-test-XXXXXX";
        fd_ = mkstemp(tmpl.data());
        if (fd_ < 0) return;
        // Kept until the end: a deleted file is memory nothing can recover.
        path_ = tmpl;
        if (ftruncate(fd_, off_t(len)) != 0) return;
        void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
        if (p != MAP_FAILED) mem_ = static_cast<uint8_t *>(p);
    }
    FileMr(ibv_pd *pd, size_t len, unsigned access) : FileMr(len) {
        if (mem_) reg(pd, access);
    }
    ~FileMr() {
        if (mr_) ibv_dereg_mr(mr_);
        if (mem_) munmap(mem_, len_);
        if (fd_ >= 0) close(fd_);
        if (!path_.empty()) unlink(path_.c_str());
    }
    FileMr(const FileMr &) = delete;
    FileMr &operator=(const FileMr &) = delete;

    ibv_mr *reg(ibv_pd *pd, unsigned access) {
        mr_ = ibv_reg_mr(pd, mem_, len_, int(access));
        return mr_;
    }
    bool ok() const { return mr_ != nullptr; }
    uint8_t *data() { return mem_; }
    uint64_t addr(size_t off = 0) const { return uint64_t(uintptr_t(mem_ + off)); }
    ibv_mr *mr() const { return mr_; }
    uint32_t rkey() const { return mr_->rkey; }
    // What the file holds, read through the descriptor, not the mapping.
    std::vector<uint8_t> file_bytes(size_t off, size_t n) const {
        std::vector<uint8_t> v(n);
        EXPECT_EQ(pread(fd_, v.data(), n, off_t(off)), ssize_t(n));
        return v;
    }

  private:
    std::string path_;
    int fd_ = -1;
    size_t len_;
    uint8_t *mem_ = nullptr;
    ibv_mr *mr_ = nullptr;
};

} // namespace rctest
