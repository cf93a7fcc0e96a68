"""``slabtune simulate CONFIG.toml``: run one configuration through the model and print its
metrics.  Parsing and validation live in :mod:`slabtune.sweeps.simconfig`, the run in
:mod:`slabtune.sweeps.simulate`; this module only prints."""

from __future__ import annotations

from slabtune.commands import jsonout


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate one configuration (TOML) and print its metrics",
        description="Simulate one cache x topology x policy x workload configuration and "
                    "print its structural fields and dynamics metrics.")
    p.add_argument("config", metavar="CONFIG.toml", help="configuration file (see examples/)")
    p.add_argument("--cost", metavar="FILE",
                   help="cost constants overriding the packaged cost_default.toml")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object; " + jsonout.NON_FINITE_HELP)
    p.set_defaults(func=_simulate)


def _simulate(args) -> int:
    from slabtune.sweeps import simconfig, simulate

    spec = simconfig.load(args.config)
    cost, meta = simconfig.load_cost(args.cost)
    row = simulate.run([spec], cost)[0]
    row["cost_source"] = meta.source
    row["cost_fitted"] = meta.fitted
    if args.json:
        print(jsonout.dumps(row, sort_keys=False))
        return 0
    print(format_row(row))
    return 0


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_row(row: dict) -> str:
    """Human-readable lines: configuration, structure, then metrics."""
    cfg = row["config"]
    t = cfg["topology"]
    lines = [
        f"config    {cfg['cache']['name']} (size {cfg['cache']['size']}), profile "
        f"{cfg['profile']}, {t['cpus']} CPUs on {len(t['node_cpus'])} nodes "
        f"(memoryless {t['memoryless_nodes'] or 'none'}), workload {cfg['workload']['kind']}, "
        f"{cfg['run']['steps']} steps, seed {cfg['run']['seed']}",
    ]
    if cfg["boot"] or cfg["knobs"]:
        lines.append(f"params    {cfg['boot']} {cfg['knobs']}")
    struct = ("nr_cpus", "min_objects", "order", "objs_per_slab", "leftover", "min_partial",
              "cpu_partial", "cpu_partial_slabs", "sheaf_capacity")
    lines.append("structure " + "  ".join(f"{k}={row[k]}" for k in struct))
    for k, v in row.items():
        if k in struct or k in ("config", "cost_source", "cost_fitted"):
            continue
        if isinstance(v, list):
            v = " ".join(f"o{i}:{x:.3g}" for i, x in enumerate(v) if x)
        lines.append(f"  {k:30s} {_fmt(v)}")
    fitted = row["cost_fitted"]
    what = sorted({w for w in fitted.values() if not w.startswith("(see ")})
    lines.append(f"cost      {row['cost_source']}"
                 + (f"; fitted: {', '.join(fitted)}, to {'; '.join(what)}"
                    if fitted else "; no constant fitted"))
    return "\n".join(lines)
