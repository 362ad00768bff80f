/* SPDX-License-Identifier: MIT */
/* The fabric: the root of a process's pmof objects. */
#include "pmof.h"

#include <stdlib.h>
#include <string.h>

static int fabric_close(struct fid *fid) {
    struct pmof_fabric *fab = container_of(fid, struct pmof_fabric, fabric_fid.fid);

    if (atomic_load(&fab->refs)) return -FI_EBUSY;
    free(fab);
    return 0;
}

static int fabric_trywait(struct fid_fabric *fabric, struct fid **fids, int count) {
    (void)fabric;
    for (int i = 0; i < count; i++) {
        int ret;
        switch (fids[i]->fclass) {
        case FI_CLASS_CQ:
            ret = pmof_cq_trywait(container_of(fids[i], struct pmof_cq, cq_fid.fid));
            break;
        case FI_CLASS_EQ:
            ret = pmof_eq_trywait(container_of(fids[i], struct pmof_eq, eq_fid.fid));
            break;
        case FI_CLASS_CNTR:
            ret = pmof_cntr_trywait(container_of(fids[i], struct pmof_cntr, cntr_fid.fid));
            break;
        default:
            return -FI_EINVAL;
        }
        if (ret) return ret;
    }
    return 0;
}

static int fabric_wait_open(struct fid_fabric *fabric, struct fi_wait_attr *attr,
                            struct fid_wait **waitset) {
    (void)fabric, (void)attr, (void)waitset;
    return -FI_ENOSYS;
}

static struct fi_ops fabric_fi_ops = {
    .size = sizeof(struct fi_ops),
    .close = fabric_close,
    .bind = pmof_fid_bind_enosys,
    .control = pmof_fid_control_enosys,
    .ops_open = pmof_fid_ops_open_enosys,
    .ops_set = pmof_fid_ops_set_enosys,
};

static struct fi_ops_fabric fabric_ops = {
    .size = sizeof(struct fi_ops_fabric),
    .domain = pmof_domain_open,
    .passive_ep = pmof_passive_ep,
    .eq_open = pmof_eq_open,
    .wait_open = fabric_wait_open,
    .trywait = fabric_trywait,
};

int pmof_fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
    struct pmof_fabric *fab;

    if (!attr || !pmof_fabric_name_ok(attr->name)) return -FI_ENODATA;
    fab = calloc(1, sizeof(*fab));
    if (!fab) return -FI_ENOMEM;
    fab->err_data_size = attr->api_version >= FI_VERSION(1, 5);
    fab->fabric_fid.fid.fclass = FI_CLASS_FABRIC;
    fab->fabric_fid.fid.context = context;
    fab->fabric_fid.fid.ops = &fabric_fi_ops;
    fab->fabric_fid.ops = &fabric_ops;
    *fabric = &fab->fabric_fid;
    return 0;
}
