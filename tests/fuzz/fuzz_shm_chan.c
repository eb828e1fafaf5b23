/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stateful fuzz target for the shm transport's target side: a hostile
 * initiator in this process connects to a live engine's shm socket, maps
 * the channel it is handed, and does what each input says: sends socket
 * messages (MAP, IPC, BELL, anything), queues notifications on the ring
 * with any length and index, fills staging slots with any runs (addresses
 * are offsets into the harness's arena, rebased) and rings the bell. The
 * engine must not crash, must still accept a channel next time, and no
 * byte outside the regions it registered for remote writes may change.
 *
 * Input: operations, each an opcode byte and its operands (see below);
 * a short operand is read as zeros.
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <kvt/kvt.h>

#include "fuzz/fuzz_util.h"
#include "transport/shm/shm.h"
#include "transport/shm/shm_sess.h"
#include "util/time.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ARENA (64u * 1024u)
#define RW_OFF (8u * 1024u)
#define RW_LEN (16u * 1024u)
#define RO_OFF (28u * 1024u)
#define RO_LEN (8u * 1024u)
#define WO_OFF (40u * 1024u)
#define WO_LEN (8u * 1024u)
#define GUARD 0xa5
#define RO_BYTE 0x3c
/* How long the service thread may take to answer a bell (it also looks
 * every 50 ms); generous, for machines loaded many times over. */
#define SERVE_NS (20000ull * 1000000ull)

enum { OP_MSG, OP_NOTE, OP_STAGE, OP_BELL, OP_TAIL, NOPS };

static kvt_engine_h engine;
static uint8_t *arena;
static struct sockaddr_un sa = {.sun_family = AF_UNIX};
static socklen_t sa_len;

/* The input, read front to back; zeros past its end. */
typedef struct {
    const uint8_t *p;
    size_t left;
} in_t;

static uint64_t take(in_t *in, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        if (in->left > 0) {
            v |= (uint64_t)*in->p << (8 * i);
            in->p++;
            in->left--;
        }
    }
    return v;
}

static void die(const char *what)
{
    fprintf(stderr, "fuzz_shm_chan: %s\n", what);
    abort();
}

static void setup(void)
{
    kvt_engine_params_t p = {0};
    const kvt__engine_cfg_t *cfg;
    void *alloc;

    fuzz_quiet();
    p.field_mask = KVT_ENGINE_PARAM_LOCAL_HOST | KVT_ENGINE_PARAM_TRANSPORTS;
    p.local_host = "127.0.0.1";
    p.transports = KVT_TRANSPORT_TCP | KVT_TRANSPORT_SHM;
    if (kvt_engine_create(&p, &engine) != KVT_OK)
        die("cannot create the engine");
    arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED)
        die("cannot map the arena");
    memset(arena, GUARD, ARENA);
    memset(arena + RO_OFF, RO_BYTE, RO_LEN);
    if (kvt_mem_register(engine, arena + RW_OFF, RW_LEN,
                         KVT_ACCESS_REMOTE_RW) != KVT_OK ||
        kvt_mem_register(engine, arena + RO_OFF, RO_LEN,
                         KVT_ACCESS_REMOTE_READ) != KVT_OK ||
        kvt_mem_register(engine, arena + WO_OFF, WO_LEN,
                         KVT_ACCESS_REMOTE_WRITE) != KVT_OK ||
        kvt_mem_alloc(engine, 64 * 1024, KVT_ACCESS_REMOTE_RW, &alloc) !=
            KVT_OK)
        die("cannot register the regions");
    cfg = kvt__engine_cfg(engine);
    sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                         kvt__shm_sock_name(sa.sun_path, cfg->host_id,
                                            (uint32_t)getpid(), cfg->port));
}

static void check_arena(void)
{
    for (size_t i = 0; i < ARENA; i++) {
        int writable = (i >= RW_OFF && i < RW_OFF + RW_LEN) ||
                       (i >= WO_OFF && i < WO_OFF + WO_LEN);
        uint8_t want = i >= RO_OFF && i < RO_OFF + RO_LEN ? RO_BYTE : GUARD;
        if (!writable && arena[i] != want) {
            fprintf(stderr, "fuzz_shm_chan: arena byte %zu changed\n", i);
            abort();
        }
    }
}

