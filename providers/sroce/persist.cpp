// SPDX-License-Identifier: MIT
#include "persist.hpp"

#include "provider.h"

#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <libpmem.h>
#include <linux/magic.h>
#include <mutex>
#include <string>
#include <string_view>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace sroce {
namespace {

// Read on every persist, so it must cost one load when no hook is installed
// (the normal case).  ctx is published before the hook (release/acquire): a
// reader that sees a hook also sees the ctx installed with it.
std::atomic<PersistHook> g_hook{nullptr};
std::atomic<void *> g_hook_ctx{nullptr};

inline void report(const void *addr, size_t len) {
    PersistHook hook = g_hook.load(std::memory_order_acquire);
    if (hook != nullptr) [[unlikely]]
        hook(g_hook_ctx.load(std::memory_order_relaxed), addr, len);
}

std::atomic<MapsLookup> g_lookup{MapsLookup::kQueryWhenAvailable};

// One mapping of this process, as far as classification needs it.
struct Mapping {
    uintptr_t lo = 0, hi = 0;
    bool shared = false;
    unsigned long ino = 0;
    bool dev_known = false; // /proc/self/maps shows the device in a form stat cannot be held to
    dev_t dev = 0;
    std::string_view path; // may be empty, "[heap]", or end in " (deleted)"
};

// PROCMAP_QUERY (Linux 6.11): the kernel finds the mapping covering one
// address itself, where reading /proc/self/maps formats every mapping
// below it - milliseconds in a sanitized process with thousands of them.
// Spelled out here because the headers this builds against may predate it;
// the kernel tells the layout apart by `size`.
struct ProcmapQuery {
    uint64_t size;
    uint64_t query_flags;
    uint64_t query_addr;
    uint64_t vma_start;
    uint64_t vma_end;
    uint64_t vma_flags;
    uint64_t vma_page_size;
    uint64_t vma_offset;
    uint64_t inode;
    uint32_t dev_major;
    uint32_t dev_minor;
    uint32_t vma_name_size;
    uint32_t build_id_size;
    uint64_t vma_name_addr;
    uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kProcmapVmaShared = 0x08;

template <typename T>
bool parse_num(std::string_view &s, T &out, int base) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
    if (ec != std::errc() || p == s.data()) return false;
    s.remove_prefix(size_t(p - s.data()));
    return true;
}

bool eat(std::string_view &s, char c) {
    if (s.empty() || s.front() != c) return false;
    s.remove_prefix(1);
    return true;
}

// "lo-hi perms offset major:minor inode   path".  A line we need and cannot read
// makes the caller give up, never guess: vouching for durability needs certainty.
// The range first, and the rest only for a line the caller looks at: most
// of a process's mappings lie below the memory being registered.
bool parse_maps_range(std::string_view &s, Mapping &m) {
    return parse_num(s, m.lo, 16) && eat(s, '-') && parse_num(s, m.hi, 16) && eat(s, ' ') &&
           m.lo < m.hi;
}

bool parse_maps_rest(std::string_view s, Mapping &m) {
    unsigned long long off;
    unsigned major, minor;
    if (s.size() < 5 || s[4] != ' ') return false;
    m.shared = s[3] == 's';
    s.remove_prefix(5);
    if (!parse_num(s, off, 16) || !eat(s, ' ') || !parse_num(s, major, 16) || !eat(s, ':') ||
        !parse_num(s, minor, 16) || !eat(s, ' ') || !parse_num(s, m.ino, 10))
        return false;
    size_t start = s.find_first_not_of(' ');
    m.path = start == std::string_view::npos ? std::string_view() : s.substr(start);
    return true;
}

// Filesystems whose files live in RAM (or are not files at all): msync on
// them returns success without anything reaching storage.
bool memory_filesystem(uint32_t magic) {
    switch (magic) {
    case TMPFS_MAGIC: // also devtmpfs, and shmem behind /dev/shm and memfd
    case RAMFS_MAGIC:
    case HUGETLBFS_MAGIC:
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case BPF_FS_MAGIC:
    case DEVPTS_SUPER_MAGIC:
    case ANON_INODE_FS_MAGIC:
    case SECRETMEM_MAGIC:
        return true;
    default:
        return false;
    }
}

// Whether msync on this mapping puts its bytes on storage.  The kernel shows
// a path, not the file; the path is trusted only while it still names the
// mapped inode, so a renamed-over or unreachable (other mount namespace)
// path makes the mapping volatile rather than borrowing another file's
// filesystem.
bool durable_file_mapping(const Mapping &m) {
    constexpr std::string_view kDeleted = " (deleted)";
    if (!m.shared || m.path.empty() || m.path.front() != '/' || m.path.ends_with(kDeleted))
        return false;
    std::string path(m.path);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != m.ino ||
        (m.dev_known && st.st_dev != m.dev))
        return false;
    struct statfs fs;
    if (::statfs(path.c_str(), &fs) != 0) return false;
    return !memory_filesystem(uint32_t(fs.f_type));
}

