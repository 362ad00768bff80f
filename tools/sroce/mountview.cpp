// SPDX-License-Identifier: MIT
#include "mountview.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <optional>
#include <sched.h>
#include <set>
#include <stdexcept>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <vector>

namespace sroce::tool {

namespace {

// The character-device major of the kernel's uverbs devices, and the first
// minor of its fixed range (IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR).  sroce's
// uverbs numbers start at 100, beyond that range, so the nodes name no
// device even where the kernel has RDMA: opening one fails with ENXIO.
constexpr unsigned uverbs_major = 231;
constexpr unsigned uverbs_base_minor = 192;
// /sys/class/infiniband_verbs/abi_version of every kernel since 2.6.
constexpr const char *uverbs_abi_version = "6";

[[noreturn]] void fail(const std::string &what) {
    throw std::runtime_error(what + ": " + std::strerror(errno));
}

class Fd {
  public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(Fd &&o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    Fd &operator=(Fd &&o) noexcept {
        std::swap(fd_, o.fd_);
        return *this;
    }
    int get() const { return fd_; }

  private:
    int fd_;
};

void write_file(const std::string &path, const std::string &text, mode_t mode = 0444) {
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) fail(path);
    std::size_t off = 0;
    while (off < text.size()) {
        ssize_t n = ::write(fd.get(), text.data() + off, text.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail(path);
        off += std::size_t(n);
    }
    if (::fchmod(fd.get(), mode) != 0) fail(path);
}

// mkdir -p, with sysfs's modes whatever the umask.
void make_dirs(const std::string &path) {
    std::size_t pos = 0;
    while (pos != std::string::npos) {
        pos = path.find('/', pos + 1);
        const std::string dir = path.substr(0, pos);
        if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail(dir);
    }
}

void make_symlink(const std::string &target, const std::string &path) {
    if (::symlink(target.c_str(), path.c_str()) != 0) fail(path);
}

// The mounts made so far, undone in reverse order when a later step fails,
// so that a half-built view never reaches the program.
class Mounts {
  public:
    void bind(const std::string &source, const std::string &target) {
        if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
            fail("bind " + target);
    }
    void tmpfs(const std::string &target, mode_t mode) {
        char opts[32];
        std::snprintf(opts, sizeof opts, "mode=%04o", unsigned(mode & 07777));
        if (::mount("sroce", target.c_str(), "tmpfs", MS_NOSUID, opts) != 0)
            fail("mount tmpfs on " + target);
        covered_.push_back(target);
    }
    void undo() noexcept {
        for (auto it = covered_.rbegin(); it != covered_.rend(); ++it)
            ::umount2(it->c_str(), MNT_DETACH);
        covered_.clear();
    }

