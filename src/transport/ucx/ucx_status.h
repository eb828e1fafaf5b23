/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TRANSPORT_UCX_UCX_STATUS_H
#define KVT_TRANSPORT_UCX_UCX_STATUS_H

/*
 * The status a ucx unit of work reports to its descriptors when it ends
 * (unit_finish() in ucx_data.c). Kept apart from ucx.h (no UCX types) so
 * that tests/unit/test_ucx_status.c checks the rule without a UCX build.
 *
 * @failed: the session's failure (KVT_OK while it stands; KVT_ERR_CANCELED
 * when its own user closed it); @st: the first failure of the unit's own
 * requests; @epoch: the unit is an epoch (puts and the flush that answers
 * for them); @posted: all its requests were posted.
 *
 * - Once the session failed, a unit that failed reports the session's
 *   failure, and so does an epoch that ends, whatever its flush said: ucp
 *   can report a flush done as it purges a failed endpoint, so those puts
 *   are not trusted to have landed.
 * - A session closed by its user fails no epoch whose flush was posted:
 *   that flush still answers for its puts.
 * - A unit not wholly posted that saw no failure of its own ends with the
 *   session's failure, or KVT_ERR_CANCELED.
 */
#include <kvt/status.h>

static inline kvt_status_t kvt__ucx_unit_status(kvt_status_t failed,
                                                kvt_status_t st, int epoch,
                                                int posted)
{
    if (failed != KVT_OK &&
        (st != KVT_OK || (epoch && failed != KVT_ERR_CANCELED)))
        return failed;
    if (st == KVT_OK && !posted)
        return failed != KVT_OK ? failed : KVT_ERR_CANCELED;
    return st;
}

#endif
