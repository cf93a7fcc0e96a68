"""One simulation configuration from a TOML file: parsing and strict validation.

The file has five tables::

    [topology]  cpus, nodes, memoryless_nodes = [node ids], node_cpus = [per node] (optional),
                possible, online (optional; default: every present CPU), distances = the
                SLIT, one row per node (optional; default 10 local, 20 remote)
    [cache]     name = "kmalloc-512" | "maple_node" | ...   or   size = <stride in bytes>
    [policy]    profile = "v7.0"  (or a SLAB profile: "slab-v2.6.33", "slab-v3.1", "slab-v6.1")
    [policy.params]  boot parameters (slub_min_order, slub_max_order, slub_min_objects and
                the slab_* spellings the profile accepts) and knobs (SIM_KNOBS below);
                a SLAB profile takes slab_max_order (v3.4 on), the /proc/slabinfo
                tunables limit, batchcount, shared, and memoryless_fallback (the
                numa_mem_id() switch), and refuses SLUB's knobs
    [workload]  kind = "local" | "producer_consumer" | "request_response" | "block_io",
                other_ns (the workload's own work per allocator op), and the parameters
                of that kind's constructor in slabtune.model.workloads
    [run]       steps, seed, ops_per_step (the dynamics run length b, default 1: one op
                per rep per step; larger b is faster and less faithful, docs/MODEL.md)

Every unknown key is an error naming the key (``workload.burts: unknown key ...``).  This
module reads files (config and cost constants); the model it feeds never does.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import tomllib
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, caches, cost, profiles, slab
from slabtune.model import topology as topologies
from slabtune.model.constants import MAX_OPS_PER_STEP
from slabtune.sweeps.spec import read_text_file

WORKLOAD_KINDS: tuple[str, ...] = ("local", "producer_consumer", "request_response", "block_io")

#: Knobs of [policy.params] beyond boot parameters: name -> (type, doc).
SIM_KNOBS: dict[str, tuple[type, str]] = {
    "memoryless_fallback": (bool, "CPUs on memoryless nodes allocate through their per-CPU "
                                  "cache (true: every SLUB profile); false is SLAB before "
                                  "v2.6.35, every object from the memory node's list"),
    "min_partial": (int, "override of /sys/kernel/slab/<cache>/min_partial"),
    "cpu_partial": (int, "override of /sys/kernel/slab/<cache>/cpu_partial (objects); only "
                         "where the profile has per-CPU partial lists"),
    "sheaf_capacity": (int, "override of the sheaf capacity; only where the cache has sheaves"),
    "barns_on_memoryless_nodes": (bool, "put barns on memoryless nodes too and let their "
                                        "CPUs free into sheaves (the v7.1 change)"),
}

_TOP_TABLES = ("topology", "cache", "policy", "workload", "run")
_TOPOLOGY_KEYS = ("cpus", "nodes", "memoryless_nodes", "node_cpus", "possible", "online",
                  "distances")
_MAX_STEPS = 10_000_000


class ConfigError(SlabtuneError):
    """A bad simulation configuration; the message names the field."""


@dataclasses.dataclass(frozen=True)
class SimSpec:
    """A validated simulation configuration (plain Python data)."""

    topology: topologies.Topology
    cache: caches.CacheInfo
    profile: profiles.KernelProfile
    boot: bootparams.SlubParams
    boot_given: dict[str, int]
    knobs: dict[str, Any]
    workload_kind: str
    workload_params: dict[str, Any]
    other_ns: float
    steps: int
    seed: int
    #: The profile name the config gave (``profile`` has the knobs applied).
    base_profile: str = ""
    #: [run] ops_per_step: the dynamics model's run length b (1: one op per rep per step).
    ops_per_step: int = 1

    def _run_table(self) -> dict[str, Any]:
        run: dict[str, Any] = {"steps": self.steps, "seed": self.seed}
        if self.ops_per_step != 1:
            run["ops_per_step"] = self.ops_per_step
        return run

    def to_doc(self) -> dict[str, Any]:
        """The spec as a config document (the tables of a CONFIG.toml) that parses back to
        an equal spec."""
        t = self.topology
        topo: dict[str, Any] = {"cpus": t.present, "nodes": t.nodes,
                                "memoryless_nodes": list(t.memoryless_nodes),
                                "node_cpus": list(t.node_cpus)}
        if t.possible != t.present:
            topo["possible"] = t.possible
        if t.online != t.present:
            topo["online"] = t.online
        if t.distances is not None:
            topo["distances"] = [list(row) for row in t.distances]
        if self.cache.name in caches.CACHES:
            cache: dict[str, Any] = {"name": self.cache.name}
        else:
            cache = {"size": self.cache.size}
        policy: dict[str, Any] = {"profile": self.base_profile}
        params = {**self.boot_given, **self.knobs}
        if params:
            policy["params"] = params
        workload = {"kind": self.workload_kind, **self.workload_params}
        if self.other_ns:
            workload["other_ns"] = self.other_ns
        return {"topology": topo, "cache": cache, "policy": policy, "workload": workload,
                "run": self._run_table()}

    def describe(self) -> dict[str, Any]:
        """The configuration spelled out, JSON-ready."""
        t = self.topology
        topo: dict[str, Any] = {"cpus": t.present, "possible": t.possible, "online": t.online,
                                "node_cpus": list(t.node_cpus),
                                "memoryless_nodes": list(t.memoryless_nodes)}
        if t.distances is not None:
            topo["distances"] = [list(row) for row in t.distances]
        return {
            "topology": topo,
            "cache": {"name": self.cache.name, "size": self.cache.size},
            "profile": self.profile.name,
            "boot": dict(self.boot_given),
            "knobs": dict(self.knobs),
            "workload": {"kind": self.workload_kind, "other_ns": self.other_ns,
                         **self.workload_params},
            "run": self._run_table(),
        }


# --------------------------------------------------------------------------- helpers


def _table(doc: dict, name: str, required: bool = True) -> dict:
    if name not in doc:
        if required:
            raise ConfigError(f"[{name}]: missing table")
        return {}
    val = doc[name]
    if not isinstance(val, dict):
        raise ConfigError(f"{name}: must be a table")
    return val


def _no_unknown(table: dict, where: str, allowed) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(allowed)})")


def _int(where: str, val, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(val, bool) or not isinstance(val, int):
        raise ConfigError(f"{where}: {val!r} is not an integer")
    if lo is not None and val < lo:
        word = "negative" if lo == 0 and val < 0 else f"below {lo}"
        raise ConfigError(f"{where}: {val} is {word}")
    if hi is not None and val > hi:
        raise ConfigError(f"{where}: {val} is above {hi}")
    return val


#: Largest number a config may give: the model computes in float32.
_FLOAT32_MAX = 3.4028234663852886e38


def _number(where: str, val, lo: float = 0.0) -> float:
    """A finite, float32-representable number of at least ``lo``."""
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) \
            or abs(val) > _FLOAT32_MAX:
        raise ConfigError(f"{where}: {val!r} is not a finite number")
    if val < lo:
        word = "negative" if lo == 0 else f"below {lo}"
        raise ConfigError(f"{where}: {val} is {word}")
    return float(val)


def _bool(where: str, val) -> bool:
    if not isinstance(val, bool):
        raise ConfigError(f"{where}: {val!r} is not true or false")
    return val


# --------------------------------------------------------------------------- sections


def parse_topology(tab: dict) -> topologies.Topology:
    """[topology] -> Topology; CPU counts must add up and named nodes must exist."""
    _no_unknown(tab, "topology", _TOPOLOGY_KEYS)
    if "cpus" not in tab:
        raise ConfigError("topology.cpus: missing")
    cpus = _int("topology.cpus", tab["cpus"], 1, topologies.MAX_CPUS)
    nodes = _int("topology.nodes", tab.get("nodes", 1), 1, topologies.MAX_NODES)
    ml = tab.get("memoryless_nodes", [])
    if not isinstance(ml, list):
        raise ConfigError("topology.memoryless_nodes: must be a list of node ids")
    for n in ml:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConfigError(f"topology.memoryless_nodes: {n!r} is not a node id (an "
                              "integer)")
        if not 0 <= n < nodes:
            raise ConfigError(
                f"topology.memoryless_nodes: node {n!r} does not exist (nodes = {nodes})")
    node_cpus = tab.get("node_cpus")
    if node_cpus is not None:
        if not isinstance(node_cpus, list):
            raise ConfigError("topology.node_cpus: must be a list of CPU counts")
        for i, c in enumerate(node_cpus):
            _int(f"topology.node_cpus[{i}]", c, 0)
    possible = tab.get("possible")
    online = tab.get("online")
    if possible is not None:
        possible = _int("topology.possible", possible, cpus, topologies.MAX_CPUS)
    if online is not None:
        online = _int("topology.online", online, 1, cpus)
    distances = tab.get("distances")
    if distances is not None and (not isinstance(distances, list)
                                  or not all(isinstance(r, list) for r in distances)):
        raise ConfigError("topology.distances: must be a list of rows (lists of node "
                          "distances), one per node")
    try:
        topo = topologies.Topology.uniform(cpus, nodes, memoryless_nodes=ml, possible=possible,
                                           online=online, node_cpus=node_cpus,
                                           distances=distances)
        topologies.check_no_empty_nodes(topo)
    except topologies.TopologyError as err:
        raise ConfigError(f"topology.{err}") from None
    return topo


def parse_cache(tab: dict) -> caches.CacheInfo:
    """[cache] -> CacheInfo: exactly one of ``name`` or ``size``."""
    _no_unknown(tab, "cache", ("name", "size"))
    if ("name" in tab) == ("size" in tab):
        raise ConfigError("cache: give exactly one of name or size")
    try:
        if "name" in tab:
            if not isinstance(tab["name"], str):
                raise ConfigError(f"cache.name: {tab['name']!r} is not a string")
            return caches.get_cache(tab["name"])
        return caches.anonymous_cache(tab["size"])
    except caches.UnknownCacheError as err:
        raise ConfigError(str(err)) from None


def apply_knobs(profile: profiles.KernelProfile, knobs: dict[str, Any]) -> profiles.KernelProfile:
    """A profile with the profile-level knobs applied (data, not branches)."""
    out = profile
    if "memoryless_fallback" in knobs:
        out = dataclasses.replace(out, memoryless_fallback=knobs["memoryless_fallback"])
    if knobs.get("barns_on_memoryless_nodes") is not None:
        on = knobs["barns_on_memoryless_nodes"]
        out = dataclasses.replace(
            out, barns="all_nodes" if on else ("memory_nodes" if out.barns != "none" else "none"),
            memoryless_cpus_use_sheaves=on)
    return out


def _slab_policy(profile: profiles.SlabProfile, params: dict):
    """[policy] with a SLAB profile -> (profile with the numa_mem_id() switch applied,
    SlubParams (unused by SLAB: its defaults), given boot params, knobs).  The knobs are
    checked as :func:`slabtune.model.slab.validate_params` checks them (a SLUB knob is
    refused naming it and the profile); ``slab_max_order`` is the boot parameter, the
    /proc/slabinfo tunables and ``memoryless_fallback`` are knobs."""
    try:
        valid = slab.validate_params(params, profile)
    except SlabtuneError as err:
        raise ConfigError(f"policy.params.{err}") from None
    given = {k: v for k, v in valid.items() if k in profile.boot_params}
    knobs = {k: v for k, v in valid.items() if k not in given}
    return apply_knobs(profile, knobs), bootparams.SlubParams(), given, knobs


def check_slab_tunables(spec: SimSpec) -> None:
    """The /proc/slabinfo tunables of a SLAB spec against the cache's own values on its
    topology: do_tune_cpucache() takes ``limit``, ``batchcount`` and ``shared`` together
    (slabinfo_write() refuses batchcount > limit), so a limit given alone must not fall
    below the cache's batchcount, nor a batchcount alone exceed its limit."""
    if not profiles.is_slab(spec.profile):
        return
    if spec.ops_per_step != 1:
        raise ConfigError(f"run.ops_per_step: {spec.ops_per_step} with SLAB profile "
                          f"{spec.profile.name}; the SLAB dynamics run one op per rep per step")
    if "limit" not in spec.knobs and "batchcount" not in spec.knobs:
        return
    t = spec.topology
    st = slab.structure(spec.cache.size, t.possible, t.node_cpus, spec.profile)
    lim = spec.knobs.get("limit", st.limit)
    bc = spec.knobs.get("batchcount", st.batchcount)
    if bc > lim:
        which = "batchcount" if "batchcount" in spec.knobs else "limit"
        raise ConfigError(f"policy.params.{which}: batchcount {bc} is above limit {lim} "
                          f"({spec.cache.name} on {spec.topology.present} CPUs)")


