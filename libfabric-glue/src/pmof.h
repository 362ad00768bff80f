/* SPDX-License-Identifier: MIT */
/*
 * The libfabric provider "pmof": libfabric's objects over verbs and
 * rdma_cm, with the persistence extensions of <rdma/fi_ext_pmof.h>.
 *
 * Built against libfabric's installed provider headers only, so every fid
 * and its operations are implemented here.  One file per object:
 * pmof_prov.c (entry point, parameters), pmof_info.c (fi_getinfo),
 * pmof_fabric.c, pmof_domain.c (domain, MR), pmof_eq.c, pmof_cq.c,
 * pmof_cntr.c, pmof_cm.c (passive endpoint, connection set-up), pmof_ep.c
 * (endpoint object), pmof_msg.c and pmof_rma.c (data path), pmof_commit.c
 * (fi_commit), pmof_manual.c (FI_COMMIT_MANUAL), pmof_tagged.c (FI_TAGGED
 * on RDM endpoints: headed messages, software matching), pmof_wire.c (what the
 * provider sends besides verbs traffic, and its parsers), pmof_enosys.c
 * (operations an object lacks).
 */
#ifndef PMOF_H
#define PMOF_H

#include <infiniband/verbs.h>
#include <infiniband/verbs_ext.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext_pmof.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_log.h>
#include <rdma/providers/fi_prov.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pmof_wire.h"

#define PMOF_NAME "pmof"
#define PMOF_PROV_VERSION FI_VERSION(0, 1)

/* libibverbs defines container_of too (the same way). */
#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

extern struct fi_provider pmof_prov;

#define PMOF_WARN(subsys, ...) FI_WARN(&pmof_prov, subsys, __VA_ARGS__)
#define PMOF_INFO(subsys, ...) FI_INFO(&pmof_prov, subsys, __VA_ARGS__)

/* ---------------------------------------------------------------- limits */

/* Private data of a REQ is 56 bytes; the provider's header takes 2 (5 for
 * a manual-commit endpoint: pmof_cm_user_max). */
#define PMOF_CM_DATA_MAX (PMOF_CM_PRIVATE_MAX - PMOF_CM_HDR_LEN)
#define PMOF_MAX_MSG_SIZE (1u << 30)
#define PMOF_IOV_LIMIT 4
#define PMOF_DEF_TX_SIZE 384
#define PMOF_DEF_RX_SIZE 384
#define PMOF_DEF_CQ_SIZE 1024
#define PMOF_DEF_INLINE 256
/* FI_TAGGED endpoints: messages up to this size travel behind their
 * header, larger ones by rendezvous (FI_PMOF_EAGER_SIZE). */
#define PMOF_DEF_EAGER_SIZE 8192
/* Inline data is gathered into one buffer of at most this size. */
#define PMOF_INLINE_MAX 1024
/* Keys carry the target region's durability class above the rkey, so the
 * initiator asks for the right placement without being told. */
#define PMOF_KEY_PMEM (1ULL << 32)
#define PMOF_KEY_UNCACHED (1ULL << 33)
#define PMOF_KEY_CLASS_MASK (PMOF_KEY_PMEM | PMOF_KEY_UNCACHED)

/* --------------------------------------------------------------- params */

struct pmof_params {
    int inline_size; /* FI_PMOF_INLINE_SIZE */
    int eager_size;  /* FI_PMOF_EAGER_SIZE */
    int tx_size, rx_size;
    int allow_layering; /* FI_PMOF_ALLOW_LAYERING: let ofi_rxm over pmof */
    int commit_manual;  /* FI_PMOF_COMMIT_MANUAL: only the manual infos */
    int commit_flush;   /* FI_PMOF_COMMIT_PATH=flush: sroce too takes the RNIC path */
    int cm_timeout_ms;  /* FI_PMOF_CM_TIMEOUT */
};
extern struct pmof_params pmof_params;

/* ------------------------------------------------------------ utilities */

struct pmof_slist_entry {
    struct pmof_slist_entry *next;
};

struct pmof_slist {
    struct pmof_slist_entry *head, *tail;
};

static inline void pmof_slist_push(struct pmof_slist *l, struct pmof_slist_entry *e) {
    e->next = NULL;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
}

static inline struct pmof_slist_entry *pmof_slist_pop(struct pmof_slist *l) {
    struct pmof_slist_entry *e = l->head;
    if (e) {
        l->head = e->next;
        if (!l->head) l->tail = NULL;
    }
    return e;
}

/* Locks that cost nothing when the application promised single-threaded
 * access to the object (FI_THREAD_DOMAIN and finer). */
struct pmof_lock {
    pthread_mutex_t m;
    bool enabled;
};

