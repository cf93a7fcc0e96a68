/*
 * slubsim: a userspace SLUB-like allocator with the model's policy knobs, driven by the
 * model's workloads with one pthread per representative CPU, printing SLUB_STATS-style
 * counters, peak slab memory and wall time as one JSON object.
 *
 * What it mirrors from mm/slub.c (v6.8 .. v7.1 shapes; older eras through the knobs):
 *   - slabs of PAGE_SIZE << order bytes with in-object freelists; a slab's owner is found
 *     from an object's address (virt_to_slab), its state lives in a separate struct slab;
 *   - a per-CPU slab: allocations pop the CPU freelist (fast path), frees of objects of the
 *     CPU's own slab push onto it (fast path); other CPUs free to the slab's own freelist
 *     under the slab lock (the cmpxchg / slab_lock fallback of __slab_free);
 *   - per-CPU partial lists bounded by cpu_partial_slabs (v3.2..v6.18): a free that makes a
 *     full slab partial puts it there without the list_lock; overflowing drains the list
 *     to the node partial lists (__put_partials), discarding empties beyond min_partial;
 *   - node partial lists under list_lock with min_partial: a free that empties a slab on
 *     the node list discards it once the node keeps min_partial + free_discard_offset
 *     partial slabs (0: the >= test from v4; 1: v3.1's >; -(1 << 20): before v3.1,
 *     which discarded every slab __slab_free() emptied);
 *   - sheaves (main and spare per CPU, capacity sheaf_capacity) and barns (full and empty
 *     sheaves per node, bounded) as in v6.18/v7.0: refill from slabs under list_lock, flush
 *     back when the barn is full; a free of an object from another node than the CPU's
 *     numa_mem_id() bypasses the sheaf when remote_free_bypasses_sheaf is set;
 *   - a page allocator stand-in: a per-thread cache of free slabs for orders up to
 *     PAGE_ALLOC_COSTLY_ORDER (the pcp lists), a global mutex (the zone lock) otherwise.
 *
 * The workload driver hands each object to the rep that will free it; that rep frees a
 * random one of the objects handed to it, or with free_order=1 the oldest (a socket's,
 * a block queue's, the lab module's ring order), so a slab's objects handed out one after
 * another come back together.
 *
 * Timing (time_ops=1): each slab_alloc()/slab_free() call is timed on its own (the TSC,
 * fenced), so the workload driver and its hand-over queues are not in the figure; calls
 * longer than OP_CAP_NS were interrupted and are counted apart.  pin_cpu=N puts every
 * thread on CPU N (reps time-slice on one core instead of outnumbering the cores).
 *
 * The C side derives no policy: order, objects per slab, min_partial, cpu_partial_slabs,
 * sheaf capacity, the CPU -> node mapping and the workload's probabilities all come in as
 * integers computed by the Python model (slabtune.tuner.native).
 *
 * Usage: slubsim [--key=value | --key value]... [--config FILE]
 *   FILE holds key=value lines ('#' starts a comment).  Lists are comma separated.
 * Exit status: 0 on success, 2 on bad arguments (one line on stderr), 1 on a system error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_REPS 64
#define MAX_NODES 64
#define PAGE_SHIFT 12
#define PAGE_ALLOC_COSTLY_ORDER 3
#define PROB_ONE 65536
#define LIVE_MAGIC 0x5ab1ab1e11ee11eeULL
#define ARENA_BYTES (8ULL << 30)

/* ------------------------------------------------------------------ configuration */

struct config {
	long size, order, objs, min_partial, cpu_partial_slabs, sheaf_capacity, cpu_slab;
	long barn_max_full, barn_max_empty, remote_free_bypasses_sheaf, partial_fill, partial_pick;
	long free_order;	/* 0: a random object handed to the freer; 1: its oldest */
	long slab_alloc_single, pc_empty_locks, free_discard_offset;
	long steps, seed, sync_every, serial, reps, nodes, pcp_high_pages, pcp_batch_pages, per_thread;
	long time_ops, pin_cpu;
	long rep_node[MAX_REPS], rep_mem_node[MAX_REPS], rep_local_node[MAX_REPS];
	long rep_barn[MAX_REPS], rep_alloc_local[MAX_REPS];
	long alloc_p[MAX_REPS], live_target[MAX_REPS], burst[MAX_REPS], active[MAX_REPS];
	long hold[MAX_REPS];	/* a rep frees only above this many handed to it (0: eager) */
	long phase_first[MAX_REPS];	/* a rep's first burst phase (-1: burst) */
	long rep_mem_home[MAX_REPS];	/* which node of its memory class (model rep_homes) */
	/* per node, min_partial for the nodes' lists it stands for (model node_min_partial);
	 * -1: min_partial */
	long node_min_partial[MAX_NODES];
	long free_cum[MAX_REPS * MAX_REPS];
	int seen_lists;
};

enum ktype { K_INT, K_LIST };
struct key {
	const char *name;
	enum ktype type;
	size_t off;
	long lo, hi;
	long def;
	int list_len; /* 0: reps, 1: reps*reps, 2: nodes */
};

