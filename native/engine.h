/*
 * engine.h: what the two dynamics engines (dynsim.c for SLUB, slabdyn.c for SLAB) share:
 * one thread's job (a range of configurations and the output arrays), storing a finished
 * configuration's results, and the driver that splits a batch over threads.
 * Configurations are independent, so the split changes no result (tests/test_dynsim.py).
 */
#ifndef SLABTUNE_ENGINE_H
#define SLABTUNE_ENGINE_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* x ^= x >> 16; x *= m1; x ^= x >> s; x *= m2; x ^= x >> 16 (wrapping mod 2^32): the
 * shape of both models' integer hashes (dynsim.c: lowbias32, slabdyn.c: MurmurHash3's
 * finaliser), whose constants each file passes. */
static inline uint32_t xmx32(uint32_t x, uint32_t m1, int s, uint32_t m2)
{
    x ^= x >> 16;
    x *= m1;
    x ^= x >> s;
    x *= m2;
    return x ^ (x >> 16);
}

/* An engine's counting helpers, for a sim_t with counts[][R], node[R] and lock_node[N]
 * and an enum with C_LIST_LOCK and C_LIST_LOCK_REMOTE: bump() adds to a counter; lock_()
 * counts c acquisitions of node n's list_lock by rep r (RefSim._lock, SlabRefSim._lock),
 * remote when n is not the rep's own node. */
#define ENGINE_COUNTING_HELPERS                                                       \
    static inline void bump(sim_t *S, int c, int r, int v) { S->counts[c][r] += v; } \
    static inline void lock_(sim_t *S, int r, int n, int c)                          \
    {                                                                                 \
        bump(S, C_LIST_LOCK, r, c);                                                   \
        if (n != S->node[r])                                                          \
            bump(S, C_LIST_LOCK_REMOTE, r, c);                                        \
        S->lock_node[n] += c;                                                         \
    }

/* Rep r's workload (model/workloads.py Workload) from a config row c, for a sim_t with
 * alloc_p, free_cum, live, burst, active and phase_left and a row with F_ALLOC_P,
 * F_FREE_CUM, F_LIVE, F_BURST, F_ACTIVE, F_PHASE_FIRST: both models start a rep's first
 * burst phase phase_first allocations long (workloads.burst_phase_first), each later one
 * burst long. */
#define READ_WORKLOAD(S, c, r)                                                        \
    do {                                                                              \
        (S)->alloc_p[r] = (c)[F_ALLOC_P + (r)];                                       \
        for (int j_ = 0; j_ < R; j_++)                                                \
            (S)->free_cum[r][j_] = (c)[F_FREE_CUM + (r) * R + j_];                    \
        (S)->live[r] = (c)[F_LIVE + (r)];                                             \
        (S)->hold[r] = (c)[F_HOLD + (r)];                                             \
        (S)->burst[r] = (c)[F_BURST + (r)];                                           \
        (S)->active[r] = (c)[F_ACTIVE + (r)] > 0;                                     \
        (S)->phase_left[r] = (c)[F_PHASE_FIRST + (r)];                                \
    } while (0)

typedef struct {
    int lo, hi;
    int B, nck;           /* the batch; per configuration nck checkpoints, ck (B, nck): */
    const int32_t *ck;    /* non-decreasing step counts, the last the run's length */
    const uint32_t *seeds;
    const int32_t *cfg;
    int32_t *counts, *lock_node, *outstanding;
    int64_t *g_rep, *g_node;
    int err;              /* set by a part that could not allocate its scratch */
} job_t;

/* Copy configuration i's counters, per-node locks, outstanding objects and gauge sums
 * out of the state *S (fields counts, lock_node, out, g_rep, g_node, any shapes) into row
 * `row` of the outputs. */
#define STORE_RESULTS(J, row, S)                                                      \
    do {                                                                              \
        int64_t i_ = (row);                                                           \
        memcpy((J)->counts + i_ * (int64_t)(sizeof (S)->counts / 4),                  \
               (S)->counts, sizeof (S)->counts);                                      \
        memcpy((J)->lock_node + i_ * (int64_t)(sizeof (S)->lock_node / 4),            \
               (S)->lock_node, sizeof (S)->lock_node);                                \
        memcpy((J)->outstanding + i_ * (int64_t)(sizeof (S)->out / 4),                \
               (S)->out, sizeof (S)->out);                                            \
        memcpy((J)->g_rep + i_ * (int64_t)(sizeof (S)->g_rep / 8),                    \
               (S)->g_rep, sizeof (S)->g_rep);                                        \
        memcpy((J)->g_node + i_ * (int64_t)(sizeof (S)->g_node / 8),                  \
               (S)->g_node, sizeof (S)->g_node);                                      \
    } while (0)

