"""``slabtune reproduce``: the seed scenarios, published figures beside the model's.

The scenarios are data (:mod:`slabtune.model.scenarios`), the comparison logic is
:mod:`slabtune.calibrate.reproduce`, the cost fit :mod:`slabtune.validate`; this module only
prints (and writes the ``--fit-cost`` file)."""

from __future__ import annotations

import shlex

from slabtune.commands import jsonout
from slabtune.model.scenarios import DEFAULT_WORK, WORK_MODES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce", help="reproduce the seed scenarios (published vs model)",
        description="Run every seed scenario through the model and print, per row, the "
                    "published figure and ratio beside the model's, whether the direction "
                    "agrees, and each scenario's one fitted scale constant.")
    p.add_argument("--cost", metavar="FILE",
                   help="cost constants overriding the packaged cost_default.toml")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of row objects; " + jsonout.NON_FINITE_HELP)
    p.add_argument("--work", choices=WORK_MODES, default=DEFAULT_WORK,
                   help="work outside the allocator per op on the arms: derived (default; "
                        "each scenario's other_ns, derived from the seed's published rate "
                        "and printed with the scenario) or none (the arms only allocate "
                        "and free, at allocator speed)")
    p.add_argument("--fit-cost", metavar="OUT.toml",
                   help="fit the free cost constants of slabtune.validate (each within "
                        "its physical range, the rest at their prior values) to the headline "
                        "ratios, write the complete cost table to OUT.toml and print the "
                        "ratios before (packaged or --cost constants) and after; with --json, "
                        "one summary object")
    p.set_defaults(func=_reproduce)


def _reproduce(args) -> int:
    from slabtune.calibrate import reproduce
    from slabtune.commands.paths import output_file
    from slabtune.sweeps import simconfig

    if args.fit_cost:
        output_file("--fit-cost", args.fit_cost)
    cost, meta = simconfig.load_cost(args.cost)
    if args.fit_cost:
        return _fit_cost(args, cost, meta)
    out = reproduce.evaluate(cost=cost, cost_meta=meta, work=args.work)
    if args.json:
        print(jsonout.dumps(out["rows"]))
    else:
        print(format_report(out))
    return 0


def _fit_cost(args, cost, meta) -> int:
    """``--fit-cost``: simulate once, report before, fit, write, report after."""
    from slabtune.calibrate import fitcost, reproduce
    from slabtune.model import priors
    from slabtune.results.safeio import write_atomic
    from slabtune.sweeps import simconfig

    path = fitcost.check_out_path(args.fit_cost)
    arms = reproduce.simulate_arms(work=args.work)
    before = reproduce.evaluate(cost=cost, cost_meta=meta, arms=arms)
    result = fitcost.fit(arms)
    # The work mode is always written: the file stays remakeable if the default changes.
    write_atomic(path, fitcost.to_toml(
        result, shlex.join(["slabtune", "reproduce", "--work", args.work,
                            "--fit-cost", args.fit_cost])), "--fit-cost")
    new_cost, new_meta = simconfig.load_cost(path)
    after = reproduce.evaluate(cost=new_cost, cost_meta=new_meta, arms=arms)
    old = {k: float(v) for k, v in cost._asdict().items()}
    summary = {
        "file": str(path), "work": args.work, "free": list(result.free),
        "values": result.values,
        "before": old, "residuals": result.residuals, "objective": result.objective,
        "before_implausible": priors.implausible(old),
        "directions_agree": [_count(before, "direction_agrees"), _count(after, "direction_agrees")],
        "headlines_within": [_count(before, "within_factor"), _count(after, "within_factor")],
        "rows": after["rows"],
    }
    if args.json:
        print(jsonout.dumps(summary))
    else:
        print(format_report(after))
        print(format_fit(summary, before, after))
    return 0


def _count(out, key) -> int:
    return sum(bool(r[key]) for r in out["rows"])


def format_fit(summary: dict, before: dict, after: dict) -> str:
    """Before/after headline ratios, directions and the constants the fit moved."""
    n_rows = len(after["rows"])
    n_head = sum(r["headline"] for r in after["rows"])
    lines = ["", f"cost fit -> {summary['file']} (free: {', '.join(summary['free'])})",
             f"   {'headline row':58s} {'published':>9s} {'before':>9s} {'after':>9s}"]
    for b, a in zip(before["rows"], after["rows"]):
        if a["headline"]:
            lines.append(f"   {a['label'][:58]:58s} {_num(a['published_ratio'], 3):>9s} "
                         f"{_num(b['model_ratio'], 3):>9s} {_num(a['model_ratio'], 3):>9s}")
    lines.append(f"   {'constant':24s} {'before':>9s} {'after':>9s}")
    for name, new in summary["values"].items():
        old = summary["before"][name]
        if name in summary["free"] or abs(old - new) > 1e-6 * abs(new):
            tag = "  fitted" if name in summary["free"] else ""
            lines.append(f"   {name:24s} {_num(old):>9s} {_num(new):>9s}{tag}")
    (d0, d1), (h0, h1) = summary["directions_agree"], summary["headlines_within"]
    lines.append(f"   directions agree: {d0}/{n_rows} before, {d1}/{n_rows} after; headline "
                 f"ratios within 1.5x: {h0}/{n_head} before, {h1}/{n_head} after")
    lines.append("   headline residuals log(model/published): "
                 + ", ".join(f"{e:+.3f}" for e in summary["residuals"]))
    lines.append("   physically implausible before: "
                 + ("; ".join(summary["before_implausible"]) or "nothing")
                 + "; after: " + ("; ".join(after["cost"]["implausible"]) or "nothing"))
    return "\n".join(lines)


