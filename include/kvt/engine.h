/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <kvt/defs.h>
#include <kvt/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The engine is kvt's root object: one per process (or per GPU rank). It
 * owns a TCP listener that serves control and data, worker threads, the
 * registry of local memory and a cache of opened remote segments. There is
 * no global state: two engines in one process are independent.
 *
 * Thread safety: unless a call says otherwise, every call on an engine and
 * on the objects it owns may be made from any thread concurrently. No call
 * may be made on an engine once kvt_engine_destroy() has started.
 *
 * fork(): an engine belongs to the process that created it. A child of
 * fork() may create engines of its own, but must neither use nor destroy
 * those it inherited (their threads did not follow it): it leaves them
 * behind by exiting or by exec().
 */
typedef struct kvt_engine *kvt_engine_h;

/* Transports, as a bit set: one bit each (kvt_transports() lists those
 * built in). */
enum {
    KVT_TRANSPORT_TCP = 1u << 0,
    KVT_TRANSPORT_SHM = 1u << 1,
    KVT_TRANSPORT_UCX = 1u << 2,
    KVT_TRANSPORT_ALL = 0xffffffffu,
};

/* Flags of a transport (kvt_transport_info_t.flags). */
enum {
    /* Reaches only peers on the same host (same boot, same pid
     * namespace). */
    KVT_TRANSPORT_F_SAME_HOST = 1u << 0,
    /* Moves strided descriptors; a transport without it refuses them
     * with KVT_ERR_NOT_SUPPORTED. */
    KVT_TRANSPORT_F_STRIDED = 1u << 1,
    /* Runs only in an engine whose `transports` name it (not with
     * KVT_TRANSPORT_ALL, the default): ucx, whose defaults use every
     * network interface and whose tcp is slower than kvt's own. */
    KVT_TRANSPORT_F_EXPLICIT = 1u << 2,
};

/* A transport built into this library. */
typedef struct {
    const char *name;    /* "tcp", "shm", ...; static */
    uint32_t id;         /* its KVT_TRANSPORT_* bit */
    uint32_t flags;      /* KVT_TRANSPORT_F_* */
    uint32_t local_mem;  /* memory kinds it moves here: 1 << kvt_mem_kind_t */
    uint32_t remote_mem; /* memory kinds it reaches in a peer */
    int priority;        /* the highest that can serve a peer is chosen */
    uint32_t reserved[3];
} kvt_transport_info_t;

/*
 * kvt_transports() - the transports built into this library, in no
 * particular order: up to @max of them into @out, and how many there are
 * into *count_p. Whether an engine runs one also depends on its
 * parameters and on the machine (see kvt_segment_transport()), and an
 * engine's instance may move more kinds of memory than listed here (ucx:
 * device memory when its UCX was built for CUDA).
 *
 * Thread-safe, does not block. Returns KVT_OK, or KVT_ERR_INVALID_PARAM
 * when @count_p is NULL or @out is NULL with @max > 0.
 */
KVT_API kvt_status_t kvt_transports(kvt_transport_info_t *out, size_t max,
                                    size_t *count_p);

/*
 * kvt_transport_bits() - the KVT_TRANSPORT_* bits of a list of transport
 * names ("tcp,shm,ucx"; commas or spaces between them; "all" is
 * KVT_TRANSPORT_ALL), for tools and bindings that take the list from
 * people. A name need not be built in (kvt_transports() says which are).
 * kvt_mem_kind_bits() - the same for memory kinds ("host,cuda"): bits
 * 1 << kvt_mem_kind_t.
 *
 * Thread-safe. Each returns KVT_OK with *bits_p set, or KVT_ERR_INVALID_PARAM
 * (NULL arguments, an unknown name, an empty list).
 */
KVT_API kvt_status_t kvt_transport_bits(const char *names, uint32_t *bits_p);
KVT_API kvt_status_t kvt_mem_kind_bits(const char *names, uint32_t *bits_p);

/* A memory domain built into this library: a kind of memory it can
 * register. */
