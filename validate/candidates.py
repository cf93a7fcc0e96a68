"""Candidates to validate: a candidate file, the top or a spread of a study's Pareto front,
always with the baseline.
"""


from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles
from slabtune.validate.schema import BASELINE_ID
from slabtune.validate.spec import ValidateSpec

# --------------------------------------------------------------------------- candidates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A policy to validate: boot parameters (canonical ``slub_*`` names) and knobs of
    :data:`slabtune.tuner.space.KNOBS` that are not boot parameters."""

    id: str
    boot: Mapping[str, int] = dataclasses.field(default_factory=dict)
    knobs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    source: str = ""

    def params(self) -> dict[str, int]:
        return {**dict(self.boot), **dict(self.knobs)}

    def to_json(self) -> dict:
        return {"id": self.id, "boot": dict(self.boot), "knobs": dict(self.knobs),
                "source": self.source}

    @classmethod
    def from_json(cls, d: Mapping) -> Candidate:
        return cls(str(d["id"]), dict(d.get("boot", {})), dict(d.get("knobs", {})),
                   str(d.get("source", "")))


BASELINE = Candidate(BASELINE_ID, {}, {}, "the kernel's defaults")

#: Profile that accepts every boot parameter spelling (slub_* and slab_*), for checking a
#: candidate file before the target kernel is known.
_SPELLING_PROFILE = "v7.1"


def _check_knobs(where: str, knobs: Mapping, profile=None) -> dict[str, int]:
    """A SLUB candidate's search knobs checked against :data:`slabtune.tuner.space.KNOBS`;
    a SLAB tunable is a one-line error naming the knob and the spec's profile."""
    from slabtune.model import slab
    from slabtune.tuner.space import KNOBS

    out = {}
    for name, value in knobs.items():
        k = KNOBS.get(str(name))
        why = slab.foreign_knob(str(name), profile) if profile is not None else None
        if k is None and why is not None:
            raise SlabtuneError(f"{where}.knobs.{name}: {why}")
        if k is None:
            raise SlabtuneError(f"{where}.knobs.{name}: unknown knob (known: {', '.join(KNOBS)})")
        if k.reach == "boot":
            raise SlabtuneError(f"{where}.knobs.{name}: a boot parameter; put it under boot")
        if isinstance(value, bool) or not isinstance(value, int):
            raise SlabtuneError(f"{where}.knobs.{name}: {value!r} is not an integer")
        if not k.low <= value <= k.high:
            raise SlabtuneError(f"{where}.knobs.{name}: {value} is outside {k.low}..{k.high}")
        out[k.name] = int(value)
    return out