def parse_policy(tab: dict, cache: caches.CacheInfo):
    """[policy] -> (profile with knobs applied, SlubParams, given boot params, knobs)."""
    _no_unknown(tab, "policy", ("profile", "params"))
    if "profile" not in tab:
        raise ConfigError("policy.profile: missing")
    if not isinstance(tab["profile"], str):
        raise ConfigError(f"policy.profile: {tab['profile']!r} is not a string")
    try:
        profile = profiles.get_any_profile(tab["profile"])
    except profiles.UnknownProfileError as err:
        raise ConfigError(f"policy.profile: {err}") from None
    params = tab.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError("policy.params: must be a table")
    if profiles.is_slab(profile):
        return _slab_policy(profile, params)
    boot_raw, knobs = {}, {}
    names = bootparams.allowed_names(profile)
    for key, val in params.items():
        where = f"policy.params.{key}"
        if key in SIM_KNOBS:
            typ = SIM_KNOBS[key][0]
            knobs[key] = _bool(where, val) if typ is bool else _int(where, val, 0)
        elif key in names:
            boot_raw[key] = _int(where, val)
        elif slab.foreign_knob(key, profile) is not None:
            raise ConfigError(f"{where}: {slab.foreign_knob(key, profile)}")
        else:
            allowed = ", ".join(list(names) + list(SIM_KNOBS))
            raise ConfigError(f"{where}: unknown key (allowed: {allowed})")
    try:
        given = bootparams.validate_params(boot_raw, profile)
    except SlabtuneError as err:
        raise ConfigError(f"policy.params: {err}") from None
    if "cpu_partial" in knobs and not profile.has_cpu_partial:
        raise ConfigError(f"policy.params.cpu_partial: profile {profile.name} has no per-CPU "
                          "partial lists")
    if "barns_on_memoryless_nodes" in knobs and profile.sheaves == "none":
        raise ConfigError(f"policy.params.barns_on_memoryless_nodes: profile {profile.name} "
                          "has no sheaves or barns")
    if "sheaf_capacity" in knobs:
        if profile.sheaves == "none":
            raise ConfigError(f"policy.params.sheaf_capacity: profile {profile.name} has no "
                              "sheaves")
        if knobs["sheaf_capacity"] == 0:
            raise ConfigError("policy.params.sheaf_capacity: 0 where sheaves are on (a sheaf "
                              "must hold at least one object)")
    if "min_partial" in knobs:
        _int("policy.params.min_partial", knobs["min_partial"], 0, 1 << 20)
    return (apply_knobs(profile, knobs), bootparams.params_from_validated(given), given, knobs)


