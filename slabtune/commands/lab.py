"""``slabtune lab run CONFIG.toml...``: run simulation configs on the real allocator (the lab
module on kernels built by scripts/build-kernels.sh) and print the kernel's counters beside
the model's.  The work lives in :mod:`slabtune.validate.lab`; this module parses and prints.
"""

from __future__ import annotations

import contextlib
import io
import sys

from slabtune.commands import jsonout


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lab", help="run configs on the real allocator (lab kernels under qemu) beside the "
                    "model",
        description="'slabtune lab run CONFIG.toml... [--kernel K]...': boot each lab kernel "
                    "(6.1, 6.12, 7.2 built from Debian's sources by scripts/build-kernels.sh, "
                    "or a bzImage of the same release; 6.1-slab, the SLAB build, reads "
                    "/proc/slabinfo instead) on each config's topology with its "
                    "slab boot parameters, run its [workload] on its [cache] with the lab "
                    "module after a warm-up, read the cache's SLUB_STATS counters over the "
                    "same window as the model's, and print them beside "
                    "the model's prediction of the same config under the booted kernel's "
                    "profile.  Each boot is a Ray task (qemu resource); rows go to the "
                    "results store.  Under TCG counters are functional, times are not "
                    "compared.  Exit 0 when every run completed, 1 when some failed, 2 on "
                    "bad input.")
    p.add_argument("action", choices=("run", "show"),
                   help="'run': boot and compare; 'show RUN': print a stored lab run again")
    p.add_argument("configs", nargs="*", metavar="CONFIG.toml",
                   help="simulation configs (see examples/lab/); for 'show', the run "
                        "directory, id or unique prefix")
    p.add_argument("--kernel", action="append", metavar="6.1|6.12|7.2|6.1-slab|PATH",
                   help="lab kernel (repeatable; default: every built SLUB one, or 6.1-slab "
                        "when every config names a SLAB profile)")
    p.add_argument("--out", default="runs", metavar="DIR", help="where run directories go")
    p.add_argument("--resume", metavar="RUN",
                   help="finish an interrupted lab run (its configs and kernels; no CONFIG)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster address (default: a local instance, or RAY_ADDRESS)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="wall-clock limit per boot attempt (default 300)")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="qemu accelerator (auto: KVM where a probe boot works)")
    p.add_argument("--schedule", choices=("free", "lockstep"),
                   help="(run) how the lab module's workers run: 'free' (default) as "
                        "fast as their vCPUs go, an idle worker sleeping a tick; "
                        "'lockstep' one op or none each per step at a barrier, through "
                        "the warm-up and the config's steps, the model's schedule "
                        "(accelerator label lab-tcg-lockstep), every worker's bursts "
                        "starting together (the model's bursting CPUs otherwise start "
                        "apart)")
    p.add_argument("--repredict", action="store_true",
                   help="(show) the stored measurements beside today's model, predicted "
                        "again under each record's kernel profile")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print JSON: the record of the one (config, kernel) pair, or "
                          "{run_dir, records} for several; each record has kernel, "
                          "accelerator, config, measured and predicted; "
                          + jsonout.NON_FINITE_HELP)
    out.add_argument("--markdown", action="store_true",
                     help="print the report-card table (Markdown) instead of the text table, "
                          "then |predicted - measured| median / worst per kernel and "
                          "workload kind")
    p.set_defaults(func=_lab)


def _lab(args) -> int:
    from slabtune.commands.paths import input_file, output_dir
    from slabtune.errors import SlabtuneError
    from slabtune.validate import lab

    if args.action == "show":
        return _show(args)
    if args.repredict:
        raise SlabtuneError("--repredict: only with 'lab show RUN'")
    if args.resume is not None:
        if args.configs or args.kernel or args.schedule:
            raise SlabtuneError("--resume: takes the configs, kernels and schedule of the "
                                "run; give no CONFIG, --kernel or --schedule")
        configs, kernels = [], []
    else:
        if not args.configs:
            raise SlabtuneError("CONFIG.toml: give at least one config")
        configs = [lab.load_config(input_file("CONFIG", c)) for c in args.configs]
        kernels = lab.resolve_kernels(args.kernel,
                                      slab=bool(configs) and all(map(lab.is_slab_config,
                                                                     configs)))
        _check_predictions(configs, len(kernels))
    if args.timeout is not None and not 0 < args.timeout <= 3600:
        raise SlabtuneError(f"--timeout: {args.timeout} is outside (0, 3600]")
    output_dir("--out", args.out)
    res = lab.run_lab(configs, kernels, out_dir=args.out, ray_address=args.ray_address,
                      timeout_s=args.timeout, accel=args.accel, resume=args.resume,
                      schedule=args.schedule or "free")
    _print(args, res)
    return 1 if res.failed else 0


