"""Check the policy model against a real kernel: predict every cache of a snapshot and compare.

For each boot of a snapshot (rows equal in release, command line and CPU/node lists) the
caches' ``slab_size`` values, the boot's topology, the slub_* parameters of its command line
and the kernel profile (given, or detected from the release) go through
:func:`slabtune.model.policy.structure` in one vectorised call; order, objs_per_slab,
min_partial, cpu_partial and sheaf_capacity are compared with what the kernel reported.

A cache's creator may ask for a sheaf capacity (``kmem_cache_args.sheaf_capacity``); the model
knows the requests of the caches :mod:`slabtune.model.caches` lists with one (maple_node and
vm_area_struct ask for 32 from v6.18 on) and passes them to the formulas, which take them as
is under opt-in sheaves (v6.18) and as max(default, request) from v7.0.

A snapshot of a guest booted with a policy (``guest boot --policy``) carries the sysfs
values the policy wrote (:data:`slabtune.kernel.snapshot.POLICY_COLUMNS`): a cache's
min_partial and cpu_partial are compared with the value written to it, not with the
model's default, and :attr:`CheckResult.policy` counts how many of those writes the kernel
shows as taken.

Caches whose values the formulas cannot know are set aside with a reason and never counted
as matched: caches with SLAB_DEBUG flags set (debugging changes the layout and disables
per-CPU partial lists), and under an opt-in sheaf profile (v6.18) any other cache with a
nonzero sheaf_capacity (its creator chose a capacity the model does not know).

A SLAB snapshot (``/proc/slabinfo`` of a CONFIG_SLAB kernel, up to v6.7) is checked against
a SLAB profile (``slab-v6.1`` etc., detected from the release) by the rules of
:mod:`slabtune.model.slab`: order (log2 of pagesperslab), objs_per_slab (objperslab) and
the tunables limit, batchcount and sharedfactor (:data:`SLAB_COMPARED_FIELDS`).  A cache
whose geometry the stride does not decide (it depends on a constructor, the object size or
SLAB_RECLAIM_ACCOUNT, which /proc/slabinfo does not show) and that the model knows nothing
about is set aside as not comparable, with the geometries it could have.
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

from slabtune.errors import SlabtuneError
from slabtune.kernel import snapshot
from slabtune.kernel.host import topology_from_lists
from slabtune.model import bootparams, caches, profiles, slab

#: Fields compared between the kernel and the model, in report order.
COMPARED_FIELDS: tuple[str, ...] = ("order", "objs_per_slab", "min_partial", "cpu_partial",
                                    "sheaf_capacity")

#: Fields compared on a SLAB snapshot (/proc/slabinfo's pagesperslab as order, objperslab,
#: and the tunables), in report order.
SLAB_COMPARED_FIELDS: tuple[str, ...] = ("order", "objs_per_slab", "limit", "batchcount",
                                         "sharedfactor")

_KMALLOC = re.compile(r"^(dma-)?kmalloc-")
_BOOTSTRAP = frozenset({"kmem_cache", "kmem_cache_node"})
#: Caches created before the secondary CPUs come up, for the v5.11 ``num_online_cpus()``
#: rule (where they see 1 CPU).  A HEURISTIC read off start_kernel() (init/main.c, v5.11)
#: and the functions it calls before rest_init(): kmem_cache_init (kmem_cache,
#: kmem_cache_node, the kmalloc caches, matched by name pattern), vmalloc_init,
#: ptlock_cache_init, sched_init, radix_tree_init, workqueue_init_early, trace_init,
#: debug_objects_mem_init, numa_policy_init, acpi_early_init, pid_idr_init, anon_vma_init,
#: cred_init, fork_init, proc_caches_init, buffer_init, key_init, security_init,
#: vfs_caches_init (dcache, inode, files, mounts, kernfs, bdev), signals_init,
#: seq_file_init, proc_root_init, taskstats_init_early, delayacct_init; later versions also
#: create maple_node (maple_tree_init) and perf_event there.  Names differ between configs
#: and versions, so a cache missing here is treated as created after smp_init().
EARLY_CACHES: frozenset[str] = frozenset({
    "kmem_cache", "kmem_cache_node", "vmap_area", "page->ptl", "task_group",
    "radix_tree_node", "pool_workqueue", "ftrace_event_field", "trace_event_file",
    "debug_objects_cache", "numa_policy", "shared_policy_node", "Acpi-Namespace",
    "Acpi-State", "Acpi-Parse", "Acpi-ParseExt", "Acpi-Operand", "pid", "anon_vma",
    "anon_vma_chain", "cred_jar", "task_struct", "sighand_cache", "signal_cache",
    "files_cache", "fs_cache", "mm_struct", "vm_area_struct", "nsproxy", "buffer_head",
    "key_jar", "lsm_file_cache", "lsm_inode_cache", "names_cache", "dentry", "inode_cache",
    "filp", "mnt_cache", "kernfs_node_cache", "kernfs_iattrs_cache", "bdev_cache",
    "sigqueue", "seq_file", "proc_inode_cache", "pde_opener", "proc_dir_entry", "taskstats",
    "task_delay_info", "maple_node", "perf_event",
})


def is_kmalloc(name: str) -> bool:
    """kmalloc-*, dma-kmalloc-* (with kmalloc-rcl-*, kmalloc-cg-*, kmalloc-rnd-*)."""
    return bool(_KMALLOC.match(name))


def is_bootstrap(name: str) -> bool:
    """kmem_cache and kmem_cache_node, which SLUB builds for itself (no sheaves in v7.0)."""
    return name in _BOOTSTRAP


def is_early(name: str) -> bool:
    """Whether a cache is created before secondary CPUs come up (see EARLY_CACHES)."""
    return is_kmalloc(name) or name in EARLY_CACHES


def explicit_sheaf(name: str) -> int:
    """The sheaf capacity a cache's creator requests in ``kmem_cache_args.sheaf_capacity``,
    where :data:`slabtune.model.caches.CACHES` records one (maple_node and vm_area_struct:
    32), else 0.  Such a cache is never merged (``__kmem_cache_create_args()`` sets
    SLAB_NO_MERGE for it, mm/slab_common.c of 7.2.13 line 347), so it keeps its own name in
    /sys/kernel/slab."""
    info = caches.CACHES.get(name)
    return info.explicit_sheaf if info is not None else 0


@dataclasses.dataclass(frozen=True)
class BootInfo:
    """One boot of a snapshot and what it was checked with."""

    index: int
    kernel_release: str
    cmdline: str
    profile: str
    #: The slab boot parameters in effect: SLUB's, or SLAB's on a SLAB snapshot.
    params: bootparams.SlubParams | slab.SlabParams
    cpus_possible: str
    cpus_present: str
    cpus_online: str
    nodes_with_memory: str
    nodes_with_cpu: str
    nr_cpu_ids: int
    present: int
    online: int
    nodes: int
    caches: int

    def params_text(self) -> str:
        """The boot parameters in effect, as the report prints them."""
        p = self.params
        if isinstance(p, slab.SlabParams):
            return (f"slab_max_order {p.max_order}, alien caches "
                    f"{'on' if p.use_alien_caches else 'off (noaliencache)'}")
        return f"slub min_order {p.min_order} max_order {p.max_order} min_objects {p.min_objects}"


@dataclasses.dataclass(frozen=True)
class Mismatch:
    boot: int
    cache: str
    field: str
    kernel: int
    model: int


@dataclasses.dataclass(frozen=True)
class NotComparable:
    boot: int
    cache: str
    reason: str


@dataclasses.dataclass(frozen=True)
class FieldCount:
    matched: int
    total: int


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """Outcome of checking a snapshot.  ``caches`` counts every row, ``comparable`` those
    the model can predict, ``matched`` the comparable ones equal in every compared field."""

    boots: tuple[BootInfo, ...]
    caches: int
    comparable: int
    matched: int
    fields: dict[str, FieldCount]
    not_comparable: tuple[NotComparable, ...]
    mismatches: tuple[Mismatch, ...]
    #: Per policy attribute (min_partial, cpu_partial): written values the kernel shows
    #: (matched) out of those written (total); empty for a snapshot without a policy.
    policy: dict[str, FieldCount] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when at least one cache was comparable and every comparable cache matched."""
        return self.comparable > 0 and self.matched == self.comparable

    def summary(self) -> str:
        return (f"matched {self.matched}/{self.caches} caches ({self.comparable} comparable, "
                f"{len(self.not_comparable)} not comparable, {len(self.boots)} boot"
                f"{'s' if len(self.boots) != 1 else ''})")

    def to_json(self) -> dict[str, Any]:
        return {
            "boots": len(self.boots),
            "caches": self.caches,
            "comparable": self.comparable,
            "matched": self.matched,
            "fields": {k: {"matched": v.matched, "total": v.total} for k, v in self.fields.items()},
            "not_comparable": [dataclasses.asdict(n) for n in self.not_comparable],
            "mismatches": [dataclasses.asdict(m) for m in self.mismatches],
            "policy": {k: {"matched": v.matched, "total": v.total}
                       for k, v in self.policy.items()},
            "boot_details": [
                {**{k: v for k, v in dataclasses.asdict(b).items() if k != "params"},
                 "params": b.params._asdict()}
                for b in self.boots
            ],
        }


