"""Published model shapes, and the bytes their attention layers keep per sequence while decoding.

A softmax layer keeps every past token (its KV cache grows with the context T); an MLA layer keeps one
latent vector per token, shared by all heads; a linear-attention or Mamba-2 layer keeps a fixed state,
whatever T is. Caches are bf16 (2 bytes a value), recurrent states fp32 (4 bytes), the short
convolutions' last inputs bf16.

    >>> MODELS["DeepSeek-V3"].cache_bytes_per_token()        # 61 layers x 576 values x 2 bytes
    70272
    >>> MODELS["Kimi Linear 48B"].bytes_per_sequence(131072)  # 7 MLA caches + 20 KDA states

Each model names its source; the numbers were read from the published config.json (or the paper where
the file is not public), and a source says where a number is the book's reading rather than a field.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import pandas as pd

CACHE_BYTES, STATE_BYTES = 2, 4  # bf16 caches and convolution inputs; fp32 recurrent states


def kv_cache_bytes_per_token(kv_heads: int, head_dim: int, value_bytes: int = CACHE_BYTES) -> int:
    """A softmax layer's KV cache, one token: K and V for every KV head, 2 · kv_heads · D · bytes."""
    return 2 * kv_heads * head_dim * value_bytes


def mla_cache_bytes_per_token(latent: int = 512 + 64, value_bytes: int = CACHE_BYTES) -> int:
    """An MLA layer's cache, one token: the compressed latent and the RoPE key (512 + 64 = 576 values
    in DeepSeek-V3), shared by every head."""
    return latent * value_bytes


def linear_state_bytes(heads: int, key_dim: int, value_dim: int, value_bytes: int = STATE_BYTES) -> int:
    """A linear-attention layer's state, one sequence: a K x V matrix per head, H · K · V · 4 bytes in
    fp32, the same at every context length."""
    return heads * key_dim * value_dim * value_bytes


def mamba2_state_bytes(heads: int, head_dim: int, dstate: int, groups: int, conv_width: int) -> int:
    """A Mamba-2 layer's state, one sequence: the SSM state (nheads · headdim · dstate, fp32) and the
    convolution's last conv_width - 1 inputs over its channels (x, B and C: nheads · headdim +
    2 · ngroups · dstate, bf16)."""
    ssm = heads * head_dim * dstate * STATE_BYTES
    conv = (conv_width - 1) * (heads * head_dim + 2 * groups * dstate) * CACHE_BYTES
    return ssm + conv


@dataclasses.dataclass(frozen=True)
class Layer:
    """One attention layer's shape.

    kind: "GQA" (softmax over a KV cache), "MLA", "GLA", "Lightning", "KDA" or "Mamba-2".
    heads, head_dim: query heads and their width (K = V = head_dim for the linear layers; headdim for
        Mamba-2). kv_heads: softmax layers' KV heads. latent: MLA's cached values per token.
    dstate, groups: Mamba-2's state size and B/C groups. conv_width: a short convolution's width before
        the layer (0: none); its last conv_width - 1 inputs are state too.
    """
    kind: str
    heads: int
    head_dim: int
    kv_heads: int = 0
    latent: int = 0
    dstate: int = 0
    groups: int = 0
    conv_width: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def cache_bytes_per_token(self) -> int:
        """Bytes added to this layer's cache by every token (0 for a fixed-state layer)."""
        if self.kind == "GQA":
            return kv_cache_bytes_per_token(self.kv_heads, self.head_dim)
        if self.kind == "MLA":
            return mla_cache_bytes_per_token(self.latent)
        return 0

    def state_bytes(self) -> int:
        """Bytes of fixed state per sequence (0 for a cache layer)."""
        if self.kind in ("GLA", "Lightning", "KDA"):
            state = linear_state_bytes(self.heads, self.head_dim, self.head_dim)
            # KDA's short convolutions on q, k and v keep their last inputs
            conv = max(self.conv_width - 1, 0) * 3 * self.heads * self.head_dim * CACHE_BYTES
            return state + conv
        if self.kind == "Mamba-2":
            return mamba2_state_bytes(self.heads, self.head_dim, self.dstate, self.groups, self.conv_width)
        return 0

    def bytes_per_sequence(self, T: int) -> int:
        """What one sequence of T tokens keeps in this layer."""
        return T * self.cache_bytes_per_token() + self.state_bytes()


KINDS = ("GQA", "MLA", "GLA", "Lightning", "KDA", "Mamba-2")


