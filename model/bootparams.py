"""SLUB boot parameters: the allow-list, kernel command-line parsing and strict validation.

Two different jobs live here:

* :func:`parse_cmdline` reads a command line the way a booting kernel does (lenient: odd
  values are taken as ``get_option()`` takes them and clamped as ``setup_slub_*`` clamps
  them), to know which (min_order, max_order, min_objects) a recorded boot ran with.
* :func:`validate_params` checks values a *user* supplies (export, the guest validator):
  unknown names and out-of-range values raise :class:`SlabtuneError` naming the field.

Pure Python, no files, no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from slabtune.errors import SlabtuneError
from slabtune.model import profiles

#: The parameters slabtune may set, by suffix; the kernel spells them ``<prefix>_<suffix>``
#: with the prefixes of ``KernelProfile.boot_param_prefixes`` ("slub"; "slab" from v6.8).
PARAM_SUFFIXES: tuple[str, ...] = ("min_order", "max_order", "min_objects")
#: Inclusive ranges the strict validator accepts.  Orders stop at MAX_PAGE_ORDER (10 on
#: x86-64); min_objects at MAX_OBJS_PER_PAGE (32767), more objects than any slab can hold.
PARAM_RANGES: dict[str, tuple[int, int]] = {
    "min_order": (0, profiles.MAX_PAGE_ORDER),
    "max_order": (0, profiles.MAX_PAGE_ORDER),
    "min_objects": (0, 32767),
}
#: Boot flags (no value), by suffix.  ``slub_nomerge`` / ``slab_nomerge`` set slab_nomerge
#: (setup_slab_nomerge(), mm/slab_common.c of 6.1, 6.12, 7.2): no cache is merged into
#: another (model/merging.py).  ``slub_merge`` / ``slab_merge`` clear it again.
FLAG_SUFFIXES: tuple[str, ...] = ("nomerge",)
#: First kernel that takes the ``slab_`` spelling of nomerge (v3.18, "mm/slab_common:
#: commonize slab merge logic"; ``slub_nomerge`` is SLUB's own, as old as SLUB).
SLAB_NOMERGE_SINCE = (3, 18)
#: First kernel with ``slub_merge`` / ``slab_merge`` (v4.13, with CONFIG_SLAB_MERGE_DEFAULT).
MERGE_FLAG_SINCE = (4, 13)
#: Canonical key prefix of a validated dict (the spelling every kernel accepts).
CANONICAL_PREFIX = "slub"
#: First kernel whose setup_slub_min_order/max_order keep min <= max (a 2023 patch by Feng
#: Tang that went in with the calculate_order() cleanups of v6.7).
MIN_MAX_CROSS_ADJUST = (6, 7)
_U32 = 1 << 32


class SlubParams(NamedTuple):
    """The effective slub_min_order, slub_max_order and slub_min_objects of a boot."""

    min_order: int = 0
    max_order: int = profiles.DEFAULT_MAX_ORDER
    min_objects: int = 0


def allowed_names(profile: profiles.KernelProfile) -> dict[str, str]:
    """Every boot parameter name the profile's kernel accepts, mapped to its suffix:
    ``slub_min_order`` etc., plus ``slab_min_order`` etc. where the profile lists the "slab"
    prefix (v6.8 on)."""
    return {f"{prefix}_{suffix}": suffix
            for prefix in profile.boot_param_prefixes for suffix in PARAM_SUFFIXES}


def allowed_flags(profile: profiles.KernelProfile) -> dict[str, str]:
    """Every boot flag name the profile's kernel accepts, mapped to its suffix:
    ``slub_nomerge``, and ``slab_nomerge`` from v3.18."""
    prefixes = ("slub", "slab") if profile.version >= SLAB_NOMERGE_SINCE else ("slub",)
    return {f"{prefix}_{suffix}": suffix for prefix in prefixes for suffix in FLAG_SUFFIXES}


def _normalise(name: str) -> str:
    """parameq(): the kernel treats '-' and '_' in parameter names as the same character."""
    return name.replace("-", "_")


def split_cmdline(cmdline: str) -> list[str]:
    """Split a kernel command line into arguments as ``next_arg()`` does.

    Arguments are separated by whitespace; a double quote toggles quoting (so
    ``a="b c"`` is one argument) and quotes are removed (a leading quote and a quote just
    before the end, as the kernel strips them); ``--`` ends the kernel's arguments (the
    rest belongs to init).
    """
    args: list[str] = []
    i, n = 0, len(cmdline)
    while i < n:
        while i < n and cmdline[i].isspace():
            i += 1
        if i >= n:
            break
        start, quoted = i, False
        while i < n and (quoted or not cmdline[i].isspace()):
            if cmdline[i] == '"':
                quoted = not quoted
            i += 1
        arg = cmdline[start:i].replace('"', "")
        if arg == "--":
            break
        args.append(arg)
    return args


def get_option(text: str) -> int:
    """get_option() as ``setup_slub_*`` use it: an optional '-' then simple_strtoull in base
    0 ("0x" hex, leading "0" octal, else decimal) over the longest valid prefix (no digits
    gives 0), truncated to a C int and stored in an ``unsigned int``."""
    neg = text.startswith("-")
    s = text[1:] if neg else text
    base = 10
    if s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        base, s = 16, s[2:]
    elif s.startswith("0"):
        base = 8
    digits = "0123456789abcdef"[:base]
    k = 0
    while k < len(s) and s[k].lower() in digits:
        k += 1
    value = int(s[:k], base) if k else 0
    if neg:
        value = -value
    return value % _U32


def slub_args(cmdline: str, profile: profiles.KernelProfile) -> list[tuple[str, str, str]]:
    """The allow-listed ``name=value`` arguments of a command line, in order, as
    (name as written, suffix, raw value).  Names the profile's kernel does not know (e.g.
    ``slab_max_order`` before v6.8) and names without '=' are not slab parameters to it."""
    names = allowed_names(profile)
    out = []
    for arg in split_cmdline(cmdline):
        name, eq, value = arg.partition("=")
        suffix = names.get(_normalise(name))
        if eq and suffix:
            out.append((name, suffix, value))
    return out


def apply_param(params: SlubParams, suffix: str, value: int,
                profile: profiles.KernelProfile) -> SlubParams:
    """One ``setup_slub_*`` call (mm/slub.c).

    * min_objects: stored as given.
    * min_order: stored; from v6.7, if min > max then max = min.
    * max_order: stored as min(value, MAX_PAGE_ORDER); from v6.7, if min > max then
      min = max.
    """
    lo, hi, objs = params
    cross = profile.version >= MIN_MAX_CROSS_ADJUST
    if suffix == "min_objects":
        objs = value
    elif suffix == "min_order":
        lo = value
        if cross and lo > hi:
            hi = lo
    elif suffix == "max_order":
        hi = min(value, profiles.MAX_PAGE_ORDER)
        if cross and lo > hi:
            lo = hi
    else:  # pragma: no cover - callers pass allow-listed suffixes
        raise SlabtuneError(f"boot parameter: unknown slub parameter {suffix!r}")
    return SlubParams(lo, hi, objs)


def parse_cmdline(cmdline: str, profile: profiles.KernelProfile) -> SlubParams:
    """The effective SLUB parameters of a boot with this command line, applying each
    allow-listed parameter in command-line order with the kernel's setup semantics
    (:func:`apply_param`); parameters after ``--`` are init's and ignored."""
    params = SlubParams()
    for _name, suffix, value in slub_args(cmdline, profile):
        params = apply_param(params, suffix, get_option(value), profile)
    return params


