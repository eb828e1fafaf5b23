/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The doctor's checks of this host: the transports built and whether each
 * starts, device memory and whether it registers, shared-memory
 * permissions, the descriptor limit, the clock source, and the address an
 * engine would advertise: what it resolves to, and whether an engine is
 * reachable through it (a second engine opening the first's segment by
 * its advertised name, not by loopback).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/doctor_int.h"
#include "core/engine_int.h"
#include "util/time.h"

static const char *const kind_names[KVT_MEM_KINDS] = {"host", "cuda"};

static void kinds(uint32_t bits, char *out, size_t cap)
{
    size_t n = 0;

    out[0] = '\0';
    for (unsigned k = 0; k < KVT_MEM_KINDS && n < cap; k++)
        if (bits & (1u << k))
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "+" : "",
                                  kind_names[k]);
}

/* Read the first line of @path into @buf; 0 when it could. */
static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    int ok;

    if (f == NULL)
        return -1;
    ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static void check_build(kvt__doc_t *d)
{
    const kvt_version_t *v = kvt_version();
    kvt_transport_info_t t[16];
    char list[128] = "";
    size_t n = 0, used = 0;

    kvt_transports(t, 16, &n);
    for (size_t i = 0; i < n && i < 16; i++)
        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s",
                                 i ? ", " : "", t[i].name);
    kvt__doc_add(d, "host.kvt", KVT_DOCTOR_OK, KVT_OK, NULL,
                 "kvt %s, wire protocol %u.%u; transports built: %s", v->string,
                 v->wire_major, v->wire_minor, list);
}

/* Each transport: built? runs when asked? what it moves. */
static void check_transports(kvt__doc_t *d)
{
    static const struct {
        uint32_t id;
        const char *name, *fix;
    } all[] = {
        {KVT_TRANSPORT_TCP, "tcp", "rebuild kvt"},
        {KVT_TRANSPORT_SHM, "shm", "rebuild kvt on Linux with memfd"},
        {KVT_TRANSPORT_UCX, "ucx",
         "install UCX (Debian: libucx-dev) and rebuild kvt with "
         "-DKVT_WITH_UCX=ON, or leave ucx out of the engine's transports"},
    };

    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) {
        const kvt__tl_ops_t *ops = kvt__tl_by_id(all[k].id);
        char id[64], lk[32], rk[32], info[512];
        kvt_engine_h e = NULL;
        kvt_status_t st;
        uint64_t t0;
        kvt_doctor_check_t *c;
        int named =
            d->transports != KVT_TRANSPORT_ALL && (d->transports & all[k].id);

        snprintf(id, sizeof(id), "host.transport.%s", all[k].name);
        if (ops == NULL) {
            if (named)
                kvt__doc_add(d, id, KVT_DOCTOR_FAIL, KVT_ERR_NOT_SUPPORTED,
                             all[k].fix,
                             "%s was requested, but this library was built "
                             "without it",
                             all[k].name);
            else
                kvt__doc_add(d, id, KVT_DOCTOR_SKIP, KVT_OK, NULL,
                             "not built into this library");
            continue;
        }
        if (!(d->transports & all[k].id) ||
            ((ops->caps.flags & KVT__TL_EXPLICIT) && !named)) {
            kvt__doc_add(d, id, KVT_DOCTOR_SKIP, KVT_OK, NULL,
                         "built, not checked: %s",
                         (ops->caps.flags & KVT__TL_EXPLICIT)
                             ? "it runs only when named in the transports "
                               "(--transports)"
                             : "not in the transports asked for");
            continue;
        }
        kvt__doc_cause_reset(d);
        t0 = kvt__now_ns();
        st = kvt__doc_engine(d, all[k].id, &e);
        if (st != KVT_OK) {
            kvt__doc_add(
                d, id, KVT_DOCTOR_FAIL, st,
                "see the cause; an engine on this host leaves the transport "
                "out and its peers use another",
                "%s is built but does not start here: %s", all[k].name,
                kvt__doc_cause(d, kvt_status_str(st)));
            continue;
        }
        kinds(e->tl[0]->local_mem, lk, sizeof(lk));
        kinds(e->tl[0]->remote_mem, rk, sizeof(rk));
        info[0] = '\0';
        if (ops->host_info != NULL) {
            info[0] = ';';
            info[1] = ' ';
            ops->host_info(e->tl[0], info + 2, sizeof(info) - 2);
        }
        c = kvt__doc_add(d, id, KVT_DOCTOR_OK, KVT_OK, NULL,
                         "starts; moves %s memory here, reaches %s memory in "
                         "peers%s%s",
                         lk, rk,
                         (ops->caps.flags & KVT__TL_SAME_HOST)
                             ? "; same-host peers only"
                             : "",
                         info);
        if (c != NULL)
            c->ms = (double)(kvt__now_ns() - t0) / 1e6;
        kvt_engine_destroy(e);
    }
}

