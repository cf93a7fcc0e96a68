"""Boot parameters: command-line splitting, the kernel's setup_slub_* semantics, strict
validation of user values and rendering back to a command line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams
from slabtune.model.profiles import get_profile

V618 = get_profile("v6.18")
V61 = get_profile("v6.1")
V510 = get_profile("v5.10")
HOST_CMDLINE = ("mitigations=auto console=ttyS0 quiet rdinit=/process_api -- "
                "--firecracker-init --addr 0.0.0.0:2024")


def test_allowed_names_follow_profile_prefixes():
    assert set(bootparams.allowed_names(V61)) == {
        "slub_min_order", "slub_max_order", "slub_min_objects"}
    assert set(bootparams.allowed_names(V618)) == {
        "slub_min_order", "slub_max_order", "slub_min_objects",
        "slab_min_order", "slab_max_order", "slab_min_objects"}


@pytest.mark.parametrize("line, args", [
    ("a b  c", ["a", "b", "c"]),
    ('foo="bar baz" x', ["foo=bar baz", "x"]),
    ('"slub_max_order=2" y', ["slub_max_order=2", "y"]),
    ("a -- slub_max_order=1", ["a"]),
    ("  \t\n", []),
    ("a --x b", ["a", "--x", "b"]),
])
def test_split_cmdline(line, args):
    assert bootparams.split_cmdline(line) == args


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("0x2", 2), ("010", 8), ("3abc", 3), ("abc", 0), ("", 0),
    ("-1", 2**32 - 1), ("4294967297", 1),
])
def test_get_option(text, value):
    assert bootparams.get_option(text) == value


@pytest.mark.parametrize("line, profile, expected", [
    (HOST_CMDLINE, V618, (0, 3, 0)),
    ("slub_max_order=1", V618, (0, 1, 0)),
    ("slub_min_objects=20 slub_max_order=2", V61, (0, 2, 20)),
    # setup_slub_min_order: min above max raises max (from v6.7) ...
    ("slub_min_order=5", V618, (5, 5, 0)),
    # ... but not in older kernels
    ("slub_min_order=5", V61, (5, 3, 0)),
    # setup_slub_max_order: clamp to MAX_PAGE_ORDER, then min follows max down
    ("slub_max_order=12", V618, (0, 10, 0)),
    ("slub_min_order=4 slub_max_order=2", V618, (2, 2, 0)),
    ("slub_max_order=2 slub_min_order=4", V618, (4, 4, 0)),
    ("slub_min_order=4 slub_max_order=2", V61, (4, 2, 0)),
    # the slab_* spellings exist from v6.8 only
    ("slab_max_order=1", V618, (0, 1, 0)),
    ("slab_max_order=1", V61, (0, 3, 0)),
    # parameq(): '-' and '_' are the same in parameter names
    ("slub-max-order=2", V618, (0, 2, 0)),
    # in order, last one wins; no '=' is not this parameter; after '--' is init's
    ("slub_max_order=1 slub_max_order=2", V618, (0, 2, 0)),
    ("slub_max_order", V618, (0, 3, 0)),
    ("quiet -- slub_max_order=1", V618, (0, 3, 0)),
    ('"slub_max_order=1"', V618, (0, 1, 0)),
    # get_option(): negative max wraps to a huge unsigned value, clamped to 10
    ("slub_max_order=-1", V618, (0, 10, 0)),
    ("slub_max_order=0x1", V510, (0, 1, 0)),
])
def test_parse_cmdline(line, profile, expected):
    assert tuple(bootparams.parse_cmdline(line, profile)) == expected


@pytest.mark.parametrize("params, pattern", [
    ({"slub_debug": 1}, r"boot parameter 'slub_debug' is not allowed"),
    ({"slab_max_order": 1}, r"'slab_max_order' is not allowed for kernel profile v6.1"),
    ({"slub_max_order": 11}, r"slub_max_order: 11 is outside 0..10"),
    ({"slub_max_order": -1}, r"slub_max_order: -1 is outside 0..10"),
    ({"slub_min_order": 11}, r"slub_min_order: 11 is outside 0..10"),
    ({"slub_min_objects": 32768}, r"slub_min_objects: 32768 is outside 0..32767"),
    ({"slub_min_objects": -1}, r"slub_min_objects: -1 is outside 0..32767"),
    ({"slub_max_order": "two"}, r"slub_max_order: 'two' is not an integer"),
    ({"slub_max_order": 2.0}, r"slub_max_order: 2.0 is not an integer"),
    ({"slub_max_order": True}, r"slub_max_order: True is not an integer"),
    ({"slub_min_order": 4, "slub_max_order": 2}, r"slub_min_order: 4 is above slub_max_order 2"),
])
def test_validate_rejects(params, pattern):
    with pytest.raises(SlabtuneError, match=pattern):
        bootparams.validate_params(params, V61)


def test_validate_accepts_and_canonicalises():
    assert bootparams.validate_params({"slab_max_order": "2", "slub_min_objects": 0}, V618) == {
        "slub_max_order": 2, "slub_min_objects": 0}
    assert bootparams.validate_params({"slub_max_order": 10, "slub_min_order": 10}, V61) == {
        "slub_max_order": 10, "slub_min_order": 10}
    with pytest.raises(SlabtuneError, match="given twice"):
        bootparams.validate_params({"slab_max_order": 2, "slub_max_order": 2}, V618)


def test_validate_cmdline():
    assert bootparams.validate_cmdline(HOST_CMDLINE, V618) == {}
    assert bootparams.validate_cmdline("slub_max_order=1 x=2 slub_max_order=3", V618) == {
        "slub_max_order": 3}
    with pytest.raises(SlabtuneError,
                       match=r"cmdline slub_max_order=11: must be an integer in 0..10"):
        bootparams.validate_cmdline("quiet slub_max_order=11", V618)
    with pytest.raises(SlabtuneError, match=r"cmdline slab_min_objects=abc"):
        bootparams.validate_cmdline("slab_min_objects=abc", V618)
    # an out-of-range value after '--' belongs to init, not the kernel
    assert bootparams.validate_cmdline("quiet -- slub_max_order=11", V618) == {}


def test_render_spelling():
    v = {"slub_min_order": 1, "slub_max_order": 2, "slub_min_objects": 16}
    assert bootparams.render(v, V618) == "slab_min_order=1 slab_max_order=2 slab_min_objects=16"
    assert bootparams.render(v, V61) == "slub_min_order=1 slub_max_order=2 slub_min_objects=16"
    assert bootparams.render(v, V618, prefix="slub") == \
        "slub_min_order=1 slub_max_order=2 slub_min_objects=16"
    assert bootparams.render({}, V618) == ""
    with pytest.raises(SlabtuneError, match="prefix 'slab' is not accepted by kernel profile v6.1"):
        bootparams.render(v, V61, prefix="slab")
    with pytest.raises(SlabtuneError, match="outside 0..10"):
        bootparams.render({"slub_max_order": 12}, V618)


_valid = st.fixed_dictionaries({}, optional={
    "slub_min_order": st.integers(0, 10),
    "slub_max_order": st.integers(0, 10),
    "slub_min_objects": st.integers(0, 32767),
}).filter(lambda d: d.get("slub_min_order", 0) <= d.get("slub_max_order", 10))


@given(_valid, st.sampled_from([V61, V618, V510]))
def test_render_then_parse_round_trips(params, profile):
    validated = bootparams.validate_params(params, profile)
    line = "console=ttyS0 " + bootparams.render(validated, profile) + " quiet"
    parsed = bootparams.parse_cmdline(line, profile)
    # what the kernel ends up with: defaults, with max raised to min when only min is given
    lo = params.get("slub_min_order", 0)
    hi = params.get("slub_max_order", 3)
    if "slub_max_order" not in params and lo > hi and profile.version >= (6, 7):
        hi = lo
    assert parsed == bootparams.SlubParams(lo, hi, params.get("slub_min_objects", 0))
    if profile.version >= (6, 7):
        assert parsed == bootparams.params_from_validated(validated)
