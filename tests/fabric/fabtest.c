/* SPDX-License-Identifier: MIT */
/*
 * pmof_fabtest -p PROV [-e msg|rdm] [-a ADDR] [-l] [TEST...]
 *
 * TAP output, one line per test; exit status 0 only if none failed.
 * A TEST argument selects the tests whose name equals it or starts with it
 * followed by '.', so `msg` runs the whole msg group.
 */
#include "fabtest.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct ft_test *const groups[] = {
    ft_info_tests,   ft_object_tests, ft_msg_tests,    ft_rma_tests,
    ft_atomic_tests, ft_pmof_tests,   ft_tagged_tests,
};

static void vappend(char *dst, size_t size, const char *fmt, va_list ap) {
    size_t used = strlen(dst);

    if (used && used + 2 < size) {
        strcat(dst, "; ");
        used += 2;
    }
    if (used < size) vsnprintf(dst + used, size - used, fmt, ap);
}

int ft_failf(struct ft_run *r, const char *file, int line, const char *fmt, ...) {
    va_list ap;

    /* The first failure is the cause; later ones are mostly its echo. */
    if (r->reason[0]) return FT_FAIL;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    size_t used = strlen(r->reason);
    snprintf(r->reason + used, sizeof(r->reason) - used, " (%s:%d)", base ? base + 1 : file, line);
    return FT_FAIL;
}

int ft_skip(struct ft_run *r, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    return FT_SKIP;
}

void ft_note(struct ft_run *r, const char *fmt, ...) {
    va_list ap;

    va_start(ap, fmt);
    vappend(r->note, sizeof(r->note), fmt, ap);
    va_end(ap);
}

void ft_diag(const char *fmt, ...) {
    va_list ap;

    fputs("# ", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s -p PROV [-e msg|rdm] [-a ADDR] [-l] [TEST...]\n"
            "  -p PROV  provider name every info must carry (e.g. pmof, tcp, \"tcp;ofi_rxm\")\n"
            "  -e TYPE  endpoint type: msg (default) or rdm\n"
            "  -a ADDR  local IP address both endpoints use (default 127.0.0.1)\n"
            "  -l       list the test names and exit\n"
            "  TEST     a test name or group prefix (default: all)\n",
            argv0);
}

static int parse_opts(int argc, char **argv, struct ft_opts *o, bool *list) {
    int c;

    while ((c = getopt(argc, argv, "p:e:a:lh")) != -1) {
        switch (c) {
        case 'p':
            o->prov = optarg;
            break;
        case 'a':
            o->addr = optarg;
            break;
        case 'l':
            *list = true;
            break;
        case 'e':
            if (!strcmp(optarg, "msg")) {
                o->ep_type = FI_EP_MSG;
            } else if (!strcmp(optarg, "rdm")) {
                o->ep_type = FI_EP_RDM;
            } else {
                fprintf(stderr, "unknown endpoint type '%s'\n", optarg);
                return -1;
            }
            break;
        default:
            return -1;
        }
    }
    if (!*list && !o->prov) {
        fprintf(stderr, "-p PROV is required\n");
        return -1;
    }
    return 0;
}

static bool selected(const char *name, int nsel, char **sel) {
    if (!nsel) return true;
    for (int i = 0; i < nsel; i++) {
        size_t n = strlen(sel[i]);
        if (!strcmp(name, sel[i]) || (!strncmp(name, sel[i], n) && name[n] == '.')) return true;
    }
    return false;
}

/* Every selection must name something, or a typo would pass silently. */
static int check_selection(int nsel, char **sel) {
    for (int i = 0; i < nsel; i++) {
        bool found = false;
        for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
            for (const struct ft_test *t = groups[g]; t->name; t++)
                found = found || selected(t->name, 1, &sel[i]);
        if (!found) {
            fprintf(stderr, "no test matches '%s' (see -l)\n", sel[i]);
            return -1;
        }
    }
    return 0;
}

static int report(int n, const struct ft_test *t, int res, const struct ft_run *r) {
    if (res == FT_OK && r->note[0])
        printf("ok %d - %s # note: %s\n", n, t->name, r->note);
    else if (res == FT_OK)
        printf("ok %d - %s\n", n, t->name);
    else if (res == FT_SKIP)
        printf("ok %d - %s # skip %s\n", n, t->name, r->reason);
    else
        printf("not ok %d - %s: %s%s%s\n", n, t->name, r->reason[0] ? r->reason : "failed",
               r->note[0] ? " # note: " : "", r->note);
    fflush(stdout);
    return res;
}

int main(int argc, char **argv) {
    struct ft_opts opts = {.ep_type = FI_EP_MSG, .addr = "127.0.0.1"};
    bool list = false;
    int counts[3] = {0};
    int n = 0;

    if (parse_opts(argc, argv, &opts, &list)) {
        usage(argv[0]);
        return 2;
    }
    int nsel = argc - optind;
    char **sel = argv + optind;
    if (check_selection(nsel, sel)) return 2;
    for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
        for (const struct ft_test *t = groups[g]; t->name; t++) {
            if (!selected(t->name, nsel, sel)) continue;
            if (list) {
                puts(t->name);
                continue;
            }
            struct ft_run run = {.opts = &opts};
            if (!n)
                printf("# provider %s, %s endpoints, address %s\n", opts.prov,
                       ft_ep_name(opts.ep_type), opts.addr);
            counts[report(++n, t, t->fn(&run), &run)]++;
        }
    }
    if (list) return 0;
    printf("1..%d\n", n);
    printf("# %d passed, %d failed, %d skipped\n", counts[FT_OK], counts[FT_FAIL], counts[FT_SKIP]);
    return counts[FT_FAIL] ? 1 : 0;
}
