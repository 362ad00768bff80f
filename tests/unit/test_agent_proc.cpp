// SPDX-License-Identifier: MIT
//
// How the agent reads what /proc says of its clients.  A client may exit at
// any moment, also between the agent's open(2) and read(2) of one of its
// files; the read then fails (ESRCH), and the agent must take that as "gone"
// rather than end for everyone.
#include "handover.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace sroce::agent;

pid_t sleeper() {
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    return pid;
}

void reap(pid_t pid) {
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
}

TEST(ReadProc, LiveProcess) {
    pid_t pid = sleeper();
    ASSERT_GT(pid, 0);
    std::string stat = read_proc(pid, "stat");
    EXPECT_EQ(stat.rfind(std::to_string(pid) + " (", 0), 0u) << stat;
    EXPECT_GT(proc_start(pid), 0u);
    EXPECT_EQ(proc_start(pid), proc_start(pid));
    reap(pid);
}

TEST(ReadProc, GoneProcessReadsEmpty) {
    pid_t pid = sleeper();
    ASSERT_GT(pid, 0);
    reap(pid);
    EXPECT_EQ(read_proc(pid, "stat"), "");
    EXPECT_EQ(read_proc(pid, "status"), "");
    EXPECT_EQ(proc_start(pid), 0u);
}

// The race itself: the file is open when the process goes.
TEST(ReadProc, ProcessGoneAfterOpenReadsEmpty) {
    pid_t pid = sleeper();
    ASSERT_GT(pid, 0);
    std::string path = "/proc/" + std::to_string(pid) + "/stat";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    reap(pid);
    EXPECT_EQ(read_rest(fd), "");
    close(fd);

    // What the agent did before: libstdc++'s filebuf throws on that read.
    pid = sleeper();
    ASSERT_GT(pid, 0);
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    ASSERT_TRUE(f.is_open());
    reap(pid);
    EXPECT_ANY_THROW(
        std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
}

} // namespace
