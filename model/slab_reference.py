"""Event-by-event reference of the SLAB dynamics, in plain Python (used only by tests).

The rules of :mod:`slabtune.model.slab_dynamics`, written as ordinary branches over Python
ints, one allocator operation at a time.  Fed the same words (``slab_dynamics.draws``) and
the same :class:`~slabtune.model.slab_dynamics.SlabSimConfig` (one configuration), :func:`run`
returns counters equal to the JAX model's.  Each method names the mm/slab.c function it
restates (6.1: Debian's 6.1.192; "old": the 2.6.35-3.x mm/slab.c, which is 3.1's and, but for
numa_mem_id(), 2.6.33's).  :meth:`SlabRefSim.check` asserts the invariants after a step.
"""

from __future__ import annotations

import numpy as np

from slabtune.model.slab_dynamics import (
    _LOCKS_FALLBACK_GROW,
    _LOCKS_FALLBACK_OWN,
    _LOCKS_REFILL_GROW,
    BATCHREFILL_LIMIT,
    COUNTER_FIELDS,
    GAUGE_SHIFT,
    NODE_GAUGES,
    REP_GAUGES,
    K,
    N,
    R,
    SlabSimConfig,
    derived,
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class SlabRefSim:
    """One configuration's SLAB state and counters."""

    def __init__(self, cfg: SlabSimConfig):
        c = {k: np.asarray(v) for k, v in cfg._asdict().items() if k != "workload"}
        wl = {k: np.asarray(v) for k, v in cfg.workload._asdict().items()}
        self.num = int(c["objs_per_slab"])
        self.limit = int(c["limit"])
        self.bc = int(c["batchcount"])
        self.sh_ent = int(c["shared_entries"])
        self.alien_limit = int(c["alien_limit"])
        self.reap = int(c["reap_interval"])
        self.era = 0 if int(c["old_locks"]) else 1
        self.on_empty = bool(int(c["free_on_empty"]))
        self.free_limit = [int(x) for x in c["free_limit"]]
        self.node = [int(x) for x in c["rep_node"]]
        self.mem = [int(x) for x in c["rep_mem_node"]]
        self.home = [int(x) for x in c["rep_mem_home"]]
        dv = derived(cfg)
        self.local = [int(x) for x in dv["local"]]
        self.alloc_local = [bool(x) for x in dv["alloc_local"]]
        self.first = [bool(x) for x in dv["first"]]
        self.alloc_p = [int(x) for x in wl["alloc_p"]]
        self.free_cum = [[int(x) for x in row] for row in wl["free_cum"]]
        self.live = [int(x) for x in wl["live_target"]]
        self.hold = [int(x) for x in wl["hold"]]
        self.burst = [int(x) for x in wl["burst"]]
        self.active = [int(x) > 0 for x in wl["active"]]

        self.pend = [[0] * R for _ in range(R)]
        self.out = [0] * R
        self.pend_tot = [0] * R
        self.phase = [0] * R
        self.phase_left = [int(x) for x in wl["phase_first"]]
        self.avail = [0] * R
        self.touched = [0] * R
        self.shared = [0] * N
        self.sh_touched = [0] * N
        self.free = [0] * N
        self.slabs = [0] * N
        self.free_touched = [0] * N
        self.alien = [[0] * N for _ in range(N)]
        self.counts = {f: [0] * R for f in COUNTER_FIELDS}
        self.lock_node = [0] * N
        self.g_rep = [[0] * R for _ in REP_GAUGES]
        self.g_node = [[0] * N for _ in NODE_GAUGES]

    # ------------------------------------------------------------------ small helpers

    def _bump(self, name: str, r: int, v: int = 1):
        self.counts[name][r] += v

    def _lock(self, r: int, n: int, c: int = 1):
        """``c`` acquisitions of node ``n``'s list_lock by rep ``r``."""
        self._bump("list_lock", r, c)
        if n != self.node[r]:
            self._bump("list_lock_remote", r, c)
        self.lock_node[n] += c

    def _free_block(self, r: int, n: int, k: int):
        """free_block(): ``k`` objects back to node ``n``'s slabs, one at a time.  Old:
        a slab that empties is destroyed if the node's free objects then exceed free_limit;
        6.1: after the batch, free slabs are destroyed while they do.  Lists are packed: a
        slab empties when the free count reaches a multiple of num."""
        num = self.num
        lim = self.free_limit[n]
        for _ in range(k):
            self.free[n] += 1
            if self.on_empty and self.free[n] % num == 0 and self.free[n] > lim:
                self._destroy(r, n)
        if not self.on_empty:
            while self.free[n] > lim and self.free[n] // num > 0:
                self._destroy(r, n)

    def _destroy(self, r: int, n: int):
        self.free[n] -= self.num
        self.slabs[n] -= 1
        self._bump("slab_free", r)

    def _drain_alien(self, r: int, src: int, dst: int):
        """__drain_alien_cache(): node ``src``'s alien array for ``dst`` into ``dst``,
        under its list_lock: its shared array first (transfer_objects(), at most the alien
        array's limit), the rest by free_block()."""
        a = self.alien[src][dst]
        if a == 0:
            return False
        self._lock(r, dst)
        x = min(a, self.alien_limit, self.sh_ent - self.shared[dst])
        self.shared[dst] += x
        self._free_block(r, dst, a - x)
        self.alien[src][dst] = 0
        self._bump("objects_moved", r, a)
        return True

    # ------------------------------------------------------------------ one op

    def _choose(self, r: int, w0: int):
        """The workload's choice (as the SLUB model's): allocate if it can and wants to,
        else free if it can (more pending than it holds, workloads.hold_levels); bursts
        alternate."""
        can_a = self.active[r] and self.alloc_p[r] > 0 and self.out[r] < self.live[r]
        can_f = self.active[r] and self.pend_tot[r] > self.hold[r]
        bursty = self.burst[r] > 0
        want_a = self.phase[r] == 0 if bursty else (w0 >> 16) < self.alloc_p[r]
        do_a = can_a and (want_a or not can_f)
        do_f = can_f and not do_a
        n = 1 if (do_a or do_f) else 0
        if bursty:
            n = min(n, self.phase_left[r])
            left = self.phase_left[r] - n
            if n > 0 and left <= 0:
                self.phase[r] = 1 - self.phase[r]
                self.phase_left[r] = self.burst[r]
            else:
                self.phase_left[r] = left
        self._bump("ops", r, n)
        return do_a and n > 0, do_f and n > 0

    def _alloc(self, r: int, w1: int):
        """____cache_alloc() and, on a miss, cache_alloc_refill(); without numa_mem_id() on
        a memoryless node ____cache_alloc_node() and fallback_alloc()."""
        self._bump("allocs", r)
        u = w1 & 0xFFFF
        j = sum(1 for x in self.free_cum[r] if x <= u)
        self.pend[r][j] += 1
        self.pend_tot[j] += 1
        self.out[r] += 1
        L, M, num = self.local[r], self.mem[r], self.num
        if not self.alloc_local[r]:
            self._bump("alloc_slow", r)
            self._bump("alloc_fallback", r)
            self._lock(r, L, _LOCKS_FALLBACK_OWN[self.era])
            if self.free[M] > 0:
                self._lock(r, M)
                if self.free[M] % num == 0:
                    self.free_touched[M] = 1
                self.free[M] -= 1
            else:
                self._bump("slab_alloc", r)
                self.slabs[M] += 1
                self.free[M] += num - 1
                self.free_touched[M] = 1
                self._lock(r, M, _LOCKS_FALLBACK_GROW[self.era])
            self._bump("objects_moved", r)
            return
        if self.avail[r] > 0:
            self.avail[r] -= 1
            self.touched[r] = 1
            self._bump("alloc_fast", r)
            return
        self._bump("alloc_slow", r)
        bc = self.bc if (self.touched[r] or self.bc <= BATCHREFILL_LIMIT) else BATCHREFILL_LIMIT
        if self.shared[L] > 0:
            self._lock(r, L)
            t = min(bc, self.shared[L], self.limit)
            self.shared[L] -= t
            self.sh_touched[L] = 1
            self._bump("refill_shared", r)
        elif self.free[L] > 0:
            self._lock(r, L)
            t = min(bc, self.free[L])
            if t > self.free[L] % num:
                self.free_touched[L] = 1
            self.free[L] -= t
            self._bump("refill_slabs", r)
        else:
            t = min(bc, num)
            self._bump("slab_alloc", r)
            self._bump("refill_grow", r)
            self.slabs[L] += 1
            self.free[L] += num - t
            self._lock(r, L, _LOCKS_REFILL_GROW[self.era])
            if self.era == 0:
                self.free_touched[L] = 1
        self._bump("objects_moved", r, t)
        self.avail[r] = t - 1
        self.touched[r] = 1

    def _free(self, r: int, w1: int):
        """___cache_free(): cache_free_alien() for another node's object, else the array,
        flushed by cache_flusharray() when full."""
        self._bump("frees", r)
        u = (w1 >> 1) % self.pend_tot[r]
        acc = 0
        for i in range(R):
            acc += self.pend[i][r]
            if acc > u:
                break
        self.pend[i][r] -= 1
        self.pend_tot[r] -= 1
        self.out[i] -= 1
        n, L = self.mem[i], self.local[r]
        # dynamics.remote_to: another node of L's class waits in alien[L][L]
        if n != L or self.home[i] != self.home[r]:
            self._bump("remote_free", r)
            self._bump("free_slow", r)
            if self.alien_limit > 0:
                self._bump("alien_lock", r)
                if self.alien[L][n] >= self.alien_limit:
                    self._bump("alien_flush", r)
                    self._drain_alien(r, L, n)
                self.alien[L][n] += 1
            else:
                self._lock(r, n)
                self._free_block(r, n, 1)
                self._bump("objects_moved", r)
            return
        if self.avail[r] < self.limit:
            self.avail[r] += 1
            self._bump("free_fast", r)
            return
        self._bump("free_slow", r)
        self._lock(r, L)
        room = self.sh_ent - self.shared[L]
        if room > 0:
            k = min(self.bc, room)
            self.shared[L] += k
            self._bump("flush_shared", r)
        else:
            k = self.bc
            self._free_block(r, L, k)
            self._bump("flush_slabs", r)
        self._bump("objects_moved", r, k)
        self.avail[r] += 1 - k

    # ------------------------------------------------------------------ cache_reap()

    def _drain_array(self, r: int, n: int, avail: int, limit: int) -> int:
        """drain_array_locked() without free_all: (limit + 4) / 5 objects, or half (rounded
        up) of fewer; under node ``n``'s list_lock."""
        self._lock(r, n)
        tf = (limit + 4) // 5
        if tf > avail:
            tf = (avail + 1) // 2
        self._free_block(r, n, tf)
        self._bump("objects_moved", r, tf)
        return tf

    def _reap(self, r: int, node_round: bool):
        """cache_reap() on rep ``r``'s CPU: reap_alien() (every alien array of its local
        node), drain_array() of its array, and on node rounds, by the node's first rep,
        drain_array() of the shared array and drain_freelist()."""
        L = self.local[r]
        if self.alien_limit > 0:
            for n in range(N):
                if self._drain_alien(r, L, n):
                    self._bump("alien_lock", r)
                    self._bump("reap_alien", r)
        if self.avail[r] > 0:
            if self.touched[r]:
                self.touched[r] = 0
            else:
                self.avail[r] -= self._drain_array(r, L, self.avail[r], self.limit)
                self._bump("reap_drain", r)
        if not (node_round and self.first[r]):
            return
        if self.shared[L] > 0:
            if self.sh_touched[L]:
                self.sh_touched[L] = 0
            else:
                self.shared[L] -= self._drain_array(r, L, self.shared[L], self.sh_ent)
                self._bump("reap_shared", r)
        if self.free_touched[L]:
            self.free_touched[L] = 0
            return
        tofree = _ceil_div(self.free_limit[L], 5 * self.num)
        nf = 0
        while nf < tofree and self.free[L] // self.num > 0:
            self._lock(r, L)
            self._destroy(r, L)
            self._bump("reap_slab_free", r)
            nf += 1

    # ------------------------------------------------------------------ step

    def step(self, t: int, w):
        for r in range(R):
            do_a, do_f = self._choose(r, int(w[r][0]))
            if do_a:
                self._alloc(r, int(w[r][1]))
            elif do_f:
                self._free(r, int(w[r][1]))
        if self.reap > 0 and (t + 1) % self.reap == 0:
            node_round = ((t + 1) // self.reap) % 2 == 0
            for r in range(R):
                if self.active[r]:
                    self._reap(r, node_round)
        for k, v in enumerate((self.out, self.avail)):
            for r in range(R):
                self.g_rep[k][r] += v[r]
        alien = [sum(row) for row in self.alien]
        empty = [f // self.num for f in self.free]
        for k, v in enumerate((self.slabs, empty, self.shared, alien)):
            for n in range(N):
                self.g_node[k][n] += v[n]

    def check(self):
        """Invariants: every node's slab objects not free on its lists are in use, in an
        array, in its shared array or in an alien array; nothing is negative; arrays stay
        within their limits."""
        for n in range(N):
            held = (sum(self.out[i] for i in range(R) if self.mem[i] == n)
                    + sum(self.avail[r] for r in range(R) if self.local[r] == n)
                    + self.shared[n] + sum(self.alien[a][n] for a in range(N)))
            assert self.slabs[n] * self.num - self.free[n] == held, (n, self.slabs, self.free)
            assert 0 <= self.free[n] <= self.slabs[n] * self.num
            assert 0 <= self.shared[n] <= self.sh_ent
            assert all(0 <= self.alien[a][n] <= self.alien_limit for a in range(N))
        assert all(0 <= a <= self.limit for a in self.avail)
        assert all(self.avail[r] == 0 for r in range(R) if not self.alloc_local[r])
        assert self.pend_tot == [sum(self.pend[i][j] for i in range(R)) for j in range(R)]

    def counters(self, steps: int) -> dict:
        out = {f: np.array(self.counts[f], np.int32) for f in COUNTER_FIELDS}
        out["list_lock_node"] = np.array(self.lock_node, np.int32)
        den = float(max(steps, 1))

        def avg(tot):
            # the JAX model keeps the sum as (sum >> 20, sum mod 2**20), both as float32
            hi, lo = tot >> GAUGE_SHIFT, tot & ((1 << GAUGE_SHIFT) - 1)
            return np.float32((np.float32(hi) * np.float32(1 << GAUGE_SHIFT)
                               + np.float32(lo)) / np.float32(den))

        for k, name in enumerate(REP_GAUGES):
            out[name] = np.array([avg(x) for x in self.g_rep[k]], np.float32)
        for k, name in enumerate(NODE_GAUGES):
            out[name] = np.array([avg(x) for x in self.g_node[k]], np.float32)
        out["outstanding"] = np.array(self.out, np.int32)
        return out


def run(words, cfg: SlabSimConfig, check: bool = False) -> dict:
    """Simulate one configuration over ``words`` (steps, R, K) uint32; counters as a dict
    of NumPy arrays with the fields of :class:`~slabtune.model.slab_dynamics.SlabCounters`.
    ``check``: assert :meth:`SlabRefSim.check` after every step."""
    w = np.asarray(words, np.uint32)
    assert w.shape[1:] == (R, K), w.shape
    sim = SlabRefSim(cfg)
    for t in range(w.shape[0]):
        sim.step(t, w[t])
        if check:
            sim.check()
    return sim.counters(w.shape[0])
