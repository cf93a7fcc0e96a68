"""The cost model: constants as documented data, and the lock-contention fixed point."""

from __future__ import annotations

import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from slabtune.model import cost
from slabtune.sweeps import simconfig


@pytest.fixture(scope="module")
def default():
    return simconfig.load_cost()[0]


def test_every_constant_is_documented_and_has_a_default():
    doc = tomllib.loads(simconfig.default_cost_text())
    assert set(cost.DOCS) == set(cost.FIELDS)
    assert set(doc["cost"]) == set(cost.FIELDS)
    # Constants fitted to published figures say so, each naming what it was fitted to.
    for name, what in doc.get("fitted", {}).items():
        assert name in cost.FIELDS and isinstance(what, str) and what
    _, meta = simconfig.load_cost()
    assert meta.fitted == doc.get("fitted", {})


def test_unfitted_defaults_are_the_documented_priors():
    # One place for the physical values: the packaged constants not marked as fitted are
    # slabtune.model.priors.PRIOR, and every constant, fitted or not, lies in its range.
    from slabtune.model import priors

    doc = tomllib.loads(simconfig.default_cost_text())
    fitted = set(doc.get("fitted", {}))
    assert fitted, "the packaged table records what was fitted, and to what"
    for name, value in doc["cost"].items():
        p = priors.PRIOR[name]
        if name not in fitted:
            assert value == p.value, name
        assert p.lo <= value <= p.hi, (name, value, p.lo, p.hi)
    assert priors.implausible(doc["cost"]) == []
    # Nothing is fitted to a published figure: the fitted ones name the UML timings.
    for name, what in doc["fitted"].items():
        assert "User Mode Linux" in what and "calibrate/data/uml-" in what, name


def test_zone_block_lines_may_be_zero():
    # A section's own line is at least one, but the lines per block may be none (a table
    # that prices the zone lock as before zone_block_lines existed).
    base, _ = simconfig.load_cost()
    params, _ = cost.parse_cost_toml("[cost]\nzone_block_lines = 0.0\n", "z.toml", base)
    assert float(params.zone_block_lines) == 0.0
    with pytest.raises(cost.CostError, match="^cost.zone_lock_lines: 0.0 must be at least 1"):
        cost.parse_cost_toml("[cost]\nzone_lock_lines = 0.0\n", "z.toml", base)


def test_cost_files_without_line_counts_load_with_the_priors(tmp_path):
    # A cost table written before the line counts existed (every other constant given)
    # still loads, with the physical priors of the counts.
    from slabtune.model import priors

    old = {k: v for k, v in priors.prior_values().items() if k not in cost.OPTIONAL_DEFAULTS}
    assert set(old) | set(cost.OPTIONAL_DEFAULTS) == set(cost.FIELDS)
    text = "[cost]\n" + "".join(f"{k} = {v!r}\n" for k, v in old.items())
    params, _ = cost.parse_cost_toml(text, "old.toml")
    assert float(params.list_lock_lines) == priors.PRIOR["list_lock_lines"].value == 3.0
    assert float(params.barn_lock_lines) == priors.PRIOR["barn_lock_lines"].value == 3.0
    assert float(params.zone_lock_lines) == priors.PRIOR["zone_lock_lines"].value == 4.0
    # Over a base (a --cost file over the packaged table) the base's counts are kept.
    base = cost.cost_from_mapping({**old, "list_lock_lines": 6.0})
    params, _ = cost.parse_cost_toml("[cost]\nline_local_ns = 45.0\n", "f.toml", base=base)
    assert float(params.list_lock_lines) == 6.0 and float(params.line_local_ns) == 45.0
    # Every other constant is still required.
    with pytest.raises(cost.CostError, match="cost.alloc_fast_ns: missing"):
        cost.parse_cost_toml(text.replace("alloc_fast_ns", "#"), "old.toml")