@lru_cache(maxsize=1)
def _structure_fn():
    """One jitted ``structure`` shared by every boot (imports JAX only when checking)."""
    import jax

    from slabtune.model import policy

    def run(size, possible, present, online, prof, min_order, max_order, min_objects, early,
            kmalloc, bootstrap, explicit):
        return policy.structure(size, possible, present, online, prof, min_order, max_order,
                                min_objects, early, kmalloc, bootstrap, explicit)

    return jax.jit(run)


def _bucket(n: int) -> int:
    """Pad the cache axis to a power of two (>= 256) so boots share one compilation."""
    b = 256
    while b < n:
        b *= 2
    return b


def predict_boot(sizes: np.ndarray, names: list[str], topology, profile: profiles.KernelProfile,
                 params: bootparams.SlubParams) -> dict[str, np.ndarray]:
    """Model every cache of one boot in one vectorised (jitted) ``structure`` call.

    ``sizes`` are the caches' slab_size values, ``names`` classify them (early, kmalloc,
    bootstrap) and give their creators' sheaf capacity requests (:func:`explicit_sheaf`),
    ``topology`` supplies possible/present/online.  Returns field -> int array for
    :data:`COMPARED_FIELDS`.
    """
    from slabtune.model import policy

    n = len(sizes)
    width = _bucket(n)
    pad = width - n
    size = np.concatenate([np.asarray(sizes, np.int32), np.full(pad, 8, np.int32)])
    flags = [np.concatenate([np.asarray([f(x) for x in names], bool), np.zeros(pad, bool)])
             for f in (is_early, is_kmalloc, is_bootstrap)]
    explicit = np.concatenate([np.asarray([explicit_sheaf(x) for x in names], np.int32),
                               np.zeros(pad, np.int32)])
    t = topology
    out = _structure_fn()(size, np.int32(t.possible), np.int32(t.present), np.int32(t.online),
                          policy.profile_arrays(profile), np.int32(params.min_order),
                          np.int32(params.max_order), np.int32(params.min_objects), *flags,
                          explicit)
    return {f: np.asarray(getattr(out, f))[:n] for f in COMPARED_FIELDS}


