// SPDX-License-Identifier: MIT
//
// Connection management in the agent: the rdma_cm of the kernel's
// drivers/infiniband/core/cma.c (ids, addresses, ports, listeners, events)
// over the InfiniBand CM of cm.c (REQ/REP/RTU/REJ/MRA/DREQ/DREP/SIDR on QP1,
// retransmission, timewait), served to processes through the kernel's
// rdma_ucm command ABI (<rdma/rdma_user_cm.h>), so that rdma-core's own
// librdmacm runs over it unchanged (docs/connection-manager.md).
//
// Single-threaded: the agent's loop calls everything here.
#pragma once

#include "agent_proto.hpp"
#include "cm_wire.hpp"
#include "inet.hpp"

#include <rdma/rdma_user_cm.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <netinet/in.h>
#include <string>
#include <vector>

namespace sroce::agent {

// A device as one process knows it: what the ucma ABI reports about it must
// match what that process's libibverbs says (GUID, index, GID table).
struct CmDevice {
    IpAddr addr; // IPv6 or IPv4-mapped; empty: it follows `netdev`
    // Every address of `netdev` is the device's (it follows its net device).
    bool follow = false;
    char netdev[16] = {};
    uint64_t guid = 0; // node GUID as stored in ibv_device_attr (network order bytes)
    uint32_t index = 0;
    uint8_t mtu = 3; // ibv_mtu of the port
    char name[64] = {};
    // The process's GID table when it opened its channel, by index (empty
    // entries unused): the sgid_index an address handle names.
    std::vector<IpAddr> gids;
};

// Sends a 256-byte MAD from the device at `local` to QP1 at `remote`.
using MadSender =
    std::function<void(const IpAddr &local, const IpAddr &remote, const uint8_t *mad)>;

// What the CM asks the host's IP stack.  The agent asks the kernel; a
// harness that must not depend on the host's addresses and routes (fuzzing)
// answers itself.  `scope`: the interface a link-local IPv6 address is on.
struct HostRoutes {
    // Whether `addr` is an address of this host now (a socket can bind it).
    bool (*is_local)(const IpAddr &addr, uint32_t scope);
    // The source address the host would send from to reach `dst`; empty if
    // none.
    IpAddr (*source_for)(const IpAddr &dst, uint32_t scope);
    // Whether `addr` is an address of interface `netdev`; none: never.
    bool (*on_interface)(const IpAddr &addr, const char *netdev) = nullptr;
    // net.ipv6.bindv6only: an IPv6 id's RDMA_OPTION_ID_AFONLY until set.
    bool bindv6only = false;
};
// The kernel's answers.
HostRoutes kernel_routes();

class Cm {
  public:
    // librdmacm keeps id handles below 65536 in its index map, so they are
    // one space for every process; no user may take more than a quarter.
    static constexpr uint32_t kMaxIds = 65535;
    static constexpr uint32_t kIdsPerUser = 16384;
    // Multicast joins one user may hold: as many groups as its processes
    // could attach on one address (kSlotsPerUser processes, 32 groups each:
    // the device's max_mcast_grp).  The kernel's rdma_cm sets none of its
    // own, so beyond it the answer is the IP stack's for a socket past
    // net.ipv4.igmp_max_memberships, ENOBUFS: EMFILE would send the user to
    // ulimit -n, which has nothing to do with it.
    static constexpr uint32_t kJoinsPerUser = kSlotsPerUser * 32;
    // Undelivered events one channel may hold: as many as its user may hold
    // ids, so a process that starts a resolution on each id before reading
    // any is never refused.  A command that would queue past it gets
    // ENOBUFS, as a netlink socket whose reader fell behind; a connection
    // request to one of its listeners is dropped as past the backlog.
    static constexpr uint32_t kEventsPerChannel = kIdsPerUser;

    explicit Cm(MadSender send, HostRoutes host = kernel_routes());
    ~Cm();