typedef struct {
    const char *name;   /* "host", "cuda"; static */
    uint32_t kind;      /* kvt_mem_kind_t */
    int32_t available;  /* 1: it serves memory now (a driver and devices
                           found); 0: built, but not on this machine */
    int32_t devices;    /* devices found (0 for host memory) */
    const char *detail; /* for people: "driver 13.0, 2 devices", or why it
                           is not available; static */
    uint32_t reserved[4];
} kvt_mem_domain_info_t;

/*
 * kvt_mem_domains() - the memory domains built into this library: up to
 * @max into @out, how many there are into *count_p. The first call may
 * load a device driver (CUDA: dlopen of libcuda.so.1, or of
 * $KVT_CUDA_LIBRARY, and cuInit()); later calls return at once.
 *
 * Thread-safe. Returns KVT_OK, or KVT_ERR_INVALID_PARAM when @count_p is
 * NULL or @out is NULL with @max > 0.
 */
KVT_API kvt_status_t kvt_mem_domains(kvt_mem_domain_info_t *out, size_t max,
                                     size_t *count_p);

/* Bits of kvt_engine_params_t.field_mask: a field is read only when set. */
enum {
    KVT_ENGINE_PARAM_LOCAL_HOST = 1u << 0,
    KVT_ENGINE_PARAM_PORT = 1u << 1,
    KVT_ENGINE_PARAM_NUM_WORKERS = 1u << 2,
    KVT_ENGINE_PARAM_METADATA_URI = 1u << 3,
    KVT_ENGINE_PARAM_TRANSPORTS = 1u << 4,
    KVT_ENGINE_PARAM_CONNS_PER_PEER = 1u << 5,
    KVT_ENGINE_PARAM_TRANSFER_TIMEOUT = 1u << 6,
    KVT_ENGINE_PARAM_SLICE_SIZE = 1u << 7,
    KVT_ENGINE_PARAM_CONNECT_TIMEOUT = 1u << 8,
    KVT_ENGINE_PARAM_SEGMENT_NAME = 1u << 9,
    KVT_ENGINE_PARAM_NET_DEVICES = 1u << 10,
    KVT_ENGINE_PARAM_AUTH_TOKEN = 1u << 11,
};

/*
 * Engine parameters. Zero-initialise, set the fields you need and their
 * bits in field_mask; everything else takes its default. Strings are
 * copied by kvt_engine_create() and may be freed after it returns.
 */
typedef struct {
    uint64_t field_mask;
    /* Host name or IPv4 address to listen on and to advertise.
     * Default "127.0.0.1". */
    const char *local_host;
    /* TCP port of the listener; 0 picks a free one (the default). */
    uint16_t port;
    /* Worker threads for network progress. Default 2. */
    unsigned num_workers;
    /* Metadata backend URI. Default "p2p": descriptors are fetched from
     * the peer's own listener, no server is needed. */
    const char *metadata_uri;
    /* Transports this engine may use and offers (KVT_TRANSPORT_*).
     * Default KVT_TRANSPORT_ALL: those built in, but those flagged
     * KVT_TRANSPORT_F_EXPLICIT, which run only when named here. */
    uint32_t transports;
    /* TCP data connections per remote peer, 1..16. Default 2. */
    unsigned conns_per_peer;
    /* Per-transfer timeout in milliseconds: a descriptor not completed
     * this long after submission ends in KVT_ERR_TIMEDOUT. Default 30000,
     * or KVT_TRANSFER_TIMEOUT (seconds) from the environment. */
    uint64_t transfer_timeout_ms;
    /* Largest piece one descriptor is cut into before being striped over
     * the peer's connections, and the most payload of one tcp frame (each
     * is acknowledged on its own). Default 4 MiB. */
    size_t slice_size;
    /* Bound on connecting and handshaking with a peer, in milliseconds.
     * Default 5000 (or the transfer timeout, if shorter). */
    uint64_t connect_timeout_ms;
    /* Segment name to advertise. Default "host:port" of the listener. */
    const char *segment_name;
    /* Network devices for transports that choose among them, as UCX
     * names them ("mlx5_0:1,mlx5_1:1"; Mooncake's device_name): ucx's
     * UCX_NET_DEVICES unless the environment sets it. Default: none
     * named (the transport's own default). At most 127 characters. */
    const char *net_devices;
    /* Shared secret that every peer must prove at each connection's
     * handshake, and that signs metadata writes to an http backend
     * (docs/security.md). Only a key derived from it is kept and it never
     * goes on the wire. NULL or "": no authentication, even where the
     * environment sets one. Without this bit: KVT_AUTH_TOKEN from the
     * environment, if set and not empty; else none (peers are not
     * authenticated, as before). At most 4096 bytes. */
    const char *auth_token;
} kvt_engine_params_t;