def resolve_profile(profile: str | profiles.KernelProfile | profiles.SlabProfile | None
                    ) -> profiles.KernelProfile | profiles.SlabProfile | None:
    """A profile object (SLUB or SLAB) from a name (None stays None: detect per boot); an
    unknown name raises SlabtuneError naming --profile."""
    if profile is None or isinstance(profile, (profiles.KernelProfile, profiles.SlabProfile)):
        return profile
    try:
        return profiles.get_any_profile(profile)
    except profiles.UnknownProfileError as err:
        raise SlabtuneError(f"--profile: {err}") from None


def _debug_reason(row: dict[str, Any]) -> str | None:
    set_flags = [f for f in snapshot.DEBUG_FLAG_COLUMNS if (row.get(f) or 0) != 0]
    if set_flags:
        return "debug flags set (" + ", ".join(set_flags) + "): layout and partial lists differ"
    return None


class _Tally:
    """Per-field and per-cache counts of one check: every kernel value against the model's."""

    def __init__(self, fields: tuple[str, ...]):
        self.counts = {f: [0, 0] for f in fields}
        self.comparable = self.matched = 0
        self.not_comp: list[NotComparable] = []
        self.mism: list[Mismatch] = []
        self.boots: list[BootInfo] = []
        self.policy: dict[str, list[int]] = {}

    def skip(self, bi: int, cache: str, reason: str) -> None:
        self.not_comp.append(NotComparable(bi, cache, reason))

    def compare(self, bi: int, cache: str, pairs: dict[str, tuple[Any, int]]) -> None:
        """One comparable cache: ``pairs`` maps a field to (kernel value or None where the
        kernel has no such file, model value)."""
        self.comparable += 1
        ok = True
        for f, (kernel, model) in pairs.items():
            if kernel is None:
                continue
            self.counts[f][1] += 1
            if kernel == model:
                self.counts[f][0] += 1
            else:
                ok = False
                self.mism.append(Mismatch(bi, cache, f, int(kernel), int(model)))
        self.matched += ok

    def policy_value(self, attr: str, kernel, written) -> None:
        """Count one value a policy wrote to ``attr`` against what the kernel shows."""
        c = self.policy.setdefault(attr, [0, 0])
        c[0] += kernel == written
        c[1] += 1

    def result(self, caches: int) -> CheckResult:
        return CheckResult(
            boots=tuple(self.boots), caches=caches, comparable=self.comparable,
            matched=self.matched,
            fields={f: FieldCount(m, t) for f, (m, t) in self.counts.items()},
            not_comparable=tuple(self.not_comp), mismatches=tuple(self.mism),
            policy={f: FieldCount(m, t) for f, (m, t) in self.policy.items()})


