// SPDX-License-Identifier: MIT
//
// Devices and contexts: the device list built from the link configuration,
// opening a device, device/port/GID queries and async events.
#include "nic.hpp"
#include "no_destructor.hpp"
#include "provider.h"
#include "transport.hpp"

#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <net/if.h>
#include <new>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sroce {

int cq_poll(ibv_cq *cq, int n, ibv_wc *wc);
int cq_req_notify(ibv_cq *cq, int solicited_only);
ibv_cq_ex *create_cq_ex(ibv_context *ctx, ibv_cq_init_attr_ex *attr);
int qp_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad);
int qp_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad);
ibv_qp *create_qp_ex(ibv_context *ctx, ibv_qp_init_attr_ex *attr);
ibv_srq *create_srq_ex(ibv_context *ctx, ibv_srq_init_attr_ex *attr);
int srq_num(ibv_srq *srq, uint32_t *num);
int post_srq_recv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
int post_srq_ops(ibv_srq *srq, ibv_ops_wr *op, ibv_ops_wr **bad_op);
ibv_xrcd *open_xrcd(ibv_context *ctx, ibv_xrcd_init_attr *attr);
int close_xrcd(ibv_xrcd *xrcd);
ibv_mw *alloc_mw(ibv_pd *pd, ibv_mw_type type);
int bind_mw(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *mw_bind);
int dealloc_mw(ibv_mw *mw);
int advise_mr(ibv_pd *pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg_list,
              uint32_t num_sge);

int mtu_bytes(ibv_mtu m) {
    return 128 << int(m);
}