/*
 * kvt_engine_create() - create an engine, bind its listener and start its
 * transports' workers.
 *
 * @params: may be NULL for all defaults; read only during the call.
 * @engine_p: set to the new engine on success only.
 *
 * Every transport built in that @params allows is started; one that
 * cannot be (its resources are missing) is left out and the log says
 * why, and peers use the others. Blocks while binding and starting
 * threads (no network waits). Returns KVT_OK, KVT_ERR_INVALID_PARAM (a
 * bad field, a malformed metadata URI, a host that does not resolve),
 * KVT_ERR_NOT_SUPPORTED (the metadata backend is not built in, or no
 * allowed transport could be started), KVT_ERR_IO (cannot bind or listen,
 * cannot start a thread; the log says why) or KVT_ERR_NO_MEMORY.
 */
KVT_API kvt_status_t kvt_engine_create(const kvt_engine_params_t *params,
                                       kvt_engine_h *engine_p);

/*
 * kvt_engine_destroy() - stop the engine and free everything it owns.
 *
 * Transfers still in flight end in KVT_ERR_CANCELED; batches not freed by
 * the caller are freed here, and their handles become invalid. Closes the
 * listener and every connection, joins the workers. NULL does nothing.
 * Must not race with any other call on the same engine.
 */
KVT_API void kvt_engine_destroy(kvt_engine_h engine);

/*
 * kvt_engine_segment_name() - the name peers use to open this engine's
 * segment ("host:port" unless set in the params).
 *
 * The string lives as long as the engine. Thread-safe, does not block.
 */
KVT_API const char *kvt_engine_segment_name(kvt_engine_h engine);

/*
 * kvt_engine_rpc_port() - the TCP port the listener is bound to (the one
 * actually bound when params asked for 0). Thread-safe, does not block.
 */
KVT_API uint16_t kvt_engine_rpc_port(kvt_engine_h engine);

/* ---- Local memory ------------------------------------------------------ */

/* Access rights a region grants to remote peers. */
enum {
    KVT_ACCESS_REMOTE_WRITE = 1u << 0,
    KVT_ACCESS_REMOTE_READ = 1u << 1,
    KVT_ACCESS_REMOTE_RW = KVT_ACCESS_REMOTE_WRITE | KVT_ACCESS_REMOTE_READ,
};

/* Memory kinds. KVT_MEM_AUTO, at registration: tell the kind from the
 * memory itself. */
typedef enum {
    KVT_MEM_HOST = 0,
    KVT_MEM_CUDA = 1,
    KVT_MEM_AUTO = 0xff,
} kvt_mem_kind_t;

#define KVT_MEM_KINDS 2

/* One region, for the batched calls. @kind KVT_MEM_AUTO: told from the
 * memory (as kvt_mem_register_ex() without KVT_MEM_PARAM_KIND); @device:
 * the device of a device kind (ignored for host memory). */
typedef struct {
    void *addr;
    size_t length;
    uint32_t access; /* KVT_ACCESS_* */
    kvt_mem_kind_t kind;
    int32_t device;
    uint32_t reserved;
} kvt_mem_region_t;

