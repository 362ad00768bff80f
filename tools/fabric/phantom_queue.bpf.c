// SPDX-License-Identifier: GPL-2.0
/*
 * The phantom queue of sroce-fabric(8)'s bottleneck, a tc program on the
 * egress of the switch port towards h0.
 *
 * A phantom queue (HULL, NSDI'12) is a byte counter that every packet towards
 * the port fills and that drains at a little less than the port's rate.  The
 * senders hear of congestion while the real queue behind it is still nearly
 * empty, as a switch's RED/ECN queue would tell them, which these kernels
 * lack.  ECN-capable packets are marked CE as RED marks them (and DCQCN
 * expects of a switch): past a first threshold with a probability that grows
 * with the backlog up to a maximum at a second threshold, and every packet
 * past that.  The ramp is what makes the senders fair: a flow's chance of a
 * mark, and so of a rate cut, grows with its share of the packets; a single
 * threshold marks every flow in the same bursts, large or small, and leaves
 * their rates in the ratio they had.  Packets that are not ECN-capable are
 * counted but left alone (the tail-drop queue deals with them).
 *
 * sroce-fabric writes the parameters into `params` (.data) after tc has
 * loaded the program, and reads the counters from `state` (.bss).  The two
 * CPUs of a small machine may update `state` at once; a lost update moves
 * the backlog by one packet, which a threshold of tens of packets absorbs,
 * so no lock (and no BTF-described map a lock would need).
 *
 * No libbpf headers: the helpers are declared from the kernel's uapi.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <stddef.h>

#define SEC(name) __attribute__((section(name), used))

static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
static long (*bpf_skb_load_bytes)(const void *skb, __u32 off, void *to,
                                  __u32 len) = (void *)BPF_FUNC_skb_load_bytes;
static long (*bpf_skb_store_bytes)(void *skb, __u32 off, const void *from, __u32 len,
                                   __u64 flags) = (void *)BPF_FUNC_skb_store_bytes;
static long (*bpf_l3_csum_replace)(void *skb, __u32 off, __u64 from, __u64 to,
                                   __u64 size) = (void *)BPF_FUNC_l3_csum_replace;

#define NSEC_PER_SEC 1000000000ULL
#define ECN_MASK 3
#define ECN_CE 3

/* Written by sroce-fabric before the first packet; these are only a
 * placeholder (200 Mbit/s at 0.95, one threshold).  max_prob is the
 * probability at max_bytes in units of 2^-32; with max_bytes at
 * threshold_bytes, every packet past it is marked. */
struct phantom_params {
    __u64 drain_bytes_per_sec;
    __u64 threshold_bytes;
    __u64 max_bytes;
    __u64 max_prob;
};
struct phantom_params params SEC(".data") = {23750000, 30000, 30000, 1ULL << 32};

/* Read by `sroce-fabric show`. */
struct phantom_state {
    __u64 backlog_bytes;
    __u64 last_ns;
    __u64 packets;
    __u64 marked;
    __u64 max_backlog_bytes;
};
struct phantom_state state;

static __u64 fill(__u32 len) {
    __u64 now = bpf_ktime_get_ns();
    __u64 idle = now - state.last_ns;
    /* A second idle empties any queue this can describe; the cap keeps the
     * product below 2^64. */
    if (idle > NSEC_PER_SEC) idle = NSEC_PER_SEC;
    __u64 drained = idle * params.drain_bytes_per_sec / NSEC_PER_SEC;
    __u64 backlog = state.backlog_bytes > drained ? state.backlog_bytes - drained : 0;
    /* Time that drained less than a byte is carried to the next packet. */
    if (drained || !state.backlog_bytes) state.last_ns = now;
    backlog += len;
    state.backlog_bytes = backlog;
    if (backlog > state.max_backlog_bytes) state.max_backlog_bytes = backlog;
    state.packets++;
    return backlog;
}

static int mark_ipv4(struct __sk_buff *skb) {
    __u8 tos;
    if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1)) return 0;
    if (!(tos & ECN_MASK) || (tos & ECN_MASK) == ECN_CE) return 0;
    __u8 ce = tos | ECN_CE;
    /* The checksum sums 16-bit words; TOS is the low byte of the first. */
    bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), __constant_htons(tos),
                        __constant_htons(ce), 2);
    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &ce, 1, 0);
    return 1;
}

static int mark_ipv6(struct __sk_buff *skb) {
    /* The traffic class straddles the first two bytes; its ECN bits are
     * bits 4-5 of the second.  No header checksum covers them. */
    __u8 b;
    if (bpf_skb_load_bytes(skb, ETH_HLEN + 1, &b, 1)) return 0;
    __u8 ecn = (b >> 4) & ECN_MASK;
    if (!ecn || ecn == ECN_CE) return 0;
    b |= ECN_CE << 4;
    bpf_skb_store_bytes(skb, ETH_HLEN + 1, &b, 1, 0);
    return 1;
}

/* RED's decision for a packet that found `backlog` bytes. */
static int should_mark(__u64 backlog) {
    if (backlog <= params.threshold_bytes) return 0;
    if (backlog > params.max_bytes) return 1;
    /* At most 2^32 * 2^31: sroce-fabric keeps max_bytes under 2 GiB. */
    __u64 p = params.max_prob * (backlog - params.threshold_bytes) /
              (params.max_bytes - params.threshold_bytes);
    return bpf_get_prandom_u32() < p;
}

SEC("tc")
int phantom_queue(struct __sk_buff *skb) {
    if (!should_mark(fill(skb->len))) return TC_ACT_OK;
    int marked = 0;
    if (skb->protocol == __constant_htons(ETH_P_IP))
        marked = mark_ipv4(skb);
    else if (skb->protocol == __constant_htons(ETH_P_IPV6))
        marked = mark_ipv6(skb);
    if (marked) state.marked++;
    return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
