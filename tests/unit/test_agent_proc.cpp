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
#include <vector>

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

// The record a successor reads: who holds which slot, and which slot map
// steers the address, so that the next agent keeps it.  Root's only; a
// socket name of the test's own keeps it apart from any running agent's.
class HandoverRecord : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) GTEST_SKIP() << "only root's agent keeps a record";
        setenv("SROCE_AGENT_SOCKET", ("handover-test-" + std::to_string(getpid())).c_str(), 1);
    }
    void TearDown() override {
        if (geteuid() == 0) {
            EXPECT_EQ(save_owners({}), 0);
        }
        unsetenv("SROCE_AGENT_SOCKET");
    }
};

TEST_F(HandoverRecord, KeepsTheOwnersAndTheMap) {
    SlotOwner me{sroce::IpAddr::v4(0x0100007f), 7, getpid(), getuid(), proc_start(getpid()), 4242};
    pid_t gone = sleeper();
    ASSERT_GT(gone, 0);
    SlotOwner dead{sroce::IpAddr::v4(0x0100007f), 8, gone, 0, proc_start(gone), 4242};
    reap(gone);
    ASSERT_EQ(save_owners({me, dead}), 0);
    std::vector<SlotOwner> got = load_owners();
    ASSERT_EQ(got.size(), 1u) << "a dead process's slot is nobody's";
    EXPECT_EQ(got[0].addr, me.addr);
    EXPECT_EQ(got[0].slot, 7u);
    EXPECT_EQ(got[0].pid, getpid());
    EXPECT_EQ(got[0].start, me.start);
    EXPECT_EQ(got[0].map, 4242u);
}

// A record an agent wrote before maps were recorded: its owners still count,
// with no map to keep (the successor attaches a new one).
TEST_F(HandoverRecord, ReadsARecordWithoutMaps) {
    ASSERT_EQ(save_owners({{sroce::IpAddr::v4(0x0100007f), 9, getpid(), getuid(),
                            proc_start(getpid()), 1}}),
              0);
    {
        std::ofstream f(record_path(), std::ios::trunc);
        f << 0x0100007f << " 9 " << getpid() << " " << getuid() << " " << proc_start(getpid())
          << "\n"
          << 0x0100007f << " 10 " << getpid() << " " << getuid() << " " << proc_start(getpid())
          << "\n";
    }
    std::vector<SlotOwner> got = load_owners();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].slot, 9u);
    EXPECT_EQ(got[1].slot, 10u);
    EXPECT_EQ(got[0].map, 0u);
    EXPECT_EQ(got[1].map, 0u);
}

} // namespace