/* Bits of kvt_mem_params_t.field_mask: a field is read only when set. */
enum {
    KVT_MEM_PARAM_ACCESS = 1u << 0,
    KVT_MEM_PARAM_KIND = 1u << 1,
    KVT_MEM_PARAM_DEVICE = 1u << 2,
};

/*
 * How to register a range (kvt_mem_register_ex()). Zero-initialise, set
 * the fields you need and their bits; the rest take their defaults.
 */
typedef struct {
    uint64_t field_mask;
    /* KVT_ACCESS_* rights granted to peers. Default KVT_ACCESS_REMOTE_RW. */
    uint32_t access;
    /* The memory's kind. Default: told from the memory itself (device
     * memory a memory domain of this build recognises, host memory
     * otherwise). */
    kvt_mem_kind_t kind;
    /* The device of a device kind (its ordinal). Default 0; ignored for
     * host memory. */
    int32_t device;
} kvt_mem_params_t;

/*
 * kvt_mem_register() - expose [addr, addr+length) to peers with @access
 * rights, and allow it as the local side of transfers. The memory's kind
 * is told from the memory: device memory a memory domain of this build
 * detects (CUDA memory, when a driver is found: kind KVT_MEM_CUDA on its
 * device), host memory otherwise.
 *
 * The memory stays owned by the caller and must stay valid until
 * kvt_mem_unregister() returns. Every transport that moves host memory
 * registers it too (an RDMA transport pins it and makes a key for
 * peers). Does not block on the network; peers see the new region when
 * they next fetch this segment's descriptor (p2p mode: on their next open
 * after a cache miss or refresh), same-host peers at once. May wait for a
 * same-host peer's copy in flight to finish (at most 1 s, see
 * docs/shm.md). Thread-safe.
 *
 * Returns KVT_OK, KVT_ERR_EXISTS (the range overlaps a registered
 * region), KVT_ERR_INVALID_PARAM (zero length, NULL address, unknown
 * access bits, a range that wraps), KVT_ERR_NOT_SUPPORTED (the range is
 * not memory this process has mapped readable from end to end: device
 * memory of a driver this build or machine lacks, or unmapped; logged),
 * KVT_ERR_NO_SPACE (the engine holds 1,048,576 regions already),
 * KVT_ERR_NO_MEMORY, or KVT_ERR_IO when a transport could not register
 * the memory (logged).
 */
KVT_API kvt_status_t kvt_mem_register(kvt_engine_h engine, void *addr,
                                      size_t length, uint32_t access);

/*
 * kvt_mem_register_ex() - kvt_mem_register() with the memory's kind and
 * device stated or left to detection, and the access rights, in @params
 * (NULL: all defaults; read during the call only).
 *
 * Returns KVT_ERR_NOT_SUPPORTED for a range of a kind this build has no
 * memory domain for, or one its domain says is not of that kind (logged);
 * KVT_ERR_INVALID_PARAM also for an unknown field bit; otherwise as
 * kvt_mem_register() does (KVT_OK, KVT_ERR_EXISTS, KVT_ERR_INVALID_PARAM,
 * KVT_ERR_NO_SPACE, KVT_ERR_NO_MEMORY, KVT_ERR_IO). kvt_mem_register() is
 * the shorthand for all defaults. Thread-safe; may wait as it does.
 */
KVT_API kvt_status_t kvt_mem_register_ex(kvt_engine_h engine, void *addr,
                                         size_t length,
                                         const kvt_mem_params_t *params);

/*
 * kvt_mem_register_batch() - register @count regions at once, each as
 * kvt_mem_register_ex() would. Either all are registered or none is.
 * Returns what kvt_mem_register_ex() returns for the first that fails
 * (KVT_ERR_EXISTS also when two of them overlap), or KVT_OK (also for
 * @count 0).
 */
KVT_API kvt_status_t kvt_mem_register_batch(kvt_engine_h engine,
                                            const kvt_mem_region_t *regions,
                                            size_t count);