def _check_predictions(configs, n_kernels: int) -> None:
    """The model's predictions of every (config, kernel) pair, warm-up included, within
    model.limits' ``model_ops``: refused before the run directory exists or a kernel boots
    (steps 1e7 x ops_per_step 1024 ran 10 minutes at full CPU before any boot)."""
    from slabtune.kernel import labmod
    from slabtune.model import limits
    from slabtune.sweeps import simconfig

    total = 0
    for c in configs:
        s = simconfig.parse_doc(c.doc)
        total += limits.model_ops(s.topology.present, labmod.warmup_steps(s.steps) + s.steps,
                                  s.ops_per_step)
    limits.check("model_ops", total * n_kernels, "run.steps",
                 f" of {len(configs)} config(s) x {n_kernels} kernel(s), warm-up included")


def _show(args) -> int:
    from slabtune.commands.paths import input_dir
    from slabtune.errors import SlabtuneError
    from slabtune.results import store
    from slabtune.validate import lab

    if len(args.configs) != 1:
        raise SlabtuneError("lab show: give exactly one RUN")
    extra = [n for n, v in (("--kernel", args.kernel), ("--resume", args.resume),
                            ("--ray-address", args.ray_address),
                            ("--timeout", args.timeout), ("--schedule", args.schedule))
             if v]
    if extra:
        raise SlabtuneError(f"lab show: {extra[0]} does not apply to show")
    input_dir("--out", args.out)
    run = store.resolve_run(args.configs[0], args.out)
    # A record edited or damaged in the manifest is one line naming the run, not a
    # traceback halfway through the table: the output is built first, then printed.
    _check_records(run)
    buf = io.StringIO()
    try:
        res = lab.stored_run(run, repredict=args.repredict)
        with contextlib.redirect_stdout(buf):
            _print(args, res)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        if isinstance(err, SlabtuneError):
            raise
        what = f"field {err}" if isinstance(err, KeyError) else \
            (str(err).splitlines() or [type(err).__name__])[0]
        raise SlabtuneError(f"lab show: {run.path}: a stored record is malformed ({what}; "
                            "a damaged or edited manifest)") from None
    sys.stdout.write(buf.getvalue())
    return 0


#: Fields of a stored lab record (validate.lab.combine) and the types lab show relies on.
_RECORD_FIELDS = {"kernel": str, "ok": bool, "config": dict, "predicted": dict,
                  "measured": (dict, type(None))}


def _check_records(run) -> None:
    """Every record in a lab run's manifest has the fields :func:`_print` reads, with their
    types; else one line naming the chunk and the field."""
    from slabtune.errors import SlabtuneError

    states = run.manifest["chunks"]["states"]
    for k in sorted(states, key=int):
        rec = states[k].get("record") if isinstance(states[k], dict) else None
        if rec is None:
            continue
        where = f"lab show: {run.path}: chunk {k}: record"
        if not isinstance(rec, dict):
            raise SlabtuneError(f"{where} is a {type(rec).__name__}, not a table (a damaged "
                                "or edited manifest)")
        for field, kind in _RECORD_FIELDS.items():
            if not isinstance(rec.get(field), kind):
                raise SlabtuneError(f"{where}.{field} is missing or malformed (a damaged or "
                                    "edited manifest)")
        if not isinstance(rec["config"].get("doc"), dict):
            raise SlabtuneError(f"{where}.config.doc is missing or malformed (a damaged or "
                                "edited manifest)")


