"""The peers' options on each of the book's drop-in calls: which the book takes, which it refuses.

A model written for flash-attn, fla or mamba_ssm calls the peer's function with the peer's keywords.
Each `Option` below names one keyword of one such call, what the book does with it, and a value that
shows it: "takes" (the call runs with it), "refuses" (a ValueError naming the keyword, before any
launch) or "takes, no effect" (accepted, and the answer is the default's: e.g. flash-attn's
`deterministic`, since the book's backward is deterministic either way). tests/test_in_a_model.py
makes every call the table describes, so the table cannot claim what the code does not do.

    >>> options_table()          # one row per call: the keywords taken and those refused
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
import torch
import torch.nn.functional as F

TAKES, REFUSES, NO_EFFECT = "takes", "refuses", "takes, no effect"


@dataclass(frozen=True)
class Call:
    """One drop-in function: its peer and a small call on fresh inputs (keyword -> value)."""
    name: str
    peer: str
    function: Callable
    inputs: Callable[[torch.device], dict]


@dataclass(frozen=True)
class Option:
    """A keyword of `call`, what the book does with it, and the keywords that show it: `value` is the
    option's value, or a function of the call's inputs returning every keyword to change (an option
    may need a companion, e.g. use_gate_in_kernel needs A_log)."""
    call: str
    name: str
    status: str
    value: Any

    def keywords(self, inputs: dict) -> dict:
        return self.value(inputs) if callable(self.value) else {self.name: self.value}


def _randn(*shape, device, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _offsets(*values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


# ------------------------------------------------------------------ small inputs for each call
# fp32 and short: they run under the Triton interpreter in seconds. T = 10 tokens, not a block multiple.
T, H, K = 10, 2, 16


def _attention_inputs(device):
    return {"q": _randn(1, 5, 2, 32, device=device), "k": _randn(1, 7, 1, 32, device=device, seed=1),
            "v": _randn(1, 7, 1, 32, device=device, seed=2)}


def _varlen_inputs(device):
    cu = _offsets(0, 4, 9, device=device)
    return {"q": _randn(9, 2, 32, device=device), "k": _randn(9, 1, 32, device=device, seed=1),
            "v": _randn(9, 1, 32, device=device, seed=2), "cu_seqlens_q": cu, "cu_seqlens_k": cu,
            "max_seqlen_q": 5, "max_seqlen_k": 5}


def _cache_inputs(device):
    return {"q": _randn(2, 1, 2, 32, device=device), "k_cache": _randn(2, 8, 1, 32, device=device, seed=1),
            "v_cache": _randn(2, 8, 1, 32, device=device, seed=2)}


def _linear_inputs(device, gate="g"):
    q, k, v, g = (_randn(1, T, H, K, device=device, seed=s) for s in range(4))
    return {"q": q, "k": F.normalize(k, dim=-1), "v": v, gate: F.logsigmoid(g) / 4}


def _kda_inputs(device):
    return {**_linear_inputs(device), "beta": torch.rand(1, T, H, generator=torch.Generator().manual_seed(5)
                                                            ).to(device)}


def _lightning_inputs(device):
    q, k, v = (_randn(1, T, H, K, device=device, seed=s) for s in range(3))
    return {"q": q, "k": k, "v": v, "layer_idx": 1, "num_layers": 4}


def _ssd_inputs(device):
    return {"x": _randn(1, T, H, K, device=device), "dt": _randn(1, T, H, device=device, seed=1).abs() / 4,
            "A": -torch.arange(1.0, H + 1, device=device), "B": _randn(1, T, 1, K, device=device, seed=2),
            "C": _randn(1, T, 1, K, device=device, seed=3), "chunk_size": 16}


def _norm_inputs(device):
    return {"x": _randn(6, 32, device=device), "weight": _randn(32, device=device, seed=1), "bias": None}


def _calls() -> dict[str, Call]:
    from ..flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from ..gla import chunk_gla, fused_recurrent_gla
    from ..kda import chunk_kda, fused_recurrent_kda
    from ..lightning import chunk_lightning_attn, fused_recurrent_lightning_attn
    from ..mamba2 import mamba_chunk_scan_combined, rmsnorm_fn

    calls = [Call("flash_attn_func", "flash-attn", flash_attn_func, _attention_inputs),
             Call("flash_attn_varlen_func", "flash-attn", flash_attn_varlen_func, _varlen_inputs),
             Call("flash_attn_with_kvcache", "flash-attn", flash_attn_with_kvcache, _cache_inputs),
             Call("chunk_gla", "fla", chunk_gla, _linear_inputs),
             Call("fused_recurrent_gla", "fla", fused_recurrent_gla, lambda d: _linear_inputs(d, gate="gk")),
             Call("chunk_kda", "fla", chunk_kda, _kda_inputs),
             Call("fused_recurrent_kda", "fla", fused_recurrent_kda, _kda_inputs),
             Call("chunk_lightning_attn", "fla", chunk_lightning_attn, _lightning_inputs),
             Call("fused_recurrent_lightning_attn", "fla", fused_recurrent_lightning_attn, _lightning_inputs),
             Call("mamba_chunk_scan_combined", "mamba_ssm", mamba_chunk_scan_combined, _ssd_inputs),
             Call("rmsnorm_fn", "mamba_ssm", rmsnorm_fn, _norm_inputs)]
    return {c.name: c for c in calls}


# ------------------------------------------------------------------ the options, call by call
def _state(x):
    """An fp32 initial state [N, H, K, V] for the linear calls' inputs x (one sequence)."""
    return {"initial_state": _randn(1, H, K, K, device=x["q"].device, seed=9)}