/*
 * kvt_mem_unregister() - withdraw the region that starts at @addr.
 *
 * When it returns, no remote write or read will touch the region any more:
 * a transfer that is landing in it at that moment is cut off and its
 * initiator gets KVT_ERR_ACCESS; later ones are refused. May block briefly
 * while a worker finishes one socket call into the region, or while a
 * same-host peer finishes a copy it had already checked (at most 1 s; that
 * copy succeeds, see docs/shm.md). Returns KVT_OK, KVT_ERR_NOT_FOUND when
 * no region starts at @addr, KVT_ERR_INVALID_PARAM for a NULL engine or
 * address. Thread-safe.
 */
KVT_API kvt_status_t kvt_mem_unregister(kvt_engine_h engine, void *addr);

/*
 * kvt_mem_unregister_batch() - unregister @count regions by start address,
 * each as kvt_mem_unregister() would. Every address is tried; returns
 * KVT_OK, or the first failure's status (KVT_ERR_NOT_FOUND,
 * KVT_ERR_INVALID_PARAM; also for NULL @addrs with @count > 0).
 */
KVT_API kvt_status_t kvt_mem_unregister_batch(kvt_engine_h engine,
                                              void *const *addrs, size_t count);

/*
 * kvt_mem_alloc() - allocate @length bytes of host memory through kvt and
 * register it with @access, in one step.
 *
 * The memory is backed by a memfd, page-aligned and zero-filled, so that
 * same-host peers can map it directly. It is advised for transparent huge
 * pages (MADV_HUGEPAGE), which the kernel grants shared memory only when
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise",
 * "within_size" or "always" (Debian's default is "never"; scattered 4 KiB
 * blocks moved 13 to 14% faster with huge pages at both ends,
 * docs/benchmarks.md). *addr_p is set on success only. Free it with
 * kvt_mem_free(); kvt_engine_destroy() frees what is left. Returns KVT_OK,
 * KVT_ERR_INVALID_PARAM (length 0, unknown access bits, NULL @addr_p),
 * KVT_ERR_NO_MEMORY, or what registering it returns (KVT_ERR_NO_SPACE,
 * KVT_ERR_IO; see kvt_mem_register()). Thread-safe.
 */
KVT_API kvt_status_t kvt_mem_alloc(kvt_engine_h engine, size_t length,
                                   uint32_t access, void **addr_p);

/*
 * kvt_mem_alloc_ex() - kvt_mem_alloc() with the memory's kind, device and
 * access rights in @params (NULL: host memory, read-write). Device memory
 * (KVT_MEM_CUDA) is allocated through the device's driver (cuMemAlloc on
 * that device) and registered as memory of that device; it is not
 * host-addressable. Free it with kvt_mem_free(). *addr_p is set on
 * success only. Thread-safe.
 *
 * Returns KVT_OK, KVT_ERR_INVALID_PARAM (NULL engine or @addr_p, zero
 * @length, an unknown field bit, KVT_MEM_AUTO, or no such device),
 * KVT_ERR_NOT_SUPPORTED (a kind this build or machine cannot allocate: no
 * driver or no device; logged), KVT_ERR_NO_MEMORY, KVT_ERR_NO_SPACE (the
 * engine holds 1,048,576 regions already), or KVT_ERR_IO (the driver
 * failed otherwise; logged).
 */
KVT_API kvt_status_t kvt_mem_alloc_ex(kvt_engine_h engine, size_t length,
                                      const kvt_mem_params_t *params,
                                      void **addr_p);

/*
 * kvt_mem_copy() - copy @len bytes from @src to @dst and wait, whatever
 * memory each is: host memory, or device memory of a domain this build
 * serves (through its driver: cuMemcpy for CUDA memory). For programs that
 * fill or check device buffers they move with kvt (tools, tests); not a
 * transfer, and neither side need be registered. The ranges must not
 * overlap. Thread-safe; blocks until the bytes are there.
 *
 * Returns KVT_OK, KVT_ERR_INVALID_PARAM (a NULL address with @len > 0), or
 * KVT_ERR_IO when the device's copy failed, a range starts in device
 * memory but runs past its allocation, or the device's driver is loaded
 * but kvt cannot use it (logged).
 */
