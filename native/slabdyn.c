/*
 * slabdyn.c: the SLAB dynamics model played event by event in C, for the CPU.
 *
 * The rules of model/slab_reference.py (SlabRefSim), one operation at a time, over the
 * same random words (model/slab_dynamics.py _words_at()), so the counters equal the JAX
 * model's exactly.  Each function names the SlabRefSim method it plays; that method's
 * docstring names the mm/slab.c function (6.1, or the 2.6.35-3.x "old" file).  Built and
 * loaded by sweeps/dynsim.py (CFG_SLAB_FIELDS is the config row's layout).
 */
#include "engine.h"

#define R 8
#define N 4
#define K 2
#define NC 25                 /* len(slab_dynamics.COUNTER_FIELDS) */
#define NRG 2                 /* REP_GAUGES */
#define NNG 4                 /* NODE_GAUGES */
#define BATCHREFILL_LIMIT 16

static const int LOCKS_REFILL_GROW[2] = {4, 1};
static const int LOCKS_FALLBACK_OWN[2] = {4, 1};
static const int LOCKS_FALLBACK_GROW[2] = {3, 2};

enum { C_OPS, C_ALLOCS, C_FREES, C_ALLOC_FAST, C_ALLOC_SLOW, C_FREE_FAST, C_FREE_SLOW,
       C_REMOTE_FREE, C_LIST_LOCK, C_LIST_LOCK_REMOTE, C_SLAB_ALLOC, C_SLAB_FREE,
       C_REFILL_SHARED, C_REFILL_SLABS, C_REFILL_GROW, C_ALLOC_FALLBACK, C_FLUSH_SHARED,
       C_FLUSH_SLABS, C_ALIEN_LOCK, C_ALIEN_FLUSH, C_REAP_ALIEN, C_REAP_DRAIN, C_REAP_SHARED,
       C_REAP_SLAB_FREE, C_OBJECTS_MOVED };

enum { F_NUM, F_LIMIT, F_BC, F_SH_ENT, F_ALIEN_LIMIT, F_REAP, F_OLD_LOCKS, F_ON_EMPTY,
       F_FREE_LIMIT, F_REP_NODE = F_FREE_LIMIT + N, F_REP_MEM = F_REP_NODE + R,
       F_LOCAL = F_REP_MEM + R, F_ALLOC_LOCAL = F_LOCAL + R, F_FIRST = F_ALLOC_LOCAL + R,
       F_ALLOC_P = F_FIRST + R, F_FREE_CUM = F_ALLOC_P + R, F_LIVE = F_FREE_CUM + R * R,
       F_HOLD = F_LIVE + R, F_BURST = F_HOLD + R, F_ACTIVE = F_BURST + R,
       F_PHASE_FIRST = F_ACTIVE + R, F_REP_MEM_HOME = F_PHASE_FIRST + R,
       NCFG = F_REP_MEM_HOME + R };

typedef struct {
    int num, limit, bc, sh_ent, alien_limit, reap, era, on_empty;
    int free_limit[N], node[R], mem[R], local[R], alloc_local[R], first[R], home[R];
    int alloc_p[R], free_cum[R][R], live[R], hold[R], burst[R], active[R];
    int pend[R][R], out[R], pend_tot[R], phase[R], phase_left[R];
    int avail[R], touched[R];
    int shared[N], sh_touched[N], free_[N], slabs[N], free_touched[N];
    int alien[N][N];
    int32_t counts[NC][R];
    int32_t lock_node[N];
    int64_t g_rep[NRG][R], g_node[NNG][N];
} sim_t;

/* slab_dynamics._fmix32 */
static inline uint32_t fmix32(uint32_t x) { return xmx32(x, 0x85EBCA6Bu, 13, 0xC2B2AE35u); }

/* slab_dynamics._words_at(): word k of rep r at step t, s = fmix32(seed * .. + ..) */
static inline uint32_t word(uint32_t s, uint32_t t, int r, int k)
{
    uint32_t ctr = t * (uint32_t)(R * K) + (uint32_t)(r * K + k);
    return fmix32(ctr ^ s);
}

ENGINE_COUNTING_HELPERS

