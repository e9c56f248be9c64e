"""Which failure the driver reports when several ranks fail in one call (ray_backend._root_failure)."""
from __future__ import annotations

from hybridrl.controller.errors import WorkerDiedError, WorkerError
from hybridrl.controller.ray_backend import _root_failure


def _failed(rank: int) -> WorkerError:
    return WorkerError(f"worker 'actor' rank {rank} raised RuntimeError in update(): gloo: connection closed",
                       rank=rank, role="actor", method="update", remote_traceback="Traceback ...")


def test_a_dead_rank_is_reported_before_the_collective_errors_it_caused():
    died = WorkerDiedError("worker 'actor' rank 2 (pid 7) died during update(): ActorDiedError", rank=2,
                           role="actor", method="update")
    err = _root_failure({0: _failed(0), 2: died, 1: _failed(1)}, {}, "actor", "update", None)
    assert isinstance(err, WorkerDiedError) and err.rank == 2
    assert str(err) == ("worker 'actor' rank 2 (pid 7) died during update(): ActorDiedError; "
                        "rank(s) [0, 1] failed too")


def test_ranks_still_running_are_named_with_the_first_failure():
    err = _root_failure({1: _failed(1)}, {}, "actor", "update", None)
    assert str(err).startswith("worker 'actor' rank 1 raised RuntimeError") and "failed too" not in str(err)
    # the remote traceback stays attached, after the message
    assert str(err).endswith("--- remote traceback (actor rank 1) ---\nTraceback ...")

    err = _root_failure({0: _failed(0), 3: _failed(3)}, {}, "actor", "update", None)
    assert err.rank == 0 and "rank(s) [3] failed too" in str(err)