    // A process's event channel: `event_fd` gets one byte per event queued
    // (what poll(2) on the rdma_cm file sees), the events themselves are
    // fetched with GET_EVENT.  `bind_service`: the process may bind ports
    // below 1024 (CAP_NET_BIND_SERVICE where the agent's network namespace
    // lives).  Returns the channel's number.
    uint32_t open_channel(int event_fd, pid_t pid, uid_t uid, bool bind_service,
                          std::vector<CmDevice> devs);
    // The process closed the file (or died): its ids go as on close(2).
    void close_channel(uint32_t ch);
    // Whether channel `ch` exists and was opened by process `pid` of `uid`.
    bool channel_owned_by(uint32_t ch, pid_t pid, uid_t uid) const;
    // One rdma_ucm command of channel `ch`: `in` is the command struct after
    // its header (with any user pointer's data inlined by the process), the
    // reply's bytes go to `out` (at most out_cap).  Returns 0 or an errno.
    int command(uint32_t ch, uint32_t cmd, const uint8_t *in, size_t in_len, uint8_t *out,
                size_t out_cap, size_t *out_len);

    // A MAD that reached QP1 of the device at `local`, sent from `remote`.
    void receive(const IpAddr &local, const IpAddr &remote, const uint8_t *mad, size_t len);

    // Milliseconds until the next timer, or -1 with none; fires due ones.
    int timers(uint64_t now_ms);

    struct Stats {
        uint64_t rx_mads = 0, tx_mads = 0, rx_bad = 0, retries = 0;
    };
    const Stats &stats() const { return stats_; }

    struct Listener {
        IpAddr addr;   // empty: any (IPv4 also, unless `afonly`)
        int family;    // AF_INET or AF_INET6
        bool afonly;   // RDMA_OPTION_ID_AFONLY
        uint16_t port; // host order
        uint16_t ps;
        pid_t pid;
    };
    // Who listens where, for `sroce agent status` (and tests that must not
    // connect before a server listens).
    std::vector<Listener> listeners() const;

    struct Join {
        IpAddr group;
        IpAddr addr; // the joining id's device
        bool send_only;
        pid_t pid;
    };
    // The multicast joins, for `sroce agent status` (and tests whose sender
    // must not send before the receivers joined).
    std::vector<Join> joins() const;

    struct Id;
    struct Channel;
    struct McJoin;

  private:
    // rdma_cm layer
    int create_id(Channel &c, const rdma_ucm_create_id &cmd, uint8_t *out, size_t *out_len);
    int destroy_id(Channel &c, uint32_t id, uint8_t *out, size_t *out_len);
    int bind(Id &id, const SockAddr &sa);
    int resolve_addr(Id &id, const void *src, const void *dst, uint32_t timeout_ms);
    int resolve_route(Id &id);
    int query_route(Id &id, uint8_t *out, size_t *out_len);
    int query(Id &id, uint32_t option, uint8_t *out, size_t cap, size_t *out_len);
    int connect(Id &id, const rdma_ucm_conn_param &p, const rdma_ucm_ece &ece);
    // The active side's start, REQ or SIDR_REQ: its local communication ID,
    // transaction ID and peer.
    void begin_connect(Id &id);
    // The rdma_cm header (addresses, port) then the user's data, at `pd`.
    static void store_private_data(const Id &id, const rdma_ucm_conn_param &p, uint8_t *pd);
    int listen(Id &id, uint32_t backlog);
    int accept(Id &id, uint64_t uid, const rdma_ucm_conn_param &p, const rdma_ucm_ece &ece,
               bool has_param);
    int reject(Id &id, const rdma_ucm_reject &cmd);
    int disconnect(Id &id);
    int init_qp_attr(Id &id, uint32_t state, uint8_t *out, size_t *out_len);
    int get_event(Channel &c, uint8_t *out, size_t cap, size_t *out_len);
    int set_option(Id &id, uint32_t level, uint32_t name, const uint8_t *val, uint32_t len);
    int notify(Id &id, uint32_t event);
    int migrate(Channel &to, uint32_t from_ch, uint32_t id, uint8_t *out, size_t *out_len);
    // UD ids (cm_ud.cpp): SIDR and multicast.
    int connect_ud(Id &id, const rdma_ucm_conn_param &p);
    int accept_ud(Id &id, uint64_t uid, const rdma_ucm_conn_param *p, const rdma_ucm_ece &ece);
    int join(Channel &c, const rdma_ucm_join_mcast &cmd, size_t out_cap, uint8_t *out,
             size_t *out_len);
    int leave(Channel &c, uint32_t mc, uint8_t *out, size_t out_cap, size_t *out_len);
    // The id's joins end with it, their queued events too.
    void drop_joins(Channel &c, uint32_t id);
    // Ends join `it` (its events already gone) and gives it back to its
    // user's kJoinsPerUser; the next join.
    std::map<uint32_t, McJoin>::iterator erase_join(std::map<uint32_t, McJoin>::iterator it);
    static uint32_t qkey_of(const Id &id);

