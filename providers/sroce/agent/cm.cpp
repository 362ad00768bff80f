// SPDX-License-Identifier: MIT
//
// rdma_cm ids and the InfiniBand CM under them (cm.hpp).  The behaviour is
// the Linux kernel's (cma.c, cm.c, ucma.c), point by point where librdmacm
// or a kernel peer can tell the difference; docs/connection-manager.md lists
// the choices.
#include "cm.hpp"
#include "cm_internal.hpp"
#include "config.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <random>
#include <unistd.h>

namespace sroce::agent {

namespace {

// The local source address the kernel would pick to reach `dst`.
IpAddr route_source(const IpAddr &dst, uint32_t scope) {
    SockAddr sa(dst, 9, scope);
    int fd = socket(sa.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return {};
    IpAddr src;
    if (::connect(fd, &sa.sa, sa.len) == 0) {
        SockAddr me;
        socklen_t l = sizeof me.in6;
        if (getsockname(fd, &me.sa, &l) == 0) src = me.addr();
    }
    close(fd);
    return src;
}

// Whether `a` is an address of this host now (a socket can bind it).
bool local_address(const IpAddr &a, uint32_t scope) {
    SockAddr sa(a, 0, scope);
    int fd = socket(sa.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return true; // no answer: let the bind that follows tell
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    bool local = ::bind(fd, &sa.sa, sa.len) == 0;
    close(fd);
    return local;
}

bool interface_address(const IpAddr &a, const char *netdev) {
    std::vector<IpAddr> on = netdev_addrs(netdev);
    return std::find(on.begin(), on.end(), a) != on.end();
}

bool bindv6only() {
    FILE *f = fopen("/proc/sys/net/ipv6/bindv6only", "re");
    if (!f) return false;
    int v = 0;
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
    return v != 0;
}

} // namespace

HostRoutes kernel_routes() {
    return {local_address, route_source, interface_address, bindv6only()};
}

Cm::Cm(MadSender send, HostRoutes host) : send_(std::move(send)), host_(host) {
    std::random_device rd;
    comm_xor_ = rd();
    next_comm_ = rd();
}

Cm::~Cm() = default;

// ------------------------------------------------------------ channels

uint32_t Cm::open_channel(int event_fd, pid_t pid, uid_t uid, bool bind_service,
                          std::vector<CmDevice> devs) {
    auto c = std::make_unique<Channel>();
    c->num = next_channel_++;
    c->event_fd = event_fd;
    c->pid = pid;
    c->uid = uid;
    c->bind_service = bind_service;
    c->devs = std::move(devs);
    uint32_t n = c->num;
    channels_[n] = std::move(c);
    return n;
}

void Cm::close_channel(uint32_t ch) {
    auto it = channels_.find(ch);
    if (it == channels_.end()) return;
    std::vector<uint32_t> mine;
    for (auto &[h, id] : ids_)
        if (id->ch == ch && !id->destroyed) mine.push_back(h);
    for (uint32_t h : mine) {
        size_t len = 0;
        uint8_t out[4];
        destroy_id(*it->second, h, out, &len);
    }
    channels_.erase(it);
}

std::vector<Cm::Listener> Cm::listeners() const {
    std::vector<Listener> out;
    for (auto &[h, id] : ids_) {
        if (id->destroyed || id->state != IdState::kListen) continue;
        auto ch = channels_.find(id->ch);
        out.push_back({id->src.addr(), id->src.family(), id->afonly, id->src.port(), id->ps,
                       ch == channels_.end() ? 0 : ch->second->pid});
    }
    return out;
}

bool Cm::channel_owned_by(uint32_t ch, pid_t pid, uid_t uid) const {
    auto it = channels_.find(ch);
    return it != channels_.end() && it->second->pid == pid && it->second->uid == uid;
}

Cm::Id *Cm::find_id(uint32_t handle) {
    auto it = ids_.find(handle);
    return it == ids_.end() || it->second->destroyed ? nullptr : it->second.get();
}

CmDevice *Cm::device_of(Channel &c, const IpAddr &addr) {
    if (addr.empty()) return nullptr;
    for (CmDevice &d : c.devs)
        if (d.follow ? host_.on_interface && host_.on_interface(addr, d.netdev) : d.addr == addr)
            return &d;
    return nullptr;
}

uint8_t Cm::sgid_index(const Id &id) {
    auto c = channels_.find(id.ch);
    CmDevice *d = c == channels_.end() ? nullptr : device_of(*c->second, id.dev);
    IpAddr src = id.src.addr();
    if (d)
        for (size_t i = 0; i < d->gids.size(); i++)
            if (d->gids[i] == src) return uint8_t(i);
    // Not in the table the process gave (an address that came later): where
    // a device pinned to one address has it.
    return 1;
}

uint32_t Cm::flow_label(const Id &id) {
    // An IPv6 id keeps the flow label its process bound with; else a hash of
    // the ports, so that connections between two hosts spread over paths.
    uint32_t fl = id.src.family() == AF_INET6 ? ntohl(id.src.in6.sin6_flowinfo) & 0xFFFFF : 0;
    return fl ? fl : (uint32_t(id.src.port()) * 31 + id.dst.port()) & 0xFFFFF;
}

void Cm::queue_event(const Id &id, uint32_t event, int status, rdma_ucm_event_resp e) {
    auto ch = channels_.find(id.ch);
    // ucma queues nothing for an id the process has not taken yet (uid 0:
    // a connection request not accepted) or has let go.
    if (ch == channels_.end() || id.destroyed || id.uid == 0) return;
    e.uid = id.uid;
    if (!e.id) e.id = id.handle;
    e.event = event;
    e.status = uint32_t(status);
    push_event(*ch->second, e);
}

void Cm::push_event(Channel &c, const rdma_ucm_event_resp &e) {
    c.events.push_back(e);
    char b = 1;
    if (send(c.event_fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        // A full wake-up queue only makes poll(2) late, never wrong: the
        // events are all there for GET_EVENT.
    }
}

bool Cm::event_room(Channel &c, size_t n) {
    // Only what the process asks for is refused: what the network brings to
    // a connection it holds (response, establishment, rejection,
    // disconnection, timewait's end) is a handful of events in an id's life,
    // bounded with the ids, and cannot be refused without losing the state.
    if (c.events.size() + n <= kEventsPerChannel) return true;
    if (!c.told_full)
        fprintf(stderr,
                "sroce agent: rdma_cm channel %u (pid %d, uid %u) holds %zu undelivered events, "
                "the most a channel may; its commands that would queue more get ENOBUFS "
                "until it reads some\n",
                c.num, int(c.pid), unsigned(c.uid), c.events.size());
    c.told_full = true;
    return false;
}

int Cm::get_event(Channel &c, uint8_t *out, size_t cap, size_t *out_len) {
    if (cap < offsetof(rdma_ucm_event_resp, reserved)) return ENOSPC;
    if (c.events.empty()) return EAGAIN;
    rdma_ucm_event_resp e = c.events.front();
    c.events.pop_front();
    // A connection request counts on its listener, whose backlog slot it
    // gives back.
    // A join's event counts on the join and on its id (ucma_get_event).
    uint32_t owner = e.id;
    if (auto mc = mcs_.find(e.id); e.id >= kMcHandleBase && mc != mcs_.end()) {
        mc->second.events_reported++;
        owner = mc->second.id;
    }
    if (auto it = ids_.find(owner); it != ids_.end()) {
        Id *counted = it->second.get();
        if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST)
            if (auto l = ids_.find(counted->listener); l != ids_.end()) {
                counted = l->second.get();
                if (counted->pending) counted->pending--;
            }
        counted->events_reported++;
    }
    size_t n = std::min(cap, sizeof e);
    std::memcpy(out, &e, n);
    *out_len = n;
    return 0;
}

// ------------------------------------------------------------ commands

int Cm::command(uint32_t chn, uint32_t cmd, const uint8_t *in, size_t in_len, uint8_t *out,
                size_t out_cap, size_t *out_len) {
    *out_len = 0;
    auto cit = channels_.find(chn);
    if (cit == channels_.end()) return EBADF;
    Channel &c = *cit->second;
    // Every command's struct starts after the header; fields the process
    // did not send read as zero, as the kernel's copy of a short command.
    uint8_t buf[512] = {};
    std::memcpy(buf, in, std::min(in_len, sizeof buf));
    auto id_at = [&](size_t off, Id **idp) -> int {
        uint32_t h;
        std::memcpy(&h, buf + off, 4);
        Id *id = find_id(h);
        if (!id) return ENOENT;
        if (id->ch != chn) return EINVAL;
        *idp = id;
        return 0;
    };
    Id *id = nullptr;
    switch (cmd) {
    // As the kernel: a response that does not fit is ENOSPC before anything
    // is done, or (QUERY_ROUTE past its first fields) cut short.
    case RDMA_USER_CM_CMD_CREATE_ID:
        if (out_cap < sizeof(rdma_ucm_create_id_resp)) return ENOSPC;
        return create_id(c, load<rdma_ucm_create_id>(buf, sizeof buf), out, out_len);
    case RDMA_USER_CM_CMD_DESTROY_ID: {
        if (out_cap < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
        auto d = load<rdma_ucm_destroy_id>(buf, sizeof buf);
        Id *x = find_id(d.id);
        if (!x) return ENOENT;
        if (x->ch != chn) return EINVAL;
        return destroy_id(c, d.id, out, out_len);
    }
    case RDMA_USER_CM_CMD_BIND_IP: {
        auto b = load<rdma_ucm_bind_ip>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_bind_ip, id), &id)) return e;
        SockAddr sa;
        if (!SockAddr::load(&b.addr, &sa)) return EAFNOSUPPORT;
        return bind(*id, sa);
    }
    case RDMA_USER_CM_CMD_BIND: {
        // librdmacm's start-up probe binds AF_IB to learn whether the kernel
        // speaks the newer commands; refused, it uses the older ones (RoCE
        // has no AF_IB addresses to bind anyway).
        auto b = load<rdma_ucm_bind>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_bind, id), &id)) return e;
        if (b.reserved) return EINVAL;
        SockAddr sa;
        if (!SockAddr::load(&b.addr, &sa)) return EAFNOSUPPORT;
        if (b.addr_size != sa.len) return EINVAL;
        return bind(*id, sa);
    }
    case RDMA_USER_CM_CMD_RESOLVE_IP: {
        auto r = load<rdma_ucm_resolve_ip>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_resolve_ip, id), &id)) return e;
        return resolve_addr(*id, &r.src_addr, &r.dst_addr, r.timeout_ms);
    }
    case RDMA_USER_CM_CMD_RESOLVE_ADDR: {
        auto r = load<rdma_ucm_resolve_addr>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_resolve_addr, id), &id)) return e;
        if (r.reserved) return EINVAL;
        return resolve_addr(*id, &r.src_addr, &r.dst_addr, r.timeout_ms);
    }
    case RDMA_USER_CM_CMD_RESOLVE_ROUTE: {
        auto r = load<rdma_ucm_resolve_route>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_resolve_route, id), &id)) return e;
        if (!r.timeout_ms) return EINVAL;
        return resolve_route(*id);
    }
    case RDMA_USER_CM_CMD_QUERY_ROUTE: {
        if (int e = id_at(offsetof(rdma_ucm_query, id), &id)) return e;
        if (out_cap < offsetof(rdma_ucm_query_route_resp, ibdev_index)) return ENOSPC;
        int e = query_route(*id, out, out_len);
        *out_len = std::min(*out_len, out_cap);
        return e;
    }
    case RDMA_USER_CM_CMD_QUERY: {
        auto q = load<rdma_ucm_query>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_query, id), &id)) return e;
        return query(*id, q.option, out, out_cap, out_len);
    }
    case RDMA_USER_CM_CMD_CONNECT: {
        if (in_len < offsetof(rdma_ucm_connect, reserved) + 4) return EINVAL;
        auto k = load<rdma_ucm_connect>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_connect, id), &id)) return e;
        if (!k.conn_param.valid) return EINVAL;
        if (in_len < sizeof k) k.ece = {};
        return connect(*id, k.conn_param, k.ece);
    }
    case RDMA_USER_CM_CMD_LISTEN: {
        auto l = load<rdma_ucm_listen>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_listen, id), &id)) return e;
        return listen(*id, l.backlog);
    }
    case RDMA_USER_CM_CMD_ACCEPT: {
        if (in_len < offsetof(rdma_ucm_accept, reserved) + 4) return EINVAL;
        auto a = load<rdma_ucm_accept>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_accept, id), &id)) return e;
        if (in_len < sizeof a) a.ece = {};
        return accept(*id, a.uid, a.conn_param, a.ece, a.conn_param.valid);
    }
    case RDMA_USER_CM_CMD_REJECT: {
        auto r = load<rdma_ucm_reject>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_reject, id), &id)) return e;
        return reject(*id, r);
    }
    case RDMA_USER_CM_CMD_DISCONNECT:
        if (int e = id_at(offsetof(rdma_ucm_disconnect, id), &id)) return e;
        return disconnect(*id);
    case RDMA_USER_CM_CMD_INIT_QP_ATTR: {
        auto q = load<rdma_ucm_init_qp_attr>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_init_qp_attr, id), &id)) return e;
        if (out_cap < sizeof(ib_uverbs_qp_attr)) return ENOSPC;
        if (q.qp_state > 6) return EINVAL;
        return init_qp_attr(*id, q.qp_state, out, out_len);
    }
    case RDMA_USER_CM_CMD_GET_EVENT:
        return get_event(c, out, out_cap, out_len);
    case RDMA_USER_CM_CMD_SET_OPTION: {
        // The process put optlen bytes of the value right after the struct.
        auto s = load<rdma_ucm_set_option>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_set_option, id), &id)) return e;
        if (sizeof s + s.optlen > in_len) return EFAULT;
        return set_option(*id, s.level, s.optname, in + sizeof s, s.optlen);
    }
    case RDMA_USER_CM_CMD_NOTIFY: {
        auto n = load<rdma_ucm_notify>(buf, sizeof buf);
        if (int e = id_at(offsetof(rdma_ucm_notify, id), &id)) return e;
        return notify(*id, n.event);
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
        // The process replaced the old file descriptor with the old
        // channel's number.
        auto m = load<rdma_ucm_migrate_id>(buf, sizeof buf);
        if (out_cap < 4) return ENOSPC;
        return migrate(c, m.fd, m.id, out, out_len);
    }
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST: {
        // The older command: a full member's join of an address in a
        // sockaddr_in6-sized field.
        auto j = load<rdma_ucm_join_ip_mcast>(buf, sizeof buf);
        rdma_ucm_join_mcast k{};
        k.uid = j.uid;
        k.id = j.id;
        k.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
        std::memcpy(&k.addr, &j.addr, sizeof j.addr);
        k.addr_size = j.addr.sin6_family == AF_INET    ? sizeof(sockaddr_in)
                      : j.addr.sin6_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                       : 0;
        if (!k.addr_size) return EINVAL;
        return join(c, k, out_cap, out, out_len);
    }
    case RDMA_USER_CM_CMD_JOIN_MCAST:
        return join(c, load<rdma_ucm_join_mcast>(buf, sizeof buf), out_cap, out, out_len);
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
        auto d = load<rdma_ucm_destroy_id>(buf, sizeof buf);
        return leave(c, d.id, out, out_cap, out_len);
    }
    case RDMA_USER_CM_CMD_GET_OPTION:
        return ENOSYS;
    default:
        return EINVAL;
    }
}

