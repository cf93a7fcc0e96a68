"""``validate --target uml``: candidates timed on the real 7.2 allocator, run natively as User
Mode Linux (kernel/uml.py), beside the model's ns per alloc+free pair for the same run.

A pair is a (candidate, topology) that UML can express (:func:`expressible`): one node, every
CPU present and online, no more CPUs than the UML kernel's NR_CPUS and than ``max_cpus``
(default: the host cores this process may use, since each virtual CPU is a host thread and
timing needs them not to time-slice).  NUMA topologies are skipped with their reason: UML
has no nodes, so the model's cross-node costs would have nothing to meet.

What runs is the lab's document of the pair (:func:`slabtune.validate.lab.validate_doc`)
under the UML kernel's profile: the spec's ``[validate.native]`` cache and workload, the
candidate's boot parameters on UML's command line and, on a kmalloc cache, the
``min_partial`` its searched knobs give that cache written to sysfs by the /init
(``cpu_partial`` only where the kernel has per-CPU partial lists: not 7.x).  Kernel-only
knobs are not applied and are listed as such; the model predicts exactly what ran.

Timing (:func:`run_round`): every pending pair once per round, rounds one after another,
each round one Ray task that holds the node's CPUs (and the ``uml`` resource where a
cluster offers it), so UML boots never overlap; the pairs' order rotates from round to
round, so a slow spell of the host falls on different pairs.  The measured figure is the
median over the good runs of the allocator's bracketed ns per alloc+free pair
(:func:`slabtune.kernel.uml.timing`).  Each round's runs are kept in the run's manifest
as it ends, so ``validate --resume`` runs only the rounds a pair still lacks.

The predicted figure is what the calibration predicts a UML timing with: the model's
``ns_per_op`` (metrics.py, per alloc+free pair: the quantity the tuner's time objective
halves to ns per op) of the same document under the cost table in force, plus the rig term
(:func:`slabtune.calibrate.umlfit.in_rig`): ``uml_section_ns``, what UML adds to each lock
section taken with interrupts off, times the model's irq-off sections per pair
(:func:`slabtune.calibrate.umlfit.section_events`), the constant read from the cost file's
header where ``calibrate fit`` stores it with the table it was fitted with
(:func:`rig_term`).  The table's price alone is kept beside it (:data:`UML_TABLE_FIELD`).
:func:`repredict` computes both again from the stored documents, so a new cost model is
checked against the stored times without booting anything.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slabtune.errors import SlabtuneError

#: The row of a pair's timing: model ns per pair against the median measured ns per pair.
UML_FIELD = "uml_ns_per_pair"
#: The cost table's price alone (no rig term) against the same measured figure: not
#: comparable, kept to show what the rig term moves.
UML_TABLE_FIELD = "uml_table_ns_per_pair"
#: Measured only: every bracket per pair, the ones above long_ns (a preempted host thread)
#: included.
UML_ALL_FIELD = "uml_ns_per_pair_all"
#: Per-pair counter rows: ``uml_counters.<SLUB_STATS name>`` per alloc+free pair.
UML_COUNTER_PREFIX = "uml_counters."
#: The custom Ray resource a cluster node offers for UML runs (one at a time per node).
UML_RESOURCE = "uml"
#: Timed runs per pair unless ``--uml-runs`` says otherwise.  Two CPUs' calls are noisy on a
#: shared 2-core host (relative sd of a pair's runs up to 40%), and the median of 5 did not
#: hold the smp-2 ranking: on 2026-11-28, 7 candidates of examples/uml/tune.toml, 5 runs gave
#: pooled Spearman 0.789-0.975 (smp-2 -0.43 to 0.81) over four validations, 11 runs gave
#: 0.944-0.966 (smp-2 0.90-0.96) over three, at 1 min 40 s against 1 min.
DEFAULT_RUNS = 11
MAX_RUNS = 50
MIN_OPS, MAX_OPS = 1_000, 10_000_000
#: What ``speed_source`` = ``uml`` means in the report.
SOURCE_TEXT = ("the real 7.2 allocator in User Mode Linux: median over interleaved runs of "
               "the ns its kmem_cache_alloc/free calls took per alloc+free pair "
               "(ktime brackets, clock cost subtracted) vs the model's ns per pair for the "
               "same document under the UML kernel's profile and the cost table in force, "
               "plus the rig term the calibration fitted with that table (uml_section_ns "
               "per lock section taken with interrupts off)")


def host_cores() -> int:
    """CPUs this process may run on (its affinity), the default ``--uml-max-cpus``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def uml_available() -> str | None:
    """None when ``--target uml`` can run here (the UML kernel built, a static busybox),
    else why not."""
    from slabtune.kernel import uml

    try:
        uml.kernel_image()
        uml.kernel_release()
        uml.find_busybox()
    except SlabtuneError as err:
        return str(err)
    return None


