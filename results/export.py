"""Export a tuned policy as what an administrator applies: a kernel command-line fragment, a
GRUB drop-in, a systemd-tmpfiles.d file for the sysfs knobs, or a JSON report; and a whole
study's trials as parquet (:func:`write_parquet`, ``results export``).

Boot parameters go through :mod:`slabtune.model.bootparams` (allow-list, kernel ranges, the
``slub_*``/``slab_*`` spelling of the target profile).  Per-cache sysfs values are written
as ``w /sys/kernel/slab/<cache>/<attr> - - - - <value>`` lines.  A SLAB policy's boot
parameter is ``slab_max_order=`` and its per-cache tunables are a ``slabinfo`` script of
``echo "name limit batchcount shared" > /proc/slabinfo`` lines (one cache per write, as
slabinfo_write() takes them, which tmpfiles.d cannot express).  Knobs that only a kernel
change reaches are listed as such in every format (comments, stderr notes, a JSON field),
never dropped silently, and every export says what deploying the policy takes (its reach:
a ``# reach:`` header line, a JSON field).  Every string written into a file is checked or
escaped to one printable line (:func:`one_line`): names are data, never lines of their
own.  Pure Python; never imports JAX.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles, slab

FORMATS = ("cmdline", "grub", "tmpfiles", "json", "slabinfo")
SYSFS_ROOT = "/sys/kernel/slab"
#: Knob families whose per-cache result is written to sysfs, by attribute.
SYSFS_FAMILIES = {
    "min_partial": ("min_partial_divisor", "min_partial_lo", "min_partial_hi"),
    "cpu_partial": ("cpu_partial_page", "cpu_partial_1k", "cpu_partial_256", "cpu_partial_small"),
}


@dataclasses.dataclass(frozen=True)
class KernelChange:
    knob: str
    value: int
    baseline: int
    doc: str


@dataclasses.dataclass(frozen=True)
class ExportedPolicy:
    """Everything an export needs about one trial, as plain data."""

    study: str
    trial: int
    profile: profiles.KernelProfile
    memory: float
    time: float
    baseline: Mapping[str, float]
    #: Effective boot parameters the trial sets, canonical ``slub_*`` names.
    boot: Mapping[str, int]
    #: cache -> {attribute: value} for sysfs attributes the trial changes.
    sysfs: Mapping[str, Mapping[str, int]]
    kernel_change: tuple[KernelChange, ...]
    #: topology -> {"memory": gain, "time": gain} (fractions, positive = better).
    gains: Mapping[str, Mapping[str, float]]
    params: Mapping[str, int]
    #: SLAB: cache -> (limit, batchcount, shared) written to /proc/slabinfo.
    slabinfo: Mapping[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)
    #: What deploying it takes (slabtune.tuner.space.policy_reach): default, boot, sysfs,
    #: slabinfo, boot+sysfs, boot+slabinfo or kernel.
    reach: str = "default"


#: :attr:`ExportedPolicy.reach` values and what each means in an export header.
REACH_TEXT = {
    "default": "default (changes nothing the kernel does not already do)",
    "boot": "boot (boot parameters only; a stock kernel takes it)",
    "sysfs": "sysfs (per-cache sysfs values written after boot; a stock kernel takes it)",
    "slabinfo": "slabinfo (/proc/slabinfo tunables written after boot; a stock kernel "
                "takes it)",
    "boot+sysfs": "boot+sysfs (boot parameters and per-cache sysfs values; a stock kernel "
                  "takes it)",
    "boot+slabinfo": "boot+slabinfo (boot parameter and /proc/slabinfo tunables; a stock "
                     "kernel takes it)",
    "kernel": "kernel (needs a rebuilt kernel: the knobs below are not applied here)",
}


def one_line(value, limit: int = 200) -> str:
    """``value`` as one printable line for a comment of an exported file: anything but
    printable ASCII (newlines, carriage returns, other controls, non-ASCII) is escaped as
    Python's ascii() writes it, and the text is cut at ``limit`` characters.  Names are
    validated where they are read (slabtune.tuner.study.load_study); this keeps a name
    that got past that as data, never a line of its own."""
    text = str(value)
    out = "".join(ch if " " <= ch <= "~" else ascii(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + "..."


def _check(c: ExportedPolicy) -> None:
    """The strings and numbers an export writes are what they claim to be; anything else
    is one line naming the field (the study's name, its reach, its objectives)."""
    if one_line(c.study) != str(c.study):
        raise SlabtuneError(f"study: name {one_line(c.study, 60)} is not one printable line")
    if c.reach not in REACH_TEXT:
        raise SlabtuneError(f"reach: {one_line(c.reach, 40)} is not one of "
                            f"{', '.join(REACH_TEXT)}")
    for field, v in (("memory", c.memory), ("time", c.time),
                     ("baseline.memory", c.baseline.get("memory")),
                     ("baseline.time", c.baseline.get("time"))):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise SlabtuneError(f"trial {c.trial}: {field} {one_line(v, 40)} is not a number")


def boot_fragment(c: ExportedPolicy, prefix: str | None = None) -> str:
    """The command-line fragment: validated against the profile's allow-list and ranges,
    spelled ``slab_*`` where the profile accepts it (v6.8 on), else ``slub_*``.  A SLAB
    profile's: ``slab_max_order=N`` (:func:`slabtune.model.slab.validate_params`)."""
    if profiles.is_slab(c.profile):
        checked = slab.validate_params(dict(c.boot), c.profile)
        return " ".join(f"{k}={v}" for k, v in checked.items())
    validated = bootparams.validate_params(dict(c.boot), c.profile)
    return bootparams.render(validated, c.profile, prefix)


def _sysfs_attr_ok(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and name.isprintable() \
        and not any(ch.isspace() for ch in name)


def tmpfiles_lines(c: ExportedPolicy) -> list[str]:
    """``w`` lines of tmpfiles.d(5) writing each changed attribute under /sys/kernel/slab."""
    lines = []
    for cache in sorted(c.sysfs):
        if not _sysfs_attr_ok(cache):
            raise SlabtuneError(f"sysfs: cache name {cache!r} cannot be a sysfs path component")
        for attr, value in sorted(c.sysfs[cache].items()):
            if attr not in SYSFS_FAMILIES:
                raise SlabtuneError(f"sysfs: {attr!r} is not a writable slab attribute here")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SlabtuneError(f"sysfs: {cache}/{attr} value {value!r} must be a "
                                    "non-negative integer")
            lines.append(f"w {SYSFS_ROOT}/{cache}/{attr} - - - - {value}")
    return lines


_SLAB_CACHE_NAME = re.compile(r"[A-Za-z0-9_.:()@+-]+")


def slabinfo_lines(c: ExportedPolicy) -> list[str]:
    """``echo "name limit batchcount shared" > /proc/slabinfo``, one line per cache, with
    the ranges slabinfo_write() accepts (limit >= 1, 1 <= batchcount <= limit,
    shared >= 0); a cache name a shell would read as more than a word is refused."""
    lines = []
    for cache in sorted(c.slabinfo):
        if not _SLAB_CACHE_NAME.fullmatch(cache):
            raise SlabtuneError(f"slabinfo: cache name {cache!r} is not a plain cache name")
        slab.validate_params(dict(zip(slab.SLAB_TUNABLES, c.slabinfo[cache])), c.profile)
        lim, bc, sh = c.slabinfo[cache]
        lines.append(f'echo "{cache} {lim} {bc} {sh}" > /proc/slabinfo')
    return lines


def _header(c: ExportedPolicy, comment: str = "#") -> list[str]:
    """The comment lines that open a grub, tmpfiles or slabinfo export; every string in
    them is :func:`one_line`."""
    out = [f"{comment} slabtune: study {one_line(c.study)}, trial {int(c.trial)}, "
           f"kernel profile {one_line(c.profile.name)}",
           f"{comment} reach: {REACH_TEXT[c.reach]}",
           f"{comment} modelled fleet memory overhead {c.memory:.4f} (baseline "
           f"{c.baseline['memory']:.4f}), time {c.time:.2f} ns/op "
           f"(baseline {c.baseline['time']:.2f})"]
    for k in c.kernel_change:
        out.append(f"{comment} needs a kernel change (not applied here): "
                   f"{one_line(k.knob)}={int(k.value)} (kernel default {int(k.baseline)}; "
                   f"{one_line(k.doc)})")
    return out


def kernel_change_notes(c: ExportedPolicy) -> list[str]:
    """One line per knob that only a kernel change applies."""
    return [f"note: {one_line(k.knob)}={int(k.value)} needs a kernel change (default "
            f"{int(k.baseline)}): {one_line(k.doc)}"
            for k in c.kernel_change]


def render(c: ExportedPolicy, fmt: str, prefix: str | None = None) -> str:
    """The exported text in format ``fmt`` (cmdline, grub, tmpfiles or json)."""
    _check(c)
    if fmt == "cmdline":
        return boot_fragment(c, prefix) + "\n"
    if fmt == "grub":
        frag = boot_fragment(c, prefix)
        lines = _header(c) + [
            "# Drop into /etc/default/grub.d/ and run update-grub (grub-mkconfig).",
        ]
        if c.sysfs:
            lines.append("# Per-cache sysfs values are not boot parameters: "
                         "export --format tmpfiles.")
        if c.slabinfo:
            lines.append("# /proc/slabinfo tunables are not boot parameters: "
                         "export --format slabinfo.")
        if frag:
            lines.append(f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {frag}"')
        else:
            lines.append("# This policy sets no boot parameter (the kernel defaults apply).")
        return "\n".join(lines) + "\n"
    if fmt == "tmpfiles":
        lines = _header(c) + ["# systemd-tmpfiles.d(5): install as /etc/tmpfiles.d/slabtune.conf"]
        body = tmpfiles_lines(c)
        if not body:
            lines.append("# This policy changes no sysfs attribute.")
        if c.slabinfo:
            lines.append("# SLAB tunables go to /proc/slabinfo: export --format slabinfo")
        if c.boot:
            lines.append(f"# Boot parameters are not set here: {boot_fragment(c, prefix)}")
        return "\n".join(lines + body) + "\n"
    if fmt == "json":
        return json.dumps(report(c, prefix), indent=2) + "\n"
    if fmt == "slabinfo":
        if not profiles.is_slab(c.profile):
            raise SlabtuneError(f"format: slabinfo is for SLAB profiles; {c.profile.name} is "
                                "SLUB (export --format tmpfiles)")
        lines = ["#!/bin/sh"] + _header(c) + [
            "# /proc/slabinfo tunables (SLAB), one cache per write: run as root after boot."]
        body = slabinfo_lines(c)
        if not body:
            lines.append("# This policy changes no tunable (every cache keeps its default).")
        if c.boot:
            lines.append(f"# Boot parameters are not set here: {boot_fragment(c, prefix)}")
        return "\n".join(lines + body) + "\n"
    raise SlabtuneError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")


def report(c: ExportedPolicy, prefix: str | None = None) -> dict:
    """The JSON report: objectives, what to apply where, and expected gains per topology."""
    return {
        "study": c.study,
        "trial": c.trial,
        "profile": c.profile.name,
        "reach": c.reach,
        "objectives": {"memory": c.memory, "time": c.time},
        "baseline": {"memory": float(c.baseline["memory"]), "time": float(c.baseline["time"])},
        "params": dict(c.params),
        "cmdline": boot_fragment(c, prefix),
        "boot_params": dict(slab.validate_params(dict(c.boot), c.profile)
                            if profiles.is_slab(c.profile)
                            else bootparams.validate_params(dict(c.boot), c.profile)),
        "sysfs": {cache: dict(v) for cache, v in c.sysfs.items()},
        **({"slabinfo": slabinfo_lines(c)} if profiles.is_slab(c.profile) else {}),
        "kernel_change": [dataclasses.asdict(k) for k in c.kernel_change],
        "gains": {t: dict(g) for t, g in c.gains.items()},
    }


def write_parquet(df, path, metadata: Mapping[str, Mapping[str, str]], field: str = "--out",
                  file_metadata: Mapping[str, str] | None = None):
    """Write a frame as parquet atomically (:func:`slabtune.results.safeio.write_atomic`),
    each column carrying ``metadata[column]`` (unit, doc) as arrow field metadata
    (:func:`slabtune.results.columns.arrow_schema`) and ``file_metadata`` as the arrow
    schema's metadata and the file's key-value metadata.  Returns the path."""
    from slabtune.results import columns
    from slabtune.results.safeio import write_atomic

    schema = columns.arrow_schema(df, metadata, file_metadata)
    return write_atomic(path, lambda fh: df.write_parquet(
        fh, statistics=True, arrow_schema=schema,
        metadata=dict(file_metadata) if file_metadata else None), field)
