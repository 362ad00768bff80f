// SPDX-License-Identifier: MIT
// Target-side persistence: memory classification, durability per class,
// non-temporal placement and the test persistence domain hook.
#include "persist.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <libpmem.h>
#include <linux/magic.h>
#include <memory>
#include <ostream>
#include <string>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>
#include <vector>

using sroce::MemClass;

namespace sroce {
void PrintTo(MemClass c, std::ostream *os) {
    *os << mem_class_name(c);
}
} // namespace sroce

namespace {

// On this machine /var/tmp is ext4 (storage) and /dev/shm is tmpfs.
constexpr const char *kDiskDir = "/var/tmp";
constexpr const char *kShmDir = "/dev/shm";

size_t page() {
    static const size_t p = size_t(::sysconf(_SC_PAGESIZE));
    return p;
}

uint8_t pattern(size_t i, unsigned seed) {
    return uint8_t(i * 131 + (i >> 8) * 7 + seed);
}

bool memory_fs(const char *dir) {
    struct statfs fs;
    if (::statfs(dir, &fs) != 0) return true;
    return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

// A scratch file of `size` bytes, removed (if still there) on destruction.
class TempFile {
  public:
    TempFile(const char *dir, size_t size) {
        path_ = std::string(dir) + "/sroce-persist-XXXXXX";
        fd_ = ::mkstemp(path_.data());
        if (fd_ < 0 || ::ftruncate(fd_, off_t(size)) != 0)
            ADD_FAILURE() << "temp file in " << dir << ": " << std::strerror(errno);
    }
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        ::unlink(path_.c_str());
    }
    TempFile(const TempFile &) = delete;
    TempFile &operator=(const TempFile &) = delete;

    int fd() const { return fd_; }
    const std::string &path() const { return path_; }

    // The file's bytes as another reader sees them: a fresh descriptor and
    // read(2), not the mapping under test.
    std::vector<uint8_t> read_back(size_t len) const {
        std::vector<uint8_t> out(len);
        int fd = ::open(path_.c_str(), O_RDONLY);
        EXPECT_GE(fd, 0) << std::strerror(errno);
        size_t got = 0;
        while (fd >= 0 && got < len) {
            ssize_t n = ::pread(fd, out.data() + got, len - got, off_t(got));
            if (n <= 0) break;
            got += size_t(n);
        }
        EXPECT_EQ(got, len);
        if (fd >= 0) ::close(fd);
        return out;
    }

  private:
    std::string path_;
    int fd_ = -1;
};

// An mmap'd range unmapped on destruction.
class Mapping {
  public:
    Mapping() = default;
    Mapping(void *addr, size_t len) : addr_(addr == MAP_FAILED ? nullptr : addr), len_(len) {
        if (addr == MAP_FAILED) ADD_FAILURE() << "mmap: " << std::strerror(errno);
    }
    ~Mapping() {
        if (addr_) ::munmap(addr_, len_);
    }
    Mapping(Mapping &&o) noexcept
        : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
    Mapping &operator=(Mapping &&) = delete;

    uint8_t *get() const { return static_cast<uint8_t *>(addr_); }
    size_t size() const { return len_; }

  private:
    void *addr_ = nullptr;
    size_t len_ = 0;
};

Mapping map_anon(size_t len, int share = MAP_PRIVATE) {
    return {::mmap(nullptr, len, PROT_READ | PROT_WRITE, share | MAP_ANONYMOUS, -1, 0), len};
}

Mapping map_file(const TempFile &f, size_t len, int share = MAP_SHARED, off_t off = 0) {
    return {::mmap(nullptr, len, PROT_READ | PROT_WRITE, share, f.fd(), off), len};
}

// Maps `f` over part of a reservation owned by someone else (MAP_FIXED).
void map_file_at(uint8_t *at, const TempFile &f, size_t len, off_t off = 0) {
    void *p = ::mmap(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, f.fd(), off);
    ASSERT_EQ(p, static_cast<void *>(at)) << std::strerror(errno);
}

// Dirty memory (kB) of the mapping that starts at `addr`, from
// /proc/self/smaps: how much of it the kernel has not yet written back.
long dirty_kb(const void *addr) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool in = false;
    long kb = 0;
    while (std::getline(smaps, line)) {
        std::string first = line.substr(0, line.find(' '));
        if (first.empty() || first.back() != ':') {
            if (in) break; // the next mapping's header
            in = std::stoull(first, nullptr, 16) == reinterpret_cast<uintptr_t>(addr);
            continue;
        }
        if (in && (first == "Shared_Dirty:" || first == "Private_Dirty:"))
            kb += std::stol(line.substr(first.size()));
    }
    EXPECT_TRUE(in) << "no mapping starts at " << addr;
    return kb;
}