def _boots(df: pl.DataFrame, source: str, read_profile):
    """Each boot of a snapshot as (index, its rows, its profile, its boot parameters, its
    topology, its BootInfo).  ``read_profile(release, cmdline)`` gives (profile, params);
    any SlabtuneError of it or of the topology names the boot."""
    for bi, boot in enumerate(snapshot.boots(df)):
        first = boot.row(0, named=True)
        release, cmdline = first["kernel_release"], first["cmdline"]
        where = f"{source}: boot {bi} ({release})"
        try:
            prof, params = read_profile(release, cmdline)
            topo, _node_ids = topology_from_lists(
                first["cpus_possible"], first["cpus_present"], first["cpus_online"],
                first["nodes_with_memory"], first["nodes_with_cpu"])
        except profiles.UnknownProfileError as err:
            raise SlabtuneError(f"{where}: {err}; pass --profile") from None
        except SlabtuneError as err:
            raise SlabtuneError(f"{where}: {err}") from None
        rows = boot.to_dicts()
        info = BootInfo(
            index=bi, kernel_release=release, cmdline=cmdline, profile=prof.name,
            params=params, cpus_possible=first["cpus_possible"],
            cpus_present=first["cpus_present"], cpus_online=first["cpus_online"],
            nodes_with_memory=first["nodes_with_memory"],
            nodes_with_cpu=first["nodes_with_cpu"], nr_cpu_ids=topo.possible,
            present=topo.present, online=topo.online, nodes=topo.nodes, caches=len(rows))
        yield bi, boot, rows, prof, params, topo, info


