/*
 * dynsim.c: the dynamics model played event by event in C, for the CPU.
 *
 * The same rules as model/reference_sim.py (RefSim), one allocator operation at a time,
 * over the same random words (model/dynamics.py _draws_at(): a counter-based hash of
 * seed, step, rep and word), so the counters equal the JAX model's exactly.  Nothing
 * here is a new rule: every function names the RefSim method it plays, and that method's
 * docstring names the kernel function (mm/slub.c) and version.  Why it exists: the JAX
 * step on XLA:CPU moves about 1900 int32 values through memory per configuration and rep
 * op (benchmarks/README.md); one configuration's whole state here is about 2 KiB and stays
 * in L1 for all its steps.
 *
 * Built by sweeps/dynsim.py (gcc -O2 -shared -fPIC -pthread); the layout of the config
 * rows and of the outputs is defined there (CFG_FIELDS) and checked by dynsim_abi().
 */
#include "engine.h"

#define R 8           /* reps: model/workloads.py R */
#define N 4           /* node classes: model/workloads.py N */
#define K 3           /* random words per rep per step: model/dynamics.py K */
#define LEVELS 2      /* fill levels: model/dynamics.py LEVELS */
#define PROB_ONE 65536
#define NC 23         /* len(COUNTER_FIELDS) */
#define SEGS (3 * R + 1 + (LEVELS - 1) + 1)

/* counter indices, in COUNTER_FIELDS order */
enum { C_OPS, C_ALLOCS, C_FREES, C_ALLOC_FAST, C_ALLOC_SLOW, C_FREE_FAST, C_FREE_SLOW,
       C_REMOTE_FREE, C_LIST_LOCK, C_LIST_LOCK_REMOTE, C_SLAB_ALLOC, C_SLAB_FREE,
       C_SHEAF_ALLOC_HIT, C_SHEAF_FREE_HIT, C_SHEAF_REFILL, C_SHEAF_FLUSH, C_BARN_GET,
       C_BARN_PUT, C_BARN_GET_FAIL, C_BARN_PUT_FAIL, C_CPU_PARTIAL_DRAIN,
       C_SHEAF_ALLOC_REPLACE, C_SHEAF_FREE_REPLACE };

/* config row: scalars, then per-rep and per-node arrays (sweeps/dynsim.py CFG_FIELDS) */
enum { F_OBJS, F_CAP, F_CPU_SLAB, F_MIN_PARTIAL, F_CPU_PARTIAL, F_BYPASS, F_SINGLE,
       F_PC_EMPTY_LOCKS, F_TAKE_OBJECTS, F_MAX_FULL, F_MAX_EMPTY, F_USE_SH, F_FALLBACK, F_BARNS, F_B,
       F_FREE_OFF, F_DEFRAG, F_REP_NODE, F_REP_MEM = F_REP_NODE + R,
       F_REP_MEMLESS = F_REP_MEM + R, F_NODE_HAS_MEM = F_REP_MEMLESS + R,
       F_ALLOC_P = F_NODE_HAS_MEM + N, F_FREE_CUM = F_ALLOC_P + R,
       F_LIVE = F_FREE_CUM + R * R, F_HOLD = F_LIVE + R, F_BURST = F_HOLD + R,
       F_ACTIVE = F_BURST + R,
       F_PHASE_FIRST = F_ACTIVE + R, F_REP_MEM_HOME = F_PHASE_FIRST + R,
       F_LAG_MUL = F_REP_MEM_HOME + R, F_LAG_FREERS = F_LAG_MUL + R * R,
       F_LIST_NODES = F_LAG_FREERS + 1, NCFG = F_LIST_NODES + N };

/* model/workloads.py LAG_BITS, LAG_PEND_MAX; model/dynamics.py LAG_SUM_MAX */
#define LAG_BITS 4
#define LAG_PEND_MAX (1 << 14)
#define LAG_SUM_MAX ((1 << 23) - 1)

#define BARNS_MEMORY 1
#define BARNS_ALL 2

enum { D_CS, D_PC, D_RPC, D_HEAD, D_PART, D_FULL };

typedef struct { int8_t kind, k, lv; int64_t size; } seg_t;

typedef struct {
    /* configuration */
    int objs, cap, cpu_slab, min_partial[N], free_mp[N], list_nodes[N], cpu_partial_slabs,
        bypass, single;
    int pc_empty_locks, take_objects, take_half, max_full, max_empty, b, cs_sheaf, defrag;
    int node[R], mem[R], other[R], local_node[R], alloc_local[R], has_barn[R], memless[R];
    int mem_home[R];
    int alloc_p[R], free_cum[R][R], live[R], hold[R], burst[R], active[R];
    int lo[LEVELS], top;
    int lag_mul[R][R], lag_freers, half, win;
    /* state */
    int pend[R][R], pend_cs[R][R], cs_tracked[R], out[R], pend_tot[R];
    int cs_free[R], cs_inuse[R], cs_rfree[R];
    int pcs[R][LEVELS], pcu[R][LEVELS], pd[R], pw[R];
    int rps[R][LEVELS], rpu[R][LEVELS], rpd[R], rpw[R];
    int main_[R], spare[R], phase[R], phase_left[R];
    int ns[N][LEVELS], nu[N][LEVELS], hs[N], hu[N], F[N];
    int barn_full[N], barn_empty[N];
    int32_t counts[NC][R];
    int32_t lock_node[N];
    int64_t g_rep[3][R], g_node[3][N];
    int flushed;
    /* the running alloc run: its node list floor, whether its bulk takes use the list and
       the slabs of it its CPU slab's takes may still take (dynamics.home_share) */
    int floor, list_ok, share;
} sim_t;

