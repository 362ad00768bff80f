// SPDX-License-Identifier: MIT
#include "config.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace fs = std::filesystem;
using sroce::Link;

namespace sroce {
// Readable failure output instead of gtest's byte dump.
void PrintTo(const Link &l, std::ostream *os) {
    *os << "{" << l.name << " netdev " << l.netdev << " addr " << l.addr << "}";
}
} // namespace sroce

namespace {

class ConfigTest : public ::testing::Test {
  protected:
    void SetUp() override {
        std::string tmpl = (fs::temp_directory_path() / "sroce-config-test-XXXXXX").string();
        ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
        dir_ = tmpl;
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    std::string path(const std::string &name = "links.conf") const {
        return (dir_ / name).string();
    }

    std::string write(const std::string &text, const std::string &name = "links.conf") const {
        std::string p = path(name);
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }

    // The message of the error load_links() throws for `text`, or nullopt.
    std::optional<std::string> load_error(const std::string &text) const {
        std::string p = write(text);
        try {
            sroce::load_links(p);
        } catch (const std::runtime_error &e) {
            return std::string(e.what());
        }
        return std::nullopt;
    }

    fs::path dir_;
};

// Restores an environment variable on scope exit so tests stay independent.
class EnvGuard {
  public:
    explicit EnvGuard(const char *name) : name_(name) {
        if (const char *v = std::getenv(name)) old_ = v;
    }
    ~EnvGuard() {
        if (old_)
            ::setenv(name_, old_->c_str(), 1);
        else
            ::unsetenv(name_);
    }

  private:
    const char *name_;
    std::optional<std::string> old_;
};

const std::vector<Link> sample = {
    {"sroce0", "lo", "127.0.0.1"},
    {"sroce1", "lo", "127.0.0.2"},
    {"roce_v6.a-b", "eth0", "fd00::1"},
};

} // namespace

TEST_F(ConfigTest, MissingFileIsEmpty) {
    EXPECT_TRUE(sroce::load_links(path()).empty());
    EXPECT_TRUE(sroce::load_links(path("no/such/dir/links.conf")).empty());
}

TEST_F(ConfigTest, RoundTrip) {
    sroce::save_links(path(), sample);
    EXPECT_EQ(sroce::load_links(path()), sample);

    // Saving again replaces rather than appends.
    std::vector<Link> fewer(sample.begin(), sample.begin() + 1);
    sroce::save_links(path(), fewer);
    EXPECT_EQ(sroce::load_links(path()), fewer);

    sroce::save_links(path(), {});
    EXPECT_TRUE(sroce::load_links(path()).empty());
}

TEST_F(ConfigTest, SaveCreatesParentDirectories) {
    std::string p = path("etc/sroce/links.conf");
    sroce::save_links(p, sample);
    EXPECT_EQ(sroce::load_links(p), sample);
}

TEST_F(ConfigTest, SaveLeavesOnlyTheFile) {
    sroce::save_links(path(), sample);
    sroce::save_links(path(), sample);
    std::vector<std::string> names;
    for (const auto &e : fs::directory_iterator(dir_))
        names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"links.conf"});
}

