"""Tiny language models, one per family, trained with the book's kernels and with the peer's.

Each model is the same small stack (token embedding, two blocks of a token mixer and an MLP, each behind an
RMSNorm and a residual) with a different mixer: softmax GQA, GLA, Lightning, KDA or Mamba-2. A mixer calls
its kernel with the peer's own call (flash-attn's, fla's, mamba_ssm's), so the book's function and the
peer's are interchangeable: the same model, seed and batches, trained once with each, should give the
same loss curve up to rounding. The task is associative recall: a sequence lists key-value pairs, then
asks for the keys again in a new order; the loss is read on the answers only, so it falls only when a
layer learns to look back to the right pair.

    >>> losses = train("gla", kernels("gla")["book"], steps=300)     # [loss per step]
    >>> df = load_losses()                                           # results/in_a_model_losses.csv
    >>> plot_losses(df)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("softmax", "gla", "lightning", "kda", "mamba2")
TITLES = {"softmax": "Softmax (GQA)", "gla": "GLA", "lightning": "Lightning", "kda": "KDA", "mamba2": "Mamba-2"}
RESULTS_NAME = "in_a_model_losses"
MEASURE_COMMAND = "python3 scripts/train_tiny.py"   # writes results/RESULTS_NAME.* on a GPU


@dataclass(frozen=True)
class Setup:
    """The run's sizes: on the GPU the defaults, on the CPU (under the interpreter) `Setup.small()`."""
    steps: int = 300
    batch: int = 64
    pairs: int = 16              # key-value pairs per sequence; the sequence is 4 · pairs tokens
    keys: int = 64               # key tokens 0 .. keys-1, value tokens keys .. 2·keys-1
    width: int = 128
    heads: int = 4
    head_dim: int = 32
    layers: int = 2
    lr: float = 2e-3
    seed: int = 0

    @classmethod
    def small(cls, steps: int) -> Setup:
        return cls(steps=steps, batch=2, pairs=4, keys=8, width=32, heads=2, head_dim=32)

    @property
    def vocab(self) -> int:
        return 2 * self.keys


def recall_batch(setup: Setup, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [batch, 4·pairs], targets [batch, 4·pairs]): k1 v1 k2 v2 ... then the same keys shuffled,
    each followed by its value. A target is the next token where it is an answer, -100 elsewhere."""
    b, n = setup.batch, setup.pairs
    keys = torch.argsort(torch.rand(b, setup.keys, generator=generator), dim=1)[:, :n]
    values = torch.randint(setup.keys, 2 * setup.keys, (b, n), generator=generator)
    order = torch.argsort(torch.rand(b, n, generator=generator), dim=1)
    asked, answers = keys.gather(1, order), values.gather(1, order)
    tokens = torch.stack([torch.stack([keys, values], -1).flatten(1), torch.stack([asked, answers], -1).flatten(1)],
                         1).flatten(1)
    targets = torch.full_like(tokens, -100)
    targets[:, 2 * n::2] = answers          # after each asked key, its value
    return tokens.to(device), targets.to(device)


# ------------------------------------------------------------------ the kernels, in the peers' calls
def _sdpa_flash(q, k, v, causal=False):
    """SDPA's flash backend in flash_attn_func's call ([B, T, H, D], k and v with fewer heads: repeated to
    q's heads here, so the backend needs no GQA support of its own)."""
    from ..peers import sdpa

    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2).transpose(1, 2) for t in (k, v))
    return sdpa("flash")(q.transpose(1, 2), k, v, causal=causal).transpose(1, 2)


def kernels(family: str) -> dict[str, dict]:
    """{provider: {role: function}} for one family: the book's functions and, where installed, the peer's
    (flash-attn's, else SDPA's flash backend, for softmax), each with the peer's call."""
    from .. import flash_attn, gla, kda, lightning, mamba2, peers
    from ..common import ON_GPU

    if family == "softmax":
        book = {"attention": flash_attn.flash_attn_func}
        peer = peers.flash_attn("flash_attn_func")
        others = {"flash-attn": {"attention": peer}} if peer else ({"SDPA flash": {"attention": _sdpa_flash}}
                                                                    if ON_GPU else {})
    elif family == "gla":
        book, others = {"chunk": gla.chunk_gla}, {"fla": {"chunk": peers.fla("gla", "chunk_gla")}}
    elif family == "lightning":
        book = {"chunk": lightning.chunk_lightning_attn}
        others = {"fla": {"chunk": peers.fla("lightning_attn", "chunk_lightning_attn")}}
    elif family == "kda":
        book, others = {"chunk": kda.chunk_kda}, {"fla": {"chunk": peers.fla("kda", "chunk_kda")}}
    elif family == "mamba2":
        book = {"scan": mamba2.mamba_chunk_scan_combined, "norm": mamba2.rmsnorm_fn}
        others = {"mamba_ssm": {"scan": peers.mamba_ssm("ssd_combined", "mamba_chunk_scan_combined"),
                                "norm": peers.mamba_ssm("layernorm_gated", "rmsnorm_fn")}}
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    found = {name: fns for name, fns in others.items() if all(fns.values())}
    return {"book": book, **found}


