"""`python -m hybridrl.trainer.main_generation data.path=P data.n_samples=N data.output_path=OUT model.path=M ...`

verl's generation entry point: n responses for every prompt of a verl-format file, written as the input
rows plus a `responses` column (a list of n strings), ready for `main_eval`. `model.path` may be an HF
folder, a folder with a .gguf file, or a hybridrl actor checkpoint (global_step_N/actor), which is merged
to an HF folder first (once; cached next to the checkpoint). One engine in this process: vLLM on GPU
(it loads the weights itself), the built-in torch engine on CPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

from hybridrl.config import ConfigError
from hybridrl.config.cli import parse_command_line
from hybridrl.config.loader import load_config, to_yaml
from hybridrl.config.schema import DataConfig, GenerationConfig
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils import logs
from hybridrl.utils.net import free_port


def resolve_model_dir(model: Any) -> str:
    """An HF folder for model.path: as is, dequantized from GGUF, or merged from an actor checkpoint."""
    from hybridrl.utils.hf_model import materialize_hf_dir

    path = os.path.abspath(os.path.expanduser(model.path))
    meta = os.path.join(path, "meta.json")
    if os.path.isfile(meta):
        with open(meta) as f:
            if json.load(f).get("format") == "hybridrl-megatron":
                return merge_checkpoint(path)
    return materialize_hf_dir(path, model.gguf_file, key="model.path")


def merge_checkpoint(ckpt_dir: str) -> str:
    out = ckpt_dir.rstrip("/") + "_hf"
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    print(f"main_generation: merging the checkpoint {ckpt_dir} into {out}", flush=True)
    cmd = [sys.executable, "-m", "hybridrl.model_merger", "merge", "--backend", "megatron", "--local_dir", ckpt_dir,
           "--target_dir", out]
    subprocess.run(cmd, check=True, timeout=3600)
    return out


def build_dataset(cfg: GenerationConfig, tokenizer: Any) -> Any:
    from hybridrl.data.dataset import RLHFDataset

    data = dataclasses.replace(
        DataConfig(), train_files=[cfg.data.path], prompt_key=cfg.data.prompt_key,
        max_prompt_length=cfg.rollout.prompt_length, truncation=cfg.data.truncation,
        apply_chat_template_kwargs=dict(cfg.data.apply_chat_template_kwargs),
    )
    return RLHFDataset([cfg.data.path], tokenizer, data, max_samples=cfg.data.max_samples)


def build_engine(cfg: GenerationConfig, model_dir: str, tokenizer: Any, device: str) -> Any:
    import torch
    from transformers import AutoConfig

    from hybridrl.rollout.factory import build_engine as build

    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    engine_name = cfg.rollout.name if cfg.rollout.name not in ("auto", "hf") else ("vllm" if device == "cuda" else "torch")
    if engine_name == "vllm":
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
            os.environ.setdefault(k, v)
        os.environ.setdefault("MASTER_PORT", str(free_port("127.0.0.1")))
    engine = build(engine_name, model_dir, cfg.rollout, tp_g=cfg.rollout.tensor_model_parallel_size,
                   tokenizer=tokenizer, hf_config=hf_config, device=torch.device(device),
                   max_model_len=cfg.rollout.prompt_length + cfg.rollout.response_length,
                   trust_remote_code=cfg.model.trust_remote_code, load_format="auto",
                   max_batch_rows=cfg.data.batch_size * cfg.data.n_samples)
    if engine_name == "torch":
        from hybridrl.utils.hf_model import iter_hf_weights

        engine.load_weights(iter_hf_weights(model_dir))
        engine.finish_weight_sync()
    return engine


def generate(cfg: GenerationConfig, device: Optional[str] = None) -> str:
    """Run the generation; returns the output path."""
    import torch

    from hybridrl.data.loader import PromptLoader
    from hybridrl.data.readers import read_file
    from hybridrl.data.tokenizer import load_tokenizer
    from hybridrl.data.verl_format import write_parquet

    if device is None:
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        device = auto if cfg.trainer.device == "auto" else cfg.trainer.device
    model_dir = resolve_model_dir(cfg.model)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    dataset = build_dataset(cfg, tokenizer)
    rows, _ = read_file(cfg.data.path)
    rows = rows[: len(dataset)]
    engine = build_engine(cfg, model_dir, tokenizer, device)
    r = cfg.rollout
    sampling = SamplingParams(n=cfg.data.n_samples, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_tokens=r.response_length, do_sample=r.do_sample, ignore_eos=r.ignore_eos, seed=r.seed)
    responses: list[list[str]] = []
    start = time.perf_counter()
    for batch in PromptLoader(dataset, cfg.data.batch_size, shuffle=False, drop_last=False):
        out = engine.generate(batch, sampling)
        texts = tokenizer.batch_decode(out.batch["responses"], skip_special_tokens=True)
        responses += [texts[i:i + sampling.n] for i in range(0, len(texts), sampling.n)]
        print(f"main_generation: {len(responses)}/{len(dataset)} prompts, {time.perf_counter() - start:.1f}s",
              flush=True)
    for row, resp in zip(rows, responses):
        row["responses"] = resp
    return write_parquet(rows, cfg.data.output_path)


def output_problem(data: Any) -> Optional[str]:
    """Why data.output_path must not be written, or None."""
    out = os.path.abspath(os.path.expanduser(data.output_path))
    if out == os.path.abspath(os.path.expanduser(data.path)):
        return f"data.output_path={data.output_path} is the input data.path; give another file"
    if os.path.isdir(out):
        return f"data.output_path={data.output_path} is a folder; give a .parquet file path"
    if os.path.exists(out) and not data.overwrite_output:
        return (f"data.output_path={data.output_path} exists; give a new path, or set data.overwrite_output=true "
                "to replace it")
    return None


def main(argv: Optional[list[str]] = None) -> int:
    cl = parse_command_line(sys.argv[1:] if argv is None else argv, default_config="generation")
    try:
        logs.setup()
        cfg = load_config(cl.overrides, cl.config_name, cl.config_path, schema=GenerationConfig)
    except ConfigError as e:
        print(f"hybridrl: {e}", file=sys.stderr)
        return 2
    if cl.cfg_mode:
        print(to_yaml(cfg), end="")
        return 0
    if cfg.data.n_samples < 1 or cfg.data.batch_size < 1:
        print("hybridrl: data.n_samples and data.batch_size must be >= 1", file=sys.stderr)
        return 2
    problem = output_problem(cfg.data)
    if problem:  # before the model loads: the answer costs nothing here
        print(f"hybridrl: {problem}", file=sys.stderr)
        return 2
    from hybridrl.config.cli import user_errors
    from hybridrl.data.readers import DataFileError

    # a missing or unusable model folder or data file is the user's to fix: one line naming it, no traceback
    with user_errors(also=(FileNotFoundError, DataFileError)):
        print(f"main_generation: wrote {generate(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