def workload_param_names(kind: str) -> tuple[str, ...]:
    """Parameter names the constructor of a workload kind accepts from a config file."""
    from slabtune.model import workloads  # the dynamics core's constructors

    return tuple(workloads.spec_params(kind))


def parse_workload(tab: dict) -> tuple[str, dict[str, Any], float]:
    """[workload] -> (kind, parameters, other_ns); parameters are checked by name against
    the kind's constructor and must be non-negative numbers (or booleans), or strings for
    the constructor's text parameters (``drain``)."""
    from slabtune.model.workloads import TEXT_PARAMS

    if "kind" not in tab:
        raise ConfigError("workload.kind: missing")
    kind = tab["kind"]
    if kind not in WORKLOAD_KINDS:
        raise ConfigError(f"workload.kind: {kind!r} is not one of {', '.join(WORKLOAD_KINDS)}")
    allowed = ("kind", "other_ns") + workload_param_names(kind)
    _no_unknown(tab, "workload", allowed)
    params = {}
    for key, val in tab.items():
        if key in ("kind", "other_ns"):
            continue
        where = f"workload.{key}"
        if key in TEXT_PARAMS:
            if not isinstance(val, str):
                raise ConfigError(f"{where}: {val!r} is not a string")
            params[key] = val
        elif isinstance(val, bool):
            params[key] = val
        elif isinstance(val, int):
            params[key] = _int(where, val, 0)
        else:
            params[key] = _number(where, val)
    other = _number("workload.other_ns", tab.get("other_ns", 0.0))
    return kind, params, other


