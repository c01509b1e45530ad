"""The input check every linear-attention family shares (GLA now; Lightning, KDA and Mamba-2 next).

The layout is sequence-major, as in fla: q, k [B, T, H, K], v [B, T, H, V], and a recurrent state
S [B, H, K, V] kept in fp32. Each family names its own gates and their shapes in the letters of
that layout: GLA's gk is "B T H K" (one decay per key channel), Mamba-2's dt "B T H" (one per
head). The check looks at types, shapes, dtypes and devices only (nothing that would wait for the
GPU) and raises TypeError for a wrong type or dtype, ValueError for a wrong value or shape. A decode step
calls it with the same shapes every step: its verdict is kept per call signature
(`attention_kernels.checks.check_once_per_signature`), so such a call costs a read of its tensors' metadata and a
dict lookup.

    >>> B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B T H K")}, scale, h0, True)
"""
from __future__ import annotations

import torch

from ..checks import (FLOATS, REFERENCE_FLOATS, check_bool, check_dims, check_gradient, check_has_values,
                      check_kernel_device, check_not_empty, check_once_per_signature, check_packed_layout, check_same_device,
                      check_same_device_and_dtype, check_tensor, softmax_scale_or_default)

MAX_HEAD_DIM = 256  # the kernels hold a whole key row (padded to a power of two) in registers


def _check_dims(name: str, t: torch.Tensor, letters: str, sizes: dict) -> None:
    letters = letters.split()
    check_dims(name, t, [sizes[c] for c in letters], ", ".join(letters))


@check_once_per_signature
def check_linear_inputs(q, k, v, gates, scale=None, initial_state=None, output_final_state=False, *,
                        kernel: bool = True, step: bool = False, state_name: str = "initial_state",
                        cu_seqlens=None):
    """Validate a linear-attention call; return (B, T, H, K, V, scale).

    q, k: [B, T, H, K]; v: [B, T, H, V], one dtype (fp16, bf16, fp32; fp64 too when kernel=False). v has
        q's heads: grouped value heads (fla's num_v_heads, more heads in v than in q) are refused by name.
    gates: {name: (tensor, letters)}, each gate any float dtype of the same list, its shape given in
        the letters B, T, H, K, V (e.g. {"gk": (gk, "B T H K")}); an empty dict for none.
    scale: a float > 0, default K ** -0.5 (the shared scale rule: bool, str -> TypeError; <= 0, nan,
        inf -> ValueError). initial_state: None, or [B, H, K, V] in fp32 (fp32 or fp64 when
        kernel=False), named `state_name` in messages. output_final_state: a bool.
    kernel: the call launches a Triton kernel: K, V <= 256, and the machine rule (CPU tensors and no
        bf16 under the interpreter, CUDA tensors on a GPU). Otherwise (a PyTorch reference) any
        device but meta. step: one decode step, no T axis (q, k [B, H, K], v [B, H, V]; T is 1).
    cu_seqlens: packed sequences' offsets (int32 [N + 1], batch 1), their layout only; the states are then
        [N, H, K, V], one per sequence. Their values are checked where they are read
        (`attention_kernels.linear.packed.sequences`).
    """
    dtypes = FLOATS if kernel else REFERENCE_FLOATS
    layout = "B H" if step else "B T H"
    check_tensor("q", q, ndim=len(layout.split()) + 1, dtypes=dtypes)
    check_tensor("k", k, ndim=q.dim(), dtypes=dtypes)
    check_tensor("v", v, ndim=q.dim(), dtypes=dtypes)
    for name, (g, letters) in gates.items():
        check_tensor(name, g, ndim=len(letters.split()), dtypes=dtypes)
    tensors = {"q": q, "k": k, "v": v, **{name: g for name, (g, _) in gates.items()}}
    if initial_state is not None or step:
        check_tensor(state_name, initial_state, ndim=4,
                     dtypes=(torch.float32,) if kernel else (torch.float32, torch.float64))
        tensors[state_name] = initial_state
    check_bool("output_final_state", output_final_state)

    check_not_empty("q", q, ", ".join(layout.split() + ["K"]))
    check_not_empty("v", v, ", ".join(layout.split() + ["V"]))
    sizes = {"T": 1, **dict(zip(layout.split() + ["K"], q.shape)), "V": v.shape[-1]}  # T = 1 for a step
    _check_dims("k", k, f"{layout} K", sizes)
    if v.shape[-2] != sizes["H"]:  # fla's num_v_heads: more value heads than query heads, q and k shared
        raise ValueError(f"v must have as many heads as q (H = {sizes['H']}), got {v.shape[-2]} "
                         f"(v is {list(v.shape)}): grouped value heads (fla's num_v_heads) are not supported")
    _check_dims("v", v, f"{layout} V", sizes)
    for name, (g, letters) in gates.items():
        _check_dims(name, g, letters, sizes)
    if cu_seqlens is not None:
        sizes["N"] = check_packed_layout(cu_seqlens, name="q", batch=sizes["B"], device=q.device)
    if state_name in tensors:
        _check_dims(state_name, initial_state, "B H K V" if cu_seqlens is None else "N H K V", sizes)
    if kernel and not (sizes["K"] <= MAX_HEAD_DIM and sizes["V"] <= MAX_HEAD_DIM):
        raise ValueError(f"head dims K={sizes['K']}, V={sizes['V']} must be at most {MAX_HEAD_DIM}")

    check_same_device_and_dtype(q=q, k=k, v=v)
    check_same_device(**tensors)
    if kernel:
        check_kernel_device(**tensors)
    else:
        check_has_values(**tensors)
    scale = softmax_scale_or_default(scale, sizes["K"], name="scale")
    return sizes["B"], sizes["T"], sizes["H"], sizes["K"], sizes["V"], scale


def check_output_gradients(do, dht, v, K: int, cu_seqlens=None) -> None:
    """A chunk form's backward op's incoming gradients, for inputs already checked: do as o (v's shape, dtype
    and device), dht None or fp32 as the final states ([B, H, K, V], or [N, H, K, V] for N packed sequences)."""
    check_gradient("do", do, v.shape, v.dtype, v.device)
    if dht is not None:
        B, _, H, V = v.shape
        states = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        check_gradient("dht", dht, (states, H, K, V), torch.float32, v.device)


def state_v_first_in(initial_state, state_v_first, q, v, cu_seqlens=None):
    """fla's state_v_first=True: initial_state comes as [B, H, V, K] ([N, H, V, K] for N packed sequences);
    the kernels read [B, H, K, V]."""
    if not check_bool("state_v_first", state_v_first) or not isinstance(initial_state, torch.Tensor):
        return initial_state
    if isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() == v.dim() == 4:
        (B, _, H, K), V = q.shape, v.shape[-1]
        if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1:
            B = cu_seqlens.shape[0] - 1
        check_dims("initial_state (state_v_first=True)", initial_state, (B, H, V, K), "B, H, V, K")
    return initial_state.transpose(-1, -2)


def state_v_first_out(final_state, state_v_first: bool):
    """The final state in the caller's layout: with state_v_first, a [B, H, V, K] view of the kernels' one."""
    return final_state.transpose(-1, -2) if state_v_first and final_state is not None else final_state


__all__ = ["MAX_HEAD_DIM", "check_linear_inputs", "check_output_gradients", "state_v_first_in", "state_v_first_out"]