// Skips where the test's premises do not hold on this machine.
class NeedsStorage : public ::testing::Test {
  protected:
    void SetUp() override {
        // PMDK's override makes pmem_is_pmem() answer yes for any range.
        if (std::getenv("PMEM_IS_PMEM_FORCE")) GTEST_SKIP() << "PMEM_IS_PMEM_FORCE is set";
    }
    void need_disk_dir() {
        if (memory_fs(kDiskDir)) GTEST_SKIP() << kDiskDir << " is not on storage here";
    }
};

// Each case twice: with the kernel's per-address query of the mappings, and
// by reading /proc/self/maps, which kernels before 6.11 are left with.
class Classify : public NeedsStorage, public ::testing::WithParamInterface<sroce::MapsLookup> {
  protected:
    void SetUp() override {
        NeedsStorage::SetUp();
        if (IsSkipped()) return;
        if (GetParam() == sroce::MapsLookup::kQueryOnly && !sroce::maps_query_available())
            GTEST_SKIP() << "this kernel has no PROCMAP_QUERY";
        sroce::set_maps_lookup(GetParam());
    }
    void TearDown() override { sroce::set_maps_lookup(sroce::MapsLookup::kQueryWhenAvailable); }
};

INSTANTIATE_TEST_SUITE_P(Lookup, Classify,
                         ::testing::Values(sroce::MapsLookup::kQueryOnly,
                                           sroce::MapsLookup::kReadMaps),
                         [](const ::testing::TestParamInfo<sroce::MapsLookup> &i) {
                             return i.param == sroce::MapsLookup::kReadMaps ? "ReadMaps"
                                                                            : "KernelQuery";
                         });

TEST(MemClassName, Names) {
    EXPECT_STREQ(sroce::mem_class_name(MemClass::kVolatile), "volatile");
    EXPECT_STREQ(sroce::mem_class_name(MemClass::kFile), "file");
    EXPECT_STREQ(sroce::mem_class_name(MemClass::kPmem), "pmem");
}

TEST_P(Classify, HeapIsVolatile) {
    auto small = std::make_unique<uint8_t[]>(100);
    // Large enough that malloc serves it from its own anonymous mapping.
    auto large = std::make_unique<uint8_t[]>(4 << 20);
    EXPECT_EQ(sroce::classify_memory(small.get(), 100), MemClass::kVolatile);
    EXPECT_EQ(sroce::classify_memory(large.get(), 4 << 20), MemClass::kVolatile);
}

TEST_P(Classify, StackIsVolatile) {
    volatile uint8_t buf[512] = {};
    EXPECT_EQ(sroce::classify_memory(const_cast<uint8_t *>(buf), sizeof buf), MemClass::kVolatile);
}

TEST_P(Classify, AnonymousMappingsAreVolatile) {
    Mapping priv = map_anon(4 * page(), MAP_PRIVATE);
    // A shared anonymous mapping is shmem; /proc shows it as a deleted file.
    Mapping shared = map_anon(4 * page(), MAP_SHARED);
    ASSERT_TRUE(priv.get() && shared.get());
    EXPECT_EQ(sroce::classify_memory(priv.get(), priv.size()), MemClass::kVolatile);
    EXPECT_EQ(sroce::classify_memory(shared.get(), shared.size()), MemClass::kVolatile);
}