/* The steps configuration i runs: its last checkpoint. */
#define RUN_STEPS(J, i) ((J)->ck[(int64_t)(i) * (J)->nck + (J)->nck - 1])

/* After `done` steps of configuration i: store its results for each of its checkpoints at
 * `done` steps (checkpoint k's results are block k of the outputs, B rows each); *next is
 * the configuration's next checkpoint, from 0. */
#define STORE_CHECKPOINTS(J, i, S, done, next)                                        \
    do {                                                                              \
        while (*(next) < (J)->nck                                                     \
               && (J)->ck[(int64_t)(i) * (J)->nck + *(next)] == (done)) {             \
            STORE_RESULTS(J, (int64_t)*(next) * (J)->B + (i), S);                     \
            (*(next))++;                                                              \
        }                                                                             \
    } while (0)

/* Run part() over configurations [0, B) in `threads` equal ranges, the first in this
 * thread; a range whose thread cannot start runs here afterwards.  Returns 0, or -1 when
 * memory ran out or a part set its err. */
static int run_threads(void *(*part)(void *), int B, int nck, const int32_t *ck, int threads,
                       const uint32_t *seeds, const int32_t *cfg, int32_t *counts,
                       int32_t *lock_node, int32_t *outstanding, int64_t *g_rep,
                       int64_t *g_node)
{
    if (nck < 1)
        return -1;
    for (int64_t k = 0; k < (int64_t)B * nck; k++)
        if (ck[k] < 0 || (k % nck > 0 && ck[k] < ck[k - 1]))
            return -1;
    if (threads < 1)
        threads = 1;
    if (threads > B)
        threads = B > 0 ? B : 1;
    job_t *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    int *started = calloc((size_t)threads, sizeof *started);
    int rc = 0;
    if (!jobs || !tid || !started) {
        rc = -1;
        goto out;
    }
    for (int t = 0; t < threads; t++)
        jobs[t] = (job_t){(int)((int64_t)B * t / threads), (int)((int64_t)B * (t + 1) / threads),
                          B, nck, ck, seeds, cfg, counts, lock_node, outstanding, g_rep,
                          g_node, 0};
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&tid[t], NULL, part, &jobs[t]) == 0;
    part(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            part(&jobs[t]);
    }
    for (int t = 0; t < threads; t++)
        if (jobs[t].err)
            rc = -1;
out:
    free(jobs);
    free(tid);
    free(started);
    return rc;
}

/* The entry points Python calls: <name>_abi fills the constants it checks against the
 * model's (the file's ABI array) and returns their count; <name>_run_at runs a batch
 * through the file's run_part (run_threads()) and stores its results at each of nck
 * checkpoints per configuration (ck: B rows of nck non-decreasing step counts; the
 * outputs hold nck blocks of B rows); <name>_run runs every configuration `steps` steps.
 * Both return -1 for bad checkpoints or when memory ran out. */
#define ENGINE_ENTRY_POINTS(name)                                                     \
    int name##_abi(int32_t *out)                                                      \
    {                                                                                 \
        for (size_t k = 0; k < sizeof ABI / sizeof ABI[0]; k++)                       \
            out[k] = ABI[k];                                                          \
        return (int)(sizeof ABI / sizeof ABI[0]);                                     \
    }                                                                                 \
    int name##_run_at(int B, int nck, const int32_t *ck, int threads,                 \
                      const uint32_t *seeds, const int32_t *cfg, int32_t *counts,     \
                      int32_t *lock_node, int32_t *outstanding, int64_t *g_rep,       \
                      int64_t *g_node)                                                \
    {                                                                                 \
        return run_threads(run_part, B, nck, ck, threads, seeds, cfg, counts,         \
                           lock_node, outstanding, g_rep, g_node);                    \
    }                                                                                 \
    int name##_run(int B, int steps, int threads, const uint32_t *seeds,              \
                   const int32_t *cfg, int32_t *counts, int32_t *lock_node,           \
                   int32_t *outstanding, int64_t *g_rep, int64_t *g_node)             \
    {                                                                                 \
        int32_t *ck = malloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1));               \
        if (!ck)                                                                      \
            return -1;                                                                \
        for (int i = 0; i < B; i++)                                                   \
            ck[i] = steps;                                                            \
        int rc = name##_run_at(B, 1, ck, threads, seeds, cfg, counts, lock_node,      \
                               outstanding, g_rep, g_node);                           \
        free(ck);                                                                     \
        return rc;                                                                    \
    }

#endif
