// SPDX-License-Identifier: MIT
//
// Asks the shim, through the public libibverbs API it serves, what the sroce
// devices look like, so that the tree `sroce exec` builds cannot disagree with
// what the engine reports to the program.
#include "devview.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <dlfcn.h>
#include <fcntl.h>
#include <set>
#include <stdexcept>
#include <unistd.h>

namespace sroce::tool {

namespace {

// Declared by <infiniband/driver.h>, which is not meant for applications;
// exported by libibverbs since IBVERBS_1.0 and served by the shim.
using ReadSysfsFile = int (*)(const char *dir, const char *file, char *buf, size_t size);

// The shim and libibverbs print their complaints (a malformed link file, a
// low RLIMIT_MEMLOCK) again in the program; once is enough.
class QuietStderr {
  public:
    QuietStderr() : saved_(::dup(STDERR_FILENO)) {
        int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null >= 0) {
            ::dup2(null, STDERR_FILENO);
            ::close(null);
        }
    }
    ~QuietStderr() {
        if (saved_ < 0) return;
        ::dup2(saved_, STDERR_FILENO);
        ::close(saved_);
    }
    QuietStderr(const QuietStderr &) = delete;
    QuietStderr &operator=(const QuietStderr &) = delete;

  private:
    int saved_;
};

template <class Fn>
Fn symbol(void *handle, const char *name, const char *version) {
    void *sym = ::dlvsym(handle, name, version);
    if (!sym) throw std::runtime_error(std::string("no ") + name + " in the shim");
    return reinterpret_cast<Fn>(sym);
}

std::set<std::string> device_names(decltype(&ibv_get_device_list) get_list,
                                   decltype(&ibv_free_device_list) free_list) {
    std::set<std::string> names;
    int n = 0;
    ibv_device **list = get_list(&n);
    if (!list) return names;
    for (int i = 0; i < n; ++i)
        names.insert(list[i]->name);
    free_list(list);
    return names;
}

// Files of a port directory besides its state and its indexed tables.
constexpr const char *port_files[] = {"phys_state",     "rate",     "lid",   "sm_lid",
                                      "lid_mask_count", "cap_mask", "sm_sl", "link_layer"};
constexpr const char *device_files[] = {"node_type", "node_guid", "sys_image_guid", "node_desc",
                                        "fw_ver",    "hw_rev",    "hca_type",       "board_id"};
// Bounds of the tables as the kernel has them; the shim ends them earlier.
constexpr int max_ports = 255;
constexpr int max_gids = 1024;
constexpr int max_pkeys = 64;

} // namespace

std::vector<DeviceView> collect_devices(const std::string &shim) {
    QuietStderr quiet;
    void *handle = ::dlopen(shim.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw std::runtime_error(::dlerror());
    auto get_list =
        symbol<decltype(&ibv_get_device_list)>(handle, "ibv_get_device_list", "IBVERBS_1.1");
    auto free_list =
        symbol<decltype(&ibv_free_device_list)>(handle, "ibv_free_device_list", "IBVERBS_1.1");
    auto read_file = symbol<ReadSysfsFile>(handle, "ibv_read_sysfs_file", "IBVERBS_1.0");

    // The shim lists the kernel's devices too; those have their own sysfs.
    std::set<std::string> kernel_devices;
    if (void *real = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL)) {
        auto real_get = reinterpret_cast<decltype(&ibv_get_device_list)>(
            ::dlvsym(real, "ibv_get_device_list", "IBVERBS_1.1"));
        auto real_free = reinterpret_cast<decltype(&ibv_free_device_list)>(
            ::dlvsym(real, "ibv_free_device_list", "IBVERBS_1.1"));
        if (real_get && real_free) kernel_devices = device_names(real_get, real_free);
    }

    std::vector<DeviceView> views;
    int n = 0;
    ibv_device **list = get_list(&n);
    if (!list) return views;
    for (int i = 0; i < n; ++i) {
        const ibv_device *dev = list[i];
        if (kernel_devices.contains(dev->name)) continue;
        DeviceView view{dev->name, dev->dev_name, {}, {}};
        auto read = [&](const std::string &file) {
            char buf[256];
            int len = read_file(dev->ibdev_path, file.c_str(), buf, sizeof buf);
            if (len < 0) return false;
            std::string value(buf, std::size_t(len));
            while (!value.empty() && value.back() == '\n')
                value.pop_back();
            view.files.emplace_back(file, value);
            return true;
        };
        for (const char *f : device_files)
            read(f);
        // The reads are the loop conditions: a table ends at the first index
        // the shim does not serve.
        for (int port = 1; port <= max_ports; ++port) {
            const std::string dir = "ports/" + std::to_string(port) + "/";
            if (!read(dir + "state")) break;
            for (const char *f : port_files)
                read(dir + f);
            for (int g = 0; g < max_gids && read(dir + "gids/" + std::to_string(g)); ++g) {
                read(dir + "gid_attrs/types/" + std::to_string(g));
                if (read(dir + "gid_attrs/ndevs/" + std::to_string(g))) {
                    const std::string &netdev = view.files.back().second;
                    if (std::find(view.netdevs.begin(), view.netdevs.end(), netdev) ==
                        view.netdevs.end())
                        view.netdevs.push_back(netdev);
                }
            }
            for (int p = 0; p < max_pkeys && read(dir + "pkeys/" + std::to_string(p)); ++p) {
            }
        }
        views.push_back(std::move(view));
    }
    free_list(list);
    return views;
}

} // namespace sroce::tool