namespace {

// The configured devices.  Never destroyed (no_destructor.hpp): progress
// threads read their device until the process ends.
Device *devices() noexcept {
    static NoDestructor<std::array<Device, kMaxDevices>> devs;
    return devs->data();
}
ibv_device *g_list[kMaxDevices + 1];
int g_ndevs = 0;
std::once_flag g_once;

// Open contexts, so that a command FD handed to ibv_import_device() can be
// recognised as one of ours.  Never destroyed: progress threads post their
// device's events to them, and the application may still be opening and
// closing contexts, while exit() runs.
std::mutex g_ctx_mu;
std::vector<Context *> &contexts() noexcept {
    static NoDestructor<std::vector<Context *>> ctxs;
    return *ctxs;
}

ibv_mtu mtu_enum(int bytes) {
    switch (bytes) {
    case 4096:
        return IBV_MTU_4096;
    case 2048:
        return IBV_MTU_2048;
    case 1024:
        return IBV_MTU_1024;
    case 512:
        return IBV_MTU_512;
    default:
        return IBV_MTU_256;
    }
}

void read_mac(const std::string &netdev, uint8_t mac[6]) {
    std::ifstream f("/sys/class/net/" + netdev + "/address");
    unsigned v[6];
    std::string s;
    if (f >> s &&
        sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6)
        for (int i = 0; i < 6; i++)
            mac[i] = uint8_t(v[i]);
}

void load_devices() {
    std::vector<Link> links;
    std::string path = config_path();
    const char *port = getenv("SROCE_PORT");
    bool memory = port && !strcmp(port, "memory");
    try {
        links = load_links(path);
    } catch (const std::exception &e) {
        fprintf(stderr, "sroce: %s; no sroce devices\n", e.what());
        return;
    }
    for (const Link &l : links) {
        if (g_ndevs == kMaxDevices) break;
        Device &d = devices()[g_ndevs];
        d.follow = l.addr.empty();
        if (d.follow && memory) {
            fprintf(stderr,
                    "sroce: %s: a link without an address has its interface's, which the "
                    "in-memory wire has not; skipping it\n",
                    l.name.c_str());
            continue;
        }
        if (!d.follow && !IpAddr::parse(l.addr.c_str(), &d.addr)) {
            fprintf(stderr, "sroce: %s: '%s' is not an IP address, skipping it\n", l.name.c_str(),
                    l.addr.c_str());
            continue;
        }
        d.link = l;
        d.index = g_ndevs;
        d.ifindex = memory ? 0 : int(if_nametoindex(l.netdev.c_str()));
        d.memory = memory;
        try {
            d.ifmtu = memory ? 65536 : interface_mtu(l.netdev);
        } catch (const std::exception &) {
            d.ifmtu = 1500;
        }
        // A device that follows its net device may carry IPv6: its MTU is
        // the one both families fit in.
        int m = roce_mtu(d.ifmtu, d.follow || !d.addr.is_v4());
        d.active_mtu = mtu_enum(m ? m : 256);
        if (!memory) read_mac(l.netdev, d.mac);
        // Interfaces without a MAC (lo) get a locally administered one made
        // from the address, so GUIDs and link-local GIDs stay unique.
        static const uint8_t zero[6] = {};
        if (!std::memcmp(d.mac, zero, 6)) {
            d.mac[0] = 0x02;
            d.mac[1] = 0x00;
            if (d.follow)
                std::memcpy(d.mac + 2, &d.ifindex, 4);
            else
                std::memcpy(d.mac + 2, d.addr.raw + 12, 4);
        }
        uint8_t eui[8] = {
            uint8_t(d.mac[0] ^ 2), d.mac[1], d.mac[2], 0xFF, 0xFE, d.mac[3], d.mac[4], d.mac[5]};
        std::memcpy(&d.guid, eui, 8);
        // GID table as Linux rxe builds it: the link-local address the MAC
        // makes first, then the addresses (IPv4-mapped, or IPv6 unless one
        // is that link-local one), all RoCE v2.
        d.default_gid.raw[0] = 0xFE;
        d.default_gid.raw[1] = 0x80;
        std::memcpy(d.default_gid.raw + 8, eui, 8);
        if (d.follow)
            d.gids.update(d.default_gid, memory ? std::vector<IpAddr>{} : netdev_addrs(l.netdev));
        else
            d.gids.set_fixed(d.default_gid, d.addr);

        ibv_device &ib = d.ibdev;
        ib.node_type = IBV_NODE_CA;
        ib.transport_type = IBV_TRANSPORT_IB;
        snprintf(ib.name, sizeof ib.name, "%s", l.name.c_str());
        snprintf(ib.dev_name, sizeof ib.dev_name, "uverbs%d", 100 + g_ndevs);
        std::string dev_path = std::string("/sys/class/infiniband_verbs/") + ib.dev_name;
        std::string ibdev_path = "/sys/class/infiniband/" + l.name;
        snprintf(ib.dev_path, sizeof ib.dev_path, "%s", dev_path.c_str());
        snprintf(ib.ibdev_path, sizeof ib.ibdev_path, "%s", ibdev_path.c_str());
        g_list[g_ndevs] = &ib;
        g_ndevs++;
    }
    g_list[g_ndevs] = nullptr;
}

int query_port_ex(ibv_context *ctx, uint8_t port, ibv_port_attr *attr, size_t attr_len) {
    ibv_port_attr a{};
    int rc = sroce_query_port(ctx, port, &a);
    if (rc) return rc;
    std::memcpy(attr, &a, std::min(attr_len, sizeof a));
    return 0;
}

int query_device_ex(ibv_context *ctx, const ibv_query_device_ex_input *input,
                    ibv_device_attr_ex *attr, size_t attr_size) {
    if (input && input->comp_mask) return EINVAL;
    if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
    ibv_device_attr_ex a{};
    int rc = sroce_query_device(ctx, &a.orig_attr);
    if (rc) return rc;
    a.device_cap_flags_ex = a.orig_attr.device_cap_flags | IB_UVERBS_DEVICE_FLUSH_GLOBAL |
                            IB_UVERBS_DEVICE_FLUSH_PERSISTENT | IB_UVERBS_DEVICE_ATOMIC_WRITE;
    a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
    // The engine reaches application memory through the process's own page
    // tables, so nothing is ever pinned: every registration already behaves
    // as on-demand paging, including one of the whole address space.
    // Not IBV_ODP_SUPPORT_IMPLICIT, as Linux rxe: a region over the whole
    // address space would let any holder of its key write anywhere in the
    // process, and UCX 1.11-1.14 crash closing a device that offers it.
    a.odp_caps.general_caps = IBV_ODP_SUPPORT;
    constexpr uint32_t kOdpAll = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                 IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
                                 IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.per_transport_caps.rc_odp_caps = kOdpAll;
    a.odp_caps.per_transport_caps.uc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
                                                IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.per_transport_caps.ud_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    a.xrc_odp_caps = kOdpAll;
    // Tag matching for RC: eager and rendezvous, one buffer per tag.
    a.tm_caps.max_rndv_hdr_size = kMaxRndvHdr;
    a.tm_caps.max_num_tags = kMaxTmTags;
    a.tm_caps.flags = IBV_TM_CAP_RC;
    a.tm_caps.max_ops = kMaxTmTags;
    a.tm_caps.max_sge = 1;
    a.completion_timestamp_mask = ~0ull;
    a.hca_core_clock = kCoreClockKhz;
    std::memcpy(attr, &a, std::min(attr_size, sizeof a));
    return 0;
}

ibv_qp *ctx_create_qp_ex(ibv_context *ctx, ibv_qp_init_attr_ex *attr) {
    return create_qp_ex(ctx, attr);
}

// The raw clock is the one completion timestamps use: CLOCK_MONOTONIC, in
// nanoseconds (hca_core_clock is 1 GHz).  Its ticks go in tv_nsec with
// tv_sec 0, as mlx4 and mlx5 give their cycle counter, so that programs
// written for them convert it with hca_core_clock; tv_sec * 1e9 + tv_nsec
// is the same count for those that read a timespec.
int query_rt_values(ibv_context *, ibv_values_ex *values) {
    uint32_t asked = values->comp_mask;
    if (asked & ~uint32_t(IBV_VALUES_MASK_RAW_CLOCK)) return EINVAL;
    values->comp_mask = 0;
    if (asked & IBV_VALUES_MASK_RAW_CLOCK) {
        timespec t{};
        clock_gettime(CLOCK_MONOTONIC, &t);
        values->raw_clock.tv_sec = 0;
        values->raw_clock.tv_nsec = long(uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec));
        values->comp_mask |= IBV_VALUES_MASK_RAW_CLOCK;
    }
    return 0;
}

