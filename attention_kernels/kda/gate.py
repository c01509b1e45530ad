"""fla's in-kernel gate options for KDA (fla.ops.kda, as Kimi Linear's layer calls it), done here in
PyTorch before the kernels: the model hands over its raw projections, and these functions turn them into
the log decay g and the write strength beta the kernels take.

    use_gate_in_kernel=True     g is the gate projection, [B, T, H, K]; the log decay is
                                -exp(A_log) * softplus(g + dt_bias), A_log [H] one rate per head and
                                dt_bias [H * K] one bias per channel; with lower_bound set it is
                                lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) instead (A_log may then be
                                None: lower_bound * sigmoid(g + dt_bias)), which stays in [lower_bound, 0)
    use_beta_sigmoid_in_kernel  beta is the logit, [B, T, H]; the write strength is sigmoid(beta),
                                2 * sigmoid(beta) with allow_neg_eigval (the state's eigenvalue along k,
                                1 - beta, may then go negative)

Both are ordinary autograd ops in fp32, so the chunk form's backward reaches A_log, dt_bias, the raw
gate and the beta logits through them. Fusing them into the first kernel (as fla does) would save a
read and a write of g: a later speed step.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..checks import REFERENCE_FLOATS, check_bool, check_tensor


def kda_gate(g: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
             lower_bound: float | None = None) -> torch.Tensor:
    """The log decay from the raw gate g [..., H, K]: -exp(A_log) * softplus(g + dt_bias), or
    lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) when lower_bound is set; fp32 (fp64 for fp64 g)."""
    H, K = g.shape[-2:]
    dtype = torch.float64 if g.dtype == torch.float64 else torch.float32
    x = g.to(dtype)
    if dt_bias is not None:
        x = x + dt_bias.to(dtype).reshape(H, K)
    rate = None if A_log is None else A_log.to(dtype).exp().reshape(H, 1)
    if lower_bound is None:
        return -rate * F.softplus(x)
    return lower_bound * torch.sigmoid(x if rate is None else rate * x)


def kda_beta(beta: torch.Tensor, allow_neg_eigval: bool = False) -> torch.Tensor:
    """The write strength from the logits beta [..., H]: sigmoid(beta), times 2 with allow_neg_eigval;
    fp32 (fp64 for fp64 beta)."""
    strength = torch.sigmoid(beta.to(torch.float64 if beta.dtype == torch.float64 else torch.float32))
    return 2 * strength if allow_neg_eigval else strength


def check_gate_options(form: str, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                       allow_neg_eigval, lower_bound, safe_gate=False) -> None:
    """fla's rules for these options, before anything is computed: TypeError or ValueError naming the
    argument. g, beta: as passed (their shapes are checked later, with the kernels' inputs; here g gives H and
    K). A_log and dt_bias may have any shape of H and H * K elements (fla reads them through a view)."""
    for name, flag in (("use_gate_in_kernel", use_gate_in_kernel), ("use_beta_sigmoid_in_kernel",
                       use_beta_sigmoid_in_kernel), ("allow_neg_eigval", allow_neg_eigval), ("safe_gate", safe_gate)):
        check_bool(name, flag)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True scales sigmoid(beta) to [0, 2): it needs "
                         "use_beta_sigmoid_in_kernel=True (beta given as logits)")
    if lower_bound is not None:
        if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)):
            raise TypeError(f"lower_bound must be a float or None, got {type(lower_bound).__name__}")
        if not (math.isfinite(lower_bound) and lower_bound < 0):
            raise ValueError(f"lower_bound must be a finite log decay below 0, got {lower_bound}")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("safe_gate=True with use_gate_in_kernel=True needs lower_bound (the gate's floor)")
        if lower_bound < -5:
            raise ValueError(f"lower_bound must be in [-5, 0) with safe_gate=True, got {lower_bound}")
    if use_beta_sigmoid_in_kernel:
        check_tensor("beta", beta, dtypes=REFERENCE_FLOATS)
    if not use_gate_in_kernel:
        for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
            if t is not None:
                raise ValueError(f"{name} is read only with use_gate_in_kernel=True (g is then the raw gate); "
                                 f"{form} got use_gate_in_kernel=False, where g is the log decay itself")
        return
    if A_log is None and lower_bound is None:
        raise ValueError("use_gate_in_kernel=True needs A_log [H] (or lower_bound, for the bounded gate)")
    check_tensor("g", g, ndim=4, dtypes=REFERENCE_FLOATS)
    H, K = g.shape[-2:]
    for name, t, n, dims in (("A_log", A_log, H, "H"), ("dt_bias", dt_bias, H * K, "H * K")):
        if t is not None:
            check_tensor(name, t, dtypes=REFERENCE_FLOATS)
            if t.numel() != n:
                raise ValueError(f"{name} must hold {dims} = {n} values, got shape {tuple(t.shape)}")
            if t.device != g.device:
                raise ValueError(f"{name} is on {t.device} and g on {g.device}: they must share a device")
