// SPDX-License-Identifier: MIT
//
// Device discovery, device/context level calls, port and GID queries and
// asynchronous events.
#include "kernel_commit.hpp"
#include "shim.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

using namespace sroce::shim;

namespace {

// Lists handed out by ibv_get_device_list(), each mapped to the list the real
// libibverbs returned while building it (nullptr when it returned none), so
// ibv_free_device_list() can release both.
struct DeviceListRegistry {
    std::mutex mutex;
    std::unordered_map<ibv_device **, ibv_device **> real_of;
};

// Constructed on first use (a verb may run before this library's static
// constructors) and intentionally never destroyed.
DeviceListRegistry *device_lists() noexcept {
    static DeviceListRegistry *const registry = new (std::nothrow) DeviceListRegistry;
    return registry;
}

bool remember_list(ibv_device **list, ibv_device **real_list) noexcept {
    DeviceListRegistry *registry = device_lists();
    if (!registry) return false;
    try {
        std::lock_guard lock(registry->mutex);
        registry->real_of.emplace(list, real_list);
        return true;
    } catch (...) {
        return false;
    }
}

// Removes `list` from the registry; false when the shim did not create it.
bool forget_list(ibv_device **list, ibv_device **&real_list) noexcept {
    DeviceListRegistry *registry = device_lists();
    if (!registry) return false;
    std::lock_guard lock(registry->mutex);
    auto it = registry->real_of.find(list);
    if (it == registry->real_of.end()) return false;
    real_list = it->second;
    registry->real_of.erase(it);
    return true;
}

void free_real_list(ibv_device **real_list) noexcept {
    if (real_list) {
        if (auto real_free = SROCE_REAL(ibv_free_device_list, kV1_1)) real_free(real_list);
    }
}

// ibv_query_port() is exported with the layout libibverbs had before
// port_cap_flags2 was appended to struct ibv_port_attr; callers built against
// old headers pass a buffer of only that size.  verbs.h declares the old
// struct but does not define it.
constexpr std::size_t kCompatPortAttrSize = offsetof(ibv_port_attr, port_cap_flags2);

bool async_event_owned(const ibv_async_event *event) noexcept {
    switch (event->event_type) {
    case IBV_EVENT_CQ_ERR:
        return owns(event->element.cq);
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
        return owns(event->element.qp);
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
        return owns(event->element.srq);
    case IBV_EVENT_WQ_FATAL:
        return owns(event->element.wq);
    default:
        // Port and device events carry no object; acknowledging them is a
        // no-op in libibverbs, so they are forwarded.
        return false;
    }
}

} // namespace

// ---------------------------------------------------------------------------
// Devices

SROCE_SHIM_EXPORT ibv_device **ibv_get_device_list(int *num_devices) {
    const int saved_errno = errno;

    // Without kernel RDMA support the real call fails with ENOSYS: that is
    // an empty list of real devices, not an error.
    ibv_device **real_list = nullptr;
    int real_count = 0;
    int real_errno = ENOSYS;
    if (auto real = SROCE_REAL(ibv_get_device_list, kV1_1)) {
        real_list = real(&real_count);
        real_errno = errno;
    }
    if (!real_list || real_count < 0) real_count = 0;

    ibv_device **sroce_devs = nullptr;
    int sroce_count = sroce_device_list(&sroce_devs);
    if (sroce_count < 0 || !sroce_devs) sroce_count = 0;

    if (!real_list && sroce_count == 0 && real_errno != ENOSYS) {
        // A genuine failure of the real libibverbs and nothing to add.
        if (num_devices) *num_devices = 0;
        errno = real_errno;
        return nullptr;
    }

    const std::size_t total = static_cast<std::size_t>(real_count) + sroce_count;
    auto **list = static_cast<ibv_device **>(std::calloc(total + 1, sizeof(ibv_device *)));
    if (!list || !remember_list(list, real_list)) {
        std::free(list);
        free_real_list(real_list);
        if (num_devices) *num_devices = 0;
        errno = ENOMEM;
        return nullptr;
    }
    std::size_t n = 0;
    for (int i = 0; i < real_count; ++i)
        list[n++] = real_list[i];
    for (int i = 0; i < sroce_count; ++i)
        list[n++] = sroce_devs[i];
    list[n] = nullptr;

    if (num_devices) *num_devices = static_cast<int>(total);
    errno = saved_errno;
    return list;
}