#define OFF(f) offsetof(struct config, f)
static const struct key KEYS[] = {
	{"size", K_INT, OFF(size), 8, 1 << 24, 0, 0},
	{"order", K_INT, OFF(order), 0, 10, 0, 0},
	{"objs", K_INT, OFF(objs), 1, 65535, 0, 0},
	{"min_partial", K_INT, OFF(min_partial), 0, 1 << 20, 5, 0},
	{"cpu_partial_slabs", K_INT, OFF(cpu_partial_slabs), 0, 1 << 20, 0, 0},
	{"sheaf_capacity", K_INT, OFF(sheaf_capacity), 0, 1 << 16, 0, 0},
	{"cpu_slab", K_INT, OFF(cpu_slab), -1, 1, -1, 0},
	{"barn_max_full", K_INT, OFF(barn_max_full), 0, 1 << 16, 10, 0},
	{"barn_max_empty", K_INT, OFF(barn_max_empty), 0, 1 << 16, 10, 0},
	{"remote_free_bypasses_sheaf", K_INT, OFF(remote_free_bypasses_sheaf), 0, 1, 0, 0},
	{"slab_alloc_single", K_INT, OFF(slab_alloc_single), 0, 1, 0, 0},
	{"pc_empty_locks", K_INT, OFF(pc_empty_locks), 0, 1, 1, 0},
	{"free_discard_offset", K_INT, OFF(free_discard_offset), -(1 << 20), 1, 0, 0},
	{"partial_fill", K_INT, OFF(partial_fill), 0, 1, 1, 0},
	{"partial_pick", K_INT, OFF(partial_pick), 0, 1, 0, 0},
	{"free_order", K_INT, OFF(free_order), 0, 1, 0, 0},
	{"steps", K_INT, OFF(steps), 1, 100000000, 1000, 0},
	{"seed", K_INT, OFF(seed), 0, 0xffffffffL, 0, 0},
	{"sync_every", K_INT, OFF(sync_every), 0, 1 << 30, 1, 0},
	{"serial", K_INT, OFF(serial), 0, 1, 0, 0},
	{"reps", K_INT, OFF(reps), 1, MAX_REPS, 1, 0},
	{"nodes", K_INT, OFF(nodes), 1, MAX_NODES, 1, 0},
	{"pcp_high_pages", K_INT, OFF(pcp_high_pages), 0, 1 << 20, 512, 0},
	{"pcp_batch_pages", K_INT, OFF(pcp_batch_pages), 1, 1 << 20, 63, 0},
	{"per_thread", K_INT, OFF(per_thread), 0, 1, 1, 0},
	{"time_ops", K_INT, OFF(time_ops), 0, 1, 0, 0},
	{"pin_cpu", K_INT, OFF(pin_cpu), -1, CPU_SETSIZE - 1, -1, 0},
	{"rep_node", K_LIST, OFF(rep_node), 0, MAX_NODES - 1, 0, 0},
	{"rep_mem_node", K_LIST, OFF(rep_mem_node), 0, MAX_NODES - 1, 0, 0},
	{"rep_local_node", K_LIST, OFF(rep_local_node), 0, MAX_NODES - 1, 0, 0},
	{"rep_barn", K_LIST, OFF(rep_barn), -1, MAX_NODES - 1, -1, 0},
	{"rep_alloc_local", K_LIST, OFF(rep_alloc_local), 0, 1, 1, 0},
	{"rep_mem_home", K_LIST, OFF(rep_mem_home), 0, 1 << 20, 0, 0},
	{"node_min_partial", K_LIST, OFF(node_min_partial), -1, 1 << 26, -1, 2},
	{"alloc_p", K_LIST, OFF(alloc_p), 0, PROB_ONE, PROB_ONE / 2, 0},
	{"live_target", K_LIST, OFF(live_target), 0, 1 << 24, 32, 0},
	{"hold", K_LIST, OFF(hold), 0, 1 << 24, 0, 0},
	{"burst", K_LIST, OFF(burst), 0, 1 << 24, 0, 0},
	{"phase_first", K_LIST, OFF(phase_first), -1, 1 << 24, -1, 0},
	{"active", K_LIST, OFF(active), 0, 1, 1, 0},
	{"free_cum", K_LIST, OFF(free_cum), 0, PROB_ONE, -1, 1},
};
#define NKEYS (sizeof(KEYS) / sizeof(KEYS[0]))

static void die_usage(const char *fmt, const char *a, const char *b)
{
	fprintf(stderr, "slubsim: ");
	fprintf(stderr, fmt, a, b);
	fputc('\n', stderr);
	exit(2);
}

static void die_sys(const char *what)
{
	fprintf(stderr, "slubsim: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Strict integer: optional sign, decimal digits only, in [lo, hi]. */
static long parse_int(const char *key, const char *s, long lo, long hi)
{
	char *end;
	errno = 0;
	if (!*s)
		die_usage("%s: empty value%s", key, "");
	long v = strtol(s, &end, 10);
	if (errno || *end || end == s)
		die_usage("%s: '%s' is not an integer", key, s);
	if (v < lo || v > hi) {
		char range[96];
		snprintf(range, sizeof(range), "%ld..%ld", lo, hi);
		fprintf(stderr, "slubsim: %s: %ld is outside %s\n", key, v, range);
		exit(2);
	}
	return v;
}

/* How many values a list key takes: per rep, per pair of reps or per node. */
static long list_count(const struct key *k, const struct config *c)
{
	return k->list_len == 1 ? c->reps * c->reps : k->list_len == 2 ? c->nodes : c->reps;
}

/* Raw list values are kept until every key is read, since their length depends on reps. */
static char *list_raw[NKEYS];

static const struct key *find_key(const char *name)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (!strcmp(KEYS[i].name, name))
			return &KEYS[i];
	return NULL;
}

static void set_key(struct config *c, const char *name, const char *val)
{
	const struct key *k = find_key(name);
	if (!k)
		die_usage("unknown option '%s'%s", name, "");
	if (k->type == K_INT) {
		*(long *)((char *)c + k->off) = parse_int(k->name, val, k->lo, k->hi);
	} else {
		size_t i = (size_t)(k - KEYS);
		free(list_raw[i]);
		list_raw[i] = strdup(val);
		if (!list_raw[i])
			die_sys("strdup");
	}
}

static void parse_lists(struct config *c)
{
	for (size_t i = 0; i < NKEYS; i++) {
		const struct key *k = &KEYS[i];
		if (k->type != K_LIST)
			continue;
		long *dst = (long *)((char *)c + k->off);
		long n = list_count(k, c);
		if (!list_raw[i]) {
			if (k->def < 0 && k->list_len == 1)
				die_usage("%s: missing (needs reps*reps values)%s", k->name, "");
			for (long j = 0; j < n; j++)
				dst[j] = k->def;
			continue;
		}
		char *save = NULL, *tok;
		long j = 0;
		for (tok = strtok_r(list_raw[i], ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			if (j >= n) {
				fprintf(stderr, "slubsim: %s: more than %ld values\n", k->name, n);
				exit(2);
			}
			dst[j++] = parse_int(k->name, tok, k->lo, k->hi);
		}
		if (j != n) {
			fprintf(stderr, "slubsim: %s: %ld values, expected %ld\n", k->name, j, n);
			exit(2);
		}
	}
}

static void read_config_file(struct config *c, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "slubsim: config: cannot open %s: %s\n", path, strerror(errno));
		exit(2);
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, f)) >= 0) {
		char *p = line;
		char *hash = strchr(p, '#');
		if (hash)
			*hash = 0;
		while (*p == ' ' || *p == '\t')
			p++;
		char *e = p + strlen(p);
		while (e > p && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
			*--e = 0;
		if (!*p)
			continue;
		char *eq = strchr(p, '=');
		if (!eq)
			die_usage("config: line '%s' is not key=value%s", p, "");
		*eq = 0;
		char *ke = eq;
		while (ke > p && (ke[-1] == ' ' || ke[-1] == '\t'))
			*--ke = 0;
		char *v = eq + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		set_key(c, p, v);
	}
	free(line);
	fclose(f);
}

