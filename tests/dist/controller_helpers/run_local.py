"""Driver run by every torchrun rank: the Ray tests' worker classes on the local backend.

    python -m torch.distributed.run --nproc_per_node=2 --standalone tests/dist/controller_helpers/run_local.py

Always gloo (use_gpu=False), also on GPU hosts. Each rank writes what its driver saw to
OUT_DIR/rank<RANK>.json (OUT_DIR: first argument); every rank must see the same.
"""
from __future__ import annotations

import json
import os
import sys

from controller_workers import ActorRole, CriticRole, RowWorker, TPWorker, make_rows, row_fn, tp_reference

from hybridrl.controller import WorkerError, make_worker_group, spawn_colocated


def main() -> None:
    rows = make_worker_group("local", RowWorker, role="rows", call_timeout_s=60, use_gpu=False)
    out7 = rows.compute(make_rows(7, seed=1))
    assert out7.batch["y"].equal(row_fn(make_rows(7, seed=1)).batch["y"])

    tp = make_worker_group("local", TPWorker, role="tp", call_timeout_s=60, use_gpu=False)
    tp.init_mesh(2)  # tp=2, dp=1 on 2 ranks
    mesh5 = tp.forward(make_rows(5, seed=2))
    assert mesh5.batch["y"].equal(tp_reference(make_rows(5, seed=2)))

    groups = spawn_colocated(None, {"actor": ActorRole, "critic": CriticRole}, backend="local", use_gpu=False)
    actor_side = groups["actor"].make_weights(4)
    critic_side = groups["critic"].peek_actor()
    init_flags = [groups["actor"].init_dist()[0][0], groups["critic"].init_dist()[0][0]]

    try:
        rows.fail_on(1)
        error = None
    except WorkerError as e:
        error = {"rank": e.rank, "role": e.role, "method": e.method, "traceback_has_line": "deliberate failure" in str(e)}

    result = {
        "dp7_y": out7.batch["y"].tolist(), "dp7_row_id": out7.batch["row_id"].tolist(),
        "dp7_src": list(out7.non_tensor_batch["src"]),
        "mesh5_y": mesh5.batch["y"].tolist(), "mesh5_src_tp": mesh5.batch["src_tp_rank"].tolist(),
        "info": [(i["rank"], i["world_size"], i["role"]) for i in rows.info()],
        "rank_zero": rows.only_zero(), "even_sum": rows.rank_plus(10),
        "colocated_same": actor_side == critic_side, "init_flags": init_flags,
        "error": error,
    }
    for g in (tp, groups["actor"], rows):  # collective; the first one leaves torch.distributed
        g.shutdown()
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(result, f, sort_keys=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