/* ------------------------------------------------------------ random words */

/* dynamics._mix32 (lowbias32) */
static inline uint32_t mix32(uint32_t x) { return xmx32(x, 0x7FEB352Du, 15, 0x846CA68Bu); }

/* dynamics._draws_at(): word k of rep r at step t */
static inline uint32_t draw(uint32_t s, uint32_t t, int r, int k)
{
    uint32_t ctr = t * (uint32_t)(R * K) + (uint32_t)(r * K + k);
    return mix32((ctr * 0x9E3779B9u) ^ s);
}

/* ------------------------------------------------------------ helpers (RefSim) */

ENGINE_COUNTING_HELPERS

static inline int level_of(const sim_t *S, int h)
{
    int k = 0;
    for (int j = 1; j < LEVELS; j++)
        k += h >= S->lo[j];
    return k;
}

static inline int sum_lv(const int *s)
{
    int t = 0;
    for (int k = 0; k < LEVELS; k++)
        t += s[k];
    return t;
}

/* RefSim._list_free */
static int list_free(sim_t *S, int *s, int *u, int k)
{
    while (s[k] == 0)
        k--;
    u[k] -= 1;
    if (u[k] < S->lo[k] * s[k]) {
        s[k] -= 1;
        u[k] -= S->lo[k] - 1;
        s[k - 1] += 1;
        u[k - 1] += S->lo[k] - 1;
        return k == 1;
    }
    return 0;
}

/* Take the emptiest slab of a list at level k0 or above (its lowest such level, the q
 * slabs first); returns its allocated objects.  k0 = 0: RefSim._take_emptiest; k0 = 1:
 * RefSim._take_least_used (the partial slab with the fewest objects). */
static int take_lowest(int *s, int *u, int k0)
{
    int k = k0;
    while (s[k] == 0)
        k++;
    int q = u[k] / s[k];
    s[k] -= 1;
    u[k] -= q;
    return q;
}

/* RefSim._fifo_free (dynamics.fifo_frees): one free into node n's partial list, into its
 * head slab, the least used partial slab made the head first where there is none;
 * returns 1 when the head slab emptied (counted on level 0) */
static int fifo_free(sim_t *S, int n)
{
    if (!S->hs[n]) {
        S->hu[n] = take_lowest(S->ns[n], S->nu[n], 1);
        S->hs[n] = 1;
    }
    S->hu[n] -= 1;
    if (S->hu[n] == 0) {
        S->hs[n] = 0;
        S->ns[n][0] += 1;
        return 1;
    }
    return 0;
}

static inline int node_slabs(const sim_t *S, int n) { return sum_lv(S->ns[n]) + S->hs[n]; }
/* RefSim._own_slabs: the running alloc run's share (dynamics.home_share) at most the list */
static inline int own_slabs(const sim_t *S, int m)
{
    int n = node_slabs(S, m);
    return S->share < n ? S->share : n;
}

/* RefSim._node_empty */
static void node_empty(sim_t *S, int r, int n)
{
    lock_(S, r, n, 1);
    if (node_slabs(S, n) >= S->free_mp[n]) {
        S->ns[n][0] -= 1;
        bump(S, C_SLAB_FREE, r, 1);
    }
}

/* RefSim._take_node_slab */
static int take_node_slab(sim_t *S, int n)
{
    if (S->hs[n]) {
        int h = S->hu[n];
        S->hs[n] = 0;
        S->hu[n] = 0;
        return h;
    }
    return take_lowest(S->ns[n], S->nu[n], 0);
}

static inline int pc_local(const sim_t *S, int r) { return sum_lv(S->pcs[r]) + S->pw[r]; }
static inline int pc_remote(const sim_t *S, int r) { return sum_lv(S->rps[r]) + S->rpw[r]; }
static inline int pc_slabs(const sim_t *S, int r) { return pc_local(S, r) + pc_remote(S, r); }

/* RefSim._take_pc */
static int take_pc(sim_t *S, int r)
{
    if (S->pcs[r][0] == 0 && S->pw[r] > 0) {
        int h = S->pd[r] / S->pw[r];
        S->pd[r] -= h;
        S->pw[r] -= 1;
        return h;
    }
    return take_lowest(S->pcs[r], S->pcu[r], 0);
}

/* RefSim._add_pc */
static void add_pc(sim_t *S, int r, int h, int remote)
{
    int k = level_of(S, h);
    int *s = remote ? S->rps[r] : S->pcs[r];
    int *u = remote ? S->rpu[r] : S->pcu[r];
    s[k] += 1;
    u[k] += h;
}

