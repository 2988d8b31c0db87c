"""Whether a report section's setting is one this scenario's engine can take, and the section it
leaves when it cannot.

Some sections add a setting to the user's engine: the offload section a CPU KV tier, the
speculation section a `speculative_config`. vLLM's engine refuses some pairings (a CPU tier
needs the v1 scheduler, the paged allocator and the hash-chain prefix cache; speculation needs
the v1 scheduler and the paged allocator over full attention), and kvsim refuses them the same
way, with a `KvsimError` naming the field. A section must not kill the report over that, nor
switch the user's engine to one that takes the setting (its figures would describe an engine
the user does not run). So before its runs a section makes its first variant and builds that
variant's engine, exactly as `kvsim run` would before its first step (`refusal`); the rules are
the scenario validation's and the engine builder's own, not repeated here. A refused section is
`skipped`: its title, the setting, the refusal, no tables and no figure. A section with nothing to simulate for
this scenario though the engine takes its setting (the offload section's trace slice, every prompt of which this
engine refuses) is `inapplicable`: the same, with the reason in the section's words.

Other sections compare the user's engine with variants of it (paged against the slab allocators,
prefix caching on against off). A variant this engine refuses is left out of the comparison
(`refused_settings`) and the section says so in one sentence
(`left_out_text`), quoting the refusal; the rest of the section runs on the user's engine as given.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.engine.builder import build_engine
from kvsim.model.errors import KvsimError
from kvsim.report.section import Section
from kvsim.workload.scenario import Scenario


def refusal(make_variant: Callable[[], Scenario]) -> str | None:
    """The one-line `KvsimError` that making the section's variant or building its engine raises (the
    engine's own reason for refusing the setting), or None when the engine takes it. Nothing is simulated."""
    try:
        build_engine(make_variant(), np.random.default_rng(0))
    except KvsimError as error:
        return str(error)
    return None


def refused_settings(variants: dict[str, Callable[[], Scenario]]) -> dict[str, str]:
    """Of a comparison's `variants` (a setting such as `engine.allocator=slab-max` → its first run), those
    this engine refuses, each with its `refusal`. A study leaves their rows out and says so
    (`left_out_text`); it never changes the user's engine to make them run."""
    return {setting: reason for setting, make in variants.items() if (reason := refusal(make)) is not None}


def skipped(key: str, title: str, setting: str, reason: str) -> Section:
    """The section of a setting this engine refused: no tables, `skipped` set to the refusal."""
    return Section(key, title, facts={"setting": setting}, skipped=reason)


def inapplicable(key: str, title: str, why: str) -> Section:
    """The section of a study this scenario gives nothing to simulate (`why`: a sentence saying so, with the
    numbers): no tables, `skipped` set to `why`, no setting named."""
    return Section(key, title, skipped=why)


def skipped_text(sec: Section) -> str:
    """Why the section was not run (the engine's refusal of its setting, or why it does not apply) and that nothing
    was simulated for it."""
    if "setting" not in sec.facts:  # `inapplicable`
        return f"Not run: {sec.skipped} Nothing was simulated for this section."
    return (f"Not run: this scenario's engine cannot take {sec.facts['setting']}; kvsim refuses it with "
            f"\"{sec.skipped}\". Nothing was simulated for this section (the report does not change the "
            "scenario's engine to make it run).")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def left_out_text(refused: dict[str, str]) -> str:
    """One sentence: the settings a section's comparison left out (setting → the refusal), each refusal quoted."""
    settings = _and([f"`{setting}`" for setting in refused])
    reasons = _and([f"\"{reason}\"" for reason in refused.values()])
    kind, it = ("a setting", "it") if len(refused) == 1 else ("settings", "them")
    return (f"Left out: the runs with {settings}, {kind} this scenario's engine cannot take (kvsim refuses {it} with "
            f"{reasons}); the report does not change the engine to make them run.")