KVT_API kvt_status_t kvt_mem_copy(void *dst, const void *src, size_t len);

/*
 * kvt_mem_free() - unregister and free memory from kvt_mem_alloc() or
 * kvt_mem_alloc_ex(). The
 * same guarantee as kvt_mem_unregister() holds before the memory is
 * unmapped. Returns KVT_OK, KVT_ERR_NOT_FOUND when @addr is not such an
 * allocation, KVT_ERR_INVALID_PARAM for a NULL engine or address.
 * Thread-safe.
 */
KVT_API kvt_status_t kvt_mem_free(kvt_engine_h engine, void *addr);

/* ---- Remote segments --------------------------------------------------- */

/* Handle of an opened remote segment; valid until the engine is destroyed.
 * 0 is never a valid handle. */
typedef uint64_t kvt_segment_t;

/* A region of a remote segment, as its descriptor advertises it. */
typedef struct {
    uint64_t addr;
    uint64_t length;
    uint32_t access; /* KVT_ACCESS_* */
    uint32_t kind;   /* kvt_mem_kind_t */
    int32_t device;  /* device ordinal of a device kind; -1 for host memory */
    uint32_t reserved;
} kvt_remote_region_t;

/*
 * kvt_segment_open() - open the remote segment @name ("host:port" in p2p
 * mode) and return its handle.
 *
 * The first open of a name connects to the peer, handshakes (protocol
 * version checked on both sides), fetches its segment descriptor and opens
 * a session with the transport that serves it best (kvt_segment_transport()
 * says which); later opens of the same name return the cached handle at
 * once. When a session fails (connection lost, timeout), its segment is
 * evicted from the cache: transfers on the old handle fail with the
 * reason and the next open of the name handshakes afresh.
 *
 * Blocks at most the connect timeout for each connection it makes.
 * Returns KVT_OK, KVT_ERR_INVALID_PARAM (malformed or too long a name),
 * KVT_ERR_UNREACHABLE (refused, no route, the name does not resolve, not
 * published in the metadata backend), KVT_ERR_TIMEDOUT, KVT_ERR_CONN_LOST
 * (the peer closed during the handshake), KVT_ERR_VERSION (another major
 * protocol version, on either side), KVT_ERR_PROTOCOL (an answer that is
 * not the protocol), KVT_ERR_AUTH (authentication failed: this engine's
 * auth token is missing, or not the peer's, or the peer has one and this
 * engine none; the log says which side), KVT_ERR_ACCESS (over shm: this
 * process may not attach to the peer's), KVT_ERR_BUSY (the peer refused
 * this engine; also while it is still closing what is left of this
 * engine's failed session to it: try again),
 * KVT_ERR_NOT_SUPPORTED (no
 * transport both engines run serves it), KVT_ERR_IO (a transport could not set
 * the session up, or the metadata backend failed), KVT_ERR_NO_SPACE (2^30
 * segments open), KVT_ERR_CLOSED (the engine is being destroyed),
 * KVT_ERR_NO_MEMORY. Thread-safe.
 */
KVT_API kvt_status_t kvt_segment_open(kvt_engine_h engine, const char *name,
                                      kvt_segment_t *segment_p);

/*
 * kvt_segment_regions() - copy up to @max regions of the segment's cached
 * descriptor into @regions and set *count_p to the total number of regions
 * the descriptor holds. Does not block on the network.
 *
 * With @refresh non-zero the descriptor is fetched again from the peer
 * first (blocking, bounded by the connect timeout). Returns KVT_OK,
 * KVT_ERR_NOT_FOUND (unknown or closed handle), KVT_ERR_INVALID_PARAM
 * (NULL @count_p, or NULL @regions with @max > 0); with @refresh also the
 * failures of fetching it, those of kvt_segment_open()'s fetch
 * (KVT_ERR_UNREACHABLE, KVT_ERR_TIMEDOUT, KVT_ERR_CONN_LOST,
 * KVT_ERR_VERSION, KVT_ERR_PROTOCOL, KVT_ERR_AUTH, KVT_ERR_ACCESS,
 * KVT_ERR_BUSY, KVT_ERR_NO_MEMORY); the cached descriptor is kept then.
 * Thread-safe.
 */
