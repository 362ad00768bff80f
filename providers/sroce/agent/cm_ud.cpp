// SPDX-License-Identifier: MIT
//
// The datagram side of rdma_cm (cm.hpp): SIDR, which resolves a UD id's
// peer QP number and Q_Key through one SIDR_REQ/SIDR_REP exchange
// (cma_resolve_ib_udp, cma_sidr_rep_handler, cm.c's SIDR states), and
// multicast joins on RoCE (cma_iboe_join_multicast), where no subnet
// manager takes part: the group's GID is the IPv4-mapped group address and
// the join completes at once.  The QP's attachment is librdmacm's
// (ibv_attach_mcast on the MULTICAST_JOIN event), which the provider turns
// into an IGMP membership of the device's interface.
#include "cm.hpp"
#include "cm_internal.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>

namespace sroce::agent {

namespace {

// The address handle a UD peer or a group is reached by, from the GID of
// the id's source address, as ib_init_ah_attr_from_path and
// ib_init_ah_from_mcmember fill it for a RoCE device.
ib_uverbs_ah_attr roce_ah(const IpAddr &dst, uint8_t sgid_index, uint8_t tos, uint32_t flow_label) {
    ib_uverbs_ah_attr ah{};
    std::memcpy(ah.grh.dgid, dst.raw, 16);
    ah.grh.sgid_index = sgid_index;
    ah.grh.hop_limit = 64; // IPV6_DEFAULT_HOPLIMIT
    ah.grh.traffic_class = tos;
    ah.grh.flow_label = flow_label;
    ah.is_global = 1;
    ah.port_num = 1;
    return ah;
}

} // namespace

uint32_t Cm::qkey_of(const Id &id) {
    // cma_set_qkey: the first Q_Key an id learns sticks; until then the
    // port space's (RDMA_UDP_QKEY for UDP and IB).
    return id.qkey ? id.qkey : kUdpQkey;
}

// ------------------------------------------------------------ SIDR

int Cm::connect_ud(Id &id, const rdma_ucm_conn_param &p) {
    using namespace cm;
    if (p.private_data_len > sidr_req::kPrivateDataLen - CmaHdr::kLen) return EINVAL;
    Channel &c = *channels_.at(id.ch);
    if (!device_of(c, id.dev)) return ENODEV;
    begin_connect(id);
    uint8_t b[kCmDataLen] = {};
    set(b, sidr_req::kRequestId, id.local_comm);
    set(b, sidr_req::kPartitionKey, 0xFFFF);
    set(b, sidr_req::kServiceId, service_id(PortSpace(id.ps), id.dst.port()));
    store_private_data(id, p, b + sidr_req::kPrivateData);
    id.cm = CmState::kSidrReqSent;
    id.max_cm_retries = kMaxCmRetries;
    // cma.c: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms per try.
    send_mad(id, kSidrReq, b, 1u << (kCmResponseTimeout - 8));
    return 0;
}

void Cm::send_sidr_rep(Id &id, uint8_t status, uint32_t qpn, const uint8_t *pd, size_t pd_len) {
    using namespace cm;
    uint8_t b[kCmDataLen] = {};
    set(b, sidr_rep::kRequestId, id.remote_comm);
    set(b, sidr_rep::kStatus, status);
    set(b, sidr_rep::kServiceId, service_id(PortSpace(id.ps), id.src.port()));
    if (status == kSidrSuccess) {
        set(b, sidr_rep::kQpn, qpn & 0xFFFFFF);
        set(b, sidr_rep::kQkey, qkey_of(id));
        set(b, sidr_rep::kVendorIdH, (id.ece.vendor_id >> 8) & 0xFFFF);
        set(b, sidr_rep::kVendorIdL, id.ece.vendor_id & 0xFF);
    }
    if (pd && pd_len)
        std::memcpy(b + sidr_rep::kPrivateData, pd, std::min(pd_len, sidr_rep::kPrivateDataLen));
    reply_mad(id.dev, id.peer_ip, id.tid, kSidrRep, b);
    // The request is answered: a SIDR id keeps no connection.
    cm_reset(id);
}

int Cm::accept_ud(Id &id, uint64_t uid, const rdma_ucm_conn_param *p, const rdma_ucm_ece &ece) {
    if (id.cm != CmState::kSidrReqRcvd) return EINVAL;
    if (p && p->private_data_len > cm::sidr_rep::kPrivateDataLen) return EINVAL;
    id.uid = uid;
    id.ece = ece;
    if (!id.qkey) id.qkey = kUdpQkey;
    send_sidr_rep(id, cm::kSidrSuccess, p ? p->qp_num : 0, p ? p->private_data : nullptr,
                  p ? p->private_data_len : 0);
    return 0;
}

void Cm::recv_sidr_req(const IpAddr &local, const IpAddr &remote, const cm::Mad &m) {
    using namespace cm;
    uint32_t request_id = uint32_t(m.field(sidr_req::kRequestId));
    // A request already being answered comes again: the answer is coming.
    for (auto &[h, id] : ids_)
        if (id->cm == CmState::kSidrReqRcvd && id->remote_comm == request_id &&
            id->peer_ip == remote)
            return;
    auto answer = [&](uint8_t status) {
        uint8_t b[kCmDataLen] = {};
        set(b, sidr_rep::kRequestId, request_id);
        set(b, sidr_rep::kStatus, status);
        set(b, sidr_rep::kServiceId, m.field(sidr_req::kServiceId));
        reply_mad(local, remote, m.hdr.tid, kSidrRep, b);
    };
    uint64_t sid = m.field(sidr_req::kServiceId);
    Match mt = match_listener(sid, m.body + sidr_req::kPrivateData, sidr_req::kPrivateDataLen);
    // No listener on the service: cm.c answers IB_SIDR_UNSUPPORTED; one
    // that does not take this request (address, QP type, backlog), rdma_cm
    // refuses and the CM answers IB_SIDR_REJECT.
    if (!mt.any_port) return answer(kSidrUnsupported);
    Id *lis = mt.lis;
    if (!lis || lis->qp_type != 4 || mt.dst_ip != local || lis->pending >= lis->backlog)
        return answer(kSidrReject);
    Channel &c = *channels_.at(lis->ch);
    // A full channel refuses as a full backlog does.
    if (!device_of(c, local) || c.events.size() >= kEventsPerChannel) return answer(kSidrReject);
    Id *idp = new_conn_id(c, *lis, mt);
    if (!idp) return answer(kSidrReject);
    Id &id = *idp;
    id.peer_ip = remote;
    id.remote_comm = request_id;
    id.tid = m.hdr.tid;
    id.cm = CmState::kSidrReqRcvd;
    lis->pending++;
    rdma_ucm_event_resp e{};
    e.id = id.handle;
    constexpr size_t kLen = sidr_req::kPrivateDataLen - CmaHdr::kLen;
    e.param.ud.private_data_len = kLen;
    std::memcpy(e.param.ud.private_data, m.body + sidr_req::kPrivateData + CmaHdr::kLen, kLen);
    queue_event(*lis, RDMA_CM_EVENT_CONNECT_REQUEST, 0, e);
}

void Cm::recv_sidr_rep(const cm::Mad &m) {
    using namespace cm;
    Id *id = by_local_comm(uint32_t(m.field(sidr_rep::kRequestId)));
    if (!id || id->cm != CmState::kSidrReqSent) return;
    cm_reset(*id);
    rdma_ucm_event_resp e{};
    e.param.ud.private_data_len = sidr_rep::kPrivateDataLen;
    std::memcpy(e.param.ud.private_data, m.body + sidr_rep::kPrivateData,
                sidr_rep::kPrivateDataLen);
    uint8_t status = uint8_t(m.field(sidr_rep::kStatus));
    if (status != kSidrSuccess) {
        queue_event(*id, RDMA_CM_EVENT_UNREACHABLE, status, e);
        return;
    }
    uint32_t qkey = uint32_t(m.field(sidr_rep::kQkey));
    if (id->qkey && id->qkey != qkey) {
        queue_event(*id, RDMA_CM_EVENT_ADDR_ERROR, -EINVAL, e);
        return;
    }
    id->qkey = qkey;
    id->remote_qpn = uint32_t(m.field(sidr_rep::kQpn));
    e.param.ud.ah_attr = roce_ah(id->peer_ip, sgid_index(*id), id->tos, flow_label(*id));
    e.param.ud.qp_num = id->remote_qpn;
    e.param.ud.qkey = qkey;
    e.ece.vendor_id = uint32_t(m.field(sidr_rep::kVendorIdH) << 8 | m.field(sidr_rep::kVendorIdL));
    queue_event(*id, RDMA_CM_EVENT_ESTABLISHED, 0, e);
}

// ------------------------------------------------------------ multicast

int Cm::join(Channel &c, const rdma_ucm_join_mcast &cmd, size_t out_cap, uint8_t *out,
             size_t *out_len) {
    if (out_cap < sizeof(rdma_ucm_create_id_resp)) return ENOSPC;
    SockAddr group;
    if (!SockAddr::load(&cmd.addr, &group) || cmd.addr_size != group.len) return EINVAL;
    if (cmd.join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
        cmd.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
        return EINVAL;
    Id *id = find_id(cmd.id);
    if (!id) return ENOENT;
    if (id->ch != c.num) return EINVAL;
    if (id->dev.empty()) return ENODEV;
    if (id->state != IdState::kAddrBound && id->state != IdState::kAddrResolved) return EINVAL;
    // A group of the id's own family, which its device sends to from the
    // id's address.  IPv6 groups are joined as IPv4 ones are, by the
    // address itself as the MGID (cma_iboe_set_mgid); the kernel refuses
    // them on RoCEv2 ports (ENOTSUPP), which leaves IPv6 hosts no rdma_cm
    // multicast at all.
    if (is_any(group) || group.family() != id->src.family()) return EINVAL;
    if (group.family() == AF_INET6 && !group.addr().multicast()) return EINVAL;
    if (auto n = joins_of_user_.find(c.uid);
        n != joins_of_user_.end() && n->second >= kJoinsPerUser) {
        if (!c.told_joins)
            fprintf(stderr,
                    "sroce agent: uid %u holds %u multicast joins, the most one user may; "
                    "rdma_join_multicast on rdma_cm channel %u (pid %d) gets ENOBUFS\n",
                    unsigned(c.uid), n->second, c.num, int(c.pid));
        c.told_joins = true;
        return ENOBUFS;
    }
    // The join's event.
    if (!event_room(c)) return ENOBUFS;
    McJoin mc;
    // After a wrap a handle may still be held: never two joins on one.
    do {
        mc.handle = next_mc_;
        next_mc_ = next_mc_ == 0xFFFFFFFE ? kMcHandleBase : next_mc_ + 1;
    } while (mcs_.contains(mc.handle));
    joins_of_user_[c.uid]++;
    mc.owner = c.uid;
    mc.id = id->handle;
    mc.uid = cmd.uid;
    mc.group = group.addr();
    mc.send_only = cmd.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
    mcs_[mc.handle] = mc;
    rdma_ucm_create_id_resp r{mc.handle};
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    if (!id->qkey) id->qkey = kUdpQkey;
    // The join completes at once (cma_iboe_join_work_handler): the event
    // carries the group's address handle, QP 0xFFFFFF and the Q_Key.
    rdma_ucm_event_resp e{};
    e.uid = mc.uid;
    e.id = mc.handle;
    e.event = RDMA_CM_EVENT_MULTICAST_JOIN;
    e.param.ud.ah_attr = roce_ah(mc.group, sgid_index(*id), 0, 0);
    e.param.ud.qp_num = 0xFFFFFF;
    e.param.ud.qkey = qkey_of(*id);
    push_event(c, e);
    return 0;
}

int Cm::leave(Channel &c, uint32_t handle, uint8_t *out, size_t out_cap, size_t *out_len) {
    if (out_cap < sizeof(rdma_ucm_destroy_id_resp)) return ENOSPC;
    auto it = mcs_.find(handle);
    if (it == mcs_.end()) return ENOENT;
    Id *id = find_id(it->second.id);
    if (!id || id->ch != c.num) return EINVAL;
    // Its events not yet fetched go with it (ucma_cleanup_mc_events).
    std::erase_if(c.events, [&](const rdma_ucm_event_resp &e) { return e.id == handle; });
    rdma_ucm_destroy_id_resp r{it->second.events_reported};
    erase_join(it);
    std::memcpy(out, &r, sizeof r);
    *out_len = sizeof r;
    return 0;
}

std::vector<Cm::Join> Cm::joins() const {
    std::vector<Join> out;
    for (auto &[h, mc] : mcs_) {
        auto id = ids_.find(mc.id);
        if (id == ids_.end()) continue;
        auto ch = channels_.find(id->second->ch);
        out.push_back(
            {mc.group, id->second->dev, mc.send_only, ch == channels_.end() ? 0 : ch->second->pid});
    }
    return out;
}

void Cm::drop_joins(Channel &c, uint32_t id) {
    for (auto it = mcs_.begin(); it != mcs_.end();) {
        if (it->second.id != id) {
            ++it;
            continue;
        }
        uint32_t handle = it->first;
        std::erase_if(c.events, [&](const rdma_ucm_event_resp &e) { return e.id == handle; });
        it = erase_join(it);
    }
}

std::map<uint32_t, Cm::McJoin>::iterator Cm::erase_join(std::map<uint32_t, McJoin>::iterator it) {
    if (auto n = joins_of_user_.find(it->second.owner);
        n != joins_of_user_.end() && --n->second == 0)
        joins_of_user_.erase(n);
    return mcs_.erase(it);
}

} // namespace sroce::agent