  private:
    // Only the tmpfs mounts: the bind mounts are on them and go with them.
    std::vector<std::string> covered_;
};

// An open directory whose path will be covered: its entries stay reachable
// through /proc/self/fd, the only name left for them.
struct Original {
    Fd fd;
    std::string proc_path() const { return "/proc/self/fd/" + std::to_string(fd.get()); }
};

Original open_dir(const std::string &path) {
    Original o{Fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC))};
    if (o.fd.get() < 0) fail(path);
    return o;
}

std::optional<Original> open_subdir(const Original &parent, const char *name) {
    int fd = ::openat(parent.fd.get(), name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    return Original{Fd(fd)};
}

std::vector<std::string> entries(const Original &dir) {
    int fd = ::dup(dir.fd.get());
    if (fd < 0) fail("dup");
    DIR *d = ::fdopendir(fd);
    if (!d) {
        ::close(fd);
        fail("fdopendir");
    }
    ::rewinddir(d);
    std::vector<std::string> names;
    while (dirent *e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    return names;
}

// Recreates the entries of `src` in `dst`, a directory on one of our tmpfs
// mounts: symbolic links as links (sysfs's are relative and resolve the same
// from the same path), everything else as a bind mount of the original.
void carry_over(Mounts &m, const Original &src, const std::string &dst,
                const std::set<std::string> &skip) {
    for (const std::string &name : entries(src)) {
        if (skip.contains(name)) continue;
        const std::string from = src.proc_path() + "/" + name;
        const std::string to = dst + "/" + name;
        struct stat st;
        if (::fstatat(src.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue; // gone meanwhile
            fail(from);
        }
        if (S_ISLNK(st.st_mode)) {
            std::vector<char> buf(std::size_t(st.st_size > 0 ? st.st_size : 255) + 1);
            ssize_t n = ::readlinkat(src.fd.get(), name.c_str(), buf.data(), buf.size());
            if (n < 0) fail(from);
            make_symlink(std::string(buf.data(), std::size_t(n)), to);
        } else if (S_ISDIR(st.st_mode)) {
            if (::mkdir(to.c_str(), st.st_mode & 07777) != 0) fail(to);
            m.bind(from, to);
        } else {
            Fd fd(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
            if (fd.get() < 0) fail(to);
            m.bind(from, to);
        }
    }
}

// Covers `path` with a tmpfs showing the same entries except `skip`, and
// returns the original directory.
Original cover(Mounts &m, const std::string &path, const std::set<std::string> &skip) {
    Original orig = open_dir(path);
    struct stat st;
    if (::fstat(orig.fd.get(), &st) != 0) fail(path);
    m.tmpfs(path, st.st_mode);
    carry_over(m, orig, path, skip);
    return orig;
}

// `dir` below a covered directory: a fresh one holding the original's
// entries (from the kernel's own RDMA devices) except `skip`.
void merged_dir(Mounts &m, const Original &covered, const char *name, const std::string &dir,
                const std::set<std::string> &skip) {
    make_dirs(dir);
    if (std::optional<Original> sub = open_subdir(covered, name)) carry_over(m, *sub, dir, skip);
}

unsigned uverbs_number(const std::string &uverbs, std::size_t fallback) {
    if (uverbs.starts_with("uverbs") && uverbs.size() > 6 &&
        uverbs.find_first_not_of("0123456789", 6) == std::string::npos)
        return unsigned(std::stoul(uverbs.substr(6)));
    return unsigned(fallback);
}

// /dev/infiniband/uverbsN: programs (UCX) check that it is a character
// device they may open for reading and writing, though they reach the
// device through libibverbs, i.e. the shim.  Returns its device number.
dev_t make_uverbs_node(Mounts &m, const Original &dev, const std::string &path, unsigned number) {
    const dev_t rdev = makedev(uverbs_major, uverbs_base_minor + number);
    if (::mknod(path.c_str(), S_IFCHR | 0600, rdev) == 0) {
        if (::chmod(path.c_str(), 0666) != 0) fail(path);
        return rdev;
    }
    // A user namespace may not create device nodes; it may bind an
    // existing one.  /dev/null is one everybody may open.
    if (errno != EPERM) fail(path);
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) fail(path);
    m.bind(dev.proc_path() + "/null", path);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) fail(path);
    return st.st_rdev;
}

// Entries of a sysfs class directory are symbolic links; directories there
// were made by an enclosing `sroce exec`, whose devices may differ from ours.
std::set<std::string> subdirectories(const std::string &path) {
    std::set<std::string> dirs;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(path, ec))
        if (e.is_directory(ec) && !e.is_symlink(ec)) dirs.insert(e.path().filename().string());
    return dirs;
}

void build(Mounts &m, const std::vector<DeviceView> &devices) {
    std::set<std::string> names = subdirectories("/sys/class/infiniband");
    std::set<std::string> uverbs = subdirectories("/sys/class/infiniband_verbs");
    for (const DeviceView &d : devices) {
        names.insert(d.name);
        uverbs.insert(d.uverbs);
    }

    const Original dev = cover(m, "/dev", {"infiniband"});
    merged_dir(m, dev, "infiniband", "/dev/infiniband", uverbs);
    std::map<std::string, dev_t> rdev;
    for (std::size_t i = 0; i < devices.size(); ++i) {
        const DeviceView &d = devices[i];
        rdev[d.name] =
            make_uverbs_node(m, dev, "/dev/infiniband/" + d.uverbs, uverbs_number(d.uverbs, i));
    }

    const Original sys = cover(m, "/sys/class", {"infiniband", "infiniband_verbs"});
    merged_dir(m, sys, "infiniband", "/sys/class/infiniband", names);
    merged_dir(m, sys, "infiniband_verbs", "/sys/class/infiniband_verbs", uverbs);
    if (::access("/sys/class/infiniband_verbs/abi_version", F_OK) != 0)
        write_file("/sys/class/infiniband_verbs/abi_version",
                   std::string(uverbs_abi_version) + "\n");

    for (const DeviceView &d : devices) {
        const std::string ib = "/sys/class/infiniband/" + d.name;
        make_dirs(ib);
        for (const auto &[file, value] : d.files) {
            const std::string path = ib + "/" + file;
            make_dirs(std::filesystem::path(path).parent_path().string());
            write_file(path, value + "\n");
        }
        // Where the kernel links the parent device, whose net/ names the
        // interfaces (rdma-core's tests look there).  Not the interface's own
        // parent: libibverbs would match a provider to its modalias.
        make_dirs(ib + "/device/net");
        for (const std::string &netdev : d.netdevs)
            make_symlink("/sys/class/net/" + netdev, ib + "/device/net/" + netdev);

        const std::string uv = "/sys/class/infiniband_verbs/" + d.uverbs;
        make_dirs(uv);
        write_file(uv + "/ibdev", d.name + "\n");
        // The per-device value is the provider's ABI; sroce's is 1.
        write_file(uv + "/abi_version", "1\n");
        const dev_t r = rdev[d.name];
        write_file(uv + "/dev", std::to_string(major(r)) + ":" + std::to_string(minor(r)) + "\n");
        make_symlink(ib + "/device", uv + "/device");
    }
}

void write_proc(const char *path, const std::string &text) {
    Fd fd(::open(path, O_WRONLY | O_CLOEXEC));
    if (fd.get() < 0 || ::write(fd.get(), text.data(), text.size()) != ssize_t(text.size()))
        fail(path);
}

// Root gets a mount namespace; anyone else (and a root without
// CAP_SYS_ADMIN, as in many containers) a user namespace in which the same
// uid and gid map to themselves, so the program runs as before and loses
// the namespace's capabilities when it is executed.
void enter_namespace() {
    if (::geteuid() == 0 && ::unshare(CLONE_NEWNS) == 0) return;
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) fail("unshare");
    write_proc("/proc/self/setgroups", "deny");
    write_proc("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1");
    write_proc("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1");
}

} // namespace

std::string show_devices(const std::vector<DeviceView> &devices) {
    try {
        enter_namespace();
        // Mounts of the host keep reaching us; ours never reach the host.
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
            fail("make / a slave mount");
    } catch (const std::exception &e) {
        return std::string("no private mount namespace (") + e.what() + ")";
    }
    Mounts m;
    // Modes are given explicitly, as sysfs and udev set them.
    const mode_t umask = ::umask(0);
    std::string err;
    try {
        build(m, devices);
    } catch (const std::exception &e) {
        m.undo();
        err = e.what();
    }
    ::umask(umask);
    return err;
}

} // namespace sroce::tool