@dataclasses.dataclass(frozen=True)
class Model:
    """A published model's attention layers: (Layer, how many) pairs, and layers without attention
    (Nemotron-H's MLP-only layers) counted apart. source: where the numbers come from."""
    name: str
    stack: tuple[tuple[Layer, int], ...]
    source: str
    other_layers: int = 0

    @property
    def layers(self) -> int:
        return sum(n for _, n in self.stack) + self.other_layers

    def pattern(self) -> str:
        """The layer mix in words: "20 KDA + 7 MLA"."""
        return " + ".join(f"{n} {layer.kind}" for layer, n in self.stack)

    def cache_bytes_per_token(self) -> int:
        return stack_bytes(self.stack, 1) - stack_bytes(self.stack, 0)

    def state_bytes(self) -> int:
        return stack_bytes(self.stack, 0)

    def bytes_per_sequence(self, T: int) -> int:
        return stack_bytes(self.stack, T)


def stack_bytes(stack: Sequence[tuple[Layer, int]], T: int, batch: int = 1) -> int:
    """Bytes a stack of layers keeps for `batch` sequences of T tokens each."""
    return batch * sum(n * layer.bytes_per_sequence(T) for layer, n in stack)


def stack_time(stack: Sequence[tuple[Layer, int]], per_layer: Mapping[str, float]) -> float:
    """A whole stack's time from one layer's time per kind: sum of count x time. The model leaves out
    what lies between the layers (norms, projections, MLPs); it is checked against a stack timed in one
    piece (`attention_kernels.compare.bench.STACK`)."""
    missing = sorted({layer.kind for layer, _ in stack} - set(per_layer))
    if missing:
        raise ValueError(f"per_layer has no time for {missing}")
    return sum(n * per_layer[layer.kind] for layer, n in stack)


