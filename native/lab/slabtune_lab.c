// SPDX-License-Identifier: GPL-2.0-only
/*
 * slabtune_lab: drive one slab cache from kthreads bound to chosen CPUs, in the workload
 * kinds of slabtune's model (model/workloads.py), so that the real allocator's SLUB_STATS
 * counters (/sys/kernel/slab/<cache>/alloc_fastpath ...) can be set beside the model's.
 *
 * The cache: kmalloc(size) (the kmalloc cache that size falls in), or with own_cache=1 a
 * cache of the module's own, kmem_cache_create(cache_name, size, align, cache_flags).
 *
 * The workload is the model's, per worker instead of per representative CPU:
 *
 *   every op, a worker allocates if it may (it has done fewer than `ops` ops, fewer than
 *   its live target of the objects it allocated are outstanding) and wants to (its burst
 *   phase, else a random draw against its alloc probability), otherwise it frees one of the
 *   objects sent to it, if any.  Who frees an object is drawn when it is allocated, from
 *   the worker's free distribution; the object then travels to that worker (itself
 *   included) through a ring.  Which pending object a free takes is drawn in proportion to
 *   the objects each ring holds (oldest first within a ring).
 *
 * Kinds (cpus: list A, cpus_b: list B; probabilities are integers out of 65536):
 *
 *   local             A: every worker allocates and frees its own objects (live, burst,
 *                     alloc_prob).  B unused.
 *   producer_consumer A allocate (depth in flight each), B free; a sender sends a
 *                     cross_node share to receivers on other nodes than its own, the rest
 *                     to receivers on its node (all to the other side when one is empty).
 *   request_response  A: application CPUs; B: exactly one interrupt CPU.  Every worker
 *                     allocates with probability 1/2 (live outstanding each).  The
 *                     interrupt CPU frees irq_free of what A allocates (A frees the rest
 *                     itself); it frees irq_self_free of its own allocations and sends the
 *                     rest evenly to A.
 *   block_io          A submit (allocate, depth in flight each), B complete (free); each
 *                     submitter spreads its requests evenly over B.
 *
 * Rings: ring=lockless gives one single-producer single-consumer ring per (allocating,
 * freeing) pair, acquire/release only; ring=spinlock gives one ring per freeing worker,
 * shared by every worker that sends to it, under a spinlock.
 *
 * Schedule: free-running by default (a worker with nothing to do spins 64 times, then
 * sleeps); lockstep=1 puts every worker on a step barrier from the first step, the
 * warm-up included, one op or none per step, the model's schedule (lab_ls_wait()), and an
 * allocating worker's `warmup` and `ops` then count steps, idle ones included, so all
 * park and stop at the same step; "steps" in the done record counts the barrier's steps
 * (warm-up and window).
 *
 * Drain: drain=eager (the default) frees whenever a worker has objects pending;
 * drain=hold keeps the declared live set (model/workloads.py hold_levels(), the same rule
 * in integers): an allocating worker of declared occupancy L (live, or depth) allocates
 * up to a cap of L + h, h = max(1, L / 32), or with bursts B of local up to L + (B - B/2)
 * (B > 2L is refused); a freeing worker frees only while the objects pending to it (every
 * ring it takes from, its own included) exceed its hold, round(sum over senders o of
 * share[o][r] * (L_o - h_o)) (L - B/2 with bursts), share[o][r] the fraction (of 65536)
 * of o's objects it frees, from the module's own per-worker free distributions.  One op
 * per step, so a free run never frees more than the excess.  The end drain (nobody
 * allocates any more) frees everything.
 *
 * end_park=1 (lockstep with a warm-up): all workers park again once the barrier has
 * released the window's last step, before any drain op; /proc/slabtune_lab reads "ended"
 * and the window's end can be dumped; writing "resume" lets the drain run.  So the
 * drain (up to the live set of every worker) stays outside the counted window.
 *
 * A worker stops allocating after `ops` ops (allocations plus frees) and keeps freeing
 * what reaches it until no worker allocates any more and its rings are empty; workers
 * that never allocate (receivers, completion CPUs) only do the latter.  So every object
 * is freed before the run ends.  The run starts on load (autorun=1) and again each time 1
 * is written to /sys/module/slabtune_lab/parameters/run; it reports through printk lines
 * with a fixed prefix, each one JSON object:
 *
 *   slabtune_lab: worker {"run":R,"w":i,"cpu":c,"node":n,"role":"...","allocs":...,
 *                          "frees":...,"drain_frees":...,"idle":...,"ops_ns":...,"ns":...,
 *                          "alloc_ns":...,"free_ns":...,"clock_ps":...,"alloc_long":...,
 *                          "alloc_long_ns":...,"free_long":...,"free_long_ns":...,
 *                          "cap":...,"hold":...}
 *   slabtune_lab: done {"run":R,"status":0,"kind":"...","allocs":...,"frees":...,...}
 *   slabtune_lab: error {"run":R,"field":"...","msg":"..."}
 *
 * ops_ns is a worker's time from the start to its last op (an allocating worker: its `ops`
 * ops; a freeing-only worker: its last free), ns to the end of its drain, both with the
 * rings, the generator and the idle waits in them.  With time_calls=1 every allocation
 * and free call (kmem_cache_alloc/kmalloc, kmem_cache_free/kfree and nothing else) is
 * bracketed by two ktime_get_ns() reads: alloc_ns and free_ns add up the brackets the
 * worker's own calls took, and clock_ps is the mean of 65536 empty brackets taken before
 * the start (picoseconds, long ones left out), what each bracket adds to a call.  A bracket longer than long_ns
 * (0: none is) goes to alloc_long/free_long (count) and alloc_long_ns/free_long_ns (sum)
 * instead: on a shared host such a bracket is mostly the virtual CPU's host thread being
 * preempted, not the allocator.  With time_calls=0 (the default) all of these are 0 and no
 * clock is read.
 *
 * A bad parameter fails the load (or the write to `run`) with -EINVAL after an error line
 * naming it.  The module allocates its own bookkeeping with vzalloc, so none of it comes
 * from the kmalloc caches it drives (vmalloc itself takes a few small kmalloc objects).
 * No floating point: a splitmix64 generator per worker, seeded from `seed`.
 */
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/cpumask.h>
#include <linux/delay.h>
#include <linux/err.h>
#include <linux/kernel.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/log2.h>
#include <linux/math64.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/topology.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>

#define LAB_PREFIX "slabtune_lab: "
#define LAB_MAX_WORKERS 64
#define LAB_PROB_ONE 65536u
#define LAB_MAX_LIVE (1u << 20)
#define LAB_MAGIC 0x5ab7u
#define LAB_CLOCK_BRACKETS 65536

/* ------------------------------------------------------------------ parameters */

