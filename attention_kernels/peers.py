"""The public kernels the book measures itself against, each only where it can be imported.

They are yardsticks for the benchmarks: nothing in the book's own kernels or tests needs them.
Each function returns a callable, or None when the peer is not installed here (the benchmark
table then records "n/a" for it).

    >>> attend = sdpa("cuDNN")                      # q, k, v: [B, H, T, D] (SDPA's own layout)
    >>> o = attend(q, k, v, causal=True)
    >>> chunk_gla = fla("gla", "chunk_gla")         # None without flash-linear-attention

Every peer handed out inside `recording()` is noted with its version, so a results table names the
peers it ran (fla, flash-attn, FA4, FlexAttention, FlashMLA, mamba_ssm, TileLang, cuDNN) without importing one
that is absent.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
from pathlib import Path

_records: list[dict] = []  # the open `recording()` blocks, innermost last


@contextlib.contextmanager
def recording():
    """{peer: version} of every peer handed out inside the block, filled in as they are.

    >>> with recording() as used:
    ...     attend = sdpa("cuDNN")
    >>> used                                        # {"cuDNN": "91002"}
    """
    used: dict[str, str] = {}
    _records.append(used)
    try:
        yield used
    finally:
        _records.remove(used)


def _version(module: str, distribution: str) -> str:
    """The version of an imported peer: its module's __version__, else its installed distribution's."""
    found = getattr(sys.modules.get(module), "__version__", None)
    if found and found != "0.0.0":  # 0.0.0: a package that did not find its own distribution (FA4's, say)
        return str(found)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (source checkout)"


def _handed_out(peer: str, found, module: str, distribution: str):
    """Note `peer` in every open record when it was found (a peer that is absent is never imported again
    for its version); return `found`."""
    if found is not None and _records:
        version = _version(module, distribution)
        for used in _records:
            used[peer] = version
    return found

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cuDNN": "CUDNN_ATTENTION"}


def sdpa(backend: str):
    """PyTorch's scaled_dot_product_attention pinned to one backend ("flash" or "cuDNN"):
    f(q, k, v, causal=False, scale=None, enable_gqa=False) on [B, H, T, D] tensors (enable_gqa: k and v
    may have fewer heads than q, where the backend takes that)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    if backend not in SDPA_BACKENDS:
        raise ValueError(f"backend must be one of {sorted(SDPA_BACKENDS)}, got {backend!r}")
    pinned = getattr(SDPBackend, SDPA_BACKENDS[backend])
    if backend == "cuDNN" and _records:
        import torch

        for used in _records:
            used["cuDNN"] = str(torch.backends.cudnn.version())

    def attend(q, k, v, causal=False, scale=None, enable_gqa=False):
        with sdpa_kernel(pinned):
            return scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa)
    return attend


def _optional(module: str, name: str | None = None):
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    return found if name is None else getattr(found, name, None)


def fla(op: str, name: str):
    """A function of flash-linear-attention's `fla.ops.<op>` (e.g. fla("gla", "chunk_gla")), or None."""
    return _handed_out("fla", _optional(f"fla.ops.{op}", name), "fla", "flash-linear-attention")


def _from_checkout(where: str | None, module: str, name: str, first: bool):
    """`name` from `module`, after putting `where` (a folder holding a source checkout of the module's package)
    on the path, first or last; None when the import fails in any way (not installed, an unbuilt extension, a
    dependency missing here)."""
    if where and Path(where, module.split(".")[0]).is_dir() and where not in sys.path:
        sys.path.insert(0, where) if first else sys.path.append(where)
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:
        return None


def flashmla(name: str = "flash_mla_with_kvcache"):
    """A function of FlashMLA's Python package `flash_mla`, or None. It is built from its source on the GPU box;
    the folder holding the package is FLASHMLA_PATH, or .peers-flashmla/flashmla_src in the repository's root
    (put first on the path: the built checkout wins over anything installed)."""
    where = os.environ.get("FLASHMLA_PATH") or str(Path(__file__).resolve().parents[1] / ".peers-flashmla"
                                                   / "flashmla_src")
    return _handed_out("FlashMLA", _from_checkout(where, "flash_mla", name, first=True), "flash_mla", "flash_mla")


def flash_attn(name: str):
    """A function of flash-attn's Python package `flash_attn` (e.g. flash_attn("flash_attn_with_kvcache")),
    or None where it is not installed."""
    return _handed_out("flash-attn", _optional("flash_attn", name), "flash_attn", "flash-attn")


def fa4(name: str = "flash_attn_func"):
    """A function of FlashAttention-4's `flash_attn.cute` (flash-attn-4, written in the CuTe DSL; GPU box only),
    or None where it does not import. Its flash_attn_func(q, k, v, causal=False) takes flash-attn's
    [B, T, H, D] layout, bf16 or fp16, k and v with fewer heads than q, and returns out or (out, lse)."""
    found = _from_checkout(None, "flash_attn.cute", name, first=False)
    return _handed_out("FA4", found, "flash_attn.cute", "flash-attn-4")


def _causal(batch, head, q_index, kv_index):
    """FlexAttention's mask_mod of causal self-attention: a query sees the keys at or before it."""
    return q_index >= kv_index


def flex_attention():
    """PyTorch's FlexAttention (`torch.nn.attention.flex_attention`), compiled by torch.compile, or None without
    a CUDA GPU or on a torch that lacks it. Returns compile_for(T, S, causal) -> attend(q, k, v, enable_gqa=False)
    on [B, H, T, D] tensors with S keys; causal runs through a block mask of `create_block_mask`, so the blocks
    above the diagonal are skipped, not masked. Each compile_for compiles afresh for its shape: dynamo keeps
    only a few compiled variants of one function, and past them it would fall back to the slow eager path."""
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask
        from torch.nn.attention.flex_attention import flex_attention as flex
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def compile_for(T: int, S: int, causal: bool):
        torch.compiler.reset()
        block_mask = create_block_mask(_causal, B=None, H=None, Q_LEN=T, KV_LEN=S, device="cuda") if causal else None
        compiled = torch.compile(flex, dynamic=False)

        def attend(q, k, v, enable_gqa=False):
            return compiled(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
        return attend
    return _handed_out("FlexAttention", compile_for, "torch", "torch")


def mamba_ssm(module: str, name: str):
    """mamba_ssm's Triton op `name` from `mamba_ssm.ops.triton.<module>`, or None. Its package __init__
    pulls in CUDA extensions that a source checkout has not built; the Triton ops alone need triton and
    einops, so a checkout named by MAMBA_SSM_PATH (the folder holding `mamba_ssm/`, put last on the path) is
    enough."""
    found = _from_checkout(os.environ.get("MAMBA_SSM_PATH"), f"mamba_ssm.ops.triton.{module}", name, first=False)
    return _handed_out("mamba_ssm", found, "mamba_ssm", "mamba_ssm")


def tilelang():
    """The `tilelang` module (TileLang's compiler, GPU box only), or None."""
    return _handed_out("TileLang", _optional("tilelang"), "tilelang", "tilelang")


__all__ = ["sdpa", "fla", "flash_attn", "fa4", "flex_attention", "flashmla", "mamba_ssm", "tilelang", "recording"]
