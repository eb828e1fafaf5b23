/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_CORE_STATS_PROM_H
#define KVT_CORE_STATS_PROM_H

/*
 * The Prometheus text of an engine's metrics (stats_prom.c), for
 * kvt_engine_metrics_text() and the /metrics listener (stats_http.c).
 */
#include <stddef.h>

#include <kvt/metrics.h> /* IWYU pragma: keep */

/* Text written as snprintf() writes: what fits into buf[0..cap), and
 * @len counting all of it, so that a first pass with @cap 0 measures. */
typedef struct {
    char *buf;
    size_t cap, len;
} kvt__prom_out_t;

/*
 * Append the text of @e's metrics to @o; @meta: with the HELP and TYPE
 * lines (once per family in a scrape: the first engine's). Returns
 * KVT_OK, or KVT_ERR_NO_MEMORY (nothing appended).
 */
kvt_status_t kvt__prom_engine(kvt_engine_h e, kvt__prom_out_t *o, int meta);

#endif