    Id *find_id(uint32_t handle);
    CmDevice *device_of(Channel &c, const IpAddr &addr);
    // The index of the id's source address in its device's GID table.
    uint8_t sgid_index(const Id &id);
    // The path's flow label (cma_get_roce_udp_flow_label).
    static uint32_t flow_label(const Id &id);
    bool port_free(const Id &id, uint16_t port) const; // host order
    uint16_t ephemeral_port(const Id &id) const;
    // Queues `e` as `event` of `id` (e.id names another id when set: a
    // connection request's new one) and wakes the channel's file.
    void queue_event(const Id &id, uint32_t event, int status, rdma_ucm_event_resp e = {});
    void push_event(Channel &c, const rdma_ucm_event_resp &e);
    // Whether the process may queue `n` more events on `c` by a command
    // (kEventsPerChannel); the agent's log says so the first time it may not.
    bool event_room(Channel &c, size_t n = 1);
    void free_id(Id *id);

    // InfiniBand CM layer
    void recv_req(const IpAddr &local, const IpAddr &remote, const cm::Mad &m);
    void recv_rep(const cm::Mad &m);
    void recv_rtu(const cm::Mad &m);
    void recv_rej(const cm::Mad &m);
    void recv_mra(const cm::Mad &m);
    void recv_dreq(const IpAddr &local, const IpAddr &remote, const cm::Mad &m);
    void recv_drep(const cm::Mad &m);
    void recv_sidr_req(const IpAddr &local, const IpAddr &remote, const cm::Mad &m);
    void recv_sidr_rep(const cm::Mad &m);
    // Answers the SIDR_REQ `id` holds with `status` (QP `qpn` on success).
    void send_sidr_rep(Id &id, uint8_t status, uint32_t qpn, const uint8_t *pd, size_t pd_len);
    // Sends `body` as message `attr` of the id's connection; with a timeout,
    // again after each until the retries run out (timers()).
    void send_mad(Id &id, uint16_t attr, const uint8_t *body, uint32_t timeout_ms = 0,
                  uint32_t attr_mod = 0);
    void reply_mad(const IpAddr &local, const IpAddr &remote, uint64_t tid, uint16_t attr,
                   const uint8_t *body);
    void send_rej(Id &id, uint16_t reason, uint8_t msg_rejected, const uint8_t *pd, size_t pd_len);
    void send_dreq(Id &id);
    void send_drep(Id &id);
    void enter_timewait(Id &id);
    void cm_reset(Id &id);
    Id *by_local_comm(uint32_t local_comm);
    // The listener a REQ or SIDR_REQ for service `sid` reaches, by the
    // rdma_cm header of its private data `pd`.
    struct Match {
        Id *lis = nullptr;
        bool any_port = false; // someone listens on the service's port
        IpAddr dst_ip, src_ip; // from the rdma_cm header
        int family = AF_INET;  // its IP version's
        uint16_t src_port = 0;
    };
    Match match_listener(uint64_t sid, const uint8_t *pd, size_t pd_len);
    // The new id of a request `lis` takes, on channel `c` (its uid stays 0
    // until the process accepts), or nullptr.
    Id *new_conn_id(Channel &c, Id &lis, const Match &mt);

    MadSender send_;
    HostRoutes host_;
    Stats stats_;
    std::map<uint32_t, std::unique_ptr<Channel>> channels_;
    std::map<uint32_t, std::unique_ptr<Id>> ids_;
    // Handles: never used ones first, then freed ones oldest first, so a
    // handle comes back as late as possible; O(1) either way.
    uint32_t next_fresh_id_ = 1;
    std::deque<uint32_t> free_ids_;
    std::map<uid_t, uint32_t> ids_of_user_; // ids each user holds (kIdsPerUser)
    std::map<uint32_t, McJoin> mcs_;
    std::map<uid_t, uint32_t> joins_of_user_; // joins each user holds (kJoinsPerUser)
    uint32_t next_mc_ = 0x10000;
    uint32_t next_channel_ = 1, next_comm_ = 0;
    uint32_t comm_xor_ = 0;
};

} // namespace sroce::agent