static void parse_args(struct config *c, int argc, char **argv)
{
	for (size_t i = 0; i < NKEYS; i++)
		if (KEYS[i].type == K_INT)
			*(long *)((char *)c + KEYS[i].off) = KEYS[i].def;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		if (strncmp(a, "--", 2) != 0)
			die_usage("unexpected argument '%s'%s", a, "");
		a += 2;
		char *val;
		char *eq = strchr(a, '=');
		char name[64];
		if (eq) {
			size_t n = (size_t)(eq - a);
			if (n >= sizeof(name))
				die_usage("unknown option '%s'%s", a, "");
			memcpy(name, a, n);
			name[n] = 0;
			val = eq + 1;
		} else {
			if (strlen(a) >= sizeof(name))
				die_usage("unknown option '%s'%s", a, "");
			strcpy(name, a);
			if (i + 1 >= argc)
				die_usage("%s: missing value%s", name, "");
			val = argv[++i];
		}
		if (!strcmp(name, "config"))
			read_config_file(c, val);
		else
			set_key(c, name, val);
	}
	parse_lists(c);
	if (c->size == 0)
		die_usage("size: missing%s%s", "", "");
	if (c->objs == 0)
		die_usage("objs: missing%s%s", "", "");
	unsigned long slab = 1UL << (PAGE_SHIFT + c->order);
	if ((unsigned long)c->objs * (unsigned long)c->size > slab) {
		fprintf(stderr, "slubsim: objs: %ld objects of %ld bytes do not fit an order-%ld slab\n",
			c->objs, c->size, c->order);
		exit(2);
	}
	if (c->size % 8)
		die_usage("size: must be a multiple of 8 (an object stride)%s%s", "", "");
	if (c->cpu_slab < 0)
		c->cpu_slab = c->sheaf_capacity == 0;
	if (!c->cpu_slab && c->sheaf_capacity == 0)
		die_usage("cpu_slab: 0 needs sheaves (sheaf_capacity > 0)%s%s", "", "");
	for (long r = 0; r < c->reps; r++) {
		if (c->rep_node[r] >= c->nodes || c->rep_mem_node[r] >= c->nodes ||
		    c->rep_local_node[r] >= c->nodes || c->rep_barn[r] >= c->nodes) {
			fprintf(stderr, "slubsim: rep_node: rep %ld names a node >= nodes (%ld)\n", r,
				c->nodes);
			exit(2);
		}
		long prev = 0;
		for (long j = 0; j < c->reps; j++) {
			long v = c->free_cum[r * c->reps + j];
			if (v < prev) {
				fprintf(stderr, "slubsim: free_cum: row %ld is not non-decreasing\n", r);
				exit(2);
			}
			prev = v;
		}
		if (c->active[r] && c->alloc_p[r] > 0 && prev != PROB_ONE) {
			fprintf(stderr, "slubsim: free_cum: row %ld of an allocating rep must end at %d\n",
				r, PROB_ONE);
			exit(2);
		}
	}
}

/* ------------------------------------------------------------------ state */

enum where { W_NONE, W_NODE, W_CPU_PARTIAL };

struct slab {
	atomic_flag lock;     /* slab_lock(): guards freelist, inuse, frozen, where */
	void *freelist;       /* objects free in the slab (not on any CPU freelist) */
	int inuse;            /* objects not on the slab's freelist */
	int frozen;           /* some CPU's current slab */
	int where;            /* which list holds it */
	int node;             /* slab_nid() */
	struct slab *prev, *next;
	char *base;
};

struct sheaf {
	int size;
	void *objs[];
};

struct node {
	pthread_mutex_t list_lock;
	struct slab head;     /* circular list of partial slabs */
	long nr_partial;
	pthread_mutex_t barn_lock;
	struct sheaf **full, **empty;
	long nr_full, nr_empty;
};

#define COUNTERS(X)                                                                        \
	X(ops) X(allocs) X(frees) X(alloc_fastpath) X(alloc_slowpath) X(free_fastpath)     \
	X(free_slowpath) X(alloc_refill) X(alloc_slab) X(free_slab) X(free_frozen)         \
	X(cpu_partial_alloc) X(cpu_partial_free) X(cpu_partial_node) X(cpu_partial_drain)  \
	X(deactivate_full) X(sheaf_swap) X(sheaf_refill) X(sheaf_flush) X(barn_get)        \
	X(barn_get_fail) X(barn_put) X(barn_put_fail) X(remote_free) X(list_lock)          \
	X(list_lock_remote) X(zone_lock) X(direct_alloc) X(sheaf_alloc_replace)            \
	X(sheaf_free_replace)

struct counters {
#define X(n) long n;
	COUNTERS(X)
#undef X
};

struct pend {
	void *obj;
	int origin;
};

struct cpu {
	int id, node, mem_node, local_node, barn, alloc_local, mem_home;
	/* allocator state, touched only by this thread */
	struct slab *slab;
	void *freelist;
	struct slab *partial;
	long partial_slabs;
	struct sheaf *main, *spare;
	struct slab *pcp;
	long pcp_count;
	struct counters c;
	/* workload state */
	pthread_mutex_t in_lock;
	struct pend *in;
	atomic_long in_n;
	atomic_long out;
	uint64_t rng;
	int phase;
	long phase_left;
	pthread_t tid;
	struct timespec t0, t1;   /* this thread's first and last step */
	int next;                 /* serial mode: the active rep that steps after this one */
	/* time_ops: ticks spent inside slab_alloc()/slab_free(), ops timed, ops left out */
	uint64_t op_ticks;
	long op_timed, op_dropped;
	int ran_on;               /* the CPU the thread was on after its last step */
	pthread_cond_t turn_cv;
} __attribute__((aligned(64)));

static struct config C;
static struct node nodes[MAX_NODES];
static struct cpu cpus[MAX_REPS];
static char *arena;
static struct slab *slabs;
static unsigned slab_shift;
static unsigned long slab_bytes;
static pthread_mutex_t zone_lock = PTHREAD_MUTEX_INITIALIZER;
static struct slab *zone_free;
static long zone_next, zone_max;
static atomic_long slabs_in_use, slabs_peak, live_objs, live_peak;
static pthread_barrier_t start_barrier, step_barrier;
static long pcp_high, pcp_batch;

/* ------------------------------------------------------------------ small helpers */

static inline void slab_lock(struct slab *s)
{
	unsigned spins = 0;
	while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire))
		if (++spins > 64) {
			sched_yield();
			spins = 0;
		}
}

static inline void slab_unlock(struct slab *s)
{
	atomic_flag_clear_explicit(&s->lock, memory_order_release);
}

static inline void *get_fp(void *obj) { return *(void **)obj; }
static inline void set_fp(void *obj, void *next) { *(void **)obj = next; }

static inline struct slab *virt_to_slab(void *obj)
{
	return &slabs[(unsigned long)((char *)obj - arena) >> slab_shift];
}

static void lock_node(struct cpu *cpu, int node)
{
	pthread_mutex_lock(&nodes[node].list_lock);
	cpu->c.list_lock++;
	if (node != cpu->node)
		cpu->c.list_lock_remote++;
}

static void unlock_node(int node) { pthread_mutex_unlock(&nodes[node].list_lock); }

static void atomic_max(atomic_long *peak, long v)
{
	long p = atomic_load(peak);
	while (v > p && !atomic_compare_exchange_weak(peak, &p, v))
		;
}

/* splitmix64: a deterministic per-thread stream. */
static inline uint64_t rnd64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint32_t rnd32(uint64_t *s) { return (uint32_t)(rnd64(s) >> 32); }