def check_options(runs: int | None, ops: int | None, max_cpus: int | None) -> dict:
    """``--uml-runs``, ``--uml-ops`` and ``--uml-max-cpus`` checked (one error line naming
    the flag), with their defaults filled in."""
    from slabtune.kernel import uml

    out = {"runs": DEFAULT_RUNS if runs is None else runs,
           "ops": uml.DEFAULT_OPS if ops is None else ops,
           "max_cpus": None if max_cpus is None else max_cpus}
    for flag, key, lo, hi in (("--uml-runs", "runs", 1, MAX_RUNS),
                              ("--uml-ops", "ops", MIN_OPS, MAX_OPS),
                              ("--uml-max-cpus", "max_cpus", 1, uml.UML_MAX_CPUS)):
        v = out[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not lo <= v <= hi):
            raise SlabtuneError(f"{flag}: {v!r} is outside {lo}..{hi}")
    return out


def cpu_limit(max_cpus: int | None) -> int:
    """The most virtual CPUs a pair may have: ``max_cpus`` (default: :func:`host_cores`),
    never more than the UML kernel's NR_CPUS."""
    from slabtune.kernel import uml

    return min(max_cpus if max_cpus is not None else host_cores(), uml.nr_cpus())


def expressible(topology, limit: int) -> str | None:
    """None when UML can run ``topology`` (a :class:`slabtune.model.topology.Topology`) as it
    is, else the reason it is skipped."""
    if topology.nodes > 1 or topology.memoryless_nodes:
        return (f"{topology.nodes} nodes: UML has no NUMA (no node to put a CPU or its "
                "memory on), so the model's cross-node costs would have nothing to meet")
    if topology.possible != topology.present or topology.online != topology.present:
        return (f"possible {topology.possible}, present {topology.present}, online "
                f"{topology.online}: UML brings up every CPU it has")
    if topology.present > limit:
        return (f"{topology.present} CPUs: more than the {limit} virtual CPUs allowed here "
                "(the UML kernel's NR_CPUS, and the host cores: a virtual CPU is a host "
                "thread, and threads time-slicing on fewer cores would be timed holding "
                "locks while preempted; --uml-max-cpus raises it)")
    return None


def plan_topologies(spec, max_cpus: int | None) -> tuple[list[str], list[dict]]:
    """The spec's topologies UML runs, and the skipped ones with their reasons."""
    limit = cpu_limit(max_cpus)
    keep, skipped = [], []
    for t in spec.fleet.topologies:
        why = expressible(t.topology, limit)
        if why is None:
            keep.append(t.name)
        else:
            skipped.append({"topology": t.name, "reason": why})
    return keep, skipped


# --------------------------------------------------------------------------- documents


def pair_doc(spec, cand, topology_name: str, profile, per_cache=None) -> tuple[dict, dict]:
    """The simulation document a UML pair runs (the lab's, under the UML kernel's
    profile), and what of the candidate it applies and leaves out."""
    from slabtune.tuner.space import KNOBS
    from slabtune.validate import lab

    doc = lab.validate_doc(spec, cand, topology_name, profile, per_cache)
    applied = dict(doc["policy"]["params"])
    boot = set(dict(cand.boot))
    left = {k: v for k, v in cand.knobs.items()
            if KNOBS[k].reach == "kernel"
            or (k.startswith("cpu_partial_") and "cpu_partial" not in applied)
            or (k.startswith("min_partial_") and "min_partial" not in applied)}
    return doc, {"boot": {k: v for k, v in applied.items() if k in boot},
                 "sysfs": {k: v for k, v in applied.items() if k not in boot},
                 "not_applied": left}