def parse_nomerge(cmdline: str, profile: profiles.KernelProfile) -> bool:
    """Whether a boot with this command line runs with slab_nomerge, as the kernel decides:
    obsolete_checksetup() (init/main.c) runs the first ``__setup`` whose string is a prefix
    of the argument (dashes and underscores alike, parameqn()), so ``slub_nomerge=1`` and
    ``slab_nomerge`` both set it; ``slub_merge`` / ``slab_merge`` (v4.13 on) clear it; the
    last one wins.  The default is merging (CONFIG_SLAB_MERGE_DEFAULT=y)."""
    sets = tuple(allowed_flags(profile))
    clears = (("slub_merge", "slab_merge") if profile.version >= MERGE_FLAG_SINCE else ())
    nomerge = False
    for arg in split_cmdline(cmdline):
        if any(_normalise(arg[:len(s)]) == s for s in sets):
            nomerge = True
        elif any(_normalise(arg[:len(s)]) == s for s in clears):
            nomerge = False
    return nomerge


def _flag(name: str, value: object) -> int:
    """A boot flag's value from a user: True/1 (given), False/0 (not given), None (a bare
    ``--param NAME``).  A string is refused: a flag takes no value (``slub_nomerge=1``)."""
    if value is None or value is True or (type(value) is int and value == 1):
        return 1
    if value is False or (type(value) is int and value == 0):
        return 0
    raise SlabtuneError(f"boot parameter {name}: a flag that takes no value "
                        f"(got {name}={value}); give it as {name}")