/* time_ops: a cheap clock around each allocator call (the TSC on x86-64, fenced so the
 * call's loads are not reordered across it; CLOCK_MONOTONIC nanoseconds elsewhere). */
static inline uint64_t now_ticks(void)
{
#if defined(__x86_64__)
	uint32_t lo, hi;
	__asm__ __volatile__("lfence; rdtsc; lfence" : "=a"(lo), "=d"(hi)::"memory");
	return ((uint64_t)hi << 32) | lo;
#else
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
#endif
}

/* Ticks per nanosecond, and the longest op counted (OP_CAP_NS): an op that took longer was
 * interrupted or descheduled (with serial=1 no op ever waits for another thread), so it
 * is counted in op_dropped instead of op_ticks. */
#define OP_CAP_NS 50000.0
static double ticks_per_ns = 1.0;
static uint64_t op_cap_ticks = ~0ULL;

static double mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void calibrate_ticks(void)
{
	double n0 = mono_ns(), n1;
	uint64_t k0 = now_ticks(), k1;
	do {
		n1 = mono_ns();
		k1 = now_ticks();
	} while (n1 - n0 < 20e6);
	ticks_per_ns = (double)(k1 - k0) / (n1 - n0);
	op_cap_ticks = (uint64_t)(OP_CAP_NS * ticks_per_ns);
}

static inline void account_op(struct cpu *cpu, uint64_t t0)
{
	uint64_t d = now_ticks() - t0;
	if (d > op_cap_ticks) {
		cpu->op_dropped++;
		return;
	}
	cpu->op_ticks += d;
	cpu->op_timed++;
}

/* Node partial lists: __add_partial() / remove_partial(); caller holds list_lock. */
static void add_partial(int node, struct slab *s, int tail)
{
	struct node *n = &nodes[node];
	struct slab *h = &n->head;
	if (tail) {
		s->prev = h->prev;
		s->next = h;
	} else {
		s->prev = h;
		s->next = h->next;
	}
	s->prev->next = s;
	s->next->prev = s;
	n->nr_partial++;
	s->where = W_NODE;
}

static void remove_partial(int node, struct slab *s)
{
	s->prev->next = s->next;
	s->next->prev = s->prev;
	s->prev = s->next = NULL;
	nodes[node].nr_partial--;
	s->where = W_NONE;
}

/* ------------------------------------------------------------------ page allocator */

/* rmqueue(): low orders come from the CPU's pcp list, refilled in batches under the zone
 * lock; costly orders always take the zone lock. */
static struct slab *zone_take(void)
{
	struct slab *s = zone_free;
	if (s) {
		zone_free = s->next;
		return s;
	}
	if (zone_next >= zone_max) {
		fprintf(stderr, "slubsim: arena: out of slab slots (%ld slabs)\n", zone_max);
		exit(1);
	}
	return &slabs[zone_next++];
}

static struct slab *page_alloc(struct cpu *cpu)
{
	struct slab *s;
	if (C.order <= PAGE_ALLOC_COSTLY_ORDER) {
		if (!cpu->pcp) {
			pthread_mutex_lock(&zone_lock);
			cpu->c.zone_lock++;
			for (long i = 0; i < pcp_batch; i++) {
				s = zone_take();
				s->next = cpu->pcp;
				cpu->pcp = s;
				cpu->pcp_count++;
			}
			pthread_mutex_unlock(&zone_lock);
		}
		s = cpu->pcp;
		cpu->pcp = s->next;
		cpu->pcp_count--;
	} else {
		pthread_mutex_lock(&zone_lock);
		cpu->c.zone_lock++;
		s = zone_take();
		pthread_mutex_unlock(&zone_lock);
	}
	atomic_max(&slabs_peak, atomic_fetch_add(&slabs_in_use, 1) + 1);
	return s;
}

static void page_free(struct cpu *cpu, struct slab *s)
{
	atomic_fetch_sub(&slabs_in_use, 1);
	if (C.order <= PAGE_ALLOC_COSTLY_ORDER) {
		s->next = cpu->pcp;
		cpu->pcp = s;
		if (++cpu->pcp_count > pcp_high) {
			pthread_mutex_lock(&zone_lock);
			cpu->c.zone_lock++;
			for (long i = 0; i < pcp_batch && cpu->pcp; i++) {
				struct slab *t = cpu->pcp;
				cpu->pcp = t->next;
				cpu->pcp_count--;
				t->next = zone_free;
				zone_free = t;
			}
			pthread_mutex_unlock(&zone_lock);
		}
	} else {
		pthread_mutex_lock(&zone_lock);
		cpu->c.zone_lock++;
		s->next = zone_free;
		zone_free = s;
		pthread_mutex_unlock(&zone_lock);
	}
}

/* allocate_slab(): a fresh slab on `node` with every object on its freelist. */
static struct slab *new_slab(struct cpu *cpu, int node)
{
	struct slab *s = page_alloc(cpu);
	char *base = arena + ((unsigned long)(s - slabs) << slab_shift);
	atomic_flag_clear(&s->lock);
	s->base = base;
	s->node = node;
	s->frozen = 0;
	s->where = W_NONE;
	s->prev = s->next = NULL;
	s->inuse = 0;
	for (long i = 0; i < C.objs; i++)
		set_fp(base + i * C.size, i + 1 < C.objs ? base + (i + 1) * C.size : NULL);
	s->freelist = base;
	cpu->c.alloc_slab++;
	return s;
}

static void discard_slab(struct cpu *cpu, struct slab *s)
{
	cpu->c.free_slab++;
	page_free(cpu, s);
}

/* ------------------------------------------------------------------ slab frees */

/* min_partial of node n's list: the model's node_min_partial (a list that stands for
 * several nodes' lists meets min_partial for each), or min_partial itself */
static long node_min_partial(long n)
{
	return C.node_min_partial[n] >= 0 ? C.node_min_partial[n] : C.min_partial;
}

/* __put_partials(): move a detached chain of per-CPU partial slabs to their nodes' partial
 * lists (tail), one list_lock hold per run of slabs on the same node; an empty slab is
 * discarded if its node already keeps min_partial partial slabs. */
static void put_partials(struct cpu *cpu, struct slab *chain)
{
	struct slab *discard = NULL;
	int locked = -1;
	while (chain) {
		struct slab *s = chain;
		chain = s->next;
		if (s->node != locked) {
			if (locked >= 0)
				unlock_node(locked);
			locked = s->node;
			lock_node(cpu, locked);
		}
		slab_lock(s);
		if (s->inuse == 0 && nodes[s->node].nr_partial >= node_min_partial(s->node)) {
			s->where = W_NONE;
			slab_unlock(s);
			s->next = discard;
			discard = s;
		} else {
			add_partial(s->node, s, 1);
			slab_unlock(s);
		}
	}
	if (locked >= 0)
		unlock_node(locked);
	while (discard) {
		struct slab *s = discard;
		discard = s->next;
		discard_slab(cpu, s);
	}
}