// Shared by ibv_query_port() and the port's sysfs files, so both agree.
void port_attr(const Device &d, ibv_port_attr *a) {
    bool up = port_down_reason(d) == 0;
    *a = ibv_port_attr{};
    a->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = d.active_mtu;
    a->gid_tbl_len = kGidTblLen;
    a->port_cap_flags = IBV_PORT_CM_SUP;
    a->max_msg_sz = uint32_t(kMaxMsgSize);
    a->pkey_tbl_len = 1;
    a->max_vl_num = 1;
    a->active_width = 1;        // 1X
    a->active_speed = 1;        // 2.5 Gb/s, what rxe reports
    a->phys_state = up ? 5 : 3; // LinkUp / Disabled
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

std::string hex(const char *fmt, unsigned v) {
    char b[16];
    snprintf(b, sizeof b, fmt, v);
    return b;
}

// A GID as the kernel prints it (%pI6): eight groups of four hex digits.
std::string gid_text(const ibv_gid &g) {
    std::string s;
    for (int i = 0; i < 16; i += 2)
        s += hex(i ? ":%04x" : "%04x", unsigned(g.raw[i] << 8 | g.raw[i + 1]));
    return s;
}

// The text of a file below /sys/class/infiniband/<dev>/ in the kernel's
// format, so that programs reading sysfs (directly, or in a tree sroce exec
// builds from these values) see what ibv_query_*() reports.
bool sysfs_value(const Device &d, std::string_view file, std::string &v) {
    static const char *const port_states[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE"};
    static const char *const phys_states[] = {
        "", "Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp"};
    if (file == "board_id" || file == "hca_type") {
        v = "sroce";
    } else if (file == "fw_ver") {
        v = "0.0.0";
    } else if (file == "hw_rev") {
        v = "0";
    } else if (file == "node_type") {
        v = "1: CA";
    } else if (file == "node_desc") {
        v = d.link.name;
    } else if (file == "node_guid" || file == "sys_image_guid") {
        uint8_t g[8];
        std::memcpy(g, &d.guid, 8);
        for (int i = 0; i < 8; i += 2)
            v += hex(i ? ":%04x" : "%04x", unsigned(g[i] << 8 | g[i + 1]));
    } else if (file.starts_with("ports/1/")) {
        file.remove_prefix(8);
        ibv_port_attr a;
        port_attr(d, &a);
        unsigned idx = 0;
        auto indexed = [&](std::string_view dir, unsigned limit) {
            if (!file.starts_with(dir)) return false;
            std::string_view n = file.substr(dir.size());
            if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != n.npos)
                return false;
            idx = unsigned(std::stoul(std::string(n)));
            return idx < limit;
        };
        if (file == "state")
            v = std::to_string(a.state) + ": " + port_states[a.state];
        else if (file == "phys_state")
            v = std::to_string(a.phys_state) + ": " + phys_states[a.phys_state];
        else if (file == "rate" && a.active_speed == 1 && a.active_width == 1) // SDR, 1X
            v = "2.5 Gb/sec (1X SDR)";
        else if (file == "lid")
            v = hex("0x%x", a.lid);
        else if (file == "sm_lid")
            v = hex("0x%x", a.sm_lid);
        else if (file == "sm_sl")
            v = std::to_string(a.sm_sl);
        else if (file == "lid_mask_count")
            v = std::to_string(a.lmc);
        else if (file == "cap_mask")
            v = hex("0x%08x", a.port_cap_flags);
        else if (file == "link_layer")
            v = "Ethernet";
        // An empty entry reads as the zero GID; its attributes cannot be
        // read (EINVAL), as rxe's.
        else if (ibv_gid g{}; indexed("gids/", kGidTblLen))
            v = gid_text(d.gids.get(idx, &g) ? g : ibv_gid{});
        else if (indexed("gid_attrs/types/", kGidTblLen) && d.gids.get(idx, &g))
            v = "RoCE v2";
        else if (indexed("gid_attrs/ndevs/", kGidTblLen) && d.gids.get(idx, &g))
            v = d.link.netdev;
        else if (indexed("pkeys/", 1))
            v = hex("0x%04x", wire::kDefaultPkey);
        else
            return false;
    } else {
        return false;
    }
    return true;
}

} // namespace