/* SlabRefSim._destroy */
static void destroy(sim_t *S, int r, int n)
{
    S->free_[n] -= S->num;
    S->slabs[n] -= 1;
    bump(S, C_SLAB_FREE, r, 1);
}

/* SlabRefSim._free_block */
static void free_block(sim_t *S, int r, int n, int k)
{
    int num = S->num, lim = S->free_limit[n];
    for (int i = 0; i < k; i++) {
        S->free_[n] += 1;
        if (S->on_empty && S->free_[n] % num == 0 && S->free_[n] > lim)
            destroy(S, r, n);
    }
    if (!S->on_empty)
        while (S->free_[n] > lim && S->free_[n] / num > 0)
            destroy(S, r, n);
}

/* SlabRefSim._drain_alien */
static int drain_alien(sim_t *S, int r, int src, int dst)
{
    int a = S->alien[src][dst];
    if (a == 0)
        return 0;
    lock_(S, r, dst, 1);
    int x = a;
    if (x > S->alien_limit)
        x = S->alien_limit;
    if (x > S->sh_ent - S->shared[dst])
        x = S->sh_ent - S->shared[dst];
    S->shared[dst] += x;
    free_block(S, r, dst, a - x);
    S->alien[src][dst] = 0;
    bump(S, C_OBJECTS_MOVED, r, a);
    return 1;
}

/* SlabRefSim._choose: returns 1 (allocate), 2 (free) or 0 */
static int choose(sim_t *S, int r, uint32_t w0)
{
    int can_a = S->active[r] && S->alloc_p[r] > 0 && S->out[r] < S->live[r];
    int can_f = S->active[r] && S->pend_tot[r] > S->hold[r];   /* workloads.hold_levels */
    int bursty = S->burst[r] > 0;
    int want_a = bursty ? S->phase[r] == 0 : (int)(w0 >> 16) < S->alloc_p[r];
    int do_a = can_a && (want_a || !can_f);
    int do_f = can_f && !do_a;
    int n = (do_a || do_f) ? 1 : 0;
    if (bursty) {
        if (n > S->phase_left[r])
            n = S->phase_left[r];
        int left = S->phase_left[r] - n;
        if (n > 0 && left <= 0) {
            S->phase[r] = 1 - S->phase[r];
            S->phase_left[r] = S->burst[r];
        } else {
            S->phase_left[r] = left;
        }
    }
    bump(S, C_OPS, r, n);
    if (n == 0)
        return 0;
    return do_a ? 1 : (do_f ? 2 : 0);
}

/* SlabRefSim._alloc */
static void alloc_one(sim_t *S, int r, uint32_t w1)
{
    bump(S, C_ALLOCS, r, 1);
    int u = (int)(w1 & 0xFFFF), j = 0;
    for (int k = 0; k < R; k++)
        j += S->free_cum[r][k] <= u;
    S->pend[r][j] += 1;
    S->pend_tot[j] += 1;
    S->out[r] += 1;
    int L = S->local[r], M = S->mem[r], num = S->num;
    if (!S->alloc_local[r]) {
        bump(S, C_ALLOC_SLOW, r, 1);
        bump(S, C_ALLOC_FALLBACK, r, 1);
        lock_(S, r, L, LOCKS_FALLBACK_OWN[S->era]);
        if (S->free_[M] > 0) {
            lock_(S, r, M, 1);
            if (S->free_[M] % num == 0)
                S->free_touched[M] = 1;
            S->free_[M] -= 1;
        } else {
            bump(S, C_SLAB_ALLOC, r, 1);
            S->slabs[M] += 1;
            S->free_[M] += num - 1;
            S->free_touched[M] = 1;
            lock_(S, r, M, LOCKS_FALLBACK_GROW[S->era]);
        }
        bump(S, C_OBJECTS_MOVED, r, 1);
        return;
    }
    if (S->avail[r] > 0) {
        S->avail[r] -= 1;
        S->touched[r] = 1;
        bump(S, C_ALLOC_FAST, r, 1);
        return;
    }
    bump(S, C_ALLOC_SLOW, r, 1);
    int bc = (S->touched[r] || S->bc <= BATCHREFILL_LIMIT) ? S->bc : BATCHREFILL_LIMIT;
    int t;
    if (S->shared[L] > 0) {
        lock_(S, r, L, 1);
        t = bc;
        if (t > S->shared[L])
            t = S->shared[L];
        if (t > S->limit)
            t = S->limit;
        S->shared[L] -= t;
        S->sh_touched[L] = 1;
        bump(S, C_REFILL_SHARED, r, 1);
    } else if (S->free_[L] > 0) {
        lock_(S, r, L, 1);
        t = bc < S->free_[L] ? bc : S->free_[L];
        if (t > S->free_[L] % num)
            S->free_touched[L] = 1;
        S->free_[L] -= t;
        bump(S, C_REFILL_SLABS, r, 1);
    } else {
        t = bc < num ? bc : num;
        bump(S, C_SLAB_ALLOC, r, 1);
        bump(S, C_REFILL_GROW, r, 1);
        S->slabs[L] += 1;
        S->free_[L] += num - t;
        lock_(S, r, L, LOCKS_REFILL_GROW[S->era]);
        if (S->era == 0)
            S->free_touched[L] = 1;
    }
    bump(S, C_OBJECTS_MOVED, r, t);
    S->avail[r] = t - 1;
    S->touched[r] = 1;
}