int Cm::create_id(Channel &c, const rdma_ucm_create_id &cmd, uint8_t *out, size_t *out_len) {
    uint8_t qp_type;
    switch (cmd.ps) {
    case RDMA_PS_TCP:
        qp_type = 2; // IB_QPT_RC
        break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
        qp_type = 4; // IB_QPT_UD
        break;
    case RDMA_PS_IB:
        qp_type = cmd.qp_type;
        break;
    default:
        return EINVAL;
    }
    // One user's limit is EMFILE (too many of its own); the space running
    // out, ENOMEM as in the kernel.
    if (ids_of_user_[c.uid] >= kIdsPerUser) return EMFILE;
    uint32_t h;
    if (next_fresh_id_ <= kMaxIds) {
        h = next_fresh_id_++;
    } else if (!free_ids_.empty()) {
        h = free_ids_.front();
        free_ids_.pop_front();
    } else {
        return ENOMEM;
    }
    ids_of_user_[c.uid]++;
    auto id = std::make_unique<Id>();
    id->handle = h;
    id->uid = cmd.uid;
    id->owner = c.uid;
    id->ch = c.num;
    id->ps = cmd.ps;
    id->qp_type = qp_type;
    id->seq_num = uint32_t(std::random_device{}()) & 0xFFFFFF;
    ids_[h] = std::move(id);
    rdma_ucm_create_id_resp r{h};
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    return 0;
}