def _slab_knobs(where: str, knobs: Mapping, profile) -> dict[str, int]:
    """A candidate's /proc/slabinfo tunables on a SLAB profile (``knobs = { limit = 60,
    batchcount = 30, shared = 4 }``, any of the three; an omitted one keeps the cache's own
    value, a limit without batchcount takes ``(limit + 1) / 2``:
    :func:`slab_applied_tunables`), each in the range of
    :data:`slabtune.tuner.space.SLAB_KNOBS`.  A SLUB knob is a one-line error naming the
    knob and the profile; so is a SLAB boot parameter (it goes under boot)."""
    from slabtune.model import slab
    from slabtune.tuner.space import SLAB_KNOBS

    out: dict[str, int] = {}
    for name, value in knobs.items():
        why = slab.foreign_knob(str(name), profile)
        if why is not None or name not in slab.SLAB_TUNABLES:
            if name in SLAB_KNOBS:
                why = (f"{name} is a boot parameter of SLAB profile {profile.name}; put it "
                       "under boot")
            raise SlabtuneError(f"{where}.knobs.{name}: "
                                + (why or f"{name} is a SLUB search knob (tuner/space.py); "
                                          f"profile {profile.name} is SLAB"))
        k = SLAB_KNOBS[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise SlabtuneError(f"{where}.knobs.{name}: {value!r} is not an integer")
        if not k.low <= value <= k.high:
            raise SlabtuneError(f"{where}.knobs.{name}: {value} is outside {k.low}..{k.high}")
        out[name] = int(value)
    if "limit" in out and out.get("batchcount", 0) > out["limit"]:
        raise SlabtuneError(f"{where}.knobs.batchcount: {out['batchcount']} is above limit "
                            f"{out['limit']} (slabinfo_write() ignores such a line)")
    return out


def _slab_boot(where: str, boot: Mapping, profile) -> dict[str, int]:
    """A candidate's boot parameters on a SLAB profile, by their SLAB names (mm/slab.c of
    6.1 takes ``slab_max_order=`` only, slab_max_order_setup()).  A SLUB boot parameter is
    a one-line error naming the knob and the profile; so is a /proc/slabinfo tunable
    (limit, batchcount, shared), which no boot sets (it goes under knobs)."""
    from slabtune.model import slab

    for name in boot:
        why = slab.foreign_knob(str(name), profile)
        if why is not None:
            raise SlabtuneError(f"{where}.boot.{name}: {why}")
        if name not in profile.boot_params:
            raise SlabtuneError(f"{where}.boot.{name}: not a boot parameter of SLAB profile "
                                f"{profile.name} (boot parameters: "
                                f"{', '.join(profile.boot_params) or 'none'})")
    try:
        out = slab.validate_params(dict(boot), profile)
    except SlabtuneError as err:
        raise SlabtuneError(f"{where}.boot.{err}") from None
    return {k: int(v) for k, v in out.items()}


def parse_candidates(doc: Any, source: str, profile=None) -> list[Candidate]:
    """Candidates from a parsed candidate file.

    Format (TOML, or the same structure as JSON)::

        [[candidate]]
        id = "order1"                               # unique; "baseline" is reserved
        boot = { slub_max_order = 1 }               # slub_*/slab_* boot parameters
        knobs = { min_partial_lo = 3 }              # other knobs of tuner/space.py
                                                    # (SLAB: limit, batchcount, shared)

    JSON may also be a bare list of such tables.  Boot parameters are checked against the
    allow-list here (every spelling) and again against the target kernel's profile before
    anything boots.  Every error names the field.  With a SLAB ``profile`` (the spec's
    fleet profile) the boot parameters keep their SLAB names, the knobs are the
    /proc/slabinfo tunables and SLUB knobs are refused (:func:`_slab_boot`,
    :func:`_slab_knobs`).
    """
    if isinstance(doc, list):
        doc = {"candidate": doc}
    if not isinstance(doc, Mapping):
        raise SlabtuneError(f"{source}: expected a table with [[candidate]] entries")
    unknown = set(doc) - {"candidate"}
    if unknown:
        raise SlabtuneError(f"{source}: unknown key {sorted(unknown)[0]!r} (expected candidate)")
    items = doc.get("candidate")
    if not isinstance(items, list) or not items:
        raise SlabtuneError(f"{source}: candidate: expected at least one [[candidate]]")
    out: list[Candidate] = []
    seen = {BASELINE_ID}
    for i, c in enumerate(items):
        where = f"{source}: candidate[{i}]"
        if not isinstance(c, Mapping):
            raise SlabtuneError(f"{where}: expected a table")
        bad = set(c) - {"id", "boot", "knobs"}
        if bad:
            raise SlabtuneError(f"{where}.{sorted(bad)[0]}: unknown field "
                                "(expected id, boot, knobs)")
        cid = c.get("id", f"c{i}")
        if not isinstance(cid, str) or not cid or len(cid) > 64 or not all(
                ch.isalnum() or ch in "-_." for ch in cid):
            raise SlabtuneError(f"{where}.id: {cid!r} must be 1-64 letters, digits, '-', '_', '.'")
        if cid in seen:
            raise SlabtuneError(f"{where}.id: {cid!r} is "
                                + ("reserved" if cid == BASELINE_ID else "used twice"))
        seen.add(cid)
        boot = c.get("boot", {})
        knobs = c.get("knobs", {})
        for name, val in (("boot", boot), ("knobs", knobs)):
            if not isinstance(val, Mapping):
                raise SlabtuneError(f"{where}.{name}: expected a table")
        if profiles.is_slab(profile):
            out.append(Candidate(cid, _slab_boot(where, boot, profile),
                                 _slab_knobs(where, knobs, profile), source))
            continue
        try:
            canon = bootparams.validate_params(dict(boot), profiles.get_profile(_SPELLING_PROFILE))
        except SlabtuneError as err:
            raise SlabtuneError(f"{where}.boot: {err}") from None
        out.append(Candidate(cid, canon, _check_knobs(where, knobs, profile), source))
    return out


def load_candidate_file(path: str | os.PathLike, profile=None) -> list[Candidate]:
    """Read a candidate file (``.toml`` or ``.json``; see :func:`parse_candidates`; ``profile``:
    the validation spec's fleet profile)."""
    from slabtune.sweeps.spec import read_text_file

    p = Path(path)
    text = read_text_file(p, "--candidate")
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise SlabtuneError(f"--candidate: {p}: not valid JSON ({err.msg}, line "
                                f"{err.lineno})") from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SlabtuneError(f"--candidate: {p}: not valid TOML ({err})") from None
    return parse_candidates(doc, f"--candidate {p.name}", profile)


def candidate_rank(points: Sequence[dict]) -> list[dict]:
    """Order Pareto points for ``--top K``: by the sum of the fleet-level relative gains over
    the baseline on both objectives (memory overhead and ns per op), largest first; ties by
    trial number.  ``points`` are :func:`slabtune.results.pareto.study_pareto` points with
    ``gain`` added."""
    return sorted(points, key=lambda p: (-p["gain"], p["trial"]))


def check_count(flag: str, k) -> None:
    """``--top K`` / ``--spread K`` take a positive integer; anything else is a one-line error."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SlabtuneError(f"{flag}: {k!r} must be a positive integer")


def spread_pick(points: Sequence[dict], k: int, key=None) -> list[dict]:
    """``k`` points spread over a Pareto front for ``--spread K``: the lowest-memory point,
    the lowest-time point, and ``k - 2`` more evenly spaced by rank between them along the
    front sorted by memory (ties by time, then trial number).  A front of at most ``k``
    points is returned whole; ``k = 1`` gives the lowest-memory point.  Returned sorted by
    memory.  ``points`` are :func:`slabtune.results.pareto.study_pareto` points.

    ``key`` (a function of a point) names what the validation would run for it: a point
    whose key was already picked is skipped for the next point along the front (towards
    more memory, then back towards less) with a key not yet picked, and when that leaves
    fewer than ``k`` picks the front is walked from its lowest-memory end for more.  Fewer
    than ``k`` points come back only when the front has fewer than ``k`` distinct keys."""
    check_count("--spread", k)
    front = sorted(points, key=lambda p: (p["memory"], p["time"], p["trial"]))
    if len(front) <= k:
        targets = list(range(len(front)))
    elif k == 1:
        targets = [0]
    else:
        lo_time = min(range(len(front)), key=lambda i: (front[i]["time"], front[i]["memory"],
                                                         front[i]["trial"]))
        ends = [0] if lo_time == 0 else [0, lo_time]
        rest = [i for i in range(len(front)) if i not in ends]
        need, m = k - len(ends), len(rest)
        # position j of `need` evenly spaced in (0, m + 1), rounded half up; m >= need keeps
        # the spacing >= 1, so the picks are distinct
        targets = ends + [rest[((2 * (j + 1) * (m + 1) + need + 1) // (2 * (need + 1))) - 1]
                          for j in range(need)]
    name = key if key is not None else (lambda p: ("trial", p["trial"]))
    keys = [name(p) for p in front]
    chosen: list[int] = []
    seen: set = set()

    def take(i: int) -> bool:
        if i in chosen or keys[i] in seen:
            return False
        chosen.append(i)
        seen.add(keys[i])
        return True

    for t in targets:
        any(take(i) for i in [*range(t, len(front)), *range(t - 1, -1, -1)])
    for i in range(len(front)):
        if len(chosen) >= k:
            break
        take(i)
    return [front[i] for i in sorted(chosen)]


def _front_points(study) -> list[dict]:
    """The study's Pareto points, each with ``gain``: the sum of the fleet-level relative
    gains over the baseline on both objectives."""
    from slabtune.results import pareto

    rep = pareto.study_pareto(study)
    base = rep["baseline"]
    return [{**p, "gain": float(sum(pareto.gains([p["memory"], p["time"]],
                                               [base["memory"], base["time"]])))}
            for p in rep["points"]]


def _trial_candidates(study, points: Sequence[dict]) -> list[Candidate]:
    """Pareto points as candidates: their effective boot parameters that differ from the
    defaults, and their other knobs."""
    from slabtune.tuner import space
    from slabtune.tuner import study as studies

    spec = studies.study_spec(study)
    defaults = space.baseline_values(spec.fleet.profile)
    table = space.knobs_for(spec.fleet.profile)
    out = []
    for p in points:
        eff = studies.effective_params(p["params"], spec)
        boot = {k: int(v) for k, v in eff.items()
                if table[k].reach == "boot" and int(v) != defaults[k]}
        knobs = {k: int(v) for k, v in p["params"].items() if table[k].reach != "boot"}
        out.append(Candidate(f"trial-{p['trial']}", boot, knobs,
                             f"study {study.study_name} trial {p['trial']}"))
    return out


def candidates_from_study(study, top: int) -> list[Candidate]:
    """The ``top`` best Pareto-front trials of a slabtune study (see :func:`candidate_rank`)
    as candidates (see :func:`_trial_candidates`)."""
    check_count("--top", top)
    return _trial_candidates(study, candidate_rank(_front_points(study))[:top])


def spread_candidates(study, k: int, spec: ValidateSpec | None = None
                      ) -> tuple[list[Candidate], int]:
    """``k`` candidates spread over the study's Pareto front (see :func:`spread_pick`) and
    the front's size.  With the validation ``spec``, a front point whose validated
    configuration (:func:`validated_key`) equals one already picked is skipped for the next
    along the front, so the K candidates are K distinct configurations when the front has
    that many (fewer come back when it has not)."""
    check_count("--spread", k)
    pts = _front_points(study)
    key = None
    if spec is not None:
        cands = {p["trial"]: c for p, c in zip(pts, _trial_candidates(study, pts))}
        key = lambda p: validated_key(spec, cands[p["trial"]])  # noqa: E731
    picked = spread_pick(pts, k, key)
    return _trial_candidates(study, picked), len(pts)


def validated_key(spec: ValidateSpec, cand: Candidate) -> str:
    """What validating a candidate runs, as a string: its boot parameters and, for every
    cache of the spec's workload, the per-cache values the validation applies
    (:func:`applied_values`; a guest applies the boot parameters only).  Knobs that reach
    nothing the validation runs leave it unchanged.  On a SLAB spec the per-cache values
    are the candidate's tunables (SLUB's cache_values() has no SLAB structure)."""
    from slabtune.tuner import objectives

    if profiles.is_slab(spec.fleet.profile):
        per: Mapping[str, Any] = {c.name: None for c in spec.fleet.caches}
    else:
        per = objectives.cache_values(spec.fleet, cand.params())
    return json.dumps({"boot": {k: int(v) for k, v in cand.boot.items()},
                       "caches": {c.name: applied_values(spec, cand, per[c.name])
                                  for c in spec.fleet.caches}}, sort_keys=True)


def with_baseline(cands: Sequence[Candidate]) -> list[Candidate]:
    """The baseline first, then the candidates (the baseline is always validated)."""
    return [BASELINE] + [c for c in cands if c.id != BASELINE_ID]


def applied_values(spec: ValidateSpec, cand: Candidate,
                   per_cache: Mapping[str, int] | None) -> dict[str, int]:
    """What the native validation applies of a candidate to one cache: its boot parameters,
    and that cache's ``min_partial`` and ``cpu_partial`` (``per_cache``, from
    :func:`slabtune.tuner.objectives.cache_values`) when the candidate searches the knobs
    behind them (the sysfs files a kernel would take them from; cpu_partial only where the
    profile has per-CPU partial lists).  On a SLAB spec, the boot parameters and the
    /proc/slabinfo tunables the candidate sets (:func:`slab_applied_tunables`, the same
    for every cache)."""
    params: dict[str, int] = {k: int(v) for k, v in cand.boot.items()}
    searched = set(cand.knobs)
    if profiles.is_slab(spec.fleet.profile):
        # SLAB has no min_partial or cpu_partial: its tunables are written to every cache
        params.update(slab_applied_tunables(cand.knobs))
        return params
    if per_cache is not None:
        if searched & {"min_partial_divisor", "min_partial_lo", "min_partial_hi"}:
            params["min_partial"] = int(per_cache["min_partial"])
        if spec.fleet.profile.has_cpu_partial and searched & {
                "cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small"}:
            params["cpu_partial"] = int(per_cache["cpu_partial"])
    return params


def slab_applied_tunables(knobs: Mapping[str, int]) -> dict[str, int]:
    """The /proc/slabinfo tunables a SLAB candidate sets on a cache, by
    :func:`slabtune.tuner.slab_objectives.tunables_of` (the tuner's one rule: a tunable at
    :data:`~slabtune.tuner.space.SLAB_CACHE_DEFAULT` or absent keeps the cache's
    enable_cpucache() value, an unset batchcount under a set limit is ``(limit + 1) /
    2``), with the cache's own values left unresolved: only the tunables the candidate
    decides come back (limit and shared where it sets them, batchcount where it sets it
    or a limit), so the result is the same for every cache and topology, and what it
    leaves out both the lab's write and the model take from the cache
    (:func:`slabtune.validate.lab.slab_tunables`)."""
    from slabtune.model import slab
    from slabtune.tuner.space import SLAB_CACHE_DEFAULT as D

    raw = [int(knobs.get(k, D)) for k in slab.SLAB_TUNABLES]
    if all(v == D for v in raw):
        return {}
    from slabtune.tuner.slab_objectives import tunables_of

    got = tunables_of(*raw, D, D, D)
    return {k: int(v) for k, v in zip(slab.SLAB_TUNABLES, got) if int(v) != D}
