/* SPDX-License-Identifier: MIT */
/*
 * Operations an object does not have.  libfabric's inline wrappers call
 * through these tables without checking, so every member must be set.
 */
#include "pmof.h"

int pmof_fid_ops_open_enosys(struct fid *fid, const char *name, uint64_t flags, void **ops,
                             void *context) {
    (void)fid, (void)name, (void)flags, (void)ops, (void)context;
    return -FI_ENOSYS;
}

int pmof_fid_bind_enosys(struct fid *fid, struct fid *bfid, uint64_t flags) {
    (void)fid, (void)bfid, (void)flags;
    return -FI_ENOSYS;
}

int pmof_fid_control_enosys(struct fid *fid, int command, void *arg) {
    (void)fid, (void)command, (void)arg;
    return -FI_ENOSYS;
}

int pmof_fid_ops_set_enosys(struct fid *fid, const char *name, uint64_t flags, void *ops,
                            void *context) {
    (void)fid, (void)name, (void)flags, (void)ops, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_ep_base_cancel(fid_t fid, void *context) {
    (void)fid, (void)context;
    return -FI_ENOSYS;
}

static int enosys_ep_base_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen) {
    (void)fid, (void)level, (void)optname, (void)optval, (void)optlen;
    return -FI_ENOSYS;
}

static int enosys_ep_base_setopt(fid_t fid, int level, int optname, const void *optval,
                                 size_t optlen) {
    (void)fid, (void)level, (void)optname, (void)optval, (void)optlen;
    return -FI_ENOSYS;
}

static int enosys_ep_base_tx_ctx(struct fid_ep *sep, int index, struct fi_tx_attr *attr,
                                 struct fid_ep **tx_ep, void *context) {
    (void)sep, (void)index, (void)attr, (void)tx_ep, (void)context;
    return -FI_ENOSYS;
}

static int enosys_ep_base_rx_ctx(struct fid_ep *sep, int index, struct fi_rx_attr *attr,
                                 struct fid_ep **rx_ep, void *context) {
    (void)sep, (void)index, (void)attr, (void)rx_ep, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_ep_base_rx_size_left(struct fid_ep *ep) {
    (void)ep;
    return -FI_ENOSYS;
}

static ssize_t enosys_ep_base_tx_size_left(struct fid_ep *ep) {
    (void)ep;
    return -FI_ENOSYS;
}

struct fi_ops_ep pmof_ep_base_ops_enosys = {
    .size = sizeof(struct fi_ops_ep),
    .cancel = enosys_ep_base_cancel,
    .getopt = enosys_ep_base_getopt,
    .setopt = enosys_ep_base_setopt,
    .tx_ctx = enosys_ep_base_tx_ctx,
    .rx_ctx = enosys_ep_base_rx_ctx,
    .rx_size_left = enosys_ep_base_rx_size_left,
    .tx_size_left = enosys_ep_base_tx_size_left,
};

static int enosys_cm_setname(fid_t fid, void *addr, size_t addrlen) {
    (void)fid, (void)addr, (void)addrlen;
    return -FI_ENOSYS;
}

static int enosys_cm_getname(fid_t fid, void *addr, size_t *addrlen) {
    (void)fid, (void)addr, (void)addrlen;
    return -FI_ENOSYS;
}

static int enosys_cm_getpeer(struct fid_ep *ep, void *addr, size_t *addrlen) {
    (void)ep, (void)addr, (void)addrlen;
    return -FI_ENOSYS;
}

static int enosys_cm_connect(struct fid_ep *ep, const void *addr, const void *param,
                             size_t paramlen) {
    (void)ep, (void)addr, (void)param, (void)paramlen;
    return -FI_ENOSYS;
}

static int enosys_cm_listen(struct fid_pep *pep) {
    (void)pep;
    return -FI_ENOSYS;
}

static int enosys_cm_accept(struct fid_ep *ep, const void *param, size_t paramlen) {
    (void)ep, (void)param, (void)paramlen;
    return -FI_ENOSYS;
}

static int enosys_cm_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t paramlen) {
    (void)pep, (void)handle, (void)param, (void)paramlen;
    return -FI_ENOSYS;
}

static int enosys_cm_shutdown(struct fid_ep *ep, uint64_t flags) {
    (void)ep, (void)flags;
    return -FI_ENOSYS;
}

static int enosys_cm_join(struct fid_ep *ep, const void *addr, uint64_t flags, struct fid_mc **mc,
                          void *context) {
    (void)ep, (void)addr, (void)flags, (void)mc, (void)context;
    return -FI_ENOSYS;
}