static inline void pmof_lock_init(struct pmof_lock *l, bool enabled) {
    pthread_mutex_init(&l->m, NULL);
    l->enabled = enabled;
}
static inline void pmof_lock_destroy(struct pmof_lock *l) {
    pthread_mutex_destroy(&l->m);
}
static inline void pmof_lock(struct pmof_lock *l) {
    if (l->enabled) pthread_mutex_lock(&l->m);
}
static inline void pmof_unlock(struct pmof_lock *l) {
    if (l->enabled) pthread_mutex_unlock(&l->m);
}

int pmof_errno(int err); /* positive errno (or -errno) to -FI_E* */
/* Before the provider starts a thread. */
void pmof_pin_library(void);
uint64_t pmof_now_ms(void);
/* Adds `fd` to the epoll set `epfd` for reading; 0 or -FI_E*. */
int pmof_epoll_add(int epfd, int fd);

/* ------------------------------------------------------------- fi_info */

int pmof_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                 const struct fi_info *hints, struct fi_info **info);
void pmof_info_cleanup(void);
/* The fabric attributes of the templates; 0 if `attr` names none of ours. */
bool pmof_fabric_name_ok(const char *name);
size_t pmof_sockaddr_len(const struct sockaddr *sa);
/* Sets an IPv4 or IPv6 address's port to 0 (any). */
void pmof_sockaddr_clear_port(struct sockaddr *sa);

/* --------------------------------------------------------------- fabric */

struct pmof_fabric {
    struct fid_fabric fabric_fid;
    atomic_int refs;
    /* Before 1.5 the error entries of CQs and EQs end at err_data: their
     * err_data_size is neither read nor written (fi_cq(3), fi_eq(3)). */
    bool err_data_size;
};

int pmof_fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);

/* --------------------------------------------------------------- domain */

/* Buckets of a domain's table of regions by key. */
#define PMOF_MR_BUCKETS 64

/* How FI_COMMIT and fi_commit reach the target on this device. */
enum pmof_commit_path {
    PMOF_COMMIT_NONE,  /* no remote persistence: say so (-FI_EOPNOTSUPP) */
    PMOF_COMMIT_VERBS, /* ibv_wr_rdma_write_commit (sroce): native or IBTA */
    PMOF_COMMIT_FLUSH, /* an RNIC with IBTA FLUSH: WRITE + FLUSH sequences */
    /* An RNIC that executes its peers' FLUSHes, under a libibverbs too old
     * to post one (rdma-core < 45): persistent memory for targets only. */
    PMOF_COMMIT_FLUSH_TARGET,
};

/* Whether this side can make its own writes durable at the target. */
static inline bool pmof_path_initiates(enum pmof_commit_path path) {
    return path == PMOF_COMMIT_VERBS || path == PMOF_COMMIT_FLUSH;
}

struct pmof_domain {
    struct fid_domain domain_fid;
    struct pmof_fabric *fab;
    struct fi_info *info;
    struct ibv_context **dev_list; /* rdma_get_devices(), freed at close */
    struct ibv_context *verbs;
    struct ibv_pd *pd;
    struct ibv_device_attr_ex dev_attr;
    atomic_int refs;
    bool thread_safe;
    enum pmof_commit_path commit_path;
    struct ibv_commit_caps commit_caps;
    size_t tx_iov_limit; /* entries a send, write or read may gather */
    /* Atomics: IBTA ATOMIC WRITE available; the word fetch-less atomics
     * return their old value to, registered as `scratch` */
    bool atomic_write;
    uint64_t scratch_word;
    struct pmof_mr *scratch;
    struct fi_pmof_domain_ops pmof_ops;
    struct fi_hmem_override_ops hmem_ops;
    bool hmem_override;
    /* FI_COMMIT_MANUAL's control thread, started by the first endpoint */
    pthread_mutex_t manual_lock;
    struct pmof_mdom *manual;
    /* The regions a peer can name, by key: what the ranges of a manual
     * commit are checked against before the application sees them */
    pthread_mutex_t mr_lock;
    struct pmof_mr *mr_table[PMOF_MR_BUCKETS];
    /* The completion channel every waitable CQ of the domain reports to,
     * made with the first: one descriptor pair for any number of CQs.  A
     * waiting thread takes its events and wakes the CQs they belong to;
     * chan_lock keeps a CQ from closing while its event is handed over */
    pthread_mutex_t chan_lock;
    struct ibv_comp_channel *channel;
};
/* The domain's completion channel, made on first use; NULL with errno. */
struct ibv_comp_channel *pmof_domain_channel(struct pmof_domain *dom);

int pmof_domain_open(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain,
                     void *context);
int pmof_mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
                uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
int pmof_mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access,
                 uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr,
                 void *context);
int pmof_mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                    struct fid_mr **mr);
/* A range of a manual commit from a peer: 0 if it lies inside a region of
 * the domain that is registered now, under that region's key, with remote
 * write access, and then the region's FI_PMEM is added to *flags;
 * -FI_EACCES otherwise. */
int pmof_mr_check_range(struct pmof_domain *dom, uint64_t addr, uint64_t len, uint64_t key,
                        uint64_t *flags);
