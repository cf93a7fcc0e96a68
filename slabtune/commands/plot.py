"""``slabtune plot (pareto | orders | fleet) ... --out FILE``: altair charts; the suffix of
FILE picks HTML (Vega inlined, opens offline), PNG or SVG."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="chart a study: Pareto front, order heatmap, gains")
    sub = p.add_subparsers(dest="plot_command", metavar="CHART", required=True)

    def source(sp, required=True):
        g = sp.add_mutually_exclusive_group(required=required)
        g.add_argument("--study", metavar="NAME", help="tune study name")
        g.add_argument("--run", metavar="RUN_DIR", help="tune run directory (with study.db)")
        sp.add_argument("--storage", metavar="URL", help="storage URL")
        sp.add_argument("--out", required=True, metavar="FILE", help=".html, .png or .svg")

    pp = sub.add_parser("pareto", help="all trials, the Pareto front and the baseline")
    source(pp)
    pp.set_defaults(func=_plot_pareto)

    po = sub.add_parser("orders", help="slab order over CPU counts x object sizes")
    source(po, required=False)
    po.add_argument("--trial", type=int, metavar="ID", help="a trial's policy (default: baseline)")
    po.add_argument("--profile", metavar="NAME",
                    help="kernel profile without a study (default v6.18)")
    po.add_argument("--cpus", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192",
                    metavar="LIST", help="comma-separated CPU counts")
    po.add_argument("--sizes", default="8,16,32,64,96,128,192,256,512,1024,2048,4096,8192",
                    metavar="LIST", help="comma-separated object strides in bytes")
    po.set_defaults(func=_plot_orders)

    pf = sub.add_parser("fleet", help="per-topology gains of Pareto points against the baseline")
    source(pf)
    pf.add_argument("--trial", type=int, action="append", metavar="ID",
                    help="trial to show (repeatable; default: up to 4 spread over the front)")
    pf.set_defaults(func=_plot_fleet)


def _ints(field: str, text: str, lo: int, hi: int) -> list[int]:
    from slabtune.errors import SlabtuneError

    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not lo <= int(part) <= hi:
            raise SlabtuneError(f"{field}: {part!r} is not an integer in {lo}..{hi}")
        out.append(int(part))
    if not out:
        raise SlabtuneError(f"{field}: empty list")
    return sorted(set(out))


def _done(path) -> int:
    print(f"wrote {path}")
    return 0


def _check_out(args) -> None:
    """--out is a file in an existing directory (checked before the study is read)."""
    from slabtune.commands.paths import output_file

    output_file("--out", args.out)


def _plot_pareto(args) -> int:
    from slabtune.results import charts, pareto
    from slabtune.tuner import study as studies

    _check_out(args)
    study = studies.load_study(args.study, args.storage, args.run)
    rep = studies.front_report(study)
    chart = charts.pareto_chart(pareto.all_points(study, rep["front_reach"]), rep["baseline"],
                            title=f"{study.study_name}: memory against time per op")
    return _done(charts.save(chart, args.out))


def _plot_orders(args) -> int:
    import polars as pl

    from slabtune.errors import SlabtuneError
    from slabtune.model import profiles
    from slabtune.results import charts
    from slabtune.tuner import objectives
    from slabtune.tuner import study as studies

    _check_out(args)
    cpus = _ints("--cpus", args.cpus, 1, 8192)
    sizes = _ints("--sizes", args.sizes, 8, 2 * 1024 * 1024)
    params: dict[str, int] = {}
    label = "baseline"
    if args.study or args.run:
        study = studies.load_study(args.study, args.storage, args.run)
        spec = studies.study_spec(study)
        profile = spec.fleet.profile
        if args.trial is not None:
            params = studies.effective_params(studies.get_trial(study, args.trial).params, spec)
            label = f"trial {args.trial}"
    else:
        if args.trial is not None:
            raise SlabtuneError("--trial: needs --study or --run")
        try:
            profile = profiles.get_profile(args.profile or "v6.18")
        except profiles.UnknownProfileError as err:
            raise SlabtuneError(f"--profile: {err}") from None
    grid = pl.DataFrame(objectives.order_grid(profile, params, cpus, sizes))
    chart = charts.orders_heatmap(grid, title=f"slab order, {profile.name}, {label}")
    return _done(charts.save(chart, args.out))


def _plot_fleet(args) -> int:
    from slabtune.errors import SlabtuneError
    from slabtune.results import charts
    from slabtune.tuner import study as studies

    _check_out(args)
    study = studies.load_study(args.study, args.storage, args.run)
    rep = studies.front_report(study)
    if not rep["points"]:
        raise SlabtuneError(f"study: {study.study_name!r} has no feasible complete trial")
    if args.trial:
        on_front = {p["trial"] for p in rep["points"]}
        kept = {t: p["trial"] for p in rep["points"] for t in p["same_as"]}
        for t in args.trial:
            if t in kept:
                raise SlabtuneError(f"--trial: {t} has the same objectives as trial {kept[t]}, "
                                    "which changes fewer knobs: plot that one")
            if t not in on_front:
                studies.get_trial(study, t)  # unknown trial: one clean line
                raise SlabtuneError(f"--trial: {t} is not on the Pareto front")
        trials = args.trial
    else:
        pts = rep["points"]
        step = max(1, (len(pts) - 1) // 3) if len(pts) > 1 else 1
        trials = sorted({pts[min(i, len(pts) - 1)]["trial"] for i in range(0, len(pts), step)})[:4]
    chart = charts.fleet_chart(charts.gains_frame(rep, trials),
                           title=f"{study.study_name}: gain against the baseline per topology")
    return _done(charts.save(chart, args.out))
