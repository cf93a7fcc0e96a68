"""The native validation task: every native pair in one batch, counters in lockstep with the
model, timing rounds interleaved with the rig's calibration runs, and the rig cost fit
(docs/VALIDATION.md, "Native speed").
"""


from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.validate.candidates import Candidate, applied_values
from slabtune.validate.schema import failed_rows, row
from slabtune.validate.spec import ValidateSpec, parse_spec


def check_workload(sim) -> None:
    """Build the native pair's model workload once, so a kind that cannot run on a topology
    (producer_consumer on one CPU) is refused before anything starts."""
    from slabtune.model import workloads

    try:
        workloads.build(sim.workload_kind, sim.topology, **sim.workload_params)
    except workloads.WorkloadError as err:
        raise SlabtuneError(f"validate.native.workload: {err}") from None


def native_doc(spec: ValidateSpec, cand: Candidate, topology_name: str,
               per_cache: Mapping[str, int] | None = None) -> tuple[dict, dict]:
    """The sweeps/simconfig.py document of one native (candidate, topology) pair, and what
    of the candidate it applies and leaves out.  ``per_cache`` holds the candidate's
    per-cache values of the native cache (:func:`slabtune.tuner.objectives.cache_values`);
    without it the sysfs knobs are left out (enough to check the document up front)."""
    from slabtune.tuner.space import KNOBS

    params = applied_values(spec, cand, per_cache)
    left = {k: v for k, v in cand.knobs.items() if KNOBS[k].reach == "kernel"}
    return native_policy_doc(spec, topology_name, params), {"applied": dict(params),
                                                            "not_applied": left}


def native_policy_doc(spec: ValidateSpec, topology_name: str, params: Mapping[str, int]) -> dict:
    """The sweeps/simconfig.py document of the spec's native cache and workload on one
    topology under policy ``params`` (boot parameters, min_partial, cpu_partial)."""
    nat = spec.native
    t = spec.topology(topology_name)
    topo = {"cpus": t.present, "nodes": t.nodes, "node_cpus": list(t.node_cpus),
            "memoryless_nodes": list(t.memoryless_nodes), "possible": t.possible,
            "online": t.online}
    if t.distances is not None:
        topo["distances"] = [list(r) for r in t.distances]
    return {"topology": topo, "cache": {"name": nat["cache"]},
            "policy": {"profile": spec.fleet.profile.name, "params": dict(params)},
            "workload": dict(nat["workload"]),
            "run": {"steps": nat["steps"], "seed": nat["seed"]}}


