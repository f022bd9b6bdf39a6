"""``litlab data d4rl``: write a D4RL-layout HDF5 data set from a policy trained (or written) locally — no
download.

    litlab data d4rl --env Pendulum-v1 --level medium            # seconds (analytic controller)
    litlab data d4rl --env Hopper-v4 --level medium --n 100000   # SAC trained here (hours on CPU; GPU users)
    litlab data d4rl --info path/to/file.hdf5                    # summary of any D4RL/Minari file

Files go to ``$LITLAB_CACHE/d4rl/<env>-<level>.hdf5`` (default ``runs/cache``) unless ``--out`` is given; the
``expert`` level also records the env's measured random/expert returns in ``ref_scores.json`` there. That file is
shared by every run that reads it (``offline.generate: false``), as a real D4RL set is; the pendulum toys instead
draw one set per run seed (``offline.generate: true``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from litlab.lit_modules.core.errors import ResourceUnavailableError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    d4rl = sub.add_parser("d4rl", help="generate (or inspect) a D4RL-layout HDF5 data set")
    d4rl.add_argument("--env", help="gymnasium env id, e.g. Pendulum-v1, Hopper-v4")
    d4rl.add_argument(
        "--level", default="medium", choices=["random", "medium", "medium-replay", "expert", "medium-expert"]
    )
    d4rl.add_argument("--n", type=int, default=None, help="transitions (default 20000 toys, 100000 MuJoCo)")
    d4rl.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of this file's rollouts (a shared file: runs that generate their own data draw it per run seed)",
    )
    d4rl.add_argument(
        "--policy",
        choices=["auto", "sac", "analytic"],
        default="auto",
        help="auto: analytic controller for Pendulum-v1, SAC otherwise",
    )
    d4rl.add_argument(
        "--sac-steps", type=int, default=None, help="SAC training steps (default 20000 toys, 1000000 MuJoCo)"
    )
    d4rl.add_argument("--out", type=Path, default=None, help="output file (default: the cache path)")
    d4rl.add_argument(
        "--info", type=Path, default=None, help="print a summary of an existing D4RL/Minari file"
    )
    args = parser.parse_args(argv)

    # imported after parsing: `litlab data --help` answers without loading torch and gymnasium
    from litlab.datamodules.rl_d4rl import episode_returns, load_dataset, read_metadata
    from litlab.datamodules.rl_env import MUJOCO_ENVS
    from litlab.lit_modules.rl.factory import make_dataset

    if args.info:
        data = load_dataset(args.info)
        rets = episode_returns(data)
        print(
            f"{args.info}: {len(data['observations'])} transitions, obs {data['observations'].shape[1]}, "
            f"act {data['actions'].shape[1]}, {len(rets)} complete episodes, mean return "
            f"{rets.mean() if len(rets) else float('nan'):.1f}, metadata {read_metadata(args.info)}"
        )
        return 0
    if not args.env:
        parser.error("d4rl needs --env (or --info FILE)")
    mujoco = args.env.split("-")[0] in MUJOCO_ENVS
    n = args.n or (100_000 if mujoco else 20_000)
    sac_steps = args.sac_steps or (1_000_000 if mujoco else 20_000)
    try:
        make_dataset(args.env, args.level, n, args.seed, args.policy, sac_steps, args.out)
    except (ResourceUnavailableError, ValueError) as err:
        print(f"litlab data d4rl: {err}", file=sys.stderr)
        return 2
    return 0