/* SlabRefSim._free */
static void free_one(sim_t *S, int r, uint32_t w1)
{
    bump(S, C_FREES, r, 1);
    int u = (int)((w1 >> 1) % (uint32_t)S->pend_tot[r]);
    int acc = 0, i;
    for (i = 0; i < R; i++) {
        acc += S->pend[i][r];
        if (acc > u)
            break;
    }
    if (i == R)
        i = R - 1;
    S->pend[i][r] -= 1;
    S->pend_tot[r] -= 1;
    S->out[i] -= 1;
    int n = S->mem[i], L = S->local[r];
    /* dynamics.remote_to: another node of L's class waits in alien[L][L] */
    if (n != L || S->home[i] != S->home[r]) {
        bump(S, C_REMOTE_FREE, r, 1);
        bump(S, C_FREE_SLOW, r, 1);
        if (S->alien_limit > 0) {
            bump(S, C_ALIEN_LOCK, r, 1);
            if (S->alien[L][n] >= S->alien_limit) {
                bump(S, C_ALIEN_FLUSH, r, 1);
                drain_alien(S, r, L, n);
            }
            S->alien[L][n] += 1;
        } else {
            lock_(S, r, n, 1);
            free_block(S, r, n, 1);
            bump(S, C_OBJECTS_MOVED, r, 1);
        }
        return;
    }
    if (S->avail[r] < S->limit) {
        S->avail[r] += 1;
        bump(S, C_FREE_FAST, r, 1);
        return;
    }
    bump(S, C_FREE_SLOW, r, 1);
    lock_(S, r, L, 1);
    int room = S->sh_ent - S->shared[L], k;
    if (room > 0) {
        k = S->bc < room ? S->bc : room;
        S->shared[L] += k;
        bump(S, C_FLUSH_SHARED, r, 1);
    } else {
        k = S->bc;
        free_block(S, r, L, k);
        bump(S, C_FLUSH_SLABS, r, 1);
    }
    bump(S, C_OBJECTS_MOVED, r, k);
    S->avail[r] += 1 - k;
}

/* SlabRefSim._drain_array and the test before it in _reap (6.1 drain_array(): an array
 * touched since the last reap is only marked untouched): drain_array_locked() without
 * free_all, (limit + 4) / 5 objects, or half (rounded up) of fewer, under node n's
 * list_lock; counted in `counter`. */
static void drain_array(sim_t *S, int r, int n, int *avail, int *touched, int limit,
                        int counter)
{
    if (*avail <= 0)
        return;
    if (*touched) {
        *touched = 0;
        return;
    }
    lock_(S, r, n, 1);
    int tf = (limit + 4) / 5;
    if (tf > *avail)
        tf = (*avail + 1) / 2;
    free_block(S, r, n, tf);
    bump(S, C_OBJECTS_MOVED, r, tf);
    *avail -= tf;
    bump(S, counter, r, 1);
}