TEST_F(ConfigTest, SaveModes) {
    struct stat st;
    sroce::save_links(path(), sample);
    ASSERT_EQ(::stat(path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0644u) << "applications of every user must read it";

    ASSERT_EQ(::chmod(path().c_str(), 0640), 0);
    sroce::save_links(path(), sample);
    ASSERT_EQ(::stat(path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u) << "an administrator's choice is kept";
}

TEST_F(ConfigTest, SaveWritesThroughSymlink) {
    std::string real = path("real.conf");
    fs::create_symlink(real, path());
    sroce::save_links(path(), sample);
    EXPECT_TRUE(fs::is_symlink(path()));
    EXPECT_EQ(sroce::load_links(real), sample);
}

TEST_F(ConfigTest, SaveReportsSystemErrors) {
    write("not a directory", "file");
    std::string p = path("file/links.conf");
    try {
        sroce::save_links(p, sample);
        FAIL() << "expected an exception";
    } catch (const std::runtime_error &e) {
        EXPECT_NE(std::string(e.what()).find(path("file")), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::strerror(ENOTDIR)), std::string::npos)
            << e.what();
    }
}

TEST_F(ConfigTest, SaveRejectsInvalidLists) {
    std::vector<Link> dup_name = {{"a", "lo", "127.0.0.1"}, {"a", "lo", "127.0.0.2"}};
    std::vector<Link> dup_addr = {{"a", "lo", "127.0.0.1"}, {"b", "lo", "127.0.0.1"}};
    std::vector<Link> bad_addr = {{"a", "lo", "127.0.0.300"}};
    std::vector<Link> two_followers = {{"a", "lo", ""}, {"b", "lo", ""}};
    for (const auto &links : {dup_name, dup_addr, bad_addr, two_followers}) {
        EXPECT_THROW(sroce::save_links(path(), links), std::runtime_error);
        EXPECT_FALSE(fs::exists(path())) << "nothing may be written for an invalid list";
    }
}

// A link without an address follows its interface, as an rxe link does;
// it is written back without one, and an address of the interface may
// still be another link's.
TEST_F(ConfigTest, LinkWithoutAddressFollowsItsInterface) {
    std::vector<Link> links = {{"sroce0", "lo", ""}, {"sroce1", "lo", "127.0.0.2"}};
    sroce::save_links(path(), links);
    EXPECT_EQ(sroce::load_links(path()), links);
    std::ifstream f(path());
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("\nsroce0 netdev lo\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nsroce1 netdev lo addr 127.0.0.2\n"), std::string::npos) << text;
}

TEST_F(ConfigTest, CommentsAndBlankLines) {
    std::string text = "# sroce links\n"
                       "\n"
                       "   \t \n"
                       "sroce0 netdev lo addr 127.0.0.1   # the first one\n"
                       "  # indented comment\n"
                       "\tsroce1\tnetdev\tlo\taddr\t127.0.0.2\r\n"
                       "#sroce2 netdev lo addr 127.0.0.3\n"
                       "sroce3 addr 127.0.0.4 netdev lo"; // keyword order is free; no final newline
    std::vector<Link> want = {
        {"sroce0", "lo", "127.0.0.1"},
        {"sroce1", "lo", "127.0.0.2"},
        {"sroce3", "lo", "127.0.0.4"},
    };
    EXPECT_EQ(sroce::load_links(write(text)), want);
    EXPECT_TRUE(sroce::load_links(write("# nothing\n\n")).empty());
    EXPECT_TRUE(sroce::load_links(write("")).empty());
}

TEST_F(ConfigTest, NameLimits) {
    std::string longest(63, 'n');
    EXPECT_EQ(sroce::load_links(write(longest + " netdev lo addr 127.0.0.1\n")).at(0).name,
              longest);
    auto err = load_error(std::string(64, 'n') + " netdev lo addr 127.0.0.1\n");
    ASSERT_TRUE(err);
    EXPECT_NE(err->find("invalid link name"), std::string::npos) << *err;
}

struct BadLine {
    const char *text;
    int line;
    const char *reason;
};

class MalformedTest : public ConfigTest, public ::testing::WithParamInterface<BadLine> {};

TEST_P(MalformedTest, ReportsPathLineAndReason) {
    const BadLine &c = GetParam();
    auto err = load_error(c.text);
    ASSERT_TRUE(err) << "accepted: " << c.text;
    std::string prefix = path() + ":" + std::to_string(c.line) + ": ";
    EXPECT_EQ(err->rfind(prefix, 0), 0u) << *err;
    EXPECT_NE(err->find(c.reason), std::string::npos) << *err;
}

