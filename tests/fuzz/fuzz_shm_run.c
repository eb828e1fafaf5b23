/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target for the check of a staged run (shm), which the target
 * process applies to what a peer wrote into a slot: whatever it accepts
 * must lie within the slot, and its pieces within the span it reports,
 * without wrapping. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/shm/shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt__shm_run_t r;
    unsigned __int128 end, span, last;
    uint64_t got = 0;

    memset(&r, 0, sizeof(r));
    memcpy(&r, data, size < sizeof(r) ? size : sizeof(r));
    if (!kvt__shm_run_check(&r, &got))
        return 0;
    if (r.count == 0 || r.len == 0 || r.rstride < r.len)
        abort();
    end = (unsigned __int128)r.off + (unsigned __int128)r.len * r.count;
    if (end > KVT_SHM_STAGE_BYTES)
        abort();
    span = (unsigned __int128)(r.count - 1) * r.rstride + r.len;
    if (span != got || (unsigned __int128)r.raddr + span > UINT64_MAX)
        abort();
    last = (unsigned __int128)r.raddr +
           (unsigned __int128)(r.count - 1) * r.rstride;
    if (last + r.len != (unsigned __int128)r.raddr + span)
        abort();
    return 0;
}