static char *kind = "local";
module_param(kind, charp, 0644);
MODULE_PARM_DESC(kind, "local | producer_consumer | request_response | block_io");
static char *cpus = "0";
module_param(cpus, charp, 0644);
MODULE_PARM_DESC(cpus, "CPU list A (e.g. 0,2-3): allocating/submitting/application CPUs");
static char *cpus_b = "";
module_param(cpus_b, charp, 0644);
MODULE_PARM_DESC(cpus_b, "CPU list B: receivers / the interrupt CPU / completion CPUs");
static unsigned int size = 512;
module_param(size, uint, 0644);
MODULE_PARM_DESC(size, "object size in bytes (kmalloc(size), or the own cache's size)");
static bool own_cache;
module_param(own_cache, bool, 0644);
MODULE_PARM_DESC(own_cache, "1: a cache of the module's own instead of kmalloc");
static char cache_name[32] = "slabtune_lab";
module_param_string(cache_name, cache_name, sizeof(cache_name), 0644);
MODULE_PARM_DESC(cache_name, "name of the own cache");
static unsigned int align;
module_param(align, uint, 0644);
MODULE_PARM_DESC(align, "alignment of the own cache (0: the default)");
static char *cache_flags = "";
module_param(cache_flags, charp, 0644);
MODULE_PARM_DESC(cache_flags, "own cache flags: hwcache_align,reclaim_account,account,no_merge");
static bool keep_cache;
module_param(keep_cache, bool, 0644);
MODULE_PARM_DESC(keep_cache, "1: destroy the own cache at unload, not after the run");
static unsigned int live = 32;
module_param(live, uint, 0644);
MODULE_PARM_DESC(live, "local, request_response: objects outstanding per worker at most");
static unsigned int burst;
module_param(burst, uint, 0644);
MODULE_PARM_DESC(burst, "local: alternate burst allocations and burst frees (0: random)");
static unsigned int alloc_prob = 32768;
module_param(alloc_prob, uint, 0644);
MODULE_PARM_DESC(alloc_prob, "local: probability (out of 65536) that an op allocates");
static unsigned int depth = 64;
module_param(depth, uint, 0644);
MODULE_PARM_DESC(depth, "producer_consumer, block_io: objects in flight per allocator");
static unsigned int cross_node;
module_param(cross_node, uint, 0644);
MODULE_PARM_DESC(cross_node, "producer_consumer: share (of 65536) sent to other nodes");
static unsigned int irq_free = 58982;
module_param(irq_free, uint, 0644);
MODULE_PARM_DESC(irq_free, "request_response: share (of 65536) of A's objects B frees");
static unsigned int irq_self_free;
module_param(irq_self_free, uint, 0644);
MODULE_PARM_DESC(irq_self_free, "request_response: share (of 65536) B frees of its own");
static unsigned long ops = 10000;
module_param(ops, ulong, 0644);
MODULE_PARM_DESC(ops, "ops (allocations plus frees) per allocating worker");
static unsigned long warmup;
module_param(warmup, ulong, 0644);
MODULE_PARM_DESC(warmup, "ops per allocating worker before the counted window (0: none)");
static unsigned long seed = 1;
module_param(seed, ulong, 0644);
MODULE_PARM_DESC(seed, "seed of the per-worker generators");
static char *ring = "lockless";
module_param(ring, charp, 0644);
MODULE_PARM_DESC(ring, "lockless (a ring per pair) | spinlock (a shared ring per freer)");
static unsigned int work_ns;
module_param(work_ns, uint, 0644);
MODULE_PARM_DESC(work_ns, "busy-wait after each op (the workload's own work), ns");
static bool time_calls;
module_param(time_calls, bool, 0644);
MODULE_PARM_DESC(time_calls, "1: time every allocation and free call (alloc_ns, free_ns)");
static unsigned int long_ns;
module_param(long_ns, uint, 0644);
MODULE_PARM_DESC(long_ns, "time_calls: brackets above this many ns are counted apart (0: none)");
static bool idle_spin;
module_param(idle_spin, bool, 0644);
MODULE_PARM_DESC(idle_spin, "1: a worker with nothing to do spins, never sleeps");
static char *drain = "eager";
module_param(drain, charp, 0644);
MODULE_PARM_DESC(drain, "eager (free whenever objects are pending) | hold (keep the "
		 "declared live set: live, depth are occupancies)");
static bool end_park;
module_param(end_park, bool, 0644);
MODULE_PARM_DESC(end_park, "1: with lockstep and a warm-up, park every worker after the "
		 "window's last step, before the drain (/proc/slabtune_lab reads ended)");
static bool lockstep;
module_param(lockstep, bool, 0644);
MODULE_PARM_DESC(lockstep, "1: in the warm-up and the counted window every worker does at "
		 "most one op per step and waits for the others at a barrier (the model's "
		 "schedule); warmup and ops count steps");
static bool autorun = true;
module_param(autorun, bool, 0444);
MODULE_PARM_DESC(autorun, "run once at load");
static int last_status;
module_param(last_status, int, 0444);
MODULE_PARM_DESC(last_status, "status of the last run (0 or a negative errno)");

/* ------------------------------------------------------------------ state */

struct lab_ring {
	void **slot;
	unsigned int mask;
	unsigned int head;		/* advanced by the producer(s) */
	unsigned int tail;		/* advanced by the consumer */
	spinlock_t lock;		/* ring=spinlock: held around push and pop */
	unsigned int cap_want;		/* objects it must hold at most */
	int src;			/* the one sender (ring=lockless), -1: any */
};

struct lab_run;

struct lab_worker {
	struct lab_run *run;
	int idx;
	int cpu;
	int node;
	const char *role;
	u32 alloc_p;			/* out of LAB_PROB_ONE */
	u32 live;			/* live target (the allocation cap) */
	u32 hold;			/* drain=hold: frees only above this many pending */
	u32 burst;
	bool allocator;
	int ndest;
	u8 dest[LAB_MAX_WORKERS];
	u32 dest_cum[LAB_MAX_WORKERS];	/* cumulative, the last is LAB_PROB_ONE */
	struct lab_ring *out_ring[LAB_MAX_WORKERS];	/* per dest index */
	int nin;
	struct lab_ring *in_ring[LAB_MAX_WORKERS];
	atomic_t out;			/* objects it allocated that nobody freed yet */
	u64 rng;
	int phase;
	u32 phase_left;
	/* results */
	u64 allocs, frees, drain_frees, idle;
	u64 warm_allocs, warm_frees;	/* allocs, frees when it parked (warmup > 0) */
	u64 end_allocs, end_frees;	/* allocs, frees at the window's end (end_park) */
	bool warm_reached;		/* an allocator that did its warmup ops */
	bool in_step;			/* lockstep: a party to the step barrier */
	u64 ops_ns, ns;
	u64 alloc_ns, free_ns, clock_ps;	/* time_calls=1 */
	u64 alloc_long, alloc_long_ns, free_long, free_long_ns;
	struct task_struct *task;
	struct completion done;
};

