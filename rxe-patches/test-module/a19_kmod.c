// SPDX-License-Identifier: GPL-2.0
/*
 * a19_kmod: a kernel consumer of the 6.1 series' FLUSH and ATOMIC WRITE
 * work requests (struct ib_flush_wr, struct ib_atomic_write_wr), for tests:
 * not for upstream.  It is the client of `a19_check --server`
 * (tests/progs/a19_check.c) and runs its cases over kernel rdma_cm, one
 * connection each, when loaded:
 *
 *   insmod a19_kmod.ko server=10.204.0.1 port=18801
 *
 *   ops                      for each placement type the server's region A
 *                            takes (global; persistent) and each selectivity
 *                            level (range; MR): WRITE a pattern, FLUSH, READ
 *                            it back; then ATOMIC WRITE 8 bytes, READ back
 *   no-flush-access          FLUSH of region B  -> IB_WC_REM_ACCESS_ERR
 *   no-persistent-access     persistent FLUSH of region C -> IB_WC_REM_ACCESS_ERR
 *   misaligned-atomic-write  posting ATOMIC WRITE to A + 4 -> -EINVAL, locally
 *
 * Every completion status and opcode is checked and every byte read back.
 * The module logs a line per check and fails to load (-EIO) when one fails,
 * so `insmod` says whether they all passed; loaded, it holds nothing.
 */
#include <linux/completion.h>
#include <linux/delay.h>
#include <linux/inet.h>
#include <linux/module.h>
#include <linux/random.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static char *server = "127.0.0.1";
module_param(server, charp, 0444);
MODULE_PARM_DESC(server, "IPv4 address of the a19_check server");
static int port = 18515;
module_param(port, int, 0444);
MODULE_PARM_DESC(port, "its rdma_cm port");

#define REGION_LEN	(64 * 1024)
#define WC_TIMEOUT_MS	20000

/* What a19_check's server gives each client, little endian. */
struct a19_regions {
	__le64 addr_a, addr_b, addr_c;
	__le32 rkey_a, rkey_b, rkey_c;
	__le32 len;
	__le32 persistent;
};

struct a19_conn {
	struct rdma_cm_id *id;
	struct ib_pd *pd;
	struct ib_cq *cq;
	u8 *buf;		/* REGION_LEN written, REGION_LEN read back */
	u64 dma;
	struct completion event_done;
	enum rdma_cm_event_type event;
	int status;
	struct a19_regions r;
	bool have_regions;
	u64 wr_id;
};

static int a19_cm_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	struct a19_conn *c = id->context;

	if (ev->event == RDMA_CM_EVENT_ESTABLISHED &&
	    ev->param.conn.private_data_len >= sizeof(c->r)) {
		memcpy(&c->r, ev->param.conn.private_data, sizeof(c->r));
		c->have_regions = true;
	}
	c->event = ev->event;
	c->status = ev->status;
	complete(&c->event_done);
	return 0;
}

static int a19_wait_event(struct a19_conn *c, enum rdma_cm_event_type want)
{
	if (!wait_for_completion_timeout(&c->event_done,
					 msecs_to_jiffies(10000))) {
		pr_err("a19_kmod: no rdma_cm event, waited for %s\n",
		       rdma_event_msg(want));
		return -ETIMEDOUT;
	}
	reinit_completion(&c->event_done);
	if (c->event != want) {
		pr_err("a19_kmod: rdma_cm %s (status %d), expected %s\n",
		       rdma_event_msg(c->event), c->status, rdma_event_msg(want));
		return -ECONNREFUSED;
	}
	return 0;
}

static void a19_close(struct a19_conn *c)
{
	if (c->id && c->id->qp) {
		rdma_disconnect(c->id);
		rdma_destroy_qp(c->id);
	}
	if (c->cq)
		ib_free_cq(c->cq);
	if (c->dma)
		ib_dma_unmap_single(c->id->device, c->dma, 2 * REGION_LEN,
				    DMA_BIDIRECTIONAL);
	if (c->pd)
		ib_dealloc_pd(c->pd);
	if (c->id)
		rdma_destroy_id(c->id);
	kfree(c->buf);
	kfree(c);
}

