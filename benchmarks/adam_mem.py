"""How much GPU memory torch's AdamW step takes beyond its state: foreach vs fused vs for-loop, fp32 and bf16 grads."""
import json, sys, time
import torch

N = int(float(sys.argv[1])) if len(sys.argv) > 1 else int(2e9)
K = 300  # tensors, like megatron's per-parameter shards
out = []
for mode in ("foreach", "fused", "loop"):
    for gdtype in (torch.float32, torch.bfloat16):
        torch.cuda.empty_cache()
        params = [torch.zeros(N // K, device="cuda", requires_grad=True) for _ in range(K)]
        model_grads = [torch.full((N // K,), 1e-3, device="cuda", dtype=gdtype) for _ in range(K)]
        kw = {"foreach": True} if mode == "foreach" else ({"fused": True} if mode == "fused" else {"foreach": False})
        opt = torch.optim.AdamW(params, lr=1e-3, **kw)
        for it in range(2):
            before = torch.cuda.memory_allocated()
            for p, g in zip(params, model_grads):
                p.grad = g.float()  # what megatron's distributed optimizer does (a copy only when g is bf16)
            copy = torch.cuda.memory_allocated() - before
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter(); opt.step(); torch.cuda.synchronize(); dt = time.perf_counter() - t
            peak = torch.cuda.max_memory_allocated()
            row = dict(mode=mode, grads=str(gdtype), step=it, grad_copy_bytes_per_param=copy / N,
                       step_transient_bytes_per_param=(peak - base) / N,
                       state_added_bytes_per_param=(torch.cuda.memory_allocated() - base) / N, seconds=dt)
            print(json.dumps(row), flush=True); out.append(row)
            for p in params:
                p.grad = None
        del opt, params, model_grads
print(torch.cuda.get_device_name(), torch.__version__)