Device *to_dev(ibv_device *d) {
    return reinterpret_cast<Device *>(d);
}

} // namespace sroce

using namespace sroce;

extern "C" {

int sroce_device_list(struct ibv_device ***devs) try {
    std::call_once(g_once, load_devices);
    *devs = g_list;
    return g_ndevs;
} catch (const std::bad_alloc &) {
    return out_of_memory(0);
}

int sroce_owns_device(const struct ibv_device *dev) {
    auto *p = reinterpret_cast<const Device *>(dev);
    const Device *devs = devices();
    return p >= devs && p < devs + g_ndevs;
}

__be64 sroce_get_device_guid(struct ibv_device *dev) {
    return to_dev(dev)->guid;
}
int sroce_get_device_index(struct ibv_device *dev) {
    return 1000 + to_dev(dev)->index;
}

int sroce_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) try {
    std::call_once(g_once, load_devices);
    for (int i = 0; i < g_ndevs; i++) {
        Device &d = devices()[i];
        if (std::strcmp(dir, d.ibdev.ibdev_path) != 0) continue;
        std::string v;
        if (!sysfs_value(d, file, v)) {
            errno = ENOENT;
            return -1;
        }
        v += "\n";
        size_t n = std::min(size ? size - 1 : 0, v.size());
        std::memcpy(buf, v.data(), n);
        if (size) buf[n] = 0;
        return int(n);
    }
    return -2;
} catch (const std::bad_alloc &) {
    return out_of_memory(-1);
}

} // extern "C"

