/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which transport carries a session. Every session starts as TCP (the
 * handshake and the descriptor come over it); then:
 *
 *  - shm, when both engines allow it (KVT_TRANSPORT_SHM in their
 *    transports: the peer's descriptor says whether it serves same-host
 *    peers) and the descriptor's host id, a hash of the boot id and the
 *    pid namespace, is this engine's own. The shm session verifies the
 *    rest (the socket's owner is the descriptor's pid; this process may
 *    attach to it) before it is used;
 *  - tcp otherwise.
 *
 * A peer on another host takes TCP silently (at debug level). Anything
 * else that keeps a session off shm, with shm allowed on this side, is
 * said once, when the session opens; transfers never switch transport.
 */
#include <string.h>

#include "core/engine_int.h"
#include "transport/transport.h"
#include "util/log.h"

void kvt__transport_select(kvt_engine_h e, kvt__session_t *tcp,
                           kvt__session_t **s_p)
{
    kvt__session_t *s = NULL;
    const char *why = NULL;
    uint32_t offered;
    uint64_t host_id;
    uint32_t pid;

    *s_p = tcp;
    if ((e->transports & KVT_TRANSPORT_SHM) == 0)
        return;
    pthread_mutex_lock(&tcp->seg->desc_lock);
    offered = tcp->seg->desc.transports;
    host_id = tcp->seg->desc.host_id;
    pid = tcp->seg->desc.pid;
    pthread_mutex_unlock(&tcp->seg->desc_lock);
    if (host_id != e->host_id || pid == 0) {
        KVT_LOG_D("segment %s is on another host: using tcp", tcp->name);
        return;
    }
    if (e->shm == NULL)
        why = "this engine does not run the shm transport";
    else if ((offered & KVT_TRANSPORT_SHM) == 0)
        why = "the peer does not offer shm";
    else if (kvt__shm_open(e->shm, tcp, &s, &why) == KVT_OK)
        why = NULL;
    if (why != NULL) {
        KVT_LOG_W("segment %s is on this host but shm is not available "
                  "(%s): falling back to tcp",
                  tcp->name, why);
        return;
    }
    KVT_LOG_I("segment %s: using shm", tcp->name);
    *s_p = s;
}

uint32_t kvt__transports_offered(kvt_engine_h e)
{
    uint32_t t = KVT_TRANSPORT_TCP;

    if (e->shm != NULL && (e->transports & KVT_TRANSPORT_SHM))
        t |= KVT_TRANSPORT_SHM;
    return t;
}

