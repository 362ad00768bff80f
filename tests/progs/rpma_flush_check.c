// SPDX-License-Identifier: MIT
//
// rpma_flush_check: librpma's write / flush / read cycle between two
// processes, every byte checked on both sides.
//
//   server: rpma_flush_check server ADDR PORT [SIZE]
//   client: rpma_flush_check client ADDR PORT [SIZE]
//
// The server registers SIZE bytes (default 1 MiB) as a write destination, read
// source and RPMA_FLUSH_TYPE_VISIBILITY target, hands the region's
// descriptor to the client in the connection's private data and waits for it
// to disconnect.  The client, in ROUNDS rounds, rpma_write()s the whole region
// with a pattern, overwrites a slice of unaligned size and offset,
// rpma_flush()es, then rpma_read()s the region back into a second buffer and
// compares it with what it wrote.  The last round writes the whole region only, so the server
// can compare its memory with that round's pattern after the client has gone.
//
// Exit status: 0 success, 1 usage error, 2 librpma call or completion failed,
// 3 data mismatch (the client's read-back or the server's final image).
//
// Debian's librpma is built against an rdma-core without ibv_wr_flush, so its
// rpma_flush() is the "appliance persistency method": an 8-byte RDMA READ
// after the writes, which the responder may only answer once the writes
// before it are placed.  The read-back after it then checks placement.

#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <librpma.h>

enum { EXIT_USAGE = 1, EXIT_RPMA = 2, EXIT_MISMATCH = 3 };
enum { ROUNDS = 4, DEFAULT_SIZE = 1 << 20 };

// Private data of an RC connection is 56 bytes at most: the descriptor, then
// the region's size so that the client can check it.
struct offer {
    uint8_t desc_size;
    uint8_t desc[47];
    uint64_t size;
};

static int fail_rpma(const char *what, int ret) {
    fprintf(stderr, "rpma_flush_check: %s: %s\n", what, rpma_err_2str(ret));
    return EXIT_RPMA;
}

// Byte i of round r: a pattern that differs between neighbouring bytes,
// rounds and 4 KiB pages, so misplaced or stale data does not match.
static uint8_t pattern(unsigned round, size_t i) {
    return (uint8_t)(i * 131u + (i >> 12) * 7u + round * 29u + 1u);
}

static void *alloc_region(size_t size) {
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096u, size) != 0) return NULL;
    memset(p, 0, size);
    return p;
}

// Returns the offset of the first byte where a and b differ, or SIZE_MAX.
static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return SIZE_MAX;
}

static int expect_event(struct rpma_conn *conn, enum rpma_conn_event want) {
    enum rpma_conn_event ev = RPMA_CONN_UNDEFINED;
    int ret = rpma_conn_next_event(conn, &ev);
    if (ret) return fail_rpma("rpma_conn_next_event", ret);
    if (ev != want) {
        fprintf(stderr, "rpma_flush_check: got connection event %s, expected %s\n",
                rpma_utils_conn_event_2str(ev), rpma_utils_conn_event_2str(want));
        return EXIT_RPMA;
    }
    return 0;
}

// Waits for the one completion an operation posted with
// RPMA_F_COMPLETION_ALWAYS produces, and checks it.
static int wait_completion(struct rpma_conn *conn, const void *ctx, const char *what) {
    struct rpma_cq *cq = NULL;
    struct ibv_wc wc;
    int n = 0, ret = rpma_conn_get_cq(conn, &cq);
    if (ret) return fail_rpma("rpma_conn_get_cq", ret);
    for (;;) {
        ret = rpma_cq_get_wc(cq, 1, &wc, &n);
        if (ret == 0 && n == 1) break;
        if (ret != RPMA_E_NO_COMPLETION) return fail_rpma("rpma_cq_get_wc", ret);
        ret = rpma_cq_wait(cq);
        if (ret) return fail_rpma("rpma_cq_wait", ret);
    }
    if (wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "rpma_flush_check: %s completed with %s\n", what,
                ibv_wc_status_str(wc.status));
        return EXIT_RPMA;
    }
    if ((const void *)(uintptr_t)wc.wr_id != ctx) {
        fprintf(stderr,
                "rpma_flush_check: %s: completion of another operation (wr_id %#" PRIx64 ")\n",
                what, (uint64_t)wc.wr_id);
        return EXIT_RPMA;
    }
    return 0;
}

