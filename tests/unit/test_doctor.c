/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_doctor_run() in C (kvt/doctor.h): its parameters and statuses, the
 * report's accessors and JSON, the scratch region, a healthy in-process
 * peer measured over tcp, and the capture of the library's log into the
 * checks (nothing written to stderr by the checks' own thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "core/doctor_int.h"
#include "kvt_test.h"

static const kvt_doctor_check_t *find(kvt_doctor_report_h r, const char *id)
{
    for (size_t i = 0; i < kvt_doctor_count(r); i++)
        if (strcmp(kvt_doctor_check(r, i)->id, id) == 0)
            return kvt_doctor_check(r, i);
    return NULL;
}

KVT_TEST(params)
{
    kvt_doctor_params_t p = {0};
    kvt_doctor_report_h r = NULL;

    CHECK(kvt_doctor_run(NULL, NULL) == KVT_ERR_INVALID_PARAM);
    p.field_mask = 1u << 30;
    CHECK(kvt_doctor_run(&p, &r) == KVT_ERR_INVALID_PARAM);
    p.field_mask = KVT_DOCTOR_PARAM_TIMEOUT;
    p.timeout_ms = 0;
    CHECK(kvt_doctor_run(&p, &r) == KVT_ERR_INVALID_PARAM);
    p.field_mask = KVT_DOCTOR_PARAM_TRANSPORTS;
    p.transports = 0;
    CHECK(kvt_doctor_run(&p, &r) == KVT_ERR_INVALID_PARAM);
    p.field_mask = KVT_DOCTOR_PARAM_MEM_KINDS;
    p.mem_kinds = 1u << 7;
    CHECK(kvt_doctor_run(&p, &r) == KVT_ERR_INVALID_PARAM);
    CHECK(r == NULL);
    CHECK(kvt_doctor_count(NULL) == 0);
    CHECK(kvt_doctor_check(NULL, 0) == NULL);
    CHECK(kvt_doctor_worst(NULL) == KVT_DOCTOR_OK);
    kvt_doctor_free(NULL);
    {
        char *s = NULL;
        CHECK(kvt_doctor_json(NULL, &s) == KVT_ERR_INVALID_PARAM);
    }
}

KVT_TEST(host_only)
{
    kvt_doctor_params_t p = {0};
    kvt_doctor_report_h r = NULL;
    const kvt_doctor_check_t *c;
    char *json = NULL;

    p.field_mask = KVT_DOCTOR_PARAM_LOCAL_HOST | KVT_DOCTOR_PARAM_TRANSPORTS;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP;
    CHECK_OK(kvt_doctor_run(&p, &r));
    CHECK(kvt_doctor_count(r) > 5);
    CHECK(kvt_doctor_check(r, kvt_doctor_count(r)) == NULL);
    c = find(r, "host.transport.tcp");
    CHECK(c != NULL && c->level == KVT_DOCTOR_OK && c->ms >= 0);
    c = find(r, "host.transport.shm");
    CHECK(c != NULL && c->level == KVT_DOCTOR_SKIP);
    /* Loopback is advertised: a warning with its fix, not a failure. */
    c = find(r, "host.address");
    CHECK(c != NULL && c->level == KVT_DOCTOR_WARN && c->fix != NULL);
    c = find(r, "host.listen");
    CHECK(c != NULL && c->level == KVT_DOCTOR_OK);
    CHECK(find(r, "peer.control") == NULL); /* no peer asked */
    CHECK(kvt_doctor_worst(r) == KVT_DOCTOR_WARN);
    CHECK_OK(kvt_doctor_json(r, &json));
    CHECK(strncmp(json, "{\"ok\": true, \"worst\": \"warn\", \"checks\": [",
                  41) == 0);
    CHECK(strstr(json, "\"id\": \"host.listen\"") != NULL);
    free(json);
    kvt_doctor_free(r);
}

KVT_TEST(scratch_and_peer)
{
    kvt_engine_params_t ep = {0};
    kvt_doctor_params_t p = {0};
    kvt_doctor_report_h r = NULL;
    const kvt_doctor_check_t *c;
    kvt_engine_h e;
    void *addr = NULL;

    ep.field_mask = KVT_ENGINE_PARAM_TRANSPORTS;
    ep.transports = KVT_TRANSPORT_TCP;
    CHECK_OK(kvt_engine_create(&ep, &e));
    CHECK(kvt_doctor_scratch(e, 4096, &addr) == KVT_ERR_INVALID_PARAM);
    CHECK(kvt_doctor_scratch(NULL, 0, &addr) == KVT_ERR_INVALID_PARAM);
    CHECK_OK(kvt_doctor_scratch(e, 1u << 20, &addr));
    CHECK(strncmp(addr, "kvt-doctor-scratch-1 1048576", 28) == 0);
    p.field_mask = KVT_DOCTOR_PARAM_PEER | KVT_DOCTOR_PARAM_PROBE_BYTES |
                   KVT_DOCTOR_PARAM_TRANSPORTS;
    p.peer = kvt_engine_segment_name(e);
    p.probe_bytes = 4u << 20;
    p.transports = KVT_TRANSPORT_TCP;
    CHECK_OK(kvt_doctor_run(&p, &r));
    c = find(r, "peer.handshake");
    CHECK(c != NULL && c->level == KVT_DOCTOR_OK);
    c = find(r, "peer.transfer.tcp");
    CHECK(c != NULL && c->level == KVT_DOCTOR_OK);
    CHECK(c->mbps > 0 && c->lat_us > 0);
    /* The head of the region is left alone; the rest was written. */
    CHECK(strncmp(addr, "kvt-doctor-scratch-1 1048576", 28) == 0);
    {
        static const unsigned char zero[4096];
        CHECK(memcmp((char *)addr + 4096, zero, sizeof(zero)) != 0);
    }
    kvt_doctor_free(r);
    kvt_engine_destroy(e);
}

KVT_TEST(refused_peer_named)
{
    kvt_doctor_params_t p = {0};
    kvt_doctor_report_h r = NULL;
    const kvt_doctor_check_t *c;

    p.field_mask = KVT_DOCTOR_PARAM_PEER | KVT_DOCTOR_PARAM_TIMEOUT;
    p.peer = "127.0.0.1:1";
    p.timeout_ms = 1000;
    CHECK_OK(kvt_doctor_run(&p, &r));
    c = find(r, "peer.control");
    CHECK(c != NULL && c->level == KVT_DOCTOR_FAIL);
    CHECK(c->status == KVT_ERR_UNREACHABLE);
    CHECK(strstr(c->detail, "connection refused") != NULL);
    CHECK(c->fix != NULL);
    CHECK(kvt_doctor_worst(r) == KVT_DOCTOR_FAIL);
    kvt_doctor_free(r);
    p.peer = "not a name";
    CHECK_OK(kvt_doctor_run(&p, &r));
    c = find(r, "peer.resolve");
    CHECK(c != NULL && c->level == KVT_DOCTOR_FAIL);
    kvt_doctor_free(r);
}

/* ---- The child runner (white box) ---------------------------------------- */

static void hang_in_ucx(kvt__doc_t *d)
{
    kvt__doc_add(d, "peer.control", KVT_DOCTOR_OK, KVT_OK, NULL,
                 "a peer's \x1e\x1f words stay whole");
    kvt__doc_step(d, "peer.transfer.ucx");
    for (;;)
        pause(); /* as a UCX worker stuck in connect() holds the step */
}

static void die_early(kvt__doc_t *d)
{
    kvt__doc_step(d, "peer.handshake");
    _exit(3);
}

static void finish(kvt__doc_t *d)
{
    kvt_doctor_check_t *c = kvt__doc_add(d, "peer.transfer.tcp", KVT_DOCTOR_OK,
                                         KVT_OK, NULL, "tcp: verified");
    c->mbps = 1234.5;
    kvt__doc_step(d, NULL);
}

static kvt__doc_t *doc_new(void)
{
    kvt__doc_t *d = calloc(1, sizeof(*d));
    CHECK(d != NULL);
    d->r = calloc(1, sizeof(*d->r));
    CHECK(d->r != NULL);
    d->out_fd = -1;
    return d;
}

KVT_TEST(child_runner)
{
    kvt__doc_t *d = doc_new();
    const kvt_doctor_check_t *c;
    double t0 = kvt_test_now();

    /* A step that hangs is killed after the bound and named. */
    kvt__doc_run_child(d, hang_in_ucx, 300, kvt__doc_stalled);
    CHECK(kvt_test_now() - t0 < 3.0);
    CHECK(kvt_doctor_count(d->r) == 2);
    c = kvt_doctor_check(d->r, 0);
    CHECK(strcmp(c->id, "peer.control") == 0 && c->level == KVT_DOCTOR_OK);
    CHECK(strcmp(c->detail, "a peer's ?? words stay whole") == 0);
    c = kvt_doctor_check(d->r, 1);
    CHECK(strcmp(c->id, "peer.transfer.ucx") == 0);
    CHECK(c->level == KVT_DOCTOR_FAIL && c->status == KVT_ERR_TIMEDOUT);
    CHECK(strstr(c->detail, "the data path did not") != NULL);
    CHECK(c->fix != NULL && strstr(c->fix, "UCX") != NULL);
    /* A child that dies is said, at the step it was in. */
    kvt__doc_run_child(d, die_early, 5000, kvt__doc_stalled);
    c = kvt_doctor_check(d->r, 2);
    CHECK(c != NULL && strcmp(c->id, "peer.handshake") == 0);
    CHECK(strstr(c->detail, "ended early") != NULL);
    /* One that finishes streams its checks, figures included. */
    kvt__doc_run_child(d, finish, 5000, kvt__doc_stalled);
    CHECK(kvt_doctor_count(d->r) == 4);
    c = kvt_doctor_check(d->r, 3);
    CHECK(strcmp(c->id, "peer.transfer.tcp") == 0 && c->mbps == 1234.5);
    kvt_doctor_free(d->r);
    free(d);
}

KVT_TEST_MAIN(KVT_CASE(params, 30), KVT_CASE(host_only, 30),
              KVT_CASE(scratch_and_peer, 60), KVT_CASE(refused_peer_named, 30),
              KVT_CASE(child_runner, 30))
