/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The proof of the shared secret on ucx's own handshake (docs/ucx.md,
 * docs/security.md). The descriptor that names a target's worker is only
 * handed out after the control plane's handshake; this keeps a peer that
 * found the worker's address some other way from opening a session (and
 * sending notifications) without the token. HELLO carries the
 * initiator's nonce after its worker's address; the target answers
 * HELLO_ACK with its nonce and its MAC; the initiator answers AUTH with
 * its MAC; the target answers HELLO_ACK with AUTHED (or REFUSED).
 */
#include "transport/ucx/ucx.h"
#include "util/auth.h"

void kvt__ucx_auth_mac(const kvt__engine_cfg_t *cfg, int target,
                       const void *iaddr, size_t ilen, const void *taddr,
                       size_t tlen, const uint8_t *nonce_i,
                       const uint8_t *nonce_t, uint64_t gen, uint8_t *out)
{
    struct iovec p[5] = {{(void *)iaddr, ilen},
                         {(void *)taddr, tlen},
                         {(void *)nonce_i, UCX_NONCE_LEN},
                         {(void *)nonce_t, UCX_NONCE_LEN},
                         {&gen, sizeof(gen)}};

    kvt__auth_mac(&cfg->auth,
                  target ? "kvt-ucx-v1 target" : "kvt-ucx-v1 initiator", p, 5,
                  out);
}