enum class Covered { kYes, kNo, kCannotAsk };

// covered_by_durable_files() with one PROCMAP_QUERY per mapping in the
// range; kCannotAsk where the kernel has no such query.
Covered query_durable_files(int maps_fd, uintptr_t begin, uintptr_t end) {
    char name[PATH_MAX];
    for (uintptr_t next = begin; next < end;) {
        ProcmapQuery q{};
        q.size = sizeof q;
        q.query_addr = next; // the mapping covering it, none other
        q.vma_name_size = sizeof name;
        q.vma_name_addr = reinterpret_cast<uintptr_t>(name);
        if (ioctl(maps_fd, kProcmapQuery, &q) < 0)
            return errno == ENOTTY || errno == EINVAL || errno == EOPNOTSUPP ? Covered::kCannotAsk
                                                                             : Covered::kNo;
        Mapping m;
        m.lo = q.vma_start;
        m.hi = q.vma_end;
        m.shared = q.vma_flags & kProcmapVmaShared;
        m.ino = q.inode;
        m.dev_known = true;
        m.dev = makedev(q.dev_major, q.dev_minor);
        if (q.vma_name_size > 0) m.path = std::string_view(name, strnlen(name, q.vma_name_size));
        if (m.lo > next || m.hi <= next || !durable_file_mapping(m)) return Covered::kNo;
        next = m.hi;
    }
    return Covered::kYes;
}

// True when [begin, end) is covered, without holes, by durable file mappings.
// /proc/self/maps is sorted by address, so one pass suffices.
bool read_durable_files(uintptr_t begin, uintptr_t end) {
    std::ifstream maps("/proc/self/maps");
    if (!maps) return false;
    std::string line;
    uintptr_t next = begin; // first byte not yet known to be durable
    while (std::getline(maps, line)) {
        Mapping m;
        std::string_view s = line;
        if (!parse_maps_range(s, m)) return false;
        if (m.hi <= next) continue;
        if (m.lo > next || !parse_maps_rest(s, m) || !durable_file_mapping(m)) return false;
        next = m.hi;
        if (next >= end) return true;
    }
    return false;
}

// /proc/self/maps kept open for PROCMAP_QUERY: opening it (a path walk
// through procfs) cost more than the query itself, on every registration.
// The descriptor is the library's only while it still names this process's
// maps: a child of fork() inherits its parent's (which answers for the
// parent's memory), and an application may close every descriptor it did
// not open and reuse the number.
class MapsFile {
  public:
    // A descriptor of this process's /proc/self/maps, or -1.  Caller holds mu.
    int get() {
        pid_t pid = getpid();
        struct stat st;
        if (fd_ >= 0 && pid == pid_ && fstat(fd_, &st) == 0 && st.st_dev == dev_ &&
            st.st_ino == ino_)
            return fd_;
        if (fd_ >= 0 && pid != pid_) ::close(fd_); // inherited: ours, but the parent's maps
        fd_ = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
        if (fd_ < 0 || fstat(fd_, &st) != 0) {
            if (fd_ >= 0) ::close(fd_);
            fd_ = -1;
            return -1;
        }
        pid_ = pid;
        dev_ = st.st_dev;
        ino_ = st.st_ino;
        return fd_;
    }

