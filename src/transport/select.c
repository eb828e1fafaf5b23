/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which transport carries a session, once the peer's descriptor is in:
 *
 *  - shm, when both engines allow it (KVT_TRANSPORT_SHM in their
 *    transports: the peer's descriptor has an shm section when it serves
 *    same-host peers) and the descriptor's host id, a hash of the boot id
 *    and the pid namespace, is this engine's own. The shm session
 *    verifies the rest (the socket's owner is the descriptor's pid; this
 *    process may attach to it) before it is used;
 *  - tcp otherwise.
 *
 * A peer on another host takes tcp silently (at debug level). Anything
 * else that keeps a session off shm, with shm allowed on this side, is
 * said once, when the session opens; transfers never switch transport.
 */
#include <string.h>

#include "core/engine_int.h"
#include "transport/transport.h"
#include "util/log.h"

kvt_status_t kvt__transport_open(kvt_engine_h e, kvt__seg_t *seg,
                                 kvt__session_t **s_p)
{
    kvt__session_t *s = NULL;
    const char *why = NULL;
    uint32_t offered;
    uint64_t host_id;
    uint32_t pid;

    pthread_mutex_lock(&seg->desc_lock);
    offered = seg->desc.transports;
    host_id = seg->desc.host_id;
    pid = seg->desc.pid;
    pthread_mutex_unlock(&seg->desc_lock);
    if ((e->transports & KVT_TRANSPORT_SHM) == 0) {
        /* tcp only */
    } else if (host_id != e->host_id || pid == 0) {
        KVT_LOG_D("segment %s is on another host: using tcp", seg->name);
    } else {
        if (e->shm == NULL)
            why = "this engine does not run the shm transport";
        else if ((offered & KVT_TRANSPORT_SHM) == 0)
            why = "the peer does not offer shm";
        else if (kvt__shm_open(e->shm, seg, &s, &why) == KVT_OK) {
            KVT_LOG_I("segment %s: using shm", seg->name);
            *s_p = s;
            return KVT_OK;
        }
        KVT_LOG_W("segment %s is on this host but shm is not available "
                  "(%s): falling back to tcp",
                  seg->name, why);
    }
    if ((offered & KVT_TRANSPORT_TCP) == 0) {
        KVT_LOG_E("segment %s offers no transport this engine uses",
                  seg->name);
        return KVT_ERR_NOT_SUPPORTED;
    }
    return kvt__tcp_open(e->tcp, seg, s_p);
}

kvt_status_t kvt__transport_sections(kvt_engine_h e, kvt__segdesc_t *d)
{
    kvt_status_t st = kvt__segdesc_add_tl(d, KVT_TRANSPORT_TCP, "tcp", 1,
                                          NULL, 0);

    if (st == KVT_OK && e->shm != NULL && (e->transports & KVT_TRANSPORT_SHM))
        st = kvt__shm_section(e->shm, d);
    return st;
}
