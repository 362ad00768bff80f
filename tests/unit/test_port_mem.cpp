// SPDX-License-Identifier: MIT
//
// The in-memory wire itself (port_mem.hpp), without a device: what a test's
// peer sends and receives, what no address takes, what is too large, and a
// receive queue nobody empties.
#include "port_mem.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <cstring>
#include <poll.h>
#include <vector>

using namespace sroce;

namespace {

in_addr_t ip4(const char *s) {
    in_addr a{};
    inet_pton(AF_INET, s, &a);
    return a.s_addr;
}

sockaddr_in from(const char *addr, uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = ip4(addr);
    return sa;
}

class PortMem : public ::testing::Test {
  protected:
    void TearDown() override { memwire::reset(); }
};

TEST_F(PortMem, NobodyAtTheAddressIsFalse) {
    uint8_t b[64] = {};
    EXPECT_FALSE(memwire::send(from("127.0.8.1", 4791), ip4("127.0.8.2"), b, sizeof b));
}

// A run reaches a listening peer as one packet each, with its place in the
// run as its IP ID and the sender's address and port.
TEST_F(PortMem, ListenerGetsARunPacketByPacket) {
    memwire::listen(ip4("127.0.8.2"));
    std::vector<uint8_t> run(250);
    for (size_t i = 0; i < run.size(); i++)
        run[i] = uint8_t(i);
    ASSERT_TRUE(
        memwire::send(from("127.0.8.1", 50000), ip4("127.0.8.2"), run.data(), run.size(), 100));
    memwire::Packet p;
    for (uint16_t k = 0; k < 3; k++) {
        ASSERT_TRUE(memwire::take(ip4("127.0.8.2"), p)) << k;
        EXPECT_EQ(p.ip.ip_id, k);
        EXPECT_EQ(p.ip.sport, 50000);
        EXPECT_EQ(p.ip.src, IpAddr::v4(ip4("127.0.8.1")));
        ASSERT_EQ(p.bytes.size(), k < 2 ? 100u : 50u);
        EXPECT_EQ(p.bytes[0], uint8_t(k * 100));
    }
    EXPECT_FALSE(memwire::take(ip4("127.0.8.2"), p));
}

TEST_F(PortMem, DatagramLargerThanUdpIsRefused) {
    MemPort port(IpAddr::v4(ip4("127.0.8.3")));
    std::vector<uint8_t> big(Port::kMaxDatagram + 1);
    EXPECT_FALSE(memwire::send(from("127.0.8.1", 4791), ip4("127.0.8.3"), big.data(), big.size()));
    big.resize(Port::kMaxDatagram);
    EXPECT_TRUE(memwire::send(from("127.0.8.1", 4791), ip4("127.0.8.3"), big.data(), big.size()));
    RxDatagram d[Port::kRxBatch];
    ASSERT_EQ(port.receive(d, Port::kRxBatch), 1);
    EXPECT_EQ(d[0].len, Port::kMaxDatagram);
}

// A port nobody receives from keeps a bounded queue: the rest is dropped,
// as a full socket buffer drops, and what was kept comes out in order.
TEST_F(PortMem, FullQueueDrops) {
    MemPort port(IpAddr::v4(ip4("127.0.8.4")));
    for (uint32_t i = 0; i < 10000; i++)
        ASSERT_TRUE(memwire::send(from("127.0.8.1", 4791), ip4("127.0.8.4"),
                                  reinterpret_cast<const uint8_t *>(&i), sizeof i));
    RxDatagram d[Port::kRxBatch];
    uint32_t got = 0;
    for (int n; (n = port.receive(d, Port::kRxBatch)) > 0;)
        for (int k = 0; k < n; k++, got++) {
            uint32_t v;
            std::memcpy(&v, d[k].data, sizeof v);
            ASSERT_EQ(v, got);
        }
    EXPECT_GT(got, 0u);
    EXPECT_LT(got, 10000u);
}

bool readable(int fd) {
    pollfd p = {fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// The descriptor a progress thread sleeps on is readable exactly while the
// queue holds something: set when a datagram arrives (also one that came
// before anybody asked for the descriptor), kept while a pass leaves some,
// cleared when a pass empties the queue.
TEST_F(PortMem, EventIsSetWhileTheQueueHoldsSomething) {
    MemPort port(IpAddr::v4(ip4("127.0.8.5")));
    uint8_t b[8] = {};
    auto send = [&] {
        ASSERT_TRUE(memwire::send(from("127.0.8.1", 4791), ip4("127.0.8.5"), b, sizeof b));
    };
    send();
    pollfd p[1];
    ASSERT_EQ(port.poll_fds(p, 1), 1);
    int fd = p[0].fd;
    EXPECT_TRUE(readable(fd)) << "a datagram queued before the descriptor was asked for";
    RxDatagram d[Port::kRxBatch];
    EXPECT_EQ(port.receive(d, Port::kRxBatch), 1);
    EXPECT_FALSE(readable(fd));
    EXPECT_EQ(port.receive(d, Port::kRxBatch), 0);
    EXPECT_FALSE(readable(fd));

    send();
    send();
    send();
    EXPECT_TRUE(readable(fd));
    EXPECT_EQ(port.receive(d, 2), 2);
    EXPECT_TRUE(readable(fd)) << "one left";
    EXPECT_EQ(port.receive(d, 2), 1);
    EXPECT_FALSE(readable(fd));
    ASSERT_EQ(port.poll_fds(p, 1), 1);
    EXPECT_EQ(p[0].fd, fd) << "one descriptor for the port's life";
}

} // namespace