/* Commit paths of a device, from what it reports. */
enum pmof_commit_path pmof_device_commit_path(struct ibv_context *verbs,
                                              struct ibv_commit_caps *caps);
/* How many entries a transmit may gather on a device. */
size_t pmof_device_tx_iov_limit(const struct ibv_device_attr_ex *attr, bool sroce);
/* A sroce device: the commit verbs, ATOMIC WRITE, no rxe provider quirks. */
bool pmof_device_is_sroce(struct ibv_context *verbs);

struct pmof_mr {
    struct fid_mr mr_fid;
    struct pmof_domain *dom;
    struct ibv_mr *ibv;
    int access;     /* the ibv access it was registered with */
    uint64_t flags; /* FI_PMEM, FI_UNCACHED */
    enum fi_hmem_iface iface;
    uint64_t device;
    /* device memory: the host copy the NIC uses, and what it stands for */
    void *bounce;
    uintptr_t dev_base;
    size_t len;
    /* in dom->mr_table: a region of host memory a peer can name */
    struct pmof_mr *table_next;
    bool in_table;
};

/* A receive or read into device memory: copied there at completion. */
struct pmof_hmem_io {
    struct pmof_mr *mr;
    void *dev, *host;
};

/*
 * With the application's override ops (FI_SET_OPS_HMEM_OVERRIDE), entries
 * of `iov` in device memory are replaced in `out` by their host copies;
 * outbound data is copied there now (copy_from_hmem_iov), inbound data at
 * completion (pmof_hmem_complete).  Returns 0 or -FI_E*.
 */
int pmof_hmem_stage(const struct iovec *iov, void **desc, size_t count, struct iovec *out,
                    bool outbound, struct pmof_hmem_io *in);
void pmof_hmem_complete(const struct pmof_hmem_io *in, size_t len);
/* pmof_hmem_stage when the domain has override ops: *iov then points at
 * `staged`.  `in` (inbound only) is cleared either way. */
static inline int pmof_hmem_prepare(const struct pmof_domain *dom, const struct iovec **iov,
                                    void **desc, size_t count, struct iovec *staged, bool outbound,
                                    struct pmof_hmem_io *in) {
    int ret;

    if (in) in->mr = NULL;
    if (!dom->hmem_override || !*iov || count > PMOF_IOV_LIMIT) return 0;
    ret = pmof_hmem_stage(*iov, desc, count, staged, outbound, in);
    if (!ret) *iov = staged;
    return ret;
}

/* ------------------------------------------------------------------- EQ */

struct pmof_eq_entry {
    struct pmof_slist_entry link;
    uint32_t event;
    bool err;
    size_t len;
    /* struct fi_eq_err_entry when err, else the event's bytes */
    uint8_t data[];
};

struct pmof_eq {
    struct fid_eq eq_fid;
    struct pmof_fabric *fab;
    struct rdma_event_channel *channel;
    int epfd;
    int evfd; /* readable while software entries are queued */
    enum fi_wait_obj wait_obj;
    struct pmof_lock lock;
    struct pmof_slist queue;
    /* the error entry last returned by readerr owns its err_data */
    void *err_data;
    struct fi_pmof_eq_ops pmof_ops;
    /* FI_COMMIT_MANUAL: the handler, or the commits read but not acked */
    fi_eq_event_handler_t commit_handler;
    void *commit_handler_ctx;
    struct pmof_mpend *pending;
    atomic_int refs;
};

int pmof_eq_open(struct fid_fabric *fabric, struct fi_eq_attr *attr, struct fid_eq **eq,
                 void *context);
/* Queues an event (or, with `err`, a struct fi_eq_err_entry) for the
 * application; takes the lock itself. */
int pmof_eq_push(struct pmof_eq *eq, uint32_t event, const void *buf, size_t len, bool err);
int pmof_eq_push_error(struct pmof_eq *eq, fid_t fid, void *context, int err, int prov_errno,
                       const void *err_data, size_t err_data_size);
/* After entries were taken out of the queue (lock held). */
void pmof_eq_resignal(struct pmof_eq *eq);

/* ------------------------------------------------------------------- CQ */

struct pmof_cq_entry {
    void *op_context;
    uint64_t flags;
    size_t len;
    void *buf;
    uint64_t data;
    uint64_t tag;
    fi_addr_t src_addr;
    /* error entries: FI_E* (positive) and the verbs status; 0 otherwise */
    int err;
    int prov_errno;
    size_t olen; /* FI_ETRUNC: the bytes that did not fit, when known */
};

struct pmof_ep;