struct fi_ops_cm pmof_cm_ops_enosys = {
    .size = sizeof(struct fi_ops_cm),
    .setname = enosys_cm_setname,
    .getname = enosys_cm_getname,
    .getpeer = enosys_cm_getpeer,
    .connect = enosys_cm_connect,
    .listen = enosys_cm_listen,
    .accept = enosys_cm_accept,
    .reject = enosys_cm_reject,
    .shutdown = enosys_cm_shutdown,
    .join = enosys_cm_join,
};

static ssize_t enosys_msg_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                               fi_addr_t src_addr, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)src_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                size_t count, fi_addr_t src_addr, void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)src_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_recvmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                               fi_addr_t dest_addr, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)dest_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                size_t count, fi_addr_t dest_addr, void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)dest_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_inject(struct fid_ep *ep, const void *buf, size_t len,
                                 fi_addr_t dest_addr) {
    (void)ep, (void)buf, (void)len, (void)dest_addr;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                   uint64_t data, fi_addr_t dest_addr, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_msg_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data,
                                     fi_addr_t dest_addr) {
    (void)ep, (void)buf, (void)len, (void)data, (void)dest_addr;
    return -FI_ENOSYS;
}

struct fi_ops_msg pmof_msg_ops_enosys = {
    .size = sizeof(struct fi_ops_msg),
    .recv = enosys_msg_recv,
    .recvv = enosys_msg_recvv,
    .recvmsg = enosys_msg_recvmsg,
    .send = enosys_msg_send,
    .sendv = enosys_msg_sendv,
    .sendmsg = enosys_msg_sendmsg,
    .inject = enosys_msg_inject,
    .senddata = enosys_msg_senddata,
    .injectdata = enosys_msg_injectdata,
};

