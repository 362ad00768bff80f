// SPDX-License-Identifier: MIT
//
// Shows the sroce devices where programs look for RDMA devices outside
// libibverbs (/sys/class/infiniband, /sys/class/infiniband_verbs,
// /dev/infiniband), in a mount namespace of this process only.
#pragma once

#include "devview.hpp"

#include <string>
#include <vector>

namespace sroce::tool {

// Moves this process into a private mount namespace (root), or into a user
// and mount namespace of its own (anyone else, where the kernel allows it),
// and mounts there the generated entries next to the host's own.  The host's
// /sys and /dev are never written.  Returns an empty string on success, else
// why the devices could not be shown; the process then sees what it saw
// before (possibly in a namespace of its own).  Must run single-threaded.
std::string show_devices(const std::vector<DeviceView> &devices);

} // namespace sroce::tool