namespace sroce {

std::vector<agent::CmDeviceInfo> cm_device_infos() {
    std::call_once(g_once, load_devices);
    std::vector<agent::CmDeviceInfo> out;
    for (int i = 0; i < g_ndevs; i++) {
        const Device &d = devices()[i];
        agent::CmDeviceInfo c{};
        std::memcpy(c.addr, d.addr.raw, 16);
        c.index = uint32_t(sroce_get_device_index(const_cast<ibv_device *>(&d.ibdev)));
        c.guid = d.guid;
        c.mtu = uint8_t(d.active_mtu);
        snprintf(c.name, sizeof c.name, "%s", d.ibdev.name);
        snprintf(c.netdev, sizeof c.netdev, "%s", d.link.netdev.c_str());
        static_assert(std::size(c.gids) == kMaxGids);
        for (uint32_t i = 0; i < uint32_t(kMaxGids); i++) {
            ibv_gid g;
            if (d.gids.get(i, &g)) std::memcpy(c.gids[i], g.raw, 16);
        }
        out.push_back(c);
    }
    return out;
}

void post_device_event(Nic *nic, ibv_event_type type) {
    std::lock_guard<std::mutex> g(g_ctx_mu);
    for (Context *c : contexts()) {
        if (c->nic != nic) continue;
        ibv_async_event ev{};
        ev.element.port_num = 1;
        ev.event_type = type;
        c->post_event(ev);
    }
}

namespace {

// A context of `ibdev` whose command FD is `cmd_fd` (taken over, closed on
// failure); nullptr with errno set.
ibv_context *open_context(ibv_device *ibdev, int cmd_fd) {
    Device *dev = to_dev(ibdev);
    struct stat st;
    if (fstat(cmd_fd, &st) < 0) {
        close(cmd_fd);
        return nullptr;
    }
    Nic *nic = Nic::acquire(dev);
    if (!nic) {
        close(cmd_fd);
        return nullptr;
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        close(cmd_fd);
        nic->release();
        return nullptr;
    }
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    auto *ctx = new (std::nothrow) Context;
    if (ctx) {
        // Registered before anything else can fail, so close finds it.
        std::lock_guard<std::mutex> g(g_ctx_mu);
        try {
            contexts().push_back(ctx);
        } catch (const std::bad_alloc &) {
            delete ctx;
            ctx = nullptr;
        }
    }
    if (!ctx) {
        close(fds[0]);
        close(fds[1]);
        close(cmd_fd);
        nic->release();
        return out_of_memory<ibv_context *>(nullptr);
    }
    std::memset(&ctx->vctx, 0, sizeof ctx->vctx);
    ctx->dev = dev;
    ctx->nic = nic;
    ctx->file_dev = st.st_dev;
    ctx->file_ino = st.st_ino;
    ctx->async_rd = fds[0];
    ctx->async_wr = fds[1];
    verbs_context &v = ctx->vctx;
    v.sz = sizeof v;
    v.query_port = query_port_ex;
    v.query_device_ex = query_device_ex;
    v.create_qp_ex = ctx_create_qp_ex;
    v.create_cq_ex = create_cq_ex;
    v.create_srq_ex = create_srq_ex;
    v.get_srq_num = srq_num;
    v.post_srq_ops = post_srq_ops;
    v.open_xrcd = open_xrcd;
    v.close_xrcd = close_xrcd;
    v.query_rt_values = query_rt_values;
    v.advise_mr = advise_mr;
    ibv_context &c = v.context;
    c.device = ibdev;
    c.cmd_fd = cmd_fd;
    c.async_fd = fds[0];
    c.num_comp_vectors = 1;
    pthread_mutex_init(&c.mutex, nullptr);
    c.abi_compat = __VERBS_ABI_IS_EXTENDED;
    c.ops.poll_cq = cq_poll;
    c.ops.req_notify_cq = cq_req_notify;
    c.ops.post_send = qp_post_send;
    c.ops.post_recv = qp_post_recv;
    c.ops.post_srq_recv = post_srq_recv;
    c.ops.alloc_mw = alloc_mw;
    c.ops.bind_mw = bind_mw;
    c.ops.dealloc_mw = dealloc_mw;
    return &c;
}

} // namespace
} // namespace sroce