/* put_cpu_partial(): a slab that just became partial joins this CPU's partial list; a full
 * list is drained to the node lists first (trading list_lock trips for bounded memory). */
static void put_cpu_partial(struct cpu *cpu, struct slab *s)
{
	if (cpu->partial && cpu->partial_slabs >= C.cpu_partial_slabs) {
		struct slab *old = cpu->partial;
		cpu->partial = NULL;
		cpu->partial_slabs = 0;
		cpu->c.cpu_partial_drain++;
		put_partials(cpu, old);
	}
	s->next = cpu->partial;
	cpu->partial = s;
	cpu->partial_slabs++;
}

static int has_cpu_partial(void) { return C.cpu_slab && C.cpu_partial_slabs > 0; }

/* __slab_free(): free to a slab that is not this CPU's current slab.  No lock but the slab
 * lock unless the slab must move between lists: it empties (and is not frozen) or it was
 * full (and there is no per-CPU partial list to take it). */
static void slab_free_slow(struct cpu *cpu, struct slab *s, void *obj)
{
	int locked = -1;
	void *prior;
	int frozen, where, newinuse, to_cpu_partial, need_lock;
	for (;;) {
		slab_lock(s);
		prior = s->freelist;
		newinuse = s->inuse - 1;
		where = s->where;
		/* per-CPU partial slabs were frozen until v6.8 ("SLUB: delay freezing of partial
		 * slabs"): then no free into one takes the list_lock */
		frozen = s->frozen || (!C.pc_empty_locks && where == W_CPU_PARTIAL);
		to_cpu_partial = 0;
		need_lock = 0;
		if (!frozen && (newinuse == 0 || !prior)) {
			if (has_cpu_partial() && !prior)
				to_cpu_partial = 1;
			else
				need_lock = 1;
		}
		if (need_lock && locked < 0) {
			slab_unlock(s);
			locked = s->node;
			lock_node(cpu, locked);
			continue;
		}
		set_fp(obj, prior);
		s->freelist = obj;
		s->inuse = newinuse;
		if (to_cpu_partial)
			s->where = W_CPU_PARTIAL;
		break;
	}
	if (!need_lock) {
		slab_unlock(s);
		if (locked >= 0)
			unlock_node(locked);
		if (frozen)
			cpu->c.free_frozen++;
		else if (to_cpu_partial) {
			put_cpu_partial(cpu, s);
			cpu->c.cpu_partial_free++;
		}
		return;
	}
	/* list_lock held.  A partial slab on some CPU's partial list stays there. */
	if (prior && where != W_NODE) {
		slab_unlock(s);
		unlock_node(locked);
		return;
	}
	if (newinuse == 0 &&
	    nodes[locked].nr_partial >= node_min_partial(locked) + C.free_discard_offset) {
		if (prior)
			remove_partial(locked, s);
		s->where = W_NONE;
		slab_unlock(s);
		unlock_node(locked);
		discard_slab(cpu, s);
		return;
	}
	if (!prior)
		add_partial(locked, s, 1);
	slab_unlock(s);
	unlock_node(locked);
}

/* ------------------------------------------------------------------ bulk take from slabs */

/* Take up to `want` objects from node partial slabs under list_lock (head first), then from
 * fresh slabs; a fresh slab left partial goes on the node list (refill_objects()). */
static int take_objects(struct cpu *cpu, int node, void **out, int want)
{
	int got = 0;
	lock_node(cpu, node);
	struct slab *h = &nodes[node].head;
	while (got < want && h->next != h) {
		struct slab *s = h->next;
		slab_lock(s);
		while (got < want && s->freelist) {
			void *o = s->freelist;
			s->freelist = get_fp(o);
			s->inuse++;
			out[got++] = o;
		}
		if (!s->freelist)
			remove_partial(node, s);
		slab_unlock(s);
	}
	unlock_node(node);
	while (got < want) {
		struct slab *s = new_slab(cpu, node);
		while (got < want && s->freelist) {
			void *o = s->freelist;
			s->freelist = get_fp(o);
			s->inuse++;
			out[got++] = o;
		}
		if (s->freelist) {
			lock_node(cpu, node);
			add_partial(node, s, 0);
			unlock_node(node);
		}
	}
	return got;
}

/* ------------------------------------------------------------------ CPU slab path */

static void *cpu_slab_alloc_slow(struct cpu *cpu)
{
	struct slab *s = cpu->slab;
	if (s) {
		/* get_freelist(): objects other CPUs freed to our slab, else unfreeze it full */
		slab_lock(s);
		void *fl = s->freelist;
		s->freelist = NULL;
		if (fl)
			s->inuse = (int)C.objs;
		else
			s->frozen = 0;
		slab_unlock(s);
		if (fl) {
			cpu->c.alloc_refill++;
			return fl;
		}
		cpu->slab = NULL;
		cpu->c.deactivate_full++;
	}
	/* a slab from the per-CPU partial list */
	if (cpu->partial) {
		s = cpu->partial;
		cpu->partial = s->next;
		cpu->partial_slabs--;
		cpu->c.cpu_partial_alloc++;
		slab_lock(s);
		void *fl = s->freelist;
		s->freelist = NULL;
		s->inuse = (int)C.objs;
		s->frozen = 1;
		s->where = W_NONE;
		slab_unlock(s);
		cpu->slab = s;
		return fl;
	}
	/* get_partial_node(): the first slab becomes the CPU slab; with per-CPU partial lists
	 * more slabs move to them until they hold more than cpu_partial_slabs / 2 */
	int node = cpu->mem_node;
	struct slab *chain = NULL, *got = NULL;
	long moved = 0;
	lock_node(cpu, node);
	struct slab *h = &nodes[node].head;
	if (C.partial_pick && h->next != h) {
		/* not SLUB: take the emptiest partial slab first (what a model that packs objects
		 * into as few partial slabs as possible assumes), to measure that assumption */
		struct slab *best = h->next;
		for (struct slab *t = best->next; t != h; t = t->next)
			if (t->inuse < best->inuse)
				best = t;
		best->prev->next = best->next;
		best->next->prev = best->prev;
		best->next = h->next;
		best->prev = h;
		h->next->prev = best;
		h->next = best;
	}
	while (h->next != h) {
		s = h->next;
		slab_lock(s);
		remove_partial(node, s);
		if (!got) {
			got = s;
			slab_unlock(s);
		} else {
			s->where = W_CPU_PARTIAL;
			slab_unlock(s);
			s->next = chain;
			chain = s;
			moved++;
			cpu->c.cpu_partial_node++;
		}
		if (!has_cpu_partial() || !C.partial_fill || moved > C.cpu_partial_slabs / 2)
			break;
	}
	unlock_node(node);
	while (chain) {
		s = chain;
		chain = s->next;
		s->next = cpu->partial;
		cpu->partial = s;
		cpu->partial_slabs++;
	}
	s = got ? got : new_slab(cpu, node);
	slab_lock(s);
	void *fl = s->freelist;
	s->freelist = NULL;
	s->inuse = (int)C.objs;
	s->frozen = 1;
	s->where = W_NONE;
	slab_unlock(s);
	cpu->slab = s;
	return fl;
}