SROCE_SHIM_EXPORT void ibv_free_device_list(ibv_device **list) {
    ibv_device **real_list = nullptr;
    if (list && forget_list(list, real_list)) {
        std::free(list);
        free_real_list(real_list);
        return;
    }
    // Not a list of the shim (e.g. obtained from the real libibverbs
    // directly): the real libibverbs owns it.
    SROCE_FORWARD_VOID(ibv_free_device_list, kV1_1, list);
}

SROCE_SHIM_EXPORT const char *ibv_get_device_name(ibv_device *device) {
    if (owns_device(device)) return device->name;
    SROCE_FORWARD(ibv_get_device_name, kV1_1, nullptr, device);
}

SROCE_SHIM_EXPORT __be64 ibv_get_device_guid(ibv_device *device) {
    if (owns_device(device)) return sroce_get_device_guid(device);
    SROCE_FORWARD(ibv_get_device_guid, kV1_1, 0, device);
}

SROCE_SHIM_EXPORT int ibv_get_device_index(ibv_device *device) {
    if (owns_device(device)) return sroce_get_device_index(device);
    SROCE_FORWARD(ibv_get_device_index, kV1_9, -1, device);
}

SROCE_SHIM_EXPORT ibv_context *ibv_open_device(ibv_device *device) {
    if (owns_device(device)) return sroce_open_device(device);
    auto real = SROCE_REAL(ibv_open_device, kV1_1);
    if (!real) return fail_errno(ENOSYS, static_cast<ibv_context *>(nullptr));
    ibv_context *context = real(device);
    kernel::context_opened(context);
    return context;
}

SROCE_SHIM_EXPORT int ibv_close_device(ibv_context *context) {
    if (owns_ctx(context)) return sroce_close_device(context);
    kernel::context_closing(context);
    SROCE_FORWARD(ibv_close_device, kV1_1, -1, context);
}

// Imports a context from a command FD: a sroce context's shares the
// objects of the context it came from.
SROCE_SHIM_EXPORT ibv_context *ibv_import_device(int cmd_fd) {
    if (sroce_is_cmd_fd(cmd_fd)) return sroce_import_device(cmd_fd);
    SROCE_FORWARD(ibv_import_device, kV1_10, nullptr, cmd_fd);
}

SROCE_SHIM_EXPORT const char *ibv_get_sysfs_path(void) {
    SROCE_FORWARD(ibv_get_sysfs_path, kV1_0, nullptr);
}

SROCE_SHIM_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
                                          size_t size) {
    const int ret = sroce_read_sysfs_file(dir, file, buf, size);
    if (ret != -2) return ret;
    SROCE_FORWARD(ibv_read_sysfs_file, kV1_0, -1, dir, file, buf, size);
}

// ---------------------------------------------------------------------------
// Device, port, GID and P_Key queries

SROCE_SHIM_EXPORT int ibv_query_device(ibv_context *context, ibv_device_attr *device_attr) {
    if (owns_ctx(context)) return sroce_query_device(context, device_attr);
    SROCE_FORWARD(ibv_query_device, kV1_1, ENOSYS, context, device_attr);
}

SROCE_SHIM_EXPORT int ibv_query_port(ibv_context *context, uint8_t port_num,
                                     _compat_ibv_port_attr *port_attr) {
    if (owns_ctx(context)) {
        ibv_port_attr attr{};
        const int ret = sroce_query_port(context, port_num, &attr);
        if (ret == 0) std::memcpy(static_cast<void *>(port_attr), &attr, kCompatPortAttrSize);
        return ret;
    }
    SROCE_FORWARD(ibv_query_port, kV1_1, ENOSYS, context, port_num, port_attr);
}

SROCE_SHIM_EXPORT int ibv_query_gid(ibv_context *context, uint8_t port_num, int index,
                                    ibv_gid *gid) {
    if (owns_ctx(context)) return sroce_query_gid(context, port_num, index, gid);
    SROCE_FORWARD(ibv_query_gid, kV1_1, -1, context, port_num, index, gid);
}