def test_file_overrides_only_what_it_names(tmp_path, default):
    f = tmp_path / "c.toml"
    f.write_text('[cost]\nlist_lock_hold_ns = 123.5\n[fitted]\nlist_lock_hold_ns = "lockstat"\n')
    params, meta = simconfig.load_cost(f)
    assert float(params.list_lock_hold_ns) == 123.5
    assert float(params.line_remote_ns) == float(default.line_remote_ns)
    assert meta.fitted["list_lock_hold_ns"] == "lockstat"
    # Packaged constants the file leaves alone keep their "fitted" note, spelled out.
    default_fitted = simconfig.load_cost()[1].fitted
    for name in default_fitted:
        if name != "list_lock_hold_ns":
            assert name in meta.fitted and not meta.fitted[name].startswith("(see list_lock")
    f.write_text("[cost]\nalloc_fast_ns = 9.0\n")
    _, meta = simconfig.load_cost(f)
    assert "alloc_fast_ns" not in meta.fitted
    assert all(not v.startswith("(see alloc_fast_ns") for v in meta.fitted.values())


@pytest.mark.parametrize("text, field", [
    ("[cost]\nlist_lock_hodl_ns = 1.0\n", "cost.list_lock_hodl_ns"),
    ("[cost]\nbarn_lock_hold_ns = -1.0\n", "cost.barn_lock_hold_ns"),
    ("[cost]\npcp_batch = 0.5\n", "cost.pcp_batch"),
    ("[cost]\nqueueing = 0.0\n", "cost.queueing"),
    ("[cost]\nlist_lock_lines = 0.5\n", "cost.list_lock_lines"),
    ("[cost]\nzone_lock_lines = -2.0\n", "cost.zone_lock_lines"),
    ("[cost]\nzone_block_lines = -1.0\n", "cost.zone_block_lines"),
    ("[cost]\nalloc_fast_ns = \"fast\"\n", "cost.alloc_fast_ns"),
    ("[fitted]\nnot_a_constant = \"x\"\n", "fitted.not_a_constant"),
    ("[costs]\n", "[costs]"),
])
def test_bad_constants_name_the_field(tmp_path, text, field):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(simconfig.ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        simconfig.load_cost(f)


def test_pcp_caches_only_order0_before_v5_13():
    assert cost.pcp_max_order((5, 10)) == 0
    assert cost.pcp_max_order((5, 11)) == 0
    assert cost.pcp_max_order((5, 13)) == 3
    assert cost.pcp_max_order((7, 0)) == 3


def test_page_call_cost_by_order(default):
    # v5.11: an order-2 slab goes to the buddy lists and takes the zone lock on every call,
    # an order-0 slab is served from the per-CPU lists and takes it once per batch.
    assert float(cost.page_call_ns(0, 0, default)) == float(default.pcp_call_ns)
    assert float(cost.page_call_ns(2, 0, default)) == float(default.buddy_call_ns)
    assert float(cost.page_call_ns(2, 3, default)) == float(default.pcp_call_ns)
    assert float(cost.zone_lock_per_call(2, 0, default)) == 1.0
    assert float(cost.zone_lock_per_call(0, 0, default)) == pytest.approx(
        1 / float(default.pcp_batch))
    # Setup grows with pages and objects: order 3 with 64 objects.
    want = 8 * float(default.page_setup_ns) + 64 * float(default.object_setup_ns)
    assert float(cost.slab_setup_ns(3, 64, default)) == pytest.approx(want)


def _one_lock(n_cpus, base=100.0, hold=80.0, acq=1.0):
    return cost.solve(jnp.array([base]), jnp.array([[acq]]), jnp.array([hold]), jnp.zeros((1, 1)),
                   jnp.array([float(n_cpus)]), jnp.array([1.0]))


def _exact_mva(n, think, service):
    """Exact single-class MVA of the machine-repairman model, by the textbook recursion
    (R(k) = S (1 + Q(k-1)), X(k) = k / (Z + R(k)), Q(k) = X(k) R(k)): cycle time Z + R."""
    q = 0.0
    for k in range(1, n + 1):
        r = service * (1.0 + q)
        q = k / (think + r) * r
    return think + r


def test_lines_move_only_from_another_cpu():
    """A lock's lines stay with its last holder: the fraction of acquisitions whose previous
    holder was another CPU is 1 - this CPU's share of the lock instance's acquisitions."""
    f = lambda acq, w, m, d: np.asarray(cost.foreign_holder_fraction(  # noqa: E731
        jnp.array(acq), jnp.array(w), jnp.array(m), jnp.array(d)))
    # one CPU alone on a lock: it is always the previous holder, no line moves
    assert f([[0.3]], [1.0], [1.0], [1.0])[0, 0] == 0.0
    # two CPUs of one rep on one lock, equal rates: half the acquisitions move the lines
    assert f([[0.3]], [2.0], [1.0], [1.0])[0, 0] == pytest.approx(0.5)
    # the same two CPUs as two reps of one CPU each: the same half
    np.testing.assert_allclose(f([[0.3], [0.3]], [1.0, 1.0], [1.0], [1.0, 1.0]), [[0.5], [0.5]])
    # two CPUs on two locks of the class (one node each): each alone on its own
    assert f([[0.3]], [2.0], [2.0], [1.0])[0, 0] == 0.0
    # an interrupt CPU taking 19 of every 20 acquisitions finds its lines 95% of the time;
    # the CPU it shares the lock with finds them 5% of the time (the rate is acq x duty)
    np.testing.assert_allclose(f([[0.95], [0.1]], [1.0, 1.0], [1.0], [1.0, 0.5]),
                               [[0.05], [0.95]], rtol=1e-6)
    # eight CPUs of one rep: 7/8 of the acquisitions follow another CPU
    assert f([[1.0]], [8.0], [1.0], [1.0])[0, 0] == pytest.approx(7 / 8)
    # an inactive rep (weight 0) brings no acquisitions
    assert f([[0.3], [5.0]], [1.0, 0.0], [1.0], [1.0, 1.0])[0, 0] == 0.0


def test_a_lone_cpu_never_waits():
    s = _one_lock(1)
    assert float(s.t[0]) == pytest.approx(180.0)
    assert float(s.wait[0, 0]) == 0.0


def test_fixed_point_satisfies_the_mean_value_equations():
    """Bard-Schweitzer: W = (n - 1) / n * Q * S with Q = n * S_tot / t (Little), and it
    stays within 8% of the exact MVA recursion of the same closed queue."""
    base, hold = 100.0, 80.0
    for n in (2, 4, 10, 30, 300):
        s = _one_lock(n, base, hold)
        t = float(s.t[0])
        q = n * (hold + float(s.wait[0, 0])) / t
        assert float(s.wait[0, 0]) == pytest.approx((n - 1) / n * q * hold, rel=2e-3), n
        assert t == pytest.approx(_exact_mva(n, base, hold), rel=0.08), n
        assert float(s.residual) < 2e-3


def test_a_closed_queue_never_holds_more_than_its_cpus():
    """However many CPUs, no CPU waits behind more than all the others."""
    for n in (2, 16, 4096):
        s = _one_lock(n, base=1.0, hold=500.0)
        assert float(s.wait[0, 0]) <= (n - 1) * 500.0 * (1 + 1e-5)


def test_contention_grows_with_cpus_and_saturates_at_the_lock():
    hold = 80.0
    ts = [float(_one_lock(n).t[0]) for n in (1, 2, 8, 64, 1024, 8192)]
    assert ts == sorted(ts) and ts[-1] > 100 * ts[0]
    # Many CPUs: the lock is busy all the time and serves 1 / hold acquisitions per ns.
    for n in (1024, 8192):
        throughput = n / float(_one_lock(n).t[0])
        assert throughput * hold == pytest.approx(1.0, rel=0.01)


def test_more_locks_spread_the_arrivals():
    # 64 CPUs over 4 real locks of one class behave like 16 CPUs on one lock.
    a = cost.solve(jnp.array([100.0]), jnp.array([[1.0]]), jnp.array([80.0]), jnp.zeros((1, 1)),
                jnp.array([64.0]), jnp.array([4.0]))
    b = _one_lock(16)
    assert float(a.t[0]) == pytest.approx(float(b.t[0]), rel=1e-4)


def test_two_coupled_locks_converge():
    # Rep 0 uses lock 0 heavily and lock 1 a little; rep 1 the reverse; lines cost extra.
    base = jnp.array([50.0, 70.0])
    acq = jnp.array([[1.0, 0.1], [0.2, 0.8]])
    hold = jnp.array([80.0, 40.0])
    line = jnp.array([[40.0, 150.0], [150.0, 40.0]])
    s = cost.solve(base, acq, hold, line, jnp.array([20.0, 30.0]), jnp.array([1.0, 1.0]))
    assert float(s.residual) < 1e-3
    t = np.asarray(s.t)
    tau = t.max()  # both reps do one op per step: the slower sets the pace
    assert float(s.tau) == pytest.approx(tau)
    service = np.asarray(hold)[None, :] + np.asarray(line)
    rho = (np.array([20.0, 30.0])[:, None] * np.asarray(acq) * service / tau).sum(0)
    np.testing.assert_allclose(rho, np.asarray(s.rho), rtol=2e-3)
    assert float(s.throughput) == pytest.approx(50.0 / tau, rel=1e-5)


def test_uncoupled_groups_keep_their_own_pace():
    # Rep 0 (8 CPUs) queues on a saturated lock; rep 1 (8 CPUs) never takes it.  Coupled,
    # rep 1 idles to rep 0's pace; uncoupled (they exchange no objects) it runs at its own
    # 100 ns per op and the machine's throughput is the sum of the two rates.
    args = (jnp.array([100.0, 100.0]), jnp.array([[1.0], [0.0]]), jnp.array([200.0]),
            jnp.zeros((2, 1)), jnp.array([8.0, 8.0]), jnp.array([1.0]), 1.0)
    tied = cost.solve(*args)
    free = cost.solve(*args, coupling=jnp.eye(2, dtype=bool))
    t0 = float(free.t[0])
    assert 1.0 / 200.0 == pytest.approx(8.0 / t0, rel=0.02)        # the lock serves 1/hold
    np.testing.assert_allclose(np.asarray(free.pace), [t0, 100.0], rtol=1e-3)
    assert float(free.throughput) == pytest.approx(8.0 / t0 + 8.0 / 100.0, rel=1e-3)
    assert float(tied.throughput) == pytest.approx(16.0 / float(tied.tau), rel=1e-5)
    assert float(free.throughput) > 5 * float(tied.throughput)
    # The lock's own arrivals and so rep 0's time do not depend on the idle rep.
    assert float(tied.t[0]) == pytest.approx(t0, rel=1e-3)


def test_idle_steps_lower_a_reps_arrivals():
    # Rep 0 (slow, lock-free work) sets the pace; rep 1 does an op every other step: half
    # the arrivals of the same CPUs at full duty.
    args = (jnp.array([2000.0, 100.0]), jnp.array([[0.0], [1.0]]), jnp.array([80.0]),
            jnp.zeros((2, 1)), jnp.array([1.0, 8.0]), jnp.array([1.0]), 1.0)
    full = cost.solve(*args, duty=jnp.array([1.0, 1.0]))
    half = cost.solve(*args, duty=jnp.array([1.0, 0.5]))
    assert float(full.rho[0]) == pytest.approx(8 * 80.0 / 2000.0, rel=1e-3)
    assert float(half.rho[0]) == pytest.approx(4 * 80.0 / 2000.0, rel=1e-3)
    assert float(half.t[1]) < float(full.t[1])


def test_remote_holders_lower_a_locks_capacity():
    # 64 CPUs on one lock: when the line crosses the interconnect on every acquisition the
    # lock serves 1 / (hold + line) acquisitions per ns instead of 1 / (hold + local line).
    def run(line):
        return cost.solve(jnp.array([100.0]), jnp.array([[1.0]]), jnp.array([80.0]),
                       jnp.full((1, 1), line), jnp.array([64.0]), jnp.array([1.0]))
    near, far = run(40.0), run(150.0)
    assert float(near.throughput) * 120.0 == pytest.approx(1.0, rel=0.02)
    assert float(far.throughput) * 230.0 == pytest.approx(1.0, rel=0.02)


def test_solve_vmaps_over_configurations():
    weights = jnp.array([[1.0], [4.0], [64.0]])
    f = jax.vmap(lambda w: cost.solve(jnp.array([100.0]), jnp.array([[1.0]]), jnp.array([80.0]),
                                   jnp.zeros((1, 1)), w, jnp.array([1.0])).t)
    batched = np.asarray(f(weights))[:, 0]
    single = [float(_one_lock(n).t[0]) for n in (1, 4, 64)]
    np.testing.assert_allclose(batched, single, rtol=1e-5)


def test_a_cost_file_of_the_open_queue_model_still_loads():
    """``rho_max`` capped the open M/M/1 queue the closed one replaced: a file that sets
    it loads, and the value changes nothing."""
    base = cost.rig_cost({}, 31.0)._replace(queueing=jnp.float32(1.0))
    old, _ = cost.parse_cost_toml("[cost]\nalloc_fast_ns = 7.0\nrho_max = 0.9\n", base=base)
    new, _ = cost.parse_cost_toml("[cost]\nalloc_fast_ns = 7.0\n", base=base)
    assert all(float(a) == float(b) for a, b in zip(old, new))
    assert float(old.queueing) == 1.0


def test_a_freed_slab_pays_its_pages_not_its_objects(default):
    # allocate_slab() writes every object's free pointer; __free_slab() touches the pages
    # only.  So object_setup_ns is charged per slab allocated (times its objects), never
    # on a slab free, and never per object allocated.
    zero = cost.OpRates(*([jnp.float32(0.0)] * len(cost.OpRates._fields)))
    call = float(cost.page_call_ns(3, 3, default))
    new = float(cost.base_ns_per_op(zero._replace(slab_alloc=jnp.float32(1.0)), 3, 64, 3,
                                    default))
    freed = float(cost.base_ns_per_op(zero._replace(slab_free=jnp.float32(1.0)), 3, 64, 3,
                                      default))
    assert new == pytest.approx(call + 8 * float(default.page_setup_ns)
                                + 64 * float(default.object_setup_ns))
    assert freed == pytest.approx(call + 8 * float(default.page_setup_ns))
    assert float(cost.slab_teardown_ns(3, default)) == pytest.approx(
        8 * float(default.page_setup_ns))


def test_priced_events_the_one_mapping():
    # SLUB_STATS-like counters to priced events: exchanges (BARN_GET/BARN_PUT) move a
    # sheaf, failed attempts only take the barn lock, objects refilled and flushed are
    # counted in objects, remote frees in lines.
    s = cost.SlubCounts(alloc_fast=1.0, alloc_slow=0.1, free_fast=0.9, free_slow=0.2,
                        remote_free=0.5, barn_get=0.03, barn_get_fail=0.02, barn_put=0.04,
                        barn_put_fail=0.01, sheaf_refill=0.56, sheaf_flush=0.28,
                        slab_alloc=0.07, slab_free=0.06, cpu_partial_drain=0.0,
                        list_lock=0.05)
    ev = cost.priced_events(s, remote_free_lines=2.0)
    assert ev.rates.sheaf_swap == pytest.approx(0.07)
    assert ev.barn_lock == pytest.approx(0.10)
    assert ev.rates.sheaf_objects_moved == pytest.approx(0.84)
    assert ev.rates.remote_free == pytest.approx(1.0)
    assert (ev.rates.alloc_fast, ev.rates.alloc_slow, ev.list_lock) == (1.0, 0.1, 0.05)


def test_irq_off_sections_count_every_irqsave_lock_section():
    # 7.2 takes the list_lock, the barn lock (exchanges and failed attempts alike) and
    # zone->lock with spin_lock_irqsave; the sheaf fast paths and the per-CPU page lists
    # mask no interrupts.  A zone->lock section serves pcp_batch page allocator calls for
    # orders the per-CPU lists cache, one call above them.
    default, _ = simconfig.load_cost()
    s = cost.SlubCounts(alloc_fast=1.0, alloc_slow=0.1, free_fast=0.9, free_slow=0.2,
                        remote_free=0.5, barn_get=0.03, barn_get_fail=0.02, barn_put=0.04,
                        barn_put_fail=0.01, sheaf_refill=0.56, sheaf_flush=0.28,
                        slab_alloc=0.07, slab_free=0.06, cpu_partial_drain=0.3,
                        list_lock=0.05)
    ev = cost.priced_events(s)
    batch = float(default.pcp_batch)
    assert float(cost.irq_off_sections(ev, 0, 3, default)) == pytest.approx(
        0.05 + 0.10 + 0.13 / batch)
    assert float(cost.irq_off_sections(ev, 4, 3, default)) == pytest.approx(
        0.05 + 0.10 + 0.13)
    # fast paths alone take none
    fast = cost.SlubCounts(**{**dict.fromkeys(cost.SlubCounts._fields, 0.0),
                              "alloc_fast": 1.0, "free_fast": 1.0})
    assert float(cost.irq_off_sections(cost.priced_events(fast), 0, 3, default)) == 0.0