/* ------------------------------------------------------------ node lists (RefSim) */

/* RefSim._bulk_take */
static int bulk_take(sim_t *S, int r, int m, int t)
{
    while (t > 0) {
        if (!S->hs[m]) {
            int h;
            if (S->list_ok && sum_lv(S->ns[m]) > 0) {
                h = take_lowest(S->ns[m], S->nu[m], 0);
            } else {
                h = 0;
                bump(S, C_SLAB_ALLOC, r, 1);
            }
            S->hs[m] = 1;
            S->hu[m] = h;
        }
        int y = S->objs - S->hu[m];
        if (t < y)
            y = t;
        S->hu[m] += y;
        t -= y;
        if (S->hu[m] == S->objs) {
            S->hs[m] = 0;
            S->hu[m] = 0;
            S->F[m] += 1;
        }
    }
    return S->hs[m];
}

/* RefSim._add_node */
static void add_node(sim_t *S, int n, int h)
{
    int k = level_of(S, h);
    S->ns[n][k] += 1;
    S->nu[n][k] += h;
}

/* RefSim._refill */
static void cs_alloc(sim_t *S, int r, int m, int j);

static void refill(sim_t *S, int r, int m)
{
    if (S->cs_sheaf) {
        for (int i = 0; i < S->cap; i++)
            cs_alloc(S, r, m, -1);
        return;
    }
    if (!S->single) {
        bulk_take(S, r, m, S->cap);
        lock_(S, r, m, 1);
        return;
    }
    int locks = (S->list_ok ? node_slabs(S, m) : S->hs[m]) > 0;
    int left = bulk_take(S, r, m, S->cap);
    for (int i = 0; i < locks + left; i++)
        lock_(S, r, m, 1);
}

/* RefSim._bulk_free */
static void bulk_free(sim_t *S, int r, int m, int k)
{
    int objs = S->objs, chg = 0;
    int64_t size[LEVELS];
    int where[LEVELS];
    int nseg = 0;
    size[nseg] = S->hs[m] ? S->hu[m] : 0;
    where[nseg++] = -1;                       /* the head slab */
    for (int lv = LEVELS - 1; lv >= 1; lv--) {
        size[nseg] = S->nu[m][lv];
        where[nseg++] = lv;
    }
    int64_t tot = 0;
    for (int i = 0; i < nseg; i++)
        tot += size[i];
    int x = k < tot ? k : (int)tot;
    for (int q = 0; q < x; q++) {
        int64_t p = (int64_t)q * tot / x, acc = 0;
        int w = -2;
        for (int i = 0; i < nseg; i++) {
            if (p < acc + size[i]) {
                w = where[i];
                break;
            }
            acc += size[i];
        }
        if (w == -1) {
            S->hu[m] -= 1;
            if (S->hu[m] == 0) {
                S->hs[m] = 0;
                S->ns[m][0] += 1;
                chg += 1;
            }
        } else {
            chg += list_free(S, S->ns[m], S->nu[m], w);
        }
    }
    int y = k - x;
    if ((int64_t)S->F[m] * objs < y)
        y = S->F[m] * objs;
    int g = (y + objs - 1) / objs;
    S->F[m] -= g;
    int h = g * objs - y;
    if (g > 0) {
        S->ns[m][0] += g - 1;
        add_node(S, m, h);
    }
    if (k > 0) {
        int drop = node_slabs(S, m) - S->min_partial[m];
        if (drop > S->ns[m][0])
            drop = S->ns[m][0];
        if (drop < 0)
            drop = 0;
        S->ns[m][0] -= drop;
        bump(S, C_SLAB_FREE, r, drop);
    }
    for (int i = 0; i < chg + g; i++)
        lock_(S, r, m, 1);
}

/* RefSim._drain */
static void drain(sim_t *S, int r)
{
    for (int part = 0; part < 2; part++) {
        int m = part ? S->other[r] : S->mem[r];
        int *s = part ? S->rps[r] : S->pcs[r];
        int *u = part ? S->rpu[r] : S->pcu[r];
        int pd = part ? S->rpd[r] : S->pd[r];
        int pw = part ? S->rpw[r] : S->pw[r];
        if (sum_lv(s) + pw == 0)
            continue;
        int e = s[0];
        for (int k = 1; k < LEVELS; k++) {
            S->ns[m][k] += s[k];
            S->nu[m][k] += u[k];
        }
        for (int i = 0; i < pw; i++) /* the window, its objects spread evenly */
            add_node(S, m, pd / pw + (i < pd % pw));
        int keep = S->min_partial[m] - node_slabs(S, m);
        if (keep > e)
            keep = e;
        if (keep < 0)
            keep = 0;
        S->ns[m][0] += keep;
        bump(S, C_SLAB_FREE, r, e - keep);
        lock_(S, r, m, 1);
    }
    memset(S->pcs[r], 0, sizeof S->pcs[r]);
    memset(S->pcu[r], 0, sizeof S->pcu[r]);
    memset(S->rps[r], 0, sizeof S->rps[r]);
    memset(S->rpu[r], 0, sizeof S->rpu[r]);
    S->pd[r] = 0;
    S->rpd[r] = 0;
    S->pw[r] = 0;
    S->rpw[r] = 0;
    bump(S, C_CPU_PARTIAL_DRAIN, r, 1);
}