/* ------------------------------------------------------------------ sheaves and barns */

static struct sheaf *sheaf_new(void)
{
	struct sheaf *sh = calloc(1, sizeof(*sh) + sizeof(void *) * (size_t)C.sheaf_capacity);
	if (!sh)
		die_sys("calloc sheaf");
	return sh;
}

/* barn_replace_empty_sheaf(): trade an empty sheaf for a full one, if the barn has one. */
static struct sheaf *barn_get_full(int b, struct sheaf *empty)
{
	struct node *n = &nodes[b];
	struct sheaf *full = NULL;
	pthread_mutex_lock(&n->barn_lock);
	if (n->nr_full > 0) {
		full = n->full[--n->nr_full];
		if (n->nr_empty < C.barn_max_empty) {
			n->empty[n->nr_empty++] = empty;
			empty = NULL;
		}
	}
	pthread_mutex_unlock(&n->barn_lock);
	if (full && empty)
		free(empty);
	return full;
}

/* barn_replace_full_sheaf(): park a full sheaf, get an empty one back, if there is room. */
static struct sheaf *barn_put_full(int b, struct sheaf *full)
{
	struct node *n = &nodes[b];
	struct sheaf *empty = NULL;
	int ok = 0;
	pthread_mutex_lock(&n->barn_lock);
	if (n->nr_full < C.barn_max_full) {
		n->full[n->nr_full++] = full;
		ok = 1;
		if (n->nr_empty > 0)
			empty = n->empty[--n->nr_empty];
	}
	pthread_mutex_unlock(&n->barn_lock);
	if (!ok)
		return NULL;
	return empty ? empty : sheaf_new();
}

/* alloc_from_pcs(): pop the main sheaf; when empty, swap in the spare, a full sheaf from
 * the barn, or refill from slabs under the node's list_lock.  Every object it hands out
 * is ALLOC_FASTPATH to SLUB_STATS, also after such a replacement (sheaf_alloc_replace). */
static void *sheaf_alloc(struct cpu *cpu)
{
	struct sheaf *m = cpu->main;
	if (m->size == 0 && cpu->spare->size == 0 && cpu->barn < 0 && C.slab_alloc_single) {
		/* v7.x without a barn on this node: __pcs_replace_empty_main() gives up and
		 * ___slab_alloc() takes one object under a node's list_lock */
		void *obj;
		cpu->c.alloc_slowpath++;
		cpu->c.direct_alloc++;
		take_objects(cpu, cpu->mem_node, &obj, 1);
		return obj;
	}
	cpu->c.alloc_fastpath++;
	if (m->size > 0)
		return m->objs[--m->size];
	cpu->c.sheaf_alloc_replace++;
	if (cpu->spare->size > 0) {
		cpu->main = cpu->spare;
		cpu->spare = m;
		cpu->c.sheaf_swap++;
	} else {
		struct sheaf *full = cpu->barn >= 0 ? barn_get_full(cpu->barn, m) : NULL;
		if (full) {
			cpu->main = full;
			cpu->c.barn_get++;
		} else {
			if (cpu->barn >= 0)
				cpu->c.barn_get_fail++;
			cpu->c.sheaf_refill++;
			m->size = take_objects(cpu, cpu->mem_node, m->objs, (int)C.sheaf_capacity);
		}
	}
	m = cpu->main;
	return m->objs[--m->size];
}


/* free_to_pcs(): push onto the main sheaf; when full, swap with an empty spare, park it in
 * the barn, or flush it back to its slabs. */
static void sheaf_free(struct cpu *cpu, void *obj)
{
	struct sheaf *m = cpu->main;
	cpu->c.free_fastpath++;
	if (m->size < C.sheaf_capacity) {
		m->objs[m->size++] = obj;
		return;
	}
	cpu->c.sheaf_free_replace++;     /* still FREE_FASTPATH, as free_to_pcs() counts it */
	if (cpu->spare->size == 0) {
		cpu->main = cpu->spare;
		cpu->spare = m;
		cpu->c.sheaf_swap++;
	} else {
		struct sheaf *empty = cpu->barn >= 0 ? barn_put_full(cpu->barn, m) : NULL;
		if (empty) {
			cpu->main = empty;
			cpu->c.barn_put++;
		} else {
			if (cpu->barn >= 0)
				cpu->c.barn_put_fail++;
			cpu->c.sheaf_flush++;
			for (int i = 0; i < m->size; i++)
				slab_free_slow(cpu, virt_to_slab(m->objs[i]), m->objs[i]);
			m->size = 0;
		}
	}
	m = cpu->main;
	m->objs[m->size++] = obj;
}

/* ------------------------------------------------------------------ kmem_cache_alloc/free */

static void *slab_alloc(struct cpu *cpu)
{
	void *obj;
	if (C.sheaf_capacity > 0) {
		obj = sheaf_alloc(cpu);
	} else if (!cpu->alloc_local) {
		/* no numa_mem_id(): the CPU's own node has no memory, so no CPU slab ever matches
		 * and every allocation takes one object under the memory node's list_lock */
		cpu->c.alloc_slowpath++;
		cpu->c.direct_alloc++;
		take_objects(cpu, cpu->mem_node, &obj, 1);
	} else if (cpu->freelist) {
		obj = cpu->freelist;
		cpu->freelist = get_fp(obj);
		cpu->c.alloc_fastpath++;
	} else {
		cpu->c.alloc_slowpath++;
		obj = cpu_slab_alloc_slow(cpu);
		cpu->freelist = get_fp(obj);
	}
	if (*(uint64_t *)obj == LIVE_MAGIC) {
		fprintf(stderr, "slubsim: internal error: object %p handed out twice\n", obj);
		exit(1);
	}
	*(uint64_t *)obj = LIVE_MAGIC;
	atomic_max(&live_peak, atomic_fetch_add(&live_objs, 1) + 1);
	return obj;
}

/* slab_free() of an object ``cpu`` got from rep ``origin``.  The slab's node is a node
 * class; two nodes of one class are told apart by their allocators' homes (the model's
 * dynamics.remote_to). */
static void slab_free(struct cpu *cpu, void *obj, int origin)
{
	if (*(uint64_t *)obj != LIVE_MAGIC) {
		fprintf(stderr, "slubsim: internal error: free of %p, not a live object\n", obj);
		exit(1);
	}
	*(uint64_t *)obj = 0;
	atomic_fetch_sub(&live_objs, 1);
	struct slab *s = virt_to_slab(obj);
	int remote = s->node != cpu->local_node || cpus[origin].mem_home != cpu->mem_home;
	if (remote)
		cpu->c.remote_free++;
	if (C.sheaf_capacity > 0 && !(C.remote_free_bypasses_sheaf && remote)) {
		sheaf_free(cpu, obj);
		return;
	}
	if (C.cpu_slab && s == cpu->slab) {
		set_fp(obj, cpu->freelist);
		cpu->freelist = obj;
		cpu->c.free_fastpath++;
		return;
	}
	cpu->c.free_slowpath++;
	slab_free_slow(cpu, s, obj);
}

