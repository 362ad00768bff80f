// SPDX-License-Identifier: MIT
//
// ucp_sockaddr_check: a UCP client and server that connect by IP address, v4 or v6
// (ucp_listener_create, ucp_ep_create with UCP_EP_PARAMS_FLAGS_CLIENT_SERVER),
// which UCX carries out through a connection manager: with
// UCX_SOCKADDR_TLS_PRIORITY=rdmacm, librdmacm's.  Then tagged messages and
// RMA over the endpoint, every byte checked on both sides.
//
//   server: ucp_sockaddr_check server ADDR PORT
//   client: ucp_sockaddr_check client ADDR PORT
//
// The client sends tagged messages of 1 byte to 1 MiB (eager and rendezvous),
// each of which the server checks and answers with another pattern, which
// the client checks.  The server then maps 1 MiB and sends its address and
// packed rkey; the client puts a pattern over it and part of it again at an
// unaligned offset, flushes, gets the region back and compares, and says
// so; the server compares its memory too and answers with its verdict.  Each
// side prints its endpoint's configuration (ucp_ep_print_info), so the
// caller can see which transports carried the data.
//
// Exit status: 0 success, 1 usage error, 2 a UCX call failed or timed out,
// 3 data mismatch (on either side: the server's verdict reaches the client).

#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <ucp/api/ucp.h>

enum { EXIT_USAGE = 1, EXIT_UCX = 2, EXIT_MISMATCH = 3 };
enum { REGION = 1 << 20, MAX_RKEY = 1024, TIMEOUT_S = 30 };

// Tags, one per kind of message; a ping and its pong add their size's index.
#define TAG_PING 0x100u
#define TAG_PONG 0x200u
#define TAG_REGION 0x300u
#define TAG_DONE 0x400u
#define TAG_VERDICT 0x500u

static const size_t sizes[] = {1, 100, 4096, 65536, 1 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

struct region_msg {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey_len;
    uint8_t rkey[MAX_RKEY];
};

static ucp_context_h context;
static ucp_worker_h worker;
static ucp_listener_h listener;
static ucp_conn_request_h conn_request;
static ucs_status_t ep_error = UCS_OK;
static int closing;

static uint8_t pattern(unsigned kind, size_t i) {
    return (uint8_t)(i * 197u + (i >> 12) * 11u + kind * 53u + 5u);
}

static void fill(uint8_t *buf, size_t n, unsigned kind) {
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(kind, i);
}

// 0 when buf holds kind's pattern, else prints the first difference.
static int check(const uint8_t *buf, size_t n, unsigned kind, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != pattern(kind, i)) {
            fprintf(stderr, "ucp_sockaddr_check: %s: byte %zu of %zu is %#x, expected %#x\n", what,
                    i, n, buf[i], pattern(kind, i));
            return EXIT_MISMATCH;
        }
    }
    return 0;
}

