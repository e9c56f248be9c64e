"""The ONE place where megatron-core is made to run without CUDA (gloo + fp32 on CPU).

megatron-core 0.16 assumes a GPU in a few places (../shared/notes/megatron-cpu.md):
  * the tensor-parallel RNG tracker keeps torch.cuda generator states,
  * the attention scratch buffer is allocated on torch.cuda.current_device(),
  * schedules, p2p, DDP buffers and the optimizer create tensors with device="cuda" or an int
    device, call `.cuda()`, torch.cuda streams/synchronize, and assert tensor type names such as
    'torch.cuda.FloatTensor'.
Instead of editing installed files, `apply()` (only when no CUDA device is used) installs
  1. a CPU RNG tracker in tensor_parallel.random (same tracker names and seeds as megatron's), and no CUDA
     generator state for activation recompute to save and restore,
  2. no-op torch.cuda stream/synchronize/current_device stand-ins,
  3. a torch function mode that maps device "cuda"/"cuda:N"/int to cpu, makes `.cuda()` a no-op
     and reports CPU tensor type names as their CUDA names;
  4. the MoE alltoall token dispatcher's device-to-host copy, which returns its split sizes as numpy
     arrays only for CUDA tensors (all_to_all_single takes no tensors as sizes), and all_gather of
     tensors of different lengths (the dispatcher gathers each expert-tp rank's tokens), which NCCL runs
     and gloo rejects: the mode pads them to the longest;
and `install_memory_buffer()` (after model-parallel init) swaps in a CPU attention buffer.
It also turns off oneDNN for matmuls and megatron's torch.compile fuser (see apply()).
`without_transformer_engine()` (CPU and GPU) fills a name megatron's MoE router expects from TE.
`fix_two_stage_interleaving()` is the one fix of megatron-core that applies on every device (GPU too):
with two pipeline stages and virtual stages its shape exchange pairs messages wrongly (see there).
Everything is idempotent. A global redirect hides stray `.cuda()` calls, which is why device
placement is tested on the GPU (tests/gpu) and why nothing outside this module touches devices.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False
_MODE: "_CudaToCpu | None" = None


# ------------------------------------------------------------------------------------------ device
def cuda_in_use() -> bool:
    """True when this process trains on a GPU (NCCL + bf16); False means the CPU path (gloo + fp32)."""
    return torch.cuda.is_available() and not _APPLIED


def device() -> torch.device:
    """The device model tensors live on in this process."""
    return torch.device("cuda", torch.cuda.current_device()) if cuda_in_use() else torch.device("cpu")


def dist_backend() -> str:
    return "nccl" if cuda_in_use() else "gloo"


def synchronize() -> None:
    if cuda_in_use():
        torch.cuda.synchronize()


def synchronize_stream() -> None:
    """Wait for the compute (current) stream only: offload's copies on their side stream keep running (copier.py)."""
    if cuda_in_use():
        torch.cuda.current_stream().synchronize()


def empty_cache() -> None:
    if cuda_in_use():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ apply
def apply(force_cpu: bool = False) -> None:
    """Make megatron-core usable on CPU. No-op when a CUDA device is available, unless `force_cpu`
    (the converter CLIs, which never need a GPU). Idempotent."""
    global _APPLIED, _MODE
    if _APPLIED or (torch.cuda.is_available() and not force_cpu):
        return
    _import_megatron_without_compile()
    _stub_torch_cuda()
    _MODE = _CudaToCpu()
    _MODE.__enter__()  # stays pushed for the life of the process (CPU workers only)
    _install_rng_tracker()
    _install_moe_split_sizes()
    # oneDNN JIT-compiles a matmul kernel for every new shape; with micro-batches trimmed to their
    # longest row almost every call is a new shape (first PPO update of a tiny model: 2.8 s vs 0.56 s
    # with plain BLAS). CPU training here is for tests and demos, where that dominates.
    torch.backends.mkldnn.enabled = False
    _APPLIED = True


