/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_XFER_TEST_H
#define KVT_TESTS_XFER_TEST_H

/* Transfers for tests: one descriptor, and a batch run to its end. */
#include <stdint.h>

#include <kvt/kvt.h>

#include "kvt_test.h"

/* A descriptor of @len bytes between @local here and @remote there. */
static inline kvt_xfer_desc_t kvt_test_xd(uint32_t op, kvt_segment_t seg,
                                          void *local, uint64_t remote,
                                          uint64_t len)
{
    kvt_xfer_desc_t d = {0};

    d.opcode = op;
    d.segment = seg;
    d.local_addr = local;
    d.remote_addr = remote;
    d.length = len;
    return d;
}

/* Run @n descriptors as one batch on @e (30 s at most; a batch still in
 * progress then fails the test): the batch's status. */
static inline kvt_status_t kvt_test_xfer(kvt_engine_h e,
                                         const kvt_xfer_desc_t *d, size_t n)
{
    kvt_batch_h b;
    kvt_status_t st;

    CHECK_OK(kvt_batch_create(e, n, &b));
    CHECK_OK(kvt_batch_submit(b, d, n));
    st = kvt_batch_wait(b, 30000);
    CHECK(st != KVT_INPROGRESS);
    CHECK_OK(kvt_batch_free(b));
    return st;
}

#endif
