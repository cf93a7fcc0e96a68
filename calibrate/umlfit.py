"""Per-event cost constants from the real allocator timed natively (``slabtune calibrate fit``).

``slabtune calibrate uml`` times the real 7.2 SLUB (User Mode Linux, kernel/uml.py) and
writes one CSV row per run: ns per allocation call and per free call, and every SLUB_STATS
counter per alloc+free pair.  This module turns the one-CPU rows into a cost table:

1. The figures: for each scenario run on ONE virtual CPU, the median over its runs of the
   ns per allocation call and per free call (two figures per scenario; six scenarios
   give twelve).  One CPU, because there no cache line moves between CPUs and no lock is
   contended: what a call costs is the sum of the events it went through, each at its
   own price, which is how the cost model charges a rig (:func:`slabtune.model.cost.
   rig_cost`: no line transfers, no waits).
2. The events of a call, from the counters, priced exactly as the model prices them
   (:func:`events`): :func:`slabtune.model.cost.priced_events`, the one mapping from
   SLUB_STATS-like counters to priced events that the model's speed axis uses too
   (:func:`slabtune.model.metrics.op_rates`), on the counters of the call
   (:func:`slub_counts`), then :func:`slabtune.model.cost.one_cpu_ns`.  In short (7.2
   mm/slub.c): every call a sheaf fast path; a barn exchange (BARN_GET / BARN_PUT) the
   exchange path plus a barn lock section; a failed attempt a barn lock section and no
   exchange, then its refill or flush: the objects moved (SHEAF_REFILL / SHEAF_FLUSH),
   list_lock sections, new and freed slabs (ALLOC_SLAB / FREE_SLAB: a page allocator
   call and its zone lock share, setup per page and per object of a new slab, teardown
   per page of a freed one; the slab's order and objects read from sysfs after each run).
3. The rig: UML is the calibration rig, not the hardware the table describes.  Each lock
   section a call takes with interrupts disabled (list_lock, barn lock, zone->lock:
   :func:`slabtune.model.cost.irq_off_sections`) costs the rig :data:`RIG`'s
   ``uml_section_ns`` on top of the table's price (:func:`rig_events`).  One constant,
   fitted with the table's and reported beside it, never written into the table.
4. The fit: the constants of :data:`FIT` and :data:`RIG` (six, fewer than the twelve
   figures) by least squares on the figures' RELATIVE errors (a figure of 15 ns weighs as
   much as one of 130 ns), each constant inside its range (:data:`slabtune.model.priors.
   PRIOR`, :data:`~slabtune.model.priors.RIG_PRIOR`, :func:`box_lsq`), every other
   constant at its prior.  Deterministic: the same CSV gives the same table.
5. The check: the two-CPU rows are predicted with the fitted table and rig term, not
   fitted; their errors are printed beside the one-CPU residuals.

What UML adds: the kernel runs as host threads and a host thread may be preempted
(brackets above ``long_ns`` are dropped by kernel/uml.py).  Its interrupt masking is
software (arch/um/include/asm/irqflags.h: local_irq_save/restore call um_set_signals(),
which stores a thread-local ``signals_enabled`` flag and, on restore, runs the handlers of
signals that arrived meanwhile; arch/um/os-Linux/signal.c): no system call, a few ns by
the source.  Yet each irqsave lock section costs UML about 500 ns more than the table's hold
(:func:`section_bracket` measures it from the runs): a rig overhead whose cause in UML is
not identified, priced per section, not per lock kind.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from slabtune.errors import SlabtuneError
from slabtune.model import cost, priors
from slabtune.results.safeio import TEXT_LIMIT, read_bounded

#: The constants the fit moves, one per kind of event the one-CPU scenarios separate: the
#: sheaf fast paths (local churn), the exchange of a sheaf with the barn (bursts of 256),
#: the objects a refill or flush moves between a sheaf and its slabs (bursts of 1024), and
#: a new slab's cost per object (bursts of 1024 on slabs of order 0 to 3: fewer, larger
#: new slabs, set up for fewer objects per pair as the order grows).  The page
#: allocator's and the locks' constants stay at their priors: a lock's hold sets the
#: contention of every other table use, and UML's irqsave sections are not a server's.
FIT: tuple[str, ...] = ("alloc_fast_ns", "free_fast_ns", "sheaf_swap_ns", "sheaf_object_ns",
                        "object_setup_ns")
#: The calibration rig's own constants, fitted with :data:`FIT` and never part of a cost
#: table: ``uml_section_ns``, what UML adds to each lock section taken with interrupts
#: disabled (:func:`slabtune.model.cost.irq_off_sections`; its range in
#: :data:`slabtune.model.priors.RIG_PRIOR`).
RIG: tuple[str, ...] = ("uml_section_ns",)
#: Pages and objects of the calibration cache's slab where a CSV row does not say (rows
#: written before the ``order`` and ``objs_per_slab`` columns): the module's own 512-byte
#: cache on one CPU, order 0 with 8 objects.
SLAB_ORDER = 0
SLAB_OBJECTS = 8


class Figure(NamedTuple):
    """One measured figure: a scenario's median ns per call of one side, and the events
    per call that the cost model charges."""

    scenario: str
    cpus: int
    side: str                     # "alloc" or "free"
    runs: int
    ns: float                     # measured median ns per call
    events: dict[str, float]      # constant name -> its count per call
    rig: dict[str, float]         # rig constant (RIG) -> its count per call


class FitResult(NamedTuple):
    values: dict[str, float]      # the whole table, fitted constants included
    figures: list[Figure]         # the one-CPU figures fitted to
    checks: list[Figure]          # the multi-CPU figures predicted, not fitted
    source: str
    rig: dict[str, float]         # the rig term (RIG), fitted with the table, not in it


def _num(row: Mapping[str, str], key: str) -> float:
    v = row.get(key)
    if v in (None, ""):
        raise SlabtuneError(f"{key}: missing in a calibration row of scenario "
                            f"{row.get('scenario')!r}")
    try:
        x = float(v)
    except ValueError:
        raise SlabtuneError(f"{key}: {v!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise SlabtuneError(f"{key}: {v!r} in a calibration row of scenario "
                            f"{row.get('scenario')!r} is not a finite count or time >= 0")
    return x


#: A timed call's plausible range in ns: above 0 (UML's clock steps 256 ns, so a mean over
#: 1e5 calls is never 0) and below 1 ms (brackets over 50 us are left out of the mean).
NS_RANGE = (0.0, 1e6)


def _ns(row: Mapping[str, str], key: str) -> float:
    """A timing of a calibration row, inside :data:`NS_RANGE` (a zero, negative, infinite
    or 1e308 timing is one line naming the column and the scenario)."""
    x = _num(row, key)
    if not NS_RANGE[0] < x < NS_RANGE[1]:
        raise SlabtuneError(f"{key}: {x:g} ns in a calibration row of scenario "
                            f"{row.get('scenario')!r} is outside ({NS_RANGE[0]:g}, "
                            f"{NS_RANGE[1]:g}) ns")
    return x


def _opt(row: Mapping[str, str], key: str, default: float) -> float:
    """A column that older CSVs lack (or a run did not dump): ``default`` then."""
    v = row.get(key)
    return default if v in (None, "") else _num(row, key)


def slub_counts(row: Mapping[str, float], side: str) -> cost.SlubCounts:
    """The counters of one side's call (``row`` holds counters per alloc+free pair: each
    side makes one call per pair) as :class:`slabtune.model.cost.SlubCounts`.

    SLUB_STATS has no list_lock counter; the sections are estimated from 7.2 mm/slub.c:
    on the allocation side one per refill (BARN_GET_FAIL: get_partial_node_bulk() when
    the node has partial slabs, else alloc_from_new_slab() putting the last new slab's
    leftover on the list), on the free side one per slab a flush puts back on the list
    (FREE_ADD_PARTIAL) and one per slab it empties and discards (FREE_SLAB, in
    __slab_free()'s section)."""
    a = side == "alloc"
    zero = 0.0
    return cost.SlubCounts(
        alloc_fast=row["alloc_fastpath"] if a else zero,
        alloc_slow=row["alloc_slowpath"] if a else zero,
        free_fast=zero if a else row["free_fastpath"],
        free_slow=zero if a else row["free_slowpath"],
        remote_free=zero,
        barn_get=row["barn_get"] if a else zero,
        barn_get_fail=row["barn_get_fail"] if a else zero,
        barn_put=zero if a else row["barn_put"],
        barn_put_fail=zero if a else row["barn_put_fail"],
        sheaf_refill=row["sheaf_refill"] if a else zero,
        sheaf_flush=zero if a else row["sheaf_flush"],
        slab_alloc=row["alloc_slab"] if a else zero,
        slab_free=zero if a else row["free_slab"],
        cpu_partial_drain=zero,
        list_lock=(row["barn_get_fail"] if a
                   else row["free_add_partial"] + row["free_slab"]),
    )


#: 7.2's per-CPU page lists hold orders up to PAGE_ALLOC_COSTLY_ORDER.
PCP_MAX = cost.pcp_max_order((7, 2))


def events(row: Mapping[str, float], side: str) -> dict[str, float]:
    """Events per call of one side: for each constant the cost model prices a one-CPU
    call with (:data:`slabtune.model.cost.RIG_FREE`), its count per call.

    The model's own pricing, read off by linearity: :func:`slabtune.model.cost.one_cpu_ns`
    (what :func:`slabtune.model.metrics.compute` gives a CPU alone) of
    :func:`slabtune.model.cost.priced_events` (the one mapping from counters to priced
    events) of :func:`slub_counts`, under a table with that constant at 1 and every other
    at 0 (:func:`slabtune.model.cost.rig_cost`: one CPU moves no line and waits for no
    lock).  The slab's order and objects are ``row["order"]`` and
    ``row["objs_per_slab"]`` (sysfs, read back after each run)."""
    ev = cost.priced_events(slub_counts(row, side))
    pcp_batch = priors.PRIOR["pcp_batch"].value
    out = {}
    for k in cost.RIG_FREE:
        n = float(cost.one_cpu_ns(ev, int(row["order"]), row["objs_per_slab"], PCP_MAX,
                                  cost.rig_cost({k: 1.0}, pcp_batch)))
        if n:
            out[k] = n
    return out


def section_events(ev: cost.PricedEvents, order: int, pcp_max: int,
                   c: cost.CostParams) -> dict[str, float]:
    """Rig events of priced events: ``uml_section_ns`` once per lock section taken with
    interrupts disabled (:func:`slabtune.model.cost.irq_off_sections`; ``c`` gives
    ``pcp_batch``).  What the fit (:func:`rig_events`) and ``validate --target uml``
    (:func:`slabtune.validate.uml.predict`) both count the rig term on."""
    return {"uml_section_ns": float(cost.irq_off_sections(ev, int(order), pcp_max, c))}


def rig_events(row: Mapping[str, float], side: str) -> dict[str, float]:
    """Rig events per call of one side: :func:`section_events` of the same priced events
    as :func:`events`."""
    return section_events(cost.priced_events(slub_counts(row, side)), int(row["order"]),
                          PCP_MAX, cost.rig_cost({}, priors.PRIOR["pcp_batch"].value))


def charge(ev: Mapping[str, float], values: Mapping[str, float]) -> float:
    """ns per call: each event's count times its constant."""
    return sum(n * values[k] for k, n in ev.items())


def in_rig(table_ns: float, rig_ev: Mapping[str, float], rig: Mapping[str, float]) -> float:
    """ns in the rig (User Mode Linux) of what the table prices at ``table_ns``: that price
    plus the rig term, each rig event (:func:`section_events`) times its constant in
    ``rig`` (a constant ``rig`` lacks counts 0)."""
    return table_ns + sum(n * rig.get(k, 0.0) for k, n in rig_ev.items())


def rig_ns(f: Figure, values: Mapping[str, float], rig: Mapping[str, float]) -> float:
    """ns per call of a figure in the rig: the table's price plus the rig term."""
    return in_rig(charge(f.events, values), f.rig, rig)


#: How a cost file's header names a rig constant fitted with its table (:func:`to_toml`
#: writes it, :func:`read_rig` reads it back).
RIG_LINE = "#   {name} = {value:g} ns, what UML adds to each lock section taken with interrupts off"
_RIG_RE = re.compile(r"^#\s+(\w+) = (\S+) ns, what UML adds to each lock section")


def read_rig(text: str, source: str) -> dict[str, float]:
    """The rig constants (:data:`RIG`) a cost file's header names (:data:`RIG_LINE`, as
    ``calibrate fit`` writes them beside the table they were fitted with); empty when it
    names none.  A value that is no number or outside its :data:`slabtune.model.priors.
    RIG_PRIOR` range is one error line naming the constant and ``source``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _RIG_RE.match(line)
        if m is None or m.group(1) not in RIG:
            continue
        name, raw = m.groups()
        try:
            v = float(raw)
        except ValueError:
            v = math.nan
        p = priors.RIG_PRIOR[name]
        if not p.lo <= v <= p.hi:
            raise SlabtuneError(f"{source}: {name}: {raw!r} in the header is not a number "
                                f"in {p.lo:g}-{p.hi:g} ns")
        out[name] = v
    return out


def figures(rows: Sequence[Mapping[str, str]]) -> list[Figure]:
    """Median figures per (scenario, CPUs, side) over the successful runs of a calibration
    CSV (:func:`slabtune.kernel.uml.read_csv` rows)."""
    groups: dict[tuple[str, int], list[Mapping[str, str]]] = {}
    for r in rows:
        if r.get("ok") == "1" and r.get("ns_per_pair") not in (None, ""):
            groups.setdefault((r["scenario"], int(r["cpus"])), []).append(r)
    counters = ("alloc_fastpath", "alloc_slowpath", "free_fastpath", "free_slowpath",
                "barn_get", "barn_get_fail", "barn_put", "barn_put_fail", "sheaf_refill",
                "sheaf_flush", "alloc_slab", "free_slab", "free_add_partial")
    out = []
    for (scen, cpus), rs in sorted(groups.items()):
        med = {c: statistics.median(_num(r, f"{c}_per_pair") for r in rs) for c in counters}
        # runs written before the CSV had these columns: the 512-byte cache's default
        med["order"] = statistics.median(_opt(r, "order", SLAB_ORDER) for r in rs)
        med["objs_per_slab"] = statistics.median(_opt(r, "objs_per_slab", SLAB_OBJECTS)
                                                 for r in rs)
        for side in ("alloc", "free"):
            ns = statistics.median(_ns(r, f"{side}_ns_per_call") for r in rs)
            out.append(Figure(scen, cpus, side, len(rs), ns, events(med, side),
                              rig_events(med, side)))
    return out


def box_lsq(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Least squares ``min |a x - b|`` with ``lo <= x <= hi``, by enumerating which
    unknowns sit at a bound (fine for a handful of unknowns): for every assignment of
    each unknown to its lower bound, its upper bound or free, the free ones by
    unconstrained least squares with the others held; the best assignment whose free
    unknowns land inside their bounds.  Deterministic; ties keep the first found (fewest
    unknowns at a bound first)."""
    n = a.shape[1]
    best, best_err = np.clip(np.zeros(n), lo, hi), np.inf
    states = sorted(itertools.product((0, 1, 2), repeat=n), key=lambda st: -st.count(2))
    for st in states:
        x = np.where(np.array(st) == 0, lo, hi).astype(float)
        free = [i for i in range(n) if st[i] == 2]
        if free:
            held = [i for i in range(n) if st[i] != 2]
            rhs = b - a[:, held] @ x[held]
            x_f, *_ = np.linalg.lstsq(a[:, free], rhs, rcond=None)
            if np.any(x_f < lo[free] - 1e-12) or np.any(x_f > hi[free] + 1e-12):
                continue
            x[free] = x_f
        err = float(np.sum((a @ x - b) ** 2))
        if err < best_err - 1e-12:
            best, best_err = x, err
    return best


def fit(rows: Sequence[Mapping[str, str]], source: str = "<rows>",
        free: Sequence[str] = FIT, rig: Sequence[str] = RIG) -> FitResult:
    """Fit :data:`FIT` and the rig term :data:`RIG` jointly to the one-CPU figures; every
    other constant at its prior (``rig=()``: no rig term, the table alone)."""
    figs = figures(rows)
    one = [f for f in figs if f.cpus == 1]
    n = len(free) + len(rig)
    if len(one) <= n:
        raise SlabtuneError(f"data: {len(one)} one-CPU figures in {source}; the fit of "
                            f"{n} constants needs more (run 'slabtune calibrate "
                            "uml --cpus 1')")
    values = priors.prior_values()
    fixed = {k: v for k, v in values.items() if k not in free}
    # each row divided by its measured ns: the least squares of relative errors
    a = np.array([[f.events.get(k, 0.0) / f.ns for k in free]
                  + [f.rig.get(k, 0.0) / f.ns for k in rig] for f in one])
    b = np.array([(f.ns - charge({k: n for k, n in f.events.items() if k not in free}, fixed))
                  / f.ns for f in one])
    # each constant inside its range (model.priors.PRIOR and RIG_PRIOR, never widened to fit)
    ranges = [priors.PRIOR[k] for k in free] + [priors.RIG_PRIOR[k] for k in rig]
    x = box_lsq(a, b, np.array([p.lo for p in ranges]), np.array([p.hi for p in ranges]))
    x = [float(f"{v:.4g}") for v in x]
    values.update(zip(free, x[:len(free)]))
    return FitResult(values, one, [f for f in figs if f.cpus != 1], source,
                     dict(zip(rig, x[len(free):])))


def section_bracket(figs: Sequence[Figure], values: Mapping[str, float]
                    ) -> tuple[float, float, float]:
    """The rig's overhead per irq-off lock section measured from two runs that differ in
    little but lock sections, no fit: the free side of bursts of 1024 on slabs of order 0
    and of order 3 (the same objects flushed per call, 0.68; list_lock sections 0.15 and
    0.05 per call, as each flush empties or makes partial fewer, larger slabs).  Their
    difference in ns, less what the table charges the difference in every event but the
    sections' overhead, over the difference in irq-off sections: the estimate at the
    ``values`` given, and its low and high ends with the page allocator's constants
    (``pcp_call_ns``, ``zone_lock_hold_ns``, ``page_setup_ns``: the other events that
    differ) at their range maxima and minima."""
    by = {(f.scenario, f.side): f for f in figs if f.cpus == 1}
    hi_f, lo_f = by[("local_burst_1024", "free")], by[("local_burst_1024_order3", "free")]
    d_sec = hi_f.rig["uml_section_ns"] - lo_f.rig["uml_section_ns"]
    page = ("pcp_call_ns", "zone_lock_hold_ns", "page_setup_ns")

    def at(vals: Mapping[str, float]) -> float:
        return (hi_f.ns - lo_f.ns - charge(hi_f.events, vals) + charge(lo_f.events, vals)) \
            / d_sec

    low = at({**values, **{k: priors.PRIOR[k].hi for k in page}})
    high = at({**values, **{k: priors.PRIOR[k].lo for k in page}})
    return at(values), low, high


def report(res: FitResult) -> list[str]:
    """Lines: the fitted constants, then measured against charged ns per call for every
    figure (one-CPU fitted, multi-CPU predicted)."""
    out = [f"fitted to {len(res.figures)} one-CPU figures of {res.source}: "
           + ", ".join(f"{k} = {res.values[k]:g}{edge_note(k, res.values[k])}" for k in FIT)]
    for k, v in res.rig.items():
        est, lo, hi = section_bracket(res.figures, res.values)
        out.append(f"rig term (User Mode Linux only, not in the cost table): {k} = {v:g} ns "
                   f"per lock section taken with interrupts off{edge_note(k, v)}; measured "
                   f"from bursts of 1024 at orders 0 and 3 alone: {est:.0f} ns "
                   f"({lo:.0f}-{hi:.0f} over the page allocator's ranges)")
    for what, figs in (("fitted", res.figures), ("predicted", res.checks)):
        for f in figs:
            got = rig_ns(f, res.values, res.rig)
            out.append(f"  {what:9s} {f.scenario:18s} cpus={f.cpus} {f.side:5s} "
                       f"measured {f.ns:7.1f} ns  model {got:7.1f} ns  "
                       f"({(got - f.ns) / f.ns:+.0%}, {f.runs} runs)")
    return out


def edge_note(name: str, value: float) -> str:
    """`` (at its range minimum)`` or ``maximum`` where a fitted value sits on an edge of
    its :data:`slabtune.model.priors.PRIOR` range (the data would move it further), else
    empty."""
    p = priors.PRIOR[name] if name in priors.PRIOR else priors.RIG_PRIOR[name]
    for edge, what in ((p.lo, "minimum"), (p.hi, "maximum")):
        if abs(value - edge) <= 1e-3 * max(abs(edge), 1.0):
            return f" (at its range {what})"
    return ""


def to_toml(res: FitResult, command: str) -> str:
    """The cost file: every constant (with its prior range), ``[fitted]`` naming the
    fitted ones and the data."""
    lines = [
        "# Cost constants of the slabtune cost model (ns unless stated); every name is",
        "# documented in slabtune.model.cost.DOCS, its physical range in slabtune.model.priors.",
        f"# Made by: {command}",
        f"# Fitted: {', '.join(FIT)}, by bounded least squares on {len(res.figures)}",
        "# one-CPU figures (ns per allocation and per free call) of the real 7.2 allocator",
        f"# timed in User Mode Linux ({res.source}); every other constant is its prior.",
        "# Fitted with them, and not a constant of this table (the rig's, not the hardware's):",
        *(RIG_LINE.format(name=k, value=v) for k, v in res.rig.items()),
        "# No constant is fitted to a published figure.",
        "",
        "[cost]",
    ]
    for k in cost.FIELDS:
        p = priors.PRIOR[k]
        rng = f"range {p.lo:g}-{p.hi:g}" if p.lo < p.hi else "fixed"
        edge = edge_note(k, res.values[k]) if k in FIT else ""
        lines.append(f"{k} = {res.values[k]:.6g}  # {rng}{edge}: {p.why}")
    lines += ["", "[fitted]"]
    for k in FIT:
        lines.append(f'{k} = "one-CPU timings of the real 7.2 allocator in User Mode Linux '
                     f'({res.source})"')
    return "\n".join(lines) + "\n"


#: The calibration CSVs shipped with the package.
DATA_DIR = Path(__file__).resolve().parent / "data"


def default_data() -> list[Path]:
    """Every calibration CSV shipped with the package, by name (their runs together: a
    later file adds scenarios, such as the slab orders, to an earlier one)."""
    found = sorted(DATA_DIR.glob("uml-*.csv"))
    if not found:
        raise SlabtuneError(f"--data: no calibration CSV in {DATA_DIR}; run 'slabtune "
                            "calibrate uml' first")
    return found


def source_name(path: str | Path) -> str:
    """How a CSV is named in a cost file: relative to the repository for the shipped ones."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(DATA_DIR.parent.parent))
    except ValueError:
        return str(path)


def read_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The rows of calibration CSVs as ``slabtune calibrate uml`` writes them: ``#``
    comment lines (the header saying how it was made), then a CSV header and one row per
    run."""
    out: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise SlabtuneError(f"--data: {path} is not a file")
        text = read_bounded(p, TEXT_LIMIT, "--data").decode("utf-8", "replace")
        out += list(csv.DictReader(ln for ln in text.splitlines(keepends=True)
                                   if not ln.startswith("#")))
    return out


def sources(paths: Sequence[str | Path]) -> str:
    """The CSVs of a fit, as a cost file names them."""
    return ", ".join(source_name(p) for p in paths)
