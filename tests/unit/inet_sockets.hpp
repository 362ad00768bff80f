// SPDX-License-Identifier: MIT
//
// Counts the AF_INET and AF_INET6 sockets the process opens, the engine's
// included: this header defines socket() for the test binary, which the
// dynamic linker binds the engine's calls to ahead of libc's.  A binary
// whose devices are on the in-memory wire (rc_pair.hpp's find_devices)
// calls expect_no_inet_sockets(), and every one of its cases then fails if
// any such socket was opened.  Include it from one source file per binary.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <dlfcn.h>
#include <sys/socket.h>

namespace rctest {

inline std::atomic<int> g_inet_sockets{0};
inline bool g_no_inet_expected = false;

inline int inet_sockets() {
    return g_inet_sockets.load();
}

inline void expect_no_inet_sockets() {
    g_no_inet_expected = true;
}

// Registered before the binary's own environments, so torn down after
// them: the devices' closing counts too.
class NoInetSockets : public ::testing::Environment {
  public:
    void TearDown() override {
        if (!g_no_inet_expected) return;
        EXPECT_EQ(inet_sockets(), 0)
            << "an AF_INET or AF_INET6 socket was opened on the in-memory wire";
    }
};

[[maybe_unused]] inline ::testing::Environment *const g_no_inet_env =
    ::testing::AddGlobalTestEnvironment(new NoInetSockets);

} // namespace rctest

extern "C" int socket(int domain, int type, int protocol) {
    using Fn = int (*)(int, int, int);
    static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "socket"));
    if (domain == AF_INET || domain == AF_INET6) rctest::g_inet_sockets++;
    return real(domain, type, protocol);
}