def check_pairs(cands, spec, topologies: Sequence[str]) -> dict:
    """Refuse bad input before anything boots: every candidate's boot parameters against the
    UML kernel's profile, every pair's document against the model's parser and the lab
    module's mapping.  One error line naming the candidate, the topology and the field.
    Returns facts for the manifest."""
    from slabtune.kernel import labmod, uml
    from slabtune.validate import lab

    why = uml_available()
    if why is not None:
        raise SlabtuneError(f"--target uml: {why}")
    prof = uml.kernel_profile()
    for c in cands:
        try:
            uml.checked_boot_params(dict(c.boot))
        except SlabtuneError as err:
            raise SlabtuneError(f"candidate {c.id} (uml): {err}") from None
        per_cache = lab.lab_cache_values(spec, c)
        for t in topologies:
            try:
                doc, _ = pair_doc(spec, c, t, prof, per_cache)
                lab.spec_for(doc, prof)
                labmod.config_params(doc)
            except SlabtuneError as err:
                raise SlabtuneError(f"candidate {c.id} (uml, {t}): {err}") from None
    return {"uml_kernel": uml.UML_KERNEL, "uml_release": uml.kernel_release(),
            "uml_profile": prof.name}


# --------------------------------------------------------------------------- the model


def rig_term(cost_path: str | None = None) -> dict:
    """The rig term UML adds to the cost table's price, as the calibration fitted it with
    that table: the ``uml_section_ns`` the cost file's header names
    (:func:`slabtune.calibrate.umlfit.read_rig`; the packaged ``cost_default.toml``, or
    ``cost_path``).  ``{"values": {name: ns}, "source": text}``; a file that names none
    gives no rig term (the table's price alone), and says so in ``source``."""
    from slabtune.calibrate import umlfit
    from slabtune.sweeps import simconfig

    if cost_path is None:
        text, name = simconfig.default_cost_text(), "cost_default.toml"
    else:
        from slabtune.sweeps.spec import read_text_file

        text, name = read_text_file(cost_path, "--cost"), str(cost_path)
    values = umlfit.read_rig(text, name)
    return {"values": values,
            "source": f"{name} header" if values else f"none named in {name}: the table's "
                                                      "price alone"}


def model_counts(counters_per_pair: Mapping[str, float], list_lock_per_pair: float):
    """The model's events per alloc+free pair as :class:`slabtune.model.cost.SlubCounts`:
    its SLUB_STATS counters (:data:`slabtune.validate.lab.MODEL_COUNTERS`, sheaf refills
    and flushes in objects as 7.x counts them) and its own list_lock sections.  A remote
    free takes no lock on this path, so it is left at 0."""
    from slabtune.model import cost as cost_model
    from slabtune.validate.lab import MODEL_COUNTERS

    vals = dict.fromkeys(cost_model.SlubCounts._fields, 0.0)
    for name, (field, _) in MODEL_COUNTERS.items():
        vals[field] = float(counters_per_pair.get(name, 0.0))
    vals["list_lock"] = float(list_lock_per_pair)
    return cost_model.SlubCounts(**vals)