def check_workload(kind: str, params: dict[str, Any], topo: topologies.Topology) -> None:
    """Build the workload once, so a parameter its constructor refuses (a count out of
    range, a probability above 1) is an error naming ``workload.<param>`` now, not when
    the model runs."""
    from slabtune.model import workloads

    try:
        workloads.build(kind, topo, **params)
    except workloads.WorkloadError as err:
        raise ConfigError(f"workload.{err}") from None


def parse_run(tab: dict) -> tuple[int, int, int]:
    """[run] -> (steps, seed, ops_per_step)."""
    _no_unknown(tab, "run", ("steps", "seed", "ops_per_step"))
    steps = _int("run.steps", tab.get("steps", 2000), 1, _MAX_STEPS)
    seed = _int("run.seed", tab.get("seed", 0), 0, (1 << 32) - 1)
    b = _int("run.ops_per_step", tab.get("ops_per_step", 1), 1, MAX_OPS_PER_STEP)
    return steps, seed, b


def parse_doc(doc: dict) -> SimSpec:
    """Validate a parsed TOML document into a :class:`SimSpec`."""
    _no_unknown(doc, "config", _TOP_TABLES)
    topo = parse_topology(_table(doc, "topology"))
    cache = parse_cache(_table(doc, "cache"))
    profile, boot, given, knobs = parse_policy(_table(doc, "policy"), cache)
    kind, wparams, other = parse_workload(_table(doc, "workload"))
    steps, seed, b = parse_run(_table(doc, "run", required=False))
    spec = SimSpec(topo, cache, profile, boot, given, knobs, kind, wparams, other, steps, seed,
                   base_profile=_table(doc, "policy")["profile"], ops_per_step=b)
    check_slab_tunables(spec)
    return spec


