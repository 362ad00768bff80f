// SPDX-License-Identifier: GPL-2.0
/*
 * a19_kmod: a kernel consumer of the 6.1 series' FLUSH, ATOMIC WRITE and
 * write-commit work requests (struct ib_flush_wr, struct ib_atomic_write_wr,
 * struct ib_write_commit_wr), for tests: not for upstream.  It is the
 * client of `a19_check --server` (tests/progs/a19_check.c) and runs its
 * cases over kernel rdma_cm, one connection each, when loaded:
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
 *   commit                   native write-commits into A (persistent when A
 *                            is, else global visibility): plain, ORDERED,
 *                            with immediate data, one packet and several,
 *                            each IB_WC_RDMA_WRITE_COMMIT and read back
 *   commit-no-access         write-commit to B -> IB_WC_REM_ACCESS_ERR
 *   commit-global-only       persistent write-commit to C -> IB_WC_REM_ACCESS_ERR
 *
 * The commit cases need IBK_WRITE_COMMIT in the local device's
 * kernel_cap_flags.  Every connection offers native write-commits in its
 * ECE exchange (vendor ID 0xFFFFFF, options tag 0x5C000000 | the
 * commit_caps flags, as docs/connection-manager.md says); the commit cases
 * require that the server agreed, since a kernel consumer posts native
 * write-commits only to a peer that takes them.
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
#define ECE_VENDOR_ID	0xffffff
#define ECE_TAG		0x5c000000
#define ECE_TAG_MASK	0xff000000
#define ECE_NATIVE	0x1	/* and ORDERED 0x2, IMMED 0x4, FLUSH 0x8 */
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
	struct rdma_ucm_ece ece;	/* the server's answer */
	u64 wr_id;
};

static int a19_cm_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	struct a19_conn *c = id->context;

	if (ev->event == RDMA_CM_EVENT_ESTABLISHED &&
	    ev->param.conn.private_data_len >= sizeof(c->r)) {
		memcpy(&c->r, ev->param.conn.private_data, sizeof(c->r));
		c->have_regions = true;
		c->ece = ev->ece;
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
	struct rdma_ucm_ece ece = {
		.vendor_id = ECE_VENDOR_ID, .attr_mod = ECE_TAG | 0xf,
	};
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
	err = rdma_connect_ece(c->id, &cp, &ece);
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

/* A write-commit of [off, off + len) of the local buffer to rkey at addr. */
static int a19_commit(struct a19_conn *c, u32 rkey, u64 addr, u32 off, u32 len,
		      u32 flags, bool imm, enum ib_wc_status status,
		      const char *what)
{
	struct ib_sge sge = {
		.addr = c->dma + off, .length = len, .lkey = c->pd->local_dma_lkey,
	};
	struct ib_write_commit_wr wr = {
		.wr = {
			.opcode = imm ? IB_WR_RDMA_WRITE_COMMIT_WITH_IMM :
					IB_WR_RDMA_WRITE_COMMIT,
			.sg_list = &sge, .num_sge = 1,
			.ex.imm_data = cpu_to_be32(0xc0de0000 + off),
		},
		.remote_addr = addr, .rkey = rkey, .flags = flags,
	};

	return a19_post(c, &wr.wr, status, IB_WC_RDMA_WRITE_COMMIT, what);
}

static int a19_case_commit(struct a19_conn *c)
{
	static const struct {
		u32 off, len, flags;
		bool imm;
		const char *what;
	} commits[] = {
		{ 16384, 200, 0, false, "commit, one packet" },
		{ 20480, 5000, 0, false, "commit, several packets" },
		{ 28672, 300, IB_WRITE_COMMIT_ORDERED, false, "ordered commit" },
		{ 32768, 100, 0, true, "commit with immediate data" },
		{ 36864, 6000, IB_WRITE_COMMIT_ORDERED, true,
		  "ordered commit with immediate data, several packets" },
	};
	u32 global = le32_to_cpu(c->r.persistent) ? 0 : IB_WRITE_COMMIT_GLOBAL;
	int i, err;

	for (i = 0; i < ARRAY_SIZE(commits); i++) {
		u32 off = commits[i].off, len = commits[i].len;

		get_random_bytes(c->buf + off, len);
		ib_dma_sync_single_for_device(c->id->device, c->dma,
					      2 * REGION_LEN, DMA_BIDIRECTIONAL);
		err = a19_commit(c, le32_to_cpu(c->r.rkey_a),
				 le64_to_cpu(c->r.addr_a) + off, off, len,
				 commits[i].flags | global, commits[i].imm,
				 IB_WC_SUCCESS, commits[i].what);
		if (!err)
			err = a19_read_back(c, off, len, commits[i].what);
		if (err)
			return err;
		pr_info("a19_kmod: commit: %s: IB_WC_RDMA_WRITE_COMMIT, %u bytes read back intact\n",
			commits[i].what, len);
	}
	pr_info("a19_kmod: commit: %zu write-commits (%s) checked\n",
		ARRAY_SIZE(commits), global ? "global visibility" : "persistent");
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
	if (!strncmp(name, "commit", 6) &&
	    !(c->id->device->attrs.kernel_cap_flags & IBK_WRITE_COMMIT)) {
		pr_err("a19_kmod: %s: %s has no IBK_WRITE_COMMIT\n", name,
		       dev_name(&c->id->device->dev));
		a19_close(c);
		return -EOPNOTSUPP;
	}
	if (!strncmp(name, "commit", 6)) {
		bool native = c->ece.vendor_id == ECE_VENDOR_ID &&
			      (c->ece.attr_mod & ECE_TAG_MASK) == ECE_TAG &&
			      (c->ece.attr_mod & ECE_NATIVE);

		pr_info("a19_kmod: %s: ECE: vendor ID %#x, options %#x: %s\n",
			name, c->ece.vendor_id, c->ece.attr_mod,
			native ? "native write-commits" : "no native write-commits");
		if (!native) {
			a19_close(c);
			return -EPROTO;
		}
	}
	if (!strcmp(name, "ops")) {
		err = a19_case_ops(c);
	} else if (!strcmp(name, "commit")) {
		err = a19_case_commit(c);
	} else if (!strcmp(name, "commit-no-access")) {
		err = a19_commit(c, le32_to_cpu(c->r.rkey_b),
				 le64_to_cpu(c->r.addr_b), 0, 64, 0, false,
				 IB_WC_REM_ACCESS_ERR, name);
	} else if (!strcmp(name, "commit-global-only")) {
		err = a19_commit(c, le32_to_cpu(c->r.rkey_c),
				 le64_to_cpu(c->r.addr_c), 0, 64, 0, false,
				 IB_WC_REM_ACCESS_ERR, name);
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
	if (!err && strcmp(name, "ops") && strcmp(name, "commit"))
		pr_info("a19_kmod: %s: as expected\n", name);
	a19_close(c);
	return err;
}

static int __init a19_kmod_init(void)
{
	static const char * const cases[] = {
		"ops", "no-flush-access", "no-persistent-access",
		"misaligned-atomic-write", "commit", "commit-no-access",
		"commit-global-only",
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
MODULE_DESCRIPTION("FLUSH, ATOMIC WRITE and write-commit from a kernel consumer (test)");
MODULE_LICENSE("GPL");