extern "C" {

struct ibv_context *sroce_open_device(struct ibv_device *ibdev) try {
    // A command FD of its own (an empty memfd: a unique inode), since
    // programs dup() or pass it on to share a context (ibv_import_device).
    int cmd_fd = memfd_create("sroce-context", MFD_CLOEXEC);
    if (cmd_fd < 0) return nullptr;
    return open_context(ibdev, cmd_fd);
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_context *>(nullptr);
}

struct ibv_context *sroce_import_device(int cmd_fd) try {
    struct stat a;
    if (fstat(cmd_fd, &a) != 0) return nullptr;
    ibv_device *dev = nullptr;
    {
        std::lock_guard<std::mutex> g(g_ctx_mu);
        for (Context *c : contexts())
            if (c->file_dev == a.st_dev && c->file_ino == a.st_ino) dev = c->vctx.context.device;
    }
    if (!dev) {
        errno = EINVAL;
        return nullptr;
    }
    return open_context(dev, cmd_fd);
} catch (const std::bad_alloc &) {
    return out_of_memory<struct ibv_context *>(nullptr);
}

int sroce_is_cmd_fd(int fd) {
    struct stat a;
    if (fstat(fd, &a) != 0) return 0;
    std::lock_guard<std::mutex> g(g_ctx_mu);
    for (Context *c : contexts())
        if (c->file_dev == a.st_dev && c->file_ino == a.st_ino) return 1;
    return 0;
}

int sroce_close_device(struct ibv_context *ibctx) {
    Context *ctx = to_ctx(ibctx);
    {
        std::lock_guard<std::mutex> g(g_ctx_mu);
        std::erase(contexts(), ctx);
    }
    ctx->nic->release();
    close(ibctx->cmd_fd);
    close(ctx->async_rd);
    close(ctx->async_wr);
    pthread_mutex_destroy(&ibctx->mutex);
    delete ctx;
    return 0;
}

int sroce_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
    Device *d = to_ctx(ctx)->dev;
    *a = ibv_device_attr{};
    snprintf(a->fw_ver, sizeof a->fw_ver, "0.0.0");
    a->node_guid = d->guid;
    a->sys_image_guid = d->guid;
    a->max_mr_size = ~0ull;
    a->page_size_cap = 0xFFFFF000u;
    a->vendor_id = kVendorId;
    a->vendor_part_id = 0; // unknown to perftest: plain-verbs code paths
    a->hw_ver = 0;
    a->max_qp = int(kMaxQps);
    a->max_qp_wr = int(kMaxWr);
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID |
                          IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SRQ_RESIZE |
                          IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC |
                          IBV_DEVICE_UD_AV_PORT_ENFORCE;
    a->max_mw = int(MrTable::kSlots);
    a->max_mcast_grp = kMaxMcGroups;
    a->max_mcast_qp_attach = kMaxMcAttach;
    a->max_total_mcast_qp_attach = kMaxMcGroups * kMaxMcAttach;
    a->max_srq = int(kMaxSrqs);
    a->max_srq_wr = int(kMaxWr);
    a->max_srq_sge = int(kMaxSge);
    a->max_sge = int(kMaxSge);
    a->max_sge_rd = int(kMaxSge);
    a->max_cq = 1 << 16;
    a->max_cqe = int(kMaxCqe);
    a->max_mr = int(MrTable::kSlots);
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = int(kMaxRdAtomic);
    a->max_qp_init_rd_atom = int(kMaxRdAtomic);
    a->max_res_rd_atom = int(kMaxRdAtomic * kMaxQps);
    a->atomic_cap = IBV_ATOMIC_HCA;
    a->max_ah = 1 << 15;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 15;
    a->phys_port_cnt = 1;
    return 0;
}