void Cm::free_id(Id *id) {
    if (auto n = ids_of_user_.find(id->owner); n != ids_of_user_.end() && --n->second == 0)
        ids_of_user_.erase(n);
    free_ids_.push_back(id->handle);
    ids_.erase(id->handle);
}

int Cm::destroy_id(Channel &c, uint32_t h, uint8_t *out, size_t *out_len) {
    Id *id = find_id(h);
    if (!id) return ENOENT;
    // Its queued events go; connection requests it never handed out are
    // refused as the kernel refuses them.
    drop_joins(c, h);
    std::vector<uint32_t> orphans;
    for (auto it = c.events.begin(); it != c.events.end();) {
        bool mine =
            it->id == h || (it->uid == id->uid && it->event == RDMA_CM_EVENT_CONNECT_REQUEST);
        if (mine && it->event == RDMA_CM_EVENT_CONNECT_REQUEST && it->id != h)
            orphans.push_back(it->id);
        it = mine ? c.events.erase(it) : it + 1;
    }
    rdma_ucm_destroy_id_resp r{id->events_reported};
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    id->destroyed = true;
    for (uint32_t o : orphans)
        if (auto it = ids_.find(o); it != ids_.end() && !it->second->destroyed) {
            uint8_t b[4];
            size_t l;
            destroy_id(c, o, b, &l);
        }
    switch (id->cm) {
    case CmState::kSidrReqRcvd:
        send_sidr_rep(*id, cm::kSidrReject, 0, nullptr, 0);
        break;
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
        send_rej(*id, cm::kRejTimeout, 2, nullptr, 0);
        cm_reset(*id);
        break;
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
        send_rej(*id, cm::kRejConsumerDefined,
                 id->cm == CmState::kRepRcvd || id->cm == CmState::kMraRepSent ? 1 : 0, nullptr, 0);
        cm_reset(*id);
        break;
    case CmState::kEstablished:
        send_dreq(*id);
        return 0; // freed at the end of timewait
    case CmState::kDreqRcvd:
        send_drep(*id);
        return 0;
    case CmState::kDreqSent:
    case CmState::kTimewait:
        return 0;
    default:
        break;
    }
    free_id(id);
    return 0;
}

bool Cm::port_free(const Id &me, uint16_t port) const {
    // cma_check_port: ids of different families share a port unless one of
    // them takes both (an IPv6 id without AFONLY); on one family, a
    // wildcard takes every address.
    for (auto &[h, id] : ids_) {
        if (id.get() == &me || id->destroyed || !id->bound || id->listener || id->ps != me.ps ||
            id->src.port() != port)
            continue;
        if (me.reuseaddr && id->reuseaddr) continue;
        if (me.afonly && id->afonly && me.src.family() != id->src.family()) continue;
        if (is_any(me.src) || is_any(id->src)) return false;
        if (me.src.family() == id->src.family() && me.src.addr() == id->src.addr() &&
            (!me.src.addr().link_local() || me.src.scope() == id->src.scope()))
            return false;
    }
    return true;
}

uint16_t Cm::ephemeral_port(const Id &me) const {
    static uint16_t last = 0;
    uint32_t span = kEphemeralHi - kEphemeralLo + 1;
    uint32_t start = std::random_device{}() % span;
    for (uint32_t k = 0; k < span; k++) {
        uint16_t p = uint16_t(kEphemeralLo + (start + k) % span);
        if (p == last) continue;
        if (port_free(me, p)) {
            last = p;
            return p;
        }
    }
    return 0;
}

int Cm::bind(Id &id, const SockAddr &sa) {
    if (id.state != IdState::kIdle) return EINVAL;
    IpAddr a = sa.addr();
    // An IPv4 address in an IPv6 one is no address of the host's IPv6
    // stack, and RoCE would take it for an IPv4 GID.
    if (sa.family() == AF_INET6 && a.is_v4()) return EADDRNOTAVAIL;
    // A link-local address is one of an interface: the scope must say which.
    if (a.link_local() && !sa.scope()) return EINVAL;
    Channel &c = *channels_.at(id.ch);
    if (!is_any(sa)) {
        // Not on the host (whether or not a configured device has it: its
        // port is down): EADDRNOTAVAIL, as the kernel.  On the host but no
        // sroce device's: ENODEV.
        if (!host_.is_local(a, sa.scope())) return EADDRNOTAVAIL;
        if (!device_of(c, a) && !a.loopback()) return ENODEV;
    }
    uint16_t want = sa.port();
    id.src = sa;
    if (!id.afonly_set) id.afonly = sa.family() == AF_INET || host_.bindv6only;
    if (want == 0) {
        uint16_t p = ephemeral_port(id);
        if (!p) return EADDRNOTAVAIL;
        id.src.set_port(p);
    } else {
        // The caller's privilege, as the kernel's cma asks it, not the agent's.
        if (want < 1024 && !c.bind_service) return EACCES;
        if (!port_free(id, want)) return EADDRINUSE;
    }
    // The destination takes the family until one is resolved (ucma's QUERY
    // shows it).
    id.dst = SockAddr::any(sa.family());
    id.bound = true;
    id.dev = device_of(c, a) ? a : IpAddr{};
    id.state = IdState::kAddrBound;
    return 0;
}

int Cm::resolve_addr(Id &id, const void *srcp, const void *dstp, uint32_t) {
    SockAddr dst;
    if (!SockAddr::load(dstp, &dst)) return EAFNOSUPPORT;
    if (id.state != IdState::kIdle && id.state != IdState::kAddrBound &&
        id.state != IdState::kAddrResolved)
        return EINVAL;
    Channel &c = *channels_.at(id.ch);
    // Every resolution queues an event, and an id may resolve again and
    // again: checked before anything changes.
    if (!event_room(c)) return ENOBUFS;
    if (id.state == IdState::kIdle) {
        // No source: the wildcard of the destination's family, on the
        // interface of a link-local destination (cma_bind_addr).
        SockAddr src = SockAddr::any(dst.family());
        if (src.family() == AF_INET6) src.in6.sin6_scope_id = dst.scope();
        SockAddr given;
        if (srcp && SockAddr::load(srcp, &given)) src = given;
        if (int e = bind(id, src)) return e;
    }
    if (id.src.family() != dst.family()) return EINVAL;
    IpAddr to = dst.addr();
    // An IPv4 address in an IPv6 one has no route in the IPv6 stack.
    if (dst.family() == AF_INET6 && to.is_v4()) return ENETUNREACH;
    uint32_t scope = to.link_local() ? (dst.scope() ? dst.scope() : id.src.scope()) : 0;
    if (to.link_local() && !scope) return EINVAL;
    id.dst = dst;
    if (dst.family() == AF_INET6) id.dst.in6.sin6_scope_id = scope;
    IpAddr src = is_any(id.src) ? IpAddr{} : id.src.addr();
    // To a device's own address the path is that device (the kernel routes
    // a local destination through lo back to the netdev that owns it).
    // A device whose address is not on the host (its port is down) is not
    // that: the route decides, as for any other address.
    if (src.empty() && device_of(c, to) && host_.is_local(to, scope)) src = to;
    if (src.empty()) src = host_.source_for(to, scope);
    if (src.empty()) return ENETUNREACH;
    id.state = IdState::kAddrQuery;
    if (!device_of(c, src)) {
        // No sroce device on the source the route picks (the kernel finds
        // no RDMA device on the netdev).
        id.state = IdState::kAddrBound;
        queue_event(id, RDMA_CM_EVENT_ADDR_ERROR, -ENODEV);
        return 0;
    }
    uint16_t port = id.src.port();
    uint32_t flowinfo = id.src.family() == AF_INET6 ? id.src.in6.sin6_flowinfo : 0;
    id.src = SockAddr(src, port, scope);
    if (id.src.family() == AF_INET6) id.src.in6.sin6_flowinfo = flowinfo;
    id.dev = src;
    id.state = IdState::kAddrResolved;
    queue_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    return 0;
}

int Cm::resolve_route(Id &id) {
    if (id.state != IdState::kAddrResolved) return EINVAL;
    if (id.dev.empty()) return ENODEV;
    if (!event_room(*channels_.at(id.ch))) return ENOBUFS;
    CmDevice *d = device_of(*channels_.at(id.ch), id.dev);
    id.path_mtu = d ? d->mtu : 3;
    id.state = IdState::kRouteResolved;
    queue_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    return 0;
}