def predict(docs: Sequence[Mapping[str, Any]], profile, cost=None,
            rig: Mapping[str, Any] | None = None) -> list[dict]:
    """The model's side of each document under ``profile``: ns per alloc+free pair in UML
    (``ns_per_pair``: the table's price, metrics ``ns_per_op`` as ``table_ns_per_pair``,
    plus the rig term per irq-off lock section, :func:`slabtune.calibrate.umlfit.in_rig`
    of :func:`slabtune.calibrate.umlfit.section_events`, ``rig`` from :func:`rig_term`,
    default the packaged table's), the structure, and every counter of
    :data:`slabtune.validate.lab.MODEL_COUNTERS` per pair (the lab's per-1000-ops figures,
    :func:`slabtune.validate.lab.predict`, times 2 / 1000: a pair is two ops)."""
    from slabtune.calibrate import umlfit
    from slabtune.model import cost as cost_model
    from slabtune.sweeps import simconfig
    from slabtune.validate import lab

    if cost is None:
        cost, _ = simconfig.load_cost(None)
    rig = rig_term() if rig is None else rig
    pcp_max = cost_model.pcp_max_order(profile.version)
    out = []
    # UML runs count from empty caches (no warm-up window): the whole run on both sides
    for p in lab.predict([(d, profile) for d in docs], cost, windows=[False] * len(docs)):
        per_pair = {k: v * 2.0 / 1000.0 for k, v in p["counters_per_kop"].items()}
        ev = cost_model.priced_events(model_counts(per_pair,
                                                   p["list_lock_per_kop"] * 2.0 / 1000.0))
        structure = {k: int(p["structure"][k]) for k in
                     ("order", "objs_per_slab", "min_partial", "sheaf_capacity")}
        rig_ev = umlfit.section_events(ev, structure["order"], pcp_max, cost)
        table_ns = float(p["ns_per_op"])
        out.append({"ns_per_pair": umlfit.in_rig(table_ns, rig_ev, rig["values"]),
                    "table_ns_per_pair": table_ns, "rig_events_per_pair": rig_ev,
                    "rig": {"values": dict(rig["values"]), "source": rig["source"]},
                    "profile": p["profile"], "structure": structure,
                    "counters_per_pair": per_pair})
    return out


def rig_note(pred: Mapping[str, Any]) -> str:
    """What a predicted UML figure is made of, for the rows' notes."""
    if "table_ns_per_pair" not in pred:
        return "predicted: the cost table's price alone (stored before the rig term)"
    terms = ", ".join(f"{k} {pred['rig']['values'].get(k, 0.0):g} ns x {n:.4f} per pair"
                      for k, n in pred["rig_events_per_pair"].items())
    return (f"predicted: the table's {pred['table_ns_per_pair']:.1f} ns + the rig term "
            f"({terms}; {pred['rig']['source']})")


