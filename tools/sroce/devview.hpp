// SPDX-License-Identifier: MIT
//
// What `sroce exec` shows of the sroce devices in /sys/class/infiniband,
// /sys/class/infiniband_verbs and /dev/infiniband.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace sroce::tool {

struct DeviceView {
    std::string name;   // ibv_get_device_name()
    std::string uverbs; // ibv_device.dev_name, e.g. "uverbs100"
    // Paths relative to /sys/class/infiniband/<name>, with the text the
    // shim's ibv_read_sysfs_file() returns for them.
    std::vector<std::pair<std::string, std::string>> files;
    std::vector<std::string> netdevs; // interfaces the GIDs belong to
};

// The sroce devices as the shim at `shim` lists them for this process's
// environment (SROCE_CONFIG), without opening any: opening one would claim
// its address.  Throws std::runtime_error when the shim cannot be loaded.
std::vector<DeviceView> collect_devices(const std::string &shim);

} // namespace sroce::tool
