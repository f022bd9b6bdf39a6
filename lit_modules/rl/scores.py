"""Score normalisation: D4RL's reference returns for the MuJoCo tasks (``d4rl.infos``; D4RL, arXiv
2004.07219), NGT's random/expert returns (``src/helpers/baselines.json`` of the released code of arXiv
2509.26294), and measured random/expert returns for toy tasks (``ref_scores.json`` beside this file, extended
by ``litlab data d4rl`` under the cache)."""

from __future__ import annotations

import json
from pathlib import Path

from litlab.lit_modules.rl.contract import cached_refs_path

# family -> (R_min = random, R_max = expert); d4rl.infos REF_MIN_SCORE/REF_MAX_SCORE (v2 = v0 values)
D4RL_REF_SCORES: dict[str, tuple[float, float]] = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
    "antmaze": (0.0, 1.0),
}
# NGT's baselines.json (Gymnasium v4): random return, 1-demo expert return
NGT_REF_SCORES: dict[str, tuple[float, float]] = {
    "hopper": (-74.38, 3510.6),
    "halfcheetah": (-281.53, 14200.9),
    "walker2d": (2.72, 6267.0),
    "ant": (-62.27, 6158.7),
    "humanoid": (119.77, 6192.6),
    "humanoidstandup": (33200.04, 157813.6),
    "pusher": (-149.88, -26.1),
}
SHIPPED_REFS = Path(__file__).with_name("ref_scores.json")


def _family(env_id: str) -> str:
    name = env_id.split("/")[-1].split("-")[0].lower()
    return "antmaze" if name.startswith("antmaze") else name


def measured_refs() -> dict[str, dict[str, float]]:
    refs: dict[str, dict[str, float]] = {}
    for path in (cached_refs_path(), SHIPPED_REFS):  # shipped numbers win: they are the recorded ones
        if path.exists():
            refs.update(json.loads(path.read_text()))
    return refs


def ref_returns(env_id: str, table: str = "d4rl") -> tuple[float, float]:
    """(random, expert) reference returns of ``env_id``; ``table`` is ``d4rl`` or ``ngt`` for MuJoCo tasks."""
    tables = {"d4rl": D4RL_REF_SCORES, "ngt": NGT_REF_SCORES}
    if table not in tables:
        raise ValueError(f"table={table!r} is not one of {sorted(tables)}")
    family = _family(env_id)
    if family in tables[table]:
        return tables[table][family]
    refs = measured_refs()
    if env_id in refs:
        return float(refs[env_id]["random"]), float(refs[env_id]["expert"])
    raise KeyError(
        f"no reference returns for {env_id!r}: not in the {table} table and not in {SHIPPED_REFS.name} or "
        f"{cached_refs_path()}; measure them with `litlab data d4rl --env {env_id} --level expert`"
    )


def normalized_score(env_id: str, ret: float, table: str = "d4rl") -> float:
    """D4RL convention: 100 · (R − R_random) / (R_expert − R_random)."""
    lo, hi = ref_returns(env_id, table)
    return 100.0 * (ret - lo) / (hi - lo)