def model_task(tds: Sequence[Mapping[str, Any]], spec_text: str, spec_name: str) -> dict:
    """Body of the Ray task that prepares every UML pair in one batch: its document, what it
    applies, and the model's prediction (index -> ``{"doc", "applied", "predicted"}``)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from slabtune.kernel import uml
    from slabtune.validate import lab
    from slabtune.validate.candidates import Candidate
    from slabtune.validate.spec import parse_spec

    spec = parse_spec(spec_text, spec_name)
    prof = uml.kernel_profile()
    per_cand: dict[str, dict] = {}
    out, docs = {}, []
    for td in tds:
        cand = Candidate.from_json(td["candidate"])
        if cand.id not in per_cand:
            per_cand[cand.id] = lab.lab_cache_values(spec, cand)
        doc, applied = pair_doc(spec, cand, td["topology"], prof, per_cand[cand.id])
        docs.append(doc)
        out[td["index"]] = {"doc": doc, "applied": applied}
    for td, pred in zip(tds, predict(docs, prof)):
        out[td["index"]]["predicted"] = pred
    return out


# --------------------------------------------------------------------------- the runs


def run_one(doc: Mapping[str, Any], round_index: int, ops: int,
            timeout_s: float | None = None) -> dict:
    """One UML boot of a pair's document: its timing and counters per pair, or why it
    failed.  ``seed`` is the document's plus the round, so the rounds are independent
    draws of the same workload."""
    from slabtune.kernel import lab_boot, uml

    t0 = time.monotonic()
    params = doc["policy"]["params"]
    boot = {k: v for k, v in params.items() if k not in lab_boot.SYSFS_KNOBS}
    sysfs = {k: int(v) for k, v in params.items() if k in lab_boot.SYSFS_KNOBS}
    try:
        r = uml.run_lab(doc["workload"], cpus=int(doc["topology"]["cpus"]),
                        cache_doc=doc["cache"], ops=ops,
                        seed=int(doc["run"].get("seed", 0)) + round_index,
                        boot_params=boot, sysfs=sysfs,
                        timeout_s=float(timeout_s or uml.DEFAULT_TIMEOUT_S))
    except SlabtuneError as err:
        return {"round": round_index, "ok": False, "error": str(err),
                "seconds": time.monotonic() - t0}
    rec: dict[str, Any] = {"round": round_index, "ok": r.ok, "error": r.error,
                           "seconds": r.seconds, "release": r.release, "cmdline": r.cmdline,
                           "module_params": list(r.params), "host": os.uname().nodename}
    if not r.ok:
        rec["console_tail"] = r.console_tail[-2000:]
        return rec
    t = uml.timing(r)
    deltas = lab_boot.counter_deltas(r)
    pairs = t["pairs"] or 0
    rec.update({k: t[k] for k in ("pairs", "ns_per_pair", "ns_per_pair_all",
                                  "alloc_ns_per_call", "free_ns_per_call", "alloc_long",
                                  "free_long", "clock_ns")})
    rec["counters_per_pair"] = ({k: deltas.get(k, 0) / pairs for k in deltas} if pairs
                                else {})
    rec["structure"] = {k: lab_boot.counter_total(r.dumps.get("after", {}).get(k))
                        for k in ("order", "objs_per_slab", "min_partial", "sheaf_capacity")}
    if rec["ns_per_pair"] is None:
        rec.update(ok=False, error="no timed calls (time_calls records missing)")
    return rec


def run_round(tds: Sequence[Mapping[str, Any]], round_index: int, ops: int,
              timeout_s: float | None = None) -> dict[int, dict]:
    """Body of one round's Ray task: every pair of ``tds`` once, one UML boot after the
    other, starting at position ``round_index`` of the list (the order rotates from round
    to round).  Returns index -> :func:`run_one` record."""
    out: dict[int, dict] = {}
    n = len(tds)
    for k in range(n):
        td = tds[(k + round_index) % n]
        out[td["index"]] = run_one(td["uml"]["doc"], round_index, ops, timeout_s)
    return out


def noise(values: Sequence[float]) -> dict | None:
    """Spread of one pair's repeated runs: the median, the relative standard deviation, the
    relative range and the standard error of the median's neighbourhood (stdev/sqrt(n))."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    med = statistics.median(v)
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return {"n": len(v), "median": med, "min": min(v), "max": max(v),
            "rel_sd": sd / med if med else None,
            "rel_range": (max(v) - min(v)) / med if med else None,
            "stderr": sd / math.sqrt(len(v))}