/* ------------------------------------------------------------ operations (RefSim) */

/* RefSim._sheaf_free */
static void sheaf_free(sim_t *S, int r)
{
    int own = S->node[r];
    if (S->main_[r] < S->cap) {
        S->main_[r] += 1;
        bump(S, C_SHEAF_FREE_HIT, r, 1);
        bump(S, C_FREE_FAST, r, 1);
        return;
    }
    bump(S, C_SHEAF_FREE_REPLACE, r, 1);
    bump(S, C_FREE_FAST, r, 1);
    if (S->spare[r] == 0) {
        S->spare[r] = S->cap;
    } else if (S->has_barn[r] && S->barn_full[own] < S->max_full) {
        bump(S, C_BARN_PUT, r, 1);
        S->barn_full[own] += 1;
        if (S->barn_empty[own] > 0)
            S->barn_empty[own] -= 1;
    } else {
        if (S->has_barn[r])
            bump(S, C_BARN_PUT_FAIL, r, 1);
        bump(S, C_SHEAF_FLUSH, r, 1);
        S->flushed += S->cap;
    }
    S->main_[r] = 1;
}

/* RefSim._pc_free */
static void pc_free(sim_t *S, int r, int k, int remote)
{
    int *s = remote ? S->rps[k] : S->pcs[k];
    int *u = remote ? S->rpu[k] : S->pcu[k];
    int *pd = remote ? &S->rpd[k] : &S->pd[k];
    int *pw = remote ? &S->rpw[k] : &S->pw[k];
    int node = remote ? S->other[k] : S->mem[k];
    if (*pw < S->win && sum_lv(s) - s[0] > 0) {
        *pd += take_lowest(s, u, 1);
        *pw += 1;
    }
    *pd -= 1;
    if (*pw > 0 && *pd <= S->half * (*pw - 1)) {
        *pw -= 1;
        s[0] += 1;
        if (S->pc_empty_locks)
            lock_(S, r, node, 1);
    }
}

/* RefSim._node_free: lv -1 is the head slab */
static void node_free(sim_t *S, int r, int n, int lv)
{
    int emptied;
    if (S->cpu_slab) {
        emptied = fifo_free(S, n);
    } else if (lv < 0) {
        S->hu[n] -= 1;
        emptied = S->hu[n] == 0;
        if (emptied) {
            S->hs[n] = 0;
            S->ns[n][0] += 1;
        }
    } else {
        emptied = list_free(S, S->ns[n], S->nu[n], lv);
    }
    if (emptied)
        node_empty(S, r, n);
}

/* RefSim._slab_free */
static void slab_free(sim_t *S, int r, int n, const seg_t *dest)
{
    int kind = dest->kind, k = dest->k;
    int m = S->mem[r];
    if (kind == D_CS) {
        S->cs_inuse[k] -= 1;
        if (k == r) {
            S->cs_free[r] += 1;
            bump(S, C_FREE_FAST, r, 1);
            return;
        }
        S->cs_rfree[k] += 1;
        bump(S, C_FREE_SLOW, r, 1);
        return;
    }
    bump(S, C_FREE_SLOW, r, 1);
    if (kind == D_PC || kind == D_RPC) {
        pc_free(S, r, k, kind == D_RPC);
        return;
    }
    if (kind == D_HEAD || kind == D_PART) {
        node_free(S, r, n, kind == D_HEAD ? -1 : dest->lv);
        return;
    }
    int cpu_partial = S->cpu_partial_slabs > 0 && S->cpu_slab;
    int remote = n != m;
    if (S->F[n] <= 0) {
        int held = remote ? S->rpd[r] + sum_lv(S->rpu[r]) : S->pd[r] + sum_lv(S->pcu[r]);
        if (cpu_partial && held > 0)
            pc_free(S, r, r, remote);
        else
            node_free(S, r, n, S->top);
        return;
    }
    S->F[n] -= 1;
    if (cpu_partial) {
        if (pc_slabs(S, r) >= S->cpu_partial_slabs)
            drain(S, r);
        add_pc(S, r, S->objs - 1, remote);
        return;
    }
    lock_(S, r, n, 1);
    if (S->objs == 1 && node_slabs(S, n) >= S->free_mp[n]) {
        bump(S, C_SLAB_FREE, r, 1);
    } else {
        S->ns[n][S->top] += 1;
        S->nu[n][S->top] += S->objs - 1;
    }
}