namespace {

// The path record rdma_cm builds for RoCE (cma_resolve_iboe_route).
void fill_path(ib_user_path_rec &p, const IpAddr &src, const IpAddr &dst, uint8_t mtu, uint8_t tos,
               uint32_t flow_label, uint8_t plt) {
    p = {};
    std::memcpy(p.dgid, dst.raw, 16);
    std::memcpy(p.sgid, src.raw, 16);
    p.flow_label = htonl(flow_label);
    p.reversible = 1;
    p.mtu = mtu;
    p.pkey = htons(0xFFFF);
    p.hop_limit = 64;
    p.traffic_class = tos;
    p.numb_path = 1;
    p.mtu_selector = 2;
    p.rate_selector = 2;
    p.packet_life_time_selector = 2;
    p.packet_life_time = plt;
}

} // namespace

int Cm::query_route(Id &id, uint8_t *out, size_t *out_len) {
    rdma_ucm_query_route_resp r{};
    Channel &c = *channels_.at(id.ch);
    CmDevice *d = device_of(c, id.dev);
    r.ibdev_index = kInvalidIndex;
    if (d) {
        r.node_guid = d->guid;
        r.ibdev_index = d->index;
        r.port_num = 1;
    }
    std::memcpy(&r.src_addr, &id.src.in6, id.src.len);
    std::memcpy(&r.dst_addr, &id.dst.in6, id.dst.len);
    if (id.state == IdState::kRouteResolved || id.state == IdState::kConnect ||
        id.state == IdState::kDisconnect) {
        r.num_paths = 1;
        fill_path(r.ib_route[0], id.src.addr(), id.dst.addr(), id.path_mtu, id.tos, flow_label(id),
                  kPacketLifeTime);
    } else {
        std::memcpy(r.ib_route[0].sgid, id.src.addr().raw, 16);
        std::memcpy(r.ib_route[0].dgid, id.dst.addr().raw, 16);
        r.ib_route[0].pkey = htons(0xFFFF);
    }
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    return 0;
}

int Cm::query(Id &id, uint32_t option, uint8_t *out, size_t cap, size_t *out_len) {
    Channel &c = *channels_.at(id.ch);
    CmDevice *d = device_of(c, id.dev);
    switch (option) {
    case RDMA_USER_CM_QUERY_ADDR:
    case RDMA_USER_CM_QUERY_GID: {
        // The same answer; QUERY_GID gives the addresses as sockaddr_ib
        // (family, P_Key, flow info, then the 16-byte GID).
        if (cap < offsetof(rdma_ucm_query_addr_resp, ibdev_index)) return ENOSPC;
        rdma_ucm_query_addr_resp r{};
        r.ibdev_index = kInvalidIndex;
        if (d) {
            r.node_guid = d->guid;
            r.port_num = 1;
            r.ibdev_index = d->index;
        }
        r.pkey = htons(0xFFFF);
        if (option == RDMA_USER_CM_QUERY_ADDR) {
            // An id of neither family yet shows AF_INET's size, as ucma's
            // rdma_addr_size of a zeroed address.
            r.src_size = id.src.len ? id.src.len : sizeof(sockaddr_in);
            r.dst_size = id.dst.len ? id.dst.len : sizeof(sockaddr_in);
            std::memcpy(&r.src_addr, &id.src.in6, id.src.len);
            std::memcpy(&r.dst_addr, &id.dst.in6, id.dst.len);
        } else {
            r.src_size = r.dst_size = 48;
            for (auto [sa, a] :
                 {std::pair{&r.src_addr, id.src.addr()}, std::pair{&r.dst_addr, id.dst.addr()}}) {
                uint8_t *p = reinterpret_cast<uint8_t *>(sa);
                uint16_t fam = AF_IB, pkey = htons(0xFFFF);
                std::memcpy(p, &fam, 2);
                std::memcpy(p + 2, &pkey, 2);
                std::memcpy(p + 8, a.raw, 16);
            }
        }
        size_t n = std::min(cap, sizeof r);
        std::memcpy(out, &r, n);
        *out_len = n;
        return 0;
    }
    case RDMA_USER_CM_QUERY_PATH: {
        if (cap < 8) return ENOSPC;
        rdma_ucm_query_path_resp hdr{};
        size_t n = 8;
        if ((id.state == IdState::kRouteResolved || id.state == IdState::kConnect ||
             id.state == IdState::kDisconnect) &&
            cap >= 8 + sizeof(ib_path_rec_data)) {
            hdr.num_paths = 1;
            ib_path_rec_data pd{};
            // IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL, and the
            // SA PathRecord in wire format.
            pd.flags = 0x2B;
            uint8_t *w = reinterpret_cast<uint8_t *>(pd.path_rec);
            std::memcpy(w + 8, id.dst.addr().raw, 16);
            std::memcpy(w + 24, id.src.addr().raw, 16);
            // raw traffic 0, flow label, hop limit
            wire::put32(w + 44, 0x80000000u | flow_label(id) << 8 | 64);
            w[48] = id.tos;
            w[49] = 0x80 | 1; // reversible, numb_path 1
            wire::put16(w + 50, 0xFFFF);
            w[54] = uint8_t(2 << 6 | id.path_mtu);
            w[55] = uint8_t(2 << 6 | 3);
            w[56] = uint8_t(2 << 6 | kPacketLifeTime);
            wire::put32(w + 40, 0); // raw traffic / reserved
            std::memcpy(out + 8, &pd, sizeof pd);
            n += sizeof pd;
        }
        std::memcpy(out, &hdr, 8);
        *out_len = n;
        return 0;
    }
    default:
        return ENOSYS;
    }
}

int Cm::listen(Id &id, uint32_t backlog) {
    if (id.state == IdState::kIdle)
        if (int e = bind(id, SockAddr::any(AF_INET))) return e;
    if (id.state != IdState::kAddrBound) return EINVAL;
    // A listener shares its port with nobody: checked again without
    // REUSEADDR, which it then loses (cma.c does the same).
    id.reuseaddr = false;
    if (!port_free(id, id.src.port())) return EADDRINUSE;
    id.backlog = backlog == 0 || backlog > kMaxBacklog ? kMaxBacklog : backlog;
    id.state = IdState::kListen;
    return 0;
}

int Cm::set_option(Id &id, uint32_t level, uint32_t name, const uint8_t *val, uint32_t len) {
    if (level == RDMA_OPTION_ID) {
        switch (name) {
        case RDMA_OPTION_ID_TOS:
            if (len != 1) return EINVAL;
            id.tos = val[0];
            return 0;
        case RDMA_OPTION_ID_REUSEADDR: {
            if (len != sizeof(int)) return EINVAL;
            int v;
            std::memcpy(&v, val, sizeof v);
            if (!((v && id.state != IdState::kListen) || id.state == IdState::kIdle)) return EINVAL;
            id.reuseaddr = v != 0;
            return 0;
        }
        case RDMA_OPTION_ID_AFONLY: {
            if (len != sizeof(int)) return EINVAL;
            if (id.state != IdState::kIdle && id.state != IdState::kAddrBound) return EINVAL;
            int v;
            std::memcpy(&v, val, sizeof v);
            id.afonly = v != 0;
            id.afonly_set = true;
            return 0;
        }
        case RDMA_OPTION_ID_ACK_TIMEOUT:
            if (len != 1) return EINVAL;
            if (id.qp_type != 2 && id.qp_type != 9) return EINVAL;
            // It ends in 5-bit fields: the QP's ACK timeout, the REQ's packet
            // life time.
            id.ack_timeout_opt = std::min<uint8_t>(val[0], 31);
            return 0;
        default:
            return ENOSYS;
        }
    }
    if (level == RDMA_OPTION_IB && name == RDMA_OPTION_IB_PATH) {
        if (len == 0 || len % sizeof(ib_path_rec_data)) return EINVAL;
        if (id.state != IdState::kAddrResolved) return EINVAL;
        if (id.dev.empty()) return ENODEV;
        if (!event_room(*channels_.at(id.ch))) return ENOBUFS;
        id.state = IdState::kRouteResolved;
        queue_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
        return 0;
    }
    return ENOSYS;
}

int Cm::notify(Id &id, uint32_t event) {
    if (id.dev.empty()) return EINVAL;
    if (event != 0 /* IBV_EVENT_COMM_EST */ && event != 16 /* IBV_EVENT_PATH_MIG */) return EINVAL;
    if (event != 0) return 0;
    if (id.cm == CmState::kEstablished) return EISCONN;
    if (id.cm != CmState::kRepSent && id.cm != CmState::kMraRepRcvd) return EINVAL;
    id.deadline = 0;
    id.cm = CmState::kEstablished;
    queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
    return 0;
}