static ssize_t enosys_tagged_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                                  fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
                                  void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)src_addr, (void)tag, (void)ignore,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                   size_t count, fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
                                   void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)src_addr, (void)tag, (void)ignore,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_recvmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg,
                                     uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                  fi_addr_t dest_addr, uint64_t tag, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)dest_addr, (void)tag, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                   size_t count, fi_addr_t dest_addr, uint64_t tag, void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)dest_addr, (void)tag, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_sendmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg,
                                     uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_inject(struct fid_ep *ep, const void *buf, size_t len,
                                    fi_addr_t dest_addr, uint64_t tag) {
    (void)ep, (void)buf, (void)len, (void)dest_addr, (void)tag;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                      uint64_t data, fi_addr_t dest_addr, uint64_t tag,
                                      void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest_addr, (void)tag,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_tagged_injectdata(struct fid_ep *ep, const void *buf, size_t len,
                                        uint64_t data, fi_addr_t dest_addr, uint64_t tag) {
    (void)ep, (void)buf, (void)len, (void)data, (void)dest_addr, (void)tag;
    return -FI_ENOSYS;
}

struct fi_ops_tagged pmof_tagged_ops_enosys = {
    .size = sizeof(struct fi_ops_tagged),
    .recv = enosys_tagged_recv,
    .recvv = enosys_tagged_recvv,
    .recvmsg = enosys_tagged_recvmsg,
    .send = enosys_tagged_send,
    .sendv = enosys_tagged_sendv,
    .sendmsg = enosys_tagged_sendmsg,
    .inject = enosys_tagged_inject,
    .senddata = enosys_tagged_senddata,
    .injectdata = enosys_tagged_injectdata,
};

static ssize_t enosys_rma_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                               fi_addr_t src_addr, uint64_t addr, uint64_t key, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)src_addr, (void)addr, (void)key,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_readv(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                size_t count, fi_addr_t src_addr, uint64_t addr, uint64_t key,
                                void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)src_addr, (void)addr, (void)key,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                fi_addr_t dest_addr, uint64_t addr, uint64_t key, void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)dest_addr, (void)addr, (void)key,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_writev(struct fid_ep *ep, const struct iovec *iov, void **desc,
                                 size_t count, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                                 void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)dest_addr, (void)addr, (void)key,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
                                   uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_inject(struct fid_ep *ep, const void *buf, size_t len,
                                 fi_addr_t dest_addr, uint64_t addr, uint64_t key) {
    (void)ep, (void)buf, (void)len, (void)dest_addr, (void)addr, (void)key;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                                    uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                                    void *context) {
    (void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest_addr, (void)addr, (void)key,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_rma_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data,
                                     fi_addr_t dest_addr, uint64_t addr, uint64_t key) {
    (void)ep, (void)buf, (void)len, (void)data, (void)dest_addr, (void)addr, (void)key;
    return -FI_ENOSYS;
}

struct fi_ops_rma pmof_rma_ops_enosys = {
    .size = sizeof(struct fi_ops_rma),
    .read = enosys_rma_read,
    .readv = enosys_rma_readv,
    .readmsg = enosys_rma_readmsg,
    .write = enosys_rma_write,
    .writev = enosys_rma_writev,
    .writemsg = enosys_rma_writemsg,
    .inject = enosys_rma_inject,
    .writedata = enosys_rma_writedata,
    .injectdata = enosys_rma_injectdata,
};

static ssize_t enosys_atomic_write(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                                   fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                                   enum fi_datatype datatype, enum fi_op op, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)dest_addr, (void)addr, (void)key,
        (void)datatype, (void)op, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_writev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc,
                                    size_t count, fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                                    enum fi_datatype datatype, enum fi_op op, void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)dest_addr, (void)addr, (void)key,
        (void)datatype, (void)op, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_writemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg,
                                      uint64_t flags) {
    (void)ep, (void)msg, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_inject(struct fid_ep *ep, const void *buf, size_t count,
                                    fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                                    enum fi_datatype datatype, enum fi_op op) {
    (void)ep, (void)buf, (void)count, (void)dest_addr, (void)addr, (void)key, (void)datatype,
        (void)op;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_readwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                                       void *result, void *result_desc, fi_addr_t dest_addr,
                                       uint64_t addr, uint64_t key, enum fi_datatype datatype,
                                       enum fi_op op, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)dest_addr,
        (void)addr, (void)key, (void)datatype, (void)op, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_readwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc,
                                        size_t count, struct fi_ioc *resultv, void **result_desc,
                                        size_t result_count, fi_addr_t dest_addr, uint64_t addr,
                                        uint64_t key, enum fi_datatype datatype, enum fi_op op,
                                        void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)resultv, (void)result_desc,
        (void)result_count, (void)dest_addr, (void)addr, (void)key, (void)datatype, (void)op,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_readwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg,
                                          struct fi_ioc *resultv, void **result_desc,
                                          size_t result_count, uint64_t flags) {
    (void)ep, (void)msg, (void)resultv, (void)result_desc, (void)result_count, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_compwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc,
                                       const void *compare, void *compare_desc, void *result,
                                       void *result_desc, fi_addr_t dest_addr, uint64_t addr,
                                       uint64_t key, enum fi_datatype datatype, enum fi_op op,
                                       void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)compare, (void)compare_desc, (void)result,
        (void)result_desc, (void)dest_addr, (void)addr, (void)key, (void)datatype, (void)op,
        (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_compwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc,
                                        size_t count, const struct fi_ioc *comparev,
                                        void **compare_desc, size_t compare_count,
                                        struct fi_ioc *resultv, void **result_desc,
                                        size_t result_count, fi_addr_t dest_addr, uint64_t addr,
                                        uint64_t key, enum fi_datatype datatype, enum fi_op op,
                                        void *context) {
    (void)ep, (void)iov, (void)desc, (void)count, (void)comparev, (void)compare_desc,
        (void)compare_count, (void)resultv, (void)result_desc, (void)result_count, (void)dest_addr,
        (void)addr, (void)key, (void)datatype, (void)op, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_atomic_compwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *msg,
                                          const struct fi_ioc *comparev, void **compare_desc,
                                          size_t compare_count, struct fi_ioc *resultv,
                                          void **result_desc, size_t result_count, uint64_t flags) {
    (void)ep, (void)msg, (void)comparev, (void)compare_desc, (void)compare_count, (void)resultv,
        (void)result_desc, (void)result_count, (void)flags;
    return -FI_ENOSYS;
}

static int enosys_atomic_writevalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                                    size_t *count) {
    (void)ep, (void)datatype, (void)op, (void)count;
    return -FI_ENOSYS;
}

static int enosys_atomic_readwritevalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                                        size_t *count) {
    (void)ep, (void)datatype, (void)op, (void)count;
    return -FI_ENOSYS;
}

static int enosys_atomic_compwritevalid(struct fid_ep *ep, enum fi_datatype datatype, enum fi_op op,
                                        size_t *count) {
    (void)ep, (void)datatype, (void)op, (void)count;
    return -FI_ENOSYS;
}