def check_snapshot(df: pl.DataFrame,
                   profile: str | profiles.KernelProfile | profiles.SlabProfile | None = None,
                   source: str = "snapshot") -> CheckResult:
    """Check a validated snapshot frame (see :func:`slabtune.kernel.snapshot.read_snapshot`).

    ``profile`` overrides detection from each boot's kernel_release.  A SLAB snapshot goes
    to :func:`check_slab_snapshot`.  Raises SlabtuneError for an unknown profile, one of
    the other allocator, an undetectable release, an impossible topology, or a slab boot
    parameter out of range in a boot's command line.
    """
    forced = resolve_profile(profile)
    df = snapshot.validate_snapshot(df, source)
    if snapshot.allocator(df) == "slab":
        return check_slab_snapshot(df, forced, source)
    if forced is not None and profiles.is_slab(forced):
        raise SlabtuneError(f"{source}: a SLUB snapshot (/sys/kernel/slab) cannot be checked "
                            f"against SLAB profile {forced.name}")

    def read_profile(release, cmdline):
        prof = forced if forced is not None else profiles.detect_profile(release)
        bootparams.validate_cmdline(cmdline, prof)
        return prof, bootparams.parse_cmdline(cmdline, prof)

    tally = _Tally(COMPARED_FIELDS)
    for bi, boot, rows, prof, params, topo, info in _boots(df, source, read_profile):
        names = [r["cache"] for r in rows]
        pred = predict_boot(boot["slab_size"].to_numpy(), names, topo, prof, params)
        tally.boots.append(info)
        for i, row in enumerate(rows):
            reason = _debug_reason(row)
            if (reason is None and prof.sheaves == "opt_in" and (row["sheaf_capacity"] or 0) > 0
                    and explicit_sheaf(row["cache"]) == 0):
                reason = (f"explicit sheaf capacity {row['sheaf_capacity']} set by the cache's "
                          "creator, not known to the model (opt-in sheaves)")
            pairs = {f: (row[f], int(pred[f][i])) for f in COMPARED_FIELDS}
            for col in snapshot.POLICY_COLUMNS:
                written = row.get(col)
                if written is not None:
                    field = col.removeprefix("set_")
                    tally.policy_value(field, row[field], int(written))
                    pairs[field] = (row[field], int(written))
            if reason is not None:
                tally.skip(bi, row["cache"], reason)
                continue
            tally.compare(bi, row["cache"], pairs)
    return tally.result(df.height)


def check_slab_snapshot(df: pl.DataFrame, forced: profiles.KernelProfile | profiles.SlabProfile
                        | None, source: str = "snapshot") -> CheckResult:
    """Check a validated SLAB snapshot (rows read from /proc/slabinfo) against the SLAB
    rules of :mod:`slabtune.model.slab`, boot by boot.

    The profile is ``forced`` (a SLAB profile) or detected from the release; the boot's
    ``slab_max_order=`` and ``noaliencache`` come from its command line; the tunables
    depend on num_possible_cpus(), the weight of ``cpus_possible``.  A cache is not
    comparable when it is a SLUB row, or when /proc/slabinfo's stride leaves its geometry
    open (:func:`slabtune.model.slab.layout_candidates`) and slabtune knows nothing of its
    creation (:func:`slabtune.model.slab.known_facts`).  slab_max_order defaults to 1, the
    value on any machine with more than 32 MiB (the snapshot does not record RAM; the
    guests have at least 128 MiB).
    """
    if forced is not None and not profiles.is_slab(forced):
        raise SlabtuneError(f"{source}: a SLAB snapshot (/proc/slabinfo) cannot be checked "
                            f"against SLUB profile {forced.name} (SLAB profiles: "
                            f"{', '.join(profiles.SLAB_PROFILES)})")

    def read_profile(release, cmdline):
        prof = forced if forced is not None else slab.detect_slab_profile(release)
        return prof, slab.parse_cmdline(cmdline, prof)

    tally = _Tally(SLAB_COMPARED_FIELDS)
    for bi, _boot, rows, prof, params, _topo, info in _boots(df, source, read_profile):
        nr_possible = len(snapshot.parse_cpulist(info.cpus_possible))
        tally.boots.append(info)
        for row in rows:
            name, size = row["cache"], int(row["slab_size"])
            if row.get("allocator") != "slab":
                tally.skip(bi, name, "a SLUB row in a SLAB snapshot")
                continue
            layouts = slab.layout_candidates(size, prof, params.max_order,
                                             slab.known_facts(name, prof))
            if len(layouts) > 1:
                alts = ", ".join(f"order {x.order} x {x.num}" for x in layouts)
                tally.skip(bi, name, f"stride {size} allows {alts}, by creation facts "
                           "/proc/slabinfo does not show (constructor or SLAB_TYPESAFE_BY_RCU, "
                           "object size, SLAB_RECLAIM_ACCOUNT) and the model does not know "
                           "for this cache")
                continue
            tun = slab.cpucache_tunables(size, nr_possible)
            model = {"order": layouts[0].order, "objs_per_slab": layouts[0].num,
                     "limit": tun.limit, "batchcount": tun.batchcount,
                     "sharedfactor": tun.shared}
            tally.compare(bi, name, {f: (row[f], model[f]) for f in SLAB_COMPARED_FIELDS})
    return tally.result(df.height)
