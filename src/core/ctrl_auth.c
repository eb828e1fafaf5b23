/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The handshake's proof of the shared secret (docs/protocol.md,
 * Handshake; docs/security.md), apart from the sockets so that both sides
 * of the control plane share it.
 *
 * The transcript is the HELLO body as sent (the initiator's session,
 * transport, fence, name and nonce), the target's segment name and the
 * target's nonce. The target proves the key first with the MAC labelled
 * TARGET_LABEL; the initiator answers with the one labelled
 * INITIATOR_LABEL. The labels differ so that neither MAC can be reflected
 * as the other, and each side's fresh nonce makes every MAC good for one
 * connection only.
 */
#include <string.h>

#include "core/ctrl.h"
#include "util/auth.h"

#define TARGET_LABEL "kvt-auth-v1 target"
#define INITIATOR_LABEL "kvt-auth-v1 initiator"

static void parts(struct iovec p[3], const uint8_t *hello, size_t hlen,
                  const char *name_t, const uint8_t *nonce_t)
{
    p[0] = (struct iovec){(void *)hello, hlen};
    p[1] = (struct iovec){(void *)name_t, strlen(name_t)};
    p[2] = (struct iovec){(void *)nonce_t, KVT_WIRE_NONCE_LEN};
}

kvt_status_t kvt__ctrl_auth_challenge(const kvt__auth_t *a,
                                      const uint8_t *hello, size_t hlen,
                                      const char *name_t,
                                      uint8_t nonce_t[KVT_WIRE_NONCE_LEN],
                                      uint8_t *out, size_t *len_p)
{
    struct iovec p[3];
    kvt_status_t st = kvt__auth_random(nonce_t, KVT_WIRE_NONCE_LEN);

    if (st != KVT_OK)
        return st;
    parts(p, hello, hlen, name_t, nonce_t);
    memcpy(out, nonce_t, KVT_WIRE_NONCE_LEN);
    kvt__auth_mac(a, TARGET_LABEL, p, 3, out + KVT_WIRE_NONCE_LEN);
    *len_p =
        KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN +
        kvt__wire_put_str(out + KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN, name_t);
    return KVT_OK;
}

int kvt__ctrl_auth_verify(const kvt__auth_t *a, const uint8_t *hello,
                          size_t hlen, const char *name_t,
                          const uint8_t nonce_t[KVT_WIRE_NONCE_LEN],
                          const uint8_t *body, size_t blen)
{
    struct iovec p[3];

    if (blen != KVT_WIRE_MAC_LEN)
        return 0;
    parts(p, hello, hlen, name_t, nonce_t);
    return kvt__auth_check(a, INITIATOR_LABEL, p, 3, body);
}

kvt_status_t kvt__ctrl_auth_answer(const kvt__auth_t *a, const uint8_t *hello,
                                   size_t hlen, const uint8_t *chal,
                                   size_t clen, uint8_t mac[KVT_WIRE_MAC_LEN])
{
    char name_t[KVT_WIRE_NAME_MAX + 1];
    const uint8_t *nonce_t = chal;
    struct iovec p[3];
    size_t n;

    if (clen < KVT_WIRE_CHALLENGE_MIN)
        return KVT_ERR_PROTOCOL;
    n = kvt__wire_get_str(chal + KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN,
                          clen - KVT_WIRE_NONCE_LEN - KVT_WIRE_MAC_LEN, name_t);
    if (n == 0 || KVT_WIRE_NONCE_LEN + KVT_WIRE_MAC_LEN + n != clen)
        return KVT_ERR_PROTOCOL;
    parts(p, hello, hlen, name_t, nonce_t);
    if (!kvt__auth_check(a, TARGET_LABEL, p, 3, chal + KVT_WIRE_NONCE_LEN))
        return KVT_ERR_ACCESS;
    kvt__auth_mac(a, INITIATOR_LABEL, p, 3, mac);
    return KVT_OK;
}