/* ------------------------------------------------------------------ workload driver */

/* One step of rep r, as the model's workload: allocate (handing the object to the rep that
 * will free it, drawn from free_cum) or free a random object handed to us. */
static void step(struct cpu *cpu)
{
	int r = cpu->id;
	long n_in = atomic_load_explicit(&cpu->in_n, memory_order_acquire);
	int can_a = C.alloc_p[r] > 0 && atomic_load(&cpu->out) < C.live_target[r];
	int can_f = n_in > C.hold[r];	/* model workloads.hold_levels */
	int bursty = C.burst[r] > 0;
	uint32_t w0 = rnd32(&cpu->rng), w1 = rnd32(&cpu->rng);
	int want_a = bursty ? cpu->phase == 0 : (long)(w0 >> 16) < C.alloc_p[r];
	int do_a = can_a && (want_a || !can_f);
	int do_f = can_f && !do_a;
	if (bursty && (do_a || do_f)) {
		if (--cpu->phase_left <= 0) {
			cpu->phase ^= 1;
			cpu->phase_left = C.burst[r];
		}
	}
	if (do_a) {
		long lo16 = w1 & 0xffff;
		int j = 0;
		for (int k = (int)C.reps - 1; k >= 0; k--)
			if (lo16 < C.free_cum[r * C.reps + k])
				j = k;
		void *obj;
		if (C.time_ops) {
			uint64_t t0 = now_ticks();
			obj = slab_alloc(cpu);
			account_op(cpu, t0);
		} else {
			obj = slab_alloc(cpu);
		}
		atomic_fetch_add(&cpu->out, 1);
		struct cpu *to = &cpus[j];
		pthread_mutex_lock(&to->in_lock);
		long n = atomic_load(&to->in_n);
		to->in[n].obj = obj;
		to->in[n].origin = r;
		atomic_store_explicit(&to->in_n, n + 1, memory_order_release);
		pthread_mutex_unlock(&to->in_lock);
		cpu->c.allocs++;
		cpu->c.ops++;
	} else if (do_f) {
		pthread_mutex_lock(&cpu->in_lock);
		long n = atomic_load(&cpu->in_n);
		long i = (long)((w1 >> 1) % (uint32_t)n);
		if (C.free_order)
			i = 0;
		struct pend p = cpu->in[i];
		if (C.free_order)
			memmove(cpu->in, cpu->in + 1, sizeof(struct pend) * (size_t)(n - 1));
		else
			cpu->in[i] = cpu->in[n - 1];
		atomic_store(&cpu->in_n, n - 1);
		pthread_mutex_unlock(&cpu->in_lock);
		if (C.time_ops) {
			uint64_t t0 = now_ticks();
			slab_free(cpu, p.obj, p.origin);
			account_op(cpu, t0);
		} else {
			slab_free(cpu, p.obj, p.origin);
		}
		atomic_fetch_sub(&cpus[p.origin].out, 1);
		cpu->c.frees++;
		cpu->c.ops++;
	}
}

static int n_threads;
static struct timespec t_start, t_end;
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static int turn;

static void *thread_main(void *arg)
{
	struct cpu *cpu = arg;
	pthread_barrier_wait(&start_barrier);
	clock_gettime(CLOCK_MONOTONIC, &cpu->t0);
	if (C.serial) {
		/* the model's order: in every step each rep does its op in turn, 0..R-1 */
		for (long t = 0; t < C.steps; t++) {
			pthread_mutex_lock(&turn_lock);
			while (turn != cpu->id)
				pthread_cond_wait(&cpu->turn_cv, &turn_lock);
			pthread_mutex_unlock(&turn_lock);
			step(cpu);
			pthread_mutex_lock(&turn_lock);
			turn = cpu->next;
			pthread_cond_signal(&cpus[cpu->next].turn_cv);
			pthread_mutex_unlock(&turn_lock);
		}
		clock_gettime(CLOCK_MONOTONIC, &cpu->t1);
		cpu->ran_on = sched_getcpu();
		return NULL;
	}
	for (long t = 0; t < C.steps; t++) {
		step(cpu);
		if (C.sync_every && (t + 1) % C.sync_every == 0 && t + 1 < C.steps)
			pthread_barrier_wait(&step_barrier);
	}
	clock_gettime(CLOCK_MONOTONIC, &cpu->t1);
	cpu->ran_on = sched_getcpu();
	return NULL;
}

/* ------------------------------------------------------------------ output */