int sroce_query_commit_caps(struct ibv_context *ctx, struct ibv_commit_caps *caps) {
    if (caps->comp_mask) return EINVAL;
    caps->flags = IBV_COMMIT_CAP_NATIVE | IBV_COMMIT_CAP_ORDERED | IBV_COMMIT_CAP_IMMED |
                  IBV_COMMIT_CAP_FLUSH | IBV_COMMIT_CAP_ANY_PEER;
    if (to_ctx(ctx)->nic->selective_repeat()) caps->flags |= IBV_COMMIT_CAP_SELECTIVE_REPEAT;
    caps->atomicity_unit = 8;
    caps->persistence_methods = IBV_COMMIT_METHOD_CACHE_FLUSH | IBV_COMMIT_METHOD_MSYNC |
                                IBV_COMMIT_METHOD_FENCE | IBV_COMMIT_METHOD_NONTEMPORAL;
    return 0;
}

int sroce_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a) {
    if (port != 1) return EINVAL;
    port_attr(*to_ctx(ctx)->dev, a);
    return 0;
}

// An empty entry of the table reads as the zero GID, as in libibverbs.
int sroce_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
    if (port != 1 || index < 0 || index >= kGidTblLen) {
        errno = EINVAL;
        return -1;
    }
    if (!to_ctx(ctx)->dev->gids.get(uint32_t(index), gid)) *gid = ibv_gid{};
    return 0;
}

int sroce_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index,
                         enum ibv_gid_type *type) {
    if (port != 1 || index >= unsigned(kGidTblLen)) {
        errno = EINVAL;
        return -1;
    }
    // An empty entry reads as IB / RoCE v1, as libibverbs reports one.
    ibv_gid g;
    *type = to_ctx(ctx)->dev->gids.get(index, &g) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
    return 0;
}

int sroce_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                       struct ibv_gid_entry *entry, uint32_t flags) {
    if (flags || port != 1 || index >= uint32_t(kGidTblLen)) return EINVAL;
    Device *d = to_ctx(ctx)->dev;
    ibv_gid g;
    if (!d->gids.get(index, &g)) return ENODATA;
    *entry = ibv_gid_entry{};
    entry->gid = g;
    entry->gid_index = index;
    entry->port_num = 1;
    entry->gid_type = IBV_GID_TYPE_ROCE_V2;
    entry->ndev_ifindex = uint32_t(d->ifindex);
    return 0;
}

ssize_t sroce_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                              size_t max_entries, uint32_t flags) {
    if (flags) return -EINVAL;
    // The entries that are not empty, in index order, as the kernel lists
    // them (ibv_query_gid_table(3)).
    uint32_t size = to_ctx(ctx)->dev->gids.size();
    size_t n = 0;
    for (uint32_t i = 0; i < size; i++) {
        ibv_gid_entry e;
        if (sroce_query_gid_ex(ctx, 1, i, &e, 0)) continue;
        if (n == max_entries) return -EINVAL;
        entries[n++] = e;
    }
    return ssize_t(n);
}

int sroce_query_pkey(struct ibv_context *, uint8_t port, int index, __be16 *pkey) {
    if (port != 1 || index != 0) {
        errno = EINVAL;
        return -1;
    }
    *pkey = htons(wire::kDefaultPkey);
    return 0;
}

int sroce_get_pkey_index(struct ibv_context *, uint8_t port, __be16 pkey) {
    if (port != 1 || (ntohs(pkey) & 0x7FFF) != 0x7FFF) return -EINVAL;
    return 0;
}

int sroce_get_async_event(struct ibv_context *ibctx, struct ibv_async_event *event) {
    Context *ctx = to_ctx(ibctx);
    for (;;) {
        // Blocks, or fails with EAGAIN, as the application set async_fd.
        uint8_t b;
        if (read(ctx->async_rd, &b, 1) != 1) return -1;
        std::lock_guard<std::mutex> g(ctx->async_mu);
        if (ctx->async_q.empty()) continue; // withdrawn by a destroy
        *event = ctx->async_q.front();
        ctx->async_q.pop_front();
        return 0;
    }
}

void sroce_ack_async_event(struct ibv_async_event *) {}

} // extern "C"