static int fail(const char *what, ucs_status_t status) {
    fprintf(stderr, "ucp_sockaddr_check: %s: %s\n", what, ucs_status_string(status));
    return EXIT_UCX;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

// Progresses the worker until the request is done; takes ownership of it.
// A tag receive's request reports the message's length in *info.
static ucs_status_t wait_request_info(ucs_status_ptr_t req, ucp_tag_recv_info_t *info) {
    if (req == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    double deadline = now_s() + TIMEOUT_S, grace = 0;
    ucs_status_t status;
    for (;;) {
        status = info ? ucp_tag_recv_request_test(req, info) : ucp_request_check_status(req);
        if (status != UCS_INPROGRESS) break;
        ucp_worker_progress(worker);
        // A peer that sent its last message and closed may be seen to
        // disconnect before that message is taken from the receive queue:
        // a receive keeps looking for a second.
        if (ep_error != UCS_OK && info && !grace) grace = now_s() + 1.0;
        bool failed = ep_error != UCS_OK && !closing && (!info || now_s() > grace);
        if (failed || now_s() > deadline) {
            status = ep_error != UCS_OK ? ep_error : UCS_ERR_TIMED_OUT;
            ucp_request_cancel(worker, req);
            while (ucp_request_check_status(req) == UCS_INPROGRESS)
                ucp_worker_progress(worker);
            break;
        }
    }
    ucp_request_free(req);
    return status;
}

static ucs_status_t wait_request(ucs_status_ptr_t req) {
    return wait_request_info(req, NULL);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)arg;
    (void)ep;
    if (!closing)
        fprintf(stderr, "ucp_sockaddr_check: endpoint error: %s\n", ucs_status_string(status));
    ep_error = status;
}

// One client per run: a second one is turned away.
static void on_conn_request(ucp_conn_request_h req, void *arg) {
    (void)arg;
    if (conn_request) {
        ucp_listener_reject(listener, req);
        return;
    }
    conn_request = req;
}

static ucs_status_t send_tag(ucp_ep_h ep, const void *buf, size_t len, ucp_tag_t tag) {
    ucp_request_param_t p = {0};
    return wait_request(ucp_tag_send_nbx(ep, buf, len, tag, &p));
}

// Receives exactly len bytes tagged tag.
static ucs_status_t recv_tag(void *buf, size_t len, ucp_tag_t tag) {
    // Filled at once when the message was already there, else by the wait.
    ucp_tag_recv_info_t info = {0};
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO,
                             .recv_info.tag_info = &info};
    ucs_status_t st =
        wait_request_info(ucp_tag_recv_nbx(worker, buf, len, tag, ~(ucp_tag_t)0, &p), &info);
    if (st == UCS_OK && info.length != len) {
        fprintf(stderr, "ucp_sockaddr_check: tag %#" PRIx64 ": %zu bytes, expected %zu\n",
                (uint64_t)tag, info.length, len);
        return UCS_ERR_MESSAGE_TRUNCATED;
    }
    return st;
}

static void close_ep(ucp_ep_h ep) {
    ucp_request_param_t p = {0};
    closing = 1;
    (void)wait_request(ucp_ep_close_nbx(ep, &p));
}

static int run_server(ucp_ep_h ep) {
    uint8_t *buf = malloc(REGION);
    uint8_t *region = NULL;
    ucp_mem_h memh = NULL;
    struct region_msg msg = {0};
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucs_status_t st;
    int rc = EXIT_UCX, bad = 0;
    int32_t verdict;

    if (!buf) goto out;
    for (unsigned k = 0; k < NSIZES; k++) {
        if ((st = recv_tag(buf, sizes[k], TAG_PING + k)) != UCS_OK) {
            rc = fail("receiving a ping", st);
            goto out;
        }
        bad |= check(buf, sizes[k], k, "ping");
        fill(buf, sizes[k], k + 100);
        if ((st = send_tag(ep, buf, sizes[k], TAG_PONG + k)) != UCS_OK) {
            rc = fail("sending a pong", st);
            goto out;
        }
    }

    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length = REGION,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    if ((st = ucp_mem_map(context, &mp, &memh)) != UCS_OK) {
        rc = fail("ucp_mem_map", st);
        goto out;
    }
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    if ((st = ucp_mem_query(memh, &ma)) != UCS_OK) {
        rc = fail("ucp_mem_query", st);
        goto out;
    }
    region = ma.address;
    memset(region, 0, REGION);
    if ((st = ucp_rkey_pack(context, memh, &rkey, &rkey_len)) != UCS_OK) {
        rc = fail("ucp_rkey_pack", st);
        goto out;
    }
    if (rkey_len > MAX_RKEY) {
        fprintf(stderr, "ucp_sockaddr_check: packed rkey of %zu bytes\n", rkey_len);
        goto out;
    }
    msg.addr = (uint64_t)(uintptr_t)region;
    msg.len = REGION;
    msg.rkey_len = (uint32_t)rkey_len;
    memcpy(msg.rkey, rkey, rkey_len);
    if ((st = send_tag(ep, &msg, sizeof msg, TAG_REGION)) != UCS_OK) {
        rc = fail("sending the region", st);
        goto out;
    }
    // DONE: the client's puts are flushed (it carries the client's own
    // verdict, which the client acts on itself).
    if ((st = recv_tag(&verdict, sizeof verdict, TAG_DONE)) != UCS_OK) {
        rc = fail("receiving DONE", st);
        goto out;
    }
    // What the client's two puts leave: see run_client.
    uint8_t *want = malloc(REGION);
    if (!want) goto out;
    fill(want, REGION, 7);
    memmove(want + 4099, want + REGION / 2, REGION / 3);
    for (size_t i = 0; i < REGION && !bad; i++) {
        if (region[i] != want[i]) {
            fprintf(stderr, "ucp_sockaddr_check: server region byte %zu is %#x, expected %#x\n", i,
                    region[i], want[i]);
            bad = EXIT_MISMATCH;
        }
    }
    free(want);
    verdict = bad ? EXIT_MISMATCH : 0;
    if ((st = send_tag(ep, &verdict, sizeof verdict, TAG_VERDICT)) != UCS_OK) {
        rc = fail("sending the verdict", st);
        goto out;
    }
    rc = bad ? EXIT_MISMATCH : 0;
    if (!rc) printf("server: %zu tagged messages and the %d-byte region checked\n", NSIZES, REGION);
out:
    if (rkey) ucp_rkey_buffer_release(rkey);
    if (memh) ucp_mem_unmap(context, memh);
    free(buf);
    return rc;
}