static void print_counters(const struct counters *c)
{
	int first = 1;
	printf("{");
#define X(n)                                                    \
	printf("%s\"%s\": %ld", first ? "" : ", ", #n, c->n); \
	first = 0;
	COUNTERS(X)
#undef X
	printf("}");
}

static void print_list(const char *name, const long *v, long n)
{
	printf("\"%s\": [", name);
	for (long i = 0; i < n; i++)
		printf("%s%ld", i ? ", " : "", v[i]);
	printf("]");
}

static double ts_diff(struct timespec a, struct timespec b)
{
	return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

static void report(void)
{
	struct counters tot;
	memset(&tot, 0, sizeof(tot));
	for (long r = 0; r < C.reps; r++) {
#define X(n) tot.n += cpus[r].c.n;
		COUNTERS(X)
#undef X
	}
	double wall = ts_diff(t_start, t_end);
	long in_slabs = atomic_load(&slabs_in_use), peak = atomic_load(&slabs_peak);
	printf("{\"counters\": ");
	print_counters(&tot);
	printf(",\n \"slab_bytes\": %lu, \"peak_slab_bytes\": %lu, \"final_slab_bytes\": %lu,",
	       slab_bytes, peak * slab_bytes, in_slabs * slab_bytes);
	printf("\n \"live_object_bytes\": %ld, \"peak_live_object_bytes\": %ld,",
	       atomic_load(&live_objs) * C.size, atomic_load(&live_peak) * C.size);
	printf("\n \"wall_seconds\": %.9f, \"ns_per_op\": %.3f, \"threads\": %d,", wall,
	       tot.ops ? wall * 1e9 / (double)tot.ops : 0.0, n_threads);
	if (C.time_ops) {
		/* time spent inside the allocator calls only (not the workload driver, the
		 * hand-over queues or a serial-mode turn), see account_op() */
		double ticks = 0;
		long timed = 0, dropped = 0;
		for (long r = 0; r < C.reps; r++) {
			ticks += (double)cpus[r].op_ticks;
			timed += cpus[r].op_timed;
			dropped += cpus[r].op_dropped;
		}
		printf("\n \"op_ns\": %.1f, \"op_timed\": %ld, \"op_dropped\": %ld, "
		       "\"op_ns_per_op\": %.3f, \"ticks_per_ns\": %.6f,", ticks / ticks_per_ns,
		       timed, dropped, timed ? ticks / ticks_per_ns / (double)timed : 0.0,
		       ticks_per_ns);
	}
	long partial[MAX_NODES];
	for (long n = 0; n < C.nodes; n++)
		partial[n] = nodes[n].nr_partial;
	printf("\n ");
	print_list("final_nr_partial", partial, C.nodes);
	printf(",\n \"config\": {");
	int first = 1;
	for (size_t i = 0; i < NKEYS; i++) {
		const struct key *k = &KEYS[i];
		printf("%s", first ? "" : ", ");
		first = 0;
		if (k->type == K_INT)
			printf("\"%s\": %ld", k->name, *(long *)((char *)&C + k->off));
		else
			print_list(k->name, (long *)((char *)&C + k->off), list_count(k, &C));
	}
	printf("}");
	if (C.per_thread) {
		printf(",\n \"per_thread\": [");
		for (long r = 0; r < C.reps; r++) {
			printf("%s\n  {\"rep\": %ld, \"active\": %ld, \"node\": %d, \"mem_node\": %d, "
			       "\"outstanding\": %ld, ",
			       r ? "," : "", r, C.active[r], cpus[r].node, cpus[r].mem_node,
			       atomic_load(&cpus[r].out));
			if (C.pin_cpu >= 0) /* where a pinned thread ran (varies run to run else) */
				printf("\"ran_on\": %d, ", C.active[r] ? cpus[r].ran_on : -1);
			printf("\"counters\": ");
			print_counters(&cpus[r].c);
			if (C.time_ops)
				printf(", \"op_ns\": %.1f, \"op_timed\": %ld, \"op_dropped\": %ld",
				       (double)cpus[r].op_ticks / ticks_per_ns, cpus[r].op_timed,
				       cpus[r].op_dropped);
			printf("}");
		}
		printf("]");
	}
	printf("}\n");
}

/* ------------------------------------------------------------------ setup */

static void setup(void)
{
	slab_shift = (unsigned)(PAGE_SHIFT + C.order);
	slab_bytes = 1UL << slab_shift;
	size_t len = ARENA_BYTES + slab_bytes;
	char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (raw == MAP_FAILED)
		die_sys("mmap arena");
	arena = (char *)(((uintptr_t)raw + slab_bytes - 1) & ~(uintptr_t)(slab_bytes - 1));
	zone_max = (long)(ARENA_BYTES >> slab_shift);
	slabs = mmap(NULL, sizeof(struct slab) * (size_t)zone_max, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (slabs == MAP_FAILED)
		die_sys("mmap slab table");
	long pages = 1L << C.order;
	pcp_high = C.pcp_high_pages / pages;
	pcp_batch = C.pcp_batch_pages / pages > 0 ? C.pcp_batch_pages / pages : 1;
	for (long n = 0; n < C.nodes; n++) {
		struct node *nd = &nodes[n];
		pthread_mutex_init(&nd->list_lock, NULL);
		pthread_mutex_init(&nd->barn_lock, NULL);
		nd->head.next = nd->head.prev = &nd->head;
		nd->full = calloc((size_t)C.barn_max_full + 1, sizeof(void *));
		nd->empty = calloc((size_t)C.barn_max_empty + 1, sizeof(void *));
		if (!nd->full || !nd->empty)
			die_sys("calloc barn");
	}
	long cap = 1;
	for (long r = 0; r < C.reps; r++)
		if (C.active[r])
			cap += C.live_target[r];
	for (long r = 0; r < C.reps; r++) {
		struct cpu *c = &cpus[r];
		c->id = (int)r;
		c->node = (int)C.rep_node[r];
		c->mem_node = (int)C.rep_mem_node[r];
		c->local_node = (int)C.rep_local_node[r];
		c->barn = (int)C.rep_barn[r];
		c->alloc_local = (int)C.rep_alloc_local[r];
		c->mem_home = (int)C.rep_mem_home[r];
		pthread_mutex_init(&c->in_lock, NULL);
		c->in = calloc((size_t)cap, sizeof(struct pend));
		if (!c->in)
			die_sys("calloc pending");
		c->rng = (uint64_t)C.seed * 0x100000001b3ULL + (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ULL;
		c->phase_left = C.phase_first[r] >= 0 ? C.phase_first[r] : C.burst[r];
		if (C.sheaf_capacity > 0) {
			c->main = sheaf_new();
			c->spare = sheaf_new();
		}
	}
}

int main(int argc, char **argv)
{
	parse_args(&C, argc, argv);
	setup();
	n_threads = 0;
	for (long r = 0; r < C.reps; r++)
		if (C.active[r])
			n_threads++;
	if (n_threads == 0)
		die_usage("active: no active rep%s%s", "", "");
	/* serial mode: a ring of the active reps in index order */
	int first_active = -1, prev = -1;
	for (long r = 0; r < C.reps; r++) {
		pthread_cond_init(&cpus[r].turn_cv, NULL);
		if (!C.active[r])
			continue;
		if (first_active < 0)
			first_active = (int)r;
		if (prev >= 0)
			cpus[prev].next = (int)r;
		prev = (int)r;
	}
	cpus[prev].next = first_active;
	turn = first_active;
	if (C.pin_cpu >= 0) {
		/* every thread on one core (they inherit the mask): on a machine with fewer
		 * cores than reps, time-slicing on one core replaces oversubscription across
		 * cores, and no per-CPU state moves between caches */
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET((int)C.pin_cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			die_sys("sched_setaffinity");
	}
	if (C.time_ops)
		calibrate_ticks();
	if (pthread_barrier_init(&start_barrier, NULL, (unsigned)n_threads + 1) ||
	    pthread_barrier_init(&step_barrier, NULL, (unsigned)n_threads))
		die_sys("pthread_barrier_init");
	for (long r = 0; r < C.reps; r++)
		if (C.active[r] && pthread_create(&cpus[r].tid, NULL, thread_main, &cpus[r]))
			die_sys("pthread_create");
	/* every thread is created before any starts; the wall time runs from the first
	 * thread's first step to the last thread's last step (each thread stamps its own, so
	 * a descheduled main thread does not shorten it) */
	pthread_barrier_wait(&start_barrier);
	int first = 1;
	for (long r = 0; r < C.reps; r++) {
		if (!C.active[r])
			continue;
		pthread_join(cpus[r].tid, NULL);
		if (first || ts_diff(cpus[r].t0, t_start) > 0)
			t_start = cpus[r].t0;
		if (first || ts_diff(t_end, cpus[r].t1) > 0)
			t_end = cpus[r].t1;
		first = 0;
	}
	report();
	return 0;
}