/* RefSim._slab_sizes: node n's allocated objects by slab, in destination order */
static void slab_sizes(const sim_t *S, int n, seg_t *out)
{
    int i = 0;
    for (int k = 0; k < R; k++) {
        int on = S->mem[k] == n, rem = S->other[k] == n;
        out[i++] = (seg_t){D_CS, (int8_t)k, 0, on ? S->cs_inuse[k] - S->cs_tracked[k] : 0};
        out[i++] = (seg_t){D_PC, (int8_t)k, 0, on ? S->pd[k] + sum_lv(S->pcu[k]) : 0};
        out[i++] = (seg_t){D_RPC, (int8_t)k, 0, rem ? S->rpd[k] + sum_lv(S->rpu[k]) : 0};
    }
    out[i++] = (seg_t){D_HEAD, -1, 0, S->hs[n] ? S->hu[n] : 0};
    for (int lv = LEVELS - 1; lv >= 1; lv--)
        out[i++] = (seg_t){D_PART, -1, (int8_t)lv, S->nu[n][lv]};
    out[i++] = (seg_t){D_FULL, -1, 0, (int64_t)S->F[n] * S->objs};
}

/* RefSim._cs_alloc: one object from rep r's CPU slab, for rep j to free, or (j < 0) for
 * a v6.18 sheaf refill, whose objects stay untracked in the CPU slab */
static void cs_alloc(sim_t *S, int r, int m, int j)
{
    if (S->cs_free[r] > 0) {
        bump(S, C_ALLOC_FAST, r, 1);
    } else {
        bump(S, C_ALLOC_SLOW, r, 1);
        if (S->cs_rfree[r] > 0) {
            S->cs_free[r] = S->cs_rfree[r];
            S->cs_rfree[r] = 0;
        } else {
            int h;
            if (S->cs_inuse[r] > 0)
                S->F[m] += 1;
            memset(S->pend_cs[r], 0, sizeof S->pend_cs[r]);
            S->cs_tracked[r] = 0;
            if (pc_local(S, r) > 0) {
                h = take_pc(S, r);
            } else if (own_slabs(S, m) > S->floor) {
                h = take_node_slab(S, m);
                lock_(S, r, m, 1);
                S->share -= 1;
                if (S->take_objects) {
                    /* v3.2 to v5.15: until the slabs taken hold more than
                       slub_cpu_partial(s) / 2 free objects, the first included */
                    int available = S->objs - h;
                    while (available <= S->take_half && own_slabs(S, m) > 0) {
                        int h2 = take_node_slab(S, m);
                        add_pc(S, r, h2, 0);
                        S->share -= 1;
                        available += S->objs - h2;
                    }
                } else if (S->cpu_partial_slabs > 0) {
                    int k = own_slabs(S, m);
                    if (k > S->cpu_partial_slabs / 2 + 1)
                        k = S->cpu_partial_slabs / 2 + 1;
                    for (int i = 0; i < k; i++)
                        add_pc(S, r, take_node_slab(S, m), 0);
                    S->share -= k;
                }
            } else {
                h = 0;
                bump(S, C_SLAB_ALLOC, r, 1);
            }
            S->cs_free[r] = S->objs - h;
            S->cs_inuse[r] = h;
        }
    }
    S->cs_free[r] -= 1;
    S->cs_inuse[r] += 1;
    if (j >= 0) {
        S->pend_cs[r][j] += 1;
        S->cs_tracked[r] += 1;
    }
}

/* RefSim.alloc */
static void alloc_one(sim_t *S, int r, int j)
{
    bump(S, C_ALLOCS, r, 1);
    int m = S->mem[r];
    if (S->cap > 0) {
        if (S->main_[r] > 0) {
            S->main_[r] -= 1;
            bump(S, C_SHEAF_ALLOC_HIT, r, 1);
            bump(S, C_ALLOC_FAST, r, 1);
        } else if (S->spare[r] == 0 && !S->has_barn[r] && S->single) {
            bump(S, C_ALLOC_SLOW, r, 1);
            bulk_take(S, r, m, 1);
            lock_(S, r, m, 1);
        } else {
            bump(S, C_SHEAF_ALLOC_REPLACE, r, 1);
            bump(S, C_ALLOC_FAST, r, 1);
            int own = S->node[r];
            if (S->spare[r] > 0) {
                S->main_[r] = S->spare[r] - 1;
                S->spare[r] = 0;
            } else if (S->has_barn[r] && S->barn_full[own] > 0) {
                bump(S, C_BARN_GET, r, 1);
                S->barn_full[own] -= 1;
                if (S->barn_empty[own] < S->max_empty)
                    S->barn_empty[own] += 1;
                S->main_[r] = S->cap - 1;
            } else {
                if (S->has_barn[r])
                    bump(S, C_BARN_GET_FAIL, r, 1);
                bump(S, C_SHEAF_REFILL, r, 1);
                refill(S, r, m);
                S->main_[r] = S->cap - 1;
            }
        }
    } else if (!S->alloc_local[r]) {
        bump(S, C_ALLOC_SLOW, r, 1);
        bulk_take(S, r, m, 1);
        lock_(S, r, m, 1);
    } else {
        cs_alloc(S, r, m, j);
    }
    S->pend[r][j] += 1;
    S->out[r] += 1;
    S->pend_tot[j] += 1;
}