/* Device memory registered on an engine that runs transport @tl alone. */
static void device_per_transport(kvt__doc_t *d, const kvt__tl_t *tl)
{
    const kvt__tl_ops_t *ops = tl->ops;
    kvt_mem_params_t mp = {0};
    kvt_engine_h e = NULL;
    void *mem = NULL;
    char id[64];
    kvt_status_t st;

    snprintf(id, sizeof(id), "host.memory.cuda.%s", ops->name);
    if (!(tl->local_mem & KVT__MEM_BIT(KVT_MEM_CUDA))) {
        kvt__doc_add(d, id, KVT_DOCTOR_SKIP, KVT_OK, NULL,
                     "%s does not move device memory here%s", ops->name,
                     ops->id == KVT_TRANSPORT_UCX
                         ? " (its UCX has no CUDA transport): pairs with "
                           "device memory go another way"
                         : "");
        return;
    }
    kvt__doc_cause_reset(d);
    st = kvt__doc_engine(d, ops->id, &e);
    if (st == KVT_OK) {
        mp.field_mask = KVT_MEM_PARAM_KIND;
        mp.kind = KVT_MEM_CUDA;
        st = kvt_mem_alloc_ex(e, 2u << 20, &mp, &mem);
    }
    if (st != KVT_OK)
        kvt__doc_add(d, id, KVT_DOCTOR_FAIL, st, "see the cause (docs/cuda.md)",
                     "device memory does not register for %s: %s", ops->name,
                     kvt__doc_cause(d, kvt_status_str(st)));
    else
        kvt__doc_add(d, id, KVT_DOCTOR_OK, KVT_OK, NULL,
                     "device memory registers for %s%s", ops->name,
                     ops->id == KVT_TRANSPORT_TCP
                         ? " (moved staged through pinned host memory)"
                     : ops->id == KVT_TRANSPORT_SHM
                         ? " (shared with same-host peers through the "
                           "driver's IPC where it allows, else staged)"
                         : "");
    kvt_engine_destroy(e);
}

