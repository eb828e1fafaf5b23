/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_TESTS_ENGINE_TEST_H
#define KVT_TESTS_ENGINE_TEST_H

/* White-box access to an engine's transports, for tests that look at
 * their state. Needs the internal headers (kvt_internal). */
#include <stdint.h>

#include "core/engine_int.h"

/* @e's transport @id (KVT_TRANSPORT_*), or NULL when it has none. Its
 * structure is the transport's own (kvt__tcp_t, kvt__shm_t, ...), which
 * begins with the kvt__tl_t. */
static inline kvt__tl_t *kvt_test_tl(kvt_engine_h e, uint32_t id)
{
    for (unsigned i = 0; i < e->ntl; i++)
        if (e->tl[i]->ops->id == id)
            return e->tl[i];
    return NULL;
}

#endif