SROCE_SHIM_EXPORT int _ibv_query_gid_ex(ibv_context *context, uint32_t port_num, uint32_t gid_index,
                                        ibv_gid_entry *entry, uint32_t flags, size_t entry_size) {
    if (owns_ctx(context)) {
        // Every field of struct ibv_gid_entry exists since the verb was
        // introduced, so a caller's entry can only be larger (newer).
        if (!entry || entry_size < sizeof(ibv_gid_entry)) return fail_ret(EINVAL);
        ibv_gid_entry tmp{};
        const int ret = sroce_query_gid_ex(context, port_num, gid_index, &tmp, flags);
        if (ret) return ret;
        auto *dst = reinterpret_cast<unsigned char *>(entry);
        std::memcpy(dst, &tmp, sizeof(tmp));
        std::memset(dst + sizeof(tmp), 0, entry_size - sizeof(tmp));
        return 0;
    }
    SROCE_FORWARD(_ibv_query_gid_ex, kV1_11, ENOSYS, context, port_num, gid_index, entry, flags,
                  entry_size);
}

SROCE_SHIM_EXPORT ssize_t _ibv_query_gid_table(ibv_context *context, ibv_gid_entry *entries,
                                               size_t max_entries, uint32_t flags,
                                               size_t entry_size) {
    if (owns_ctx(context)) {
        if (entry_size < sizeof(ibv_gid_entry) || (!entries && max_entries))
            return -fail_ret(EINVAL);
        if (entry_size == sizeof(ibv_gid_entry) || max_entries == 0)
            return sroce_query_gid_table(context, entries, max_entries, flags);

        // The caller's entries are larger than ours: fill a packed array,
        // then spread it out with the caller's stride.
        auto *tmp = static_cast<ibv_gid_entry *>(std::calloc(max_entries, sizeof(ibv_gid_entry)));
        if (!tmp) return -fail_ret(ENOMEM);
        ssize_t n = sroce_query_gid_table(context, tmp, max_entries, flags);
        if (n > 0) {
            if (static_cast<size_t>(n) > max_entries) n = static_cast<ssize_t>(max_entries);
            auto *dst = reinterpret_cast<unsigned char *>(entries);
            for (ssize_t i = 0; i < n; ++i, dst += entry_size) {
                std::memcpy(dst, &tmp[i], sizeof(ibv_gid_entry));
                std::memset(dst + sizeof(ibv_gid_entry), 0, entry_size - sizeof(ibv_gid_entry));
            }
        }
        std::free(tmp);
        return n;
    }
    SROCE_FORWARD(_ibv_query_gid_table, kV1_11, static_cast<ssize_t>(-ENOSYS), context, entries,
                  max_entries, flags, entry_size);
}

SROCE_SHIM_EXPORT int ibv_query_gid_type(ibv_context *context, uint8_t port_num, unsigned int index,
                                         ibv_gid_type_sysfs *type) {
    if (owns_ctx(context)) {
        // sroce reports enum ibv_gid_type (IB / RoCE v1 / RoCE v2); this
        // private verb reports the sysfs flavour, which merges IB and v1.
        ibv_gid_type gid_type = IBV_GID_TYPE_IB;
        const int ret = sroce_query_gid_type(context, port_num, index, &gid_type);
        if (ret) return ret;
        *type = gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2
                                                 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
        return 0;
    }
    SROCE_FORWARD(ibv_query_gid_type, kPrivate, -1, context, port_num, index, type);
}

SROCE_SHIM_EXPORT int ibv_query_pkey(ibv_context *context, uint8_t port_num, int index,
                                     __be16 *pkey) {
    if (owns_ctx(context)) return sroce_query_pkey(context, port_num, index, pkey);
    SROCE_FORWARD(ibv_query_pkey, kV1_1, -1, context, port_num, index, pkey);
}

SROCE_SHIM_EXPORT int ibv_get_pkey_index(ibv_context *context, uint8_t port_num, __be16 pkey) {
    if (owns_ctx(context)) return sroce_get_pkey_index(context, port_num, pkey);
    SROCE_FORWARD(ibv_get_pkey_index, kV1_5, -1, context, port_num, pkey);
}

// ---------------------------------------------------------------------------
// Asynchronous events

SROCE_SHIM_EXPORT int ibv_get_async_event(ibv_context *context, ibv_async_event *event) {
    if (owns_ctx(context)) return sroce_get_async_event(context, event);
    SROCE_FORWARD(ibv_get_async_event, kV1_1, -1, context, event);
}

SROCE_SHIM_EXPORT void ibv_ack_async_event(ibv_async_event *event) {
    if (event && async_event_owned(event)) {
        sroce_ack_async_event(event);
        return;
    }
    SROCE_FORWARD_VOID(ibv_ack_async_event, kV1_1, event);
}