def native_model_task(tasks: Sequence[dict], spec_text: str, spec_name: str) -> dict:
    """Body of the Ray task that predicts every native pair and the rig's calibration
    configurations in one batch (one simulation, one compilation): ``{"pairs": index ->
    {"spec_native", "native": {"doc", "applied", "model"}}, "calibration": [...],
    "pcp_batch"}``.  A pair's model holds its ns per pair under the packaged cost table
    (``ns_per_op``), under the prior constants (``ns_per_op_prior``) and under each unit
    rig table (``rig_features``, :mod:`slabtune.validate.rigcost`); each calibration entry its
    topology, policy params, simconfig document and features.  Runs in a worker so the
    driver never imports JAX."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from slabtune.sweeps import simconfig, simulate
    from slabtune.tuner import objectives
    from slabtune.validate import rigcost

    spec = parse_spec(spec_text, spec_name)
    docs = []
    for t in tasks:
        cand = Candidate.from_json(t["candidate"])
        per_cache = objectives.cache_values(spec.fleet, cand.params())[spec.native["cache"]]
        docs.append(native_doc(spec, cand, t["topology"], per_cache))
    cost, _ = simconfig.load_cost()
    sims = [simconfig.parse_doc(d) for d, _ in docs]
    cal_sims, cal = calibration_set(spec, [(t["topology"], s) for t, s in zip(tasks, sims)])
    every = sims + cal_sims
    simulated = simulate.simulate_specs(every)
    pcp_batch = float(cost.pcp_batch)
    feats = rigcost.features_of(every, pcp_batch, simulated)
    preds = simulate.metrics_of(every, *simulated, cost)
    prior = simulate.metrics_of(every, *simulated, prior_cost(cost))
    n = len(sims)
    pick = rigcost.choose_calibration(feats[n:], feats[:n], int(spec.native["calibration_runs"]),
                                      first=len(rigcost.CAL_ORDERS))
    keep = ("ns_per_op", "throughput_ops_per_us", "alloc_fastpath_frac", "free_fastpath_frac",
            "order", "objs_per_slab", "min_partial", "cpu_partial")
    pairs = {t["index"]: {"spec_native": dict(spec.native),
                          "native": {"doc": doc, "applied": applied,
                                     "model": {**{k: pred[k] for k in keep},
                                               "ns_per_op_prior": rigcost.model_pair_ns(pp),
                                               "rig_features": feats[i].tolist()}}}
             for i, (t, (doc, applied), pred, pp) in enumerate(zip(tasks, docs, preds, prior))}
    cal = [cal[j] for j in pick]
    for j, c in zip(pick, cal):
        c["features"] = feats[n + j].tolist()
        c["model"] = {k: preds[n + j][k] for k in keep}
    return {"pairs": pairs, "calibration": cal, "pcp_batch": pcp_batch}


def calibration_set(spec: ValidateSpec, pairs: Sequence[tuple[str, Any]]
                    ) -> tuple[list, list[dict]]:
    """The pool the rig's calibration is chosen from
    (:func:`slabtune.validate.rigcost.choose_calibration`): the entries of
    :func:`slabtune.validate.rigcost.calibration_policies` whose effective native
    configuration (:func:`slabtune.validate.rigcost.native_key`) is neither a validated pair's
    (``pairs``: topology name and SimSpec of each) nor an earlier entry's.  Returns their
    SimSpecs and ``{"topology", "params", "doc", "key"}`` entries."""
    from slabtune.sweeps import simconfig
    from slabtune.validate import native, rigcost

    nat = spec.native
    n = int(nat["calibration_runs"])
    taken = {rigcost.native_key(topo, native.sim_config_for_spec(sim)) for topo, sim in pairs}
    sims, out = [], []
    for topo, params in rigcost.calibration_policies(n, int(nat["calibration_seed"]),
                                                [t.name for t in spec.fleet.topologies],
                                                spec.fleet.profile.has_cpu_partial):
        doc = native_policy_doc(spec, topo, params)
        sim = simconfig.parse_doc(doc)
        key = rigcost.native_key(topo, native.sim_config_for_spec(sim))
        if key in taken:
            continue
        taken.add(key)
        sims.append(sim)
        out.append({"topology": topo, "params": params, "doc": doc, "key": list(key)})
    return sims, out


def prior_cost(cost):
    """``cost`` with every constant at its prior value (:data:`slabtune.model.priors.PRIOR`:
    order-of-magnitude values inside each constant's physical range), for the labelled
    diagnostic beside the packaged constants (cost_default.toml lists the packaged ones that
    are not physical, e.g. free_fast_ns > free_slow_ns)."""
    from slabtune.model import priors

    return cost._replace(**{k: float(v) for k, v in priors.prior_values().items()
                            if k in cost._fields})


def timing_cpu() -> int:
    """The CPU every thread of a timing run is pinned to: the lowest this process may run
    on (the worker's own affinity, so a cluster node's restrictions hold)."""
    return min(os.sched_getaffinity(0))


def _native_counter_rows(td: dict, timeout: float) -> tuple[list[dict], Any]:
    """The counters run of one native pair (threads in lockstep with the model's steps):
    fast-path rows, and the binary's configuration for the timing runs."""
    from slabtune.sweeps import simconfig
    from slabtune.validate import native

    nat = td["native"]
    sim = simconfig.parse_doc(nat["doc"])
    cfg = native.config_for_spec(sim)
    res = native.run(cfg, timeout=timeout)
    fa, ff = native.fastpath_fractions(res, cfg.rep_weight)
    m = nat["model"]
    common = _native_common(td, sim, res.threads)
    return [
        row(td, **common, field="alloc_fastpath_pct",
             predicted=100.0 * float(m["alloc_fastpath_frac"]), measured=100.0 * fa, unit="%"),
        row(td, **common, field="free_fastpath_pct",
             predicted=100.0 * float(m["free_fastpath_frac"]), measured=100.0 * ff, unit="%"),
    ], cfg


def _native_common(td: dict, sim, threads: int) -> dict:
    nat = td["native"]
    return {"accelerator": "native", "attempts": 1,
            "applied": json.dumps(nat["applied"], sort_keys=True), "profile": sim.profile.name,
            "cache": sim.cache.name, "comparable": True,
            "note": f"{threads} threads; counters {nat['doc']['run']['steps']} steps in lockstep"}


def run_native_batch(tds: Sequence[dict], calibration: Sequence[dict] = (),
                     pcp_batch: float | None = None) -> dict:
    """Body of the one Ray task that runs every native pair (after the guest and host tasks
    have finished, so no guest competes for the cores): ``{"rows": index -> rows, "rig":
    the rig cost table's fit}``.

    1. Counters: each pair once in lockstep with the model (fast-path rows).
    2. Timing: ``timing_repeats`` rounds, each running every pair and every calibration
       configuration (``calibration``, from :func:`native_model_task`) once, the two kinds
       interleaved, so load from other work on the machine falls on both alike.  A timing
       run has the binary time each slab_alloc()/slab_free() call on its own (``time_ops``:
       not the workload driver, its hand-over queues or thread start-up), every thread
       pinned to one CPU (:func:`timing_cpu`: the reps time-slice on one core instead of
       outnumbering the machine's cores; a call that spans a time slice is left out),
       threads free-running for ``timing_steps`` steps.  The measured figure of a pair or a
       calibration configuration is the median over rounds of the ns spent in the
       allocator per alloc+free pair (:func:`slabtune.validate.native.op_ns_per_pair`).
    3. The rig table: the calibration medians fitted against their features
       (:func:`rig_fit`).  ``native_cost`` is a pair's measurement against the model under
       that table (its features x the fitted constants); ``native_cost_packaged`` (the
       packaged server table) and ``native_cost_prior`` (the prior constants,
       :func:`prior_cost`) put the same measurement beside the model under the other
       tables: labelled diagnostics, not counted.
    A pair whose run fails leaves one failed row; the others go on.  A calibration run that
    fails is left out of the fit and listed with its error.

    The steps are :func:`_counter_runs`, :func:`_timing_config` and
    :func:`_calibration_configs`, :func:`_timing_rounds`, :func:`rig_fit`,
    :func:`_pair_rows` and :func:`_span_check`."""
    out, cfgs, t0 = _counter_runs(tds)
    live = [td for td in tds if td["index"] in cfgs]
    if not live:
        return {"rows": out, "rig": None}
    sn = live[0]["spec_native"]
    timeout = float(live[0].get("timeout_s") or 300.0)
    pin = timing_cpu()
    tcfg = {td["index"]: _timing_config(cfgs[td["index"]], sn, pin) for td in live}
    cal = _calibration_configs(calibration, sn, pin)
    times, dropped, failed = _timing_rounds(live, cfgs, tcfg, cal, int(sn["timing_repeats"]),
                                            timeout)
    steps = int(sn["timing_steps"])
    rig = rig_fit(cal, pcp_batch, steps=steps, cpu=pin)
    for td in live:
        i = td["index"]
        if i in failed:
            out[i] = failed_rows(td, f"timing: {failed[i]}", seconds=time.monotonic() - t0[i])
            continue
        out[i] = _pair_rows(td, out[i], tcfg[i], times[i], dropped[i], pin, rig, t0[i])
    _span_check(rig, live, failed)
    return {"rows": out, "rig": rig}


def _counter_runs(tds: Sequence[dict]) -> tuple[dict[int, list[dict]], dict[int, Any],
                                                 dict[int, float]]:
    """Step 1 of :func:`run_native_batch`: each pair's counters run, in lockstep with the
    model (:func:`_native_counter_rows`).  Returns the rows by pair index (fast-path rows,
    or one failed row), the binary's configuration of every pair whose run succeeded, and
    each pair's start time (``time.monotonic``)."""
    out: dict[int, list[dict]] = {}
    cfgs: dict[int, Any] = {}
    t0 = {td["index"]: time.monotonic() for td in tds}
    for td in tds:
        timeout = float(td.get("timeout_s") or 300.0)
        try:
            out[td["index"]], cfgs[td["index"]] = _native_counter_rows(td, timeout)
        except SlabtuneError as err:
            out[td["index"]] = failed_rows(td, str(err), seconds=time.monotonic() - t0[td["index"]])
    return out, cfgs, t0


def _timing_config(cfg, sn: Mapping[str, Any], pin: int):
    """A configuration of the binary as a timing run: every allocator call timed alone
    (``time_ops``), every thread pinned to CPU ``pin``, the spec's (``sn``, its
    ``[validate.native]`` table) ``timing_steps`` and ``timing_sync_every``."""
    return dataclasses.replace(cfg, sync_every=int(sn["timing_sync_every"]),
                               steps=int(sn["timing_steps"]), time_ops=1, pin_cpu=pin)


def _calibration_configs(calibration: Sequence[dict], sn: Mapping[str, Any],
                         pin: int) -> list[dict]:
    """The calibration entries (copies) ready for the timing rounds: each with ``runs``
    (ns per pair, one per round) and ``dropped``, and its timing run's configuration
    ``cfg``, or ``error`` where its document does not give one."""
    from slabtune.sweeps import simconfig
    from slabtune.validate import native

    cal = [dict(c) for c in calibration]
    for c in cal:
        c.update(runs=[], dropped=0)
        try:
            c["cfg"] = _timing_config(native.config_for_spec(simconfig.parse_doc(c["doc"])),
                                      sn, pin)
        except SlabtuneError as err:
            c["error"] = str(err)
    return cal


def _interleaved_order(n_pairs: int, n_cal: int) -> list[tuple[float, int, int]]:
    """One timing round's order: ``(position, kind, k)`` with kind 0 for pair ``k`` and 1
    for calibration run ``k``, the two lists spread over the round by their position."""
    # pairs and calibration runs in one round, interleaved by their position in their list
    return sorted([((k + 0.5) / n_pairs, 0, k) for k in range(n_pairs)]
                  + [((k + 0.5) / n_cal, 1, k) for k in range(n_cal)])


def _timed_run(cfg, weights, timeout: float) -> tuple[float, int]:
    """One timing run: the ns in the allocator per alloc+free pair (reps weighted by
    ``weights``) and the calls left out for spanning a time slice."""
    from slabtune.validate import native

    r = native.run(cfg, timeout=timeout)
    return native.op_ns_per_pair(r, weights), int(r.raw.get("op_dropped", 0))


def _time_calibration(c: dict, timeout: float) -> None:
    """One round's run of calibration entry ``c``: a measurement appended to its ``runs``,
    or its ``error`` set (a failed entry runs no more)."""
    if "error" in c:
        return
    try:
        ns, dropped = _timed_run(c["cfg"], c["cfg"].rep_weight, timeout)
        c["runs"].append(ns)
        c["dropped"] += dropped
    except SlabtuneError as err:
        c["error"] = str(err)


def _timing_rounds(live: Sequence[dict], cfgs: Mapping[int, Any], tcfg: Mapping[int, Any],
                   cal: list[dict], repeats: int, timeout: float
                   ) -> tuple[dict[int, list[float]], dict[int, int], dict[int, str]]:
    """Step 2 of :func:`run_native_batch`: ``repeats`` rounds, each timing every live pair
    (its configuration ``tcfg``, reps weighted as in ``cfgs``) and every calibration entry
    once, interleaved (:func:`_interleaved_order`).  Returns per pair index its ns per
    pair of each round and its calls left out, and the error of each pair whose timing
    failed (it runs no more); the calibration entries are updated in place."""
    times: dict[int, list[float]] = {td["index"]: [] for td in live}
    dropped: dict[int, int] = {td["index"]: 0 for td in live}
    failed: dict[int, str] = {}
    order = _interleaved_order(len(live), len(cal))
    for _ in range(repeats):
        for _, kind, k in order:
            if kind == 1:
                _time_calibration(cal[k], timeout)
                continue
            td = live[k]
            i = td["index"]
            if i in failed:
                continue
            try:
                ns, n_dropped = _timed_run(tcfg[i], cfgs[i].rep_weight,
                                           float(td.get("timeout_s") or 300.0))
                times[i].append(ns)
                dropped[i] += n_dropped
            except SlabtuneError as err:
                failed[i] = str(err)
    return times, dropped, failed


def _pair_rows(td: dict, counter_rows: list[dict], tcfg, v: list[float], dropped: int,
               pin: int, rig: dict, t0: float) -> list[dict]:
    """A timed pair's rows: its counter rows with the task's seconds, then the median of
    its runs ``v`` against the model under the rig table (``native_cost``; not comparable
    when there is no table), the packaged table and the prior constants (labelled
    diagnostics, not comparable)."""
    from slabtune.validate import rigcost

    m = td["native"]["model"]
    med = statistics.median(v)
    common = {"accelerator": "native", "attempts": 1, "comparable": True,
              "applied": counter_rows[0]["applied"], "profile": counter_rows[0]["profile"],
              "cache": counter_rows[0]["cache"], "unit": "ns in the allocator per alloc+free pair",
              "note": f"allocator calls timed alone, {len(v)} interleaved runs x "
                      f"{tcfg.steps} steps, threads on CPU {pin}; runs "
                      + ", ".join(f"{x:.1f}" for x in v)
                      + f"; {dropped} calls over 50 us left out"}
    seconds = time.monotonic() - t0
    if rig["constants"] is not None:
        rig_pred = float(rigcost.predict(m["rig_features"], rig["constants"], rig["names"])[0])
        rig_row = {}
    else:
        rig_pred, rig_row = None, {"comparable": False,
                                   "note": f"{common['note']}; no rig table: {rig['error']}"}
    return [{**r, "seconds": seconds} for r in counter_rows] + [
        row(td, **{**common, **rig_row}, seconds=seconds, field="native_cost",
             predicted=rig_pred, measured=med),
        row(td, **{**common, "comparable": False}, seconds=seconds,
             field="native_cost_packaged", predicted=float(m["ns_per_op"]), measured=med),
        row(td, **{**common, "comparable": False}, seconds=seconds,
             field="native_cost_prior", predicted=float(m["ns_per_op_prior"]), measured=med),
    ]


def _span_check(rig: dict, live: Sequence[dict], failed: Mapping[int, str]) -> None:
    """With a rig table, ``rig["pairs_outside_span"]``: how far the timed pairs' features
    lie outside the span of the measured calibration runs' features
    (:func:`slabtune.validate.rigcost.span_residual`)."""
    from slabtune.validate import rigcost

    if rig["constants"] is not None:
        pf = [td["native"]["model"]["rig_features"] for td in live if td["index"] not in failed]
        rig["pairs_outside_span"] = rigcost.span_residual([c["features"] for c in rig["calibration"]
                                                      if c.get("measured") is not None], pf)


def rig_fit(cal: Sequence[dict], pcp_batch: float | None, steps: int, cpu: int) -> dict:
    """The rig cost table from measured calibration runs (each with ``features``, ``runs``
    and maybe an ``error``): :func:`slabtune.validate.rigcost.fit` of their medians, and what
    the run stores of it (``native_rig`` in the manifest: constants, R^2, what was not
    identified, every calibration configuration with its runs, median and fitted value).
    ``constants`` is None, with ``error``, when fewer than 2 calibration runs succeeded."""
    from slabtune.model import cost as cost_model
    from slabtune.validate import rigcost

    ok = [c for c in cal if "error" not in c and c["runs"]]
    entries = [{"topology": c["topology"], "params": c["params"], "key": c.get("key"),
                "features": c["features"], "runs": [float(x) for x in c["runs"]],
                "dropped": c.get("dropped", 0), "error": c.get("error"),
                "measured": statistics.median(c["runs"]) if c["runs"] and "error" not in c
                else None} for c in cal]
    rig: dict[str, Any] = {
        "names": list(cost_model.RIG_FREE), "unit": "ns in the allocator per alloc+free pair",
        "pcp_batch": pcp_batch, "timing_steps": steps, "cpu": cpu,
        "table": "rig: line_local_ns = line_remote_ns = 0, queueing = 0 (no waits)",
        "calibration": entries, "constants": None, "error": None}
    if len(ok) < 2:
        rig["error"] = f"{len(ok)} of {len(cal)} calibration runs succeeded (2 needed)"
        return rig
    f = rigcost.fit([c["features"] for c in ok], [statistics.median(c["runs"]) for c in ok],
               rig["names"])
    fitted = iter(f["fitted"])
    for e in entries:
        e["fitted"] = next(fitted) if e["measured"] is not None else None
    rig.update({k: f[k] for k in ("constants", "stderr", "fitted_constants",
                                  "not_identified", "aliased", "rank", "r2", "runs")})
    return rig