/* Device memory: a driver and devices, and whether a region registers. */
static void check_device(kvt__doc_t *d)
{
    kvt_mem_domain_info_t dom[8];
    size_t nd = 0;
    int want = (d->kinds >> KVT_MEM_CUDA) & 1;
    const char *alloc_conf = getenv("PYTORCH_CUDA_ALLOC_CONF");

    if (alloc_conf != NULL && strstr(alloc_conf, "expandable_segments:True"))
        kvt__doc_add(d, "host.memory.expandable", KVT_DOCTOR_WARN, KVT_OK,
                     "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False "
                     "for the KV cache's process, or allocate the cache "
                     "with cudaMalloc",
                     "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True: "
                     "such memory (the driver's virtual-memory API) cannot "
                     "be shared with cudaIpc, so same-host peers stage it "
                     "through host memory");
    kvt__doc_cause_reset(d);
    kvt_mem_domains(dom, 8, &nd);
    for (size_t i = 0; i < nd && i < 8; i++) {
        kvt_engine_h e = NULL;
        void *mem = NULL;
        kvt_mem_params_t mp = {0};
        kvt_status_t st;

        if (dom[i].kind != KVT_MEM_CUDA)
            continue;
        if (!dom[i].available) {
            if (want && d->kinds_asked)
                kvt__doc_add(d, "host.memory.cuda", KVT_DOCTOR_FAIL,
                             KVT_ERR_NOT_SUPPORTED,
                             "install the NVIDIA driver (libcuda.so.1) or "
                             "point KVT_CUDA_LIBRARY at it, and check that "
                             "the process sees a device "
                             "(CUDA_VISIBLE_DEVICES)",
                             "device memory was requested, but it cannot be "
                             "registered here: %s",
                             dom[i].detail);
            else
                kvt__doc_add(d, "host.memory.cuda", KVT_DOCTOR_SKIP, KVT_OK,
                             NULL, "no device memory here: %s", dom[i].detail);
            return;
        }
        d->kinds |= 1u << KVT_MEM_CUDA;
        st = kvt__doc_engine(d, d->transports, &e);
        if (st == KVT_OK) {
            mp.field_mask = KVT_MEM_PARAM_KIND;
            mp.kind = KVT_MEM_CUDA;
            st = kvt_mem_alloc_ex(e, 2u << 20, &mp, &mem);
        }
        if (st != KVT_OK) {
            kvt__doc_add(d, "host.memory.cuda", KVT_DOCTOR_FAIL, st,
                         "see the cause (docs/cuda.md lists what the driver "
                         "needs)",
                         "%s, but 2 MiB of device memory could not be "
                         "allocated and registered: %s",
                         dom[i].detail, kvt__doc_cause(d, kvt_status_str(st)));
        } else {
            char list[96] = "";
            size_t used = 0;
            for (unsigned k = 0; k < e->ntl; k++)
                if (e->tl[k]->local_mem & KVT__MEM_BIT(KVT_MEM_CUDA))
                    used += (size_t)snprintf(list + used, sizeof(list) - used,
                                             "%s%s", used ? ", " : "",
                                             e->tl[k]->ops->name);
            kvt__doc_add(d, "host.memory.cuda", KVT_DOCTOR_OK, KVT_OK, NULL,
                         "%s; device memory registers, moved here by: %s",
                         dom[i].detail, used ? list : "no transport");
            /* And for each transport alone: its own registration. */
            for (unsigned k = 0; k < e->ntl; k++)
                device_per_transport(d, e->tl[k]);
        }
        kvt_engine_destroy(e);
    }
}

static void check_shm(kvt__doc_t *d)
{
    char v[32];

    if (kvt__tl_by_id(KVT_TRANSPORT_SHM) == NULL ||
        !(d->transports & KVT_TRANSPORT_SHM))
        return;
    if (read_line("/proc/sys/kernel/yama/ptrace_scope", v, sizeof(v)) != 0) {
        kvt__doc_add(d, "host.shm.ptrace", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "no Yama module: same-host peers attach as their "
                     "credentials allow");
        return;
    }
    if (atoi(v) <= 1)
        kvt__doc_add(d, "host.shm.ptrace", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "Yama ptrace_scope %s: same-host peers attach (%s)", v,
                     atoi(v) == 1 ? "each target names one attaching peer "
                                    "process at a time with PR_SET_PTRACER"
                                  : "any process of the same user");
    else
        kvt__doc_add(d, "host.shm.ptrace", KVT_DOCTOR_WARN, KVT_OK,
                     "set kernel.yama.ptrace_scope to 1 (sysctl), or give "
                     "the processes CAP_SYS_PTRACE",
                     "Yama ptrace_scope %s: cross-memory attach is refused, so "
                     "shm moves only memory allocated through kvt "
                     "(kvt_mem_alloc) and other transfers go over tcp",
                     v);
}

static void check_limits(kvt__doc_t *d)
{
    struct rlimit rl;
    char cs[64];
    /* Per peer: its data connections both ways and a control
     * connection; and a margin for the process's own. */
    uint64_t need = (uint64_t)d->peers_expected * (2 * 2 + 1) + 256;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
            kvt__doc_add(d, "host.fds", KVT_DOCTOR_WARN, KVT_OK,
                         "raise the limit (ulimit -n, LimitNOFILE= in a "
                         "systemd unit, --ulimit nofile= for docker)",
                         "open files limited to %llu; %u peers with 2 "
                         "connections each way need about %llu",
                         (unsigned long long)rl.rlim_cur, d->peers_expected,
                         (unsigned long long)need);
        else
            kvt__doc_add(d, "host.fds", KVT_DOCTOR_OK, KVT_OK, NULL,
                         "open files limited to %llu; %u peers need about "
                         "%llu",
                         (unsigned long long)rl.rlim_cur, d->peers_expected,
                         (unsigned long long)need);
    }
    if (read_line("/sys/devices/system/clocksource/clocksource0/"
                  "current_clocksource",
                  cs, sizeof(cs)) == 0) {
        int fast = !strcmp(cs, "tsc") || !strcmp(cs, "kvm-clock") ||
                   !strcmp(cs, "arch_sys_counter");
        kvt__doc_add(d, "host.clock", fast ? KVT_DOCTOR_OK : KVT_DOCTOR_WARN,
                     KVT_OK,
                     fast ? NULL
                          : "use the tsc clock source where the CPU's is "
                            "stable (clocksource=tsc on the kernel's "
                            "command line)",
                     "clock source %s%s", cs,
                     fast ? ""
                          : ": reading the time costs microseconds, "
                            "and kvt reads it per transfer");
    }
}

