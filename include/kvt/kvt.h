/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_KVT_H
#define KVT_KVT_H

/*
 * kvt: KV-cache transfer for disaggregated LLM serving.
 *
 * Include this header for the whole public C API:
 *   kvt/status.h    status codes and their messages
 *   kvt/engine.h    engine, local memory, remote segments
 *   kvt/transfer.h  batched one-sided transfers and notifications
 *   kvt/connector.h the prefill/decode KV connector and bootstrap server
 */
#include <kvt/connector.h>
#include <kvt/defs.h>
#include <kvt/engine.h>
#include <kvt/status.h>
#include <kvt/transfer.h>

#endif