static struct a19_conn *a19_connect(void)
{
	struct ib_qp_init_attr qa = {};
	struct rdma_conn_param cp = {};
	struct sockaddr_in dst = {};
	struct a19_conn *c;
	int err;

	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return ERR_PTR(-ENOMEM);
	init_completion(&c->event_done);
	c->buf = kzalloc(2 * REGION_LEN, GFP_KERNEL);
	if (!c->buf) {
		err = -ENOMEM;
		goto fail;
	}
	c->id = rdma_create_id(&init_net, a19_cm_handler, c, RDMA_PS_TCP,
			       IB_QPT_RC);
	if (IS_ERR(c->id)) {
		err = PTR_ERR(c->id);
		c->id = NULL;
		goto fail;
	}
	dst.sin_family = AF_INET;
	dst.sin_port = htons(port);
	if (!in4_pton(server, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL)) {
		pr_err("a19_kmod: server=%s is no IPv4 address\n", server);
		err = -EINVAL;
		goto fail;
	}
	err = rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&dst, 5000);
	if (!err)
		err = a19_wait_event(c, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (!err)
		err = rdma_resolve_route(c->id, 5000);
	if (!err)
		err = a19_wait_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (err)
		goto fail;

	c->pd = ib_alloc_pd(c->id->device, 0);
	if (IS_ERR(c->pd)) {
		err = PTR_ERR(c->pd);
		c->pd = NULL;
		goto fail;
	}
	c->cq = ib_alloc_cq(c->id->device, c, 16, 0, IB_POLL_DIRECT);
	if (IS_ERR(c->cq)) {
		err = PTR_ERR(c->cq);
		c->cq = NULL;
		goto fail;
	}
	c->dma = ib_dma_map_single(c->id->device, c->buf, 2 * REGION_LEN,
				   DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(c->id->device, c->dma)) {
		c->dma = 0;
		err = -ENOMEM;
		goto fail;
	}
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.qp_type = IB_QPT_RC;
	qa.sq_sig_type = IB_SIGNAL_ALL_WR;
	qa.cap.max_send_wr = 8;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	err = rdma_create_qp(c->id, c->pd, &qa);
	if (err)
		goto fail;

	cp.responder_resources = 4;
	cp.initiator_depth = 4;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	err = rdma_connect(c->id, &cp);
	if (!err)
		err = a19_wait_event(c, RDMA_CM_EVENT_ESTABLISHED);
	if (err)
		goto fail;
	if (!c->have_regions) {
		pr_err("a19_kmod: the server sent no regions\n");
		err = -EPROTO;
		goto fail;
	}
	return c;

fail:
	a19_close(c);
	return ERR_PTR(err);
}

/* Posts wr and waits for its completion; 0 when it has `status` and
 * (successful) `opcode`.
 */
static int a19_post(struct a19_conn *c, struct ib_send_wr *wr,
		    enum ib_wc_status status, enum ib_wc_opcode opcode,
		    const char *what)
{
	unsigned long end = jiffies + msecs_to_jiffies(WC_TIMEOUT_MS);
	struct ib_wc wc;
	int err, n;

	wr->wr_id = ++c->wr_id;
	wr->send_flags = IB_SEND_SIGNALED;
	err = ib_post_send(c->id->qp, wr, NULL);
	if (err) {
		pr_err("a19_kmod: %s: ib_post_send: %d\n", what, err);
		return err;
	}
	while ((n = ib_poll_cq(c->cq, 1, &wc)) == 0) {
		if (time_after(jiffies, end)) {
			pr_err("a19_kmod: %s: no completion\n", what);
			return -ETIMEDOUT;
		}
		usleep_range(50, 200);
	}
	if (n < 0)
		return n;
	if (wc.wr_id != c->wr_id || wc.status != status ||
	    (status == IB_WC_SUCCESS && wc.opcode != opcode)) {
		pr_err("a19_kmod: %s: completion %llu status %s opcode %d, expected %llu %s %d\n",
		       what, wc.wr_id, ib_wc_status_msg(wc.status), wc.opcode,
		       c->wr_id, ib_wc_status_msg(status), opcode);
		return -EIO;
	}
	return 0;
}

static int a19_write(struct a19_conn *c, u32 off, u32 len)
{
	struct ib_sge sge = {
		.addr = c->dma + off, .length = len, .lkey = c->pd->local_dma_lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = { .opcode = IB_WR_RDMA_WRITE, .sg_list = &sge, .num_sge = 1 },
		.remote_addr = le64_to_cpu(c->r.addr_a) + off,
		.rkey = le32_to_cpu(c->r.rkey_a),
	};

	return a19_post(c, &wr.wr, IB_WC_SUCCESS, IB_WC_RDMA_WRITE, "WRITE");
}

/* READs [off, off + len) of A back and compares it with what was written. */
static int a19_read_back(struct a19_conn *c, u32 off, u32 len, const char *what)
{
	u8 *got = c->buf + REGION_LEN;
	struct ib_sge sge = {
		.addr = c->dma + REGION_LEN, .length = len,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = { .opcode = IB_WR_RDMA_READ, .sg_list = &sge, .num_sge = 1 },
		.remote_addr = le64_to_cpu(c->r.addr_a) + off,
		.rkey = le32_to_cpu(c->r.rkey_a),
	};
	int err;

	memset(got, 0xA5, len);
	ib_dma_sync_single_for_device(c->id->device, c->dma, 2 * REGION_LEN,
				      DMA_BIDIRECTIONAL);
	err = a19_post(c, &wr.wr, IB_WC_SUCCESS, IB_WC_RDMA_READ, "READ");
	if (err)
		return err;
	ib_dma_sync_single_for_cpu(c->id->device, c->dma, 2 * REGION_LEN,
				   DMA_BIDIRECTIONAL);
	if (memcmp(got, c->buf + off, len)) {
		pr_err("a19_kmod: %s: the data read back differs\n", what);
		return -EIO;
	}
	return 0;
}