struct lab_run {
	unsigned int id;
	int nw;
	int na;				/* workers in list A */
	struct lab_worker *w;		/* nw workers */
	struct lab_ring *rings;		/* nw * nw (lockless) or nw (spinlock) */
	int nrings;
	bool locked;
	struct kmem_cache *cache;
	unsigned int size;
	unsigned long ops;
	unsigned long warmup;		/* 0: no warm-up phase, no barrier */
	atomic_t warm_left;		/* allocating workers still in their warm-up ops */
	atomic_t parked;		/* workers parked at the window's start */
	int resumed;			/* 1: resumed by /proc/slabtune_lab, -1: by timeout */
	bool hold;			/* drain=hold */
	bool end_park;			/* park at the window's end too (lockstep, warmup) */
	atomic_t end_parked;		/* workers parked at the window's end */
	int ended;			/* 1: end resumed by /proc/slabtune_lab, -1: timeout */
	unsigned int work_ns;
	bool timed;			/* time_calls */
	bool spin;			/* idle_spin */
	u64 long_ns;
	atomic_t allocating;		/* allocating workers still in their ops */
	int allocators;			/* allocating workers at the start */
	bool lockstep;			/* the step barrier, warm-up and counted window */
	spinlock_t ls_lock;		/* guards ls_n, ls_arrived; ls_gen's writes */
	int ls_n;			/* workers still in lockstep */
	int ls_arrived;			/* of them, those at the barrier of this step */
	unsigned long ls_gen;		/* steps released so far */
	wait_queue_head_t ls_wq;	/* workers that stopped spinning at the barrier */
	int abort;			/* an allocation failed: stop allocating */
	struct completion go;
	unsigned int ksize;
};

static DEFINE_MUTEX(lab_mutex);
static unsigned int lab_runs;
static bool lab_ready;
static struct kmem_cache *lab_kept_cache;

/*
 * The warm-up barrier (warmup > 0): /proc/slabtune_lab reads the phase of the current
 * run; writing "resume" to it, once it reads "parked", starts the counted window.  The
 * module's parameters cannot carry this: the load holds their lock during an autorun.
 */
enum { LAB_IDLE, LAB_WARMUP, LAB_PARKED, LAB_WINDOW, LAB_ENDED, LAB_DRAIN };
static atomic_t lab_phase = ATOMIC_INIT(LAB_IDLE);
static DECLARE_COMPLETION(lab_resume);
static DECLARE_COMPLETION(lab_resume_end);
/* a parked run that nobody resumes goes on after this long (the window then has no
 * snapshot, and the host side reports that) */
#define LAB_PARK_TIMEOUT (120 * HZ)

struct lab_obj {
	u16 magic;
	u16 src;
};

/* ------------------------------------------------------------------ helpers */

static void lab_error(unsigned int id, const char *field, const char *msg)
{
	pr_info(LAB_PREFIX "error {\"run\":%u,\"field\":\"%s\",\"msg\":\"%s\"}\n", id, field, msg);
}