static int run_server(struct rpma_peer *peer, const char *addr, const char *port, size_t size) {
    uint8_t *mem = alloc_region(size);
    struct rpma_mr_local *mr = NULL;
    struct rpma_ep *ep = NULL;
    struct rpma_conn_req *req = NULL;
    struct rpma_conn *conn = NULL;
    struct offer offer = {.size = size};
    size_t desc_size = 0;
    int ret, rc = EXIT_RPMA;

    if (!mem) {
        fprintf(stderr, "rpma_flush_check: out of memory\n");
        return EXIT_RPMA;
    }
    ret = rpma_mr_reg(peer, mem, size,
                      RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_READ_SRC |
                          RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY,
                      &mr);
    if (ret) {
        rc = fail_rpma("rpma_mr_reg", ret);
        goto out;
    }
    ret = rpma_mr_get_descriptor_size(mr, &desc_size);
    if (ret || desc_size > sizeof offer.desc) {
        rc = ret ? fail_rpma("rpma_mr_get_descriptor_size", ret) : EXIT_RPMA;
        goto out;
    }
    offer.desc_size = (uint8_t)desc_size;
    ret = rpma_mr_get_descriptor(mr, offer.desc);
    if (ret) {
        rc = fail_rpma("rpma_mr_get_descriptor", ret);
        goto out;
    }
    ret = rpma_ep_listen(peer, addr, port, &ep);
    if (ret) {
        rc = fail_rpma("rpma_ep_listen", ret);
        goto out;
    }
    printf("listening on %s:%s\n", addr, port);
    fflush(stdout);
    ret = rpma_ep_next_conn_req(ep, NULL, &req);
    if (ret) {
        rc = fail_rpma("rpma_ep_next_conn_req", ret);
        goto out;
    }
    struct rpma_conn_private_data pdata = {.ptr = &offer, .len = sizeof offer};
    ret = rpma_conn_req_connect(&req, &pdata, &conn);
    if (ret) {
        rc = fail_rpma("rpma_conn_req_connect", ret);
        goto out;
    }
    if ((rc = expect_event(conn, RPMA_CONN_ESTABLISHED)) != 0) goto out;
    // The client disconnects once it has checked everything.
    if ((rc = expect_event(conn, RPMA_CONN_CLOSED)) != 0) goto out;

    uint8_t *want = malloc(size);
    if (!want) {
        rc = EXIT_RPMA;
        goto out;
    }
    for (size_t i = 0; i < size; i++)
        want[i] = pattern(ROUNDS - 1, i);
    size_t at = first_diff(mem, want, size);
    free(want);
    if (at != SIZE_MAX) {
        fprintf(stderr,
                "rpma_flush_check: server memory differs at offset %zu: %#x, expected %#x\n", at,
                mem[at], pattern(ROUNDS - 1, at));
        rc = EXIT_MISMATCH;
        goto out;
    }
    printf("server: %zu bytes hold the last round's pattern\n", size);
    rc = 0;
out:
    if (conn) {
        (void)rpma_conn_disconnect(conn);
        (void)rpma_conn_delete(&conn);
    }
    if (req) (void)rpma_conn_req_delete(&req);
    if (ep) (void)rpma_ep_shutdown(&ep);
    if (mr) (void)rpma_mr_dereg(&mr);
    free(mem);
    return rc;
}

// One round: write, slice, flush, read back, compare.
static int client_round(struct rpma_conn *conn, struct rpma_mr_remote *dst, uint8_t *src,
                        struct rpma_mr_local *src_mr, uint8_t *back, struct rpma_mr_local *back_mr,
                        size_t size, unsigned round) {
    static const char write_ctx, flush_ctx, read_ctx;
    bool last = round == ROUNDS - 1;
    size_t off = 0, len = 0, from = 0;
    int ret, rc;

    for (size_t i = 0; i < size; i++)
        src[i] = pattern(round, i);
    memset(back, 0, size);
    ret = rpma_write(conn, dst, 0, src_mr, 0, size, RPMA_F_COMPLETION_ON_ERROR, &write_ctx);
    if (ret) return fail_rpma("rpma_write", ret);
    if (!last) {
        // A second write over part of the first, from another part of the
        // source buffer, at offsets no MTU or page boundary lines up with.
        off = 4093 * (round + 1) % (size / 2);
        len = size / 3 + round * 17 + 1;
        from = size - len;
        ret = rpma_write(conn, dst, off, src_mr, from, len, RPMA_F_COMPLETION_ON_ERROR, &write_ctx);
        if (ret) return fail_rpma("rpma_write", ret);
    }
    ret = rpma_flush(conn, dst, 0, size, RPMA_FLUSH_TYPE_VISIBILITY, RPMA_F_COMPLETION_ALWAYS,
                     &flush_ctx);
    if (ret) return fail_rpma("rpma_flush", ret);
    if ((rc = wait_completion(conn, &flush_ctx, "rpma_flush")) != 0) return rc;
    // The writes read src until they complete, which the flush's completion
    // implies (an RC QP completes in order): only now may src become the
    // image the region must hold.
    memmove(src + off, src + from, len);
    ret = rpma_read(conn, back_mr, 0, dst, 0, size, RPMA_F_COMPLETION_ALWAYS, &read_ctx);
    if (ret) return fail_rpma("rpma_read", ret);
    if ((rc = wait_completion(conn, &read_ctx, "rpma_read")) != 0) return rc;
    size_t at = first_diff(back, src, size);
    if (at != SIZE_MAX) {
        fprintf(stderr, "rpma_flush_check: round %u: read back %#x at offset %zu, wrote %#x\n",
                round, back[at], at, src[at]);
        return EXIT_MISMATCH;
    }
    printf("round %u: %zu bytes written%s, flushed, read back and equal\n", round, size,
           last ? "" : " (and a slice rewritten)");
    return 0;
}