/* One message and the descriptor riding along (closed here); the
 * message's length, 0 when none is waiting, -1 at the end. */
static ssize_t recv_msg(int fd, kvt__shm_msg_t *m, int *memfd_p, int wait_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int got = -1;
    ssize_t n;

    if (memfd_p != NULL)
        *memfd_p = -1;
    if (poll(&p, 1, wait_ms) <= 0)
        return 0;
    n = kvt__shm_recv_msg(fd, m, &got);
    if (got >= 0 && memfd_p != NULL)
        *memfd_p = got;
    else if (got >= 0)
        close(got);
    return n <= 0 ? -1 : n;
}

/* Connect and take a channel, as a sound initiator does. The engine
 * drops a peer whose HELLO is not there within 1 s of its accept: on a
 * machine loaded many times over that can be this one, which then tries
 * again (and says so); any other failure is the engine's. */
static kvt__shm_chan_t *open_chan(int *fd_p, size_t *len_p)
{
    kvt__shm_msg_t m;
    kvt__shm_chan_t *ch;

    for (int attempt = 0;; attempt++) {
        uint64_t t0 = kvt__now_ns(), ms;
        ssize_t got = -1;
        int fd, memfd = -1, err = 0;

        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sa_len) != 0)
            die("the engine's shm socket is gone");
        kvt__shm_msg_init(&m, KVT_SHM_HELLO);
        m.pid = (uint32_t)getpid();
        snprintf(m.name, sizeof(m.name), "fuzz-shm");
        if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) == (ssize_t)sizeof(m))
            got = recv_msg(fd, &m, &memfd, 20000);
        err = errno;
        ms = (kvt__now_ns() - t0) / 1000000;
        if (got == (ssize_t)sizeof(m) && m.type == KVT_SHM_HELLO_ACK &&
            m.status == KVT_OK && memfd >= 0) {
            ch = mmap(NULL, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
                      0);
            close(memfd);
            if (ch == MAP_FAILED)
                die("cannot map the channel");
            *fd_p = fd;
            *len_p = m.length;
            return ch;
        }
        fprintf(stderr,
                "fuzz_shm_chan: no channel after %llu ms: %zd bytes, type "
                "%u, status %d, memfd %d, errno %d\n",
                (unsigned long long)ms, got, got > 0 ? m.type : 0,
                got > 0 ? m.status : 0, memfd, err);
        if (memfd >= 0)
            close(memfd);
        close(fd);
        if (got > 0 || ms < 900 || attempt == 2)
            die("the engine no longer hands out channels");
    }
}