static int run_client(ucp_ep_h ep) {
    uint8_t *buf = malloc(REGION), *back = malloc(REGION);
    struct region_msg msg;
    ucp_rkey_h rkey = NULL;
    ucp_request_param_t p = {0};
    ucs_status_t st;
    int rc = EXIT_UCX, bad = 0;
    int32_t verdict = -1;

    if (!buf || !back) goto out;
    for (unsigned k = 0; k < NSIZES; k++) {
        fill(buf, sizes[k], k);
        if ((st = send_tag(ep, buf, sizes[k], TAG_PING + k)) != UCS_OK) {
            rc = fail("sending a ping", st);
            goto out;
        }
        memset(buf, 0, sizes[k]);
        if ((st = recv_tag(buf, sizes[k], TAG_PONG + k)) != UCS_OK) {
            rc = fail("receiving a pong", st);
            goto out;
        }
        bad |= check(buf, sizes[k], k + 100, "pong");
    }
    if (!bad) printf("client: %zu tagged messages each way, 1 B to 1 MiB, checked\n", NSIZES);

    if ((st = recv_tag(&msg, sizeof msg, TAG_REGION)) != UCS_OK) {
        rc = fail("receiving the region", st);
        goto out;
    }
    if (msg.len != REGION || msg.rkey_len > MAX_RKEY) {
        fprintf(stderr, "ucp_sockaddr_check: bad region message\n");
        goto out;
    }
    if ((st = ucp_ep_rkey_unpack(ep, msg.rkey, &rkey)) != UCS_OK) {
        rc = fail("ucp_ep_rkey_unpack", st);
        goto out;
    }
    // The whole region, then a third of it again at an unaligned offset, from
    // another part of the source: the server knows both and checks the result.
    fill(buf, REGION, 7);
    if ((st = wait_request(ucp_put_nbx(ep, buf, REGION, msg.addr, rkey, &p))) != UCS_OK) {
        rc = fail("ucp_put_nbx", st);
        goto out;
    }
    if ((st = wait_request(
             ucp_put_nbx(ep, buf + REGION / 2, REGION / 3, msg.addr + 4099, rkey, &p))) != UCS_OK) {
        rc = fail("ucp_put_nbx", st);
        goto out;
    }
    if ((st = wait_request(ucp_ep_flush_nbx(ep, &p))) != UCS_OK) {
        rc = fail("ucp_ep_flush_nbx", st);
        goto out;
    }
    memset(back, 0, REGION);
    if ((st = wait_request(ucp_get_nbx(ep, back, REGION, msg.addr, rkey, &p))) != UCS_OK) {
        rc = fail("ucp_get_nbx", st);
        goto out;
    }
    memmove(buf + 4099, buf + REGION / 2, REGION / 3);
    for (size_t i = 0; i < REGION; i++) {
        if (back[i] != buf[i]) {
            fprintf(stderr, "ucp_sockaddr_check: got %#x back at byte %zu, put %#x\n", back[i], i,
                    buf[i]);
            bad = EXIT_MISMATCH;
            break;
        }
    }
    if (!bad) printf("client: put, flushed and got back %d bytes, equal\n", REGION);
    verdict = bad;
    if ((st = send_tag(ep, &verdict, sizeof verdict, TAG_DONE)) != UCS_OK) {
        rc = fail("sending DONE", st);
        goto out;
    }
    if ((st = recv_tag(&verdict, sizeof verdict, TAG_VERDICT)) != UCS_OK) {
        rc = fail("receiving the verdict", st);
        goto out;
    }
    if (verdict != 0) {
        fprintf(stderr, "ucp_sockaddr_check: the server found its region wrong\n");
        bad = EXIT_MISMATCH;
    }
    rc = bad ? EXIT_MISMATCH : 0;
out:
    if (rkey) ucp_rkey_destroy(rkey);
    free(back);
    free(buf);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
        return EXIT_USAGE;
    }
    int server = strcmp(argv[1], "server") == 0;
    /* IPv4 or IPv6, as UCX's rdmacm connection manager takes either. */
    struct sockaddr_storage sa = {0};
    socklen_t sa_len;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&sa;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&sa;
    uint16_t port = htons((uint16_t)atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = port;
        sa_len = sizeof *in4;
    } else if (inet_pton(AF_INET6, argv[2], &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = port;
        sa_len = sizeof *in6;
    } else {
        fprintf(stderr, "ucp_sockaddr_check: %s is not an IPv4 or IPv6 address\n", argv[2]);
        return EXIT_USAGE;
    }

    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                           .features = UCP_FEATURE_TAG | UCP_FEATURE_RMA};
    ucs_status_t st = ucp_init(&params, NULL, &context);
    if (st != UCS_OK) return fail("ucp_init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(context, &wp, &worker)) != UCS_OK)
        return fail("ucp_worker_create", st);

    ucp_ep_h ep = NULL;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error},
    };
    int rc = EXIT_UCX;
    if (server) {
        ucp_listener_params_t lp = {
            .field_mask =
                UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
            .sockaddr = {.addr = (const struct sockaddr *)&sa, .addrlen = sa_len},
            .conn_handler = {.cb = on_conn_request},
        };
        if ((st = ucp_listener_create(worker, &lp, &listener)) != UCS_OK) {
            rc = fail("ucp_listener_create", st);
            goto out;
        }
        printf("listening on %s:%s\n", argv[2], argv[3]);
        fflush(stdout);
        double deadline = now_s() + TIMEOUT_S;
        while (!conn_request && now_s() < deadline)
            ucp_worker_progress(worker);
        if (!conn_request) {
            fprintf(stderr, "ucp_sockaddr_check: no client within %d s\n", TIMEOUT_S);
            goto out;
        }
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep_params.conn_request = conn_request;
    } else {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep_params.sockaddr.addr = (const struct sockaddr *)&sa;
        ep_params.sockaddr.addrlen = sa_len;
    }
    if ((st = ucp_ep_create(worker, &ep_params, &ep)) != UCS_OK) {
        rc = fail("ucp_ep_create", st);
        goto out;
    }
    rc = server ? run_server(ep) : run_client(ep);
    // Only now is the endpoint's configuration final (the client's lanes are
    // chosen once the server's reply arrives).
    ucp_ep_print_info(ep, stdout);
    close_ep(ep);
out:
    if (listener) ucp_listener_destroy(listener);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return rc;
}
