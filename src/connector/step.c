/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Forward steps (layer-wise streaming): prefill opens a step per forward
 * pass, marks its layers ready one by one, and ends it; the chunks given
 * with the step are written layer group by layer group as they become
 * ready (prefill.c asks kvtc__step_state()).
 */
#include <stdlib.h>

#include "conn_int.h"

static kvtc__step_t *step_find(kvt_conn_h c, uint64_t id, size_t *idx_p)
{
    for (size_t i = 0; i < c->nsteps; i++) {
        if (c->steps[i].id == id) {
            if (idx_p)
                *idx_p = i;
            return &c->steps[i];
        }
    }
    return NULL;
}

void kvtc__step_state(kvt_conn_h c, uint64_t step, uint32_t *ready_p,
                      int *aux_p)
{
    kvtc__step_t *s = step ? step_find(c, step, NULL) : NULL;

    *ready_p = s ? s->ready : c->lay.nlayers;
    *aux_p = s == NULL;
}

kvt_status_t kvt_conn_step_begin(kvt_conn_h c, uint64_t *step_p)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;

    if (c == NULL || step_p == NULL || c->role != KVT_ROLE_PREFILL)
        return st;
    pthread_mutex_lock(&c->lock);
    if (c->nsteps == c->cap_steps) {
        size_t cap = c->cap_steps ? 2 * c->cap_steps : 8;
        kvtc__step_t *s = realloc(c->steps, cap * sizeof(*s));
        if (s == NULL) {
            st = KVT_ERR_NO_MEMORY;
            goto out;
        }
        c->steps = s;
        c->cap_steps = cap;
    }
    c->steps[c->nsteps++] = (kvtc__step_t){++c->next_step, 0};
    *step_p = c->next_step;
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_conn_layer_ready(kvt_conn_h c, uint64_t step, uint32_t layer)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;
    kvtc__step_t *s;

    if (c == NULL || c->role != KVT_ROLE_PREFILL || layer >= c->lay.nlayers)
        return st;
    pthread_mutex_lock(&c->lock);
    if (step == 0 || step > c->next_step)
        goto out;
    s = step_find(c, step, NULL);
    if (s != NULL && s->ready < layer + 1) {
        s->ready = layer + 1;
        kvtc__conn_wake(c);
    }
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvt_status_t kvt_conn_step_end(kvt_conn_h c, uint64_t step)
{
    kvt_status_t st = KVT_ERR_INVALID_PARAM;
    size_t i;

    if (c == NULL || c->role != KVT_ROLE_PREFILL)
        return st;
    pthread_mutex_lock(&c->lock);
    if (step == 0 || step > c->next_step)
        goto out;
    if (step_find(c, step, &i) != NULL) {
        c->steps[i] = c->steps[--c->nsteps];
        kvtc__conn_wake(c);
    }
    st = KVT_OK;
out:
    pthread_mutex_unlock(&c->lock);
    return st;
}