def _print(args, res) -> None:
    if args.json:
        recs = [{k: v for k, v in r.items() if k != "console_tail" or not r["ok"]}
                for r in res.records]
        doc = ({**recs[0], "run_dir": str(res.run_dir)} if len(recs) == 1
               else {"run_dir": str(res.run_dir), "records": recs})
        print(jsonout.dumps(doc))
    else:
        from slabtune.validate import lab

        if args.markdown:
            head = "\n|predicted - measured|, median / worst per kernel and workload kind:\n"
            print(format_markdown(res.records))
        else:
            head = "per kernel and workload kind, |predicted - measured| median / worst:"
            print(format_text(res.records))
            print("\n".join(lab.format_summary(lab.summary(_frame_of(res.records)))))
        kinds = lab.format_by_kind(lab.by_kind(res.records))
        if kinds:
            print(head)
            print("\n".join(kinds))
        sys.stdout.flush()
        if not args.markdown:
            print(f"run {res.run_dir}", file=sys.stderr)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, nd: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{nd}g}"


def _mem(v) -> str:
    return "-" if v is None else f"{v / 1024:.0f} KiB"


#: (label, key, formatter) of the compared figures in both tables.
_FIGURES = (("alloc fast", "alloc_fastpath_frac", _pct),
            ("free fast", "free_fastpath_frac", _pct),
            ("slabs/kop", "slab_allocs_per_kop", _num),
            ("memory", "memory_bytes", _mem))


def format_text(records) -> str:
    """Per (config, kernel): the compared figures measured | predicted, then the counters
    per 1000 ops either side has."""
    lines = []
    for r in records:
        head = (f"{r['config']['name']} on {r['kernel']} ({r['release'] or '?'}, "
                f"{r['accelerator'] or '?'}, profile {r['profile']})")
        if not r["ok"]:
            lines += [head, f"  FAILED: {r['error']}"]
            continue
        m, p = r["measured"], r["predicted"]
        lines.append(head + f": {m['ops']} ops, {m['samples']} memory samples")
        lines.append(f"  {'':26s} {'measured':>12s} {'predicted':>12s}")
        for label, key, fmt in _FIGURES:
            lines.append(f"  {label:26s} {fmt(m[key]):>12s} {fmt(p[key]):>12s}")
        names = sorted(set(m["counters_per_kop"]) | set(p["counters_per_kop"]))
        shown = [n for n in names if m["counters_per_kop"].get(n)
                 or p["counters_per_kop"].get(n)]
        if shown:
            lines.append("  per 1000 ops:")
            for n in shown:
                mv = m["counters_per_kop"].get(n)
                pv = p["counters_per_kop"].get(n)
                lines.append(f"    {n:24s} {_num(mv, 4):>12s} {_num(pv, 4):>12s}")
    lines.append("TCG runs count every allocator path; their times are emulation artefacts "
                 "and are not compared.")
    return "\n".join(lines)


def format_markdown(records) -> str:
    """The report card: one row per (config, kernel), measured / predicted."""
    head = ("| kernel | config | topology | accel | alloc fast | free fast | slabs/kop | "
            "memory |")
    lines = [head, "|" + "---|" * 8]
    from slabtune.validate.lab import topology_label

    for r in records:
        cells = [r["kernel"], r["config"]["name"], topology_label(r["config"]["doc"]),
                 r["accelerator"] or "-"]
        if not r["ok"]:
            cells += [f"failed: {r['error'][:60]}", "", "", ""]
        else:
            m, p = r["measured"], r["predicted"]
            cells += [f"{fmt(m[k])} / {fmt(p[k])}" for _, k, fmt in _FIGURES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _frame_of(records):
    """The rows of the records (the summary's input: the same as a stored run's rows for
    it, and the only rows ``show --repredict`` has)."""
    from slabtune.validate import lab
    from slabtune.validate.schema import frame

    rows = []
    for i, r in enumerate(records):
        rows += lab.rows_of(r, {"task": i, "candidate": r["config"]["name"]})
    return frame(rows)
