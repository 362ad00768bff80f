// SPDX-License-Identifier: MIT
//
// librdmacm support: the kernel's rdma_cm device file, served by the sroce
// agent.  rdma-core's own librdmacm opens /dev/infiniband/rdma_cm and
// speaks the rdma_ucm command ABI to it with write(2), the kernel copying
// each reply to a user pointer in the command.  With sroce devices present
// the shim takes those calls: open(2) gives a socket to the agent instead
// (pollable, readable while events are queued, O_NONBLOCK honoured),
// write(2) sends the command to the agent and copies the reply where the
// kernel would, fstat(2) says "character device", close(2) ends the
// channel.  Every other file goes to the C library untouched.
//
// These definitions interpose the C library's by carrying its symbol
// versions (libibverbs.map.in).  Nothing here may call write() or close()
// on an rdma_cm file, or open() on its path, through those names.
#include "agent_client.hpp"
#include "no_destructor.hpp"
#include "provider.h"

#include <rdma/rdma_user_cm.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <unordered_map>

namespace {

using namespace sroce::agent;

constexpr const char *kCmPath = "/dev/infiniband/rdma_cm";

template <class F>
F next(const char *name) {
    return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

struct CmFile {
    int commands = -1;
    uint32_t channel = 0;
    ino_t ino = 0; // the events socket's, to tell it from a file that took its number
    std::mutex mu; // one command at a time on the command socket
    // close(2) seen: a thread still blocked in GET_EVENT holds the file, as
    // the kernel's would, and waits until the process ends.
    std::atomic<bool> closed{false};
};

[[noreturn]] void wait_forever() {
    for (;;)
        pause();
}

// The open rdma_cm files by descriptor.  Never destroyed (no_destructor.hpp):
// close() and write() are the C library's for the whole process, called
// by other threads and by other libraries' destructors while exit() runs.
std::mutex g_files_mu;
std::unordered_map<int, std::shared_ptr<CmFile>> &files() noexcept {
    static sroce::NoDestructor<std::unordered_map<int, std::shared_ptr<CmFile>>> m;
    return *m;
}
// Which descriptor numbers are rdma_cm files, so that every other write()
// and close() costs one load.
constexpr int kMaxFd = 1 << 16;
std::atomic<uint8_t> g_is_cm[kMaxFd];

bool is_cm(int fd) {
    return fd >= 0 && fd < kMaxFd && g_is_cm[fd].load(std::memory_order_relaxed);
}

// The app is done with `f`: its command socket closes (the agent then
// destroys the file's ids) once no command is in flight on it.
void release(CmFile &f) {
    f.closed.store(true);
    std::lock_guard<std::mutex> g(f.mu);
    next<int (*)(int)>("close")(f.commands);
    f.commands = -1;
}

std::shared_ptr<CmFile> cm_file(int fd) {
    std::lock_guard<std::mutex> g(g_files_mu);
    auto &m = files();
    auto it = m.find(fd);
    return it == m.end() ? nullptr : it->second;
}

// The rdma_cm file behind `fd`, or nullptr when the number now names
// another file (dup2() over it, close_range(), a close the shim did not
// see): then the channel is forgotten and the call is the C library's.
std::shared_ptr<CmFile> live_cm_file(int fd) {
    std::shared_ptr<CmFile> f = cm_file(fd);
    if (!f) return nullptr;
    static auto real_fstat = next<int (*)(int, struct stat *)>("fstat");
    struct stat st;
    if (real_fstat(fd, &st) == 0 && st.st_ino == f->ino) return f;
    {
        std::lock_guard<std::mutex> g(g_files_mu);
        auto &m = files();
        if (auto it = m.find(fd); it != m.end() && it->second == f) m.erase(it);
        g_is_cm[fd].store(0, std::memory_order_release);
    }
    release(*f);
    return nullptr;
}

bool want_cm(const char *path) {
    if (!path || std::strcmp(path, kCmPath) != 0) return false;
    ibv_device **devs = nullptr;
    return sroce_device_list(&devs) > 0;
}

int cm_open(int flags) {
    CmChannel ch;
    if (int err = open_cm_channel(ch)) {
        errno = err == ECONNREFUSED ? ENODEV : err;
        return -1;
    }
    if (!(flags & O_CLOEXEC)) fcntl(ch.events, F_SETFD, 0);
    if (flags & O_NONBLOCK) fcntl(ch.events, F_SETFL, O_NONBLOCK);
    if (ch.events >= kMaxFd) {
        next<int (*)(int)>("close")(ch.events);
        next<int (*)(int)>("close")(ch.commands);
        errno = EMFILE;
        return -1;
    }
    auto f = std::make_shared<CmFile>();
    f->commands = ch.commands;
    f->channel = ch.number;
    struct stat st;
    if (next<int (*)(int, struct stat *)>("fstat")(ch.events, &st) == 0) f->ino = st.st_ino;
    {
        std::lock_guard<std::mutex> g(g_files_mu);
        files()[ch.events] = f;
    }
    g_is_cm[ch.events].store(1, std::memory_order_release);
    return ch.events;
}

// Where the command struct keeps its reply pointer (offset after the
// header), or -1 for commands without a reply.
int response_offset(uint32_t cmd) {
    switch (cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID:
        return offsetof(rdma_ucm_create_id, response);
    case RDMA_USER_CM_CMD_DESTROY_ID:
    case RDMA_USER_CM_CMD_LEAVE_MCAST:
        return offsetof(rdma_ucm_destroy_id, response);
    case RDMA_USER_CM_CMD_QUERY_ROUTE:
    case RDMA_USER_CM_CMD_QUERY:
        return offsetof(rdma_ucm_query, response);
    case RDMA_USER_CM_CMD_INIT_QP_ATTR:
        return offsetof(rdma_ucm_init_qp_attr, response);
    case RDMA_USER_CM_CMD_GET_EVENT:
        return offsetof(rdma_ucm_get_event, response);
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
        return offsetof(rdma_ucm_join_ip_mcast, response);
    case RDMA_USER_CM_CMD_JOIN_MCAST:
        return offsetof(rdma_ucm_join_mcast, response);
    case RDMA_USER_CM_CMD_MIGRATE_ID:
        return offsetof(rdma_ucm_migrate_id, response);
    default:
        return -1;
    }
}

// One command and its reply on the command socket.  0 or an errno.
int transact(CmFile &f, uint32_t cmd, const uint8_t *in, size_t in_len, uint8_t *out,
             size_t out_cap, size_t *out_len) {
    alignas(8) uint8_t msg[sizeof(CmCommand) + kCmMaxMsg];
    if (in_len > kCmMaxMsg) return EINVAL;
    CmCommand c{cmd, uint32_t(in_len), uint32_t(out_cap), 0};
    std::memcpy(msg, &c, sizeof c);
    std::memcpy(msg + sizeof c, in, in_len);
    alignas(8) uint8_t rep[sizeof(CmReply) + kCmMaxMsg];
    ssize_t n;
    {
        std::lock_guard<std::mutex> g(f.mu);
        if (f.commands < 0) return EBADF;
        if (send(f.commands, msg, sizeof c + in_len, MSG_NOSIGNAL) < 0) return ENODEV;
        while ((n = recv(f.commands, rep, sizeof rep, 0)) < 0 && errno == EINTR) {
        }
    }
    // The agent is gone: as a device removed under the kernel's rdma_cm.
    if (n < ssize_t(sizeof(CmReply))) return ENODEV;
    CmReply r;
    std::memcpy(&r, rep, sizeof r);
    if (r.err) return r.err;
    *out_len = std::min<size_t>({r.out_len, out_cap, size_t(n) - sizeof r});
    std::memcpy(out, rep + sizeof r, *out_len);
    return 0;
}

ssize_t cm_write(int fd, const std::shared_ptr<CmFile> &f, const void *buf, size_t len) {
    rdma_ucm_cmd_hdr hdr;
    if (len < sizeof hdr) {
        errno = EINVAL;
        return -1;
    }
    std::memcpy(&hdr, buf, sizeof hdr);
    if (hdr.cmd > RDMA_USER_CM_CMD_JOIN_MCAST || size_t(hdr.in) + sizeof hdr > len) {
        errno = EINVAL;
        return -1;
    }
    alignas(8) uint8_t in[kCmMaxMsg];
    size_t in_len = std::min<size_t>(hdr.in, 512);
    std::memcpy(in, static_cast<const uint8_t *>(buf) + sizeof hdr, in_len);
    if (hdr.cmd == RDMA_USER_CM_CMD_SET_OPTION) {
        // The option's value is behind a pointer: it travels after the
        // struct.
        rdma_ucm_set_option s{};
        std::memcpy(&s, in, std::min(in_len, sizeof s));
        if (s.optlen > kCmMaxMsg - sizeof s) {
            errno = EINVAL;
            return -1;
        }
        if (s.optlen)
            std::memcpy(in + sizeof s, reinterpret_cast<const void *>(s.optval), s.optlen);
        in_len = sizeof s + s.optlen;
    } else if (hdr.cmd == RDMA_USER_CM_CMD_MIGRATE_ID) {
        // The old channel is named by its descriptor, which only this
        // process can read: the agent gets its number.
        rdma_ucm_migrate_id m{};
        std::memcpy(&m, in, std::min(in_len, sizeof m));
        std::shared_ptr<CmFile> from = cm_file(int(m.fd));
        if (!from) {
            errno = fcntl(int(m.fd), F_GETFD) < 0 ? ENOENT : EINVAL;
            return -1;
        }
        m.fd = from->channel;
        std::memcpy(in, &m, sizeof m);
    }
    // Where the reply goes, checked before the agent acts on the command,
    // as the kernel would fail the copy (EFAULT) of a command with no
    // place for its reply.
    int off = response_offset(hdr.cmd);
    uint64_t resp = 0;
    if (off >= 0 && hdr.out) {
        std::memcpy(&resp, in + off, sizeof resp);
        if (!resp) {
            errno = EFAULT;
            return -1;
        }
    }
    alignas(8) uint8_t out[kCmMaxMsg];
    size_t out_len = 0;
    int err;
    if (hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT) {
        // Wait for a wake-up byte on the file itself (blocking or not, as
        // the file is), then take the event; a byte whose event went away
        // (its id destroyed or migrated) is skipped.
        for (;;) {
            char b;
            ssize_t k = recv(fd, &b, 1, 0);
            if (f->closed.load()) wait_forever();
            if (k < 0) return -1;
            if (k == 0) {
                errno = ENODEV;
                return -1;
            }
            err = transact(*f, hdr.cmd, in, in_len, out, hdr.out, &out_len);
            if (f->closed.load()) wait_forever();
            if (err != EAGAIN) break;
        }
    } else {
        err = transact(*f, hdr.cmd, in, in_len, out, hdr.out, &out_len);
    }
    if (err) {
        errno = err;
        return -1;
    }
    if (resp && out_len) std::memcpy(reinterpret_cast<void *>(resp), out, out_len);
    return ssize_t(len);
}

void fill_stat(struct stat *st) {
    std::memset(st, 0, sizeof *st);
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = makedev(10, 58);
    st->st_nlink = 1;
    st->st_blksize = 4096;
}

int vopen(const char *name, const char *path, int flags, va_list ap) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) mode = mode_t(va_arg(ap, int));
    if (want_cm(path)) return cm_open(flags);
    return next<int (*)(const char *, int, ...)>(name)(path, flags, mode);
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int r = vopen("open", path, flags, ap);
    va_end(ap);
    return r;
}