def parse_text(text: str, where: str = "<config>") -> SimSpec:
    """Parse TOML text; a syntax error is one line naming the file."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: not valid TOML ({err})") from None
    return parse_doc(doc)


def load(path: str | Path) -> SimSpec:
    """Read and validate a config file; every error is one line naming the file and the
    field."""
    p = Path(path)
    text = _read("config", p)
    try:
        spec = parse_text(text, str(p))
        check_workload(spec.workload_kind, spec.workload_params, spec.topology)
        return spec
    except ConfigError as err:
        msg = str(err)
        raise ConfigError(msg if msg.startswith(f"{p}: ") else f"{p}: {msg}") from None


def _read(field: str, path: Path) -> str:
    """A config or cost file's UTF-8 text; a missing, binary or directory path is one
    ConfigError line naming ``field`` and the path."""
    try:
        return read_text_file(path, field)
    except SlabtuneError as err:
        raise ConfigError(str(err)) from None


# --------------------------------------------------------------------------- cost files


def default_cost_text() -> str:
    """The packaged ``cost_default.toml``."""
    return importlib.resources.files("slabtune.model").joinpath("cost_default.toml").read_text()


def load_cost(path: str | Path | None = None) -> tuple[cost.CostParams, cost.CostMeta]:
    """Cost constants: the packaged defaults, overridden by the constants a file names."""
    if path is None:
        return cost.parse_cost_toml(default_cost_text(), "cost_default.toml")
    p = Path(path)
    return load_cost_text(_read("cost", p), str(p))


def load_cost_text(text: str, source: str) -> tuple[cost.CostParams, cost.CostMeta]:
    """The packaged defaults overridden by the constants of a cost file's ``text`` (read
    from ``source``, which errors name with the constant)."""
    base, meta = cost.parse_cost_toml(default_cost_text(), "cost_default.toml")
    try:
        params, file_meta = cost.parse_cost_toml(text, source, base=base)
    except cost.CostError as err:
        msg = str(err)   # a TOML syntax error already names the source
        raise ConfigError(msg if msg.startswith(f"{source}: ") else f"{source}: {msg}") from None
    # Defaults the file does not override keep their "fitted" note; the file's own notes
    # are added.
    overridden = set(tomllib.loads(text).get("cost", {}))
    fitted = {k: v for k, v in meta.fitted.items() if k not in overridden}
    for k, v in list(fitted.items()):
        ref = v[5:-1].strip() if v.startswith("(see ") else None
        if ref and ref not in fitted:
            fitted[k] = meta.fitted.get(ref, v)
    fitted.update(file_meta.fitted)
    return params, cost.CostMeta(f"{source} over cost_default.toml", fitted)
