"""Which targets can run here, and the (candidate, topology, target) tasks of a run, checked
before anything boots.
"""


from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slabtune.errors import SlabtuneError
from slabtune.model import bootparams, profiles
from slabtune.validate.candidates import Candidate
from slabtune.validate.native_tasks import check_workload, native_doc
from slabtune.validate.schema import BASELINE_ID, TARGETS
from slabtune.validate.spec import ValidateSpec

# --------------------------------------------------------------------------- targets


def native_available() -> str | None:
    """None when the native allocator can run here, else why not."""
    import importlib

    for mod in ("slabtune.validate.native", "slabtune.sweeps.simconfig", "slabtune.sweeps.simulate",
                "slabtune.model.metrics"):
        try:
            importlib.import_module(mod)
        except ImportError as err:
            return f"{mod} is not available ({err})"
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    return None


def guest_available() -> str | None:
    """None when qemu, a kernel and busybox are installed here, else why not."""
    from slabtune.kernel import guest

    try:
        guest.find_assets(build=False)
    except SlabtuneError as err:
        return str(err)
    return None


def available_targets() -> dict[str, str | None]:
    """target -> None (runs here) or the reason it cannot."""
    from slabtune.validate.lab import lab_available
    from slabtune.validate.uml import uml_available

    host = None if Path("/sys/kernel/slab").is_dir() else "/sys/kernel/slab is missing"
    return {"guest": guest_available(), "host": host, "native": native_available(),
            "lab": lab_available(), "uml": uml_available()}


