"""Event-by-event reference of the dynamics model, in plain Python (used only by tests).

Same semantics as :mod:`slabtune.model.dynamics`, written as ordinary branches over Python
ints, one allocator operation at a time.  Fed the same random words (``dynamics.draws``)
and the same :class:`~slabtune.model.dynamics.SimConfig` (one configuration, NumPy or JAX
arrays), :func:`run` returns counters equal to the JAX model's exactly.  A run of
``ops_per_step`` > 1 operations, which the JAX step computes in closed form, is played
here as that many single events in the run's fixed order (docs/MODEL.md, "Runs"), each by
the one-event rules: the equality is what checks the closed forms.
"""

from __future__ import annotations

import numpy as np

from slabtune.model.dynamics import (
    BARNS_ALL,
    BARNS_MEMORY,
    COUNTER_FIELDS,
    DEFRAG_DRAW,
    GAUGE_SHIFT,
    LAG_SUM_MAX,
    LEVELS,
    SHARE_SHIFT,
    K,
    N,
    R,
    SimConfig,
    level_bounds,
    node_list_floor,
    node_min_partial,
)
from slabtune.model.workloads import LAG_BITS, LAG_PEND_MAX, PROB_ONE


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class RefSim:
    """One configuration's allocator state and counters."""

    def __init__(self, cfg: SimConfig):
        c = {k: np.asarray(v) for k, v in cfg._asdict().items() if k != "workload"}
        wl = {k: np.asarray(v) for k, v in cfg.workload._asdict().items()}
        self.objs = int(c["objs_per_slab"])
        self.cap1 = max(self.objs - 1, 1)
        self.cap = int(c["sheaf_capacity"])
        self.cpu_slab = int(c["cpu_slab"]) > 0
        self.min_partial = int(c["min_partial"])
        # per node class, min_partial for the nodes' lists the class's list sums
        # (dynamics.node_min_partial)
        self.list_nodes = [int(x) for x in c["list_nodes"]]
        self.node_mp = [node_min_partial(self.min_partial, k) for k in self.list_nodes]
        # the partial slabs at which __slab_free() discards a slab it empties
        self.free_mp = [mp + int(c["free_discard_offset"]) for mp in self.node_mp]
        self.cpu_partial_slabs = int(c["cpu_partial_slabs"])
        self.bypass = int(c["remote_free_bypasses_sheaf"]) > 0
        self.single = int(c["slab_alloc_single"]) > 0
        # v6.18 opt-in caches: sheaves beside the CPU slab, refilled and flushed through it
        self.cs_sheaf = self.cap > 0 and self.cpu_slab
        self.pc_empty_locks = int(c["pc_empty_locks"]) > 0
        # v3.2 to v5.15: get_partial_node() stops by free objects (dynamics.take_half)
        self.take_objects = int(c["take_objects"]) > 0 and self.cpu_partial_slabs > 0
        self.take_half = max(self.cpu_partial_slabs - 1, 0) // 2
        self.max_full = int(c["barn_max_full"])
        self.max_empty = int(c["barn_max_empty"])
        self.node = [int(x) for x in c["rep_node"]]
        self.mem = [int(x) for x in c["rep_mem_node"]]
        self.mem_home = [int(x) for x in c["rep_mem_home"]]
        # slabs come from memory node classes 0 and 1: a rep's remote slabs are the other's
        self.other = [1 - m for m in self.mem]
        memless = [int(x) > 0 for x in c["rep_memoryless"]]
        self.memless = memless
        self.defrag = int(c["remote_node_defrag_ratio"])
        # the running alloc run's node list floor, whether its bulk takes use the list and
        # the slabs of it its CPU slab's takes may still take (dynamics.home_share; the
        # whole list until a run sets it)
        self.floor = 0
        self.list_ok = True
        self.share = 1 << 30
        use_sh = int(c["memoryless_cpus_use_sheaves"]) > 0
        fallback = int(c["memoryless_fallback"]) > 0
        self.local_node = [self.node[r] if (memless[r] and not use_sh) else self.mem[r]
                           for r in range(R)]
        self.alloc_local = [(not memless[r]) or fallback for r in range(R)]
        barns = int(c["barns"])
        has_mem = [int(x) > 0 for x in c["node_has_memory"]]
        barn_at = [barns == BARNS_ALL or (barns == BARNS_MEMORY and has_mem[n])
                   for n in range(N)]
        self.has_barn = [barn_at[self.node[r]] and self.cap > 0 for r in range(R)]
        self.alloc_p = [int(x) for x in wl["alloc_p"]]
        self.free_cum = [[int(x) for x in row] for row in wl["free_cum"]]
        self.live = [int(x) for x in wl["live_target"]]
        self.hold = [int(x) for x in wl["hold"]]
        self.burst = [int(x) for x in wl["burst"]]
        self.active = [int(x) > 0 for x in wl["active"]]
        self.b = int(c["ops_per_step"])
        # the per-CPU partial lists' draining window (dynamics.pc_window): the lags, the
        # objects behind a window's oldest slab per other slab, and this step's width
        self.lag_mul = [[int(x) for x in row] for row in c["lag_mul"]]
        self.lag_freers = int(c["lag_freers"])
        self.half = self.objs // 2
        self.win = 1
        self.lo = level_bounds(self.objs)
        self.top = self._level(self.objs - 1)

        self.pend = [[0] * R for _ in range(R)]
        self.pend_cs = [[0] * R for _ in range(R)]   # of pend[i][j]: in i's CPU slab
        self.cs_tracked = [0] * R                      # sum of pend_cs[i]
        self.out = [0] * R
        self.pend_tot = [0] * R
        self.cs_free = [0] * R
        self.cs_inuse = [0] * R
        self.cs_rfree = [0] * R
        self.pcs = [[0] * LEVELS for _ in range(R)]    # per-CPU partial slabs by level
        self.pcu = [[0] * LEVELS for _ in range(R)]    # their allocated objects
        # the draining window of the per-CPU partial list: its slabs and their objects
        self.pw = [0] * R
        self.pd = [0] * R
        # the per-CPU partial slabs of the other memory node class (item 5b), the same way
        self.rps = [[0] * LEVELS for _ in range(R)]
        self.rpu = [[0] * LEVELS for _ in range(R)]
        self.rpw = [0] * R
        self.rpd = [0] * R
        self.main = [0] * R
        self.spare = [0] * R
        self.phase = [0] * R
        self.phase_left = [int(x) for x in wl["phase_first"]]
        self.ns = [[0] * LEVELS for _ in range(N)]     # node partial slabs by level
        self.nu = [[0] * LEVELS for _ in range(N)]
        self.hs = [0] * N                              # the head slab a bulk take left
        self.hu = [0] * N
        self.F = [0] * N
        self.barn_full = [0] * N
        self.barn_empty = [0] * N
        self.counts = {f: [0] * R for f in COUNTER_FIELDS}
        self.lock_node = [0] * N
        self.g_rep = [[0] * R for _ in range(3)]
        self.g_node = [[0] * N for _ in range(3)]

    # ------------------------------------------------------------------ small helpers

    def _bump(self, name: str, r: int, v: int = 1):
        self.counts[name][r] += v

    def _lock(self, r: int, node: int):
        self._bump("list_lock", r)
        if node != self.node[r]:
            self._bump("list_lock_remote", r)
        self.lock_node[node] += 1

    # ------------------------------------------------------------------ fill levels
    # A partial list is a histogram of slabs by fill level (``LEVELS`` levels of allocated
    # objects, ``level_bounds``): per level its slabs ``s[k]`` and their objects ``u[k]``,
    # spread evenly (``u = q * s + r``: ``s - r`` slabs hold ``q``, ``r`` hold ``q + 1``).

    def _level(self, h: int) -> int:
        """The level of a slab with ``h`` allocated objects."""
        return sum(h >= self.lo[k] for k in range(1, LEVELS))

    def _list_free(self, s: list, u: list, k: int) -> bool:
        """One free into a slab of level ``k`` of the list (``s``, ``u``); a level whose
        slabs are gone passes the free down.  A slab drops a level when the level's
        objects fall below ``lo[k]`` per slab; True when it dropped to empty."""
        while s[k] == 0:
            k -= 1
        assert k > 0, "free into an empty list"
        u[k] -= 1
        if u[k] < self.lo[k] * s[k]:
            s[k] -= 1
            u[k] -= self.lo[k] - 1
            s[k - 1] += 1
            u[k - 1] += self.lo[k] - 1
            return k == 1
        return False

    def _fifo_free(self, n: int) -> bool:
        """One free into node ``n``'s partial list, in the list's order
        (dynamics.fifo_frees): into its head slab; without one, the least used partial
        slab becomes the head first.  True when the head slab emptied (it is then counted
        on level 0)."""
        if not self.hs[n]:
            self.hs[n], self.hu[n] = 1, self._take_least_used(self.ns[n], self.nu[n])
        self.hu[n] -= 1
        if self.hu[n] == 0:
            self.hs[n] = 0
            self.ns[n][0] += 1
            return True
        return False

    @staticmethod
    def _take_least_used(s: list, u: list) -> int:
        """Take the partial slab (level 1 or above) with the fewest allocated objects of
        a list (its lowest such level, the ``q`` slabs first); returns its objects."""
        k = next(k for k in range(1, LEVELS) if s[k] > 0)
        q = u[k] // s[k]
        s[k] -= 1
        u[k] -= q
        return q

    @staticmethod
    def _take_emptiest(s: list, u: list) -> int:
        """Take the emptiest slab of a list (its lowest level, the ``q`` slabs first);
        returns its allocated objects."""
        k = next(k for k in range(LEVELS) if s[k] > 0)
        q = u[k] // s[k]
        s[k] -= 1
        u[k] -= q
        return q

    def _node_slabs(self, n: int) -> int:
        return sum(self.ns[n]) + self.hs[n]

    def _own_slabs(self, m: int) -> int:
        """Slabs of node class ``m``'s list the running alloc run may still take: its
        node's share (dynamics.home_share) less what it took, at most the list."""
        return min(self.share, self._node_slabs(m))

    def _node_empty(self, r: int, n: int):
        """A slab of node ``n``'s partial list has just emptied (it is counted on level 0):
        __slab_free() takes the list_lock and discards it when the node keeps at least
        min_partial partial slabs (``>=`` from v4, ``>`` in v3.1, every one before:
        ``free_mp``)."""
        self._lock(r, n)
        if self._node_slabs(n) >= self.free_mp[n]:
            self.ns[n][0] -= 1
            self._bump("slab_free", r)

    def _take_node_slab(self, n: int) -> int:
        """get_partial_node() takes the list's head: the slab a bulk take left there, else
        the emptiest (the oldest on a FIFO list has had the most frees)."""
        if self.hs[n]:
            h, self.hs[n], self.hu[n] = self.hu[n], 0, 0
            return h
        return self._take_emptiest(self.ns[n], self.nu[n])

    def _pc_local(self, r: int) -> int:
        """Slabs of rep ``r``'s memory node on its per-CPU partial list, the draining
        window's included."""
        return sum(self.pcs[r]) + self.pw[r]

    def _pc_remote(self, r: int) -> int:
        """Slabs of the other memory node class on rep ``r``'s per-CPU partial list."""
        return sum(self.rps[r]) + self.rpw[r]

    def _pc_slabs(self, r: int) -> int:
        """Slabs on rep ``r``'s per-CPU partial list, whatever their node."""
        return self._pc_local(r) + self._pc_remote(r)

    def _take_pc(self, r: int) -> int:
        """___slab_alloc() takes a slab off the per-CPU partial list: an empty one first,
        then a slab of the draining window (its objects spread evenly, the least used
        first), then the emptiest; returns its allocated objects."""
        if self.pcs[r][0] == 0 and self.pw[r] > 0:
            h = self.pd[r] // self.pw[r]
            self.pd[r] -= h
            self.pw[r] -= 1
            return h
        return self._take_emptiest(self.pcs[r], self.pcu[r])

    def _add_pc(self, r: int, h: int, remote: bool = False):
        k = self._level(h)
        s, u = (self.rps[r], self.rpu[r]) if remote else (self.pcs[r], self.pcu[r])
        s[k] += 1
        u[k] += h

    # ------------------------------------------------------------------ node lists

    def _bulk_take(self, r: int, m: int, t: int) -> bool:
        """Take ``t`` objects from node ``m``: the head slab, then whole slabs emptiest
        first, then new slabs; a slab left partly used stays at the head (7.2
        alloc_from_new_slab(): ADD_TO_HEAD), a slab used up is full.  A run whose bulk
        takes may not use the list (``list_ok``) takes new slabs only.  Returns whether the
        take ended inside a slab."""
        objs = self.objs
        while t > 0:
            if not self.hs[m]:
                if self.list_ok and sum(self.ns[m]) > 0:
                    h = self._take_emptiest(self.ns[m], self.nu[m])
                else:
                    h = 0
                    self._bump("slab_alloc", r)
                self.hs[m], self.hu[m] = 1, h
            y = min(t, objs - self.hu[m])
            self.hu[m] += y
            t -= y
            if self.hu[m] == objs:
                self.hs[m], self.hu[m] = 0, 0
                self.F[m] += 1
        return bool(self.hs[m])

    def _add_node(self, n: int, h: int):
        """A partial slab with ``h`` allocated objects joins node ``n``'s levels."""
        k = self._level(h)
        self.ns[n][k] += 1
        self.nu[n][k] += h

    def _refill(self, r: int, m: int):
        """refill_sheaf() of ``cap`` objects from node ``m`` (7.2.13 refill_objects()):
        __refill_objects_node() takes the list_lock once in get_partial_node_bulk() when
        the node's partial list is not empty; a last partial slab with more free objects
        than the sheaf needs goes back under the lock (__slab_try_return_freelist()), and
        a last new slab left partly used is put on the list under it
        (alloc_from_new_slab(): ``needs_add_partial``).  Both leave a partly used slab,
        which the model keeps as the head slab (``hs``).  v6.18's opt-in caches refill
        through __kmem_cache_alloc_bulk() instead (6.18 refill_sheaf()): ``cap``
        allocations through the CPU slab, its freelist then ___slab_alloc()'s slow paths
        (:meth:`_cs_alloc`)."""
        if self.cs_sheaf:
            for _ in range(self.cap):
                self._cs_alloc(r, m, None)
            return
        locks = int((self._node_slabs(m) if self.list_ok else self.hs[m]) > 0)
        left = self._bulk_take(r, m, self.cap)
        for _ in range(locks + left):
            self._lock(r, m)

    def _bulk_free(self, r: int, m: int, k: int):
        """Free ``k`` objects (a run's flushed sheaves) into node ``m``'s slabs: split
        over the partial slabs by their objects (points at 0, k/U, 2k/U, ...: head, then
        the levels from the fullest down), the rest into full slabs (emptying all but
        the last); empty slabs beyond min_partial are discarded.  One list_lock per slab
        that changes state (7.2 __kmem_cache_free_bulk(): one __slab_free() per slab,
        which locks for a full slab made partial or a slab made empty, not for a partial
        slab that stays partial)."""
        objs = self.objs
        chg = 0
        segs = [("head", self.hu[m] if self.hs[m] else 0)] + \
               [(lv, self.nu[m][lv]) for lv in range(LEVELS - 1, 0, -1)]
        tot = sum(size for _, size in segs)
        x = min(k, tot)
        for q in range(x):
            p = q * tot // x
            acc, where = 0, None
            for seg, size in segs:
                if p < acc + size:
                    where = seg
                    break
                acc += size
            if where == "head":
                self.hu[m] -= 1
                if self.hu[m] == 0:
                    self.hs[m] = 0
                    self.ns[m][0] += 1
                    chg += 1
            else:
                chg += self._list_free(self.ns[m], self.nu[m], where)
        y = min(k - x, self.F[m] * objs)
        g = _ceil_div(y, objs)
        self.F[m] -= g
        h = g * objs - y
        if g > 0:
            self.ns[m][0] += g - 1
            self._add_node(m, h)
        if k > 0:
            drop = max(0, min(self._node_slabs(m) - self.node_mp[m], self.ns[m][0]))
            self.ns[m][0] -= drop
            self._bump("slab_free", r, drop)
        for _ in range(chg + g):
            self._lock(r, m)

    def _drain(self, r: int):
        """The whole per-CPU partial list to the node lists (6.1 __unfreeze_partials(),
        6.12 __put_partials()): each slab onto its own node's list under that node's
        list_lock, empty slabs kept up to the node's min_partial.  The kernel takes a
        node's lock again each time the node changes along the list; the model keeps no
        order between the two node classes' slabs and takes each node's lock once (as if
        the list were grouped by node)."""
        parts = [(self.mem[r], self.pcs[r], self.pcu[r], self.pd[r], self.pw[r]),
                 (self.other[r], self.rps[r], self.rpu[r], self.rpd[r], self.rpw[r])]
        for m, s, u, pd, pw in parts:
            if sum(s) + pw == 0:
                continue
            e = s[0]
            for k in range(1, LEVELS):
                self.ns[m][k] += s[k]
                self.nu[m][k] += u[k]
            for i in range(pw):           # the window, its objects spread evenly
                self._add_node(m, pd // pw + int(i < pd % pw))
            keep = max(0, min(self.node_mp[m] - self._node_slabs(m), e))
            self.ns[m][0] += keep
            self._bump("slab_free", r, e - keep)
            self._lock(r, m)
        self.pcs[r], self.pcu[r], self.pd[r], self.pw[r] = [0] * LEVELS, [0] * LEVELS, 0, 0
        self.rps[r], self.rpu[r], self.rpd[r], self.rpw[r] = [0] * LEVELS, [0] * LEVELS, 0, 0
        self._bump("cpu_partial_drain", r)

    # ------------------------------------------------------------------ operations

    def _choose(self, r: int, w0: int) -> tuple[str | None, int]:
        """The kind of rep ``r``'s run this step and its length ``n`` (at most ``b`` ops,
        the rest of a burst phase, the objects it may still allocate or has to free above
        what it holds, workloads.hold_levels)."""
        if not self.active[r]:
            return None, 0
        can_a = self.alloc_p[r] > 0 and self.out[r] < self.live[r]
        excess = self.pend_tot[r] - self.hold[r]
        can_f = excess > 0
        if self.burst[r] > 0:
            want_a = self.phase[r] == 0
        else:
            want_a = (w0 >> 16) < self.alloc_p[r]
        if can_a and (want_a or not can_f):
            op, n = "alloc", min(self.b, self.live[r] - self.out[r])
        elif can_f:
            op, n = "free", min(self.b, excess)
        else:
            return None, 0
        if self.burst[r] > 0:
            n = min(n, self.phase_left[r])
            self.phase_left[r] -= n
            if self.phase_left[r] <= 0:
                self.phase[r] = 1 - self.phase[r]
                self.phase_left[r] = self.burst[r]
        self._bump("ops", r, n)
        return op, n

    def alloc_run(self, r: int, n: int, w1: int, w2: int):
        """``n`` allocations, one at a time; the freeing rep of the i-th object is where the
        systematic point (lo16 + i * 65536) // n falls in the rep's free_cum row.  The
        run's node list floor comes from the low bits of ``w2`` (dynamics.node_list_floor);
        its bulk takes use node m's list when the list holds more as the run starts; when
        they do not, the run's takes see only the head slab they start themselves (the old
        head is set aside for the run, then stays behind a new one, dynamics._bulk_take)."""
        m = self.mem[r]
        self.floor = node_list_floor(int(self.memless[r]),
                                     int((w2 & DEFRAG_DRAW) <= self.defrag), self.node_mp[m])
        S, k = self._node_slabs(m), self.list_nodes[m]
        self.list_ok = S > self.floor
        # dynamics.home_share: the slabs of the class's list on this CPU's node's list
        q = S // k
        self.share = q + int(((w2 >> SHARE_SHIFT) % k) < S - q * k)
        aside = 0
        if not self.list_ok and self.hs[m]:
            aside, self.hs[m], self.hu[m] = self.hu[m], 0, 0
        lo16 = w1 & 0xFFFF
        for i in range(n):
            p = (lo16 + i * PROB_ONE) // n
            j = next((k for k in range(R) if p < self.free_cum[r][k]), R - 1)
            self.alloc(r, j)
        if aside:
            if self.hs[m]:
                self._add_node(m, aside)
            else:
                self.hs[m], self.hu[m] = 1, aside

    def free_run(self, r: int, n: int, w1: int, w2: int):
        """``n`` frees, one at a time, in the run's fixed order (docs/MODEL.md): which
        pending objects (systematic points over the origins, oldest first within one),
        then the sheaf frees, the frees of objects still in their origin's CPU slab, and
        per node class the frees into slabs by destination (systematic points over the
        slab sizes taken at the start of the run)."""
        T = max(self.pend_tot[r], 1)
        u = (w1 >> 1) % T
        k_of = [0] * R
        for q in range(n):
            p = (u + q * T) // n
            acc, pick = 0, R - 1
            for i in range(R):
                if p < acc + self.pend[i][r]:
                    pick = i
                    break
                acc += self.pend[i][r]
            k_of[pick] += 1
        # oldest first within an origin (dynamics.fifo_split): the objects of its earlier
        # slabs, then those of its current CPU slab
        picks = []
        for i in range(R):
            old = min(k_of[i], self.pend[i][r] - self.pend_cs[i][r])
            picks += [(i, False)] * old + [(i, True)] * (k_of[i] - old)
        # the slab sizes as the run starts, of the node classes its objects come from
        m = self.mem[r]
        nodes = {self.mem[i] for i, cs in picks if not cs} | ({m} if self.cs_sheaf else set())
        sizes = {nn: self._slab_sizes(nn) for nn in nodes}
        sheaf, in_cs, other = [], [], [0] * N
        n_self = 0
        for origin, cs in picks:
            n_o = self.mem[origin]
            # dynamics.remote_to
            remote = n_o != self.local_node[r] or self.mem_home[origin] != self.mem_home[r]
            self._bump("frees", r)
            if remote:
                self._bump("remote_free", r)
            self.pend[origin][r] -= 1
            self.out[origin] -= 1
            self.pend_tot[r] -= 1
            if cs:
                self.pend_cs[origin][r] -= 1
                self.cs_tracked[origin] -= 1
            if self.cap > 0 and not (self.bypass and remote):
                sheaf.append(origin)
            elif cs:
                in_cs.append(origin)
            else:
                other[n_o] += 1
                n_self += origin == r
        # this rep's own older objects go onto its own per-CPU partial list first, up to
        # the list's objects as the run starts (dynamics._own_first)
        own = 0
        if n_self:
            pc = ("pc", r, 0)
            own = min(n_self, dict(sizes[m])[pc])
            other[m] -= own
            sizes[m] = [(w, size - own if w == pc else size) for w, size in sizes[m]]
        self._flushed = 0
        for _ in sheaf:
            self._sheaf_free(r, m)
        # a run's flushed sheaves go back to their slabs as one bulk free (7.x); v6.18's
        # opt-in caches free each object as slab_free() would (6.18
        # __kmem_cache_free_bulk(): do_slab_free(), the CPU slab's freelist or
        # __slab_free()), with the run's other frees into node m's slabs
        if self.cs_sheaf:
            other[m] += self._flushed
        else:
            self._bulk_free(r, m, self._flushed)
        for origin in in_cs:
            self.cs_inuse[origin] -= 1
            if origin == r:               # this CPU's own CPU slab: its freelist
                self.cs_free[r] += 1
                self._bump("free_fast", r)
            else:                         # another CPU's CPU slab: into the frozen slab
                self.cs_rfree[origin] += 1
                self._bump("free_slow", r)
        dests = {}
        for nn in range(N):
            x = other[nn]
            if nn == m and own:
                dests[nn] = [("pc", r, 0)] * own
            if x == 0:
                continue
            tot = max(sum(size for _, size in sizes[nn]), 1)
            un = (w2 >> 1) % tot
            dests.setdefault(nn, [])
            for q in range(x):
                p = (un + q * tot) // x
                acc, dest = 0, sizes[nn][-1][0]
                for where, size in sizes[nn]:
                    if p < acc + size:
                        dest = where
                        break
                    acc += size
                dests[nn].append(dest)
        # the frees into slabs that are not full, every node class, then those into full
        # slabs, node class by node class (a full slab made partial can drain the per-CPU
        # list, whose slabs may be of either node class)
        for full in (False, True):
            for nn, ds in dests.items():
                for dest in ds:
                    if (dest[0] == "full") == full:
                        self._slab_free(r, nn, dest)

    def _slab_sizes(self, n: int) -> list:
        """Allocated objects on node ``n`` by the slab that holds them, in destination
        order: rep by rep its CPU slab (untracked objects) and its per-CPU partial list
        (the draining window and the levels, one segment) and its per-CPU partial slabs of
        the other memory node class (one segment); the node's head slab and partial
        slabs by level, fullest first; its full slabs."""
        out = []
        for k in range(R):
            on = self.mem[k] == n
            out.append((("cs", k, 0), (self.cs_inuse[k] - self.cs_tracked[k]) if on else 0))
            out.append((("pc", k, 0), (self.pd[k] + sum(self.pcu[k])) if on else 0))
            rem = self.other[k] == n
            out.append((("rpc", k, 0), (self.rpd[k] + sum(self.rpu[k])) if rem else 0))
        out.append((("head", None, 0), self.hu[n] if self.hs[n] else 0))
        for lv in range(LEVELS - 1, 0, -1):
            out.append((("part", None, lv), self.nu[n][lv]))
        out.append((("full", None, 0), self.F[n] * self.objs))
        return out

    def alloc(self, r: int, j: int):
        """One allocation by rep ``r`` of an object rep ``j`` will free."""
        self._bump("allocs", r)
        m = self.mem[r]
        if self.cap > 0:
            if self.main[r] > 0:
                self.main[r] -= 1
                self._bump("sheaf_alloc_hit", r)
                self._bump("alloc_fast", r)
            elif self.spare[r] == 0 and not self.has_barn[r] and self.single:
                # v7.x, no barn: __pcs_replace_empty_main() gives up, ___slab_alloc()
                # takes one object under the node's list_lock
                self._bump("alloc_slow", r)
                self._bulk_take(r, m, 1)
                self._lock(r, m)
            else:
                # __pcs_replace_empty_main(), then the object: still ALLOC_FASTPATH
                self._bump("sheaf_alloc_replace", r)
                self._bump("alloc_fast", r)
                own = self.node[r]
                if self.spare[r] > 0:
                    self.main[r], self.spare[r] = self.spare[r] - 1, 0
                elif self.has_barn[r] and self.barn_full[own] > 0:
                    self._bump("barn_get", r)
                    self.barn_full[own] -= 1
                    if self.barn_empty[own] < self.max_empty:
                        self.barn_empty[own] += 1
                    self.main[r] = self.cap - 1
                else:
                    if self.has_barn[r]:
                        self._bump("barn_get_fail", r)
                    self._bump("sheaf_refill", r)
                    self._refill(r, m)
                    self.main[r] = self.cap - 1
        elif not self.alloc_local[r]:
            self._bump("alloc_slow", r)
            self._bulk_take(r, m, 1)
            self._lock(r, m)
        else:
            self._cs_alloc(r, m, j)
        self.pend[r][j] += 1
        self.out[r] += 1
        self.pend_tot[j] += 1

    def _cs_alloc(self, r: int, m: int, j):
        """One object from rep ``r``'s CPU slab (slab_alloc() fast path, else
        ___slab_alloc()), for rep ``j`` to free, or for a v6.18 sheaf refill (``j`` None:
        the object stays untracked in the CPU slab; 6.18 __kmem_cache_alloc_bulk() counts
        ALLOC_FASTPATH per freelist object and ___slab_alloc() ALLOC_SLOWPATH, so the
        refill's objects count as fast and slow paths too)."""
        if self.cs_free[r] > 0:
            self._bump("alloc_fast", r)
        else:
            self._bump("alloc_slow", r)
            if self.cs_rfree[r] > 0:
                self.cs_free[r] = self.cs_rfree[r]
                self.cs_rfree[r] = 0
            else:
                if self.cs_inuse[r] > 0:
                    self.F[m] += 1          # the exhausted CPU slab is full
                self.pend_cs[r] = [0] * R   # old slab's objects leave the CPU slab
                self.cs_tracked[r] = 0
                if self._pc_local(r) > 0:
                    h = self._take_pc(r)
                elif self._own_slabs(m) > self.floor:
                    # get_partial_node() of its own node's share of the class's list
                    # (dynamics.home_share), for a memoryless CPU get_any_partial()'s
                    h = self._take_node_slab(m)
                    self._lock(r, m)
                    self.share -= 1
                    if self.take_objects:
                        # v3.2 to v5.15: until the slabs taken hold more than
                        # slub_cpu_partial(s) / 2 free objects, the first included
                        available = self.objs - h
                        while available <= self.take_half and self._own_slabs(m) > 0:
                            h2 = self._take_node_slab(m)
                            self._add_pc(r, h2)
                            self.share -= 1
                            available += self.objs - h2
                    elif self.cpu_partial_slabs > 0:
                        # get_partial_node() fills the (empty) per-CPU partial list
                        # until it holds more than cpu_partial_slabs / 2 slabs
                        k = min(self._own_slabs(m), self.cpu_partial_slabs // 2 + 1)
                        for _ in range(k):
                            self._add_pc(r, self._take_node_slab(m))
                        self.share -= k
                else:
                    h = 0
                    self._bump("slab_alloc", r)
                self.cs_free[r] = self.objs - h
                self.cs_inuse[r] = h
        self.cs_free[r] -= 1
        self.cs_inuse[r] += 1
        if j is not None:
            self.pend_cs[r][j] += 1
            self.cs_tracked[r] += 1

    def _sheaf_free(self, r: int, m: int):
        """free_to_pcs(): into the main sheaf, else __pcs_replace_full_main()."""
        own = self.node[r]
        if self.main[r] < self.cap:
            self.main[r] += 1
            self._bump("sheaf_free_hit", r)
            self._bump("free_fast", r)
            return
        # __pcs_replace_full_main(), then the push: still FREE_FASTPATH
        self._bump("sheaf_free_replace", r)
        self._bump("free_fast", r)
        if self.spare[r] == 0:
            self.spare[r] = self.cap
        elif self.has_barn[r] and self.barn_full[own] < self.max_full:
            self._bump("barn_put", r)
            self.barn_full[own] += 1
            if self.barn_empty[own] > 0:
                self.barn_empty[own] -= 1
        else:
            if self.has_barn[r]:
                self._bump("barn_put_fail", r)
            self._bump("sheaf_flush", r)
            self._flushed += self.cap
        self.main[r] = 1

    def _pc_free(self, r: int, k: int, remote: bool = False):
        """One free by rep ``r`` into rep ``k``'s per-CPU partial slabs.  The frees of a
        per-CPU list go to the slabs of its draining window (``pw`` slabs, ``pd``
        objects): the kernel's freers free a slab's objects one after another, so slabs
        empty on the list (6.1 __slab_free(): a frozen slab, no lock, it stays listed;
        6.12 __slab_free(): not frozen, ``!new.inuse`` takes the node's list_lock and,
        ``prior && !on_node_partial``, leaves it on the per-CPU list); freers at
        different distances behind free into ``win`` slabs at once (dynamics.pc_window).
        A free that finds fewer than ``win`` slabs in the window starts the least used
        partial slab of the list; the window's oldest slab is empty when ``pd`` falls to
        ``half`` objects for each of the others (a take or a drain sees the window's
        objects spread evenly over its slabs).  An emptied slab counts on level 0,
        where the list's drain discards it (__unfreeze_partials(), 6.1; __put_partials(),
        6.12).  ``remote``: into rep ``k``'s slabs of the other memory node class (the
        same rules, that node's lock)."""
        if remote:
            s, u, pd, pw, node = self.rps[k], self.rpu[k], self.rpd, self.rpw, self.other[k]
        else:
            s, u, pd, pw, node = self.pcs[k], self.pcu[k], self.pd, self.pw, self.mem[k]
        if pw[k] < self.win and sum(s[1:]) > 0:
            pd[k] += self._take_least_used(s, u)
            pw[k] += 1
        pd[k] -= 1
        if pw[k] > 0 and pd[k] <= self.half * (pw[k] - 1):
            pw[k] -= 1
            s[0] += 1
            if self.pc_empty_locks:
                self._lock(r, node)

    def _node_free(self, r: int, n: int, lv: int):
        """One free into node ``n``'s partial list whose object the layout found at
        level ``lv`` (-1: the head slab): in the list's order where the cache has a CPU
        slab (dynamics.fifo_frees), else into that slab (dynamics._cascade)."""
        if self.cpu_slab:
            emptied = self._fifo_free(n)
        elif lv < 0:
            self.hu[n] -= 1
            emptied = self.hu[n] == 0
            if emptied:                   # the head slab is empty: level 0
                self.hs[n] = 0
                self.ns[n][0] += 1
        else:
            emptied = self._list_free(self.ns[n], self.nu[n], lv)
        if emptied:
            self._node_empty(r, n)

    def _slab_free(self, r: int, n: int, dest):
        """One free into a slab of node ``n`` that is not its origin's CPU slab."""
        kind, k, lv = dest
        m = self.mem[r]
        if kind == "cs":                  # another CPU slab (the origin's old one)
            self.cs_inuse[k] -= 1
            if k == r:                    # a slab this CPU holds: its own freelist
                self.cs_free[r] += 1
                self._bump("free_fast", r)
                return
            self.cs_rfree[k] += 1
            self._bump("free_slow", r)
            return
        self._bump("free_slow", r)
        if kind in ("pc", "rpc"):
            self._pc_free(r, k, kind == "rpc")
            return
        if kind in ("head", "part"):
            self._node_free(r, n, -1 if kind == "head" else lv)
            return
        cpu_partial = self.cpu_partial_slabs > 0 and self.cpu_slab
        remote = n != m
        if self.F[n] <= 0:
            # the run's earlier frees have made every full slab partial: the object is in
            # one of those (top level), on this CPU's partial list or the node's
            held = (self.rpd[r] + sum(self.rpu[r])) if remote \
                else (self.pd[r] + sum(self.pcu[r]))
            if cpu_partial and held > 0:
                self._pc_free(r, r, remote)
            else:
                self._node_free(r, n, self.top)
            return
        # a full slab becomes partial: frozen onto this CPU's per-CPU partial list
        # whatever its node, no list_lock (6.1 __slab_free(): ``!prior`` with
        # kmem_cache_has_cpu_partial() sets new.frozen, then put_cpu_partial(s, slab, 1);
        # 6.12 the same without freezing)
        self.F[n] -= 1
        if cpu_partial:
            if self._pc_slabs(r) >= self.cpu_partial_slabs:
                self._drain(r)
            self._add_pc(r, self.objs - 1, remote)
            return
        self._lock(r, n)
        if self.objs == 1 and self._node_slabs(n) >= self.free_mp[n]:
            self._bump("slab_free", r)
        else:
            self.ns[n][self.top] += 1
            self.nu[n][self.top] += self.objs - 1

    # ------------------------------------------------------------------ steps

    def _window(self) -> int:
        """dynamics.pc_window: the slabs a per-CPU partial list's freers free into at
        once, from how far behind each sender its freers are as the step starts."""
        tot = 0
        for o in range(R):
            lags = [min(self.pend[o][j], LAG_PEND_MAX) * self.lag_mul[o][j]
                    for j in range(R) if self.lag_mul[o][j] > 0]
            if lags:
                tot += (max(lags) - min(lags)) >> LAG_BITS
        return 1 + min(tot, LAG_SUM_MAX) // (self.objs * max(self.lag_freers, 1))

    def step(self, w):
        self.win = self._window()
        for r in range(R):
            w0, w1, w2 = (int(x) for x in w[r])
            op, n = self._choose(r, w0)
            if op == "alloc":
                self.alloc_run(r, n, w1, w2)
            elif op == "free":
                self.free_run(r, n, w1, w2)
        self._gauge()

    def _gauge(self):
        for r in range(R):
            self.g_rep[0][r] += self.out[r]
            self.g_rep[1][r] += self._pc_slabs(r)
            self.g_rep[2][r] += self.main[r] + self.spare[r]
        for n in range(N):
            held = sum(int(self.cs_free[k] + self.cs_inuse[k] + self.cs_rfree[k] > 0)
                       + self._pc_local(k) for k in range(R) if self.mem[k] == n)
            held += sum(self._pc_remote(k) for k in range(R) if self.other[k] == n)
            self.g_node[0][n] += self._node_slabs(n) + self.F[n] + held
            self.g_node[1][n] += self.ns[n][0]
            self.g_node[2][n] += self.barn_full[n] * self.cap

    def counters(self, steps: int) -> dict:
        out = {f: np.array(v, np.int32) for f, v in self.counts.items()}
        out["list_lock_node"] = np.array(self.lock_node, np.int32)
        den = np.float32(max(steps, 1))
        scale = np.float32(1 << GAUGE_SHIFT)

        def avg(sums):
            hi, lo = np.divmod(np.array(sums, np.int64), 1 << GAUGE_SHIFT)
            return (hi.astype(np.float32) * scale + lo.astype(np.float32)) / den
        g, gn = avg(self.g_rep), avg(self.g_node)
        out.update(slabs_total=gn[0], objects_inuse=g[0], empty_slabs_kept=gn[1],
                   cpu_partial_slabs_held=g[1], sheaf_objects_held=g[2],
                   barn_objects_held=gn[2], outstanding=np.array(self.out, np.int32))
        return out


def run(draws, cfg: SimConfig) -> dict:
    """Simulate one configuration over ``draws`` (steps, R, K) uint32; counters as a dict
    of NumPy arrays with the fields of :class:`~slabtune.model.dynamics.Counters`."""
    w = np.asarray(draws, np.uint32)
    assert w.shape[1:] == (R, K), w.shape
    sim = RefSim(cfg)
    for t in range(w.shape[0]):
        sim.step(w[t])
    return sim.counters(w.shape[0])