/* RefSim.alloc_run, with dynamics.node_list_floor */
static void alloc_run(sim_t *S, int r, int n, uint32_t w1, uint32_t w2)
{
    int m = S->mem[r];
    int searched = (int)(w2 & 1023u) <= S->defrag;
    S->floor = S->memless[r] ? (searched ? S->min_partial[m] : 1 << 30 /* NO_TAKE */) : 0;
    int sl = node_slabs(S, m), kn = S->list_nodes[m], q = sl / kn;
    S->list_ok = sl > S->floor;
    /* dynamics.home_share */
    S->share = q + ((int)((w2 >> 16) % (uint32_t)kn) < sl - q * kn);
    int aside = 0;
    if (!S->list_ok && S->hs[m]) {
        aside = S->hu[m];
        S->hs[m] = 0;
        S->hu[m] = 0;
    }
    int64_t lo16 = w1 & 0xFFFF;
    for (int i = 0; i < n; i++) {
        int64_t p = (lo16 + (int64_t)i * PROB_ONE) / n;
        int j = R - 1;
        for (int k = 0; k < R; k++)
            if (p < S->free_cum[r][k]) {
                j = k;
                break;
            }
        alloc_one(S, r, j);
    }
    if (aside > 0) {
        if (S->hs[m]) {
            add_node(S, m, aside);
        } else {
            S->hs[m] = 1;
            S->hu[m] = aside;
        }
    }
}

/* RefSim.free_run: picks, sheaf frees, CPU-slab frees, then slab frees by destination */
static void free_run(sim_t *S, int r, int n, uint32_t w1, uint32_t w2,
                     int *pick_o, int8_t *pick_cs, seg_t *dd)
{
    int64_t T = S->pend_tot[r] > 1 ? S->pend_tot[r] : 1;
    int64_t u = (int64_t)(w1 >> 1) % T;
    int used[N] = {0};
    int k_of[R] = {0};
    for (int q = 0; q < n; q++) {
        int64_t p = (u + (int64_t)q * T) / n, acc = 0;
        int po = R - 1;
        for (int i = 0; i < R; i++) {
            if (p < acc + S->pend[i][r]) {
                po = i;
                break;
            }
            acc += S->pend[i][r];
        }
        k_of[po] += 1;
    }
    /* oldest first within an origin (dynamics.fifo_split): the objects of its earlier
     * slabs, then those of its current CPU slab */
    int q = 0;
    for (int i = 0; i < R; i++) {
        int old = S->pend[i][r] - S->pend_cs[i][r];
        if (old > k_of[i])
            old = k_of[i];
        if (old > 0)
            used[S->mem[i]] = 1;
        for (int x = 0; x < k_of[i]; x++, q++) {
            pick_o[q] = i;
            pick_cs[q] = (int8_t)(x >= old);
        }
    }
    /* the slab sizes as the run starts, of the node classes its objects come from */
    if (S->cs_sheaf)
        used[S->mem[r]] = 1;
    seg_t sizes[N][SEGS];
    for (int nn = 0; nn < N; nn++)
        if (used[nn])
            slab_sizes(S, nn, sizes[nn]);
    int m = S->mem[r];
    int other[N] = {0};
    int nsheaf = 0, ncs = 0, nself = 0;
    int *in_cs = pick_o + n;          /* scratch after the picks */
    for (int q = 0; q < n; q++) {
        int origin = pick_o[q], cs = pick_cs[q];
        int n_o = S->mem[origin];
        /* dynamics.remote_to */
        int remote = n_o != S->local_node[r] || S->mem_home[origin] != S->mem_home[r];
        bump(S, C_FREES, r, 1);
        if (remote)
            bump(S, C_REMOTE_FREE, r, 1);
        S->pend[origin][r] -= 1;
        S->out[origin] -= 1;
        S->pend_tot[r] -= 1;
        if (cs) {
            S->pend_cs[origin][r] -= 1;
            S->cs_tracked[origin] -= 1;
        }
        if (S->cap > 0 && !(S->bypass && remote))
            nsheaf++;
        else if (cs)
            in_cs[ncs++] = origin;
        else {
            other[n_o] += 1;
            nself += origin == r;
        }
    }
    /* this rep's own older objects onto its own per-CPU partial list first, up to the
     * list's objects as the run starts (dynamics._own_first) */
    int own = 0;
    if (nself) {
        seg_t *pc = &sizes[m][3 * r + 1];
        own = nself < pc->size ? nself : (int)pc->size;
        other[m] -= own;
        pc->size -= own;
    }
    S->flushed = 0;
    for (int i = 0; i < nsheaf; i++)
        sheaf_free(S, r);
    /* 7.x: a run's flushed sheaves go back as one bulk free; v6.18's opt-in caches free
     * each object as slab_free() would, with the run's other frees into node m's slabs */
    if (S->cs_sheaf)
        other[m] += S->flushed;
    else
        bulk_free(S, r, m, S->flushed);
    for (int i = 0; i < ncs; i++) {
        int origin = in_cs[i];
        S->cs_inuse[origin] -= 1;
        if (origin == r) {
            S->cs_free[r] += 1;
            bump(S, C_FREE_FAST, r, 1);
        } else {
            S->cs_rfree[origin] += 1;
            bump(S, C_FREE_SLOW, r, 1);
        }
    }
    int off[N], cnt[N];
    int tot_d = 0;
    for (int nn = 0; nn < N; nn++) {
        int x = other[nn];
        off[nn] = tot_d;
        cnt[nn] = x;
        if (nn == m && own) {
            for (int q = 0; q < own; q++)
                dd[tot_d++] = (seg_t){D_PC, (int8_t)r, 0, 0};
            cnt[nn] += own;
        }
        if (x == 0)
            continue;
        int64_t tot = 0;
        for (int i = 0; i < SEGS; i++)
            tot += sizes[nn][i].size;
        if (tot < 1)
            tot = 1;
        int64_t un = (int64_t)(w2 >> 1) % tot;
        for (int q = 0; q < x; q++) {
            int64_t p = (un + (int64_t)q * tot) / x, acc = 0;
            const seg_t *dest = &sizes[nn][SEGS - 1];
            for (int i = 0; i < SEGS; i++) {
                if (p < acc + sizes[nn][i].size) {
                    dest = &sizes[nn][i];
                    break;
                }
                acc += sizes[nn][i].size;
            }
            dd[tot_d++] = *dest;
        }
    }
    for (int full = 0; full < 2; full++)
        for (int nn = 0; nn < N; nn++)
            for (int q = 0; q < cnt[nn]; q++) {
                const seg_t *dest = &dd[off[nn] + q];
                if ((dest->kind == D_FULL) == full)
                    slab_free(S, r, nn, dest);
            }
}