def _import_megatron_without_compile() -> None:
    """megatron-core wraps a dozen functions in torch.compile (megatron.core.jit.jit_fuser) while it is imported,
    and that first call imports inductor and dynamo: ~2.5 of the ~6 CPU-s that `import megatron.core` costs every
    worker, torchrun rank and CLI on CPU. None of them runs compiled here: the fusions they serve are off
    (builder.py), and the one called on CPU, the MoE router's expert-bias count, only adds to a counter. So on CPU
    megatron is imported with torch.compile passing functions through, and its own disable_jit_fuser() keeps
    what it imports later eager too. A process that imported megatron before apply() keeps megatron's fuser."""
    if "megatron.core" in sys.modules:
        return
    compile_ = torch.compile
    torch.compile = _eager
    # megatron's inference context and timers import wandb when it is installed (our dev extras install it), only
    # to log metrics from megatron's own inference engine and timers, which hybridrl never uses: ~0.8 CPU-s a
    # process. They are written to run without it, so megatron's import sees none; hybridrl's wandb logger imports
    # it later as usual.
    hide_wandb = "wandb" not in sys.modules
    if hide_wandb:
        sys.modules["wandb"] = None  # type: ignore[assignment]  # `import wandb` raises ImportError
    try:
        from megatron.core import jit
    finally:
        torch.compile = compile_
        if hide_wandb and sys.modules.get("wandb", False) is None:
            del sys.modules["wandb"]
    jit.disable_jit_fuser()


def _eager(model: Any = None, **kwargs: Any) -> Any:
    """torch.compile's signature, compiling nothing: the function itself, or a decorator returning it."""
    return model if model is not None else (lambda fn: fn)


def without_transformer_engine() -> None:
    """megatron-core 0.16.1's MoE router gating (moe_utils.RouterGatingLinearFunction) tests
    `te_general_gemm is not None`, but the name is only defined when transformer_engine imports: without TE
    every MoE forward raises NameError. Defining it as None selects the torch.mm path it was written to
    fall back on. Idempotent; a no-op when TE provides the name."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def install_memory_buffer() -> None:
    """Replace megatron's attention scratch buffer with a CPU one (call after initialize_model_parallel)."""
    if not _APPLIED:
        return
    from megatron.core import parallel_state

    parallel_state._GLOBAL_MEMORY_BUFFER = _CpuMemoryBuffer()


def model_parallel_seed(seed: int) -> None:
    """megatron's model_parallel_cuda_manual_seed, on the CPU generator when CUDA is not used."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.tensor_parallel import random as mrandom

    if not _APPLIED:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    # Same names and seed offsets as megatron, so dropout streams match the GPU path's structure.
    tracker = mrandom._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    torch.manual_seed(seed)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)


def fix_two_stage_interleaving() -> None:
    """Make megatron-core 0.16.1's interleaved schedule exchange micro-batch shapes correctly when
    pipeline_model_parallel_size == 2 (any device). Idempotent.

    With variable sequence lengths, each p2p step first sends the shapes of the tensors to come, in ONE
    batch ordered [send_prev, recv_prev, send_next, recv_next]. With two stages the previous and the next
    rank are the same peer, and p2p messages between two ranks are matched in the order they are posted
    (gloo per tag, NCCL per peer): the activation shape one rank sends "next" lands in the peer's
    "recv_next" slot, which expects a gradient's shape. The 1F1B schedule without virtual stages never
    sends both ways at once; the interleaved one does. Running the exchange one direction at a time
    (forward pair, then backward pair) pairs every message with its slot. The tensors themselves go
    through megatron's unbatched p2p (builder sets batch_p2p_comm=False), which handles two stages.
    """
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    original = P2PCommunicator._communicate_shapes
    if getattr(original, "_one_direction_at_a_time", False):
        return

    def communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
        both_ways = (tensor_send_next is not None or recv_prev) and (tensor_send_prev is not None or recv_next)
        if self.pp_group.size() != 2 or not both_ways:
            return original(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next)
        forward, _ = original(self, tensor_send_next, None, recv_prev, False)
        _, backward = original(self, None, tensor_send_prev, False, recv_next)
        return forward, backward

    communicate_shapes._one_direction_at_a_time = True
    P2PCommunicator._communicate_shapes = communicate_shapes


# ------------------------------------------------------------------------------------------ pieces
class _CpuRNGTracker:
    """tensor_parallel.random's tracker API on torch's CPU generator (fork swaps its state)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_ or name in self.states_:
            raise RuntimeError(f"RNG tracker: seed {seed} or state {name!r} already added")
        self._is_initialized = True
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise RuntimeError(f"RNG tracker: state {name!r} was never added")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


