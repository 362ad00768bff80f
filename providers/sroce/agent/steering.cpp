// SPDX-License-Identifier: MIT
#include "steering.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <linux/bpf.h>
#include <linux/filter.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace sroce::agent {
namespace {

long bpf(int cmd, bpf_attr &attr) {
    return syscall(__NR_bpf, cmd, &attr, sizeof attr);
}

constexpr bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    bpf_insn i{};
    i.code = code;
    i.dst_reg = dst & 0xF;
    i.src_reg = src & 0xF;
    i.off = off;
    i.imm = imm;
    return i;
}

// The BTH follows the 8-byte UDP header the program's data starts with;
// its byte 5 is bits 16-23 of the destination QPN.
constexpr int32_t kSlotByte = 8 + 5;

// One entry per value of the slot byte.
constexpr uint32_t kMapEntries = 256;

} // namespace

int attach_slot_map(int member, std::string &why) {
    if (const char *s = getenv("SROCE_AGENT_STEERING"); s && !strcmp(s, "classic")) {
        why = "SROCE_AGENT_STEERING=classic";
        return -1;
    }
    bpf_attr a{};
    a.map_type = BPF_MAP_TYPE_REUSEPORT_SOCKARRAY;
    a.key_size = sizeof(uint32_t);
    a.value_size = sizeof(uint64_t);
    a.max_entries = kMapEntries;
    int map = int(bpf(BPF_MAP_CREATE, a));
    if (map < 0) {
        why = std::string("no slot map (") + strerror(errno) + ")";
        return -1;
    }
    // r6 = ctx; key = slot byte, or 0 when the datagram is too short;
    // select map[key], else map[0] (the agent), else drop: a slot without
    // a socket is no one's, and with the agent gone nobody answers QP1.
    enum : uint8_t { kR0, kR1, kR2, kR3, kR4, kR6 = 6, kFp = 10 };
    constexpr uint8_t kMov = BPF_ALU64 | BPF_MOV, kAdd = BPF_ALU64 | BPF_ADD;
    std::vector<bpf_insn> p = {
        insn(kMov | BPF_X, kR6, kR1, 0, 0),
        insn(BPF_ST | BPF_MEM | BPF_DW, kFp, 0, -8, 0),
        insn(kMov | BPF_K, kR2, 0, 0, kSlotByte),
        insn(kMov | BPF_X, kR3, kFp, 0, 0),
        insn(kAdd | BPF_K, kR3, 0, 0, -8),
        insn(kMov | BPF_K, kR4, 0, 0, 1),
        insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_skb_load_bytes),
    };
    // bpf_sk_select_reuseport(ctx, map, &key, 0), then to `pass` (the
    // program's last two instructions) when it chose a socket.
    std::vector<size_t> to_pass;
    auto select = [&] {
        p.push_back(insn(kMov | BPF_X, kR1, kR6, 0, 0));
        p.push_back(insn(BPF_LD | BPF_DW | BPF_IMM, kR2, BPF_PSEUDO_MAP_FD, 0, map));
        p.push_back(insn(0, 0, 0, 0, 0));
        p.push_back(insn(kMov | BPF_X, kR3, kFp, 0, 0));
        p.push_back(insn(kAdd | BPF_K, kR3, 0, 0, -8));
        p.push_back(insn(kMov | BPF_K, kR4, 0, 0, 0));
        p.push_back(insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_select_reuseport));
        to_pass.push_back(p.size());
        p.push_back(insn(BPF_JMP | BPF_JEQ | BPF_K, kR0, 0, 0, 0));
    };
    select();
    p.push_back(insn(BPF_ST | BPF_MEM | BPF_DW, kFp, 0, -8, 0)); // key 0
    select();
    p.push_back(insn(kMov | BPF_K, kR0, 0, 0, SK_DROP));
    p.push_back(insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    for (size_t j : to_pass)
        p[j].off = int16_t(p.size() - j - 1);
    p.push_back(insn(kMov | BPF_K, kR0, 0, 0, SK_PASS));
    p.push_back(insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    a = {};
    a.prog_type = BPF_PROG_TYPE_SK_REUSEPORT;
    a.insns = reinterpret_cast<uintptr_t>(p.data());
    a.insn_cnt = uint32_t(p.size());
    a.license = reinterpret_cast<uintptr_t>("MIT");
    int prog = int(bpf(BPF_PROG_LOAD, a));
    if (prog < 0) {
        why = std::string("no steering program (") + strerror(errno) + ")";
        close(map);
        return -1;
    }
    // A group taken over from a dead agent drops its old program, and with
    // it the old map, which frees the sockets in it for this one (a socket
    // is in one map at most; the kernel frees the old map a moment later,
    // and a socket resumed before that is refused, EBUSY, and tries again).
    int err = map_slot(map, 0, member);
    if (!err && setsockopt(member, SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &prog, sizeof prog) < 0)
        err = errno;
    // The group holds the program, and the program the map.
    close(prog);
    if (err) {
        why = std::string("cannot attach the slot map (") + strerror(err) + ")";
        close(map);
        return -1;
    }
    return map;
}

namespace {

// The cookie of the socket at `slot` (what a lookup of a reuseport array
// gives), 0 for an empty slot.
uint64_t slot_cookie(int map, uint32_t slot) {
    uint64_t cookie = 0;
    bpf_attr a{};
    a.map_fd = uint32_t(map);
    a.key = reinterpret_cast<uintptr_t>(&slot);
    a.value = reinterpret_cast<uintptr_t>(&cookie);
    return bpf(BPF_MAP_LOOKUP_ELEM, a) < 0 ? 0 : cookie;
}

bool map_info(int map, bpf_map_info &info) {
    bpf_attr a{};
    a.info.bpf_fd = uint32_t(map);
    a.info.info_len = sizeof info;
    a.info.info = reinterpret_cast<uintptr_t>(&info);
    return bpf(BPF_OBJ_GET_INFO_BY_FD, a) == 0;
}

} // namespace

int adopt_slot_map(uint32_t id, int member, const std::vector<uint32_t> &held, std::string &why) {
    bpf_attr a{};
    a.map_id = id;
    int map = int(bpf(BPF_MAP_GET_FD_BY_ID, a));
    if (map < 0) {
        why = "map " + std::to_string(id) + ": " + strerror(errno);
        return -1;
    }
    bpf_map_info info{};
    const char *bad = nullptr;
    if (!map_info(map, info) || info.type != BPF_MAP_TYPE_REUSEPORT_SOCKARRAY ||
        info.key_size != sizeof(uint32_t) || info.value_size != sizeof(uint64_t) ||
        info.max_entries != kMapEntries)
        bad = " is no slot map";
    else if (std::none_of(held.begin(), held.end(), [map](uint32_t s) {
                 return s < kMapEntries && slot_cookie(map, s) != 0;
             }))
        bad = " holds none of the slots";
    else if (slot_cookie(map, 0) != 0)
        bad = "'s slot 0 is taken";
    int err = bad ? 0 : map_slot(map, 0, member);
    if (bad || err) {
        why = "map " + std::to_string(id) + (bad ? bad : std::string(": ") + strerror(err));
        close(map);
        return -1;
    }
    return map;
}

uint32_t slot_map_id(int map) {
    bpf_map_info info{};
    return map_info(map, info) ? info.id : 0;
}

bool slot_holds(int map, uint32_t slot, int sock) {
    uint64_t cookie = 0;
    socklen_t l = sizeof cookie;
    return getsockopt(sock, SOL_SOCKET, SO_COOKIE, &cookie, &l) == 0 && cookie != 0 &&
           slot_cookie(map, slot) == cookie;
}

int map_slot(int map, uint32_t slot, int sock) {
    uint64_t value = uint64_t(sock);
    bpf_attr a{};
    a.map_fd = uint32_t(map);
    a.key = reinterpret_cast<uintptr_t>(&slot);
    a.value = reinterpret_cast<uintptr_t>(&value);
    a.flags = BPF_ANY;
    return bpf(BPF_MAP_UPDATE_ELEM, a) < 0 ? errno : 0;
}

void unmap_slot(int map, uint32_t slot) {
    bpf_attr a{};
    a.map_fd = uint32_t(map);
    a.key = reinterpret_cast<uintptr_t>(&slot);
    bpf(BPF_MAP_DELETE_ELEM, a);
}

int attach_classic(int member, uint32_t members) {
    // An index past the group, and a datagram too short to have the byte
    // (the load fails and the program returns 0), go to slot 0.
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 5),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, members, 1, 0),
        BPF_STMT(BPF_RET | BPF_A, 0),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    sock_fprog prog{uint16_t(sizeof code / sizeof code[0]), code};
    return setsockopt(member, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) < 0 ? errno
                                                                                            : 0;
}

} // namespace sroce::agent