def ratio_stack(linear: Layer, softmax: Layer, linear_per_softmax: int | None, layers: int):
    """A hybrid of `layers` layers with `linear_per_softmax` fixed-state layers for each softmax (or MLA)
    layer: 0 is all softmax, None all linear. MiniMax-01: 7 per 1 over 80 layers, 70 + 10."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if linear_per_softmax is None:
        return ((linear, layers),)
    if linear_per_softmax < 0:
        raise ValueError(f"linear_per_softmax must be >= 0 or None, got {linear_per_softmax}")
    n_softmax = max(1, int(layers / (linear_per_softmax + 1) + 0.5))
    return tuple((layer, n) for layer, n in ((linear, layers - n_softmax), (softmax, n_softmax)) if n)


# ------------------------------------------------------------------ the published shapes
LLAMA3_GQA = Layer("GQA", heads=32, head_dim=128, kv_heads=8)
DEEPSEEK_MLA = Layer("MLA", heads=128, head_dim=576, latent=512 + 64)
KIMI_KDA = Layer("KDA", heads=32, head_dim=128, conv_width=4)
KIMI_MLA = Layer("MLA", heads=32, head_dim=576, latent=512 + 64)
MINIMAX_LIGHTNING = Layer("Lightning", heads=64, head_dim=128)
MINIMAX_GQA = Layer("GQA", heads=64, head_dim=128, kv_heads=8)
MAMBA2_27B = Layer("Mamba-2", heads=80, head_dim=64, dstate=128, groups=1, conv_width=4)
NEMOTRON_MAMBA2 = Layer("Mamba-2", heads=128, head_dim=64, dstate=128, groups=8, conv_width=4)
NEMOTRON_GQA = Layer("GQA", heads=32, head_dim=128, kv_heads=8)
BOOK_GLA = Layer("GLA", heads=32, head_dim=128)  # the GLA chapter's shape (no published model here)

# The layer of each kind the benchmarks time (attention_kernels.compare.bench), by its model.
LAYERS = {"GQA": LLAMA3_GQA, "MLA": DEEPSEEK_MLA, "GLA": BOOK_GLA, "Lightning": MINIMAX_LIGHTNING,
          "KDA": KIMI_KDA, "Mamba-2": MAMBA2_27B}

MODELS = {m.name: m for m in [
    Model("LLaMA-3-8B", ((LLAMA3_GQA, 32),),
          "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json: num_hidden_layers 32, "
          "num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head dim 4096 / 32 = 128)"),
    Model("DeepSeek-V3", ((DEEPSEEK_MLA, 61),),
          "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: num_hidden_layers 61, "
          "num_attention_heads 128, kv_lora_rank 512, qk_rope_head_dim 64 (the cache: 512 + 64 = 576)"),
    Model("Kimi Linear 48B", ((KIMI_KDA, 20), (KIMI_MLA, 7)),
          "https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json: "
          "num_hidden_layers 27, linear_attn_config full_attn_layers [4, 8, 12, 16, 20, 24, 27] (MLA) and "
          "20 kda_layers, num_heads 32, head_dim 128, short_conv_kernel_size 4; MLA kv_lora_rank 512, "
          "qk_rope_head_dim 64, num_attention_heads 32 (read from copies of the file; arXiv:2510.26692)"),
    Model("MiniMax-01", ((MINIMAX_LIGHTNING, 70), (MINIMAX_GQA, 10)),
          "https://huggingface.co/MiniMaxAI/MiniMax-Text-01/blob/main/config.json: num_hidden_layers 80, "
          "attn_type_list [0] * 7 + [1] repeated 10 times, num_attention_heads 64, head_dim 128, "
          "num_key_value_heads 8 (arXiv:2501.08313); the Lightning state held in fp32 is the book's choice"),
    Model("Mamba-2 2.7B", ((MAMBA2_27B, 64),),
          "https://huggingface.co/state-spaces/mamba2-2.7b/blob/main/config.json: d_model 2560, n_layer 64; "
          "expand 2, headdim 64, d_state 128, ngroups 1, d_conv 4 are mamba_ssm's Mamba2 defaults "
          "(arXiv:2405.21060): 2 x 2560 / 64 = 80 heads"),
    Model("Nemotron-H 8B", ((NEMOTRON_MAMBA2, 24), (NEMOTRON_GQA, 4)),
          "https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/main/config.json: num_hidden_layers 52, "
          "hybrid_override_pattern with 24 M (Mamba-2), 4 * (attention) and 24 - (MLP); mamba_num_heads 128, "
          "mamba_head_dim 64, ssm_state_size 128, n_groups 8, conv_kernel 4; num_attention_heads 32, "
          "num_key_value_heads 8, attention_head_dim 128 (read from copies of the file; arXiv:2504.03624)",
          other_layers=24),
]}

KIB, MIB, GIB = 2 ** 10, 2 ** 20, 2 ** 30


def shapes_table(contexts: Sequence[int] = (131072, 1048576), models: Mapping[str, Model] = MODELS) -> pd.DataFrame:
    """One row per model: its layer mix, the cache every token adds (KiB, whole model), the fixed state
    of one sequence (MiB) and what one sequence holds at each context (GiB)."""
    rows = []
    for m in models.values():
        row = {"model": m.name, "attention layers": m.pattern(),
               "KiB / token": m.cache_bytes_per_token() / KIB, "state MiB": m.state_bytes() / MIB}
        row.update({f"GiB at {_tokens(T)}": m.bytes_per_sequence(T) / GIB for T in contexts})
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def _tokens(T: int) -> str:
    return f"{T // 1048576}M" if T % 1048576 == 0 else f"{T // 1024}K"


# ------------------------------------------------------------------ one layer of each kind, against the context
LAYER_CONTEXTS = (1024, 4096, 16384, 65536, 262144, 1048576)  # 1K to 1M tokens


def layer_label(kind: str, layers: Mapping[str, Layer] = LAYERS) -> str:
    """The kind and whose layer it is: "GQA, LLaMA-3-8B" (the first model of `MODELS` that has this very
    layer; its name alone where it starts with the kind, "Mamba-2 2.7B"), or its heads where no model here
    has it ("GLA, 32 heads of 128")."""
    layer = layers[kind]
    model = next((m.name for m in MODELS.values() if any(each == layer for each, _ in m.stack)), None)
    if model is None:
        return f"{kind}, {layer.heads} heads of {layer.head_dim}"
    return model if model.startswith(kind) else f"{kind}, {model}"


def layer_memory(contexts: Sequence[int] = LAYER_CONTEXTS, layers: Mapping[str, Layer] = LAYERS) -> pd.DataFrame:
    """Bytes one sequence keeps in one layer of each kind (`LAYERS`: the shapes the decode table times),
    one row per context length T, one column per kind: a cache grows with T, a fixed state does not."""
    return pd.DataFrame({kind: [layer.bytes_per_sequence(T) for T in contexts] for kind, layer in layers.items()},
                        index=pd.Index(contexts, name="T"))


def memory_crossover(cache: Layer, state: Layer) -> float:
    """The context length at which a cache layer keeps as many bytes per sequence as a fixed-state layer:
    the state's bytes over the bytes every token adds to the cache."""
    if not cache.cache_bytes_per_token() or cache.state_bytes() or not state.state_bytes():
        raise ValueError(f"memory_crossover takes a cache layer and a fixed-state layer, got {cache.kind} "
                         f"and {state.kind}")
    return state.state_bytes() / cache.cache_bytes_per_token()


def memory_crossovers(layers: Mapping[str, Layer] = LAYERS) -> pd.DataFrame:
    """The context length (tokens, rounded) at which each cache layer of `layers` (columns) passes each
    fixed-state layer (rows) in bytes per sequence, one layer of each at the shapes of `LAYERS`."""
    caches = [k for k, layer in layers.items() if layer.cache_bytes_per_token()]
    states = [k for k, layer in layers.items() if layer.state_bytes()]
    return pd.DataFrame([[round(memory_crossover(layers[c], layers[s])) for c in caches] for s in states],
                        index=pd.Index([layer_label(s, layers) for s in states], name="fixed state"),
                        columns=pd.Index([layer_label(c, layers) for c in caches], name="cache passes it at T ="))