static int a19_flush(struct a19_conn *c, u32 rkey, u64 addr, u32 len, u8 type,
		     u8 level, enum ib_wc_status status, const char *what)
{
	struct ib_flush_wr wr = {
		.wr = { .opcode = IB_WR_FLUSH },
		.remote_addr = addr, .rkey = rkey, .length = len,
		.type = type, .level = level,
	};

	return a19_post(c, &wr.wr, status, IB_WC_FLUSH, what);
}

static int a19_case_ops(struct a19_conn *c)
{
	struct ib_atomic_write_wr aw = { .wr = { .opcode = IB_WR_ATOMIC_WRITE } };
	u64 a = le64_to_cpu(c->r.addr_a);
	u32 rkey = le32_to_cpu(c->r.rkey_a);
	int t, level, err, kinds = 0;
	char what[48];

	for (t = 0; t < 2; t++) {
		u8 type = t ? IB_FLUSH_PERSISTENT : IB_FLUSH_GLOBAL;

		if (t && !le32_to_cpu(c->r.persistent))
			break;
		for (level = IB_FLUSH_RANGE; level <= IB_FLUSH_MR; level++) {
			u32 off = 512 * (2 * t + level), len = 3000;

			snprintf(what, sizeof(what), "FLUSH %s %s",
				 t ? "persistent" : "global",
				 level == IB_FLUSH_MR ? "MR" : "range");
			get_random_bytes(c->buf + off, len);
			ib_dma_sync_single_for_device(c->id->device, c->dma,
						      2 * REGION_LEN,
						      DMA_BIDIRECTIONAL);
			err = a19_write(c, off, len);
			if (!err)
				err = a19_flush(c, rkey, a + off, len, type,
						level, IB_WC_SUCCESS, what);
			if (!err)
				err = a19_read_back(c, off, len, what);
			if (err)
				return err;
			pr_info("a19_kmod: ops: %s: IB_WC_FLUSH, %u bytes read back intact\n",
				what, len);
			kinds++;
		}
	}

	get_random_bytes(aw.value, sizeof(aw.value));
	memcpy(c->buf + 8192, aw.value, sizeof(aw.value));
	aw.remote_addr = a + 8192;
	aw.rkey = rkey;
	err = a19_post(c, &aw.wr, IB_WC_SUCCESS, IB_WC_ATOMIC_WRITE,
		       "ATOMIC WRITE");
	if (!err)
		err = a19_read_back(c, 8192, sizeof(aw.value), "ATOMIC WRITE");
	if (err)
		return err;
	pr_info("a19_kmod: ops: %d FLUSH kinds and ATOMIC WRITE checked\n", kinds);
	return 0;
}

static int a19_case(const char *name)
{
	struct a19_conn *c = a19_connect();
	int err;

	if (IS_ERR(c)) {
		pr_err("a19_kmod: %s: cannot connect to %s:%d: %ld\n", name,
		       server, port, PTR_ERR(c));
		return PTR_ERR(c);
	}
	if (!strcmp(name, "ops")) {
		err = a19_case_ops(c);
	} else if (!strcmp(name, "no-flush-access")) {
		err = a19_flush(c, le32_to_cpu(c->r.rkey_b),
				le64_to_cpu(c->r.addr_b), 64, IB_FLUSH_GLOBAL,
				IB_FLUSH_RANGE, IB_WC_REM_ACCESS_ERR, name);
	} else if (!strcmp(name, "no-persistent-access")) {
		err = a19_flush(c, le32_to_cpu(c->r.rkey_c),
				le64_to_cpu(c->r.addr_c), 64,
				IB_FLUSH_PERSISTENT, IB_FLUSH_RANGE,
				IB_WC_REM_ACCESS_ERR, name);
	} else {
		struct ib_atomic_write_wr aw = {
			.wr = { .opcode = IB_WR_ATOMIC_WRITE },
			.remote_addr = le64_to_cpu(c->r.addr_a) + 4,
			.rkey = le32_to_cpu(c->r.rkey_a),
		};

		/* A kernel consumer learns it before anything is sent. */
		err = ib_post_send(c->id->qp, &aw.wr, NULL);
		err = err == -EINVAL ? 0 : -EIO;
	}
	if (!err && strcmp(name, "ops"))
		pr_info("a19_kmod: %s: as expected\n", name);
	a19_close(c);
	return err;
}

static int __init a19_kmod_init(void)
{
	static const char * const cases[] = {
		"ops", "no-flush-access", "no-persistent-access",
		"misaligned-atomic-write",
	};
	int i, err, failed = 0;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		err = a19_case(cases[i]);
		if (err) {
			pr_err("a19_kmod: %s failed: %d\n", cases[i], err);
			failed++;
		}
	}
	pr_info("a19_kmod: %zu cases, %d failed\n", ARRAY_SIZE(cases), failed);
	return failed ? -EIO : 0;
}

static void __exit a19_kmod_exit(void)
{
}

module_init(a19_kmod_init);
module_exit(a19_kmod_exit);
MODULE_DESCRIPTION("FLUSH and ATOMIC WRITE from a kernel consumer (test)");
MODULE_LICENSE("GPL");
