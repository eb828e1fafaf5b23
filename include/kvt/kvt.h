/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_KVT_H
#define KVT_KVT_H

/*
 * kvt: KV-cache transfer for disaggregated LLM serving.
 *
 * Include this header for the whole public C API:
 *   kvt/status.h    status codes and their messages
 *   kvt/version.h   the library's and the wire protocol's versions
 *   kvt/engine.h    engine, transports, local memory, remote segments
 *   kvt/transfer.h  batched one-sided transfers, the submission plug,
 *                   notifications
 *   kvt/connector.h the prefill/decode KV connector and bootstrap server
 *   kvt/metad.h     the metadata server and the bootstrap client
 *   kvt/log.h       the library's log, for code built on it
 *   kvt/metrics.h   an engine's metrics, Prometheus text, /metrics
 *   kvt/doctor.h    checks of this host, a metadata server and a peer
 */
#include <kvt/connector.h>
#include <kvt/defs.h>
#include <kvt/doctor.h>
#include <kvt/engine.h>
#include <kvt/log.h>
#include <kvt/metad.h>
#include <kvt/metrics.h>
#include <kvt/status.h>
#include <kvt/transfer.h>
#include <kvt/version.h>

#endif