struct pmof_cq {
    struct fid_cq cq_fid;
    struct pmof_domain *dom;
    struct ibv_cq *ibv;
    bool waitable; /* FI_WAIT_FD or UNSPEC: reports to the domain's channel */
    enum fi_cq_format format;
    enum fi_wait_obj wait_obj;
    /* Descriptors only a CQ that is waited on needs, made on first use
     * (so that thousands of CQs cost none): wake_fd, an eventfd, wakes a
     * waiter for an event of this CQ taken by another thread, a software
     * entry or fi_cq_signal; epfd (FI_GETWAIT) holds it and the channel */
    pthread_mutex_t wait_lock;
    atomic_int wake_fd;
    int epfd;
    atomic_bool signalled; /* fi_cq_signal not yet seen by fi_cq_sread */
    struct pmof_lock lock;
    /* completions translated but not yet read; errors kept in order */
    struct pmof_cq_entry *ring;
    size_t ring_size, ring_head, ring_count;
    struct pmof_cq_entry last_err;
    /* entries the provider makes itself (pmof_cq_push), under a lock of
     * their own so that any thread, one polling this CQ included, can add
     * them; moved into the ring by the next poll */
    pthread_mutex_t soft_lock;
    struct pmof_cq_entry *soft;
    size_t soft_count, soft_cap;
    /* RDM endpoints whose deferred work (FI_TAGGED) runs before the
     * application reads; the lock keeps a closing one out of use */
    pthread_rwlock_t hooks_lock;
    struct pmof_rdm **hooks;
    size_t hooks_cap;
    atomic_size_t nhooks;
    atomic_int refs;
};

int pmof_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq,
                 void *context);
/* Moves completions from the verbs CQ into the ring; 0 or -FI_E*. */
int pmof_cq_progress(struct pmof_cq *cq);
/* Adds an entry produced by the provider itself (e.g. a software commit);
 * never takes the CQ's lock, so it may be called while it is held. */
int pmof_cq_push(struct pmof_cq *cq, const struct pmof_cq_entry *e);
/* An RDM endpoint whose deferred work runs when the application reads
 * this CQ; 0 or -FI_ENOMEM. */
int pmof_cq_add_hook(struct pmof_cq *cq, struct pmof_rdm *rdm);
/* Wakes a thread waiting on the CQ (fi_cq_sread), to look again. */
void pmof_cq_wake(struct pmof_cq *cq);
void pmof_cq_del_hook(struct pmof_cq *cq, struct pmof_rdm *rdm);
/* Runs that work (counters' progress; CQ reads do it themselves). */
void pmof_cq_run_hooks(struct pmof_cq *cq);

/* -------------------------------------------------------------- counters */

struct pmof_cntr {
    struct fid_cntr cntr_fid;
    struct pmof_domain *dom;
    atomic_uint_least64_t value, errors;
    enum fi_wait_obj wait_obj;
    int signal_fd;
    struct pmof_lock lock;
    /* the CQs whose progress advances this counter */
    struct pmof_cq *cqs[8];
    size_t ncqs;
    atomic_int refs;
};

int pmof_cntr_open(struct fid_domain *domain, struct fi_cntr_attr *attr, struct fid_cntr **cntr,
                   void *context);
void pmof_cntr_inc(struct pmof_cntr *c);
void pmof_cntr_err(struct pmof_cntr *c);
int pmof_cntr_watch_cq(struct pmof_cntr *c, struct pmof_cq *cq);
void pmof_cntr_unwatch_cq(struct pmof_cntr *c, struct pmof_cq *cq);
int pmof_cntr_trywait(struct pmof_cntr *c);
int pmof_cq_trywait(struct pmof_cq *cq);
int pmof_eq_trywait(struct pmof_eq *eq);

/* ------------------------------------------------------ passive endpoint */

struct pmof_pep {
    struct fid_pep pep_fid;
    struct pmof_fabric *fab;
    struct fi_info *info;
    /* NULL once an active endpoint took it (fi_endpoint(3): info->handle) */
    struct rdma_cm_id *id;
    struct pmof_eq *eq;
    int backlog;
    bool listening;
};

int pmof_passive_ep(struct fid_fabric *fabric, struct fi_info *info, struct fid_pep **pep,
                    void *context);
/* The pmof passive endpoint `fid` is, or NULL (another provider's, or no
 * passive endpoint). */
struct pmof_pep *pmof_pep_of(struct fid *fid);

/* The handle of an FI_CONNREQ's fi_info. */
struct pmof_connreq {
    struct fid handle;
    struct rdma_cm_id *id;
    struct ibv_ece ece; /* what the request offered */
    uint8_t peer_flags;
    uint32_t peer_ctl_qpn; /* PMOF_CM_COMMIT_MANUAL */
};

/* -------------------------------------------------------------- endpoint */

/* One per posted work request; wr_id points at it. */
struct pmof_rdm;
struct pmof_mrec;