def pair_rows(td: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], runs_wanted: int
              ) -> list[dict]:
    """Store rows of one pair from its runs: :data:`UML_FIELD` (model with the rig term
    against the median ns per pair of the good runs), :data:`UML_TABLE_FIELD` (the table's
    price alone, not comparable), :data:`UML_ALL_FIELD` (measured only) and one
    ``uml_counters.<name>`` row per SLUB_STATS counter the model has (medians per pair).
    A pair without a good run is one failed row with the first error and console tail."""
    from slabtune.kernel.guest import CONSOLE_TAIL_CHARS
    from slabtune.kernel.uml import UML_KERNEL
    from slabtune.validate.schema import TASK_FIELD, row

    good = [r for r in runs if r.get("ok")]
    pred = td["uml"]["predicted"]
    applied = json.dumps({**td["uml"]["applied"],
                          "cmdline": good[0].get("cmdline") if good else None}, sort_keys=True)
    seconds = sum(float(r.get("seconds") or 0.0) for r in runs)
    common = {"accelerator": "uml", "attempts": len(runs), "seconds": seconds,
              "applied": applied, "profile": pred["profile"],
              "cache": td["uml"]["doc"]["cache"].get("name")
              or f"size-{td['uml']['doc']['cache'].get('size')}",
              "kernel": UML_KERNEL, "config_hash": None}
    if not good:
        bad = runs[0] if runs else {"error": "no run"}
        return [row(dict(td), **common, status="failed", field=TASK_FIELD,
                    error=f"no good run of {len(runs)}: {bad.get('error') or 'failed'}",
                    console_tail=(bad.get("console_tail") or "")[-CONSOLE_TAIL_CHARS:],
                    comparable=False)]
    common["kernel_release"] = good[0].get("release")
    ns = noise([r["ns_per_pair"] for r in good])
    failed = [r for r in runs if not r.get("ok")]
    note = (f"{len(good)} of {runs_wanted} runs good"
            + (f" ({len(failed)} failed: {failed[0].get('error')})" if failed else "")
            + "; ns per pair by round: "
            + ", ".join(f"{r['ns_per_pair']:.1f}" for r in sorted(good, key=lambda r: r["round"]))
            + f"; relative sd {ns['rel_sd']:.3f}")
    out = [row(dict(td), **common, field=UML_FIELD, predicted=float(pred["ns_per_pair"]),
               measured=ns["median"], unit="ns per alloc+free pair", comparable=True,
               note=f"{note}; {rig_note(pred)}"),
           *([row(dict(td), **common, field=UML_TABLE_FIELD,
                  predicted=float(pred["table_ns_per_pair"]), measured=ns["median"],
                  unit="ns per alloc+free pair", comparable=False,
                  note="the cost table's price alone, without the rig term")]
             if "table_ns_per_pair" in pred else []),
           row(dict(td), **common, field=UML_ALL_FIELD, predicted=None,
               measured=statistics.median(float(r["ns_per_pair_all"]) for r in good),
               unit="ns per alloc+free pair", comparable=False,
               note="every bracket, those above long_ns (a preempted host thread) included; "
                    "long brackets per run: "
                    + ", ".join(str(int(r.get("alloc_long", 0)) + int(r.get("free_long", 0)))
                                for r in good))]
    for name in sorted(pred["counters_per_pair"]):
        # a counter the kernel has no file for (cpu_partial_drain on 7.x) is not measured
        have = all(name in r.get("counters_per_pair", {}) for r in good)
        vals = [float(r["counters_per_pair"][name]) for r in good] if have else []
        out.append(row(dict(td), **common, field=UML_COUNTER_PREFIX + name,
                       predicted=float(pred["counters_per_pair"][name]),
                       measured=statistics.median(vals) if vals else None,
                       unit="events per pair", comparable=have))
    return out


def dispatch(run, tds: list[dict], spec, opts: Mapping[str, Any], timeout_s: float | None,
             node_cpus: int, store) -> int:
    """Run the rounds of every pending UML pair (``tds``, their ``uml`` entries filled by
    :func:`model_task`) and store each pair's rows once its last round is in; returns the
    number of failed pairs.  Runs already kept in the manifest (``uml_runs``: a resumed run)
    count, so a pair gets exactly ``opts["runs"]`` runs.  ``store(td, rows)`` writes a
    pair's part."""
    import ray

    from slabtune.validate.dispatch import ray_failure
    from slabtune.validate.schema import MAX_RETRIES

    kept = run.manifest.setdefault("uml_runs", {})
    runs_wanted = int(opts["runs"])
    use_resource = UML_RESOURCE in ray.cluster_resources()
    remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=[OSError])(run_round)
    ropts: dict[str, Any] = {"num_cpus": max(1, node_cpus)}
    if use_resource:
        ropts["resources"] = {UML_RESOURCE: 1}
    for r in range(runs_wanted):
        todo = [td for td in tds
                if not any(x["round"] == r for x in kept.get(str(td["index"]), []))]
        if not todo:
            continue
        try:
            got = ray.get(remote.options(**ropts).remote(todo, r, int(opts["ops"]),
                                                         timeout_s))
        except ray.exceptions.RayError as err:
            msg, _ = ray_failure(err)
            got = {td["index"]: {"round": r, "ok": False, "error": msg} for td in todo}
        for i, rec in got.items():
            kept.setdefault(str(i), []).append(rec)
        run.save()
    failed = 0
    for td in tds:
        runs = sorted(kept.get(str(td["index"]), []), key=lambda x: x["round"])
        release = next((x.get("release") for x in runs if x.get("ok")), None)
        failed += store(td, pair_rows(td, runs, runs_wanted), uml_doc=td["uml"]["doc"],
                        uml_release=release)
    return failed


# --------------------------------------------------------------------------- report


