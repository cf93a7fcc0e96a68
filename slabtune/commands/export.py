"""``slabtune export --study NAME --trial ID --format cmdline|grub|tmpfiles|json|slabinfo``:
turn a tuned policy into boot parameters, a GRUB drop-in, a tmpfiles.d file, a JSON report
or (SLAB) a script of /proc/slabinfo tunables."""

from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="export a trial as boot parameters or sysfs settings")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--study", metavar="NAME", help="tune study name")
    src.add_argument("--run", metavar="RUN_DIR", help="tune run directory (with study.db)")
    p.add_argument("--storage", metavar="URL", help="storage URL (default: the run's study.db)")
    p.add_argument("--trial", type=int, required=True, metavar="ID", help="trial number")
    p.add_argument("--format", required=True, choices=("cmdline", "grub", "tmpfiles", "json",
                                                        "slabinfo"),
                   help="slabinfo: SLAB tunables as /proc/slabinfo writes")
    p.add_argument("--prefix", choices=("slub", "slab"),
                   help="boot parameter spelling (default: slab_* where the profile accepts it)")
    p.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=_export)


def _export(args) -> int:
    from slabtune.commands.paths import output_file
    from slabtune.results import export
    from slabtune.results.safeio import write_atomic
    from slabtune.tuner import study as studies

    if args.out:
        output_file("--out", args.out)
    study = studies.load_study(args.study, args.storage, args.run)
    cand = studies.candidate(study, args.trial)
    text = export.render(cand, args.format, args.prefix)
    if args.format == "cmdline":
        print(f"note: reach {export.REACH_TEXT[cand.reach]}", file=sys.stderr)
        for line in export.kernel_change_notes(cand):
            print(line, file=sys.stderr)
        if cand.sysfs:
            print("note: this policy also sets sysfs values: export --format tmpfiles",
                  file=sys.stderr)
        if cand.slabinfo:
            print("note: this policy also sets /proc/slabinfo tunables: export --format "
                  "slabinfo", file=sys.stderr)
    if args.out:
        out = write_atomic(args.out, text, "--out")
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