# ------------------------------------------------------------------ the mixers
class Mixer(nn.Module):
    """Projections from the token and the one before it (a shift, so a key's value can find its key),
    then the family's kernel on [B, T, H, D] tensors in the kernel dtype, then an output projection."""

    def __init__(self, setup: Setup, fns: dict, projections: dict[str, int], dtype: torch.dtype):
        super().__init__()
        self.fns, self.dtype, self.setup = fns, dtype, setup
        self.sizes = projections
        self.inp = nn.Linear(2 * setup.width, sum(projections.values()), bias=False)
        self.out = nn.Linear(setup.heads * setup.head_dim, setup.width, bias=False)

    def project(self, x):
        previous = F.pad(x[:, :-1], (0, 0, 1, 0))
        parts = self.inp(torch.cat([x, previous], -1)).split(list(self.sizes.values()), -1)
        return dict(zip(self.sizes, parts))

    def heads(self, t, n=None):
        B, T, _ = t.shape
        return t.reshape(B, T, n or self.setup.heads, -1)

    def forward(self, x):
        o = self.mix(self.project(x))
        return self.out(o.float().flatten(2))


class Softmax(Mixer):
    """GQA: the query heads in pairs on one key-value head, causal."""

    def __init__(self, setup, fns, dtype, layer_idx):
        hd = setup.heads * setup.head_dim
        super().__init__(setup, fns, {"q": hd, "k": hd // 2, "v": hd // 2}, dtype)

    def mix(self, p):
        q, k, v = (self.heads(p[n], None if n == "q" else self.setup.heads // 2).to(self.dtype) for n in "qkv")
        return self.fns["attention"](q, k, v, causal=True)


class GLA(Mixer):
    def __init__(self, setup, fns, dtype, layer_idx):
        hd = setup.heads * setup.head_dim
        super().__init__(setup, fns, {"q": hd, "k": hd, "v": hd, "g": hd}, dtype)

    def mix(self, p):
        q, k, v = (self.heads(p[n]).to(self.dtype) for n in "qkv")
        g = F.logsigmoid(self.heads(p["g"])) / 16     # log decay, GLA's gate with its temperature
        return self.fns["chunk"](q, k, v, g)[0]


class Lightning(Mixer):
    def __init__(self, setup, fns, dtype, layer_idx):
        hd = setup.heads * setup.head_dim
        super().__init__(setup, fns, {"q": hd, "k": hd, "v": hd}, dtype)
        self.layer_idx = layer_idx

    def mix(self, p):
        q, k, v = (F.silu(self.heads(p[n])).to(self.dtype) for n in "qkv")
        return self.fns["chunk"](q, k, v, self.layer_idx, self.setup.layers)[0]


class KDA(Mixer):
    """The gate -exp(A_log) · softplus(g + dt_bias) and beta = sigmoid, in PyTorch before the call."""

    def __init__(self, setup, fns, dtype, layer_idx):
        hd = setup.heads * setup.head_dim
        super().__init__(setup, fns, {"q": hd, "k": hd, "v": hd, "g": hd, "beta": setup.heads}, dtype)
        self.A_log = nn.Parameter(torch.zeros(setup.heads))
        self.dt_bias = nn.Parameter(torch.zeros(hd))

    def mix(self, p):
        q, k, v = (self.heads(p[n]).to(self.dtype) for n in "qkv")
        g = -self.A_log.exp()[:, None] * F.softplus(self.heads(p["g"] + self.dt_bias))
        beta = torch.sigmoid(p["beta"]).to(self.dtype)
        return self.fns["chunk"](q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]


class Mamba2(Mixer):
    """The SSD scan (one group of B and C), then the gated RMSNorm with z, as a Mamba-2 layer does."""

    def __init__(self, setup, fns, dtype, layer_idx):
        hd = setup.heads * setup.head_dim
        n = setup.head_dim
        super().__init__(setup, fns, {"x": hd, "z": hd, "B": n, "C": n, "dt": setup.heads}, dtype)
        self.A_log = nn.Parameter(torch.zeros(setup.heads))
        self.dt_bias = nn.Parameter(torch.full((setup.heads,), -2.0))
        self.D = nn.Parameter(torch.ones(setup.heads))
        self.norm = nn.Parameter(torch.ones(hd))

    def mix(self, p):
        x, z = (self.heads(p[n]).to(self.dtype) for n in "xz")
        B, C = (self.heads(p[n], 1).to(self.dtype) for n in "BC")
        y = self.fns["scan"](x, p["dt"], -self.A_log.exp(), B, C, 64, D=self.D, dt_bias=self.dt_bias,
                             dt_softplus=True)
        return self.fns["norm"](y.flatten(2), self.norm, None, z=z.flatten(2), norm_before_gate=False)


MIXERS = {"softmax": Softmax, "gla": GLA, "lightning": Lightning, "kda": KDA, "mamba2": Mamba2}


class TinyLM(nn.Module):
    def __init__(self, family: str, setup: Setup, fns: dict, dtype: torch.dtype):
        super().__init__()
        self.embed = nn.Embedding(setup.vocab, setup.width)
        self.mixers = nn.ModuleList(MIXERS[family](setup, fns, dtype, i) for i in range(setup.layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(setup.width, 4 * setup.width), nn.GELU(),
                                                nn.Linear(4 * setup.width, setup.width))
                                  for _ in range(setup.layers))
        self.norms = nn.ModuleList(nn.RMSNorm(setup.width) for _ in range(2 * setup.layers + 1))
        self.head = nn.Linear(setup.width, setup.vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for i, (mixer, mlp) in enumerate(zip(self.mixers, self.mlps)):
            x = x + mixer(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(self.norms[-1](x))


def train(family: str, fns: dict, setup: Setup, device) -> list[float]:
    """Train a fresh model (weights and batches from setup.seed, so every provider starts and sees the
    same) for setup.steps steps of AdamW; returns the loss of each step."""
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32   # fp32 under the interpreter
    torch.manual_seed(setup.seed)
    model = TinyLM(family, setup, fns, dtype).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=0.01)
    batches = torch.Generator().manual_seed(setup.seed + 1)
    losses = []
    for _ in range(setup.steps):
        tokens, targets = recall_batch(setup, batches, device)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


# ------------------------------------------------------------------ results
def _results_dir(directory) -> Path:
    from ..bench import RESULTS_DIR

    return Path(directory) if directory is not None else RESULTS_DIR


def save_losses(df: pd.DataFrame, setup: Setup, peers: dict, directory=None) -> None:
    """results/in_a_model_losses.csv (family, provider, step, loss) and .json: where and when it ran (as
    every results table), the peers with their versions, and the run's sizes."""
    from ..bench import metadata

    meta = {k: v for k, v in metadata().items() if k != "do_bench"}
    meta.update(peers=dict(sorted(peers.items())), **asdict(setup))
    out = _results_dir(directory)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{RESULTS_NAME}.csv", index=False, float_format="%.6g")
    (out / f"{RESULTS_NAME}.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_losses(directory=None) -> pd.DataFrame:
    """The committed loss curves, the metadata as df.attrs["meta"]; FileNotFoundError when not measured."""
    out = _results_dir(directory)
    csv, js = out / f"{RESULTS_NAME}.csv", out / f"{RESULTS_NAME}.json"
    if not csv.exists() or not js.exists():
        raise FileNotFoundError(f"no {csv.name} and {js.name} in {out}: on a GPU, {MEASURE_COMMAND}")
    df = pd.read_csv(csv)
    missing = {"family", "provider", "step", "loss"} - set(df.columns)
    if missing:
        raise ValueError(f"{csv}: missing column(s) {sorted(missing)}")
    df.attrs["meta"] = json.loads(js.read_text())
    return df


def not_measured() -> str:
    """The line a page prints where the loss curves are not measured yet (the text column's width)."""
    import textwrap

    from ..bench import TEXT_WIDTH

    return textwrap.fill(f"Not measured yet: {RESULTS_NAME} (on a GPU: {MEASURE_COMMAND})", TEXT_WIDTH)


def describe(df: pd.DataFrame) -> str:
    """Where and when the curves were measured and the run's sizes, in lines that fit the text column."""
    import textwrap

    from ..bench import TEXT_WIDTH

    m = df.attrs["meta"]
    ran = "".join(f", {peer} {version}" for peer, version in m.get("peers", {}).items())
    text = (f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}{ran}; commit {m['commit']}, {m['date']}. "
            f"{m['steps']} steps of AdamW (lr {m['lr']:g}), batches of {m['batch']} sequences of "
            f"{4 * m['pairs']} tokens ({m['pairs']} pairs), width {m['width']}, {m['layers']} layers of "
            f"{m['heads']} heads of {m['head_dim']}.")
    return textwrap.fill(text, TEXT_WIDTH, break_on_hyphens=False)


def plot_losses(df: pd.DataFrame):
    """The loss curves, one panel per family, the book's and the peer's overlaid (house style)."""
    import matplotlib.pyplot as plt

    from ..plot import column_figure, figure_title, plot_providers, styled

    @styled
    def draw():
        families = [f for f in FAMILIES if f in set(df["family"])]
        fig, axes = column_figure(len(families), height=2.2, sharex=True)
        for ax, family in zip(axes, families):
            part = df[df["family"] == family]
            plot_providers(ax, part, "step", "loss", list(dict.fromkeys(part["provider"])))
            for line in ax.get_lines():
                line.set_marker("")
            ax.set_title(TITLES[family], loc="left")
            ax.set_ylabel("loss")
            ax.legend(loc="upper right")
        axes[-1].set_xlabel("step")
        fig.suptitle(figure_title("Associative recall, two layers", df.attrs.get("meta", {}).get("gpu", "")))
        plt.close(fig)
        return fig

    return draw()


__all__ = ["FAMILIES", "Setup", "recall_batch", "kernels", "TinyLM", "train", "save_losses", "load_losses",
           "not_measured", "describe", "plot_losses"]