    std::mutex mu; // guards the descriptor while a query uses it

  private:
    int fd_ = -1;
    pid_t pid_ = 0;
    dev_t dev_ = 0;
    ino_t ino_ = 0;
};

// Never destroyed: a registration may run while the process exits.
MapsFile &maps_file() {
    static auto *m = new MapsFile;
    return *m;
}

bool covered_by_durable_files(uintptr_t begin, uintptr_t end) {
    MapsLookup how = g_lookup.load(std::memory_order_relaxed);
    if (how != MapsLookup::kReadMaps) {
        MapsFile &maps = maps_file();
        Covered c;
        // Held elsewhere (a registration in another thread, or one in the
        // parent at fork(), which leaves it held for good): a descriptor of
        // its own.
        if (std::unique_lock<std::mutex> g(maps.mu, std::try_to_lock); g.owns_lock()) {
            int fd = maps.get();
            c = fd < 0 ? Covered::kCannotAsk : query_durable_files(fd, begin, end);
        } else {
            int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
            c = fd < 0 ? Covered::kCannotAsk : query_durable_files(fd, begin, end);
            if (fd >= 0) ::close(fd);
        }
        if (c != Covered::kCannotAsk || how == MapsLookup::kQueryOnly) return c == Covered::kYes;
    }
    return read_durable_files(begin, end);
}

} // namespace

void set_maps_lookup(MapsLookup how) {
    g_lookup.store(how, std::memory_order_relaxed);
}

bool maps_query_available() {
    int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = reinterpret_cast<uintptr_t>(&g_lookup);
    bool ok = ioctl(fd, kProcmapQuery, &q) == 0;
    ::close(fd);
    return ok;
}

const char *mem_class_name(MemClass c) {
    switch (c) {
    case MemClass::kVolatile:
        return "volatile";
    case MemClass::kFile:
        return "file";
    case MemClass::kPmem:
        return "pmem";
    }
    return "?";
}

MemClass classify_memory(const void *addr, size_t len) {
    auto begin = reinterpret_cast<uintptr_t>(addr);
    if (len == 0 || len > UINTPTR_MAX - begin) return MemClass::kVolatile;
    if (pmem_is_pmem(addr, len)) return MemClass::kPmem;
    return covered_by_durable_files(begin, begin + len) ? MemClass::kFile : MemClass::kVolatile;
}

int persist_range(MemClass cls, const void *addr, size_t len) {
    switch (len == 0 ? MemClass::kVolatile : cls) {
    case MemClass::kPmem:
        pmem_persist(addr, len);
        break;
    case MemClass::kFile:
        // msync writes back what is in the page cache; non-temporal stores
        // may still sit in write-combining buffers, which entering the kernel
        // does not drain.
        pmem_drain();
        if (pmem_msync(addr, len) != 0) return errno != 0 ? errno : EIO;
        break;
    case MemClass::kVolatile:
        pmem_drain();
        break;
    }
    report(addr, len);
    return 0;
}

void visibility_fence() {
    // pmem_drain is the store fence libpmem pairs with its own non-temporal
    // copies (sfence on x86, dmb ishst on ARM), and it is an opaque call, so
    // the compiler cannot move stores across it either.
    pmem_drain();
    report(nullptr, 0);
}

void copy_nontemporal(void *dst, const void *src, size_t len) {
    pmem_memcpy(dst, src, len, PMEM_F_MEM_NONTEMPORAL | PMEM_F_MEM_NODRAIN);
}

void set_persist_hook(PersistHook hook, void *ctx) {
    // Clearing first means a reader that sees the new hook sees the new ctx.
    // One that loaded the old hook just before may still read the new ctx,
    // which is why the hook is only changed while no traffic runs.
    g_hook.store(nullptr, std::memory_order_release);
    g_hook_ctx.store(ctx, std::memory_order_relaxed);
    g_hook.store(hook, std::memory_order_release);
}

} // namespace sroce

extern "C" __attribute__((visibility("default"))) void
sroce_set_persist_hook(void (*hook)(void *ctx, const void *addr, size_t len), void *ctx) {
    sroce::set_persist_hook(hook, ctx);
}