/* RefSim._choose: the kind of rep r's run (0 none, 1 alloc, 2 free) and its length */
static int choose(sim_t *S, int r, uint32_t w0, int *n_out)
{
    if (!S->active[r])
        return 0;
    int can_a = S->alloc_p[r] > 0 && S->out[r] < S->live[r];
    int excess = S->pend_tot[r] - S->hold[r];   /* workloads.hold_levels */
    int can_f = excess > 0;
    int want_a = S->burst[r] > 0 ? S->phase[r] == 0 : (int)(w0 >> 16) < S->alloc_p[r];
    int op, n;
    if (can_a && (want_a || !can_f)) {
        op = 1;
        n = S->live[r] - S->out[r];
    } else if (can_f) {
        op = 2;
        n = excess;
    } else {
        return 0;
    }
    if (n > S->b)
        n = S->b;
    if (S->burst[r] > 0) {
        if (n > S->phase_left[r])
            n = S->phase_left[r];
        S->phase_left[r] -= n;
        if (S->phase_left[r] <= 0) {
            S->phase[r] = 1 - S->phase[r];
            S->phase_left[r] = S->burst[r];
        }
    }
    bump(S, C_OPS, r, n);
    *n_out = n;
    return op;
}

/* RefSim._gauge */
static void gauge(sim_t *S)
{
    for (int r = 0; r < R; r++) {
        S->g_rep[0][r] += S->out[r];
        S->g_rep[1][r] += pc_slabs(S, r);
        S->g_rep[2][r] += S->main_[r] + S->spare[r];
    }
    for (int n = 0; n < N; n++) {
        int64_t held = 0;
        for (int k = 0; k < R; k++) {
            if (S->mem[k] == n)
                held += (S->cs_free[k] + S->cs_inuse[k] + S->cs_rfree[k] > 0) + pc_local(S, k);
            if (S->other[k] == n)
                held += pc_remote(S, k);
        }
        S->g_node[0][n] += node_slabs(S, n) + S->F[n] + held;
        S->g_node[1][n] += S->ns[n][0];
        S->g_node[2][n] += (int64_t)S->barn_full[n] * S->cap;
    }
}

/* RefSim.__init__ */
static void init(sim_t *S, const int32_t *c)
{
    memset(S, 0, sizeof *S);
    S->objs = c[F_OBJS];
    S->cap = c[F_CAP];
    S->cpu_slab = c[F_CPU_SLAB] > 0;
    /* dynamics.node_min_partial(): min_partial for the nodes' lists a class's list sums */
    for (int n = 0; n < N; n++) {
        S->min_partial[n] = c[F_MIN_PARTIAL] * c[F_LIST_NODES + n];
        S->list_nodes[n] = c[F_LIST_NODES + n];
        S->free_mp[n] = S->min_partial[n] + c[F_FREE_OFF];
    }
    S->cpu_partial_slabs = c[F_CPU_PARTIAL];
    S->bypass = c[F_BYPASS] > 0;
    S->single = c[F_SINGLE] > 0;
    S->pc_empty_locks = c[F_PC_EMPTY_LOCKS] > 0;
    /* dynamics.take_half: v3.2 to v5.15 get_partial_node() stops by free objects */
    S->take_objects = c[F_TAKE_OBJECTS] > 0 && S->cpu_partial_slabs > 0;
    S->take_half = (S->cpu_partial_slabs > 1 ? S->cpu_partial_slabs - 1 : 0) / 2;
    S->max_full = c[F_MAX_FULL];
    S->max_empty = c[F_MAX_EMPTY];
    S->b = c[F_B];
    S->defrag = c[F_DEFRAG];
    /* v6.18 opt-in caches: sheaves beside the CPU slab, refilled and flushed through it */
    S->cs_sheaf = S->cap > 0 && S->cpu_slab;
    int use_sh = c[F_USE_SH] > 0, fallback = c[F_FALLBACK] > 0, barns = c[F_BARNS];
    int barn_at[N];
    for (int n = 0; n < N; n++)
        barn_at[n] = barns == BARNS_ALL || (barns == BARNS_MEMORY && c[F_NODE_HAS_MEM + n] > 0);
    for (int r = 0; r < R; r++) {
        int memless = c[F_REP_MEMLESS + r] > 0;
        S->node[r] = c[F_REP_NODE + r];
        S->mem[r] = c[F_REP_MEM + r];
        S->mem_home[r] = c[F_REP_MEM_HOME + r];
        for (int j = 0; j < R; j++)
            S->lag_mul[r][j] = c[F_LAG_MUL + r * R + j];
        S->other[r] = 1 - S->mem[r];
        S->local_node[r] = (memless && !use_sh) ? S->node[r] : S->mem[r];
        S->alloc_local[r] = !memless || fallback;
        S->memless[r] = memless;
        S->has_barn[r] = barn_at[S->node[r]] && S->cap > 0;
        READ_WORKLOAD(S, c, r);
    }
    /* dynamics.level_bounds() */
    S->lo[0] = 0;
    for (int k = 1; k < LEVELS; k++) {
        int v = ((k - 1) * S->objs + (LEVELS - 1) - 1) / (LEVELS - 1);
        S->lo[k] = v > k ? v : k;
    }
    S->top = level_of(S, S->objs - 1);
    S->lag_freers = c[F_LAG_FREERS];
    S->half = S->objs / 2;
    S->win = 1;
}

