"""Test-only launcher: main_ppo with deterministic pause points, so fault tests need no timing luck.

    python tests/e2e/fault_helpers/launch.py --flag F [--go G] [--pids P]
        [--pause METHOD:N:before|after | --slow-save STEP] -- <main_ppo arguments>

--pids P                    write {"role": [pid of rank 0, pid of rank 1, ...]} once the worker groups exist
--pause M:N:WHEN            on the driver, right before (WHEN=before) or right after (WHEN=after) the N-th
                            call of worker-group method M is sent to the workers: touch F, then wait until
                            G exists (after: the workers run the call meanwhile)
--slow-save STEP            when the checkpoint manager is about to write trainer_state.json of
                            global_step_STEP (the actor part is already saved, nothing is committed): touch F
                            and sleep, so a signal sent now lands in the middle of the save

Everything else is the normal entry point (hybridrl.trainer.main_ppo.main); nothing of the product is
changed beyond these wrappers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

WAIT_S = 300.0  # a pause never outlives a test that forgot to release it


def touch(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def record_pids(path: str) -> None:
    from hybridrl.trainer import components

    spawn = components._spawn_groups

    def spawn_and_record(*args, **kwargs):
        actor, critic, rollout, rank0, reward_model = spawn(*args, **kwargs)
        pids = {"actor_rollout_ref": list(actor.pids)}
        for name, group in (("critic", critic), ("rollout", rollout)):
            if group is not None:
                pids[name] = list(group.pids)
        touch(path, json.dumps(pids))
        return actor, critic, rollout, rank0, reward_model

    components._spawn_groups = spawn_and_record


def pause_at(method: str, nth: int, when: str, flag: str, go: str) -> None:
    from hybridrl.controller.ray_backend import RayWorkerGroup

    if when not in ("before", "after"):
        raise SystemExit(f"--pause {method}:{nth}:{when}: WHEN must be before or after")
    submit = RayWorkerGroup._submit
    calls = {"n": 0}

    def pause() -> None:
        touch(flag, f"{method} call {nth} ({when} submitting)\n")
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)

    def submit_with_pause(self, name, plan):
        hit = False
        if name == method:
            calls["n"] += 1
            hit = calls["n"] == nth
        if hit and when == "before":
            pause()
        handle = submit(self, name, plan)
        if hit and when == "after":
            pause()
        return handle

    RayWorkerGroup._submit = submit_with_pause


def slow_save(step: int, flag: str) -> None:
    from hybridrl.trainer import checkpoint_manager as cm

    write = cm.write_trainer_state

    def write_slowly(folder, state):
        if cm.step_of(folder) == step:
            touch(flag, f"saving {folder}\n")
            time.sleep(WAIT_S)
        return write(folder, state)

    cm.write_trainer_state = write_slowly


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser()
    parser.add_argument("--flag")
    parser.add_argument("--go")
    parser.add_argument("--pids")
    parser.add_argument("--pause")
    parser.add_argument("--slow-save", type=int)
    args = parser.parse_args(argv[:split])
    if args.pids:
        record_pids(args.pids)
    if args.pause:
        method, nth, when = args.pause.split(":")
        pause_at(method, int(nth), when, args.flag, args.go)
    if args.slow_save is not None:
        slow_save(args.slow_save, args.flag)
    from hybridrl.trainer.main_ppo import main as main_ppo

    main_ppo(argv[split + 1:])


if __name__ == "__main__":
    main()
