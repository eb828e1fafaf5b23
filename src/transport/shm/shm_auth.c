/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shm socket's proof of the shared secret (docs/shm.md, Rendezvous;
 * docs/security.md): the same challenge and response as the control
 * plane's handshake, over the socket's fixed-size messages. The
 * initiator's HELLO says it holds a token (id 1) and carries its nonce in
 * the handle; the target answers CHALLENGE (its nonce and MAC in the
 * handle), the initiator AUTH (its MAC), and only then does the target
 * create the channel. The MACs cover both nonces, both segment names and
 * both pids, each under its own direction's label.
 */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/shm/shm.h"
#include "util/auth.h"
#include "util/log.h"

#define TARGET_LABEL "kvt-shm-v1 target"
#define INITIATOR_LABEL "kvt-shm-v1 initiator"

typedef struct {
    char name_i[KVT_WIRE_NAME_MAX + 1];
    uint32_t pid_i, pid_t_;
    uint8_t nonce_i[KVT_AUTH_NONCE_LEN];
    uint8_t nonce_t[KVT_AUTH_NONCE_LEN];
} transcript_t;

static void mac_of(const kvt__auth_t *a, const char *label,
                   const transcript_t *t, const char *name_t,
                   uint8_t out[KVT_AUTH_MAC_LEN])
{
    struct iovec p[6] = {{(void *)t->name_i, strlen(t->name_i)},
                         {(void *)name_t, strlen(name_t)},
                         {(void *)&t->pid_i, sizeof(t->pid_i)},
                         {(void *)&t->pid_t_, sizeof(t->pid_t_)},
                         {(void *)t->nonce_i, KVT_AUTH_NONCE_LEN},
                         {(void *)t->nonce_t, KVT_AUTH_NONCE_LEN}};
    kvt__auth_mac(a, label, p, 6, out);
}

static int verify(const kvt__auth_t *a, const transcript_t *t,
                  const char *name_t, const uint8_t *mac)
{
    uint8_t want[KVT_AUTH_MAC_LEN];
    int ok;

    mac_of(a, INITIATOR_LABEL, t, name_t, want);
    ok = kvt__ct_equal(want, mac, KVT_AUTH_MAC_LEN);
    kvt__wipe(want, sizeof(want));
    return ok;
}

int kvt__shm_auth_target(kvt__shm_t *shm, int fd, const kvt__shm_msg_t *hello,
                         kvt__shm_msg_t *ack)
{
    const kvt__auth_t *a = &shm->cfg->auth;
    kvt__shm_msg_t m;
    transcript_t t = {0};

    if (!a->on || hello->id != 1) {
        KVT_LOG_W("shm: authentication failed: %s %s", hello->name,
                  a->on ? "offers no auth token"
                        : "offers an auth token, this engine has none");
        snprintf(ack->name, sizeof(ack->name), "authentication failed: %s",
                 a->on ? "this engine requires an auth token"
                       : "this engine has no auth token set");
        ack->status = KVT_ERR_ACCESS;
        return -1;
    }
    snprintf(t.name_i, sizeof(t.name_i), "%s", hello->name);
    t.pid_i = hello->pid;
    t.pid_t_ = (uint32_t)getpid();
    memcpy(t.nonce_i, hello->handle, KVT_AUTH_NONCE_LEN);
    if (kvt__auth_random(t.nonce_t, KVT_AUTH_NONCE_LEN) != KVT_OK)
        return -2;
    kvt__shm_msg_init(&m, KVT_SHM_CHALLENGE);
    m.pid = t.pid_t_;
    memcpy(m.handle, t.nonce_t, KVT_AUTH_NONCE_LEN);
    mac_of(a, TARGET_LABEL, &t, shm->cfg->seg_name,
           m.handle + KVT_AUTH_NONCE_LEN);
    if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m) ||
        recv(fd, &m, sizeof(m), 0) != (ssize_t)sizeof(m) ||
        m.magic != KVT_SHM_MAGIC || m.type != KVT_SHM_AUTH)
        return -2;
    if (!verify(a, &t, shm->cfg->seg_name, m.handle)) {
        KVT_LOG_W("shm: authentication failed: %s did not prove the auth "
                  "token (another token?)",
                  t.name_i);
        snprintf(ack->name, sizeof(ack->name),
                 "authentication failed: wrong auth token");
        ack->status = KVT_ERR_ACCESS;
        return -1;
    }
    return 0;
}

void kvt__shm_auth_hello(const kvt__shm_t *shm, kvt__shm_msg_t *hello)
{
    if (!shm->cfg->auth.on)
        return;
    hello->id = 1;
    if (kvt__auth_random(hello->handle, KVT_AUTH_NONCE_LEN) != KVT_OK)
        hello->id = 0; /* the target refuses: no proof without a nonce */
}

kvt_status_t kvt__shm_auth_initiator(const kvt__shm_t *shm, int sock,
                                     const kvt__shm_msg_t *hello,
                                     const char *name_t, uint32_t pid_t_,
                                     const kvt__shm_msg_t *chal,
                                     const char **why)
{
    const kvt__auth_t *a = &shm->cfg->auth;
    uint8_t want[KVT_AUTH_MAC_LEN];
    kvt__shm_msg_t m;
    transcript_t t = {0};

    if (chal->type != KVT_SHM_CHALLENGE) {
        *why = "authentication failed: the peer does not authenticate "
               "(no auth token set there)";
        return KVT_ERR_AUTH;
    }
    snprintf(t.name_i, sizeof(t.name_i), "%s", hello->name);
    t.pid_i = hello->pid;
    t.pid_t_ = pid_t_;
    memcpy(t.nonce_i, hello->handle, KVT_AUTH_NONCE_LEN);
    memcpy(t.nonce_t, chal->handle, KVT_AUTH_NONCE_LEN);
    mac_of(a, TARGET_LABEL, &t, name_t, want);
    if (chal->pid != pid_t_ ||
        !kvt__ct_equal(want, chal->handle + KVT_AUTH_NONCE_LEN,
                       KVT_AUTH_MAC_LEN)) {
        *why = "authentication failed: the peer did not prove the auth "
               "token (another token?)";
        return KVT_ERR_AUTH;
    }
    kvt__shm_msg_init(&m, KVT_SHM_AUTH);
    mac_of(a, INITIATOR_LABEL, &t, name_t, m.handle);
    if (send(sock, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m)) {
        *why = "no answer to the shm handshake";
        return KVT_ERR_PROTOCOL;
    }
    return KVT_OK;
}
