// SPDX-License-Identifier: MIT
//
// Congestion control (docs/congestion-control.md), as RoCE RNICs do it:
// packets leave ECN-capable, a receiver answers CE marks with CNPs (the
// notification point), and a sender's QP that gets CNPs is held to a rate
// that DCQCN's algorithm sets (the reaction point), paced by the progress
// thread.  The state lives in each QP (QpCc, under Qp::mu); the device's
// parameters in the NIC (Nic::cc()).
#pragma once

#include "config.hpp"

#include <cstdint>

namespace sroce {

struct Qp;
struct TxBatch;
namespace wire {
struct Packet;
}

// The ECN field's code points (RFC 3168), in the traffic class's two low bits.
constexpr uint8_t kEcnMask = 3, kEct0 = 2, kEcnCe = 3;

// A device's congestion control in the engine's units: times in ns, rates
// in bytes per ns (1 Mbit/s = 1/8000 byte/ns).
struct CcConfig {
    bool on = false;
    uint8_t cnp_tclass = 0;
    uint64_t cnp_interval_ns = 0, cut_interval_ns = 0, alpha_timer_ns = 0, rate_timer_ns = 0;
    uint64_t rate_bytes = 0;
    uint64_t inflight_ns = 0;
    uint32_t stages = 0;
    double g = 0;
    double ai = 0, hai = 0, min_rate = 0, first_rate = 0;
    static CcConfig from(const CcParams &p);
};

// What a packet of `payload` bytes costs a QP's rate: the payload and the
// headers around it on an Ethernet link (Ethernet 14, IPv4 20, UDP 8, BTH 12,
// ICRC 4, FCS 4, and an extended header or two).
constexpr uint32_t kCcPacketOverhead = 80;

// One QP's congestion control, both roles; under Qp::mu.
struct QpCc {
    // Notification point: when the last CNP left, and whether one has.
    uint64_t cnp_sent_ns = 0;
    // Reaction point.  Not limited: the QP sends as fast as it can, as an
    // RNIC's QP at line rate; the first CNP starts the limiter.
    bool limited = false;
    double rc = 0, rt = 0; // current and target rate
    double alpha = 1;
    uint64_t alpha_ns = 0; // α was last brought up to date
    uint64_t cut_ns = 0;   // the last rate cut
    // Rate increase events since the last cut: of the timer (each
    // rate_timer_ns after stage_ns) and of the byte counter (each
    // rate_bytes sent, stage_bytes of them so far).
    uint32_t t_stages = 0, b_stages = 0;
    uint64_t stage_ns = 0, stage_bytes = 0;
    // The token bucket that paces the requester at rc: bytes it may send
    // now (negative: owed), as of tokens_ns.
    double tokens = 0;
    uint64_t tokens_ns = 0;
    // The request bytes and packets sent (kCcPacketOverhead each packet
    // included), the packets acknowledged, and the rate the QP's bytes got
    // through at: an average over the meter's periods, the last ending at
    // meter_ns with meter_bytes delivered.
    uint64_t tx_bytes = 0, tx_pkts = 0, acked_pkts = 0, meter_bytes = 0, meter_ns = 0;
    uint64_t meter_tx_bytes = 0; // tx_bytes at meter_ns
    double meter_rate = 0;
    // Counters, shown per QP by `sroce resource show qp`.
    uint64_t cnps_sent = 0, cnps_received = 0, cuts = 0;
};

// Notification point: `pkt`, a request for `qp`, arrived with CE.  Queues a
// CNP to the sender's QP into `tx` unless one left less than cnp_interval_ns
// ago.
void cc_congestion_seen(Qp *qp, const wire::Packet &pkt, TxBatch &tx);
// Reaction point: a CNP for `qp` arrived from its peer.
void cc_cnp_received(Qp *qp, uint64_t now);
// The requester is about to send a packet of `bytes` (payload and
// kCcPacketOverhead): false when the QP's rate holds it back, and then the
// QP's pacing timer is set for when it may.  `now` is the requester's
// cc_refill() time.
bool cc_admit(Qp *qp, uint32_t bytes, uint64_t now);
// How many packets a limited QP may have unacknowledged: its rate times
// inflight-time, in packets of the average size it sends, at least two.
uint32_t cc_inflight_cap(const Qp *qp);
// The token bucket and the timer's rate increases brought up to `now`;
// called by the requester before it sends while the QP is limited.
void cc_refill(Qp *qp, uint64_t now);
// Every timer scan: the send rate's meter, and the limiter let go once it
// no longer holds the QP back (true when it let go of it now).
bool cc_tick(Qp *qp, uint64_t now);
// Forgets everything but the counters (the QP was reset).
void cc_reset(Qp *qp);

} // namespace sroce