/* dynamics.pc_window (RefSim._window): the slabs a per-CPU partial list's freers free
 * into at once, from how far behind each sender its freers are as the step starts */
static int pc_window(const sim_t *S)
{
    if (S->lag_freers == 0) /* no sender with two freers: no spread (local, block I/O) */
        return 1;
    int64_t tot = 0;
    for (int o = 0; o < R; o++) {
        int any = 0;
        int64_t hi = 0, lo = 0;
        for (int j = 0; j < R; j++) {
            if (S->lag_mul[o][j] <= 0)
                continue;
            int p = S->pend[o][j] < LAG_PEND_MAX ? S->pend[o][j] : LAG_PEND_MAX;
            int64_t lag = (int64_t)p * S->lag_mul[o][j];
            if (!any || lag > hi)
                hi = lag;
            if (!any || lag < lo)
                lo = lag;
            any = 1;
        }
        if (any)
            tot += (hi - lo) >> LAG_BITS;
    }
    if (tot > LAG_SUM_MAX)
        tot = LAG_SUM_MAX;
    int fr = S->lag_freers > 1 ? S->lag_freers : 1;
    return 1 + (int)(tot / ((int64_t)S->objs * fr));
}

static void *run_part(void *arg)
{
    job_t *J = arg;
    sim_t *S = malloc(sizeof *S);
    int bmax = 1, capmax = 0;
    for (int i = J->lo; i < J->hi; i++) {
        const int32_t *c = J->cfg + (int64_t)i * NCFG;
        if (c[F_B] > bmax)
            bmax = c[F_B];
        if (c[F_CAP] > capmax)
            capmax = c[F_CAP];
    }
    int *pick_o = malloc(sizeof(int) * 2 * (size_t)bmax);
    int8_t *pick_cs = malloc((size_t)bmax);
    /* a run's slab frees: its own, and (v6.18) the objects of the sheaves it flushed, at
     * most one per cap sheaf frees plus the first: n + 2 cap */
    seg_t *dd = malloc(sizeof(seg_t) * ((size_t)bmax + 2 * (size_t)capmax));
    if (!S || !pick_o || !pick_cs || !dd) {
        J->err = 1;
        goto out;
    }
    for (int i = J->lo; i < J->hi; i++) {
        init(S, J->cfg + (int64_t)i * NCFG);
        uint32_t s = mix32(J->seeds[i] ^ 0x5BD1E995u);
        int next = 0;
        STORE_CHECKPOINTS(J, i, S, 0, &next);
        for (int t = 0; t < RUN_STEPS(J, i); t++) {
            S->win = pc_window(S);
            for (int r = 0; r < R; r++) {
                int n = 0;
                int op = choose(S, r, draw(s, (uint32_t)t, r, 0), &n);
                if (op == 1)
                    alloc_run(S, r, n, draw(s, (uint32_t)t, r, 1), draw(s, (uint32_t)t, r, 2));
                else if (op == 2)
                    free_run(S, r, n, draw(s, (uint32_t)t, r, 1), draw(s, (uint32_t)t, r, 2),
                             pick_o, pick_cs, dd);
            }
            gauge(S);
            STORE_CHECKPOINTS(J, i, S, t + 1, &next);
        }
    }
out:
    free(S);
    free(pick_o);
    free(pick_cs);
    free(dd);
    return NULL;
}

/* The constants the Python side checks against the model's before the first call. */
static const int32_t ABI[] = {R, N, K, LEVELS, NC, NCFG};

ENGINE_ENTRY_POINTS(dynsim)