/* The advertised address: what it resolves to, and a self-connect
 * through it. */
static void check_address(kvt__doc_t *d)
{
    char addr[64] = "", name[256];
    kvt_engine_h a = NULL, b = NULL;
    kvt_segment_t seg;
    kvt_status_t st;
    kvt_doctor_check_t *c;
    uint64_t t0;
    int loop = kvt__doc_loopback(d->local_host, addr, sizeof(addr));

    if (loop < 0) {
        kvt__doc_add(d, "host.address", KVT_DOCTOR_FAIL, KVT_ERR_INVALID_PARAM,
                     "give an address or a name this host resolves "
                     "(local_host, --host)",
                     "'%s' does not resolve here", d->local_host);
        return;
    }
    if (loop)
        kvt__doc_add(d, "host.address", KVT_DOCTOR_WARN, KVT_OK,
                     "set local_host (--host) to this host's address on the "
                     "network its peers use",
                     "an engine here would advertise '%s' (%s, loopback): "
                     "only peers on this host can reach it",
                     d->local_host, addr);
    else
        kvt__doc_add(d, "host.address", KVT_DOCTOR_OK, KVT_OK, NULL,
                     "an engine here would advertise '%s' (%s)", d->local_host,
                     addr);
    if (!d->host_asked && gethostname(name, sizeof(name)) == 0 &&
        kvt__doc_loopback(name, addr, sizeof(addr)) == 1)
        kvt__doc_add(d, "host.hostname", KVT_DOCTOR_WARN, KVT_OK,
                     "give engines an address (local_host), or map the name "
                     "to the host's network address in /etc/hosts",
                     "this host's name '%s' resolves to %s (loopback): an "
                     "engine that advertises the host name is reachable "
                     "from this host only",
                     name, addr);
    /* Reachable through it: one engine opens the other's segment by the
     * name it advertises. */
    kvt__doc_cause_reset(d);
    t0 = kvt__now_ns();
    st = kvt__doc_engine(d, KVT_TRANSPORT_TCP, &a);
    if (st == KVT_OK)
        st = kvt__doc_engine(d, KVT_TRANSPORT_TCP, &b);
    if (st == KVT_OK)
        st = kvt_segment_open(b, kvt_engine_segment_name(a), &seg);
    if (st != KVT_OK) {
        c = kvt__doc_add(
            d, "host.listen", KVT_DOCTOR_FAIL, st,
            "listen on an address of this host that its peers can reach "
            "(local_host), and let TCP to it through the firewall",
            "an engine on '%s' %s: %s", d->local_host,
            a == NULL ? "cannot listen" : "is not reachable through it",
            kvt__doc_cause(d, kvt_status_str(st)));
    } else {
        c = kvt__doc_add(d, "host.listen", KVT_DOCTOR_OK, KVT_OK, NULL,
                         "an engine listening on %s is reachable through "
                         "it from this host (connect and handshake; a "
                         "firewall between hosts shows in `kvt doctor "
                         "PEER` from another host)",
                         kvt_engine_segment_name(a));
    }
    if (c != NULL)
        c->ms = (double)(kvt__now_ns() - t0) / 1e6;
    kvt_engine_destroy(b);
    kvt_engine_destroy(a);
}

void kvt__doc_host(kvt__doc_t *d)
{
    check_build(d);
    check_transports(d);
    check_device(d);
    check_shm(d);
    check_limits(d);
    check_address(d);
}