INSTANTIATE_TEST_SUITE_P(
    Config, MalformedTest,
    ::testing::Values(
        BadLine{"sroce0\n", 1, "no 'netdev IF'"},
        BadLine{"sroce0 netdev lo\nsroce1 netdev lo\n", 2,
                "interface lo is already followed by link 'sroce0' on line 1"},
        BadLine{"# c\nsroce0 addr 127.0.0.1\n", 2, "no 'netdev IF'"},
        BadLine{"\n\nsroce0 netdev lo addr\n", 3, "missing value after 'addr'"},
        BadLine{"sroce0 netdev\n", 1, "missing value after 'netdev'"},
        BadLine{"sroce0 netdev lo addr 127.0.0.1 port 1\n", 1, "unknown keyword 'port'"},
        BadLine{"sroce0 netdev lo netdev eth0 addr 127.0.0.1\n", 1, "'netdev' given twice"},
        BadLine{"sroce0 netdev lo addr 127.0.0.1 addr 127.0.0.2\n", 1, "'addr' given twice"},
        BadLine{"sro/ce0 netdev lo addr 127.0.0.1\n", 1, "invalid link name"},
        BadLine{"sroce0 netdev lo addr 127.0.0.256\n", 1, "invalid address '127.0.0.256'"},
        BadLine{"sroce0 netdev lo addr 127.1\n", 1, "invalid address '127.1'"},
        BadLine{"sroce0 netdev lo addr localhost\n", 1, "invalid address 'localhost'"},
        BadLine{"sroce0 netdev lo addr fe80::1%lo\n", 1, "invalid address"},
        BadLine{"sroce0 netdev lo addr ::\n", 1, "address :: of link 'sroce0' is no address of"},
        BadLine{"sroce0 netdev lo addr 0.0.0.0\n", 1, "is no address of one host"},
        BadLine{"sroce0 netdev lo addr 255.255.255.255\n", 1, "is no address of one host"},
        BadLine{"sroce0 netdev lo addr 239.1.2.3\n", 1, "is no address of one host"},
        BadLine{"sroce0 netdev lo addr ff02::1\n", 1, "is no address of one host"},
        BadLine{"sroce0 netdev a/b addr 127.0.0.1\n", 1, "invalid interface name 'a/b'"},
        BadLine{"sroce0 netdev abcdefghijklmnop addr 127.0.0.1\n", 1, "invalid interface name"},
        BadLine{"sroce0 netdev lo addr 127.0.0.1\n"
                "# comment\n"
                "sroce0 netdev lo addr 127.0.0.2\n",
                3, "duplicate link name 'sroce0' (first defined on line 1)"},
        BadLine{"a netdev lo addr 127.0.0.1\n"
                "b netdev lo addr 127.0.0.2\n"
                "c netdev eth0 addr 127.0.0.1\n",
                3, "address 127.0.0.1 is already used by link 'a' on line 1"},
        // Different spellings of one address are still one endpoint.
        BadLine{"a netdev lo addr ::1\nb netdev lo addr 0:0::1\n", 2, "already used by link 'a'"},
        BadLine{"a netdev lo addr 10.0.0.1\nb netdev lo addr ::ffff:10.0.0.1\n", 2,
                "already used by link 'a'"},
        // Congestion control and its parameters.
        BadLine{"a netdev lo cc\n", 1, "missing value after 'cc'"},
        BadLine{"a netdev lo cc maybe\n", 1,
                "unknown congestion control 'maybe' (expected dcqcn or off)"},
        BadLine{"a netdev lo cc dcqcn stages 1.5\n", 1,
                "invalid stages '1.5' (stages, an integer from 0 to 100)"},
        BadLine{"a netdev lo cnp-dscp 64\n", 1, "invalid cnp-dscp '64'"},
        BadLine{"a netdev lo ai-rate -1\n", 1, "invalid ai-rate '-1'"},
        BadLine{"a netdev lo ai-rate 1x\n", 1, "invalid ai-rate '1x'"},
        BadLine{"a netdev lo min-rate 0\n", 1, "invalid min-rate '0'"},
        BadLine{"a netdev lo rate-timer\n", 1, "missing value after 'rate-timer'"},
        BadLine{"a netdev lo cc dcqcn ai-rate 1 stages 2 ai-rate 3\n", 1, "'ai-rate' given twice"},
        BadLine{"a netdev lo cc dcqcn cc off\n", 1, "'cc' given twice"}));

