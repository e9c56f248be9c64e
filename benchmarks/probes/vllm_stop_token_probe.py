"""Does vLLM 0.26 keep the stop token in CompletionOutput.token_ids? (GPU host; a random 32-token model)
Both ways a sample can stop in hybridrl's vLLM engine: the model's EOS, and an id in stop_token_ids.
2026-11-26, H100: yes, both ways (64/64 stopped samples end with the stop id), so responses and their masks end
with it. `PYTHONPATH=$PWD:/tmp/site VLLM_ENABLE_V1_MULTIPROCESSING=0 python3 benchmarks/probes/vllm_stop_token_probe.py`"""
import sys
import tempfile

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm import LLM, SamplingParams

sys.path.insert(0, ".")
from hybridrl.data.tokenizer import build_tiny_tokenizer  # noqa: E402

d = tempfile.mkdtemp()
tok = build_tiny_tokenizer(alphabet="0123456789+=abcdefghijklmnop")
tok.save_pretrained(d)
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
                  bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
llm = LLM(model=d, gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=256)
eos = tok.eos_token_id
prompts = [{"prompt_token_ids": [5, 6, 7]}] * 64
for name, sp in (("eos", SamplingParams(max_tokens=200, temperature=2.0, seed=1)),
                 ("stop_token_ids", SamplingParams(max_tokens=200, temperature=2.0, seed=1, stop_token_ids=[eos, 9]))):
    outs = [o.outputs[0] for o in llm.generate(prompts, sp)]
    stopped = [o for o in outs if o.finish_reason == "stop"]
    kept = sum(1 for o in stopped if o.token_ids and o.token_ids[-1] in (eos, 9))
    print(f"[stop probe] {name}: {len(stopped)}/{len(outs)} stopped; stop token last in token_ids: {kept}/{len(stopped)}; "
          f"examples {[list(o.token_ids[-3:]) for o in stopped[:3]]} reasons {[o.stop_reason for o in stopped[:3]]}")