TEST_P(Classify, SharedFileOnStorageIsFile) {
    need_disk_dir();
    TempFile f(kDiskDir, 4 * page());
    Mapping m = map_file(f, 4 * page());
    ASSERT_TRUE(m.get());
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(m.get() + 17, 2 * page() + 5), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(m.get() + m.size() - 1, 1), MemClass::kFile);
}

TEST_P(Classify, AdjacentMappingsOfTwoFilesAreFile) {
    need_disk_dir();
    TempFile a(kDiskDir, page()), b(kDiskDir, page());
    Mapping area = map_anon(2 * page());
    ASSERT_TRUE(area.get());
    map_file_at(area.get(), a, page());
    map_file_at(area.get() + page(), b, page());
    EXPECT_EQ(sroce::classify_memory(area.get() + 100, page()), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(area.get(), 2 * page()), MemClass::kFile);
}

TEST_P(Classify, PrivateFileMappingIsVolatile) {
    need_disk_dir();
    TempFile f(kDiskDir, 4 * page());
    // Copy-on-write: stores land in anonymous copies, never in the file.
    Mapping m = map_file(f, 4 * page(), MAP_PRIVATE);
    ASSERT_TRUE(m.get());
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kVolatile);
}

TEST_P(Classify, SharedFileOnTmpfsIsVolatile) {
    if (!memory_fs(kShmDir)) GTEST_SKIP() << kShmDir << " is not tmpfs here";
    TempFile f(kShmDir, 4 * page());
    Mapping m = map_file(f, 4 * page());
    ASSERT_TRUE(m.get());
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kVolatile);
}

TEST_P(Classify, DeletedFileIsVolatile) {
    need_disk_dir();
    TempFile f(kDiskDir, 4 * page());
    Mapping m = map_file(f, 4 * page());
    ASSERT_TRUE(m.get());
    ASSERT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kFile);
    ASSERT_EQ(::unlink(f.path().c_str()), 0);
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kVolatile);

    // A new file under the old name is not the mapped one.
    int fd = ::open(f.path().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ::close(fd);
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kVolatile);
}

TEST_P(Classify, RangeSpanningFileAndAnonymousIsVolatile) {
    need_disk_dir();
    TempFile f(kDiskDir, 2 * page());
    // Pages: [anon][file][file][anon], one reservation so they are adjacent.
    Mapping area = map_anon(4 * page());
    ASSERT_TRUE(area.get());
    map_file_at(area.get() + page(), f, 2 * page());
    uint8_t *file = area.get() + page();
    ASSERT_EQ(sroce::classify_memory(file, 2 * page()), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(file, 2 * page() + 1), MemClass::kVolatile);
    EXPECT_EQ(sroce::classify_memory(file - 1, 2), MemClass::kVolatile);
    EXPECT_EQ(sroce::classify_memory(area.get(), area.size()), MemClass::kVolatile);
}

TEST_P(Classify, RangeRunningIntoAHoleIsVolatile) {
    need_disk_dir();
    TempFile f(kDiskDir, 2 * page());
    Mapping area = map_anon(3 * page());
    ASSERT_TRUE(area.get());
    map_file_at(area.get(), f, 2 * page());
    ASSERT_EQ(::munmap(area.get() + 2 * page(), page()), 0);
    EXPECT_EQ(sroce::classify_memory(area.get(), 2 * page()), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(area.get(), 3 * page()), MemClass::kVolatile);
}

TEST_P(Classify, DegenerateRangesAreVolatile) {
    need_disk_dir();
    TempFile f(kDiskDir, page());
    Mapping m = map_file(f, page());
    ASSERT_TRUE(m.get());
    // Nothing to vouch for, even inside a durable mapping.
    EXPECT_EQ(sroce::classify_memory(m.get(), 0), MemClass::kVolatile);
    EXPECT_EQ(sroce::classify_memory(nullptr, 0), MemClass::kVolatile);
    // Wrapping around the address space.
    EXPECT_EQ(sroce::classify_memory(m.get(), SIZE_MAX), MemClass::kVolatile);
}

