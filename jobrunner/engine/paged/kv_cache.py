"""The KV cache: per layer a K and a V tensor of shape (nkv, num_blocks, block_size, hd).

Stored in the model's dtype (`model.kv_cache_dtype: auto`), in 16 bits (`float16`, `bfloat16`:
half the memory of a float32 model's cache, attention still computes in the model's dtype), or
in 8 bits with a scale per token and head (`int8`, `fp8`: engine/quant/kv.py).

One block more than the block manager owns is allocated: the scratch block, which padding rows
of captured decode steps write to.

Sized from `engine.kv_cache_bytes` when given, else from free memory x `memory_fraction`
(on CPU half of that, at most CPU_MAX_BYTES, and no more than max_num_seqs full-length
sequences could ever use).
The cache is zeroed where decode attention gathers padded groups (masked padding positions must
hold finite values: 0 x NaN is NaN). Where the CPU decode kernel reads only real positions it
is left uninitialised, so start-up does not spend seconds writing zeros to gigabytes: an 8-bit
cache too (a zeroed 4 GiB int8 cache took 8.3 s of a job's start-up on a KVM guest).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from jobrunner.engine.paged import cpu_kernels
from jobrunner.engine.quant.kv import allocate
from jobrunner.engine.quant.kv import kv_bytes_per_token as quantized

log = logging.getLogger(__name__)

CPU_MAX_BYTES = 4 << 30
# On CPU the prefix cache keeps finished rows' blocks up to this share of the cache before it
# reuses them ahead of never-touched blocks (sched/block_manager.py: each touched page costs a
# fault, and the process's memory grows to all it ever touched)
CPU_RETAIN_SHARE = 1 / 8
HALF_FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class KVCache:
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    num_blocks: int  # blocks 0..num_blocks-1 hold sequences (the block manager's)
    block_size: int
    bytes_per_token: int

    def retain_blocks(self, device: torch.device) -> int | None:
        """How many cached blocks of finished rows the block manager keeps before it reuses
        them ahead of never-touched blocks: on CPU a share of the cache, elsewhere all (the
        device's memory is mapped when the cache is allocated)."""
        return int(self.num_blocks * CPU_RETAIN_SHARE) if device.type == "cpu" else None

    @property
    def scratch_block(self) -> int:
        """One block past the managed ones: padding rows of a captured decode step write
        there (cuda_graphs.py)."""
        return self.num_blocks


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, kv_format: str = "auto"
) -> int:
    if kv_format not in ("auto", *HALF_FORMATS):  # int8 | fp8: codes + scales
        return quantized(num_layers, num_kv_heads, head_dim, kv_format)
    dtype = HALF_FORMATS.get(kv_format, dtype)
    return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    import psutil

    return psutil.virtual_memory().available


def plan_num_blocks(
    bytes_per_token: int,
    block_size: int,
    device: torch.device,
    memory_fraction: float,
    kv_cache_bytes: int | None,
    max_useful_tokens: int,
) -> int:
    if kv_cache_bytes is not None:
        budget = kv_cache_bytes
    else:
        budget = int(free_memory_bytes(device) * memory_fraction)
        if device.type == "cuda":
            budget -= 2 << 30  # activations of the largest step
        else:  # host memory is shared with everything else; decode is bandwidth-bound anyway
            budget = min(budget // 2, max_useful_tokens * bytes_per_token, CPU_MAX_BYTES)
    return max(1, budget // (bytes_per_token * block_size))


def allocate_kv_cache(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    kv_format: str = "auto",
) -> KVCache:
    shape = (num_kv_heads, num_blocks + 1, block_size, head_dim)  # + the scratch block
    quantized = kv_format not in ("auto", *HALF_FORMATS)
    stored = kv_format if quantized else HALF_FORMATS.get(kv_format, dtype)
    zeroed = not cpu_kernels.decode_supported(stored, device)  # see the module's docstring
    if quantized:
        layers = allocate(num_layers, shape, kv_format, dtype, device, zeroed)
    else:
        new = torch.zeros if zeroed else torch.empty
        layers = [
            (new(shape, dtype=stored, device=device), new(shape, dtype=stored, device=device))
            for _ in range(num_layers)
        ]
    per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype, kv_format)
    log.info(
        "KV cache: %d blocks of %d tokens, %s, %d bytes/token (%.2f GiB)",
        num_blocks,
        block_size,
        kv_format if kv_format != "auto" else str(dtype).removeprefix("torch."),
        per_token,
        num_blocks * block_size * per_token / 2**30,
    )
    return KVCache(layers, num_blocks, block_size, per_token)


def kv_cache_for(model, cfg, dtype: torch.dtype, device: torch.device, max_model_len: int):
    """The cache a job asks for (model.kv_cache_dtype, engine.*) for a PagedCausalLM's layers."""
    e, n_layers, kv_format = cfg.engine, len(model.layers), cfg.model.kv_cache_dtype
    per_token = kv_bytes_per_token(n_layers, model.num_kv_heads, model.head_dim, dtype, kv_format)
    num_blocks = plan_num_blocks(
        per_token,
        e.block_size,
        device,
        e.memory_fraction,
        e.kv_cache_bytes,
        max_useful_tokens=e.max_num_seqs * max_model_len,
    )
    return allocate_kv_cache(
        n_layers,
        model.num_kv_heads,
        model.head_dim,
        num_blocks,
        e.block_size,
        dtype,
        device,
        kv_format,
    )