static int run_client(struct rpma_peer *peer, const char *addr, const char *port, size_t size) {
    uint8_t *src = alloc_region(size), *back = alloc_region(size);
    struct rpma_mr_local *src_mr = NULL, *back_mr = NULL;
    struct rpma_mr_remote *dst = NULL;
    struct rpma_conn_req *req = NULL;
    struct rpma_conn *conn = NULL;
    struct rpma_conn_private_data pdata;
    struct offer offer;
    size_t remote_size = 0;
    int ret, rc = EXIT_RPMA;

    if (!src || !back) {
        fprintf(stderr, "rpma_flush_check: out of memory\n");
        goto out;
    }
    ret = rpma_mr_reg(peer, src, size, RPMA_MR_USAGE_WRITE_SRC, &src_mr);
    if (ret == 0) ret = rpma_mr_reg(peer, back, size, RPMA_MR_USAGE_READ_DST, &back_mr);
    if (ret) {
        rc = fail_rpma("rpma_mr_reg", ret);
        goto out;
    }
    ret = rpma_conn_req_new(peer, addr, port, NULL, &req);
    if (ret) {
        rc = fail_rpma("rpma_conn_req_new", ret);
        goto out;
    }
    ret = rpma_conn_req_connect(&req, NULL, &conn);
    if (ret) {
        rc = fail_rpma("rpma_conn_req_connect", ret);
        goto out;
    }
    if ((rc = expect_event(conn, RPMA_CONN_ESTABLISHED)) != 0) goto out;
    rc = EXIT_RPMA;
    ret = rpma_conn_get_private_data(conn, &pdata);
    if (ret) {
        rc = fail_rpma("rpma_conn_get_private_data", ret);
        goto out;
    }
    if (pdata.len < sizeof offer) {
        fprintf(stderr, "rpma_flush_check: %u bytes of private data, expected %zu\n", pdata.len,
                sizeof offer);
        goto out;
    }
    memcpy(&offer, pdata.ptr, sizeof offer);
    if (offer.size != size || offer.desc_size > sizeof offer.desc) {
        fprintf(stderr, "rpma_flush_check: the server offers %" PRIu64 " bytes, expected %zu\n",
                offer.size, size);
        goto out;
    }
    ret = rpma_mr_remote_from_descriptor(offer.desc, offer.desc_size, &dst);
    if (ret == 0) ret = rpma_mr_remote_get_size(dst, &remote_size);
    if (ret) {
        rc = fail_rpma("rpma_mr_remote_from_descriptor", ret);
        goto out;
    }
    if (remote_size != size) {
        fprintf(stderr, "rpma_flush_check: remote region of %zu bytes, expected %zu\n", remote_size,
                size);
        goto out;
    }
    for (unsigned round = 0; round < ROUNDS; round++)
        if ((rc = client_round(conn, dst, src, src_mr, back, back_mr, size, round)) != 0) goto out;
    ret = rpma_conn_disconnect(conn);
    if (ret) {
        rc = fail_rpma("rpma_conn_disconnect", ret);
        goto out;
    }
    rc = expect_event(conn, RPMA_CONN_CLOSED);
out:
    if (dst) (void)rpma_mr_remote_delete(&dst);
    if (conn) (void)rpma_conn_delete(&conn);
    if (req) (void)rpma_conn_req_delete(&req);
    if (back_mr) (void)rpma_mr_dereg(&back_mr);
    if (src_mr) (void)rpma_mr_dereg(&src_mr);
    free(back);
    free(src);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server|client ADDR PORT [SIZE]\n", argv[0]);
        return EXIT_USAGE;
    }
    bool server = strcmp(argv[1], "server") == 0;
    size_t size = DEFAULT_SIZE;
    if (argc == 5) {
        char *end;
        unsigned long long v = strtoull(argv[4], &end, 0);
        // The slice arithmetic of client_round needs some room.
        if (*end || v < 65536 || v > (1ull << 30)) {
            fprintf(stderr, "rpma_flush_check: SIZE must be 64 KiB to 1 GiB\n");
            return EXIT_USAGE;
        }
        size = (size_t)v;
    }

    struct ibv_context *dev = NULL;
    struct rpma_peer *peer = NULL;
    int ret = rpma_utils_get_ibv_context(
        argv[2], server ? RPMA_UTIL_IBV_CONTEXT_LOCAL : RPMA_UTIL_IBV_CONTEXT_REMOTE, &dev);
    if (ret) return fail_rpma("rpma_utils_get_ibv_context", ret);
    ret = rpma_peer_new(dev, &peer);
    if (ret) return fail_rpma("rpma_peer_new", ret);
    int rc = server ? run_server(peer, argv[2], argv[3], size)
                    : run_client(peer, argv[2], argv[3], size);
    (void)rpma_peer_delete(&peer);
    return rc;
}