def _strict_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise SlabtuneError(f"boot parameter {name}: {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text and (text.isdigit() or (text[0] in "+-" and text[1:].isdigit())):
            return int(text)
    raise SlabtuneError(f"boot parameter {name}: {value!r} is not an integer")


def validate_params(params: Mapping[str, object],
                    profile: profiles.KernelProfile) -> dict[str, int]:
    """Strictly validate user-supplied boot parameters; return ``{"slub_<suffix>": int}``.

    Raises SlabtuneError naming the parameter for: a name not on the profile's allow-list,
    a value that is not a decimal integer, a value outside its range (orders 0..10,
    min_objects 0..32767), the same parameter given twice under two spellings, and
    min_order above max_order when both are given (the kernel would silently move one).
    A flag (``slub_nomerge``, ``slab_nomerge`` from v3.18) is true/1, false/0 or None
    (given bare); a string value is refused; it is kept as ``{"slub_nomerge": 1}`` when set.
    """
    names = allowed_names(profile)
    flags = allowed_flags(profile)
    out: dict[str, int] = {}
    for name, value in params.items():
        if str(name) in flags:
            key = f"{CANONICAL_PREFIX}_{flags[str(name)]}"
            if key in out:
                raise SlabtuneError(f"boot parameter {name}: {flags[str(name)]} is given twice")
            if _flag(str(name), value):
                out[key] = 1
            continue
        suffix = names.get(str(name))
        if suffix is None:
            from slabtune.model import slab  # slab imports this module

            foreign = slab.foreign_knob(str(name), profile)
            allowed = ", ".join([*names, *flags])
            raise SlabtuneError(
                f"boot parameter {name!r} is not allowed for kernel profile {profile.name}"
                f"{': ' + foreign if foreign else ''} (allowed: {allowed})")
        v = _strict_int(name, value)
        lo, hi = PARAM_RANGES[suffix]
        if not lo <= v <= hi:
            raise SlabtuneError(f"boot parameter {name}: {v} is outside {lo}..{hi}")
        key = f"{CANONICAL_PREFIX}_{suffix}"
        if key in out:
            raise SlabtuneError(f"boot parameter {name}: {suffix} is given twice")
        out[key] = v
    lo_o, hi_o = out.get("slub_min_order"), out.get("slub_max_order")
    if lo_o is not None and hi_o is not None and lo_o > hi_o:
        raise SlabtuneError(
            f"boot parameter slub_min_order: {lo_o} is above slub_max_order {hi_o}")
    return out


def validate_params_any_profile(params: Mapping[str, object]) -> dict[str, int]:
    """:func:`validate_params` before the kernel is known: a name must be on the allow-list
    in some spelling (``slub_*``, or ``slab_*`` from v6.8), a value in its range.  The
    target kernel's profile is checked again once it is known."""
    widest = max(profiles.PROFILES.values(), key=lambda p: len(p.boot_param_prefixes))
    names = [*allowed_names(widest), *allowed_flags(widest)]
    for name in params:
        if str(name) not in names:
            raise SlabtuneError(f"boot parameter {name!r} is not allowed by any kernel "
                                f"profile (allowed: {', '.join(names)})")
    return validate_params(params, widest)


def validate_cmdline(cmdline: str, profile: profiles.KernelProfile) -> dict[str, int]:
    """Strictly validate the SLUB parameters a command line sets, in order; other arguments
    are the kernel's business and ignored.  Returns ``{"slub_<suffix>": last value}`` (the
    kernel's in-order parsing lets the last one win).  A value that is not a decimal
    integer in range raises SlabtuneError naming the parameter as written and its range;
    min_order above max_order is left to :func:`parse_cmdline`'s kernel semantics.  A flag
    (``slub_nomerge``) given a value (``slub_nomerge=1``) is refused, as is a spelling of it
    the profile's kernel does not take (``slab_nomerge`` before v3.18, ``slab_no_merge``)."""
    out: dict[str, int] = {}
    flags = allowed_flags(profile)
    for arg in split_cmdline(cmdline):
        name, eq, value = arg.partition("=")
        norm = _normalise(name)
        if norm in flags:
            if eq:
                raise SlabtuneError(f"cmdline {arg}: {name} is a flag that takes no value")
            out[f"{CANONICAL_PREFIX}_{flags[norm]}"] = 1
        elif norm.replace("_", "") in ("slabnomerge", "slubnomerge"):
            raise SlabtuneError(f"cmdline {arg}: not a nomerge spelling kernel profile "
                                f"{profile.name} takes (it takes: {', '.join(flags)})")
    for name, suffix, value in slub_args(cmdline, profile):
        lo, hi = PARAM_RANGES[suffix]
        try:
            v = _strict_int(name, value)
        except SlabtuneError:
            v = None
        if v is None or not lo <= v <= hi:
            raise SlabtuneError(f"cmdline {name}={value}: must be an integer in {lo}..{hi}")
        out[f"{CANONICAL_PREFIX}_{suffix}"] = v
    return out


def cmdline_arg(key: str, value: int) -> str:
    """One argument of a validated dict as a command line takes it: ``slub_min_order=2``,
    a flag bare (``slub_nomerge``)."""
    if key.startswith(f"{CANONICAL_PREFIX}_") and key[len(CANONICAL_PREFIX) + 1:] in FLAG_SUFFIXES:
        return key
    return f"{key}={int(value)}"


def params_from_validated(validated: Mapping[str, int]) -> SlubParams:
    """The effective parameters of a validated dict (defaults for what it leaves out;
    validation already ensured min_order <= max_order when both are given)."""
    p = SlubParams()
    lo = validated.get("slub_min_order", p.min_order)
    hi = validated.get("slub_max_order", max(p.max_order, lo))
    return SlubParams(lo, hi, validated.get("slub_min_objects", p.min_objects))


def render(validated: Mapping[str, int], profile: profiles.KernelProfile,
           prefix: str | None = None) -> str:
    """Render a validated dict as a command-line fragment in the profile's spelling:
    ``slub_*`` before v6.8 and, by default, the ``slab_*`` names newer kernels document
    (``prefix`` picks any spelling the profile accepts).  Order is min_order, max_order,
    min_objects; with min_order <= max_order either setup order gives the same result."""
    prefixes = profile.boot_param_prefixes
    prefix = prefixes[-1] if prefix is None else prefix
    if prefix not in prefixes:
        raise SlabtuneError(
            f"boot parameter prefix {prefix!r} is not accepted by kernel profile "
            f"{profile.name} (accepted: {', '.join(prefixes)})")
    checked = validate_params(dict(validated), profile)
    parts = []
    for suffix in PARAM_SUFFIXES:
        key = f"{CANONICAL_PREFIX}_{suffix}"
        if key in checked:
            parts.append(f"{prefix}_{suffix}={checked[key]}")
    flags = allowed_flags(profile)
    for suffix in FLAG_SUFFIXES:
        if checked.get(f"{CANONICAL_PREFIX}_{suffix}"):
            name = f"{prefix}_{suffix}"
            parts.append(name if name in flags else f"{CANONICAL_PREFIX}_{suffix}")
    return " ".join(parts)