struct fi_ops_atomic pmof_atomic_ops_enosys = {
    .size = sizeof(struct fi_ops_atomic),
    .write = enosys_atomic_write,
    .writev = enosys_atomic_writev,
    .writemsg = enosys_atomic_writemsg,
    .inject = enosys_atomic_inject,
    .readwrite = enosys_atomic_readwrite,
    .readwritev = enosys_atomic_readwritev,
    .readwritemsg = enosys_atomic_readwritemsg,
    .compwrite = enosys_atomic_compwrite,
    .compwritev = enosys_atomic_compwritev,
    .compwritemsg = enosys_atomic_compwritemsg,
    .writevalid = enosys_atomic_writevalid,
    .readwritevalid = enosys_atomic_readwritevalid,
    .compwritevalid = enosys_atomic_compwritevalid,
};

static ssize_t enosys_collective_barrier(struct fid_ep *ep, fi_addr_t coll_addr, void *context) {
    (void)ep, (void)coll_addr, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_broadcast(struct fid_ep *ep, void *buf, size_t count, void *desc,
                                           fi_addr_t coll_addr, fi_addr_t root_addr,
                                           enum fi_datatype datatype, uint64_t flags,
                                           void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)coll_addr, (void)root_addr, (void)datatype,
        (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_alltoall(struct fid_ep *ep, const void *buf, size_t count,
                                          void *desc, void *result, void *result_desc,
                                          fi_addr_t coll_addr, enum fi_datatype datatype,
                                          uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)datatype, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_allreduce(struct fid_ep *ep, const void *buf, size_t count,
                                           void *desc, void *result, void *result_desc,
                                           fi_addr_t coll_addr, enum fi_datatype datatype,
                                           enum fi_op op, uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)datatype, (void)op, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_allgather(struct fid_ep *ep, const void *buf, size_t count,
                                           void *desc, void *result, void *result_desc,
                                           fi_addr_t coll_addr, enum fi_datatype datatype,
                                           uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)datatype, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_reduce_scatter(struct fid_ep *ep, const void *buf, size_t count,
                                                void *desc, void *result, void *result_desc,
                                                fi_addr_t coll_addr, enum fi_datatype datatype,
                                                enum fi_op op, uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)datatype, (void)op, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_reduce(struct fid_ep *ep, const void *buf, size_t count,
                                        void *desc, void *result, void *result_desc,
                                        fi_addr_t coll_addr, fi_addr_t root_addr,
                                        enum fi_datatype datatype, enum fi_op op, uint64_t flags,
                                        void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)root_addr, (void)datatype, (void)op, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_scatter(struct fid_ep *ep, const void *buf, size_t count,
                                         void *desc, void *result, void *result_desc,
                                         fi_addr_t coll_addr, fi_addr_t root_addr,
                                         enum fi_datatype datatype, uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)root_addr, (void)datatype, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_gather(struct fid_ep *ep, const void *buf, size_t count,
                                        void *desc, void *result, void *result_desc,
                                        fi_addr_t coll_addr, fi_addr_t root_addr,
                                        enum fi_datatype datatype, uint64_t flags, void *context) {
    (void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr,
        (void)root_addr, (void)datatype, (void)flags, (void)context;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_msg(struct fid_ep *ep, const struct fi_msg_collective *msg,
                                     struct fi_ioc *resultv, void **result_desc,
                                     size_t result_count, uint64_t flags) {
    (void)ep, (void)msg, (void)resultv, (void)result_desc, (void)result_count, (void)flags;
    return -FI_ENOSYS;
}

static ssize_t enosys_collective_barrier2(struct fid_ep *ep, fi_addr_t coll_addr, uint64_t flags,
                                          void *context) {
    (void)ep, (void)coll_addr, (void)flags, (void)context;
    return -FI_ENOSYS;
}

struct fi_ops_collective pmof_collective_ops_enosys = {
    .size = sizeof(struct fi_ops_collective),
    .barrier = enosys_collective_barrier,
    .broadcast = enosys_collective_broadcast,
    .alltoall = enosys_collective_alltoall,
    .allreduce = enosys_collective_allreduce,
    .allgather = enosys_collective_allgather,
    .reduce_scatter = enosys_collective_reduce_scatter,
    .reduce = enosys_collective_reduce,
    .scatter = enosys_collective_scatter,
    .gather = enosys_collective_gather,
    .msg = enosys_collective_msg,
    .barrier2 = enosys_collective_barrier2,
};
