/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_STATUS_H
#define KVT_STATUS_H

#include <kvt/defs.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every kvt call returns a kvt_status_t: KVT_OK (0) on success,
 * KVT_INPROGRESS (1) for an operation that has not finished yet, and a
 * negative KVT_ERR_* value on failure. The table below is the single source
 * of the codes and their messages; codes are stable across releases and
 * new ones are only ever appended.
 */
#define KVT_STATUS_MAP(XX)                                                     \
    XX(OK, 0, "success")                                                       \
    XX(INPROGRESS, 1, "operation in progress")                                 \
    XX(ERR_INVALID_PARAM, -1, "invalid parameter")                             \
    XX(ERR_NO_MEMORY, -2, "out of memory")                                     \
    XX(ERR_NOT_SUPPORTED, -3, "operation not supported")                       \
    XX(ERR_BUSY, -4, "resource busy")                                          \
    XX(ERR_NOT_FOUND, -5, "not found")                                         \
    XX(ERR_EXISTS, -6, "already exists")                                       \
    XX(ERR_NOT_REGISTERED, -7, "memory range is not registered")               \
    XX(ERR_ACCESS, -8, "remote peer refused access to the memory range")       \
    XX(ERR_IO, -9, "input/output error")                                       \
    XX(ERR_TIMEDOUT, -10, "timed out")                                         \
    XX(ERR_UNREACHABLE, -11, "peer unreachable")                               \
    XX(ERR_CONN_LOST, -12, "connection to peer lost")                          \
    XX(ERR_PROTOCOL, -13, "protocol error")                                    \
    XX(ERR_VERSION, -14, "peer speaks an incompatible protocol version")       \
    XX(ERR_CANCELED, -15, "operation canceled")                                \
    XX(ERR_NO_SPACE, -16, "no space left")                                     \
    XX(ERR_AGAIN, -17, "nothing available, try again")                         \
    XX(ERR_CLOSED, -18, "engine or handle is shutting down")                   \
    XX(ERR_OVERFLOW, -19, "value or buffer too large")                         \
    XX(ERR_AUTH, -20,                                                          \
       "authentication failed: the auth token is missing or not the peer's")

typedef enum {
#define KVT__STATUS_ENUM(name, value, msg) KVT_##name = value,
    KVT_STATUS_MAP(KVT__STATUS_ENUM)
#undef KVT__STATUS_ENUM
} kvt_status_t;

/*
 * kvt_status_str() - a human-readable message for a status.
 *
 * Returns a static string; never NULL (unknown values give "unknown
 * status"). Thread-safe, does not block.
 */
KVT_API const char *kvt_status_str(kvt_status_t status);

/*
 * kvt_status_name() - the symbolic name of a status, e.g. "KVT_ERR_ACCESS".
 *
 * Returns a static string; never NULL. Thread-safe, does not block.
 */
KVT_API const char *kvt_status_name(kvt_status_t status);

#ifdef __cplusplus
}
#endif
#endif