__attribute__((visibility("default"))) int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    int r = vopen("open64", path, flags, ap);
    va_end(ap);
    return r;
}

__attribute__((visibility("default"))) ssize_t write(int fd, const void *buf, size_t len) {
    if (is_cm(fd))
        if (std::shared_ptr<CmFile> f = live_cm_file(fd)) return cm_write(fd, f, buf, len);
    static auto real = next<ssize_t (*)(int, const void *, size_t)>("write");
    return real(fd, buf, len);
}

__attribute__((visibility("default"))) int close(int fd) {
    static auto real = next<int (*)(int)>("close");
    if (is_cm(fd))
        if (std::shared_ptr<CmFile> f = live_cm_file(fd)) {
            {
                std::lock_guard<std::mutex> g(g_files_mu);
                files().erase(fd);
                g_is_cm[fd].store(0, std::memory_order_release);
            }
            release(*f);
        }
    return real(fd);
}

__attribute__((visibility("default"))) int fstat(int fd, struct stat *st) {
    if (is_cm(fd) && live_cm_file(fd)) {
        fill_stat(st);
        return 0;
    }
    static auto real = next<int (*)(int, struct stat *)>("fstat");
    return real(fd, st);
}

__attribute__((visibility("default"))) int fstat64(int fd, struct stat64 *st) {
    if (is_cm(fd) && live_cm_file(fd)) {
        fill_stat(reinterpret_cast<struct stat *>(st));
        return 0;
    }
    static auto real = next<int (*)(int, struct stat64 *)>("fstat64");
    return real(fd, st);
}

__attribute__((visibility("default"))) int __fxstat(int ver, int fd, struct stat *st) {
    if (is_cm(fd) && live_cm_file(fd)) {
        fill_stat(st);
        return 0;
    }
    static auto real = next<int (*)(int, int, struct stat *)>("__fxstat");
    return real(ver, fd, st);
}

} // extern "C"