int Cm::migrate(Channel &to, uint32_t from_ch, uint32_t h, uint8_t *out, size_t *out_len) {
    auto fit = channels_.find(from_ch);
    if (fit == channels_.end()) return EINVAL;
    // The old channel is named by a number, which any process can send: only
    // its owner's user may take its ids (the kernel takes a file the caller
    // holds; a forked child, which holds its parent's, is the same user).
    if (fit->second->uid != to.uid) return ENOENT;
    Id *id = find_id(h);
    if (!id) return ENOENT;
    if (id->ch != from_ch) return EINVAL;
    Channel &from = *fit->second;
    // What moves must fit where it lands: a full channel takes no events by
    // migration either.
    size_t moving = 0;
    for (const rdma_ucm_event_resp &e : from.events) {
        auto mc = mcs_.find(e.id);
        moving += (e.id == h || (mc != mcs_.end() && mc->second.id == h)) &&
                  e.event != RDMA_CM_EVENT_CONNECT_REQUEST;
    }
    if (&from != &to && !event_room(to, moving)) return ENOBUFS;
    // Its queued events move with it (the old channel keeps a stale wake-up
    // byte per event, which GET_EVENT there then finds empty).  Onto its own
    // channel nothing moves (ucma_migrate_id), and the loop would meet the
    // events it appends.
    for (auto it = from.events.begin(); &from != &to && it != from.events.end();) {
        auto mc = mcs_.find(it->id);
        bool mine = it->id == h || (mc != mcs_.end() && mc->second.id == h);
        if (mine && it->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            to.events.push_back(*it);
            char b = 1;
            if (send(to.event_fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            }
            it = from.events.erase(it);
        } else {
            ++it;
        }
    }
    id->ch = to.num;
    rdma_ucm_migrate_resp r{id->events_reported};
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    return 0;
}

// ------------------------------------------------------------ connecting

void Cm::begin_connect(Id &id) {
    id.active = true;
    id.state = IdState::kConnect;
    id.local_comm = (next_comm_++) ^ comm_xor_;
    id.peer_ip = id.dst.addr();
    id.tid = own_tid(id.local_comm);
}

void Cm::store_private_data(const Id &id, const rdma_ucm_conn_param &p, uint8_t *pd) {
    cm::CmaHdr hdr;
    hdr.set(id.src.addr(), id.dst.addr());
    hdr.port = id.src.port();
    hdr.store(pd);
    std::memcpy(pd + cm::CmaHdr::kLen, p.private_data, p.private_data_len);
}

int Cm::connect(Id &id, const rdma_ucm_conn_param &p, const rdma_ucm_ece &ece) {
    if (id.state != IdState::kRouteResolved) return EINVAL;
    if (id.qp_type == 4) return connect_ud(id, p);
    if (p.private_data_len > cm::req::kPrivateDataLen - cm::CmaHdr::kLen) return EINVAL;
    Channel &c = *channels_.at(id.ch);
    CmDevice *d = device_of(c, id.dev);
    if (!d) return ENODEV;
    id.param = p;
    id.ece = ece;
    begin_connect(id);
    id.responder_resources = p.responder_resources;
    id.initiator_depth = p.initiator_depth;
    id.retry_count = std::min<uint8_t>(p.retry_count, 7);
    id.local_ack_timeout =
        ack_timeout(kAckDelay, id.ack_timeout_opt ? id.ack_timeout_opt - 1 : kPacketLifeTime);
    uint8_t plt = id.ack_timeout_opt ? id.ack_timeout_opt - 1 : kPacketLifeTime;
    uint8_t b[cm::kCmDataLen] = {};
    using namespace cm;
    set(b, req::kLocalCommId, id.local_comm);
    set(b, req::kVendorId, ece.vendor_id & 0xFFFFFF);
    set(b, req::kServiceId, service_id(PortSpace(id.ps), id.dst.port()));
    uint64_t guid_be;
    std::memcpy(&guid_be, &d->guid, 8);
    set(b, req::kLocalCaGuid, be64toh(guid_be));
    set(b, req::kLocalQpn, p.qp_num & 0xFFFFFF);
    set(b, req::kResponderResources, p.responder_resources);
    set(b, req::kInitiatorDepth, p.initiator_depth);
    set(b, req::kRemoteCmResponseTimeout, kCmResponseTimeout);
    set(b, req::kTransportServiceType, id.qp_type == 3 ? 1 : 0);
    set(b, req::kEndToEndFlowControl, p.flow_control & 1);
    set(b, req::kStartingPsn, id.seq_num);
    set(b, req::kLocalCmResponseTimeout, kCmResponseTimeout);
    set(b, req::kRetryCount, std::min<uint8_t>(p.retry_count, 7));
    set(b, req::kPartitionKey, 0xFFFF);
    set(b, req::kPathMtu, id.path_mtu);
    set(b, req::kRnrRetryCount, std::min<uint8_t>(p.rnr_retry_count, 7));
    set(b, req::kMaxCmRetries, kMaxCmRetries);
    set(b, req::kSrq, p.srq & 1);
    set(b, req::kPrimaryLocalLid, 0xFFFF);
    set(b, req::kPrimaryRemoteLid, 0xFFFF);
    std::memcpy(b + req::kPrimaryLocalGid, id.src.addr().raw, 16);
    std::memcpy(b + req::kPrimaryRemoteGid, id.dst.addr().raw, 16);
    set(b, req::kPrimaryFlowLabel, flow_label(id));
    set(b, req::kPrimaryTrafficClass, id.tos);
    set(b, req::kPrimaryHopLimit, 64);
    set(b, req::kPrimaryLocalAckTimeout, id.local_ack_timeout);
    store_private_data(id, p, b + req::kPrivateData);
    id.cm = CmState::kReqSent;
    id.max_cm_retries = kMaxCmRetries;
    // The MAD header's attribute modifier carries ECE's.
    send_mad(id, kReq, b, 2 * conv_ms(plt) + conv_ms(kCmResponseTimeout), ece.attr_mod);
    return 0;
}

int Cm::accept(Id &id, uint64_t uid, const rdma_ucm_conn_param &p, const rdma_ucm_ece &ece,
               bool has_param) {
    if (id.state != IdState::kConnect) return EINVAL;
    if (id.qp_type == 4) return accept_ud(id, uid, has_param ? &p : nullptr, ece);
    using namespace cm;
    if (!has_param) {
        // The active side, after its QP reached RTS: RTU.
        if (id.cm != CmState::kRepRcvd && id.cm != CmState::kMraRepSent) return EINVAL;
        uint8_t b[kCmDataLen] = {};
        set(b, kLocalCommId, id.local_comm);
        set(b, kRemoteCommId, id.remote_comm);
        send_mad(id, kRtu, b);
        id.cm = CmState::kEstablished;
        return 0;
    }
    if (id.cm != CmState::kReqRcvd && id.cm != CmState::kMraReqSent) return EINVAL;
    if (p.private_data_len > rep::kPrivateDataLen) return EINVAL;
    Channel &c = *channels_.at(id.ch);
    CmDevice *d = device_of(c, id.dev);
    if (!d) return ENODEV;
    id.uid = uid;
    id.param = p;
    id.ece = ece;
    id.responder_resources = p.responder_resources;
    id.initiator_depth = p.initiator_depth;
    uint8_t b[kCmDataLen] = {};
    set(b, kLocalCommId, id.local_comm);
    set(b, kRemoteCommId, id.remote_comm);
    set(b, rep::kLocalQpn, p.qp_num & 0xFFFFFF);
    set(b, rep::kStartingPsn, id.seq_num);
    set(b, rep::kResponderResources, p.responder_resources);
    set(b, rep::kInitiatorDepth, p.initiator_depth);
    set(b, rep::kTargetAckDelay, kAckDelay);
    set(b, rep::kEndToEndFlowControl, p.flow_control & 1);
    set(b, rep::kRnrRetryCount, std::min<uint8_t>(p.rnr_retry_count, 7));
    set(b, rep::kSrq, p.srq & 1);
    uint64_t guid_be;
    std::memcpy(&guid_be, &d->guid, 8);
    set(b, rep::kLocalCaGuid, be64toh(guid_be));
    set(b, rep::kVendorIdH, (ece.vendor_id >> 16) & 0xFF);
    set(b, rep::kVendorIdM, (ece.vendor_id >> 8) & 0xFF);
    set(b, rep::kVendorIdL, ece.vendor_id & 0xFF);
    std::memcpy(b + rep::kPrivateData, p.private_data, p.private_data_len);
    id.cm = CmState::kRepSent;
    send_mad(id, kRep, b, id.cm_timeout_ms, ece.attr_mod);
    return 0;
}

int Cm::reject(Id &id, const rdma_ucm_reject &cmd) {
    uint16_t reason = cmd.reason ? uint16_t(cmd.reason) : uint16_t(cm::kRejConsumerDefined);
    if (reason != cm::kRejConsumerDefined && reason != cm::kRejVendorOptionNotSupported)
        return EINVAL;
    if (id.dev.empty() || id.cm == CmState::kIdle) return EINVAL;
    if (id.qp_type == 4) {
        // A UD id refuses with a SIDR_REP (IB_SIDR_REJECT); the reason
        // stays here.
        if (id.cm != CmState::kSidrReqRcvd) return EINVAL;
        send_sidr_rep(id, cm::kSidrReject, 0, cmd.private_data,
                      std::min<size_t>(cmd.private_data_len, cm::sidr_rep::kPrivateDataLen));
        return 0;
    }
    if (id.cm != CmState::kReqRcvd && id.cm != CmState::kMraReqSent) return EINVAL;
    send_rej(id, reason, 0, cmd.private_data,
             std::min<size_t>(cmd.private_data_len, cm::rej::kPrivateDataLen));
    cm_reset(id);
    return 0;
}

int Cm::disconnect(Id &id) {
    if (id.dev.empty() || id.cm == CmState::kIdle) return EINVAL;
    if (id.cm == CmState::kEstablished)
        send_dreq(id);
    else if (id.cm == CmState::kDreqRcvd)
        send_drep(id);
    return 0;
}

int Cm::init_qp_attr(Id &id, uint32_t state, uint8_t *out, size_t *out_len) {
    ib_uverbs_qp_attr a{};
    a.qp_state = state;
    a.port_num = 1;
    a.pkey_index = 0;
    constexpr uint32_t kState = 0x1, kAccess = 0x8, kPkey = 0x10, kPort = 0x20, kQkey = 0x40,
                       kAv = 0x80, kMtu = 0x100, kTimeout = 0x200, kRetry = 0x400,
                       kRnrRetry = 0x800, kRqPsn = 0x1000, kMaxRd = 0x2000, kMinRnr = 0x8000,
                       kSqPsn = 0x10000, kMaxDestRd = 0x20000, kDestQpn = 0x100000;
    if (id.cm == CmState::kIdle || id.qp_type == 4) {
        // No connection yet (or UD): what any QP of the port needs.
        a.qp_attr_mask = kState | kPkey | kPort;
        if (id.qp_type == 4) {
            a.qp_attr_mask |= kQkey;
            a.qkey = qkey_of(id);
        } else {
            a.qp_attr_mask |= kAccess;
        }
        if (state == 2) a.rq_psn = id.seq_num;
    } else if (state == 1) {
        a.qp_attr_mask = kState | kAccess | kPkey | kPort;
        a.qp_access_flags = 0x2 /* REMOTE_WRITE */;
        // A FLUSH takes a responder resource like a READ: the kernel's CM
        // (from Linux 6.2 on) grants the placement types the device
        // executes with them, and every sroce device executes both.
        if (id.responder_resources)
            a.qp_access_flags |= 0x4 | 0x8 | 0x100 | 0x200; // READ, ATOMIC, FLUSH_*
    } else if (state == 2) {
        if (id.cm == CmState::kReqSent || id.cm == CmState::kMraReqRcvd) return EINVAL;
        a.qp_attr_mask = kState | kAv | kMtu | kDestQpn | kRqPsn;
        if (id.qp_type == 2) a.qp_attr_mask |= kMaxDestRd | kMinRnr;
        ib_uverbs_ah_attr &ah = a.ah_attr;
        std::memcpy(ah.grh.dgid, id.peer_ip.raw, 16);
        ah.grh.sgid_index = sgid_index(id);
        ah.grh.hop_limit = id.active ? 64 : 0xFF;
        ah.grh.traffic_class = id.tos;
        ah.grh.flow_label = flow_label(id);
        ah.is_global = 1;
        ah.port_num = 1;
        a.path_mtu = id.path_mtu;
        a.dest_qp_num = id.remote_qpn;
        a.rq_psn = id.seq_num;
        a.max_dest_rd_atomic = id.responder_resources;
        a.min_rnr_timer = 0;
    } else if (state == 3) {
        if (id.cm == CmState::kReqSent || id.cm == CmState::kMraReqRcvd) return EINVAL;
        a.qp_attr_mask = kState | kSqPsn;
        if (id.qp_type == 2) a.qp_attr_mask |= kRetry | kRnrRetry | kMaxRd | kTimeout;
        a.sq_psn = id.remote_psn;
        a.retry_cnt = id.retry_count;
        a.rnr_retry = id.rnr_retry_count;
        a.max_rd_atomic = id.initiator_depth;
        a.timeout = id.ack_timeout_opt ? id.ack_timeout_opt : id.local_ack_timeout;
    } else {
        return EINVAL;
    }
    std::memcpy(out, &a, sizeof a);
    *out_len = sizeof a;
    return 0;
}

// ------------------------------------------------------------ the IB CM

void Cm::send_mad(Id &id, uint16_t attr, const uint8_t *body, uint32_t timeout_ms,
                  uint32_t attr_mod) {
    cm::MadHdr h;
    h.attr_id = attr;
    h.tid = id.tid;
    h.attr_mod = attr_mod;
    std::memset(id.mad, 0, sizeof id.mad);
    h.store(id.mad);
    std::memcpy(id.mad + cm::kMadHdrLen, body, cm::kCmDataLen);
    id.retries_left = timeout_ms ? id.max_cm_retries : 0;
    id.retry_ms = timeout_ms;
    id.deadline = timeout_ms ? now_ms() + timeout_ms : 0;
    send_(id.dev, id.peer_ip, id.mad);
    stats_.tx_mads++;
}

void Cm::reply_mad(const IpAddr &local, const IpAddr &remote, uint64_t tid, uint16_t attr,
                   const uint8_t *body) {
    uint8_t mad[cm::kMadLen] = {};
    cm::MadHdr h;
    h.attr_id = attr;
    h.tid = tid;
    h.store(mad);
    std::memcpy(mad + cm::kMadHdrLen, body, cm::kCmDataLen);
    send_(local, remote, mad);
    stats_.tx_mads++;
}

void Cm::send_rej(Id &id, uint16_t reason, uint8_t msg_rejected, const uint8_t *pd, size_t pd_len) {
    using namespace cm;
    uint8_t b[kCmDataLen] = {};
    set(b, kLocalCommId, id.cm == CmState::kReqRcvd ? 0 : id.local_comm);
    set(b, kRemoteCommId, id.remote_comm);
    set(b, rej::kMessageRejected, msg_rejected);
    set(b, rej::kReason, reason);
    if (reason == kRejTimeout) {
        CmDevice *d = nullptr;
        if (auto c = channels_.find(id.ch); c != channels_.end()) d = device_of(*c->second, id.dev);
        if (d) {
            std::memcpy(b + rej::kAri, &d->guid, 8);
            set(b, rej::kRejectedInfoLength, 8);
        }
    }
    if (pd && pd_len) std::memcpy(b + rej::kPrivateData, pd, pd_len);
    send_mad(id, kRej, b);
}

void Cm::send_dreq(Id &id) {
    using namespace cm;
    uint8_t b[kCmDataLen] = {};
    set(b, kLocalCommId, id.local_comm);
    set(b, kRemoteCommId, id.remote_comm);
    set(b, dreq::kRemoteQpn, id.remote_qpn);
    id.tid = own_tid(id.local_comm);
    id.cm = CmState::kDreqSent;
    uint32_t t = id.cm_timeout_ms ? id.cm_timeout_ms
                                  : 2 * conv_ms(kPacketLifeTime) + conv_ms(kCmResponseTimeout);
    send_mad(id, kDreq, b, t);
}

void Cm::send_drep(Id &id) {
    using namespace cm;
    uint8_t b[kCmDataLen] = {};
    set(b, kLocalCommId, id.local_comm);
    set(b, kRemoteCommId, id.remote_comm);
    enter_timewait(id);
    send_mad(id, kDrep, b);
}

void Cm::enter_timewait(Id &id) {
    id.cm = CmState::kTimewait;
    id.deadline = 0;
    id.timewait_until = now_ms() + conv_ms(id.local_ack_timeout);
}

void Cm::cm_reset(Id &id) {
    id.cm = CmState::kIdle;
    id.deadline = 0;
    id.timewait_until = 0;
}

Cm::Id *Cm::by_local_comm(uint32_t local_comm) {
    for (auto &[h, id] : ids_)
        if (id->local_comm == local_comm && id->cm != CmState::kIdle) return id.get();
    return nullptr;
}

void Cm::receive(const IpAddr &local, const IpAddr &remote, const uint8_t *data, size_t len) {
    cm::Mad m;
    if (cm::parse(data, len, m) != cm::ParseError::kOk) {
        stats_.rx_bad++;
        return;
    }
    stats_.rx_mads++;
    switch (m.hdr.attr_id) {
    case cm::kReq:
        return recv_req(local, remote, m);
    case cm::kRep:
        return recv_rep(m);
    case cm::kRtu:
        return recv_rtu(m);
    case cm::kRej:
        return recv_rej(m);
    case cm::kMra:
        return recv_mra(m);
    case cm::kDreq:
        return recv_dreq(local, remote, m);
    case cm::kDrep:
        return recv_drep(m);
    case cm::kSidrReq:
        return recv_sidr_req(local, remote, m);
    case cm::kSidrRep:
        return recv_sidr_rep(m);
    default:
        return; // LAP/APR: RoCE has no alternate paths
    }
}

Cm::Match Cm::match_listener(uint64_t sid, const uint8_t *pd, size_t pd_len) {
    Match mt;
    uint16_t ps = uint16_t(sid >> 16), port = uint16_t(sid);
    cm::CmaHdr hdr;
    bool ip = hdr.load(pd, pd_len);
    if (ip) {
        mt.family = hdr.ip_version == 4 ? AF_INET : AF_INET6;
        mt.dst_ip = hdr.dst_addr();
        mt.src_ip = hdr.src_addr();
        mt.src_port = hdr.port;
    }
    for (auto &[h, id] : ids_) {
        if (id->destroyed || id->state != IdState::kListen || id->ps != ps ||
            id->src.port() != port)
            continue;
        mt.any_port = true;
        if (!ip) continue;
        // cma_match_private_data: a wildcard without AFONLY takes both
        // families; else the family and the address must be the listener's.
        if (!(is_any(id->src) && !id->afonly)) {
            if (id->src.family() != mt.family) continue;
            if (!is_any(id->src) && id->src.addr() != mt.dst_ip) continue;
        }
        mt.lis = id.get();
        break;
    }
    return mt;
}

Cm::Id *Cm::new_conn_id(Channel &c, Id &lis, const Match &mt) {
    rdma_ucm_create_id cid{};
    cid.ps = lis.ps;
    cid.qp_type = lis.qp_type;
    uint8_t out[4];
    size_t ol;
    if (create_id(c, cid, out, &ol)) return nullptr;
    uint32_t h;
    std::memcpy(&h, out, 4);
    Id &id = *ids_.at(h);
    id.uid = 0; // taken by the process at ACCEPT
    id.listener = lis.handle;
    id.state = IdState::kConnect;
    id.bound = true;
    id.afonly = lis.afonly;
    // The addresses of the rdma_cm header, without a scope (cma_save_ip6_info).
    id.src = SockAddr(mt.dst_ip, lis.src.port());
    id.dst = SockAddr(mt.src_ip, mt.src_port);
    id.dev = mt.dst_ip;
    return &id;
}

void Cm::recv_req(const IpAddr &local, const IpAddr &remote, const cm::Mad &m) {
    using namespace cm;
    uint32_t remote_comm = uint32_t(m.field(req::kLocalCommId));
    uint64_t guid = m.field(req::kLocalCaGuid);
    uint32_t qpn = uint32_t(m.field(req::kLocalQpn));
    auto issue_rej = [&](uint16_t reason) {
        uint8_t b[kCmDataLen] = {};
        set(b, kRemoteCommId, remote_comm);
        set(b, kLocalCommId, get(m.body, Field{4, 0, 32}));
        set(b, rej::kReason, reason);
        reply_mad(local, remote, m.hdr.tid, kRej, b);
    };
    for (auto &[h, id] : ids_) {
        if (id->cm == CmState::kIdle || id->remote_guid != guid) continue;
        if (id->remote_comm == remote_comm) return; // a duplicate: our REP has its own retries
        if (id->remote_qpn == qpn && id->cm != CmState::kTimewait) {
            // The peer reuses a QP we still count as connected: stale.
            issue_rej(kRejStaleConn);
            if (id->cm == CmState::kEstablished) send_dreq(*id);
            return;
        }
    }
    uint64_t sid = m.field(req::kServiceId);
    Match mt = match_listener(sid, m.body + req::kPrivateData, req::kPrivateDataLen);
    if (!mt.any_port) {
        fprintf(stderr, "sroce agent: REQ from %s for service 0x%llx: no listener (REJ 8)\n",
                remote.text().c_str(), (unsigned long long)sid);
        return issue_rej(kRejInvalidServiceId);
    }
    Id *lis = mt.lis;
    IpAddr dst_ip = mt.dst_ip;
    if (!lis) return issue_rej(kRejConsumerDefined);
    Channel &c = *channels_.at(lis->ch);
    CmDevice *d = device_of(c, dst_ip);
    if (!d || dst_ip != local) return issue_rej(kRejConsumerDefined);
    uint8_t tst = uint8_t(m.field(req::kTransportServiceType));
    if ((tst == 0 ? 2 : tst == 1 ? 3 : 0) != lis->qp_type) return issue_rej(kRejConsumerDefined);
    // Past the backlog, or with the listener's channel full, as the kernel
    // past the backlog (cm.c keeps quiet on ucma's ENOMEM): silently, the
    // peer's CM retries.
    if (lis->pending >= lis->backlog || c.events.size() >= kEventsPerChannel) return;
    Id *idp = new_conn_id(c, *lis, mt);
    if (!idp) return;
    Id &id = *idp;
    id.tos = uint8_t(m.field(req::kPrimaryTrafficClass));
    id.peer_ip = IpAddr::of_gid(m.body + req::kPrimaryLocalGid);
    id.remote_comm = remote_comm;
    id.remote_guid = guid;
    id.remote_qpn = qpn;
    id.remote_psn = uint32_t(m.field(req::kStartingPsn));
    id.responder_resources = uint8_t(m.field(req::kInitiatorDepth));
    id.initiator_depth = uint8_t(m.field(req::kResponderResources));
    id.retry_count = uint8_t(m.field(req::kRetryCount));
    id.rnr_retry_count = uint8_t(m.field(req::kRnrRetryCount));
    id.path_mtu = std::min<uint8_t>(uint8_t(m.field(req::kPathMtu)), d->mtu);
    id.local_ack_timeout = std::max<uint8_t>(1, uint8_t(m.field(req::kPrimaryLocalAckTimeout)));
    id.cm_timeout_ms = conv_ms(uint8_t(m.field(req::kLocalCmResponseTimeout)));
    id.max_cm_retries = uint8_t(m.field(req::kMaxCmRetries));
    id.tid = m.hdr.tid;
    id.local_comm = (next_comm_++) ^ comm_xor_;
    // The kernel marks the request MRA'd with a delayed MRA: nothing is
    // sent unless the REQ comes again.
    id.cm = CmState::kMraReqSent;
    lis->pending++;
    // The event belongs to the listener (uid), naming the new id.
    rdma_ucm_event_resp e{};
    e.id = id.handle;
    e.param.conn.qp_num = qpn;
    e.param.conn.responder_resources = id.responder_resources;
    e.param.conn.initiator_depth = id.initiator_depth;
    e.param.conn.flow_control = uint8_t(m.field(req::kEndToEndFlowControl));
    e.param.conn.retry_count = id.retry_count;
    e.param.conn.rnr_retry_count = id.rnr_retry_count;
    e.param.conn.srq = uint8_t(m.field(req::kSrq));
    e.param.conn.private_data_len = req::kPrivateDataLen - CmaHdr::kLen;
    std::memcpy(e.param.conn.private_data, m.body + req::kPrivateData + CmaHdr::kLen,
                req::kPrivateDataLen - CmaHdr::kLen);
    e.ece.vendor_id = uint32_t(m.field(req::kVendorId));
    e.ece.attr_mod = m.hdr.attr_mod;
    queue_event(*lis, RDMA_CM_EVENT_CONNECT_REQUEST, 0, e);
}

void Cm::recv_rep(const cm::Mad &m) {
    using namespace cm;
    uint32_t ours = uint32_t(m.field(kRemoteCommId));
    Id *id = by_local_comm(ours);
    if (!id) return;
    if (id->cm == CmState::kEstablished && id->remote_comm == m.field(kLocalCommId)) {
        // Our RTU was lost: send it again.
        uint8_t b[kCmDataLen] = {};
        set(b, kLocalCommId, id->local_comm);
        set(b, kRemoteCommId, id->remote_comm);
        send_mad(*id, kRtu, b);
        return;
    }
    if (id->cm != CmState::kReqSent && id->cm != CmState::kMraReqRcvd) return;
    id->deadline = 0;
    id->remote_comm = uint32_t(m.field(kLocalCommId));
    id->remote_guid = m.field(rep::kLocalCaGuid);
    id->remote_qpn = uint32_t(m.field(rep::kLocalQpn));
    id->remote_psn = uint32_t(m.field(rep::kStartingPsn));
    id->responder_resources = uint8_t(m.field(rep::kInitiatorDepth));
    id->initiator_depth = uint8_t(m.field(rep::kResponderResources));
    id->rnr_retry_count = uint8_t(m.field(rep::kRnrRetryCount));
    uint8_t plt = id->ack_timeout_opt ? id->ack_timeout_opt - 1 : kPacketLifeTime;
    id->local_ack_timeout = ack_timeout(uint8_t(m.field(rep::kTargetAckDelay)), plt);
    id->tid = m.hdr.tid;
    id->cm = CmState::kMraRepSent;
    rdma_ucm_event_resp e{};
    e.param.conn.qp_num = id->remote_qpn;
    e.param.conn.responder_resources = id->responder_resources;
    e.param.conn.initiator_depth = id->initiator_depth;
    e.param.conn.flow_control = uint8_t(m.field(rep::kEndToEndFlowControl));
    e.param.conn.rnr_retry_count = id->rnr_retry_count;
    e.param.conn.srq = uint8_t(m.field(rep::kSrq));
    e.param.conn.private_data_len = rep::kPrivateDataLen;
    std::memcpy(e.param.conn.private_data, m.body + rep::kPrivateData, rep::kPrivateDataLen);
    e.ece.vendor_id = uint32_t(m.field(rep::kVendorIdH) << 16 | m.field(rep::kVendorIdM) << 8 |
                               m.field(rep::kVendorIdL));
    e.ece.attr_mod = m.hdr.attr_mod;
    queue_event(*id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, e);
}

void Cm::recv_rtu(const cm::Mad &m) {
    using namespace cm;
    Id *id = by_local_comm(uint32_t(m.field(kRemoteCommId)));
    if (!id || id->remote_comm != m.field(kLocalCommId)) return;
    if (id->cm != CmState::kRepSent && id->cm != CmState::kMraRepRcvd) return;
    id->deadline = 0;
    id->cm = CmState::kEstablished;
    queue_event(*id, RDMA_CM_EVENT_ESTABLISHED, 0);
}

void Cm::recv_mra(const cm::Mad &m) {
    using namespace cm;
    uint8_t which = uint8_t(m.field(mra::kMessageMraed));
    Id *id = by_local_comm(uint32_t(m.field(kRemoteCommId)));
    if (!id) return;
    uint32_t extra =
        conv_ms(uint8_t(m.field(mra::kServiceTimeout))) + conv_ms(id->local_ack_timeout);
    if (which == 0 && id->cm == CmState::kReqSent) {
        id->cm = CmState::kMraReqRcvd;
    } else if (which == 1 && id->cm == CmState::kRepSent &&
               id->remote_comm == m.field(kLocalCommId)) {
        id->cm = CmState::kMraRepRcvd;
    } else {
        return;
    }
    id->retry_ms = extra;
    id->deadline = now_ms() + extra;
}

void Cm::recv_rej(const cm::Mad &m) {
    using namespace cm;
    uint16_t reason = uint16_t(m.field(rej::kReason));
    Id *id = by_local_comm(uint32_t(m.field(kRemoteCommId)));
    if (!id) return;
    if (m.field(rej::kMessageRejected) != 0 && id->remote_comm != m.field(kLocalCommId)) return;
    switch (id->cm) {
    case CmState::kReqSent:
    case CmState::kMraReqRcvd:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
        if (reason == kRejStaleConn)
            enter_timewait(*id);
        else
            cm_reset(*id);
        break;
    case CmState::kDreqSent:
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
    case CmState::kEstablished:
        enter_timewait(*id);
        break;
    default:
        return;
    }
    if (id->destroyed) {
        if (id->cm == CmState::kIdle) free_id(id);
        return;
    }
    if (id->state != IdState::kConnect) return;
    rdma_ucm_event_resp e{};
    e.param.conn.private_data_len = rej::kPrivateDataLen;
    std::memcpy(e.param.conn.private_data, m.body + rej::kPrivateData, rej::kPrivateDataLen);
    queue_event(*id, RDMA_CM_EVENT_REJECTED, reason, e);
}

void Cm::recv_dreq(const IpAddr &local, const IpAddr &remote, const cm::Mad &m) {
    using namespace cm;
    Id *id = by_local_comm(uint32_t(m.field(kRemoteCommId)));
    if (!id || id->remote_comm != m.field(kLocalCommId)) {
        // Unknown connection: a DREP anyway, so the peer stops asking.
        uint8_t b[kCmDataLen] = {};
        set(b, kLocalCommId, m.field(kRemoteCommId));
        set(b, kRemoteCommId, m.field(kLocalCommId));
        reply_mad(local, remote, m.hdr.tid, kDrep, b);
        return;
    }
    if (m.field(dreq::kRemoteQpn) != (id->param.qp_num & 0xFFFFFF)) return;
    switch (id->cm) {
    case CmState::kTimewait: {
        uint8_t b[kCmDataLen] = {};
        set(b, kLocalCommId, id->local_comm);
        set(b, kRemoteCommId, id->remote_comm);
        reply_mad(local, remote, m.hdr.tid, kDrep, b);
        return;
    }
    case CmState::kEstablished:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
    case CmState::kDreqSent:
        break;
    default:
        return;
    }
    id->deadline = 0;
    id->cm = CmState::kDreqRcvd;
    id->tid = m.hdr.tid;
    if (id->destroyed) {
        send_drep(*id);
        return;
    }
    if (id->state == IdState::kConnect) {
        id->state = IdState::kDisconnect;
        queue_event(*id, RDMA_CM_EVENT_DISCONNECTED, 0);
    }
}

void Cm::recv_drep(const cm::Mad &m) {
    using namespace cm;
    Id *id = by_local_comm(uint32_t(m.field(kRemoteCommId)));
    if (!id || id->remote_comm != m.field(kLocalCommId)) return;
    if (id->cm != CmState::kDreqSent && id->cm != CmState::kDreqRcvd) return;
    enter_timewait(*id);
    if (!id->destroyed && id->state == IdState::kConnect) {
        id->state = IdState::kDisconnect;
        queue_event(*id, RDMA_CM_EVENT_DISCONNECTED, 0);
    }
}

int Cm::timers(uint64_t now) {
    int64_t next = -1;
    std::vector<Id *> done;
    for (auto &[h, idp] : ids_) {
        Id &id = *idp;
        if (id.timewait_until && now >= id.timewait_until) {
            id.timewait_until = 0;
            id.cm = CmState::kIdle;
            if (id.destroyed) {
                done.push_back(&id);
                continue;
            }
            if (id.state == IdState::kDisconnect) queue_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
        }
        if (id.deadline && now >= id.deadline) {
            if (id.retries_left > 0) {
                id.retries_left--;
                id.deadline = now + id.retry_ms;
                send_(id.dev, id.peer_ip, id.mad);
                stats_.tx_mads++;
                stats_.retries++;
            } else {
                id.deadline = 0;
                CmState was = id.cm;
                if (was == CmState::kDreqSent) {
                    enter_timewait(id);
                    if (!id.destroyed && id.state == IdState::kConnect) {
                        id.state = IdState::kDisconnect;
                        queue_event(id, RDMA_CM_EVENT_DISCONNECTED, -ETIMEDOUT);
                    }
                } else {
                    cm_reset(id);
                    if (id.destroyed)
                        done.push_back(&id);
                    else if (id.state == IdState::kConnect)
                        queue_event(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
                }
            }
        }
        for (uint64_t t : {id.deadline, id.timewait_until})
            if (t) next = next < 0 ? int64_t(t - now) : std::min<int64_t>(next, int64_t(t - now));
    }
    for (Id *id : done)
        free_id(id);
    // A REQ with a long ACK timeout option waits past INT_MAX ms, which as
    // an int would be a negative (endless) poll(2) timeout.
    return int(next < 0 ? -1 : std::clamp<int64_t>(next, 1, INT_MAX));
}

} // namespace sroce::agent