// This machine has no persistent memory and no DAX filesystem, so libpmem
// never vouches for a range here, not even for one it mapped itself.  The
// kPmem path (pmem_map_file on fsdax with MAP_SYNC, pmem_persist) is covered
// by the qemu NVDIMM test (planned).
TEST_P(Classify, NoPersistentMemoryHere) {
    need_disk_dir();
    auto heap = std::make_unique<uint8_t[]>(page());
    EXPECT_FALSE(pmem_is_pmem(heap.get(), page()));

    TempFile f(kDiskDir, 16 * page());
    size_t mapped = 0;
    int is_pmem = -1;
    void *p = pmem_map_file(f.path().c_str(), 0, 0, 0, &mapped, &is_pmem);
    ASSERT_NE(p, nullptr) << pmem_errormsg();
    EXPECT_EQ(mapped, 16 * page());
    EXPECT_EQ(is_pmem, 0);
    EXPECT_FALSE(pmem_is_pmem(p, mapped));
    EXPECT_EQ(sroce::classify_memory(p, mapped), MemClass::kFile);
    EXPECT_EQ(pmem_unmap(p, mapped), 0);
}

// The kernel's query goes through a /proc/self/maps descriptor the library
// keeps open between registrations: it must answer for this process's
// memory even when the process forked or the application closed the
// descriptor and reused its number.
class KeptMapsFile : public NeedsStorage {
  protected:
    void SetUp() override {
        NeedsStorage::SetUp();
        if (IsSkipped()) return;
        need_disk_dir();
        if (IsSkipped()) return;
        if (!sroce::maps_query_available()) GTEST_SKIP() << "this kernel has no PROCMAP_QUERY";
        sroce::set_maps_lookup(sroce::MapsLookup::kQueryOnly);
    }
    void TearDown() override { sroce::set_maps_lookup(sroce::MapsLookup::kQueryWhenAvailable); }
};

// What descriptor `fd` names, as /proc shows it; "" if none.
std::string fd_target(int fd) {
    char buf[PATH_MAX];
    std::string link = "/proc/self/fd/" + std::to_string(fd);
    ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    return n < 0 ? "" : std::string(buf, size_t(n));
}

// The descriptors open on this process's maps file.
std::vector<int> maps_fds() {
    std::string mine = "/proc/" + std::to_string(::getpid()) + "/maps";
    std::vector<int> out;
    for (int fd = 0; fd < 1024; fd++)
        if (fd_target(fd) == mine) out.push_back(fd);
    return out;
}

TEST_F(KeptMapsFile, ChildOfForkAsksAboutItsOwnMemory) {
    TempFile f(kDiskDir, 4 * page());
    Mapping before = map_file(f, 4 * page());
    ASSERT_TRUE(before.get());
    // The parent's descriptor is open, then inherited.
    ASSERT_EQ(sroce::classify_memory(before.get(), before.size()), MemClass::kFile);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
        // Memory the parent does not have at that address: asked of the
        // parent's maps, it would be unmapped, hence volatile.
        void *p = ::mmap(nullptr, 4 * page(), PROT_READ | PROT_WRITE, MAP_SHARED, f.fd(), 0);
        if (p == MAP_FAILED) ::_exit(3);
        if (sroce::classify_memory(before.get(), before.size()) != MemClass::kFile) ::_exit(4);
        ::_exit(sroce::classify_memory(p, 4 * page()) == MemClass::kFile ? 0 : 5);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "3: mmap failed; 4: the inherited mapping; 5: a mapping of the child's own";
}

TEST_F(KeptMapsFile, DescriptorClosedAndReusedByTheApplication) {
    TempFile f(kDiskDir, 4 * page());
    Mapping m = map_file(f, 4 * page());
    ASSERT_TRUE(m.get());
    ASSERT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kFile);
    std::vector<int> kept = maps_fds();
    ASSERT_EQ(kept.size(), 1u) << "one descriptor kept between registrations";
    // As a daemon closing what it did not open, then opening something else.
    int null = ::open("/dev/null", O_RDWR);
    ASSERT_GE(null, 0);
    ASSERT_EQ(::close(kept[0]), 0);
    ASSERT_EQ(::dup2(null, kept[0]), kept[0]);
    ::close(null);

    Mapping other = map_file(f, 4 * page());
    ASSERT_TRUE(other.get());
    EXPECT_EQ(sroce::classify_memory(other.get(), other.size()), MemClass::kFile);
    EXPECT_EQ(sroce::classify_memory(m.get(), m.size()), MemClass::kFile);
    // The application's descriptor left as it was, the library on a new one.
    EXPECT_EQ(fd_target(kept[0]), "/dev/null");
    EXPECT_EQ(maps_fds().size(), 1u);
    ::close(kept[0]);
}