/* SlabRefSim._reap */
static void reap(sim_t *S, int r, int node_round)
{
    int L = S->local[r];
    if (S->alien_limit > 0)
        for (int n = 0; n < N; n++)
            if (drain_alien(S, r, L, n)) {
                bump(S, C_ALIEN_LOCK, r, 1);
                bump(S, C_REAP_ALIEN, r, 1);
            }
    drain_array(S, r, L, &S->avail[r], &S->touched[r], S->limit, C_REAP_DRAIN);
    if (!(node_round && S->first[r]))
        return;
    drain_array(S, r, L, &S->shared[L], &S->sh_touched[L], S->sh_ent, C_REAP_SHARED);
    if (S->free_touched[L]) {
        S->free_touched[L] = 0;
        return;
    }
    int tofree = (S->free_limit[L] + 5 * S->num - 1) / (5 * S->num);
    for (int nf = 0; nf < tofree && S->free_[L] / S->num > 0; nf++) {
        lock_(S, r, L, 1);
        destroy(S, r, L);
        bump(S, C_REAP_SLAB_FREE, r, 1);
    }
}

/* SlabRefSim.step */
static void step(sim_t *S, int t, uint32_t s)
{
    for (int r = 0; r < R; r++) {
        int op = choose(S, r, word(s, (uint32_t)t, r, 0));
        if (op == 1)
            alloc_one(S, r, word(s, (uint32_t)t, r, 1));
        else if (op == 2)
            free_one(S, r, word(s, (uint32_t)t, r, 1));
    }
    if (S->reap > 0 && (t + 1) % S->reap == 0) {
        int node_round = ((t + 1) / S->reap) % 2 == 0;
        for (int r = 0; r < R; r++)
            if (S->active[r])
                reap(S, r, node_round);
    }
    for (int r = 0; r < R; r++) {
        S->g_rep[0][r] += S->out[r];
        S->g_rep[1][r] += S->avail[r];
    }
    for (int n = 0; n < N; n++) {
        int alien = 0;
        for (int d = 0; d < N; d++)
            alien += S->alien[n][d];
        S->g_node[0][n] += S->slabs[n];
        S->g_node[1][n] += S->free_[n] / S->num;
        S->g_node[2][n] += S->shared[n];
        S->g_node[3][n] += alien;
    }
}

/* SlabRefSim.__init__ (derived values precomputed by the caller) */
static void init(sim_t *S, const int32_t *c)
{
    memset(S, 0, sizeof *S);
    S->num = c[F_NUM];
    S->limit = c[F_LIMIT];
    S->bc = c[F_BC];
    S->sh_ent = c[F_SH_ENT];
    S->alien_limit = c[F_ALIEN_LIMIT];
    S->reap = c[F_REAP];
    S->era = c[F_OLD_LOCKS] ? 0 : 1;
    S->on_empty = c[F_ON_EMPTY] != 0;
    for (int n = 0; n < N; n++)
        S->free_limit[n] = c[F_FREE_LIMIT + n];
    for (int r = 0; r < R; r++) {
        S->node[r] = c[F_REP_NODE + r];
        S->mem[r] = c[F_REP_MEM + r];
        S->local[r] = c[F_LOCAL + r];
        S->alloc_local[r] = c[F_ALLOC_LOCAL + r] != 0;
        S->first[r] = c[F_FIRST + r] != 0;
        S->home[r] = c[F_REP_MEM_HOME + r];
        READ_WORKLOAD(S, c, r);
    }
}

static void *run_part(void *arg)
{
    job_t *J = arg;
    sim_t S;
    for (int i = J->lo; i < J->hi; i++) {
        init(&S, J->cfg + (int64_t)i * NCFG);
        uint32_t s = fmix32(J->seeds[i] * 0x9E3779B1u + 0x632BE5ABu);
        int next = 0;
        STORE_CHECKPOINTS(J, i, &S, 0, &next);
        for (int t = 0; t < RUN_STEPS(J, i); t++) {
            step(&S, t, s);
            STORE_CHECKPOINTS(J, i, &S, t + 1, &next);
        }
    }
    return NULL;
}

/* The constants the Python side checks against the model's before the first call. */
static const int32_t ABI[] = {R, N, K, NC, NCFG, NRG * 10 + NNG};

ENGINE_ENTRY_POINTS(slabdyn)