static void bell(int fd)
{
    kvt__shm_msg_t m;
    kvt__shm_msg_init(&m, KVT_SHM_BELL);
    send(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* OP_MSG: type u8, mode u8 (bit 0: raw first 8 bytes, bit 1: short
 * message; bit 2: the id of the first allocation in the snapshot), status
 * u32, id u64, seq u64, addr u64 (rebased), length u64, name byte. */
static void op_msg(int fd, kvt__shm_chan_t *ch, in_t *in)
{
    kvt__shm_msg_t m;
    unsigned type = (unsigned)take(in, 1), mode = (unsigned)take(in, 1);
    size_t len = sizeof(m);

    kvt__shm_msg_init(&m, (uint16_t)type);
    m.status = (int32_t)take(in, 4);
    m.id = take(in, 8);
    m.seq = take(in, 8);
    m.addr = take(in, 8) + (uint64_t)(uintptr_t)arena;
    m.length = take(in, 8);
    memset(m.name, (int)take(in, 1), sizeof(m.name));
    if (mode & 1) {
        uint64_t raw = take(in, 8);
        memcpy(&m, &raw, 8);
    }
    if (mode & 2)
        len = (size_t)take(in, 1) % sizeof(m);
    if (mode & 4) {
        uint32_t n = ch->nregions < KVT_SHM_MAX_REGIONS ? ch->nregions
                                                        : KVT_SHM_MAX_REGIONS;
        for (uint32_t r = 0; r < n; r++)
            if (ch->regions[r].map_id != 0) {
                m.id = ch->regions[r].map_id;
                break;
            }
    }
    send(fd, &m, len, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* OP_NOTE: len u32 (as written; the ring holds at most KVT_NOTIFY_MAX),
 * n u8 bytes of data, tail step u8 (0 means 1). */
static void op_note(int fd, kvt__shm_chan_t *ch, in_t *in)
{
    uint32_t tail = atomic_load(&ch->nq_tail);
    kvt__shm_note_t *nt = &ch->notes[tail % KVT_SHM_NOTES];
    uint32_t len = (uint32_t)take(in, 4), n = (uint32_t)take(in, 1), step;

    nt->len = len;
    for (uint32_t i = 0; i < n; i++)
        nt->data[i] = (uint8_t)take(in, 1);
    step = (uint32_t)take(in, 1);
    atomic_store(&ch->nq_tail, tail + (step ? step : 1));
    bell(fd);
}

/* OP_STAGE: slot u8, op u8 (bit 0: READ, else WRITE), nruns u16 (as
 * written), then per run (at most 8 from the input): raddr u32 (rebased),
 * rstride u16, off u32, len u16, count u16, 4 data bytes at off; waits
 * until the target made the slot done. */
static void op_stage(int fd, kvt__shm_chan_t *ch, in_t *in)
{
    kvt__shm_slot_t *sl = &ch->stage[take(in, 1) % KVT_SHM_STAGE_SLOTS];
    uint32_t op = take(in, 1) & 1 ? KVT_OP_READ : KVT_OP_WRITE;
    uint32_t nruns = (uint32_t)take(in, 2);
    uint64_t deadline = kvt__now_ns() + SERVE_NS;

    if (atomic_load(&sl->state) != KVT_SHM_SLOT_FREE &&
        atomic_load(&sl->state) != KVT_SHM_SLOT_DONE)
        return;
    sl->op = op;
    sl->nruns = nruns;
    for (uint32_t r = 0; r < 8 && r < KVT_SHM_STAGE_RUNS; r++) {
        kvt__shm_run_t *run = &sl->runs[r];
        run->raddr = take(in, 4) + (uint64_t)(uintptr_t)arena;
        run->rstride = take(in, 2);
        run->off = take(in, 4);
        run->len = (uint32_t)take(in, 2);
        run->count = (uint32_t)take(in, 2);
        run->st = 1;
        for (unsigned b = 0; b < 4; b++)
            if (run->off + b < KVT_SHM_STAGE_BYTES)
                sl->data[run->off + b] = (uint8_t)take(in, 1);
    }
    atomic_store(&sl->state, KVT_SHM_SLOT_FULL);
    bell(fd);
    while (atomic_load(&sl->state) != KVT_SHM_SLOT_DONE &&
           atomic_load(&ch->closed) == 0) {
        kvt__shm_msg_t m;
        if (kvt__now_ns() > deadline)
            die("a staged slot was never served");
        if (recv_msg(fd, &m, NULL, 1) < 0)
            break; /* the target closed the channel */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    in_t in = {data, size};
    kvt__shm_chan_t *ch;
    kvt_notify_t notes[16];
    size_t len, count;
    int fd;

    if (engine == NULL)
        setup();
    ch = open_chan(&fd, &len);
    for (unsigned ops = 0; in.left > 0 && ops < 64; ops++) {
        kvt__shm_msg_t m;
        switch (take(&in, 1) % NOPS) {
        case OP_MSG:
            op_msg(fd, ch, &in);
            break;
        case OP_NOTE:
            op_note(fd, ch, &in);
            break;
        case OP_STAGE:
            op_stage(fd, ch, &in);
            break;
        case OP_BELL:
            bell(fd);
            break;
        case OP_TAIL:
            atomic_store(&ch->nq_tail, (uint32_t)take(&in, 4));
            break;
        }
        /* Answers (with the memfds of MAP_ACKs) are taken and dropped. */
        while (recv_msg(fd, &m, NULL, 0) > 0)
            ;
    }
    /* Let the service thread take the ring before the hang-up. */
    bell(fd);
    {
        uint64_t until = kvt__now_ns() + 20000000ull;
        while (kvt__now_ns() < until && atomic_load(&ch->closed) == 0 &&
               atomic_load(&ch->nq_head) != atomic_load(&ch->nq_tail))
            usleep(100);
    }
    close(fd);
    munmap(ch, len);
    while (kvt_notify_recv(engine, notes, 16, &count, 0) == KVT_OK && count > 0)
        ;
    check_arena();
    return 0;
}