def _num(v, digits=4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def format_report(out: dict) -> str:
    lines = []
    cost = out["cost"]
    fitted = cost["fitted"]
    if fitted:
        by_what: dict[str, list[str]] = {}
        first = {}
        for name, what in fitted.items():
            # "(see X)" points at the constant whose entry says what it was fitted to
            key = fitted.get(what[5:-1].strip(), what) if what.startswith("(see ") else what
            key = first.setdefault(key, key)
            by_what.setdefault(key, []).append(name)
        text = "; ".join(f"{', '.join(names)} fitted to {what}" for what, names in by_what.items())
    else:
        text = "none fitted to a published figure"
    lines.append(f"cost constants: {cost['source']}; {text}")
    if cost.get("implausible"):
        lines.append("   physically implausible (slabtune.model.priors.PRIOR ranges): "
                     + "; ".join(cost["implausible"]))
    for sc in out["scenarios"]:
        lines.append("")
        lines.append(f"== {sc['scenario']}: {sc['title']}")
        lines.append(f"   assumptions: {sc['assumptions']}")
        lines.append(f"   fitted scale: {sc['scale'] or 'none (unscaled percentages)'}")
        w = sc["work"]
        lines.append(f"   work outside the allocator: {_num(w['applied_ns'])} ns per op applied "
                     f"(--work {out['work']}); derived from the seed: "
                     f"{_num(w['derived_ns'])} ns ({w['derivation']})")
        for name, arm in sc["arms"].items():
            c = arm["config"]
            t = c["topology"]
            extra = " ".join(f"{k}={v}" for k, v in {**c["boot"], **c["knobs"]}.items())
            wl = ", ".join(f"{k}={v}" for k, v in c["workload"].items() if k != "kind")
            lines.append(
                f"   [{name}] profile {c['profile']}, {c['cache']['name']}, {t['cpus']} CPUs/"
                f"{len(t['node_cpus'])} nodes"
                + (f" (memoryless {t['memoryless_nodes']})" if t["memoryless_nodes"] else "")
                + f", {c['workload']['kind']}" + (f" ({wl})" if wl else "")
                + (f", {extra}" if extra else "")
                + f"; order {arm['order']}, {arm['objs_per_slab']} objs/slab, min_partial "
                f"{arm['min_partial']}, cpu_partial {arm['cpu_partial']}, sheaf "
                f"{arm['sheaf_capacity']}")
            lines.append(
                f"        alloc fast {arm['alloc_fastpath_frac']:.3f}, free fast "
                f"{arm['free_fastpath_frac']:.3f}, page allocs/kop "
                f"{arm['slab_allocs_per_kop']:.3g}, list_lock/kop {arm['list_lock_per_kop']:.3g}"
                f" (rho {arm['list_lock_rho']:.2f}), {arm['ns_per_op']:.4g} ns/pair")
        rows = [r for r in out["rows"] if r["scenario"] == sc["scenario"]]
        lines.append(f"   {'row':58s} {'published':>17s} {'model':>17s} {'pub.ratio':>9s} "
                     f"{'mod.ratio':>9s}  dir  headline")
        for r in rows:
            pub = (f"{_num(r['published_base'])}->{_num(r['published'])}"
                   if r["published"] is not None else (r["expect"] or "-"))
            mod = f"{_num(r['model_base'])}->{_num(r['model'])}"
            head = ("" if not r["headline"] else
                    ("within 1.5x" if r["within_factor"] else "OUTSIDE 1.5x"))
            lines.append(f"   {r['label'][:58]:58s} {pub[:17]:>17s} {mod[:17]:>17s} "
                         f"{_num(r['published_ratio'], 3):>9s} {_num(r['model_ratio'], 3):>9s}"
                         f"  {'yes' if r['direction_agrees'] else 'NO ':3s}  {head}")
    rows = out["rows"]
    n_dir = sum(r["direction_agrees"] for r in rows)
    heads = [r for r in rows if r["headline"]]
    n_head = sum(bool(r["within_factor"]) for r in heads)
    lines.append("")
    lines.append(f"directions agree: {n_dir}/{len(rows)}; headline ratios within "
                 f"{1.5}x: {n_head}/{len(heads)}")
    return "\n".join(lines)
