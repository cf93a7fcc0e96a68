"""Search spaces over SLUB policies: which knobs a study may turn, over which ranges, and how
each knob reaches a running kernel.

A knob is one integer the model reads.  Each is marked with its *reach*:

* ``boot``: a kernel command-line parameter (``slub_min_order``, ``slub_max_order``,
  ``slub_min_objects``; ``slab_*`` aliases from v6.8) or flag (``slub_nomerge``: 0 or 1,
  rendered bare as ``slab_nomerge`` / ``slub_nomerge``);
* ``sysfs``: a per-cache value writable at run time under ``/sys/kernel/slab/<cache>/``
  (``min_partial``, and ``cpu_partial`` in eras with per-CPU partial lists).  The min_partial
  clamp and divisor are the kernel's formula for the initial value; a policy that changes
  them is applied to existing caches by writing the per-cache results;
* ``kernel``: only a rebuilt kernel changes it (the order heuristic's coefficients, sheaf
  capacities, barn limits);
* ``slabinfo`` (SLAB profiles only): a per-cache tunable written at run time as
  ``echo "name limit batchcount shared" > /proc/slabinfo`` (slabinfo_write()).

Checked against mm/slub.c and mm/slab_common.c: ``slub_min_order=``, ``slub_max_order=``,
``slub_min_objects=`` are ``__setup`` parameters (``slab_*`` aliases from v6.8),
``slub_nomerge``/``slab_nomerge`` a ``__setup`` flag; ``min_partial`` (min_partial_store(),
any value) and ``cpu_partial`` (cpu_partial_store(), slub_set_cpu_partial(); v7.0 refuses
non-zero) are writable ``SLAB_ATTR``s; ``sheaf_capacity`` is ``SLAB_ATTR_RO`` (v6.18 on), and
MAX_FULL_SHEAVES/MAX_EMPTY_SHEAVES and calculate_order()'s ``4 * (fls(nr_cpus) + 1)`` are
compiled in.

A *policy's* reach (:func:`policy_reach`) is what deploying it takes: ``default`` (no knob
differs from the kernel's), ``boot``, ``sysfs`` (or ``slabinfo``), ``boot+sysfs`` (both, no
rebuild), or ``kernel`` as soon as one knob needs a rebuilt kernel.  A stock kernel takes
every reach but ``kernel``.  A spec searches stock knobs only unless its ``[search]`` table
says ``reach = "kernel"``; naming a kernel knob without it is a one-line error.

A SLAB profile (``slab-*``) has its own knobs (:data:`SLAB_KNOBS`): ``slab_max_order`` (its
boot parameter, v3.4 on) and the three /proc/slabinfo tunables; ``memoryless_fallback`` is
the kernel version's, not a knob.  A SLUB knob on a SLAB profile, or a SLAB one on a SLUB
profile, is a one-line error naming both.

The space is read from the ``[search]`` table of a tune spec::

    [search]
    sampler = "nsga2"          # or "tpe"
    seed = 0
    reach = "kernel"           # default "stock": boot and sysfs knobs only
    [search.knobs]
    slub_max_order = { low = 1, high = 5 }
    slub_min_objects = { choices = [0, 8, 16, 32] }
    cpu_partial_small = { low = 0, high = 240, step = 8 }
    min_partial_lo = {}        # the knob's full kernel range
    sheaf_small = { low = 0, high = 64 }   # kernel: needs reach = "kernel"

Params are stored in Optuna with plain ``IntDistribution``/``CategoricalDistribution`` under
the knob names, so a study opens in optuna-dashboard unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

import optuna

from slabtune.errors import SlabtuneError
from slabtune.model import profiles, slab

Reach = Literal["boot", "sysfs", "kernel", "slabinfo"]
REACHES: tuple[str, ...] = ("boot", "sysfs", "kernel", "slabinfo")
SAMPLERS: tuple[str, ...] = ("nsga2", "tpe")
#: ``[search] reach``: ``stock`` searches what a stock kernel takes (boot parameters, sysfs,
#: /proc/slabinfo); ``kernel`` also allows knobs that need a rebuilt kernel.
SEARCH_REACHES: tuple[str, ...] = ("stock", "kernel")
#: Policy reaches (:func:`policy_reach`), from least to most to deploy.
POLICY_REACHES: tuple[str, ...] = ("default", "boot", "sysfs", "slabinfo", "boot+sysfs",
                                   "boot+slabinfo", "kernel")


@dataclasses.dataclass(frozen=True)
class KnobDef:
    """A knob the model understands: its kernel range, reach and what it needs in a profile."""

    name: str
    reach: Reach
    low: int
    high: int
    #: Profile feature the knob needs to mean anything: None, "cpu_partial", "sheaves", "barns".
    needs: str | None
    doc: str


#: Every knob, in the order a batch is laid out.  Ranges are what the kernel accepts (boot
#: parameters: setup_slub_*(); sysfs: the store handlers) or, for kernel-only knobs, what
#: keeps the formulas meaningful.
KNOBS: dict[str, KnobDef] = {k.name: k for k in (
    KnobDef("slub_min_order", "boot", 0, profiles.MAX_PAGE_ORDER, None,
            "smallest slab order calculate_order() may pick"),
    KnobDef("slub_max_order", "boot", 0, profiles.MAX_PAGE_ORDER, None,
            "largest slab order calculate_order() tries (min(value, MAX_PAGE_ORDER) at boot)"),
    KnobDef("slub_min_objects", "boot", 0, 1024, None,
            "objects a slab should hold; 0 keeps the 4 * (fls(nr_cpus) + 1) heuristic"),
    KnobDef("slub_nomerge", "boot", 0, 1, None,
            "1: boot with slub_nomerge, so no cache is merged into another "
            "(find_mergeable(); model/merging.py)"),
    KnobDef("order_objects_mul", "kernel", 1, 32, None,
            "the 4 in min_objects = 4 * (fls(nr_cpus) + 1)"),
    KnobDef("order_objects_add", "kernel", 0, 8, None,
            "the 1 in min_objects = 4 * (fls(nr_cpus) + 1)"),
    KnobDef("min_partial_divisor", "sysfs", 1, 8, None,
            "min_partial = clamp(ilog2(size) / divisor, lo, hi), written per cache"),
    KnobDef("min_partial_lo", "sysfs", 0, 32, None, "lower clamp of min_partial"),
    KnobDef("min_partial_hi", "sysfs", 0, 64, None, "upper clamp of min_partial"),
    KnobDef("cpu_partial_page", "sysfs", 0, 1024, "cpu_partial",
            "per-CPU partial objects for objects >= PAGE_SIZE"),
    KnobDef("cpu_partial_1k", "sysfs", 0, 1024, "cpu_partial",
            "per-CPU partial objects for objects >= 1024 bytes"),
    KnobDef("cpu_partial_256", "sysfs", 0, 1024, "cpu_partial",
            "per-CPU partial objects for objects >= 256 bytes"),
    KnobDef("cpu_partial_small", "sysfs", 0, 1024, "cpu_partial",
            "per-CPU partial objects for objects < 256 bytes"),
    KnobDef("sheaf_page", "kernel", 0, 510, "sheaves",
            "base sheaf capacity for objects >= PAGE_SIZE (before the kmalloc round-up)"),
    KnobDef("sheaf_1k", "kernel", 0, 510, "sheaves", "base sheaf capacity for objects >= 1024"),
    KnobDef("sheaf_256", "kernel", 0, 510, "sheaves", "base sheaf capacity for objects >= 256"),
    KnobDef("sheaf_small", "kernel", 0, 510, "sheaves",
            "base sheaf capacity for objects < 256"),
    KnobDef("barn_max_full", "kernel", 0, 256, "barns",
            "full sheaves a barn keeps (MAX_FULL_SHEAVES, 10)"),
    KnobDef("barn_max_empty", "kernel", 0, 256, "barns",
            "empty sheaves a barn keeps (MAX_EMPTY_SHEAVES, 10)"),
)}

#: Knobs that map one-to-one onto a ProfileArrays field of the same name.
PROFILE_FIELD_KNOBS: tuple[str, ...] = (
    "min_partial_divisor", "min_partial_lo", "min_partial_hi",
    "cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small",
    "sheaf_page", "sheaf_1k", "sheaf_256", "sheaf_small",
)


#: Largest array limit do_tune_cpucache() can allocate (:data:`slabtune.model.slab.LIMIT_MAX`).
SLAB_LIMIT_MAX = slab.LIMIT_MAX
#: Search cap of the shared factor: slabinfo_write() takes any shared >= 0 and the shared
#: array (shared * batchcount pointers) is kmalloc'ed per node; 64 is eight times
#: enable_cpucache()'s 8, far past where holding objects pays.
SLAB_SHARED_MAX = 64
#: Value of a /proc/slabinfo tunable in the baseline (and when not searched): each cache
#: keeps its enable_cpucache() value (batchcount: ``(limit + 1) / 2`` of a searched limit).
SLAB_CACHE_DEFAULT = -1
SLAB_TUNABLE_NAMES: tuple[str, ...] = ("limit", "batchcount", "shared")

#: SLAB's knobs (see the module docstring).  Ranges: slab_max_order_setup() (0..10);
#: slabinfo_write() (limit >= 1, 1 <= batchcount <= limit, shared >= 0), capped as above.
#: A batchcount above the limit is refused by the kernel (-EINVAL); such a policy is a
#: failed trial.
SLAB_KNOBS: dict[str, KnobDef] = {k.name: k for k in (
    KnobDef("slab_max_order", "boot", 0, profiles.MAX_PAGE_ORDER, None,
            "largest order calculate_slab_order() goes to while a slab wastes over 1/8"),
    KnobDef("limit", "slabinfo", 1, SLAB_LIMIT_MAX, None,
            "objects each CPU's array cache holds (enable_cpucache(): 1..120 by size)"),
    KnobDef("batchcount", "slabinfo", 1, SLAB_LIMIT_MAX, None,
            "objects one refill or flush of a CPU's array moves under the list_lock"),
    KnobDef("shared", "slabinfo", 0, SLAB_SHARED_MAX, None,
            "shared array of a node: shared * batchcount objects (enable_cpucache(): 8)"),
)}


def policy_reach(knob_reaches) -> str:
    """What deploying a policy takes, from the reaches of the knobs it changes (live ones:
    :mod:`slabtune.tuner.reach`): ``kernel`` if any needs a rebuilt kernel, else the run-time
    and boot parts joined (``boot``, ``sysfs``, ``slabinfo``, ``boot+sysfs``,
    ``boot+slabinfo``), ``default`` when it changes nothing."""
    got = set(knob_reaches)
    unknown = got - set(REACHES)
    if unknown:
        raise ValueError(f"unknown knob reach {sorted(unknown)[0]!r}")
    if "kernel" in got:
        return "kernel"
    parts = [r for r in ("boot", "sysfs", "slabinfo") if r in got]
    return "+".join(parts) if parts else "default"


def is_stock(reach: str) -> bool:
    """Whether a policy of this reach runs on a stock kernel (no rebuild)."""
    return reach != "kernel"


@dataclasses.dataclass(frozen=True)
class Family:
    """Knobs shown together under the name a kernel engineer knows them by (the pareto
    table, ``pareto --json``'s ``settings``): a boot parameter, a sysfs file or, for the
    kernel-change coefficients, the kernel constant or formula they replace."""

    knobs: tuple[str, ...]
    reach: Reach
    #: Column name; ``{prefix}`` becomes the profile's boot-parameter prefix (slab_ from v6.8).
    name: str
    #: How the family's values are shown; ``{knob}`` fields are the knobs' values.
    fmt: str
    #: What the column holds and where it goes (the table's legend).
    doc: str


_CLASSES = "by object size >= 4096 / >= 1024 / >= 256 / < 256 B"

#: Families in table order.
FAMILIES: tuple[Family, ...] = (
    Family(("slub_min_order",), "boot", "{prefix}_min_order=", "{slub_min_order}",
           "boot parameter (default 0)"),
    Family(("slub_max_order",), "boot", "{prefix}_max_order=", "{slub_max_order}",
           "boot parameter (default 3, PAGE_ALLOC_COSTLY_ORDER)"),
    Family(("slub_min_objects",), "boot", "{prefix}_min_objects=", "{slub_min_objects}",
           "boot parameter (default 0: 4 * (fls(nr_cpus) + 1))"),
    Family(("slub_nomerge",), "boot", "{prefix}_nomerge", "{slub_nomerge}",
           "boot flag: no cache merged into another"),
    Family(("min_partial_divisor", "min_partial_lo", "min_partial_hi"), "sysfs",
           "min_partial", "ilog2/{min_partial_divisor} in {min_partial_lo}..{min_partial_hi}",
           "sysfs /sys/kernel/slab/<cache>/min_partial, written per cache as "
           "clamp(ilog2(size) / d, lo, hi) (set_min_partial()'s rule; default ilog2/2 in 5..10)"),
    Family(("cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small"),
           "sysfs", "cpu_partial",
           "{cpu_partial_page}/{cpu_partial_1k}/{cpu_partial_256}/{cpu_partial_small}",
           f"sysfs /sys/kernel/slab/<cache>/cpu_partial, objects {_CLASSES} "
           "(set_cpu_partial()'s classes)"),
    Family(("slab_max_order",), "boot", "slab_max_order=", "{slab_max_order}",
           "SLAB boot parameter (default 1)"),
    Family(("limit", "batchcount", "shared"), "slabinfo", "slabinfo",
           "{limit}/{batchcount}/{shared}",
           "SLAB: limit/batchcount/shared written to /proc/slabinfo for every fleet cache"),
    Family(("order_objects_mul", "order_objects_add"), "kernel", "min_objects rule",
           "{order_objects_mul}*(fls+{order_objects_add})",
           "kernel change: calculate_order()'s min_objects = mul * (fls(nr_cpus) + add) "
           "(order_objects_mul/_add; kernel 4*(fls+1))"),
    Family(("sheaf_page", "sheaf_1k", "sheaf_256", "sheaf_small"), "kernel",
           "sheaf_capacity", "{sheaf_page}/{sheaf_1k}/{sheaf_256}/{sheaf_small}",
           f"kernel change: base sheaf capacity {_CLASSES} (sheaf_*; read-only in sysfs)"),
    Family(("barn_max_full", "barn_max_empty"), "kernel", "barn", "{barn_max_full}/"
           "{barn_max_empty}", "kernel change: MAX_FULL_SHEAVES/MAX_EMPTY_SHEAVES "
           "(barn_max_full/_empty; kernel 10/10)"),
)


def family_name(fam: Family, profile) -> str:
    """A family's column name for ``profile``: boot parameters in the newest spelling it
    accepts (``slab_*`` from v6.8, else ``slub_*``)."""
    prefixes = getattr(profile, "boot_param_prefixes", ("slub",))
    return fam.name.format(prefix=prefixes[-1])


def settings(values: Mapping[str, int], changed, profile) -> dict[str, str]:
    """The families a policy changes, as ``{column name: text}`` in :data:`FAMILIES` order:
    ``values`` are every knob's effective value, ``changed`` the knobs that differ from the
    baseline.  A SLAB tunable left at its cache's own value reads ``dflt``; the nomerge flag
    reads ``on``/``off``."""
    changed = set(changed)
    out = {}
    for fam in FAMILIES:
        if not changed & set(fam.knobs):
            continue
        shown = {k: ("dflt" if k in SLAB_TUNABLE_NAMES and values.get(k) == SLAB_CACHE_DEFAULT
                     else values.get(k, "?")) for k in fam.knobs}
        text = fam.fmt.format(**shown)
        if fam.knobs == ("slub_nomerge",):
            text = "on" if int(values.get("slub_nomerge", 0)) else "off"
        out[family_name(fam, profile)] = text
    return out


#: A knob's part of its family, where the family holds several (engineer_name()).
_PART = {"min_partial_divisor": "d", "min_partial_lo": "lo", "min_partial_hi": "hi",
         "cpu_partial_page": ">= 4096 B", "cpu_partial_1k": ">= 1024 B",
         "cpu_partial_256": ">= 256 B", "cpu_partial_small": "< 256 B"}


def engineer_name(knob: str, profile) -> str:
    """One knob as a kernel engineer names it: its boot parameter or sysfs file (with its
    part of the family's rule: ``min_partial lo``, ``cpu_partial >= 1024 B``); kernel-change
    coefficients and SLAB tunables keep their own names."""
    for fam in FAMILIES:
        if knob in fam.knobs and fam.reach in ("boot", "sysfs"):
            name = family_name(fam, profile)
            return f"{name} {_PART[knob]}" if knob in _PART else name
    return knob


def legend(profile) -> dict[str, str]:
    """Every family's column name for ``profile`` and what it holds."""
    table = knobs_for(profile)
    return {family_name(f, profile): f.doc for f in FAMILIES if f.knobs[0] in table}


def knobs_for(profile) -> dict[str, KnobDef]:
    """The knob table of ``profile``'s allocator: :data:`SLAB_KNOBS` or :data:`KNOBS`."""
    return SLAB_KNOBS if profiles.is_slab(profile) else KNOBS


def baseline_values(profile: profiles.KernelProfile) -> dict[str, int]:
    """The value of every knob in an unmodified kernel of ``profile`` booted without slub_*
    parameters (the baseline every candidate is compared against).  SLAB: slab_max_order
    1 (kmem_cache_init() above 32 MiB of RAM) and every tunable at its cache's default."""
    if profiles.is_slab(profile):
        return {"slab_max_order": slab.default_max_order(),
                "limit": SLAB_CACHE_DEFAULT, "batchcount": SLAB_CACHE_DEFAULT,
                "shared": SLAB_CACHE_DEFAULT}
    cpp = profile.cpu_partial_objects or (0, 0, 0, 0)
    sh = profile.sheaf_base_capacity
    return {
        "slub_min_order": 0,
        "slub_max_order": profiles.DEFAULT_MAX_ORDER,
        "slub_min_objects": 0,
        "slub_nomerge": 0,
        "order_objects_mul": 4,
        "order_objects_add": 1,
        "min_partial_divisor": profile.min_partial_divisor,
        "min_partial_lo": profile.min_partial_lo,
        "min_partial_hi": profile.min_partial_hi,
        "cpu_partial_page": cpp[0],
        "cpu_partial_1k": cpp[1],
        "cpu_partial_256": cpp[2],
        "cpu_partial_small": cpp[3],
        "sheaf_page": sh[0],
        "sheaf_1k": sh[1],
        "sheaf_256": sh[2],
        "sheaf_small": sh[3],
        "barn_max_full": profiles.BARN_MAX_FULL,
        "barn_max_empty": profiles.BARN_MAX_EMPTY,
    }


def _profile_has(profile: profiles.KernelProfile, need: str | None) -> bool:
    if need is None:
        return True
    if need == "cpu_partial":
        return profile.has_cpu_partial
    if need == "sheaves":
        return profile.sheaves != "none"
    if need == "barns":
        return profile.barns != "none"
    raise AssertionError(need)


@dataclasses.dataclass(frozen=True)
class Knob:
    """One searched knob: its definition and the range (or choices) the study samples."""

    name: str
    reach: Reach
    low: int
    high: int
    step: int = 1
    choices: tuple[int, ...] | None = None

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The plain Optuna distribution (what optuna-dashboard shows)."""
        if self.choices is not None:
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        return optuna.distributions.IntDistribution(self.low, self.high, step=self.step)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The knobs of a study, the target profile and the sampler settings."""

    profile: profiles.KernelProfile
    knobs: tuple[Knob, ...]
    sampler: str = "nsga2"
    seed: int | None = None
    #: ``[search] reach``: ``stock`` (default) or ``kernel`` (:data:`SEARCH_REACHES`).
    reach: str = "stock"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {k.name: k.distribution() for k in self.knobs}

    def full_values(self, params: Mapping[str, int]) -> dict[str, int]:
        """Baseline values with the searched ``params`` laid over them."""
        vals = baseline_values(self.profile)
        for k, v in params.items():
            if k not in knobs_for(self.profile):
                raise SlabtuneError(f"params: unknown knob {k!r}")
            vals[k] = int(v)
        return vals

    def reach_of(self, name: str) -> str:
        return knobs_for(self.profile)[name].reach


def _int_field(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlabtuneError(f"{where}: expected an integer, got {value!r}")
    return value


def parse_knob(name: str, table, profile: profiles.KernelProfile,
               reach: str = "kernel") -> Knob:
    """Validate one ``[search.knobs]`` entry against the knob's kernel range and the profile;
    with ``reach = "stock"`` a knob that needs a rebuilt kernel is refused."""
    where = f"search.knobs.{name}"
    table_of = knobs_for(profile)
    if name not in table_of:
        foreign = slab.foreign_knob(name, profile)
        if foreign is not None:
            raise SlabtuneError(f"{where}: {foreign}")
        if profiles.is_slab(profile) and name in KNOBS:
            raise SlabtuneError(f"{where}: {name} is a SLUB knob ({KNOBS[name].doc}); "
                                f"profile {profile.name} is SLAB")
        raise SlabtuneError(f"{where}: unknown knob (known: {', '.join(table_of)})")
    if profiles.is_slab(profile) and name not in slab.SLAB_TUNABLES \
            and name not in profile.boot_params:
        raise SlabtuneError(f"{where}: profile {profile.name} has no such boot parameter "
                            "(slab_max_order= came in v3.4)")
    kd = table_of[name]
    if not _profile_has(profile, kd.needs):
        raise SlabtuneError(f"{where}: profile {profile.name} has no {kd.needs}; "
                            "the knob means nothing there")
    if kd.reach == "kernel" and reach != "kernel":
        raise SlabtuneError(f"{where}: needs a rebuilt kernel ({kd.doc}); a stock kernel "
                            "takes boot and sysfs knobs only: add reach = \"kernel\" to "
                            "[search] to search it")
    if not isinstance(table, Mapping):
        raise SlabtuneError(f"{where}: expected a table such as {{ low = 0, high = 4 }}")
    unknown = set(table) - {"low", "high", "step", "choices"}
    if unknown:
        raise SlabtuneError(f"{where}.{sorted(unknown)[0]}: unknown field "
                            "(use low, high, step or choices)")
    if "choices" in table:
        if {"low", "high", "step"} & set(table):
            raise SlabtuneError(f"{where}: give either choices or low/high/step, not both")
        ch = table["choices"]
        if not isinstance(ch, list) or not ch:
            raise SlabtuneError(f"{where}.choices: expected a non-empty list of integers")
        vals = tuple(_int_field(f"{where}.choices", c) for c in ch)
        for v in vals:
            if not kd.low <= v <= kd.high:
                raise SlabtuneError(f"{where}.choices: {v} is outside the kernel range "
                                    f"{kd.low}..{kd.high}")
        if len(set(vals)) != len(vals):
            raise SlabtuneError(f"{where}.choices: duplicate values")
        return Knob(name, kd.reach, min(vals), max(vals), 1, vals)
    low = _int_field(f"{where}.low", table.get("low", kd.low))
    high = _int_field(f"{where}.high", table.get("high", kd.high))
    step = _int_field(f"{where}.step", table.get("step", 1))
    if not kd.low <= low <= kd.high:
        raise SlabtuneError(f"{where}.low: {low} is outside the kernel range {kd.low}..{kd.high}")
    if not kd.low <= high <= kd.high:
        raise SlabtuneError(f"{where}.high: {high} is outside the kernel range {kd.low}..{kd.high}")
    if high < low:
        raise SlabtuneError(f"{where}.high: {high} is below low ({low})")
    if step < 1:
        raise SlabtuneError(f"{where}.step: must be >= 1, got {step}")
    if (high - low) % step:
        raise SlabtuneError(f"{where}.step: high - low ({high - low}) is not a multiple of {step}")
    return Knob(name, kd.reach, low, high, step)


def parse_search(table, profile: profiles.KernelProfile, stored: bool = False) -> SearchSpace:
    """Build a :class:`SearchSpace` from a spec's ``[search]`` table.  ``stored``: the spec
    of an existing study, which may predate ``reach`` (kernel knobs were then searched
    without it); its reach is ``kernel`` when it holds a kernel knob."""
    if not isinstance(table, Mapping):
        raise SlabtuneError("search: expected a [search] table")
    unknown = set(table) - {"sampler", "seed", "knobs", "reach"}
    if unknown:
        raise SlabtuneError(f"search.{sorted(unknown)[0]}: unknown field")
    sampler = table.get("sampler", "nsga2")
    if sampler not in SAMPLERS:
        raise SlabtuneError(f"search.sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    seed = table.get("seed")
    if seed is not None:
        seed = _int_field("search.seed", seed)
        if not 0 <= seed <= 2 ** 32 - 1:    # numpy's RandomState, which Optuna's samplers use
            raise SlabtuneError(f"search.seed: {seed} is outside 0..{2 ** 32 - 1}")
    knobs_t = table.get("knobs")
    if not isinstance(knobs_t, Mapping) or not knobs_t:
        raise SlabtuneError("search.knobs: expected a table with at least one knob")
    reach = table.get("reach", "stock")
    if reach not in SEARCH_REACHES:
        raise SlabtuneError(f"search.reach: {reach!r} is not one of {', '.join(SEARCH_REACHES)} "
                            "(stock: boot and sysfs knobs; kernel: also knobs that need a "
                            "rebuilt kernel)")
    knobs = tuple(parse_knob(n, t, profile, "kernel" if stored else reach)
                  for n, t in knobs_t.items())
    if stored and any(k.reach == "kernel" for k in knobs):
        reach = "kernel"
    return SearchSpace(profile=profile, knobs=knobs, sampler=sampler, seed=seed, reach=reach)


def make_sampler(space: SearchSpace) -> optuna.samplers.BaseSampler:
    """NSGA-II or multi-objective TPE.  Regression limits reach the sampler as Optuna trial
    constraints (``Trial.set_constraint``), which both samplers and ``best_trials`` honour."""
    if space.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=space.seed, multivariate=True,
                                          constant_liar=True)
    return optuna.samplers.NSGAIISampler(seed=space.seed)