def summary(rows, manifest: Mapping[str, Any] | None = None) -> dict:
    """The UML part of a report, from store rows: Spearman of predicted against measured
    ns per pair, the ceiling ties allow, the absolute agreement (``ratio``: predicted over
    measured ns per pair, median, least and most; :func:`ratios`), the same two figures
    for the cost table's price alone (``table_alone``, where the rows have it), the repeat
    noise (relative standard deviation of
    each pair's runs: median and worst; median standard error in ns), each pair's figures,
    and the topologies skipped with their reasons."""
    import polars as pl

    from slabtune.validate.report import spearman, spearman_ceiling

    manifest = manifest or {}
    use = rows.filter((pl.col("target") == "uml") & (pl.col("status") == "ok")
                      & (pl.col("field") == UML_FIELD) & pl.col("predicted").is_not_null()
                      & pl.col("measured").is_not_null()).sort("task")
    failed = rows.filter((pl.col("target") == "uml") & (pl.col("status") == "failed")).height
    kept = manifest.get("uml_runs") or {}
    table = dict(rows.filter((pl.col("target") == "uml") & (pl.col("status") == "ok")
                             & (pl.col("field") == UML_TABLE_FIELD)
                             & pl.col("predicted").is_not_null())
                 .select("task", "predicted").iter_rows())
    pairs, rel_sd, stderr = [], [], []
    for r in use.iter_rows(named=True):
        good = [x["ns_per_pair"] for x in kept.get(str(r["task"]), []) if x.get("ok")]
        nz = noise(good)
        if nz is not None and nz["n"] > 1:
            rel_sd.append(nz["rel_sd"])
            stderr.append(nz["stderr"])
        pairs.append({"task": r["task"], "candidate": r["candidate"], "topology": r["topology"],
                      "predicted_ns": r["predicted"], "measured_ns": r["measured"],
                      "ratio": r["predicted"] / r["measured"] if r["measured"] else None,
                      "table_ns": table.get(r["task"]),
                      "runs": nz["n"] if nz else None,
                      "rel_sd": nz["rel_sd"] if nz else None,
                      "rel_range": nz["rel_range"] if nz else None})
    p, m = use["predicted"].to_list(), use["measured"].to_list()
    res = statistics.median(stderr) if stderr else None
    with_table = [(table[t], x) for t, x in zip(use["task"].to_list(), m) if t in table]
    out = {"pairs": use.height, "failed": failed,
           "candidates": use["candidate"].n_unique(),
           "spearman": spearman(p, m), "spearman_ceiling": spearman_ceiling(p),
           "ratio": ratios(p, m),
           "table_alone": ({"pairs": len(with_table),
                            "spearman": spearman(*map(list, zip(*with_table))),
                            "ratio": ratios(*map(list, zip(*with_table)))}
                           if with_table else None),
           "distinct_predictions": len(set(p)),
           "noise": {"median_rel_sd": statistics.median(rel_sd) if rel_sd else None,
                     "worst_rel_sd": max(rel_sd) if rel_sd else None,
                     "median_stderr_ns": res},
           "by_topology": {}, "skipped_topologies": list(manifest.get("spec", {})
                                                         .get("uml_skipped") or []),
           "repredicted": False,
           "pair_table": pairs}
    for topo, g in sorted(use.group_by("topology"), key=lambda kv: str(kv[0])):
        out["by_topology"][str(topo[0])] = {
            "pairs": g.height, "spearman": spearman(g["predicted"].to_list(),
                                                    g["measured"].to_list())}
    return out