def _install_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    if not isinstance(mrandom._CUDA_RNG_STATE_TRACKER, _CpuRNGTracker):
        mrandom._CUDA_RNG_STATE_TRACKER = _CpuRNGTracker()
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # Activation recompute (CheckpointFunction) saves and restores the CPU generator, the tracker's states and
    # the CUDA generator's; the last one asks torch.cuda and fails without CUDA. Nothing draws from a CUDA
    # generator here, so there is no state to keep.
    mrandom._get_cuda_rng_state = _no_cuda_rng_state
    mrandom._set_cuda_rng_state = _set_no_cuda_rng_state


def _no_cuda_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _set_no_cuda_rng_state(*args: Any, **kwargs: Any) -> None:
    return None


def _backward_in_mode(func: Any, args: tuple, kwargs: dict) -> None:
    """torch.autograd.backward with the mode on. A mode is off while its own handler runs, so calling
    `func` would run every autograd Function's backward without it; the MoE dispatcher's all-to-all
    allocates on "cuda" in its backward. This is backward's own body, entered below the dispatch."""
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    if func is torch.Tensor.backward:  # (self, gradient, retain_graph, create_graph, inputs)
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "inputs")
        kwargs = {("grad_tensors" if k == "gradient" else k): v for k, v in kwargs.items()}
        kwargs.update(zip(names, args))
        args = ()
    bound = dict(zip(("tensors", "grad_tensors", "retain_graph", "create_graph", "inputs"), args), **kwargs)
    tensors = bound["tensors"]
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    create_graph = bool(bound.get("create_graph") or False)
    retain_graph = bound.get("retain_graph")
    inputs = bound.get("inputs")
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs or ())
    with _CudaToCpu():
        grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(bound.get("grad_tensors"), len(tensors)),
                            is_grads_batched=False)
        _engine_run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph, create_graph,
                             inputs, allow_unreachable=True, accumulate_grad=True)


def _uneven(tensors: list[torch.Tensor]) -> bool:
    return len({t.shape[0] for t in tensors}) > 1


def _padded_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                       async_op: bool = False) -> None:
    """all_gather of tensors whose first dims differ (gloo needs equal shapes): gather padded copies."""
    longest = max(t.shape[0] for t in tensor_list)
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]].copy_(tensor)
    parts = [torch.empty_like(padded) for _ in tensor_list]
    torch.distributed.all_gather(parts, padded, group=group)
    for out, part in zip(tensor_list, parts):
        out.copy_(part[: out.shape[0]])
    assert not async_op, "uneven all_gather on gloo runs synchronously"


def _install_moe_split_sizes() -> None:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu
    if getattr(token_dispatcher.maybe_move_tensor_to_cpu, "hybridrl_cpu", False):
        return

    def to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    to_host.hybridrl_cpu = True
    token_dispatcher.maybe_move_tensor_to_cpu = to_host


class _CpuMemoryBuffer:
    """megatron.core.utils.GlobalMemoryBuffer, allocating on CPU."""

    def __init__(self) -> None:
        self.buffer: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        numel = functools.reduce(lambda a, b: a * b, tensor_shape, 1)
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = self.buffer[(name, dtype)] = torch.empty(numel, dtype=dtype)
        return buf[:numel].view(*tensor_shape)


class _NoStream:
    """Stands in for torch.cuda.Stream / Event: every call is a no-op. Calls return another stand-in (the MoE
    token dispatcher synchronizes the event its stream's record_event() returns), and all stand-ins are
    equal (there is one CPU "stream", so code never thinks it runs on a side stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: _NoStream()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NoStream)

    def __hash__(self) -> int:
        return 0


def _stub_torch_cuda() -> None:
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda: None
    cuda.set_device = lambda *a, **k: None
    cuda.Stream = _NoStream
    cuda.Event = _NoStream
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.current_stream = lambda *a, **k: _NoStream()
    cuda.default_stream = lambda *a, **k: _NoStream()


_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


def _is_cuda_device(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.startswith("cuda")
    return isinstance(d, int) and not isinstance(d, bool)


class _CudaToCpu(TorchFunctionMode):
    """device="cuda"/int -> cpu, Tensor.cuda() -> self, Tensor.type() -> CUDA type names, uneven all_gather."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.distributed.all_gather and _uneven(args[0] if args else kwargs["tensor_list"]):
            return _padded_all_gather(*args, **kwargs)
        if func is torch.autograd.backward or func is torch.Tensor.backward:
            return _backward_in_mode(func, args, kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return _CUDA_TYPE_NAMES.get(name, name)
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)
