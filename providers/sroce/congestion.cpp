// SPDX-License-Identifier: MIT
//
// DCQCN (Zhu et al., SIGCOMM 2015) per QP, in the engine's units; the
// parameters and what differs for software rates are in
// docs/congestion-control.md.
#include "congestion.hpp"

#include "nic.hpp"

#include <algorithm>
#include <cmath>

namespace sroce {

namespace {

constexpr double kMbit = 1.0 / 8000; // 1 Mbit/s in bytes per ns
// The most a limited QP may send at once after a pause: this long at its
// rate, so that a progress thread woken late catches up, or two packets.
constexpr uint64_t kBurstNs = 250000;
// The meter's period, and the weight of each period's rate in its average
// (1/4: it follows the rate within a few milliseconds).
constexpr uint64_t kMeterNs = 1000000;
constexpr double kMeterWeight = 0.25;
// Past this rate (100 Gbit/s) the limiter holds nothing back and lets go.
constexpr double kLetGoRate = 100000 * kMbit;
// Increases counted at once when the QP has been idle for long: beyond
// this many, the next CNP finds the limiter let go anyway.
constexpr uint32_t kMaxCatchUp = 64;

// And never more than this: at a rate far above what the path takes (the
// limiter recovering towards a target), a quarter millisecond's worth would
// be megabytes at once into the bottleneck's queue.
constexpr double kMaxBurst = 65536;

double burst(const Qp *qp) {
    return std::max(2.0 * (qp->attr.mtu + kCcPacketOverhead),
                    std::min(kMaxBurst, qp->cc.rc * double(kBurstNs)));
}

// A rate increase event of DCQCN: fast recovery towards the target while
// both counters are below F; then the target grows, additively while one
// of them is, faster once both are past it.
void increase(QpCc &c, const CcConfig &k) {
    uint32_t hi = std::max(c.t_stages, c.b_stages), lo = std::min(c.t_stages, c.b_stages);
    if (hi < k.stages) {
    } else if (lo > k.stages) {
        c.rt += double(lo - k.stages) * k.hai;
    } else {
        c.rt += k.ai;
    }
    c.rc = (c.rt + c.rc) / 2;
}

// What the peer has received of the QP: its acknowledged packets at the
// average size of those sent (an ACK covers PSNs, not bytes), or for a QP
// that nothing acknowledges, the bytes sent.
uint64_t delivered(const Qp *qp) {
    const QpCc &c = qp->cc;
    if (!qp->reliable()) return c.tx_bytes;
    return c.tx_pkts ? uint64_t(double(c.acked_pkts) * double(c.tx_bytes) / double(c.tx_pkts)) : 0;
}

// The rate the QP's packets got through at, as well as the meter knows it;
// before its first period, what it has seen of this one; with nothing
// delivered yet, the rate it sends at, the nearest thing to an RNIC's line
// rate (the cuts that follow bring it down as they would that).
double measured_rate(const Qp *qp, uint64_t now) {
    const QpCc &c = qp->cc;
    if (c.meter_rate > 0 || !c.meter_ns || now <= c.meter_ns) return c.meter_rate;
    double span = double(now - c.meter_ns);
    double got = double(delivered(qp) - c.meter_bytes) / span;
    return got > 0 ? got : double(c.tx_bytes - c.meter_tx_bytes) / span;
}

void publish(Qp *qp) {
    qp->nic->publish_cc(qp);
}

} // namespace

CcConfig CcConfig::from(const CcParams &p) {
    CcConfig k;
    k.on = p.enabled;
    k.cnp_tclass = uint8_t(uint8_t(p.cnp_dscp) << 2);
    k.cnp_interval_ns = uint64_t(p.cnp_interval * 1000);
    k.cut_interval_ns = uint64_t(p.cut_interval * 1000);
    k.alpha_timer_ns = uint64_t(p.alpha_timer * 1000);
    k.rate_timer_ns = uint64_t(p.rate_timer * 1000);
    k.rate_bytes = uint64_t(p.rate_bytes);
    k.inflight_ns = uint64_t(p.inflight_time * 1000);
    k.stages = uint32_t(p.stages);
    k.g = p.alpha_g;
    k.ai = p.ai_rate * kMbit;
    k.hai = p.hai_rate * kMbit;
    k.min_rate = p.min_rate * kMbit;
    k.first_rate = p.first_rate * kMbit;
    return k;
}

void cc_congestion_seen(Qp *qp, const wire::Packet &pkt, TxBatch &tx) {
    using namespace wire;
    Nic *nic = qp->nic;
    const CcConfig &k = nic->cc();
    uint64_t now = now_ns();
    QpCc &c = qp->cc;
    if (c.cnps_sent && now - c.cnp_sent_ns < k.cnp_interval_ns) return;
    // To the QP that sent the request: the connected peer, or a datagram's
    // sender (its DETH's source QP).
    uint32_t dqpn;
    IpAddr src, dst;
    IpFields f;
    if (qp->type == IBV_QPT_UD) {
        dqpn = get24(pkt.hdr + pkt.info->deth + 5);
        src = pkt.dst_addr;
        dst = pkt.src_addr;
    } else {
        dqpn = qp->attr.dest_qpn;
        src = qp->attr.src_addr;
        dst = qp->attr.dest_addr;
        f = ip_fields(qp->attr.ah.grh);
    }
    f.tclass = k.cnp_tclass;
    uint8_t h[kBthLen + kCnpPadLen] = {};
    bth::build(h, kCnp, false, 0, kDefaultPkey, dqpn, false, 0);
    h[4] = bth::kBecn;
    nic->queue(tx, src, dst, f, h, sizeof h, nullptr, 0, 0, Nic::kQueueCnp);
    c.cnp_sent_ns = now;
    c.cnps_sent++;
    nic->stats.tx_cnp.fetch_add(1, std::memory_order_relaxed);
    publish(qp);
}

void cc_cnp_received(Qp *qp, uint64_t now) {
    const CcConfig &k = qp->nic->cc();
    QpCc &c = qp->cc;
    c.cnps_received++;
    if (!c.limited) {
        // An RNIC starts from its line rate; software has none, so the rate
        // the QP's packets got through at is what the first cut is taken
        // from: its acknowledgements' (what it sent is no measure: a burst
        // of a whole window leaves at once, and then nothing).
        double r = k.first_rate > 0 ? k.first_rate : measured_rate(qp, now);
        c.rc = c.rt = std::max(r, k.min_rate);
        c.limited = true;
        c.tokens = 0;
        c.tokens_ns = now;
        c.cut_ns = now - k.cut_interval_ns;
        if (!c.alpha_ns) c.alpha_ns = now; // α starts at 1, undecayed
        c.stage_ns = now;
    } else {
        cc_refill(qp, now);
    }
    if (now - c.cut_ns >= k.cut_interval_ns) {
        // α decays once per alpha_timer_ns without a CNP; brought up to date
        // here, where it is used.
        if (uint64_t quiet = k.alpha_timer_ns ? (now - c.alpha_ns) / k.alpha_timer_ns : 0)
            c.alpha *= std::pow(1 - k.g, double(std::min<uint64_t>(quiet, 1u << 20)));
        c.rt = c.rc;
        c.rc = std::max(k.min_rate, c.rc * (1 - c.alpha / 2));
        c.alpha = (1 - k.g) * c.alpha + k.g;
        c.alpha_ns = now;
        c.cut_ns = now;
        c.t_stages = c.b_stages = 0;
        c.stage_ns = now;
        c.stage_bytes = 0;
        c.tokens = std::min(c.tokens, burst(qp));
        c.cuts++;
        qp->nic->stats.cc_rate_cuts.fetch_add(1, std::memory_order_relaxed);
    }
    qp->nic->stats.rx_cnp_handled.fetch_add(1, std::memory_order_relaxed);
    publish(qp);
}

void cc_refill(Qp *qp, uint64_t now) {
    const CcConfig &k = qp->nic->cc();
    QpCc &c = qp->cc;
    if (k.rate_timer_ns && now - c.stage_ns >= k.rate_timer_ns) {
        uint64_t n = (now - c.stage_ns) / k.rate_timer_ns;
        c.stage_ns += n * k.rate_timer_ns;
        for (uint64_t i = 0; i < std::min<uint64_t>(n, kMaxCatchUp); i++) {
            c.t_stages++;
            increase(c, k);
        }
    }
    if (now > c.tokens_ns) {
        c.tokens = std::min(burst(qp), c.tokens + double(now - c.tokens_ns) * c.rc);
        c.tokens_ns = now;
    }
}

bool cc_admit(Qp *qp, uint32_t bytes, uint64_t now) {
    QpCc &c = qp->cc;
    if (c.tokens <= 0) {
        // When the debt is paid; a nanosecond late rather than early.
        uint64_t at = now + uint64_t(-c.tokens / c.rc) + 1;
        qp->timers.pace_at_ns = at;
        qp->nic->pace_at(at);
        qp->nic->stats.cc_paced.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    c.tokens -= bytes;
    c.stage_bytes += bytes;
    const CcConfig &k = qp->nic->cc();
    if (c.stage_bytes >= k.rate_bytes) {
        c.stage_bytes = 0;
        c.b_stages++;
        increase(c, k);
    }
    return true;
}

uint32_t cc_inflight_cap(const Qp *qp) {
    const QpCc &c = qp->cc;
    const CcConfig &k = qp->nic->cc();
    if (!c.limited || !k.inflight_ns || !c.tx_pkts) return UINT32_MAX;
    double avg = double(c.tx_bytes) / double(c.tx_pkts);
    double pkts = c.rc * double(k.inflight_ns) / avg;
    return pkts < 2 ? 2 : pkts > 1e9 ? UINT32_MAX : uint32_t(pkts);
}

bool cc_tick(Qp *qp, uint64_t now) {
    QpCc &c = qp->cc;
    uint64_t d = delivered(qp);
    if (!c.meter_ns) {
        // The QP's first scan: its first period starts.
        c.meter_ns = now;
        c.meter_bytes = d;
        c.meter_tx_bytes = c.tx_bytes;
        return false;
    }
    if (now - c.meter_ns < kMeterNs) return false;
    double period = double(d - c.meter_bytes) / double(now - c.meter_ns);
    c.meter_rate =
        c.meter_rate > 0 ? (1 - kMeterWeight) * c.meter_rate + kMeterWeight * period : period;
    c.meter_bytes = d;
    c.meter_tx_bytes = c.tx_bytes;
    c.meter_ns = now;
    if (!c.limited) return false;
    cc_refill(qp, now);
    // Recovered to where the limiter holds nothing back: the QP goes at its
    // own pace again.
    bool let_go = c.rc >= kLetGoRate;
    if (let_go) {
        c.limited = false;
        qp->timers.pace_at_ns = 0;
    }
    publish(qp);
    return let_go;
}

void cc_reset(Qp *qp) {
    QpCc &c = qp->cc;
    QpCc fresh;
    fresh.cnps_sent = c.cnps_sent;
    fresh.cnps_received = c.cnps_received;
    fresh.cuts = c.cuts;
    fresh.meter_ns = c.meter_ns; // the meter's periods go on
    c = fresh;
    qp->timers.pace_at_ns = 0;
}

} // namespace sroce