def ratios(predicted: Sequence[float], measured: Sequence[float]) -> dict | None:
    """Predicted over measured ns per pair: median, least and most (None without a pair
    measured above 0)."""
    r = [a / b for a, b in zip(predicted, measured) if b]
    if not r:
        return None
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def format_summary(s: Mapping[str, Any]) -> list[str]:
    """Text lines of :func:`summary` (nothing for a run without UML rows)."""
    if not s["pairs"] and not s["failed"] and not s["skipped_topologies"]:
        return []

    def f(x, pct=False):
        if x is None:
            return "n/a"
        return f"{100 * x:.1f}%" if pct else f"{x:.3f}"

    def fr(r):
        return "n/a" if not r else (f"median {r['median']:.2f} "
                                    f"({r['min']:.2f}-{r['max']:.2f})")

    nz = s["noise"]
    lines = [f"uml (the real 7.2 allocator, timed natively): {s['pairs']} pairs of "
             f"{s['candidates']} candidates, {s['failed']} failed; Spearman "
             f"{f(s['spearman'])} (ceiling {f(s['spearman_ceiling'])}, "
             f"{s['distinct_predictions']} distinct predictions)"
             + (" [predictions recomputed by today's model]" if s["repredicted"] else ""),
             f"  predicted / measured ns per pair (the model's price plus UML's rig term per "
             f"irq-off lock section): {fr(s.get('ratio'))}"
             + (f"; the table's price alone: {fr(s['table_alone']['ratio'])}, Spearman "
                f"{f(s['table_alone']['spearman'])}" if s.get("table_alone") else ""),
             f"  repeat noise: relative sd median {f(nz['median_rel_sd'], True)}, worst "
             f"{f(nz['worst_rel_sd'], True)}; median standard error "
             f"{f(nz['median_stderr_ns'])} ns"]
    for topo, t in s["by_topology"].items():
        lines.append(f"  {topo}: {t['pairs']} pairs, Spearman {f(t['spearman'])}")
    for sk in s["skipped_topologies"]:
        lines.append(f"  skipped topology {sk['topology']}: {sk['reason']}")
    for p in s["pair_table"]:
        lines.append(f"    {p['candidate']!s:<14} {p['topology']!s:<14} predicted "
                     f"{p['predicted_ns']:8.1f} ns  measured {p['measured_ns']:8.1f} ns  "
                     + (f"(x{p['ratio']:.2f}) " if p.get("ratio") else "")
                     + f"(runs {p['runs']}, rel sd {f(p['rel_sd'], True)})")
    return lines


def repredict(run, rows, cost_path: str | None = None):
    """``rows`` with the predicted side of every UML row computed again by today's model
    (under the profile of the release each pair ran, the cost table in force or
    ``cost_path``) from the documents stored with the run: how a model change moves the
    UML figures without booting anything.  Imports JAX."""
    import polars as pl

    from slabtune.model import profiles
    from slabtune.sweeps import simconfig

    cost, _ = simconfig.load_cost(cost_path)
    rig = rig_term(cost_path)
    states = run.manifest["chunks"]["states"]
    items = []
    for i, st in states.items():
        if st.get("target") == "uml" and st.get("uml_doc") is not None \
                and st.get("status") == "ok":
            items.append((int(i), st["uml_doc"], st.get("uml_release")))
    if not items:
        return rows
    by_profile: dict[str, list] = {}
    for it in items:
        by_profile.setdefault(it[2] or "", []).append(it)
    new: dict[int, dict] = {}
    for release, group in by_profile.items():
        prof = profiles.detect_profile(release)
        for (i, _, _), pred in zip(group, predict([d for _, d, _ in group], prof, cost, rig)):
            new[i] = pred
    keys = []
    for i, pred in new.items():
        keys.append((i, UML_FIELD, pred["ns_per_pair"], pred["profile"]))
        keys.append((i, UML_TABLE_FIELD, pred["table_ns_per_pair"], pred["profile"]))
        for name, v in pred["counters_per_pair"].items():
            keys.append((i, UML_COUNTER_PREFIX + name, v, pred["profile"]))
    upd = pl.DataFrame(keys, schema={"task": pl.Int64, "field": pl.String,
                                     "_pred": pl.Float64, "_prof": pl.String}, orient="row")
    out = rows.join(upd, on=["task", "field"], how="left")
    return out.with_columns(
        pl.when(pl.col("_pred").is_not_null()).then(pl.col("_pred"))
        .otherwise(pl.col("predicted")).alias("predicted"),
        pl.when(pl.col("_prof").is_not_null()).then(pl.col("_prof"))
        .otherwise(pl.col("profile")).alias("profile")).drop("_pred", "_prof").select(
        rows.columns)
