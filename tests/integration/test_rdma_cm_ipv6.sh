#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# rdma_cm over AF_INET6 with librdmacm's own programs: network namespaces A
# and B joined by a veth pair with fixed MACs (so the link-local addresses
# are known: fe80::ff:fe00:a and fe80::ff:fe00:b), global IPv6 (fd00:33::1,
# fd00:33::2) and IPv4 (10.33.0.1, 10.33.0.2) addresses, and on each end an
# sroce device that follows its veth, as rxe does.  Checks:
#   - rping -v to a global IPv6 address, and to a link-local one with its
#     scope (fe80::...%veth-b), every ping's data verified on both sides;
#   - rping from IPv4 to a server listening on [::] (both families);
#   - ucmatose (RC, connect, transfers, disconnect) and udaddy (UD, SIDR)
#     over IPv6;
#   - mckey over an IPv6 group (ff0e::33) and an IPv4 one (239.0.33.1),
#     the receiver counting every message;
#   - rdma_client and rdma_server (rdma_getaddrinfo, rdma_create_ep) over
#     IPv6.
#
# Usage: test_rdma_cm_ipv6.sh BUILD-DIR
# Exits 77 (ctest SKIP_RETURN_CODE) without root, network namespaces or veth.
# Traffic stays inside the namespaces created here.
#
# ctest: TIMEOUT=600 LABELS=netns PROCESSORS=2
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sroce_init "${1:?usage: test_rdma_cm_ipv6.sh BUILD-DIR}"
((EUID == 0)) || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip(8)"

tmp=$WORK
ns_a=sroce-cm6-a-$$
ns_b=sroce-cm6-b-$$
netns_pair "$ns_a" "$ns_b"
netns_fixed_macs 02:00:00:00:00:0a 02:00:00:00:00:0b
{ in_a ip addr add fd00:33::1/64 dev veth-a nodad && in_b ip addr add fd00:33::2/64 dev veth-b nodad &&
	in_a ip addr add 10.33.0.1/24 dev veth-a && in_b ip addr add 10.33.0.2/24 dev veth-b; } ||
	die "cannot address the namespaces"
ll_a=fe80::ff:fe00:a
in_a ip -6 addr show dev veth-a | grep -q "inet6 $ll_a/64" || die "veth-a has no $ll_a"

netns_sroce cm6
{ link_a fa netdev veth-a && link_b fb netdev veth-b; } || die "sroce link add"

for prog in rping ucmatose udaddy mckey rdma_server rdma_client; do
	command -v "$prog" >/dev/null || die "$prog is not installed (rdmacm-utils)"
done

# rping_pair NAME PORT SERVER-ADDR CLIENT-ADDR: 10 verified pings.
rping_pair() {
	local name=$1 port=$2 at=$3 to=$4
	if netns_cm_pair "$name" "\"port\":${port}[,}]" 60 rping -s -a "$at" -p "$port" -v -C 10 -- \
		rping -c -a "$to" -p "$port" -v -C 10 &&
		(($(grep -c 'server ping data: rdma-ping-' "$tmp/$name.a") == 10)) &&
		(($(grep -c '^ping data: rdma-ping-' "$tmp/$name.b") == 10)); then
		pass "rping -a $to to a server on $at: 10 pings verified on both sides"
	else
		fail "rping -a $to to a server on $at"
	fi
}
rping_pair rping-global 7533 fd00:33::1 fd00:33::1
rping_pair rping-ll 7534 :: "$ll_a%veth-b"
rping_pair rping-v4 7535 :: 10.33.0.1

if netns_cm_pair ucmatose '"port":7536[,}]' 60 ucmatose -b fd00:33::1 -p 7536 -c 2 -C 20 -- \
	ucmatose -s fd00:33::1 -b fd00:33::2 -p 7536 -c 2 -C 20 &&
	grep -q "return status 0" "$tmp/ucmatose.a" && grep -q "return status 0" "$tmp/ucmatose.b"; then
	pass "ucmatose over IPv6: 2 connections, 20 messages each, disconnected"
else
	fail "ucmatose over IPv6"
fi

# udaddy's -p is the port space; it listens on port 7174.
if netns_cm_pair udaddy '"port":7174[,}]' 60 udaddy -b fd00:33::1 -c 2 -C 20 -- \
	udaddy -s fd00:33::1 -b fd00:33::2 -c 2 -C 20 &&
	grep -q "return status 0" "$tmp/udaddy.a" && grep -q "return status 0" "$tmp/udaddy.b"; then
	pass "udaddy over IPv6: SIDR resolved 2 peers, 20 messages each"
else
	fail "udaddy over IPv6"
fi

# mckey's receiver counts the messages it expects (-C) and waits for them.
for group in ff0e::33 239.0.33.1; do
	if [[ $group == *:* ]]; then a=fd00:33::1 b=fd00:33::2; else a=10.33.0.1 b=10.33.0.2; fi
	if netns_cm_pair "mckey-$group" "\"group\":\"$group\"" 60 mckey -m "$group" -b "$a" -C 50 -- \
		mckey -m "$group" -b "$b" -s -C 50 &&
		grep -q "joined dgid: \(::ffff:\)\?$group" "$tmp/mckey-$group.a" &&
		grep -q "data transfers complete" "$tmp/mckey-$group.a" &&
		grep -q "return status 0" "$tmp/mckey-$group.a"; then
		pass "mckey on group $group: 50 messages received"
	else
		fail "mckey on group $group"
	fi
done

if netns_cm_pair rdma_server '"port":7538[,}]' 60 rdma_server -s fd00:33::1 -p 7538 -- \
	rdma_client -s fd00:33::1 -p 7538 &&
	grep -q "rdma_server: end 0" "$tmp/rdma_server.a" && grep -q "rdma_client: end 0" "$tmp/rdma_server.b"; then
	pass "rdma_client to rdma_server over IPv6"
else
	fail "rdma_client to rdma_server over IPv6"
fi

finish
