/* SPDX-License-Identifier: MIT */
/* The RMA fixture shared by ft_rma.c, ft_pmof.c and ft_tagged.c: a pair, a
 * local buffer on the client and a remotely accessible one on the server. */
#ifndef PMOF_FT_RMA_H
#define PMOF_FT_RMA_H

#include "fabtest.h"

struct ft_rma {
    struct ft_pair p;
    struct ft_side *c, *s; /* initiator, target */
    struct ft_buf loc, tgt;
};

int ft_rma_open(struct ft_run *r, struct ft_rma *e, const struct ft_pair_cfg *cfg, size_t len,
                uint64_t tgt_flags);
int ft_rma_close(struct ft_run *r, struct ft_rma *e, int ret);
/* Waits, progressing, until buf holds the pattern; fails on the timeout. */
int ft_wait_pattern(struct ft_pair *p, const void *buf, size_t len, unsigned seed,
                    const char *what);

#endif /* PMOF_FT_RMA_H */