def _two_sequences(x):
    return {"cu_seqlens": _offsets(0, 4, T, device=x["q"].device)}


def _kda_gate_in_kernel(x):
    device = x["q"].device
    return {"use_gate_in_kernel": True, "A_log": _randn(H, device=device, seed=6) / 4,
            "dt_bias": _randn(H * K, device=device, seed=7), "g": _randn(1, T, H, K, device=device, seed=3)}


def _linear_common(call: str) -> list[Option]:
    return [Option(call, "scale", TAKES, 0.5), Option(call, "initial_state", TAKES, _state),
            Option(call, "output_final_state", TAKES, True),
            Option(call, "state_v_first", TAKES, lambda x: {"state_v_first": True, **_state(x)}),
            Option(call, "cu_seqlens", TAKES, _two_sequences)]


def _kda_common(call: str) -> list[Option]:
    return _linear_common(call) + [
        Option(call, "use_qk_l2norm_in_kernel", TAKES, True),
        Option(call, "use_gate_in_kernel", TAKES, _kda_gate_in_kernel),
        Option(call, "lower_bound", TAKES, lambda x: {**_kda_gate_in_kernel(x), "lower_bound": -3.0}),
        Option(call, "use_beta_sigmoid_in_kernel", TAKES, True),
        Option(call, "allow_neg_eigval", TAKES,
               lambda x: {"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True})]


def _flash_common(call: str) -> list[Option]:
    return [Option(call, "softmax_scale", TAKES, 0.1), Option(call, "causal", TAKES, True),
            Option(call, "window_size", TAKES, (-1, 0)), Option(call, "return_attn_probs", TAKES, True),
            Option(call, "deterministic", NO_EFFECT, True), Option(call, "dropout_p", REFUSES, 0.1),
            Option(call, "window_size", REFUSES, (4, 0)), Option(call, "softcap", REFUSES, 30.0),
            Option(call, "alibi_slopes", REFUSES, lambda x: {"alibi_slopes": torch.ones(2, device=x["q"].device)})]


def _ssd_varlen(x):
    device = x["x"].device
    return {"seq_idx": torch.tensor([[0] * 4 + [1] * (T - 4)], device=device),
            "cu_seqlens": _offsets(0, 4, T, device=device), "return_varlen_states": True}


def _options() -> list[Option]:
    def new_tokens(x):
        device = x["q"].device
        return {"k": _randn(2, 1, 1, 32, device=device, seed=3), "v": _randn(2, 1, 1, 32, device=device, seed=4),
                "cache_seqlens": _offsets(3, 6, device=device)}

    cache = "flash_attn_with_kvcache"
    return [
        *_flash_common("flash_attn_func"),
        *_flash_common("flash_attn_varlen_func"),
        Option("flash_attn_varlen_func", "block_table", REFUSES,
               lambda x: {"block_table": _offsets(0, 1, device=x["q"].device)[None]}),
        Option(cache, "k, v", TAKES, new_tokens),
        Option(cache, "cache_seqlens", TAKES, lambda x: {"cache_seqlens": _offsets(3, 8, device=x["q"].device)}),
        Option(cache, "softmax_scale", TAKES, 0.1), Option(cache, "causal", TAKES, True),
        Option(cache, "num_splits", TAKES, 2), Option(cache, "return_softmax_lse", TAKES, True),
        Option(cache, "rotary_interleaved", NO_EFFECT, False),
        *(Option(cache, name, REFUSES, lambda x, name=name: {name: torch.zeros(2, dtype=torch.int32,
                                                                               device=x["q"].device)})
          for name in ("rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad", "block_table",
                       "alibi_slopes")),
        Option(cache, "window_size", REFUSES, (4, 0)), Option(cache, "softcap", REFUSES, 30.0),

        *_linear_common("chunk_gla"),
        Option("chunk_gla", "cu_seqlens_cpu", REFUSES, lambda x: {**_two_sequences(x),
                                                                  "cu_seqlens_cpu": _offsets(0, 4, T, device="cpu")}),
        *_linear_common("fused_recurrent_gla"),
        Option("fused_recurrent_gla", "gv", REFUSES, lambda x: {"gv": x["gk"][..., :K]}),
        Option("fused_recurrent_gla", "reverse", REFUSES, True),

        *_kda_common("chunk_kda"),
        Option("chunk_kda", "safe_gate", NO_EFFECT, True),
        *(Option("chunk_kda", name, REFUSES, True) for name in ("disable_recompute", "return_intermediate_states")),
        Option("chunk_kda", "cu_seqlens_cpu", REFUSES, lambda x: {**_two_sequences(x),
                                                                  "cu_seqlens_cpu": _offsets(0, 4, T, device="cpu")}),
        Option("chunk_kda", "cp_context", REFUSES, "a context-parallel group"),
        Option("chunk_kda", "chunk_size", REFUSES, 32),
        *_kda_common("fused_recurrent_kda"),

        *(option for call in ("chunk_lightning_attn", "fused_recurrent_lightning_attn")
          for option in (*(o for o in _linear_common(call) if o.name != "state_v_first"),
                         Option(call, "head_first", REFUSES, True))),
        Option("fused_recurrent_lightning_attn", "reverse", REFUSES, True),

        *(Option("mamba_chunk_scan_combined", name, TAKES, value) for name, value in (
            ("D", lambda x: {"D": torch.ones(H, device=x["x"].device)}),
            ("z", lambda x: {"z": _randn(1, T, H, K, device=x["x"].device, seed=4)}),
            ("dt_bias", lambda x: {"dt_bias": torch.zeros(H, device=x["x"].device)}),
            ("initial_states", lambda x: {"initial_states": _randn(1, H, K, K, device=x["x"].device, seed=9)}),
            ("seq_idx", lambda x: {"seq_idx": _ssd_varlen(x)["seq_idx"]}),
            ("cu_seqlens", lambda x: {k: v for k, v in _ssd_varlen(x).items() if k != "return_varlen_states"}),
            ("dt_softplus", True),
            ("dt_limit", lambda x: {"dt_softplus": True, "dt_limit": (0.01, 0.5)}),
            ("return_final_states", True),
            ("return_varlen_states", _ssd_varlen),
            ("state_dtype", lambda x: {**_ssd_varlen(x), "state_dtype": torch.float16}))),
        *(Option("mamba_chunk_scan_combined", name, REFUSES,
                 lambda x, name=name: {name: torch.zeros(1, dtype=torch.int32, device=x["x"].device)})
          for name in ("chunk_indices", "chunk_offsets")),

        Option("rmsnorm_fn", "z", TAKES, lambda x: {"z": _randn(6, 32, device=x["x"].device, seed=2)}),
        Option("rmsnorm_fn", "eps", TAKES, 1e-3),
        Option("rmsnorm_fn", "group_size", TAKES, 16),
        Option("rmsnorm_fn", "norm_before_gate", TAKES,
               lambda x: {"norm_before_gate": False, "z": _randn(6, 32, device=x["x"].device, seed=2)}),
    ]


CALLS = _calls()
OPTIONS = _options()


def call_with(option: Option | None, call: str | None = None, device: str | torch.device = "cpu"):
    """Make the call `option` belongs to (or the plain `call`, option None) on fresh small inputs."""
    c = CALLS[option.call if option is not None else call]
    inputs = c.inputs(torch.device(device))
    keywords = {**inputs, **(option.keywords(inputs) if option is not None else {})}
    return c.function(**keywords)


def options_frame() -> pd.DataFrame:
    """One row per (call, option): the peer, the keyword, what the book does with it."""
    return pd.DataFrame([{"call": o.call, "peer": CALLS[o.call].peer, "option": o.name, "book": o.status}
                         for o in OPTIONS])


def options_table() -> pd.DataFrame:
    """One row per drop-in call: its peer, the peer's keywords the book takes (those that change nothing
    marked "(no effect)") and those it refuses ("—" where none). A keyword taken at some values and refused
    at others (flash-attn's window_size: the causal window is taken, a sliding one refused) is in both."""
    frame = options_frame()
    rows = []
    for call, group in frame.groupby("call", sort=False):
        def names(status, suffix=""):
            return [name + suffix for name in dict.fromkeys(group.loc[group["book"] == status, "option"])]

        rows.append({"call": call, "peer": group["peer"].iloc[0],
                     TAKES: ", ".join(names(TAKES) + names(NO_EFFECT, " (no effect)")) or "—",
                     REFUSES: ", ".join(names(REFUSES)) or "—"})
    return pd.DataFrame(rows).set_index("call")


__all__ = ["Call", "Option", "CALLS", "OPTIONS", "TAKES", "REFUSES", "NO_EFFECT", "call_with", "options_frame",
           "options_table"]
