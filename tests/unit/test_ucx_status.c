/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The status a ucx unit of work reports when it ends
 * (src/transport/ucx/ucx_status.h), case by case. The rule needs no UCX, so
 * this runs in every build. Among the cases: an epoch whose flush ucp
 * reported done after the session failed reports the failure, not
 * KVT_OK (ucp can report a flush done as it purges a failed endpoint;
 * conformance over ucx's sm saw such a write to a killed peer return
 * KVT_OK), while a session closed by its own user keeps the flush's word.
 */
#include "kvt_test.h"
#include "transport/ucx/ucx_status.h"

enum { GET = 0, EPOCH = 1 };

typedef struct {
    kvt_status_t failed, st;
    int epoch, posted;
    kvt_status_t want;
} rule_case_t;

static const rule_case_t cases[] = {
    /* The session stands: a unit's own result stands; one not wholly
     * posted with no failure of its own is canceled. */
    {KVT_OK, KVT_OK, EPOCH, 1, KVT_OK},
    {KVT_OK, KVT_OK, GET, 1, KVT_OK},
    {KVT_OK, KVT_ERR_CONN_LOST, EPOCH, 1, KVT_ERR_CONN_LOST},
    {KVT_OK, KVT_ERR_ACCESS, GET, 1, KVT_ERR_ACCESS},
    {KVT_OK, KVT_OK, EPOCH, 0, KVT_ERR_CANCELED},
    {KVT_OK, KVT_ERR_NO_MEMORY, GET, 0, KVT_ERR_NO_MEMORY},
    /* The session failed: an epoch whose flush said done is not trusted,
     * posted or not, and a failure of its own gives way to the
     * session's. */
    {KVT_ERR_CONN_LOST, KVT_OK, EPOCH, 1, KVT_ERR_CONN_LOST},
    {KVT_ERR_TIMEDOUT, KVT_OK, EPOCH, 1, KVT_ERR_TIMEDOUT},
    {KVT_ERR_ACCESS, KVT_OK, EPOCH, 1, KVT_ERR_ACCESS},
    {KVT_ERR_CONN_LOST, KVT_OK, EPOCH, 0, KVT_ERR_CONN_LOST},
    {KVT_ERR_CONN_LOST, KVT_ERR_IO, EPOCH, 1, KVT_ERR_CONN_LOST},
    /* A get whose request completed has its bytes in local memory. */
    {KVT_ERR_CONN_LOST, KVT_OK, GET, 1, KVT_OK},
    {KVT_ERR_CONN_LOST, KVT_ERR_IO, GET, 1, KVT_ERR_CONN_LOST},
    {KVT_ERR_CONN_LOST, KVT_OK, GET, 0, KVT_ERR_CONN_LOST},
    /* Closed by its user: a posted flush answers for its puts; what was
     * never posted is canceled. */
    {KVT_ERR_CANCELED, KVT_OK, EPOCH, 1, KVT_OK},
    {KVT_ERR_CANCELED, KVT_OK, EPOCH, 0, KVT_ERR_CANCELED},
    {KVT_ERR_CANCELED, KVT_ERR_CONN_LOST, EPOCH, 1, KVT_ERR_CANCELED},
    {KVT_ERR_CANCELED, KVT_OK, GET, 1, KVT_OK},
};

KVT_TEST(rule)
{
    int bad = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const rule_case_t *c = &cases[i];
        kvt_status_t got =
            kvt__ucx_unit_status(c->failed, c->st, c->epoch, c->posted);
        if (got != c->want) {
            fprintf(stderr,
                    "case %zu: session %s, unit %s, %s, %s: got %s, "
                    "expected %s\n",
                    i, kvt_status_name(c->failed), kvt_status_name(c->st),
                    c->epoch ? "epoch" : "get",
                    c->posted ? "posted" : "not posted", kvt_status_name(got),
                    kvt_status_name(c->want));
            bad++;
        }
    }
    CHECK(bad == 0);
}

KVT_TEST_MAIN(KVT_CASE(rule, 10))