struct pmof_op {
    struct pmof_ep *ep;
    struct pmof_rdm *rdm; /* a receive of an RDM endpoint's shared queue */
    uint64_t seq;         /* position in its ring, counting from the start */
    void *context;
    uint64_t flags; /* FI_* of the completion entry */
    size_t len;
    void *buf;   /* receive: start of the buffer (FI_CQ_FORMAT_MSG) */
    bool report; /* a successful completion goes to the CQ */
    bool signaled;
    uint32_t cntr; /* which counter (PMOF_CNTR_*) counts it */
    struct pmof_hmem_io hmem;
    struct pmof_mrec *mrec; /* a manual commit's drain: its placement */
    /* FI_TAGGED endpoints: a provider buffer of the shared receive queue
     * (or, sending, a FIN), the receive a rendezvous READ fills, or the
     * send an RTS announces */
    bool bounce;
    struct pmof_trecv *trecv;
    uint64_t tsend;
    uint32_t tbuf; /* a send buffer (from 1) the payload was copied into */
};

enum pmof_cntr_kind {
    PMOF_CNTR_SEND,
    PMOF_CNTR_RECV,
    PMOF_CNTR_READ,
    PMOF_CNTR_WRITE,
    PMOF_CNTR_REMOTE_READ,
    PMOF_CNTR_REMOTE_WRITE,
    PMOF_CNTR_KINDS,
    PMOF_CNTR_NONE = PMOF_CNTR_KINDS, /* the provider's own requests */
};

/* Positions count from the start and never wrap in practice (64 bits),
 * so head - tail is the number outstanding for any ring size. */
struct pmof_ring {
    struct pmof_op *ops;
    uint32_t size;
    uint64_t head, tail; /* head: next to post; tail: oldest outstanding */
};

enum pmof_ep_state {
    PMOF_EP_IDLE,
    PMOF_EP_CONNECTING,
    PMOF_EP_ACCEPTING,
    PMOF_EP_CONNECTED,
    PMOF_EP_SHUTDOWN,
    PMOF_EP_ERROR,
};

struct pmof_ep {
    struct fid_ep ep_fid;
    struct pmof_domain *dom;
    struct fi_info *info;
    struct rdma_cm_id *id;
    struct ibv_qp *qp;
    struct ibv_qp_ex *qpx;
    const struct ibv_qp_commit_ops *commit_ops;
    struct pmof_eq *eq;
    struct pmof_cq *tx_cq, *rx_cq;
    bool tx_selective, rx_selective;
    /* counters only: the endpoint made these CQs itself */
    bool tx_cq_internal, rx_cq_internal;
    struct pmof_cntr *cntrs[PMOF_CNTR_KINDS + 1];
    uint64_t tx_op_flags, rx_op_flags;
    enum pmof_ep_state state;
    uint32_t max_inline;
    struct pmof_lock tx_lock, rx_lock;
    struct pmof_ring tx, rx;
    /* tx.head and unsignaled when the batch being built began */
    uint64_t tx_start_head;
    uint32_t tx_start_unsignaled;
    /* slots a manual commit holds for what follows its acknowledgement */
    atomic_uint tx_reserved;
    bool resolved; /* the rdma_cm id has a destination address */
    bool closing;  /* completions still queued are dropped */
    /* unsignaled WRs since the last signaled one; every so often one is
     * signaled so the ring can be reclaimed */
    uint32_t unsignaled;
    /* connection set-up */
    uint8_t cm_data[PMOF_CM_PRIVATE_MAX];
    size_t cm_data_len;
    struct pmof_connreq *connreq;
    uint8_t peer_flags;
    /* FI_COMMIT_MANUAL: the control QP (pmof_manual.c) */
    struct pmof_mctl *mctl;
    struct fi_pmof_ep_ops pmof_ops;
    /* a connection of an RDM endpoint: receives go to its shared queue */
    struct pmof_rdm *rdm;
    struct pmof_conn *conn;
    struct ibv_srq *srq;
    /* FI_TAGGED: the headers of sends not inline, one per ring slot */
    uint8_t *msg_hdrs;
    struct ibv_mr *msg_hdr_mr;
};

int pmof_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep,
                  void *context);
/* Converts one verbs completion of the endpoint into a CQ entry; false if
 * it produces none. */
bool pmof_ep_complete(struct pmof_ep *ep, const struct ibv_wc *wc, struct pmof_cq_entry *out,
                      struct pmof_cntr **cntr);
/* FI_E* (positive) of a failed verbs completion. */
int pmof_wc_errno(enum ibv_wc_status s);
/* Length, FI_REMOTE_CQ_DATA and a remote write's flags of a successful
 * receive completion. */
void pmof_recv_entry(const struct ibv_wc *wc, struct pmof_cq_entry *out,
                     struct pmof_cntr *const *cntrs, struct pmof_cntr **cntr);
int pmof_ep_create_qp(struct pmof_ep *ep);
int pmof_ep_qp_to_rts(struct pmof_ep *ep);
void pmof_ep_qp_to_error(struct pmof_ep *ep);
/* Offers (active side) or answers (passive side) native commits by ECE. */
int pmof_ep_set_local_ece(struct pmof_ep *ep);
/* Translates an rdma_cm event of the EQ's channel (and acknowledges it):
 * application events are queued on the EQ. */
