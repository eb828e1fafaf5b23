/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefill topology as decode learns it from a bootstrap server: per
 * prefill instance its sizes, then the address of each rank a room
 * needs, looked up by the slow thread (the lock released meanwhile) with
 * a backoff after failures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"

kvtc__topo_t *kvtc__topo_get(kvt_conn_h c, const char *server)
{
    kvtc__topo_t *t;

    for (t = c->topos; t != NULL; t = t->next)
        if (strcmp(t->server, server) == 0)
            return t;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    snprintf(t->server, sizeof(t->server), "%s", server);
    t->backoff_ms = 50;
    t->next = c->topos;
    c->topos = t;
    pthread_cond_signal(&c->slow_cv);
    return t;
}

/* A session to @name died: the next room looks the instance up again, in
 * case the prefill rank restarted elsewhere. */
void kvtc__topo_forget(kvt_conn_h c, const char *name)
{
    for (kvtc__topo_t *t = c->topos; t != NULL; t = t->next) {
        if (t->state != KVTC__TOPO_OK)
            continue;
        for (uint32_t i = 0; i < t->tp_total; i++) {
            if (strcmp(t->names[i], name) == 0) {
                t->state = KVTC__TOPO_NONE;
                break;
            }
        }
    }
}

void kvtc__topo_free_all(kvt_conn_h c)
{
    while (c->topos != NULL) {
        kvtc__topo_t *t = c->topos;
        c->topos = t->next;
        free(t->names);
        free(t->need);
        free(t);
    }
}

static void topo_error(kvtc__topo_t *t, kvt_status_t st, const char *why)
{
    t->err = st;
    snprintf(t->why, sizeof(t->why), "%s", why);
    t->t_retry = kvtc__conn_now_ms() + t->backoff_ms;
    if (t->backoff_ms < 1000)
        t->backoff_ms *= 2;
}

/* Fetch the sizes (the lock released). */
static void topo_fetch_sizes(kvt_conn_h c, kvt_bootc_h bc, kvtc__topo_t *t)
{
    char server[KVTC__NAME_MAX], why[KVTC__WHY_MAX] = "";
    uint32_t tp = 0, dp = 0;
    kvt_status_t st = KVT_ERR_NOT_SUPPORTED;

    t->state = KVTC__TOPO_FETCHING;
    snprintf(server, sizeof(server), "%s", t->server);
    pthread_mutex_unlock(&c->lock);
    if (bc != NULL)
        st = kvt_bootc_sizes(bc, server, &tp, &dp, KVTC__HTTP_TIMEOUT_MS, why,
                             sizeof(why));
    else
        snprintf(why, sizeof(why),
                 "no bootstrap client: built without "
                 "libcurl and json-c");
    pthread_mutex_lock(&c->lock);
    if (st == KVT_OK) {
        char(*names)[KVTC__NAME_MAX] = calloc(tp, sizeof(*names));
        uint8_t *need = calloc(tp, 1);
        if (names == NULL || need == NULL) {
            free(names);
            free(need);
            st = KVT_ERR_NO_MEMORY;
            snprintf(why, sizeof(why), "out of memory");
        } else {
            free(t->names);
            free(t->need);
            t->names = names;
            t->need = need;
            t->tp_total = tp;
            t->dp = dp;
            t->state = KVTC__TOPO_OK;
            t->backoff_ms = 50;
            t->t_retry = 0;
            t->why[0] = '\0';
            return;
        }
    }
    t->state = KVTC__TOPO_ERR;
    topo_error(t, st, why);
}

/* Look up the ranks rooms need (the lock released during each). */
static void topo_fetch_ranks(kvt_conn_h c, kvt_bootc_h bc, kvtc__topo_t *t)
{
    uint32_t P = t->tp_total / t->dp;

    t->fetching = 1;
    for (uint32_t i = 0; i < t->tp_total && t->state == KVTC__TOPO_OK; i++) {
        char server[KVTC__NAME_MAX], name[KVTC__NAME_MAX];
        char why[KVTC__WHY_MAX] = "";
        kvt_status_t st;
        if (!t->need[i] || t->names[i][0] != '\0')
            continue;
        snprintf(server, sizeof(server), "%s", t->server);
        pthread_mutex_unlock(&c->lock);
        st = kvt_bootc_route(bc, server, i % P, i / P, name, sizeof(name),
                             KVTC__HTTP_TIMEOUT_MS, why, sizeof(why));
        pthread_mutex_lock(&c->lock);
        if (t->state != KVTC__TOPO_OK)
            break;
        if (st != KVT_OK) {
            topo_error(t, st, why);
            break;
        }
        snprintf(t->names[i], sizeof(t->names[i]), "%s", name);
        t->need[i] = 0;
        t->backoff_ms = 50;
        t->why[0] = '\0';
    }
    t->fetching = 0;
}

static int topo_wants_ranks(const kvtc__topo_t *t, uint64_t now)
{
    if (t->state != KVTC__TOPO_OK || t->fetching || now < t->t_retry)
        return 0;
    for (uint32_t i = 0; i < t->tp_total; i++)
        if (t->need[i] && t->names[i][0] == '\0')
            return 1;
    return 0;
}

int kvtc__topo_fetch(kvt_conn_h c, kvt_bootc_h bc, uint64_t now)
{
    kvtc__topo_t *t;

    for (t = c->topos; t != NULL; t = t->next)
        if (t->state == KVTC__TOPO_NONE ||
            (t->state == KVTC__TOPO_ERR && now >= t->t_retry) ||
            topo_wants_ranks(t, now))
            break;
    if (t == NULL)
        return 0;
    if (t->state == KVTC__TOPO_OK)
        topo_fetch_ranks(c, bc, t);
    else
        topo_fetch_sizes(c, bc, t);
    return 1;
}
