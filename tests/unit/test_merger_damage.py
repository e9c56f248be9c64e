"""model_merger merge and `hybridrl convert mcore-to-hf` name a damaged file of a trainer checkpoint (the step's
completion marker lists each file's size and CRC-32) instead of ending in a bare EOFError."""
import os

from hybridrl.trainer.checkpoint_manager import CheckpointManager, TrainerState


def test_merge_and_convert_name_the_truncated_file(tmp_path, capsys):
    from hybridrl.model_merger.__main__ import main as merge_main
    from hybridrl.model_merger.convert_cli import main as convert_main

    def actor(folder):
        os.makedirs(os.path.join(folder, "dist"))
        with open(os.path.join(folder, "dist", "__0_0.distcp"), "wb") as f:
            f.write(b"\x80" * 4096)
        with open(os.path.join(folder, "meta.json"), "w") as f:
            f.write("{}")

    CheckpointManager(str(tmp_path)).save(1, {"actor": actor}, TrainerState(global_step=1))
    shard = tmp_path / "global_step_1" / "actor" / "dist" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    actor_dir = str(tmp_path / "global_step_1" / "actor")
    assert merge_main(["merge", "--local_dir", actor_dir, "--target_dir", str(tmp_path / "hf")]) == 1
    assert convert_main(["mcore-to-hf", "--ckpt-dir", actor_dir, "--out", str(tmp_path / "hf2")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(f"damaged checkpoint: {shard} is 100 bytes, the save wrote 4096" in ln
                                   for ln in lines), lines
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf2").exists()
