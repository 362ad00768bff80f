// SPDX-License-Identifier: MIT
/* ib_write_commit_lat: see ib_write_commit_lat(1). */
#include "perf_common.h"

int main(int argc, char **argv) {
    return perf_main(TOOL_WRITE_COMMIT, false, argc, argv);
}