ssize_t pmof_cm_dispatch(struct pmof_eq *eq, struct rdma_cm_event *ev);

/*
 * Send batches, tx_lock held: pmof_tx_start, then per work request
 * pmof_tx_op (a slot; NULL when the queue is full), pmof_tx_wr and the
 * ibv_wr_* calls, then pmof_tx_post, or pmof_tx_abort to post nothing.
 */
void pmof_tx_start(struct pmof_ep *ep);
struct pmof_op *pmof_tx_op(struct pmof_ep *ep, void *context, uint64_t flags, uint64_t cq_flags,
                           size_t len, enum pmof_cntr_kind cntr);
/* A slot held in ep->tx_reserved, already released by the caller. */
struct pmof_op *pmof_tx_op_reserved(struct pmof_ep *ep, void *context, uint64_t flags,
                                    uint64_t cq_flags, size_t len);
void pmof_tx_wr(struct pmof_ep *ep, struct pmof_op *op, unsigned int send_flags);
ssize_t pmof_tx_post(struct pmof_ep *ep);
void pmof_tx_abort(struct pmof_ep *ep);
/* Fills an SGE list from iov/desc (FI_MR_LOCAL descriptors). */
int pmof_fill_sge(const struct iovec *iov, void **desc, size_t count, struct ibv_sge *sge,
                  size_t *total);
/* The data of the work request just started: inline (copied now) or the
 * scatter/gather list. */
void pmof_wr_set_payload(struct pmof_ep *ep, const struct iovec *iov, size_t count,
                         const struct ibv_sge *sge, int nsge, bool inl);
extern const uint64_t pmof_cntr_flags[PMOF_CNTR_KINDS];
/* fi_ep_bind of a counter (FI_SEND, FI_RECV, FI_READ, ... flags). */
int pmof_bind_cntr(struct pmof_cntr **cntrs, struct pmof_cntr *c, uint64_t flags);
/* FI_GETOPSFLAG / FI_SETOPSFLAG of fi_control. */
int pmof_ops_flag_control(uint64_t *tx_flags, uint64_t *rx_flags, int command, void *arg);
bool pmof_ep_wants_completion(const struct pmof_ep *ep, bool tx, uint64_t flags);
ssize_t pmof_ep_check_tx(struct pmof_ep *ep);

extern struct fi_ops_msg pmof_msg_ops;
extern struct fi_ops_rma pmof_rma_ops;
/* Atomics (pmof_atomic.c), of MSG and RDM endpoints alike. */
extern struct fi_ops_atomic pmof_atomic_ops;
enum pmof_atomic_family { PMOF_ATOMIC_WRITE, PMOF_ATOMIC_FETCH, PMOF_ATOMIC_COMPARE };
int pmof_atomic_valid(const struct pmof_domain *dom, int family, enum fi_datatype datatype,
                      enum fi_op op, size_t *count);
/* An RDM endpoint's connection to addr, or the MSG endpoint itself. */
struct pmof_ep *pmof_ep_for(struct fid_ep *ep_fid, fi_addr_t addr, ssize_t *err);
struct pmof_domain *pmof_ep_domain(struct fid_ep *ep_fid);
uint64_t pmof_ep_op_flags(struct fid_ep *ep_fid); /* its default transmit flags */
ssize_t pmof_post_send(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       uint64_t data, void *context, uint64_t flags);
ssize_t pmof_rma_read(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                      uint64_t addr, uint64_t key, void *context, uint64_t flags);

/* ------------------------------------------------------- address vector */

struct pmof_av {
    struct fid_av av_fid;
    struct pmof_domain *dom;
    enum fi_av_type type;
    size_t addrlen; /* stride of fi_av_insert's array */
    struct pmof_lock lock;
    struct sockaddr_storage *addrs;
    bool *used;
    size_t count, cap;
    atomic_int refs;
    /* fi_av_remove calls that removed something: whoever keeps an fi_addr
     * (an RDM endpoint's connections) looks it up again when this moved. */
    atomic_uint removals;
};

int pmof_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av,
                 void *context);
fi_addr_t pmof_av_find(struct pmof_av *av, const struct sockaddr *sa);
bool pmof_av_get(struct pmof_av *av, fi_addr_t addr, struct sockaddr_storage *out);
bool pmof_addr_equal(const struct sockaddr *a, const struct sockaddr *b);
const char *pmof_straddr(const void *addr, char *buf, size_t *len);

/* --------------------------------------------------------- RDM endpoint */

enum pmof_conn_state {
    PMOF_CONN_CONNECTING,
    PMOF_CONN_UP,
    PMOF_CONN_DOWN,
    PMOF_CONN_REFUSED, /* the peer's endpoint speaks the other protocol */
};

/* Caps that make an RDM endpoint head its messages and match them in
 * software (pmof_tagged.c): tags, and receives from one source only. */
#define PMOF_HEADED_CAPS (FI_TAGGED | FI_DIRECTED_RECV)