KVT_API kvt_status_t kvt_segment_regions(kvt_engine_h engine,
                                         kvt_segment_t segment, int refresh,
                                         kvt_remote_region_t *regions,
                                         size_t max, size_t *count_p);

/* What an engine knows of an opened segment (kvt_segment_info()). */
typedef struct {
    uint32_t offered;  /* KVT_TRANSPORT_* the peer offers */
    uint32_t nregions; /* regions in its cached descriptor */
    int same_host;     /* the peer runs on this host */
    uint32_t reserved[5];
} kvt_segment_info_t;

/*
 * kvt_segment_info() - what the segment's cached descriptor says, into
 * *info_p. Does not block on the network; thread-safe. Returns KVT_OK,
 * KVT_ERR_NOT_FOUND (unknown or closed handle), KVT_ERR_INVALID_PARAM.
 */
KVT_API kvt_status_t kvt_segment_info(kvt_engine_h engine,
                                      kvt_segment_t segment,
                                      kvt_segment_info_t *info_p);

/*
 * kvt_segment_transport() - the name of the transport that carries
 * transfers between @local memory here and @remote memory of the segment
 * ("tcp", "shm"; a static string) into *name_p. Chosen when the segment
 * was opened, from what both engines run and the peer offers; it does not
 * change. Does not block; thread-safe. Returns KVT_OK, KVT_ERR_NOT_FOUND
 * (unknown or closed handle), KVT_ERR_NOT_SUPPORTED (no transport serves
 * that pair of memory kinds), KVT_ERR_INVALID_PARAM.
 */
KVT_API kvt_status_t kvt_segment_transport(kvt_engine_h engine,
                                           kvt_segment_t segment,
                                           kvt_mem_kind_t local,
                                           kvt_mem_kind_t remote,
                                           const char **name_p);

/*
 * kvt_segment_transport_reason() - why kvt_segment_transport() answers
 * what it does for (@local, @remote): the chosen transport and why, then
 * every other transport built in and why it does not carry the pair, as
 * one line of text into @buf (@cap bytes, NUL-terminated, cut to fit at
 * 511 bytes), for example "shm (the highest priority of the
 * 2 that serve it); tcp: serves it too, at a lower priority; ucx: runs
 * only when named in the engine's transports". "none (...)" when no
 * transport serves the pair. The same reasons are logged once when the
 * segment's session opens (a warning when a better transport was passed
 * over, else at info level); docs/transports.md lists every reason.
 * Does not block; thread-safe. Returns KVT_OK, KVT_ERR_NOT_FOUND (unknown
 * or closed handle), KVT_ERR_INVALID_PARAM (NULL @buf, @cap 0, unknown
 * kinds).
 */
KVT_API kvt_status_t kvt_segment_transport_reason(kvt_engine_h engine,
                                                  kvt_segment_t segment,
                                                  kvt_mem_kind_t local,
                                                  kvt_mem_kind_t remote,
                                                  char *buf, size_t cap);

/*
 * kvt_segment_close() - drop the handle's sessions and evict it from the
 * cache. Transfers in flight on it end in KVT_ERR_CANCELED. Later use of
 * the handle returns KVT_ERR_NOT_FOUND, also once its slot holds another
 * segment; the sessions' memory is freed when the last transfer on them
 * has ended. Returns KVT_OK, KVT_ERR_NOT_FOUND (unknown or closed handle),
 * KVT_ERR_INVALID_PARAM (NULL engine). Thread-safe, does not block.
 */
KVT_API kvt_status_t kvt_segment_close(kvt_engine_h engine,
                                       kvt_segment_t segment);

#ifdef __cplusplus
}
#endif
#endif