static u32 lab_rand(struct lab_worker *w)
{
	u64 z = (w->rng += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return (u32)((z ^ (z >> 31)) >> 32);
}

/* "0,2-3" -> out[] (in the order given, repeats allowed); count, or -EINVAL */
static int lab_parse_cpus(const char *s, int *out, int max)
{
	int n = 0;

	while (s && *s) {
		unsigned int a, b;
		char *end;

		if (*s == ',') {
			s++;
			continue;
		}
		a = simple_strtoul(s, &end, 10);
		if (end == s)
			return -EINVAL;
		b = a;
		s = end;
		if (*s == '-') {
			s++;
			b = simple_strtoul(s, &end, 10);
			if (end == s || b < a)
				return -EINVAL;
			s = end;
		}
		if (*s && *s != ',' && *s != '\n')
			return -EINVAL;
		if (*s == '\n')
			s++;
		for (; a <= b; a++) {
			if (n >= max || a >= nr_cpu_ids || !cpu_online(a))
				return -EINVAL;
			out[n++] = a;
		}
	}
	return n;
}

static bool lab_word(const char *s, const char *word)
{
	size_t n = strlen(word);

	return !strncmp(s, word, n) && (s[n] == '\0' || s[n] == '\n');
}

static int lab_parse_flags(const char *s, slab_flags_t *flags)
{
	*flags = 0;
	while (s && *s) {
		const char *end = strchrnul(s, ',');
		size_t n = end - s;

		if (n && s[n - 1] == '\n')
			n--;
		if (n == 13 && !strncmp(s, "hwcache_align", n))
			*flags |= SLAB_HWCACHE_ALIGN;
		else if (n == 15 && !strncmp(s, "reclaim_account", n))
			*flags |= SLAB_RECLAIM_ACCOUNT;
		else if (n == 7 && !strncmp(s, "account", n))
			*flags |= SLAB_ACCOUNT;
#ifdef SLAB_NO_MERGE
		else if (n == 8 && !strncmp(s, "no_merge", n))
			*flags |= SLAB_NO_MERGE;
#endif
		else if (n)
			return -EINVAL;
		s = *end ? end + 1 : end;
	}
	return 0;
}

/* ------------------------------------------------------------------ rings */

static bool lab_push(struct lab_run *r, struct lab_ring *q, void *obj)
{
	unsigned int head, tail;
	bool ok = false;

	if (r->locked)
		spin_lock(&q->lock);
	head = q->head;
	tail = smp_load_acquire(&q->tail);
	if (head - tail <= q->mask) {
		q->slot[head & q->mask] = obj;
		smp_store_release(&q->head, head + 1);
		ok = true;
	}
	if (r->locked)
		spin_unlock(&q->lock);
	return ok;
}

static void *lab_pop(struct lab_run *r, struct lab_ring *q)
{
	unsigned int head, tail;
	void *obj = NULL;

	if (r->locked)
		spin_lock(&q->lock);
	tail = q->tail;
	head = smp_load_acquire(&q->head);
	if (head != tail) {
		obj = q->slot[tail & q->mask];
		smp_store_release(&q->tail, tail + 1);
	}
	if (r->locked)
		spin_unlock(&q->lock);
	return obj;
}

static unsigned int lab_count(struct lab_ring *q)
{
	return smp_load_acquire(&q->head) - READ_ONCE(q->tail);
}

/* objects pending to w: what every ring it takes from holds, its own included */
static unsigned int lab_pending(struct lab_worker *w)
{
	unsigned int k, pend = 0;

	for (k = 0; k < w->nin; k++)
		pend += lab_count(w->in_ring[k]);
	return pend;
}

/* ------------------------------------------------------------------ ops */

/* add one timed bracket of d ns to *sum, or with long_ns set and d above it, apart */
static void lab_account(struct lab_run *r, u64 d, u64 *sum, u64 *nlong, u64 *long_sum)
{
	if (r->long_ns && d > r->long_ns) {
		(*nlong)++;
		*long_sum += d;
	} else {
		*sum += d;
	}
}

/* free obj (worker `by` calls the allocator: its free_ns with time_calls) */
static void lab_free_obj(struct lab_run *r, struct lab_worker *by, void *obj)
{
	struct lab_obj *o = obj;
	struct lab_worker *src;
	u64 t = 0;

	WARN_ON_ONCE(o->magic != LAB_MAGIC || o->src >= r->nw);
	src = &r->w[o->src < r->nw ? o->src : 0];
	o->magic = 0;
	if (r->timed)
		t = ktime_get_ns();
	if (r->cache)
		kmem_cache_free(r->cache, obj);
	else
		kfree(obj);
	if (r->timed)
		lab_account(r, ktime_get_ns() - t, &by->free_ns, &by->free_long,
			    &by->free_long_ns);
	smp_mb__before_atomic();
	atomic_dec(&src->out);
}

/*
 * free one pending object, drawn in proportion to what each incoming ring holds; with
 * others_only, from the rings other workers send to (a worker waiting at the warm-up
 * barrier: it frees what others wait on, not its own objects)
 */
static bool lab_free_one_of(struct lab_run *r, struct lab_worker *w, u32 rnd,
			    bool others_only)
{
	unsigned int cnt[LAB_MAX_WORKERS];
	u64 total = 0, pick;
	int k;
	void *obj;

	for (k = 0; k < w->nin; k++) {
		cnt[k] = others_only && w->in_ring[k]->src == w->idx ? 0 :
			 lab_count(w->in_ring[k]);
		total += cnt[k];
	}
	if (!total)
		return false;
	pick = ((u64)rnd * total) >> 32;
	for (k = 0; k < w->nin; k++) {
		if (pick < cnt[k])
			break;
		pick -= cnt[k];
	}
	if (k == w->nin)
		k = w->nin - 1;
	obj = lab_pop(r, w->in_ring[k]);
	if (!obj)
		return false;	/* ring=spinlock: never, only this worker pops */
	lab_free_obj(r, w, obj);
	w->frees++;
	return true;
}

static bool lab_free_one(struct lab_run *r, struct lab_worker *w, u32 rnd)
{
	return lab_free_one_of(r, w, rnd, false);
}

/* allocate one object and send it to the freer drawn with the low 16 bits of rnd */
static int lab_alloc_one(struct lab_run *r, struct lab_worker *w, u32 rnd)
{
	struct lab_obj *o;
	u32 u = rnd & 0xffff;
	int j = 0;
	u64 t = 0;

	while (j < w->ndest - 1 && w->dest_cum[j] <= u)
		j++;
	if (r->timed)
		t = ktime_get_ns();
	if (r->cache)
		o = kmem_cache_alloc(r->cache, GFP_KERNEL);
	else
		o = kmalloc(r->size, GFP_KERNEL);
	if (r->timed)
		lab_account(r, ktime_get_ns() - t, &w->alloc_ns, &w->alloc_long,
			    &w->alloc_long_ns);
	if (!o)
		return -ENOMEM;
	o->magic = LAB_MAGIC;
	o->src = w->idx;
	atomic_inc(&w->out);
	if (!lab_push(r, w->out_ring[j], o)) {
		/* cannot happen: a ring holds at most the live targets of its senders */
		lab_free_obj(r, w, o);
		return -EOVERFLOW;
	}
	w->allocs++;
	return 1;
}

/*
 * drain=hold keeps a freer's level only while every allocating worker still allocates:
 * the holds add up to the allocators' declared live sets, so once one allocator has done
 * its ops (free-running workers finish apart) the others' objects alone can sit at or
 * below every hold while they wait at their caps, and nobody would move again
 */
static bool lab_holding(struct lab_run *r, struct lab_worker *w)
{
	return w->hold && atomic_read(&r->allocating) == r->allocators;
}

/* one op of an allocating worker: 1 allocated, 2 freed, 0 nothing to do, < 0 error */
static int lab_step(struct lab_run *r, struct lab_worker *w)
{
	u32 rnd = lab_rand(w);
	bool can_a, can_f, want_a, do_a;
	int ret;

	can_a = w->alloc_p > 0 && (u32)atomic_read(&w->out) < w->live;
	/* drain=eager: hold 0, any pending object; drain=hold: only above the hold */
	can_f = lab_pending(w) > (lab_holding(r, w) ? w->hold : 0);
	want_a = w->burst ? w->phase == 0 : (rnd >> 16) < w->alloc_p;
	do_a = can_a && (want_a || !can_f);
	if (!do_a && !can_f)
		return 0;
	if (do_a)
		ret = lab_alloc_one(r, w, rnd);
	else
		ret = lab_free_one(r, w, lab_rand(w)) ? 2 : 0;
	if (ret > 0 && w->burst && --w->phase_left == 0) {
		w->phase ^= 1;
		w->phase_left = w->burst;
	}
	return ret;
}

/*
 * nothing to do: spin 64 times, then sleep 20-50 us at a time (without high-resolution
 * timers that is up to a tick), unless idle_spin=1, which keeps spinning, so that the two
 * sides of a hand-off run at once instead of a tick apart
 */
static void lab_idle(struct lab_worker *w, unsigned int *idle)
{
	w->idle++;
	if (++*idle < 64 || w->run->spin) {
		cpu_relax();
		cond_resched();
	} else {
		usleep_range(20, 50);
	}
}

/*
 * Park at the window's start: every allocating worker did its warmup ops.  The last
 * worker to park tells /proc/slabtune_lab; all wait for "resume" there.
 */
static void lab_park(struct lab_run *r, struct lab_worker *w)
{
	w->warm_allocs = w->allocs;
	w->warm_frees = w->frees;
	if (atomic_inc_return(&r->parked) == r->nw)
		atomic_set(&lab_phase, LAB_PARKED);
	if (wait_for_completion_timeout(&lab_resume, LAB_PARK_TIMEOUT))
		cmpxchg(&r->resumed, 0, 1);
	else
		cmpxchg(&r->resumed, 0, -1);
	atomic_set(&lab_phase, LAB_WINDOW);
}

/*
 * end_park=1: park at the window's end, after the barrier released step warmup + ops and
 * before any worker does a drain op; the last to park tells /proc/slabtune_lab ("ended"),
 * all wait for "resume" there.
 */
static void lab_park_end(struct lab_run *r, struct lab_worker *w)
{
	w->end_allocs = w->allocs;
	w->end_frees = w->frees;
	if (atomic_inc_return(&r->end_parked) == r->nw)
		atomic_set(&lab_phase, LAB_ENDED);
	if (wait_for_completion_timeout(&lab_resume_end, LAB_PARK_TIMEOUT))
		cmpxchg(&r->ended, 0, 1);
	else
		cmpxchg(&r->ended, 0, -1);
	atomic_set(&lab_phase, LAB_DRAIN);
}

/*
 * lockstep=1: the model advances its CPUs one op each per step (model/dynamics.py), so
 * how many objects come back to an allocator between two of its allocations is set by
 * the workload's rates alone.  Free-running workers are not: a worker that finds nothing
 * to do sleeps a tick (lab_idle()), and under TCG vCPU threads share the host's cores in
 * time slices, so returns pile up and an allocator takes them back in one batch.  With
 * the barrier every worker does one step (one op or none) and waits for the others, the
 * model's schedule, whatever the vCPUs' speeds.  Called with ls_lock held: release the
 * step.
 */
static void lab_ls_release(struct lab_run *r)
{
	r->ls_arrived = 0;
	smp_store_release(&r->ls_gen, r->ls_gen + 1);
	wake_up_all(&r->ls_wq);
}

/* one step done: wait until every worker still in lockstep did its own */
static void lab_ls_wait(struct lab_run *r)
{
	unsigned long gen;
	unsigned int spins = 0;

	spin_lock(&r->ls_lock);
	gen = r->ls_gen;
	if (++r->ls_arrived >= r->ls_n)
		lab_ls_release(r);
	spin_unlock(&r->ls_lock);
	while (smp_load_acquire(&r->ls_gen) == gen) {
		if (++spins < 256) {
			cpu_relax();
			continue;
		}
		/* a halted vCPU gives the host's core to the ones the step waits for */
		wait_event_timeout(r->ls_wq, smp_load_acquire(&r->ls_gen) != gen, HZ);
	}
}

/*
 * The warm-up is over.  Free-running: once every allocating worker did its warmup ops.
 * In lockstep: once the barrier released step `warmup`, which every worker passes before
 * it looks here again, so all park after the same step and none is left at the barrier
 * (the model's warm-up is that many steps, validate/lab.py).  A free-running warm-up left
 * the window's start to the vCPUs' time slices: on 7.2 pc-4cpu-ml the senders refilled 15
 * sheaves before the receivers' full ones came back, and the barns then held 9 full
 * sheaves through the window: 240 KiB of slabs, 136 KiB with the warm-up in step (the
 * model: 114 KiB).
 */
static bool lab_warm_over(struct lab_run *r)
{
	if (r->lockstep)
		return smp_load_acquire(&r->ls_gen) >= r->warmup;
	return atomic_read(&r->warm_left) == 0;
}

/* a worker leaves lockstep (it stopped allocating, or nobody allocates any more) */
static void lab_ls_leave(struct lab_run *r, struct lab_worker *w)
{
	spin_lock(&r->ls_lock);
	w->in_step = false;
	r->ls_n--;
	if (r->ls_arrived && r->ls_arrived >= r->ls_n)
		lab_ls_release(r);
	spin_unlock(&r->ls_lock);
}

static int lab_worker_fn(void *arg)
{
	struct lab_worker *w = arg;
	struct lab_run *r = w->run;
	bool allocating = w->allocator;
	unsigned long done_ops = 0;
	unsigned int idle = 0;
	bool warming = r->warmup > 0;
	bool end_due = r->end_park;	/* the window's end is still to park at */
	u64 t0;

	if (r->timed) {
		/* what one bracket of two clock reads adds to a timed call (long ones apart) */
		u64 sum = 0, n = 0, a, d;
		int k;

		for (k = 0; k < LAB_CLOCK_BRACKETS; k++) {
			a = ktime_get_ns();
			d = ktime_get_ns() - a;
			if (r->long_ns && d > r->long_ns)
				continue;
			sum += d;
			n++;
		}
		w->clock_ps = n ? div64_u64(sum * 1000, n) : 0;
	}
	wait_for_completion(&r->go);
	w->in_step = r->lockstep;
	t0 = ktime_get_ns();
	for (;;) {
		int op;

		if (warming && READ_ONCE(r->abort)) {
			warming = false;	/* no window: the run fails anyway */
		} else if (warming) {
			if (allocating && !w->warm_reached && done_ops >= r->warmup) {
				w->warm_reached = true;
				smp_mb__before_atomic();
				atomic_dec(&r->warm_left);
			}
			if (lab_warm_over(r)) {
				smp_rmb();
				lab_park(r, w);
				warming = false;
				done_ops = 0;
				idle = 0;
				continue;
			}
			if (w->warm_reached && !w->in_step) {
				/*
				 * free-running: wait for the others, freeing what they sent
				 * here (in lockstep the step that ends the warm-up parks all)
				 */
				op = lab_free_one_of(r, w, lab_rand(w), true) ? 2 : 0;
				if (!op) {
					lab_idle(w, &idle);
					continue;
				}
				idle = 0;
				if (r->work_ns)
					ndelay(r->work_ns);
				cond_resched();
				continue;
			}
		}
		if (end_due && READ_ONCE(r->abort)) {
			end_due = false;	/* no window: the run fails anyway */
		} else if (end_due && !warming &&
			   smp_load_acquire(&r->ls_gen) >= r->warmup + r->ops) {
			/* every worker is here before its first drain op (lockstep) */
			end_due = false;
			smp_rmb();
			lab_park_end(r, w);
		}
		if (allocating && (done_ops >= r->ops || READ_ONCE(r->abort))) {
			allocating = false;
			if (w->in_step)
				lab_ls_leave(r, w);
			w->ops_ns = ktime_get_ns() - t0;
			smp_mb__before_atomic();
			atomic_dec(&r->allocating);
		}
		if (allocating) {
			op = lab_step(r, w);
			if (op < 0) {
				WRITE_ONCE(r->abort, op);
				continue;
			}
		} else {
			bool last = atomic_read(&r->allocating) == 0;

			smp_rmb();
			if (last && w->in_step)
				lab_ls_leave(r, w);
			if (!last && lab_holding(r, w) && lab_pending(w) <= w->hold)
				op = 0;		/* drain=hold: the queue keeps its level */
			else
				op = lab_free_one(r, w, lab_rand(w)) ? 2 : 0;
			if (op)
				w->drain_frees++;
			else if (last)
				break;
		}
		if (w->in_step) {
			/*
			 * one step: this op (or none), its work, then the others'.  The budget
			 * counts steps here, as the model runs every CPU for `steps` steps:
			 * counting ops, a CPU with more to do per step (an interrupt CPU that
			 * frees for three) ran out of ops first and the rest of the window
			 * ran without its allocations
			 */
			if (allocating)
				done_ops++;
			if (op && r->work_ns)
				ndelay(r->work_ns);
			if (!op)
				w->idle++;
			lab_ls_wait(r);
			cond_resched();
			continue;
		}
		if (!op) {
			lab_idle(w, &idle);
			continue;
		}
		idle = 0;
		if (allocating)
			done_ops++;
		if (r->work_ns)
			ndelay(r->work_ns);
		if ((done_ops & 31) == 0 || !allocating)
			cond_resched();
	}
	w->ns = ktime_get_ns() - t0;
	if (!w->allocator)
		w->ops_ns = w->ns;
	complete(&w->done);
	while (!kthread_should_stop()) {
		set_current_state(TASK_INTERRUPTIBLE);
		if (!kthread_should_stop())
			schedule();
		__set_current_state(TASK_RUNNING);
	}
	return 0;
}

/* ------------------------------------------------------------------ workload tables */

/* share `part` (of 65536) evenly over workers first..first+n-1 as w's destinations */
static void lab_add_dests(struct lab_worker *w, u32 *cum, int first, int n, u32 part)
{
	int k;

	if (!n || !part)
		return;
	for (k = 0; k < n; k++) {
		u32 share = (u32)((u64)part * (k + 1) / n - (u64)part * k / n);

		if (!share)
			continue;
		*cum += share;
		w->dest[w->ndest] = first + k;
		w->dest_cum[w->ndest] = *cum;
		w->ndest++;
	}
}

static void lab_add_dest_list(struct lab_worker *w, u32 *cum, const int *idx, int n, u32 part)
{
	int k;

	for (k = 0; k < n && part; k++) {
		u32 share = (u32)((u64)part * (k + 1) / n - (u64)part * k / n);

		if (!share)
			continue;
		*cum += share;
		w->dest[w->ndest] = idx[k];
		w->dest_cum[w->ndest] = *cum;
		w->ndest++;
	}
}

static void lab_role(struct lab_worker *w, const char *role, u32 alloc_p, u32 lv, u32 bst)
{
	w->role = role;
	w->alloc_p = alloc_p;
	w->live = alloc_p ? lv : 0;
	w->burst = bst;
	w->allocator = alloc_p > 0;
}

/* fill roles and free distributions; 0, or -EINVAL after an error line */
static int lab_tables(struct lab_run *r, const char *k)
{
	int na = r->na, nb = r->nw - r->na, i;

	if (lab_word(k, "local")) {
		if (nb) {
			lab_error(r->id, "cpus_b", "local uses cpus only");
			return -EINVAL;
		}
		if (!live || live > LAB_MAX_LIVE || alloc_prob > LAB_PROB_ONE ||
		    burst > LAB_MAX_LIVE) {
			lab_error(r->id, !live || live > LAB_MAX_LIVE ? "live" :
				  alloc_prob > LAB_PROB_ONE ? "alloc_prob" : "burst", "out of range");
			return -EINVAL;
		}
		for (i = 0; i < na; i++) {
			u32 cum = 0;

			lab_role(&r->w[i], "local", alloc_prob, live, burst);
			lab_add_dests(&r->w[i], &cum, i, 1, LAB_PROB_ONE);
		}
		return 0;
	}
	if (lab_word(k, "producer_consumer")) {
		if (!na || !nb) {
			lab_error(r->id, na ? "cpus_b" : "cpus", "producer_consumer needs senders "
				  "(cpus) and receivers (cpus_b)");
			return -EINVAL;
		}
		if (!depth || depth > LAB_MAX_LIVE || cross_node > LAB_PROB_ONE) {
			lab_error(r->id, cross_node > LAB_PROB_ONE ? "cross_node" : "depth",
				  "out of range");
			return -EINVAL;
		}
		for (i = 0; i < na; i++) {
			struct lab_worker *w = &r->w[i];
			int same[LAB_MAX_WORKERS], other[LAB_MAX_WORKERS], ns = 0, no = 0, j;
			u32 cum = 0, c;

			lab_role(w, "sender", LAB_PROB_ONE, depth, 0);
			for (j = na; j < r->nw; j++) {
				if (r->w[j].node == w->node)
					same[ns++] = j;
				else
					other[no++] = j;
			}
			if (!ns) {
				memcpy(same, other, sizeof(int) * no);
				ns = no;
				no = 0;
			}
			c = no ? cross_node : 0;
			lab_add_dest_list(w, &cum, same, ns, LAB_PROB_ONE - c);
			lab_add_dest_list(w, &cum, other, no, c);
		}
		for (i = na; i < r->nw; i++)
			lab_role(&r->w[i], "receiver", 0, 0, 0);
		return 0;
	}
	if (lab_word(k, "request_response")) {
		int irq = r->nw - 1;

		if (!na || nb != 1) {
			lab_error(r->id, na ? "cpus_b" : "cpus", "request_response needs thread CPUs "
				  "(cpus) and exactly one interrupt CPU (cpus_b)");
			return -EINVAL;
		}
		if (!live || live > LAB_MAX_LIVE || irq_free > LAB_PROB_ONE ||
		    irq_self_free > LAB_PROB_ONE) {
			lab_error(r->id, !live || live > LAB_MAX_LIVE ? "live" :
				  irq_free > LAB_PROB_ONE ? "irq_free" : "irq_self_free",
				  "out of range");
			return -EINVAL;
		}
		for (i = 0; i < na; i++) {
			u32 cum = 0;

			lab_role(&r->w[i], "thread", LAB_PROB_ONE / 2, live, 0);
			lab_add_dests(&r->w[i], &cum, irq, 1, irq_free);
			lab_add_dests(&r->w[i], &cum, i, 1, LAB_PROB_ONE - irq_free);
		}
		{
			u32 cum = 0;

			lab_role(&r->w[irq], "irq", LAB_PROB_ONE / 2, live, 0);
			lab_add_dests(&r->w[irq], &cum, irq, 1, irq_self_free);
			lab_add_dests(&r->w[irq], &cum, 0, na, LAB_PROB_ONE - irq_self_free);
		}
		return 0;
	}
	if (lab_word(k, "block_io")) {
		if (!na || !nb) {
			lab_error(r->id, na ? "cpus_b" : "cpus", "block_io needs submitting CPUs "
				  "(cpus) and completion CPUs (cpus_b)");
			return -EINVAL;
		}
		if (!depth || depth > LAB_MAX_LIVE) {
			lab_error(r->id, "depth", "out of range");
			return -EINVAL;
		}
		for (i = 0; i < na; i++) {
			u32 cum = 0;

			lab_role(&r->w[i], "submit", LAB_PROB_ONE, depth, 0);
			lab_add_dests(&r->w[i], &cum, na, nb, LAB_PROB_ONE);
		}
		for (i = na; i < r->nw; i++)
			lab_role(&r->w[i], "complete", 0, 0, 0);
		return 0;
	}
	lab_error(r->id, "kind", "not local, producer_consumer, request_response or block_io");
	return -EINVAL;
}

/*
 * drain=hold: the allocation caps and the free floors that keep each worker's declared
 * live set (model/workloads.py hold_levels(), the same integers): an allocator of
 * declared L (its live target so far) keeps between L - below and L + above, below =
 * above = max(1, L / 32), with bursts B below = B / 2, above = B - B / 2; its cap becomes
 * L + above.  A freer's hold is sum over allocators o of share[o][r] * (L_o - below_o),
 * share out of 65536 (the steps of o's dest_cum), rounded half up.  0, or -EINVAL after
 * an error line.
 */
static int lab_holds(struct lab_run *r)
{
	u64 acc[LAB_MAX_WORKERS] = { 0 };
	int i, k;

	for (i = 0; i < r->nw; i++) {
		struct lab_worker *w = &r->w[i];
		u32 L = w->live, below, above, prev = 0;

		if (!w->allocator)
			continue;
		if (w->burst) {
			if (w->burst > 2 * L) {
				lab_error(r->id, "burst", "more than twice live under drain=hold");
				return -EINVAL;
			}
			below = w->burst / 2;
			above = w->burst - below;
		} else {
			below = above = max(1u, L / 32);
		}
		for (k = 0; k < w->ndest; k++) {
			acc[w->dest[k]] += (u64)(w->dest_cum[k] - prev) * (L - below);
			prev = w->dest_cum[k];
		}
		w->live = L + above;
	}
	for (i = 0; i < r->nw; i++)
		r->w[i].hold = (u32)((acc[i] + LAB_PROB_ONE / 2) / LAB_PROB_ONE);
	return 0;
}

/* rings for every (sender, freer) pair in use, sized so that a push never fails */
static int lab_rings(struct lab_run *r)
{
	int i, k;

	r->nrings = r->locked ? r->nw : r->nw * r->nw;
	r->rings = vzalloc(sizeof(*r->rings) * r->nrings);
	if (!r->rings)
		return -ENOMEM;
	for (i = 0; i < r->nw; i++) {
		struct lab_worker *w = &r->w[i];

		for (k = 0; k < w->ndest; k++) {
			int d = w->dest[k];
			struct lab_ring *q = &r->rings[r->locked ? d : i * r->nw + d];

			q->cap_want += w->live;
			q->src = r->locked ? -1 : i;
			w->out_ring[k] = q;
		}
	}
	for (i = 0; i < r->nrings; i++) {
		struct lab_ring *q = &r->rings[i];
		unsigned int cap;

		spin_lock_init(&q->lock);
		if (!q->cap_want)
			continue;
		cap = roundup_pow_of_two(q->cap_want);
		q->slot = vzalloc(sizeof(void *) * cap);
		if (!q->slot)
			return -ENOMEM;
		q->mask = cap - 1;
		k = r->locked ? i : i % r->nw;
		r->w[k].in_ring[r->w[k].nin++] = q;
	}
	return 0;
}

static void lab_free_rings(struct lab_run *r)
{
	int i;

	if (!r->rings)
		return;
	for (i = 0; i < r->nrings; i++)
		vfree(r->rings[i].slot);
	vfree(r->rings);
}

/* ------------------------------------------------------------------ one run */

static void lab_report(struct lab_run *r, int status, u64 elapsed, const char *k,
		       const char *ring_kind)
{
	u64 allocs = 0, frees = 0, warm_allocs = 0, warm_frees = 0;
	u64 end_allocs = 0, end_frees = 0;
	int i;

	for (i = 0; i < r->nw; i++) {
		struct lab_worker *w = &r->w[i];

		allocs += w->allocs;
		frees += w->frees;
		warm_allocs += w->warm_allocs;
		warm_frees += w->warm_frees;
		end_allocs += w->end_allocs;
		end_frees += w->end_frees;
		pr_info(LAB_PREFIX "worker {\"run\":%u,\"w\":%d,\"cpu\":%d,\"node\":%d,"
			"\"role\":\"%s\",\"allocs\":%llu,\"frees\":%llu,\"drain_frees\":%llu,"
			"\"idle\":%llu,\"ops_ns\":%llu,\"ns\":%llu,\"alloc_ns\":%llu,"
			"\"free_ns\":%llu,\"clock_ps\":%llu,\"alloc_long\":%llu,"
			"\"alloc_long_ns\":%llu,\"free_long\":%llu,\"free_long_ns\":%llu,"
			"\"cap\":%u,\"hold\":%u}\n",
			r->id, i, w->cpu, w->node,
			w->role, (unsigned long long)w->allocs, (unsigned long long)w->frees,
			(unsigned long long)w->drain_frees, (unsigned long long)w->idle,
			(unsigned long long)w->ops_ns, (unsigned long long)w->ns,
			(unsigned long long)w->alloc_ns, (unsigned long long)w->free_ns,
			(unsigned long long)w->clock_ps, (unsigned long long)w->alloc_long,
			(unsigned long long)w->alloc_long_ns, (unsigned long long)w->free_long,
			(unsigned long long)w->free_long_ns, w->live, w->hold);
	}
	pr_info(LAB_PREFIX "done {\"run\":%u,\"status\":%d,\"kind\":\"%s\",\"cache\":\"%s\","
		"\"own_cache\":%d,\"size\":%u,\"ksize\":%u,\"ring\":\"%s\",\"workers\":%d,"
		"\"ops\":%lu,\"seed\":%lu,\"allocs\":%llu,\"frees\":%llu,\"elapsed_ns\":%llu,"
		"\"warmup\":%lu,\"warm_allocs\":%llu,\"warm_frees\":%llu,\"window\":%d,"
		"\"lockstep\":%d,\"steps\":%lu,\"drain\":\"%s\",\"end_park\":%d,"
		"\"end_allocs\":%llu,\"end_frees\":%llu,\"ended\":%d}\n",
		r->id, status, k, r->cache ? cache_name : "kmalloc", r->cache ? 1 : 0, r->size,
		r->ksize, ring_kind, r->nw, r->ops, seed, (unsigned long long)allocs,
		(unsigned long long)frees, (unsigned long long)elapsed, r->warmup,
		(unsigned long long)warm_allocs, (unsigned long long)warm_frees, r->resumed,
		r->lockstep ? 1 : 0, r->ls_gen, r->hold ? "hold" : "eager", r->end_park ? 1 : 0,
		(unsigned long long)end_allocs, (unsigned long long)end_frees, r->ended);
}

static const char *lab_kind_name(const char *k)
{
	static const char * const names[] = {
		"local", "producer_consumer", "request_response", "block_io",
	};
	int i;

	for (i = 0; i < ARRAY_SIZE(names); i++)
		if (lab_word(k, names[i]))
			return names[i];
	return "?";
}

/* the whole run under lab_mutex with the module's parameters stable */
static int lab_run_once(void)
{
	int list_a[LAB_MAX_WORKERS], list_b[LAB_MAX_WORKERS];
	struct lab_run *r;
	const char *ring_kind;
	u64 t0, elapsed = 0;
	int na, nb, i, err = 0, allocators = 0;

	r = vzalloc(sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->id = ++lab_runs;
	r->size = size;
	r->ops = ops;
	r->warmup = warmup;
	r->work_ns = work_ns;
	r->timed = time_calls;
	r->spin = idle_spin;
	r->lockstep = lockstep;
	r->end_park = end_park;
	spin_lock_init(&r->ls_lock);
	init_waitqueue_head(&r->ls_wq);
	r->long_ns = long_ns;
	init_completion(&r->go);

	na = lab_parse_cpus(cpus, list_a, LAB_MAX_WORKERS);
	nb = lab_parse_cpus(cpus_b, list_b, LAB_MAX_WORKERS);
	if (na < 0 || nb < 0 || na + nb > LAB_MAX_WORKERS || na + nb == 0) {
		lab_error(r->id, na < 0 ? "cpus" : nb < 0 ? "cpus_b" : "cpus",
			  "not a list of online CPUs (at most 64 workers, at least one)");
		err = -EINVAL;
		goto out_run;
	}
	if (size < sizeof(struct lab_obj) || size > KMALLOC_MAX_CACHE_SIZE) {
		lab_error(r->id, "size", "outside 4..KMALLOC_MAX_CACHE_SIZE");
		err = -EINVAL;
		goto out_run;
	}
	if (!ops) {
		lab_error(r->id, "ops", "must be at least 1");
		err = -EINVAL;
		goto out_run;
	}
	if (lab_word(drain, "hold")) {
		r->hold = true;
	} else if (!lab_word(drain, "eager")) {
		lab_error(r->id, "drain", "not eager or hold");
		err = -EINVAL;
		goto out_run;
	}
	if (end_park && (!lockstep || !warmup)) {
		lab_error(r->id, "end_park", "needs lockstep=1 and a warm-up");
		err = -EINVAL;
		goto out_run;
	}
	if (lab_word(ring, "lockless")) {
		ring_kind = "lockless";
	} else if (lab_word(ring, "spinlock")) {
		ring_kind = "spinlock";
		r->locked = true;
	} else {
		lab_error(r->id, "ring", "not lockless or spinlock");
		err = -EINVAL;
		goto out_run;
	}
	r->nw = na + nb;
	r->na = na;
	r->ls_n = r->nw;
	r->w = vzalloc(sizeof(*r->w) * r->nw);
	if (!r->w) {
		err = -ENOMEM;
		goto out_run;
	}
	for (i = 0; i < r->nw; i++) {
		struct lab_worker *w = &r->w[i];

		w->run = r;
		w->idx = i;
		w->cpu = i < na ? list_a[i] : list_b[i - na];
		w->node = cpu_to_node(w->cpu);
		w->rng = (u64)seed * 0x9E3779B97F4A7C15ULL + ((u64)i << 32) + i;
		atomic_set(&w->out, 0);
		init_completion(&w->done);
	}
	err = lab_tables(r, kind);
	if (!err && r->hold)
		err = lab_holds(r);
	if (err)
		goto out_workers;
	for (i = 0; i < r->nw; i++)
		r->w[i].phase_left = r->w[i].burst;

	if (own_cache) {
		slab_flags_t flags;

		if (lab_parse_flags(cache_flags, &flags)) {
			lab_error(r->id, "cache_flags", "not a list of hwcache_align, "
				  "reclaim_account, account, no_merge (no_merge from v6.5)");
			err = -EINVAL;
			goto out_workers;
		}
		if (lab_kept_cache) {
			kmem_cache_destroy(lab_kept_cache);
			lab_kept_cache = NULL;
		}
		r->cache = kmem_cache_create(cache_name, size, align, flags, NULL);
		if (!r->cache) {
			lab_error(r->id, "cache_name", "kmem_cache_create failed");
			err = -EINVAL;
			goto out_workers;
		}
	}
	err = lab_rings(r);
	if (err)
		goto out_rings;
	/* the kmalloc bucket, without allocating (every allocation counts) */
	r->ksize = r->cache ? size : kmalloc_size_roundup(size);

	for (i = 0; i < r->nw; i++) {
		struct lab_worker *w = &r->w[i];
		struct task_struct *t;

		t = kthread_create(lab_worker_fn, w, "slabtune_lab/%d", i);
		if (IS_ERR(t)) {
			err = PTR_ERR(t);
			lab_error(r->id, "cpus", "kthread_create failed");
			break;
		}
		kthread_bind(t, w->cpu);
		w->task = t;
		if (w->allocator)
			allocators++;
	}
	if (err) {
		/* workers already created run no op: they see abort, find nothing, finish */
		r->abort = err;
	}
	r->allocators = allocators;
	atomic_set(&r->allocating, allocators);
	if (err || !allocators) {
		r->warmup = 0;		/* no window to open */
		r->end_park = false;
	}
	atomic_set(&r->warm_left, allocators);
	reinit_completion(&lab_resume);
	reinit_completion(&lab_resume_end);
	atomic_set(&lab_phase, r->warmup ? LAB_WARMUP : LAB_WINDOW);
	for (i = 0; i < r->nw; i++)
		if (r->w[i].task)
			wake_up_process(r->w[i].task);
	t0 = ktime_get_ns();
	complete_all(&r->go);
	for (i = 0; i < r->nw; i++) {
		if (!r->w[i].task)
			continue;
		/* wake every 10 s so a long run under TCG does not look hung */
		while (!wait_for_completion_timeout(&r->w[i].done, 10 * HZ))
			;
	}
	elapsed = ktime_get_ns() - t0;
	atomic_set(&lab_phase, LAB_IDLE);
	for (i = 0; i < r->nw; i++)
		if (r->w[i].task)
			kthread_stop(r->w[i].task);
	if (!err && r->abort)
		err = r->abort;
	if (!err) {
		u64 allocs = 0, frees = 0;

		for (i = 0; i < r->nw; i++) {
			allocs += r->w[i].allocs;
			frees += r->w[i].frees;
			if (atomic_read(&r->w[i].out))
				err = -EFAULT;
		}
		if (allocs != frees)
			err = -EFAULT;
		if (err)
			lab_error(r->id, "run", "objects left outstanding");
	}
	lab_report(r, err, elapsed, lab_kind_name(kind), ring_kind);
out_rings:
	lab_free_rings(r);
	if (r->cache) {
		if (keep_cache && !err)
			lab_kept_cache = r->cache;
		else
			kmem_cache_destroy(r->cache);
	}
out_workers:
	vfree(r->w);
out_run:
	vfree(r);
	last_status = err;
	return err;
}

/* writing 1 to /sys/module/slabtune_lab/parameters/run runs again (sysfs holds the
 * module's parameter lock around this call, so the parameters are stable) */
static int lab_run_set(const char *val, const struct kernel_param *kp)
{
	bool go;
	int err = kstrtobool(val, &go);

	if (err)
		return err;
	if (!go || !READ_ONCE(lab_ready))
		return 0;	/* at load, autorun decides */
	mutex_lock(&lab_mutex);
	err = lab_run_once();
	mutex_unlock(&lab_mutex);
	return err;
}

static const struct kernel_param_ops lab_run_ops = {
	.set = lab_run_set,
	.get = param_get_int,
};
static int lab_run_dummy;
module_param_cb(run, &lab_run_ops, &lab_run_dummy, 0644);
MODULE_PARM_DESC(run, "write 1 to run the workload again with the current parameters");

/* /proc/slabtune_lab: the phase of the run (idle, warmup, parked, window, ended, drain) */
static ssize_t lab_proc_read(struct file *f, char __user *buf, size_t n, loff_t *pos)
{
	static const char * const names[] = { "idle\n", "warmup\n", "parked\n", "window\n",
					      "ended\n", "drain\n" };
	int ph = atomic_read(&lab_phase);
	const char *s = names[ph >= 0 && ph < ARRAY_SIZE(names) ? ph : 0];

	return simple_read_from_buffer(buf, n, pos, s, strlen(s));
}

/* writing "resume" while parked opens the window; while ended, lets the drain run */
static ssize_t lab_proc_write(struct file *f, const char __user *buf, size_t n, loff_t *pos)
{
	char word[16] = "";

	if (n >= sizeof(word) || copy_from_user(word, buf, n))
		return -EINVAL;
	if (!lab_word(word, "resume"))
		return -EINVAL;
	switch (atomic_read(&lab_phase)) {
	case LAB_PARKED:
		complete_all(&lab_resume);
		return n;
	case LAB_ENDED:
		complete_all(&lab_resume_end);
		return n;
	default:
		return -EBUSY;
	}
}

static const struct proc_ops lab_proc_ops = {
	.proc_read = lab_proc_read,
	.proc_write = lab_proc_write,
	.proc_lseek = default_llseek,
};

static int __init lab_init(void)
{
	int err = 0;

	if (!proc_create("slabtune_lab", 0600, NULL, &lab_proc_ops))
		return -ENOMEM;
	if (autorun) {
		kernel_param_lock(THIS_MODULE);
		mutex_lock(&lab_mutex);
		err = lab_run_once();
		mutex_unlock(&lab_mutex);
		kernel_param_unlock(THIS_MODULE);
	}
	WRITE_ONCE(lab_ready, true);
	if (err)
		remove_proc_entry("slabtune_lab", NULL);
	return err;
}

static void __exit lab_exit(void)
{
	remove_proc_entry("slabtune_lab", NULL);
	mutex_lock(&lab_mutex);
	if (lab_kept_cache) {
		kmem_cache_destroy(lab_kept_cache);
		lab_kept_cache = NULL;
	}
	mutex_unlock(&lab_mutex);
}

module_init(lab_init);
module_exit(lab_exit);
MODULE_LICENSE("GPL");
MODULE_AUTHOR("slabtune");
MODULE_DESCRIPTION("slabtune's slab allocator lab: the model's workloads on real caches");