/* What an RDM endpoint rejects a connection of the other protocol with. */
#define PMOF_RDM_REJECT_PROTOCOL "pmof:protocol"

struct pmof_conn {
    struct pmof_conn *next;
    struct pmof_ep *ep;           /* the hidden connected endpoint */
    uint32_t qpn;                 /* its QP's number, which completions carry */
    struct sockaddr_storage peer; /* the peer's name */
    fi_addr_t addr;               /* its index in our AV, once known */
    unsigned addr_gen;            /* the AV's removals when `addr` was found */
    bool active;                  /* we connected */
    enum pmof_conn_state state;
};

struct pmof_rdm {
    struct fid_ep ep_fid;
    struct pmof_domain *dom;
    struct fi_info *info, *msg_info;
    struct pmof_av *av;
    struct pmof_eq *user_eq;
    struct pmof_cq *tx_cq, *rx_cq;
    bool tx_selective, rx_selective;
    struct pmof_cntr *cntrs[PMOF_CNTR_KINDS + 1];
    uint64_t tx_op_flags, rx_op_flags;
    bool enabled;
    /* connections: the listener, its EQ and the thread that serves it */
    struct pmof_pep *pep;
    struct pmof_eq *cm_eq;
    struct sockaddr_storage name;
    pthread_t thread;
    bool thread_running;
    int stop_fd[2];
    struct pmof_lock lock;
    struct pmof_conn *conns;
    struct pmof_conn **send_conn; /* by fi_addr: the connection sends use */
    size_t send_cap;
    unsigned send_gen; /* the AV's removals when send_conn was last emptied */
    /* the shared receive queue and its request slots */
    struct ibv_srq *srq;
    struct pmof_lock rx_lock;
    struct pmof_op *rx_ops;
    uint32_t *rx_free;
    uint32_t rx_size, rx_free_count;
    struct fi_pmof_ep_ops pmof_ops;
    bool closing; /* completions still queued are dropped */
    /* FI_TAGGED: every message headed and matched in software */
    struct pmof_tagged *tg;
};

int pmof_rdm_endpoint(struct pmof_domain *dom, struct fi_info *info, struct fid_ep **ep,
                      void *context);
bool pmof_rdm_complete(struct pmof_rdm *rdm, const struct ibv_wc *wc, struct pmof_cq_entry *out,
                       struct pmof_cntr **cntr);

/* The connection a completion's QP belongs to, and the sender's address. */
struct pmof_conn *pmof_rdm_conn_by_qpn(struct pmof_rdm *rdm, uint32_t qpn);
fi_addr_t pmof_rdm_src_addr(struct pmof_rdm *rdm, struct pmof_conn *c);
/* The connection operations toward `addr` use: NULL with -FI_EAGAIN while
 * it is being made. */
struct pmof_ep *pmof_rdm_conn(struct pmof_rdm *rdm, fi_addr_t addr, ssize_t *err);

/* ------------------------------------------------- FI_TAGGED (pmof_tagged.c) */

struct pmof_tagged;
struct pmof_trecv;

int pmof_tagged_open(struct pmof_rdm *rdm);
/* Fills the shared receive queue with the provider's buffers. */
int pmof_tagged_fill_srq(struct pmof_rdm *rdm);
void pmof_tagged_close(struct pmof_rdm *rdm);
/* A completion of a provider buffer of the shared receive queue. */
bool pmof_tagged_recv_complete(struct pmof_rdm *rdm, struct pmof_op *op, const struct ibv_wc *wc,
                               struct pmof_cq_entry *out, struct pmof_cntr **cntr);
/* A rendezvous READ (op.trecv) or an RTS send (op.tsend) completed. */
void pmof_tagged_tx_complete(struct pmof_ep *ep, const struct pmof_op *op, const struct ibv_wc *wc);
/* Runs what completions left to do (READs and FINs to post). */
void pmof_tagged_progress(struct pmof_rdm *rdm);
bool pmof_tagged_has_work(struct pmof_rdm *rdm);
ssize_t pmof_tagged_recv(struct pmof_rdm *rdm, const struct iovec *iov, void **desc, size_t count,
                         fi_addr_t src, uint64_t tag, uint64_t ignore, void *context,
                         uint64_t flags, bool tagged);
ssize_t pmof_tagged_send(struct pmof_rdm *rdm, fi_addr_t dest, const struct iovec *iov, void **desc,
                         size_t count, uint64_t tag, uint64_t data, void *context, uint64_t flags,
                         bool tagged);
size_t pmof_tagged_rx_left(struct pmof_rdm *rdm);
/* Readable while completions have left work to run; -1 without FI_TAGGED.
 * The endpoint's CM thread waits on it, acks it and runs the work. */