class Persist : public NeedsStorage {};

TEST_F(Persist, EveryClassSucceeds) {
    need_disk_dir();
    std::vector<uint8_t> heap(3 * page() + 7, 0x5a);
    TempFile f(kDiskDir, 2 * page());
    Mapping m = map_file(f, 2 * page());
    ASSERT_TRUE(m.get());
    std::memset(m.get(), 0xa5, m.size());

    EXPECT_EQ(sroce::persist_range(MemClass::kVolatile, heap.data() + 1, heap.size() - 1), 0);
    // Cache-line write-back is valid on any memory, so the pmem path runs
    // here too; it just proves nothing about durability without DAX.
    EXPECT_EQ(sroce::persist_range(MemClass::kPmem, heap.data() + 1, heap.size() - 1), 0);
    EXPECT_EQ(sroce::persist_range(MemClass::kFile, m.get(), m.size()), 0);
    for (MemClass c : {MemClass::kVolatile, MemClass::kFile, MemClass::kPmem})
        EXPECT_EQ(sroce::persist_range(c, m.get() + 3, 0), 0) << sroce::mem_class_name(c);
}

TEST_F(Persist, FileDataIsWrittenBack) {
    need_disk_dir();
    const size_t len = 4 * page();
    TempFile f(kDiskDir, len);
    Mapping m = map_file(f, len);
    ASSERT_TRUE(m.get());
    for (size_t i = 0; i < len; i++)
        m.get()[i] = pattern(i, 1);

    ASSERT_EQ(sroce::persist_range(MemClass::kFile, m.get(), len), 0);
    // Written back means clean: a read(2) alone would also be served from
    // the page cache the mapping shares, written back or not.
    EXPECT_EQ(dirty_kb(m.get()), 0);
    std::vector<uint8_t> disk = f.read_back(len);
    EXPECT_EQ(std::memcmp(disk.data(), m.get(), len), 0);
}

TEST_F(Persist, UnalignedFileSubRangeIsWrittenBack) {
    need_disk_dir();
    const size_t len = 4 * page();
    TempFile f(kDiskDir, len);
    Mapping m = map_file(f, len);
    ASSERT_TRUE(m.get());
    // Dirty only pages 1 and 2, across their boundary, at odd offsets.
    const size_t off = 2 * page() - 333, n = 333 + 77;
    for (size_t i = 0; i < n; i++)
        m.get()[off + i] = pattern(i, 2);

    ASSERT_EQ(sroce::persist_range(MemClass::kFile, m.get() + off, n), 0);
    EXPECT_EQ(dirty_kb(m.get()), 0);
    std::vector<uint8_t> disk = f.read_back(len);
    EXPECT_EQ(std::memcmp(disk.data(), m.get(), len), 0);
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(disk[off + i], pattern(i, 2)) << "byte " << off + i;
}

// Hook calls made by persist_range / visibility_fence, in order.
struct Recorder {
    std::vector<std::pair<const void *, size_t>> calls;
    static void hook(void *ctx, const void *addr, size_t len) {
        static_cast<Recorder *>(ctx)->calls.emplace_back(addr, len);
    }
};

// Removes the hook even when an assertion returns early.
struct HookGuard {
    explicit HookGuard(Recorder *r) { sroce::set_persist_hook(&Recorder::hook, r); }
    ~HookGuard() { sroce::set_persist_hook(nullptr, nullptr); }
};

