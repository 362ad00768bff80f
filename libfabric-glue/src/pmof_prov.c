/* SPDX-License-Identifier: MIT */
/*
 * Entry point of libpmof-fi.so.  libfabric dlopens every *fi.so in its
 * provider directory in every process that uses it, so fi_prov_ini only
 * defines parameters: devices are looked at when fi_getinfo asks.
 */
#include "pmof.h"

#include <dlfcn.h>
#include <errno.h>
#include <sys/epoll.h>
#include <time.h>

struct pmof_params pmof_params = {
    .inline_size = PMOF_DEF_INLINE,
    .eager_size = PMOF_DEF_EAGER_SIZE,
    .tx_size = PMOF_DEF_TX_SIZE,
    .rx_size = PMOF_DEF_RX_SIZE,
    .allow_layering = 0,
    .cm_timeout_ms = 5000,
};

static void pin_library(void) {
    Dl_info di;

    if (!dladdr((void *)pmof_pin_library, &di) || !di.dli_fname ||
        !dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE))
        PMOF_WARN(FI_LOG_CORE, "cannot keep the provider loaded: %s\n", dlerror());
}

/* libfabric unloads its providers at exit (fi_fini), maybe while an
 * application that never closed its domain still has the provider's
 * threads running: the first thread keeps the library mapped to the end. */
void pmof_pin_library(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pin_library);
}

static void pmof_cleanup(void) {
    pmof_info_cleanup();
}

/* Written by libfabric (its context member), so not const. */
struct fi_provider pmof_prov = {
    .name = PMOF_NAME,
    .version = PMOF_PROV_VERSION,
    .fi_version = FI_VERSION(1, 17),
    .getinfo = pmof_getinfo,
    .fabric = pmof_fabric_open,
    .cleanup = pmof_cleanup,
};

static void get_int_param(const char *name, int *value, int min) {
    int v;

    if (fi_param_get_int(&pmof_prov, name, &v) == 0) {
        if (v >= min)
            *value = v;
        else
            PMOF_WARN(FI_LOG_CORE, "FI_PMOF_%s=%d is below %d, ignored\n", name, v, min);
    }
}

FI_EXT_INI {
    /* The core skips a provider whose API level is below what the
     * application asks for: claim the running library's, whose structures
     * only grow at their ends. */
    pmof_prov.fi_version = fi_version();

    fi_param_define(&pmof_prov, "inline_size", FI_PARAM_INT,
                    "Largest message or write sent inline, the inject size (default %d)",
                    PMOF_DEF_INLINE);
    fi_param_define(&pmof_prov, "eager_size", FI_PARAM_INT,
                    "Largest message an FI_TAGGED endpoint sends behind its header; larger "
                    "ones are read by the receiver (default %d)",
                    PMOF_DEF_EAGER_SIZE);
    fi_param_define(&pmof_prov, "tx_size", FI_PARAM_INT,
                    "Default transmit queue depth (default %d)", PMOF_DEF_TX_SIZE);
    fi_param_define(&pmof_prov, "rx_size", FI_PARAM_INT, "Default receive queue depth (default %d)",
                    PMOF_DEF_RX_SIZE);
    fi_param_define(&pmof_prov, "allow_layering", FI_PARAM_BOOL,
                    "Let utility providers (ofi_rxm) layer over pmof; they drop "
                    "FI_COMMIT semantics (default no)");
    fi_param_define(&pmof_prov, "commit_manual", FI_PARAM_BOOL,
                    "To applications that take mode FI_COMMIT_MANUAL, offer only that "
                    "mode, even where the transport can make writes durable (default no)");
    fi_param_define(&pmof_prov, "commit_path", FI_PARAM_STRING,
                    "How commits travel on a device with native write-commit (sroce): "
                    "'native' (default; write-commits, or sroce's IBTA sequences for peers "
                    "that do not agree) or 'flush' (IBTA WRITE + FLUSH sequences posted by "
                    "the provider, as on an RNIC with FLUSH)");
    fi_param_define(&pmof_prov, "cm_timeout", FI_PARAM_INT,
                    "Address and route resolution timeout in ms (default 5000)");

    get_int_param("inline_size", &pmof_params.inline_size, 0);
    get_int_param("eager_size", &pmof_params.eager_size, 0);
    get_int_param("tx_size", &pmof_params.tx_size, 16);
    get_int_param("rx_size", &pmof_params.rx_size, 16);
    get_int_param("cm_timeout", &pmof_params.cm_timeout_ms, 1);
    int b;
    if (fi_param_get_bool(&pmof_prov, "allow_layering", &b) == 0) pmof_params.allow_layering = b;
    if (fi_param_get_bool(&pmof_prov, "commit_manual", &b) == 0) pmof_params.commit_manual = b;
    char *path = NULL;
    if (fi_param_get_str(&pmof_prov, "commit_path", &path) == 0 && path) {
        if (!strcmp(path, "flush"))
            pmof_params.commit_flush = 1;
        else if (strcmp(path, "native"))
            PMOF_WARN(FI_LOG_CORE, "FI_PMOF_COMMIT_PATH=%s: expected native or flush\n", path);
    }
    return &pmof_prov;
}

int pmof_errno(int err) {
    if (err < 0) err = -err;
    switch (err) {
    case 0:
        return 0;
    case EAGAIN:
        return -FI_EAGAIN;
    case ENOMEM:
        return -FI_ENOMEM;
    case EINVAL:
        return -FI_EINVAL;
    case EOPNOTSUPP:
        return -FI_EOPNOTSUPP;
    case ENOSYS:
        return -FI_ENOSYS;
    case ENODEV:
        return -FI_ENODEV;
    case ENOENT:
        return -FI_ENOENT;
    case EBUSY:
        return -FI_EBUSY;
    case ETIMEDOUT:
        return -FI_ETIMEDOUT;
    case ECONNREFUSED:
        return -FI_ECONNREFUSED;
    case EADDRINUSE:
        return -FI_EADDRINUSE;
    case EADDRNOTAVAIL:
        return -FI_EADDRNOTAVAIL;
    case ENETUNREACH:
    case EHOSTUNREACH:
        return -FI_EHOSTUNREACH;
    case EACCES:
    case EPERM:
        return -FI_EACCES;
    case ENOSPC:
        return -FI_ENOSPC;
    case EISCONN:
        return -FI_EISCONN;
    case ENOTCONN:
        return -FI_ENOTCONN;
    default:
        /* libfabric's FI_E* below 256 are the errno values */
        return err < 256 ? -err : -FI_EOTHER;
    }
}

int pmof_epoll_add(int epfd, int fd) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? pmof_errno(errno) : 0;
}

uint64_t pmof_now_ms(void) {
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