TEST_F(ConfigTest, CongestionControl) {
    auto links =
        sroce::load_links(write("a netdev lo addr 127.0.0.1 cc off ai-rate 2.5 cnp-interval 20\n"
                                "b netdev lo addr 127.0.0.2\n"));
    ASSERT_EQ(links.size(), 2u);
    sroce::CcParams want;
    want.enabled = false;
    want.ai_rate = 2.5;
    want.cnp_interval = 20;
    EXPECT_EQ(links[0].cc, want);
    // Unsaid: off, with the defaults.
    EXPECT_EQ(links[1].cc, sroce::CcParams{});
    EXPECT_FALSE(links[1].cc.enabled);
    // Saved with what differs from the defaults only, and read back.
    links[1].cc.alpha_g = 1.0 / 64;
    sroce::save_links(path(), links);
    EXPECT_EQ(sroce::load_links(path()), links);
    std::ifstream in(path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("a netdev lo addr 127.0.0.1 cc off cnp-interval 20 ai-rate 2.5\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("b netdev lo addr 127.0.0.2 cc off alpha-g 0.015625\n"), std::string::npos)
        << text;
    // Every parameter has a name, a range that holds its default, a unit.
    const sroce::CcParams defaults;
    for (const sroce::CcParamInfo &p : sroce::cc_params()) {
        SCOPED_TRACE(p.name);
        EXPECT_GE(defaults.*p.field, p.min);
        EXPECT_LE(defaults.*p.field, p.max);
        sroce::CcParams c;
        EXPECT_EQ(sroce::set_cc_param(c, p.name, "7x")
                      .rfind(std::string("invalid ") + p.name + " '7x' (" + p.unit + ", ", 0),
                  0u);
        EXPECT_EQ(c, defaults);
    }
    sroce::CcParams c;
    EXPECT_EQ(sroce::set_cc_param(c, "no-such", "1"),
              "unknown congestion control parameter 'no-such'");
}

TEST_F(ConfigTest, UnreadableFileThrows) {
    fs::create_directory(path());
    EXPECT_THROW(sroce::load_links(path()), std::runtime_error);
}

TEST(ConfigPath, EnvironmentOverride) {
    EnvGuard guard("SROCE_CONFIG");
    ::unsetenv("SROCE_CONFIG");
    EXPECT_EQ(sroce::config_path(), "/etc/sroce/links.conf");
    ::setenv("SROCE_CONFIG", "", 1);
    EXPECT_EQ(sroce::config_path(), "/etc/sroce/links.conf");
    ::setenv("SROCE_CONFIG", "/tmp/x/links.conf", 1);
    EXPECT_EQ(sroce::config_path(), "/tmp/x/links.conf");
}

TEST_F(ConfigTest, EnvironmentOverrideIsWhatLoads) {
    EnvGuard guard("SROCE_CONFIG");
    sroce::save_links(path("other.conf"), sample);
    ::setenv("SROCE_CONFIG", path("other.conf").c_str(), 1);
    EXPECT_EQ(sroce::load_links(sroce::config_path()), sample);
}

TEST(Addresses, Canonical) {
    EXPECT_EQ(sroce::canonical_addr("127.0.0.1"), "127.0.0.1");
    EXPECT_EQ(sroce::canonical_addr("0:0::1"), "::1");
    EXPECT_EQ(sroce::canonical_addr("::ffff:10.1.2.3"), "10.1.2.3");
    EXPECT_EQ(sroce::canonical_addr("FD00::A"), "fd00::a");
    EXPECT_EQ(sroce::canonical_addr("10.1"), "");
    EXPECT_EQ(sroce::canonical_addr(""), "");
    EXPECT_TRUE(sroce::is_ipv6_addr("fd00::1"));
    EXPECT_FALSE(sroce::is_ipv6_addr("10.0.0.1"));
}

TEST(RoceMtu, FromInterfaceMtu) {
    EXPECT_EQ(sroce::roce_mtu(65536), 4096);
    EXPECT_EQ(sroce::roce_mtu(9000), 4096);
    EXPECT_EQ(sroce::roce_mtu(4096 + 72), 4096);
    EXPECT_EQ(sroce::roce_mtu(4096 + 71), 2048);
    EXPECT_EQ(sroce::roce_mtu(1500), 1024);
    EXPECT_EQ(sroce::roce_mtu(256 + 72), 256);
    EXPECT_EQ(sroce::roce_mtu(256 + 71), 0);
    EXPECT_EQ(sroce::roce_mtu(1024 + 72, true), 512);
    EXPECT_EQ(sroce::roce_mtu(1024 + 92, true), 1024);
}

TEST(Interfaces, Loopback) {
    if (!sroce::interface_exists("lo")) GTEST_SKIP() << "no loopback interface";
    EXPECT_GE(sroce::interface_mtu("lo"), 68);
    // A fresh network namespace has lo down and without addresses.
    if (sroce::interface_running("lo")) {
        EXPECT_EQ(sroce::interface_ipv4("lo"), "127.0.0.1");
    }
}

TEST(Interfaces, Unknown) {
    EXPECT_FALSE(sroce::interface_exists("nosuchif0"));
    EXPECT_FALSE(sroce::interface_exists("bad/name"));
    EXPECT_FALSE(sroce::interface_exists(""));
    EXPECT_FALSE(sroce::interface_running("nosuchif0"));
    EXPECT_THROW(sroce::interface_mtu("nosuchif0"), std::runtime_error);
    EXPECT_THROW(sroce::interface_mtu("a-name-much-too-long"), std::runtime_error);
    try {
        sroce::interface_ipv4("nosuchif0");
        FAIL() << "expected an exception";
    } catch (const std::runtime_error &e) {
        EXPECT_NE(std::string(e.what()).find("no such interface"), std::string::npos) << e.what();
    }
}

// The port of a link: up only with its address on the host and its
// interface up with carrier.  Nothing is sent; the checks only bind.
TEST(Interfaces, LinkDownReason) {
    if (!sroce::interface_running("lo") || !sroce::address_local("127.0.0.1", "lo"))
        GTEST_SKIP() << "loopback is down";
    EXPECT_EQ(sroce::link_down_reason({"l", "lo", "127.0.0.1"}), 0);
    // 192.0.2.0/24 is TEST-NET-1, never a host's address.
    EXPECT_FALSE(sroce::address_local("192.0.2.1", "lo"));
    EXPECT_EQ(sroce::link_down_reason({"l", "lo", "192.0.2.1"}), EADDRNOTAVAIL);
    EXPECT_EQ(sroce::link_down_reason({"l", "nosuchif0", "127.0.0.1"}), ENETDOWN);
    EXPECT_EQ(sroce::link_down_reason({"l", "bad/name", "127.0.0.1"}), ENETDOWN);
    // A missing address is told first: it is what keeps the device from working.
    EXPECT_EQ(sroce::link_down_reason({"l", "nosuchif0", "192.0.2.1"}), EADDRNOTAVAIL);
    EXPECT_EQ(sroce::link_down_reason({"l", "lo", "not-an-address"}), EADDRNOTAVAIL);
}

TEST_F(ConfigTest, LockCreatesDirectory) {
    std::string p = path("locked/links.conf");
    {
        sroce::ConfigLock lock(p);
        EXPECT_TRUE(fs::is_directory(path("locked")));
        sroce::save_links(p, sample);
    }
    EXPECT_EQ(sroce::load_links(p), sample);
}