TEST_F(Persist, FailedMsyncReportsErrorAndNothingPersisted) {
    void *p = ::mmap(nullptr, page(), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    ASSERT_EQ(::munmap(p, page()), 0);
    Recorder rec;
    {
        HookGuard guard(&rec);
        EXPECT_EQ(sroce::persist_range(MemClass::kFile, static_cast<uint8_t *>(p) + 8, 64), ENOMEM);
    }
    EXPECT_TRUE(rec.calls.empty());
}

TEST(PersistHook, ReportsExactlyThePersistedRanges) {
    std::vector<uint8_t> a(1000), b(64);
    Recorder rec;
    {
        HookGuard guard(&rec);
        EXPECT_EQ(sroce::persist_range(MemClass::kVolatile, a.data() + 3, 500), 0);
        EXPECT_EQ(rec.calls.size(), 1u) << "reported before returning";
        EXPECT_EQ(sroce::persist_range(MemClass::kPmem, b.data(), b.size()), 0);
        sroce::visibility_fence();
        EXPECT_EQ(sroce::persist_range(MemClass::kVolatile, a.data() + 999, 0), 0);
    }
    EXPECT_EQ(sroce::persist_range(MemClass::kVolatile, a.data(), a.size()), 0);
    sroce::visibility_fence();

    std::vector<std::pair<const void *, size_t>> want = {
        {a.data() + 3, 500}, {b.data(), b.size()}, {nullptr, 0}, {a.data() + 999, 0}};
    EXPECT_EQ(rec.calls, want);
}

TEST(PersistHook, FileRangesAreReported) {
    if (memory_fs(kDiskDir)) GTEST_SKIP() << kDiskDir << " is not on storage here";
    TempFile f(kDiskDir, 2 * page());
    Mapping m = map_file(f, 2 * page());
    ASSERT_TRUE(m.get());
    m.get()[page() + 1] = 1;
    Recorder rec;
    {
        HookGuard guard(&rec);
        EXPECT_EQ(sroce::persist_range(MemClass::kFile, m.get() + page() + 1, 10), 0);
    }
    std::vector<std::pair<const void *, size_t>> want = {{m.get() + page() + 1, 10}};
    EXPECT_EQ(rec.calls, want);
}

TEST(CopyNontemporal, ExactForEverySizeAndOddAlignments) {
    constexpr size_t kMax = 8192, kGuard = 128, kSize = kGuard + 64 + kMax + kGuard;
    // Cache-line aligned bases, so the offsets below are the alignments seen
    // by the copy: aligned, odd, and skewed across cache lines.
    struct Free {
        void operator()(uint8_t *p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t[], Free> src(static_cast<uint8_t *>(std::aligned_alloc(64, kSize)));
    std::unique_ptr<uint8_t[], Free> dst(static_cast<uint8_t *>(std::aligned_alloc(64, kSize)));
    std::vector<uint8_t> fill(kSize, 0xEE);
    ASSERT_TRUE(src && dst);
    for (size_t i = 0; i < kSize; i++)
        src[i] = pattern(i, 3);

    const std::pair<size_t, size_t> offsets[] = {{0, 0},  {1, 3},  {7, 0},
                                                 {0, 13}, {63, 1}, {33, 65}};
    for (auto [doff, soff] : offsets) {
        for (size_t len = 0; len <= kMax; len++) {
            std::memset(dst.get(), 0xEE, kSize);
            uint8_t *d = dst.get() + kGuard + doff;
            const uint8_t *s = src.get() + soff;
            sroce::copy_nontemporal(d, s, len);
            sroce::visibility_fence();
            const size_t before = kGuard + doff, after = kSize - before - len;
            ASSERT_EQ(std::memcmp(d, s, len), 0)
                << "len " << len << " dst+" << doff << " src+" << soff;
            ASSERT_EQ(std::memcmp(dst.get(), fill.data(), before), 0)
                << "wrote before dst: len " << len << " dst+" << doff;
            ASSERT_EQ(std::memcmp(d + len, fill.data(), after), 0)
                << "wrote past dst: len " << len << " dst+" << doff;
        }
    }
}

} // namespace