def parse_targets(text: str | None) -> tuple[str, ...]:
    """``--target`` (one name or a comma list); None means every target available here."""
    avail = available_targets()
    if text is None:
        chosen = tuple(t for t in TARGETS if avail[t] is None)
        if not chosen:
            raise SlabtuneError("--target: no target can run here: "
                                + "; ".join(f"{k}: {v}" for k, v in avail.items()))
        return chosen
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise SlabtuneError("--target: empty")
    for t in names:
        if t not in TARGETS:
            raise SlabtuneError(f"--target: {t!r} is not one of {', '.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in names)


#: Why a target does not validate a SLAB spec: SLAB (mm/slab.c, CONFIG_SLAB, removed in
#: v6.8) runs only in the lab's 6.1 build with CONFIG_SLAB=y.
SLAB_SKIPPED: dict[str, str] = {
    "guest": "the guest kernel is a SLUB build; only the lab's 6.1-slab kernel runs SLAB",
    "host": "this machine's kernel is not the lab's SLAB build",
    "native": "the native allocator is a userspace twin of the SLUB model; SLAB has none",
    "uml": "the UML kernel is 7.2, whose only allocator is SLUB",
}


def slab_targets(spec: ValidateSpec, targets: Sequence[str]
                 ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The targets that run for ``spec`` and those skipped with their reason: every target
    for a SLUB spec; for a SLAB spec only ``lab`` (:data:`SLAB_SKIPPED`)."""
    if not profiles.is_slab(spec.fleet.profile):
        return tuple(targets), {}
    return (tuple(t for t in targets if t not in SLAB_SKIPPED),
            {t: SLAB_SKIPPED[t] for t in targets if t in SLAB_SKIPPED})


def check_boot(boot: dict, prof) -> dict:
    """A candidate's boot parameters against a kernel's profile: SLUB's allow-list
    (:func:`slabtune.model.bootparams.validate_params`) or a SLAB profile's
    (:func:`slabtune.model.slab.validate_params`)."""
    if profiles.is_slab(prof):
        from slabtune.model import slab

        return slab.validate_params(boot, prof)
    return bootparams.validate_params(boot, prof)


# --------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class Task:
    index: int
    candidate: Candidate
    topology: str
    target: str


def plan_tasks(cands: Sequence[Candidate], spec: ValidateSpec,
               targets: Sequence[str], uml_topologies: Sequence[str] | None = None
               ) -> list[Task]:
    """Every (candidate, topology) pair per target: guest, native and lab over the spec's
    topologies (a lab task boots every lab kernel of the run), uml over the topologies UML
    can express (``uml_topologies``; default :func:`slabtune.validate.uml.plan_topologies`
    with the default CPU limit), host for the baseline only (the host cannot reboot with
    other parameters).  A SLAB spec's tasks are lab tasks only (:func:`slab_targets`)."""
    tasks: list[Task] = []
    targets, _ = slab_targets(spec, targets)
    for target in TARGETS:
        if target not in targets:
            continue
        names = [t.name for t in spec.fleet.topologies]
        if target == "uml":
            if uml_topologies is None:
                from slabtune.validate.uml import plan_topologies

                uml_topologies = plan_topologies(spec, None)[0]
            names = [n for n in names if n in set(uml_topologies)]
        for c in cands:
            if target == "host":
                if c.id == BASELINE_ID:
                    tasks.append(Task(len(tasks), c, "host", target))
                continue
            for name in names:
                tasks.append(Task(len(tasks), c, name, target))
    return tasks


def preflight(cands: Sequence[Candidate], spec: ValidateSpec, targets: Sequence[str],
              uml_opts: dict | None = None) -> dict:
    """Refuse bad input before any qemu starts: every candidate's boot parameters against
    the guest kernel's profile, the guest assets present.  Returns facts for the manifest.
    ``uml_opts``: :func:`slabtune.validate.uml.check_options` (defaults when None).  A SLAB
    spec runs only the lab target: the others are skipped with their reason (recorded in
    the manifest as ``skipped_targets``), and a run with no lab target is refused."""
    info: dict[str, Any] = {}
    targets, skipped = slab_targets(spec, targets)
    if skipped:
        info["skipped_targets"] = skipped
        if not targets:
            t, why = next(iter(skipped.items()))
            raise SlabtuneError(f"--target {t}: spec {spec.name} has the SLAB profile "
                                f"{spec.fleet.profile.name}: {why} (use --target lab)")
    if "uml" in targets:
        from slabtune.validate import uml

        opts = uml_opts if uml_opts is not None else uml.check_options(None, None, None)
        keep, skipped = uml.plan_topologies(spec, opts["max_cpus"])
        if not keep and list(targets) == ["uml"]:
            raise SlabtuneError(f"--target uml: no topology of spec {spec.name} can run under "
                                f"UML ({skipped[0]['topology']}: {skipped[0]['reason']})")
        info.update(uml.check_pairs(cands, spec, keep), uml_topologies=keep,
                    uml_skipped=skipped, uml_runs=opts["runs"], uml_ops=opts["ops"],
                    uml_max_cpus=uml.cpu_limit(opts["max_cpus"]))
    if "guest" in targets:
        from slabtune.kernel import guest

        assets = guest.find_assets()
        prof = guest.kernel_profile(assets.kernel)
        info["guest_kernel"] = str(assets.kernel)
        info["guest_profile"] = prof.name
        for c in cands:
            try:
                bootparams.validate_params(dict(c.boot), prof)
            except SlabtuneError as err:
                raise SlabtuneError(f"candidate {c.id}: {err}") from None
    if "lab" in targets:
        from slabtune.kernel import labmod
        from slabtune.validate import lab

        why = lab.lab_available()
        if why is not None:
            raise SlabtuneError(f"--target lab: {why}")
        # a SLAB profile's candidates boot the lab's SLAB kernel, a SLUB one's the others
        kernels = lab.resolve_kernels(None, slab=profiles.is_slab(spec.fleet.profile))
        info["lab_kernels"] = kernels
        profs = {k: lab.kernel_profile(k) for k in kernels}
        for c in cands:
            for k, prof in profs.items():
                try:
                    check_boot(dict(c.boot), prof)
                except SlabtuneError as err:
                    raise SlabtuneError(f"candidate {c.id} (lab {k}): {err}") from None
            per_cache = lab.lab_cache_values(spec, c)
            for t in spec.fleet.topologies:
                try:
                    for prof in profs.values():
                        doc = lab.validate_doc(spec, c, t.name, prof, per_cache)
                        lab.spec_for(doc, prof)
                        labmod.config_params(doc)
                except SlabtuneError as err:
                    raise SlabtuneError(f"candidate {c.id} (lab, {t.name}): {err}") from None
    if "native" in targets:
        why = native_available()
        if why is not None:
            raise SlabtuneError(f"--target native: {why}")
        from slabtune.sweeps import simconfig

        for c in cands:
            for t in spec.fleet.topologies:
                try:
                    sim = simconfig.parse_doc(native_doc(spec, c, t.name)[0])
                    check_workload(sim)
                except SlabtuneError as err:
                    raise SlabtuneError(f"candidate {c.id} (native, {t.name}): {err}") from None
    return info