int pmof_tagged_work_fd(struct pmof_rdm *rdm);
void pmof_tagged_work_ack(struct pmof_rdm *rdm);
/* A connection went down: its rendezvous sends fail (no FIN will come). */
void pmof_tagged_conn_down(struct pmof_rdm *rdm, struct pmof_ep *ep);
void pmof_tagged_ep_close(struct pmof_ep *ep);
/* A send buffer's send completed. */
void pmof_tagged_sbuf_put(struct pmof_rdm *rdm, uint32_t b);
extern struct fi_ops_tagged pmof_tagged_ops;

/* ------------------------------------------------------------- commits */

/* Posts a write with the durability its flags ask for (FI_COMMIT,
 * FI_COMMIT_COMPLETE, FI_DELIVERY_COMPLETE, FI_IMMED, FI_FENCE). */
ssize_t pmof_rma_write(struct pmof_ep *ep, const struct iovec *iov, void **desc, size_t count,
                       uint64_t addr, uint64_t key, uint64_t data, void *context, uint64_t flags);
ssize_t pmof_commit(struct fi_pmof_ep_ops *ops, const struct fi_rma_iov *iov, size_t count,
                    fi_addr_t dest_addr, uint64_t flags, void *context);
ssize_t pmof_commit_ep(struct pmof_ep *ep, const struct fi_rma_iov *iov, size_t count,
                       uint64_t flags, void *context);
int pmof_commit_ack(struct fi_pmof_eq_ops *ops, const struct fi_eq_commit_entry *entry, int status);

/* ------------------------------------------------------ FI_COMMIT_MANUAL */

struct pmof_mctl;
struct pmof_mdom;
struct pmof_mpend;

/* The control QP of a manual endpoint, created with its QP (INIT). */
int pmof_manual_ep_init(struct pmof_ep *ep);
/* Connects it to the peer's control QP; manual commits work from then on. */
int pmof_manual_connect(struct pmof_ep *ep, uint32_t peer_qpn);
void pmof_manual_ep_close(struct pmof_ep *ep);
void pmof_manual_domain_close(struct pmof_domain *dom);
uint32_t pmof_manual_qpn(const struct pmof_ep *ep);
/* Both sides commit manually on this connection. */
bool pmof_manual_active(const struct pmof_ep *ep);
ssize_t pmof_manual_commit(struct pmof_ep *ep, const struct fi_rma_iov *iov, size_t count,
                           uint64_t flags, void *context);
/* A durable write (tx_lock not held). */
ssize_t pmof_manual_write(struct pmof_ep *ep, const struct iovec *iov, size_t count,
                          const struct ibv_sge *sge, int nsge, bool inl, size_t total,
                          uint64_t addr, uint64_t key, uint64_t data, void *context,
                          uint64_t flags);
/* A write without a commit: its extent joins the next commit to its key
 * (tx_lock held). */
int pmof_manual_note_write(struct pmof_ep *ep, uint64_t addr, uint64_t len, uint64_t key);
/* The drain of a manual commit completed: the REQ goes out.  0, or -FI_E*
 * and the commit is over (its error is the caller's to report). */
int pmof_manual_placed(struct pmof_ep *ep, struct pmof_mrec *r);
void pmof_manual_drain_failed(struct pmof_ep *ep, struct pmof_mrec *r);
/* Answers (status < 0) or forgets (0) the commits an EQ holds for `m`,
 * or for every endpoint (NULL). */
void pmof_manual_eq_release(struct pmof_eq *eq, struct pmof_mctl *m, int status);
/* Operation flag of the provider's own requests and of fi_inject*: no
 * completion entry (FI_INJECT alone, on fi_sendmsg or fi_writemsg, only
 * frees the buffer at return).  Bit 63, which no flag of the header uses;
 * stripped from applications' flags. */
#define PMOF_NO_COMPLETION (1ULL << 63)
#define PMOF_INJECT (FI_INJECT | PMOF_NO_COMPLETION)

/* The op flags that ask for durability. */
#define PMOF_DURABLE_FLAGS (FI_COMMIT | FI_COMMIT_COMPLETE | FI_DELIVERY_COMPLETE)

/* ------------------------------------------------------- enosys tables */

extern struct fi_ops_ep pmof_ep_base_ops_enosys;
extern struct fi_ops_cm pmof_cm_ops_enosys;
extern struct fi_ops_msg pmof_msg_ops_enosys;
extern struct fi_ops_tagged pmof_tagged_ops_enosys;
extern struct fi_ops_rma pmof_rma_ops_enosys;
extern struct fi_ops_atomic pmof_atomic_ops_enosys;
extern struct fi_ops_collective pmof_collective_ops_enosys;
int pmof_fid_ops_open_enosys(struct fid *fid, const char *name, uint64_t flags, void **ops,
                             void *context);
int pmof_fid_bind_enosys(struct fid *fid, struct fid *bfid, uint64_t flags);
int pmof_fid_control_enosys(struct fid *fid, int command, void *arg);
int pmof_fid_ops_set_enosys(struct fid *fid, const char *name, uint64_t flags, void *ops,
                            void *context);

#endif /* PMOF_H */
