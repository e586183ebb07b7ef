"""Chapter 6's experiments: a tiny Grassmann language model against a Transformer of the same size,
trained on text that every Python installation carries; the cost count and its crossover; the
receptive field measured by perturbation.

Corpus. The source of 53 modules of Python's standard library (:data:`CORPUS_FILES`, read from
``sysconfig.get_paths()["stdlib"]`` in that sorted order), byte-level (vocabulary 256). Each file's
first 90% of bytes go to training and its last 10% to validation; the pieces are concatenated in
the list's order. Nothing is downloaded, so the lab runs the same on Colab. The text is whatever the
running Python ships: a different Python version gives a slightly different corpus, and
:func:`stdlib_corpus` reports the version and the byte counts so that a result can say what it used.

Models. ``GrassmannLM`` and ``TransformerLM`` share everything but the token mixer: byte embedding
(tied with the read-out), learned positions, ``n_layers`` blocks of (mixer, feed-forward 4d with
GELU), post-norm (``LN(x + f(x))``, as published) or pre-norm (``x + f(LN(x))`` with a final LN).
The Grassmann mixer is :class:`attnlib.grassmann.CausalGrassmannMixing`; the attention mixer is
multi-head causal attention through :func:`attnlib.softmax_attention`. With ``C(r, 2) ~ 2d`` the two
mixers have nearly the same number of parameters (the paper's d = 256, r = 32 is such a pair).

Figures' numbers. :mod:`attnbook.widgets.grassmann` draws what :func:`planes_in_r3`,
:func:`plucker_feature_maps`, :func:`pair_plane` and :func:`pair_terms` return.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlib.attention import softmax_attention
from attnlib.grassmann import CausalGrassmannMixing, pair_indices, plucker, plucker_features, valid_counts

from ._measure import count_flops
from ._training import train_loop, warmup_cosine

CORPUS_FILES = tuple(f + ".py" for f in sorted(
    "abc argparse ast bisect calendar colorsys contextlib copy csv dataclasses difflib enum fnmatch "
    "fractions functools getopt gettext glob heapq hmac inspect keyword linecache locale numbers "
    "operator optparse pprint queue quopri random reprlib sched secrets selectors shlex shutil "
    "statistics string struct textwrap threading timeit token tokenize trace traceback types typing "
    "uuid warnings weakref zipapp".split()))
VAL_FRACTION = 0.1

# Published perplexities and parameter counts (theirs, not ours), each with the split it was measured
# on and where a reader finds it. Zhang: arXiv 2512.19428, Wikitext-2 with a "WordPiece-like" vocabulary
# of about 30,522 tokens, best validation perplexity over 30 epochs; Table 1 (6 layers, block size 128,
# two window schedules) and Table 2 (12 layers, block size 256). Arledge: "Grassmann Flows for Sequence
# Modeling: An Independent Reproduction Study" (elliotarledge.com/blog/grassmann-flows, code
# github.com/Infatoshi/grassmann-flows): GPT-2 tokenizer, 6 layers, d = 256, r = 32, sequence length 256,
# 20 epochs, an 8-head Transformer (section 5); its section 6.2 gives the perplexities and parameter
# counts; "best validation" is the best epoch's validation perplexity.
PUBLISHED = [
    dict(source="Zhang 2025 (the paper), Wikitext-2, 6 layers, block 128", where="Table 1, rows 1-2",
         split="validation", transformer=248.4, grassmann=275.7, params_m=(12.59, 13.00)),
    dict(source="Zhang 2025 (the paper), Wikitext-2, 6 layers, block 128", where="Table 1, rows 3-4",
         split="validation", transformer=253.6, grassmann=282.3, params_m=(12.59, 13.00)),
    dict(source="Zhang 2025 (the paper), Wikitext-2, 12 layers, block 256", where="Table 2",
         split="validation", transformer=235.2, grassmann=261.1, params_m=(17.32, 18.16)),
    dict(source="Arledge 2025 (reproduction), GPT-2 tokens, 6 layers", where="section 6.2",
         split="best validation", transformer=190.03, grassmann=236.05, params_m=(17.67, 17.70)),
    dict(source="Arledge 2025 (reproduction), GPT-2 tokens, 6 layers", where="section 6.2",
         split="test", transformer=198.17, grassmann=242.94, params_m=(17.67, 17.70)),
]


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------

def stdlib_corpus(root: str | Path | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(train, val, info)``: uint8 byte tensors and a description (Python version, sizes)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, val = [], []
    for name in CORPUS_FILES:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the corpus is {len(CORPUS_FILES)} standard-library "
                                    "modules that every CPython 3.10-3.13 installs")
        data = path.read_bytes()
        cut = int(len(data) * (1 - VAL_FRACTION))
        train.append(data[:cut])
        val.append(data[cut:])
    tr, va = b"".join(train), b"".join(val)
    info = dict(python=sys.version.split()[0], files=len(CORPUS_FILES), train_bytes=len(tr), val_bytes=len(va))
    return (torch.frombuffer(bytearray(tr), dtype=torch.uint8).clone(),
            torch.frombuffer(bytearray(va), dtype=torch.uint8).clone(), info)


def random_windows(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` windows of ``seq_len + 1`` bytes at random starts -> ``(inputs, next bytes)``, long."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    win = data[idx].long()
    return win[:, :-1], win[:, 1:]


def fixed_windows(data: torch.Tensor, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` evenly spaced, non-overlapping windows: the fixed validation set."""
    stride = (data.numel() - seq_len - 1) // n
    if stride < seq_len:
        raise ValueError(f"{n} windows of {seq_len} bytes do not fit in {data.numel()} bytes")
    idx = (torch.arange(n) * stride)[:, None] + torch.arange(seq_len + 1)
    win = data[idx].long()
    return win[:, :-1], win[:, 1:]


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    """Multi-head causal softmax attention (q, k, v and output projections, with biases)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.h = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.reshape(B, T, self.h, d // self.h).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        o = softmax_attention(q, k, v, causal=True)
        return self.out(o.transpose(1, 2).reshape(B, T, d))


def _ffn(d: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class GrassmannBlock(nn.Module):
    """Post-norm: ``h = CGM(h)`` (the gated mix and its LayerNorm), ``h = LN(h + FFN(h))``.
    Pre-norm: ``h = h + mix(LN(h))`` (see ``CausalGrassmannMixing(norm="pre")``), ``h = h + FFN(LN(h))``."""

    def __init__(self, d_model: int, reduced_dim: int, offsets, norm: str, backend: str = "auto"):
        super().__init__()
        self.norm_kind = norm
        self.mix = CausalGrassmannMixing(d_model, reduced_dim, offsets, norm=norm, backend=backend)
        self.ffn, self.ln = _ffn(d_model), nn.LayerNorm(d_model)

    def forward(self, h):
        h = self.mix(h)
        return self.ln(h + self.ffn(h)) if self.norm_kind == "post" else h + self.ffn(self.ln(h))


class TransformerBlock(nn.Module):
    """Post-norm: ``h = LN1(h + Attn(h))``, ``h = LN2(h + FFN(h))``; pre-norm: ``h + f(LN(h))``."""

    def __init__(self, d_model: int, n_heads: int, norm: str):
        super().__init__()
        self.norm_kind = norm
        self.attn, self.ffn = CausalSelfAttention(d_model, n_heads), _ffn(d_model)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, h):
        if self.norm_kind == "post":
            h = self.ln1(h + self.attn(h))
            return self.ln2(h + self.ffn(h))
        h = h + self.attn(self.ln1(h))
        return h + self.ffn(self.ln2(h))


class _ByteLM(nn.Module):
    def __init__(self, blocks, d_model: int, max_len: int, norm: str, vocab: int = 256):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(blocks)
        self.final = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()

    def embed(self, tokens):
        return self.emb(tokens) + self.pos[: tokens.shape[1]]

    def forward_embedded(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.final(x) @ self.emb.weight.T                      # tied read-out

    def forward(self, tokens):
        return self.forward_embedded(self.embed(tokens))


class GrassmannLM(_ByteLM):
    """Byte-level LM with causal Grassmann mixing. ``tokens [B, T] -> logits [B, T, 256]``."""

    def __init__(self, d_model: int = 64, n_layers: int = 2, reduced_dim: int = 16,
                 offsets=(1, 2, 4, 8, 12, 16), norm: str = "post", max_len: int = 256, backend: str = "auto"):
        super().__init__([GrassmannBlock(d_model, reduced_dim, offsets, norm, backend) for _ in range(n_layers)],
                         d_model, max_len, norm)


class TransformerLM(_ByteLM):
    """The same byte-level LM with multi-head causal softmax attention as the mixer."""

    def __init__(self, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, norm: str = "post",
                 max_len: int = 256):
        super().__init__([TransformerBlock(d_model, n_heads, norm) for _ in range(n_layers)], d_model, max_len, norm)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# Training and the comparison
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LMConfig:
    d_model: int = 48
    n_layers: int = 2
    reduced_dim: int = 13          # C(13, 2) = 78 ~ 2 d - r: the two mixers have nearly equal sizes
    n_heads: int = 4
    offsets: tuple = (1, 2, 4, 8, 12, 16)
    seq_len: int = 64
    batch: int = 8
    steps: int = 120
    lr: float = 3e-3
    val_windows: int = 64


QUICK = LMConfig()
FULL = LMConfig(d_model=256, n_layers=4, reduced_dim=32, n_heads=8, seq_len=128, batch=32, steps=500,
                lr=1e-3, val_windows=256)


def build(kind: str, norm: str, cfg: LMConfig) -> nn.Module:
    if kind == "grassmann":
        return GrassmannLM(cfg.d_model, cfg.n_layers, cfg.reduced_dim, cfg.offsets, norm, max_len=cfg.seq_len)
    if kind == "transformer":
        return TransformerLM(cfg.d_model, cfg.n_layers, cfg.n_heads, norm, max_len=cfg.seq_len)
    raise ValueError(f"kind must be 'grassmann' or 'transformer'; got {kind!r}")


def matched_sizes(cfg: LMConfig, *, tol: float = 0.03) -> dict[str, int]:
    """Parameter counts of the two models for ``cfg`` (post-norm; pre-norm adds one final LayerNorm to
    each); raises if they differ by more than ``tol`` (relative)."""
    sizes = {k: n_params(build(k, "post", cfg)) for k in ("grassmann", "transformer")}
    if abs(sizes["grassmann"] / sizes["transformer"] - 1) > tol:
        raise ValueError(f"parameter counts {sizes} differ by more than {tol:.0%}: choose reduced_dim with "
                         "C(r, 2) close to 2 d_model - r")
    return sizes


@torch.no_grad()
def perplexity(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, x.shape[0], batch):
        logits = model(x[i:i + batch])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                 reduction="sum").item()
        n += y[i:i + batch].numel()
    model.train()
    return math.exp(total / n)


@dataclass
class RunResult:
    kind: str
    norm: str
    seed: int
    params: int
    val_ppl: float
    final_train_loss: float


def train_lm(kind: str, norm: str, cfg: LMConfig, train: torch.Tensor, val: torch.Tensor, *, seed: int,
             device: torch.device | str = "cpu", return_model: bool = False):
    """Train one model with AdamW (warm-up, cosine decay, clip 1.0) on random training windows drawn
    from ``seed``; report the perplexity on the fixed validation windows. Same budget for every kind.
    Returns a :class:`RunResult` (and the trained model with ``return_model=True``)."""
    torch.manual_seed(seed)
    model = build(kind, norm, cfg).to(device)
    gen = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = warmup_cosine(opt, cfg.steps, warmup=max(1, cfg.steps // 10))

    def step_loss(_: int) -> torch.Tensor:
        x, y = random_windows(train, cfg.batch, cfg.seq_len, gen)
        logits = model(x.to(device))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1))

    loss = train_loop(step_loss, opt, cfg.steps, sched=sched, clip=1.0)
    xv, yv = fixed_windows(val, cfg.val_windows, cfg.seq_len)
    ppl = perplexity(model, xv.to(device), yv.to(device))
    res = RunResult(kind, norm, seed, n_params(model), ppl, float(loss.detach()))
    return (res, model) if return_model else res


def compare(cfg: LMConfig, seeds, *, norms=("post", "pre"), device="cpu", progress=None,
            models: dict | None = None) -> list[dict]:
    """Every (norm, kind, seed) run, as dicts. ``progress``: an optional tqdm-like wrapper.
    ``models``: if a dict is given, the first seed's trained models are stored in it by (norm, kind)."""
    train, val, _ = stdlib_corpus()
    jobs = [(n, k, s) for n in norms for k in ("transformer", "grassmann") for s in seeds]
    runs = []
    for n, k, s in (progress(jobs) if progress else jobs):
        res, model = train_lm(k, n, cfg, train, val, seed=s, device=device, return_model=True)
        runs.append(asdict(res))
        if models is not None and s == seeds[0]:
            models[n, k] = model.cpu()
    return runs


def summarise(runs: list[dict]) -> list[dict]:
    """Per norm: mean and spread (sample std; min, max) of each kind's perplexity, and the gap
    ``(grassmann - transformer) / transformer`` of the means, with its per-seed range."""
    out = []
    for norm in sorted({r["norm"] for r in runs}, reverse=True):
        row = dict(norm=norm)
        per = {}
        for kind in ("transformer", "grassmann"):
            ppl = [r["val_ppl"] for r in runs if r["norm"] == norm and r["kind"] == kind]
            per[kind] = {r["seed"]: r["val_ppl"] for r in runs if r["norm"] == norm and r["kind"] == kind}
            row[kind] = statistics.fmean(ppl)
            row[kind + "_std"] = statistics.stdev(ppl) if len(ppl) > 1 else 0.0
            row[kind + "_min"], row[kind + "_max"] = min(ppl), max(ppl)
        row["gap"] = row["grassmann"] / row["transformer"] - 1
        gaps = [per["grassmann"][s] / per["transformer"][s] - 1 for s in per["transformer"] if s in per["grassmann"]]
        row["gap_min"], row["gap_max"] = min(gaps), max(gaps)
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------
# Cost: counted FLOPs, and the crossover with attention
# ---------------------------------------------------------------------------------------------

def grassmann_mixing_paper_order(layer: CausalGrassmannMixing, h: torch.Tensor) -> torch.Tensor:
    """The layer's mixing signal ``g`` computed in the published order: every offset's coordinates
    projected to width ``d`` (a ``[B, T, |W|, d]`` product), then averaged. Equal to
    ``layer.mixing_signal(h)[1]``; its matrix products cost ``2 T |W| C(r,2) d``."""
    z = layer.reduce(h)
    feats = plucker_features(z, layer.offsets, norm_floor=layer.norm_floor, backend="torch")       # [B, T, W, C]
    proj = feats @ layer.plu.weight.T                                                # [B, T, W, d]
    K = valid_counts(h.shape[1], layer.offsets, device=h.device)
    valid = (torch.arange(h.shape[1], device=h.device)[:, None] - torch.tensor(layer.offsets, device=h.device) >= 0)
    g = (proj * valid[None, :, :, None]).sum(2) / K.clamp_min(1)[None, :, None]
    return g + layer.plu.bias * (K > 0)[:, None]


def mixer_flops(T: int, d: int, r: int, offsets, n_heads: int = 8) -> dict[str, int]:
    """Counted FLOPs of one token mixer on a ``[1, T, d]`` input: the whole Grassmann layer (reduce,
    projection, gate) with its signal in the published order and in the library's (average first,
    project once), and causal softmax attention with its four projections (the reference computes all
    ``T^2`` scores, then masks). Matrix products only (``count_flops``): the elementwise work -- the
    Plücker products themselves, norms, gates -- is not counted."""
    h = torch.zeros(1, T, d)
    layer = CausalGrassmannMixing(d, r, offsets, mode="features", backend="torch")
    attn = CausalSelfAttention(d, n_heads)
    def paper_order(x):
        return layer.gate_value(x, grassmann_mixing_paper_order(layer, x))

    with torch.no_grad():
        return dict(
            grassmann_paper_order=count_flops(lambda: paper_order(h)),
            grassmann_average_first=count_flops(lambda: layer(h)),
            attention=count_flops(lambda: attn(h)),
        )


def crossover(Ts, flops_a, flops_b) -> float | None:
    """The first length (log-interpolated) where ``flops_b`` exceeds ``flops_a``; None if never."""
    for i in range(1, len(Ts)):
        a0, a1, b0, b1 = flops_a[i - 1], flops_a[i], flops_b[i - 1], flops_b[i]
        if b0 <= a0 and b1 > a1:
            f0, f1 = math.log(b0 / a0), math.log(b1 / a1)
            x0, x1 = math.log(Ts[i - 1]), math.log(Ts[i])
            return math.exp(x0 + (x1 - x0) * (-f0) / (f1 - f0))
    return None


# ---------------------------------------------------------------------------------------------
# Receptive field
# ---------------------------------------------------------------------------------------------

def reachable_lags(offsets, depth: int) -> set[int]:
    """Lags ``k >= 0`` through which ``depth`` layers can carry information: sums of at most
    ``depth`` offsets (the gate's ``alpha h`` path lets a layer add nothing)."""
    lags = {0}
    for _ in range(depth):
        lags = lags | {a + o for a in lags for o in offsets}
    return lags


def dependence_lags(model: _ByteLM, T: int, *, generator: torch.Generator | None = None) -> set[int]:
    """The lags ``k`` at which the last position's output depends on the input ``k`` steps back,
    measured by the gradient of the last output with respect to every input embedding, on a float64
    copy of ``model`` (the caller's model keeps its dtype and mode)."""
    x = torch.randn(1, T, model.emb.weight.shape[1], generator=generator, dtype=torch.float64,
                    requires_grad=True)
    model = copy.deepcopy(model).double().eval()
    out = model.forward_embedded(x)[0, -1]
    (g,) = torch.autograd.grad(out.square().sum(), x)
    norms = g[0].norm(dim=-1)
    return {T - 1 - t for t in range(T) if norms[t].item() > 0}


# ---------------------------------------------------------------------------------------------
# What one position mixes: the planes of its pairs and their shares of the signal
# ---------------------------------------------------------------------------------------------

def pair_terms(layer: CausalGrassmannMixing, h: torch.Tensor, t: int) -> dict:
    """What a (causal) layer mixes at position ``t`` of the input ``h [1, T, d]``, pair by pair, on a
    float64 copy of the layer (the caller's layer is left alone). Returns a dict of float64 tensors:

    * ``z [T, r]``: the reduced token states ``y`` (after the pre-norm, for ``norm="pre"``);
    * ``offsets``, ``partners``: the offsets ``delta`` with ``t - delta >= 0`` and the positions ``t - delta``;
    * ``features [K, C(r,2)]``: the normalised Plücker coordinates of ``span(y_t, y_{t-delta})``;
    * ``terms [K, d]``: each pair's share of the mixing signal, ``W_plu features / K``;
    * ``bias [d]``: ``b_plu`` (added once, where ``K > 0``);
    * ``signal [d]``: the layer's own mixing signal ``g_t`` (its fused or collapsed path), which equals
      ``terms.sum(0) + bias``;
    * ``gate [d]``: ``alpha_t`` per channel (1 keeps ``h_t``, 0 takes the signal).
    """
    if layer.pairing != "causal":
        raise ValueError(f"pair_terms reads the causal pairing (y_t with y_(t-delta)); this layer pairs "
                         f"{layer.pairing!r}")
    if h.dim() != 3 or h.shape[0] != 1:
        raise ValueError(f"h has shape {tuple(h.shape)}; expected [1, T, d_model] (one sequence)")
    T = h.shape[1]
    if not 0 <= t < T:
        raise ValueError(f"t must be in [0, {T}); got {t}")
    m = copy.deepcopy(layer).double().eval()
    with torch.no_grad():
        x = h.double()
        x = m.norm(x) if m.norm_kind == "pre" else x
        z, signal = m.mixing_signal(x)
        gate = m.gate_value(x, signal)[0, t]
        feats = plucker_features(z, m.offsets, norm_floor=m.norm_floor, backend="torch")[0, t]       # [|W|, C]
        valid = [k for k, delta in enumerate(m.offsets) if t - delta >= 0]
        feats = feats[valid]
        terms = feats @ m.plu.weight.T / max(len(valid), 1)
        bias = m.plu.bias.clone()
    return dict(z=z[0], offsets=[m.offsets[k] for k in valid], partners=[t - m.offsets[k] for k in valid],
                features=feats, terms=terms, bias=bias, signal=signal[0, t], gate=gate)


def pairing_pattern(T: int, offsets) -> torch.Tensor:
    """``[T, T]`` bool: True at ``(t, t - delta)`` for every offset with ``t - delta >= 0`` -- the positions
    each token is paired with, fixed in advance. Not weights on values: the layer averages the pairs'
    Plücker coordinates (uniformly), never the partners' states."""
    t = torch.arange(T)
    return torch.stack([(t[:, None] - t[None, :]) == delta for delta in offsets]).any(0)



# ---------------------------------------------------------------------------------------------
# What chapter 6's figures draw (attnbook.widgets.grassmann draws these; it computes nothing)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlaneR3:
    """The plane ``span(u, w)`` of ``R^3``: the two vectors (float64 ``[3]`` each) and its Plücker
    coordinates ``(p01, p02, p12) = (c2, -c1, c0)`` with ``c = u x w``."""
    u: np.ndarray
    w: np.ndarray
    coordinates: np.ndarray


def planes_in_r3(pairs) -> list[PlaneR3]:
    """:class:`PlaneR3` of every pair ``(u, w)`` of vectors of ``R^3`` in ``pairs``."""
    planes = []
    for k, (u, w) in enumerate(pairs):
        u, w = np.asarray(u, dtype=float), np.asarray(w, dtype=float)
        if u.shape != (3,) or w.shape != (3,):
            raise ValueError(f"pairs[{k}] has shapes {u.shape}, {w.shape}; expected two vectors of R^3")
        planes.append(PlaneR3(u, w, plucker(torch.tensor(u), torch.tensor(w)).numpy()))
    return planes


@dataclass(frozen=True)
class PluckerFeatureMap:
    """The normalised Plücker coordinates of ``span(z_t[:r], z_{t-delta}[:r])`` at every position ``t``
    of one sequence: ``features [T, C(r, 2)]`` float64 (columns: the pairs ``(i, j)`` in ``pairs``);
    the first ``delta`` rows are zero, those positions having no partner ``delta`` steps back."""
    r: int
    delta: int
    pairs: tuple[tuple[int, int], ...]
    features: np.ndarray


def plucker_feature_maps(z, rs, offsets) -> list[PluckerFeatureMap]:
    """:class:`PluckerFeatureMap` for every ``(r, delta)`` in ``rs x offsets`` (``r`` outer), of one
    sequence of reduced vectors ``z [T, R]`` with ``R >= max(rs)``."""
    rs, offsets = [int(r) for r in rs], tuple(int(d) for d in offsets)
    if not rs or not offsets:
        raise ValueError(f"rs and offsets must each hold at least one value; got rs={rs}, offsets={list(offsets)}")
    z = torch.as_tensor(z, dtype=torch.float64)
    if z.dim() != 2 or z.shape[1] < max(rs):
        raise ValueError(f"z has shape {tuple(z.shape)}; expected [T, R] with R >= max(rs) = {max(rs)}")
    maps = []
    for r in rs:
        i, j = pair_indices(r)
        pairs = tuple(zip(i.tolist(), j.tolist()))
        feats = plucker_features(z[None, :, :r], offsets, backend="torch")[0]           # [T, W, C]
        maps += [PluckerFeatureMap(r, delta, pairs, feats[:, k].numpy()) for k, delta in enumerate(offsets)]
    return maps


@dataclass(frozen=True)
class PairPlane:
    """One position ``t`` and one offset ``delta`` of a layer on one input: the plane of ``z_t`` and
    ``z_{t-delta}`` as two vectors of ``R^3`` (``u``, ``w``: the vectors themselves for ``r = 3``, else
    their projection onto the first three principal directions of ``z`` over the sequence --
    ``projected``), the plane's ``C(r, 2)`` normalised Plücker coordinates (columns: ``pairs``), and the
    gate ``alpha_t`` per channel (1 keeps ``h_t``, 0 takes the Grassmann signal) with its mean."""
    t: int
    delta: int
    r: int
    projected: bool
    u: np.ndarray
    w: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    coordinates: np.ndarray
    gate: np.ndarray
    mean_gate: float


def pair_plane(layer: CausalGrassmannMixing, h: torch.Tensor, t: int, delta: int) -> PairPlane:
    """:class:`PairPlane` of ``layer`` at position ``t`` and offset ``delta`` on ``h [1, T, d]`` (the layer
    runs in its own dtype, without gradients; the plane is read in float64)."""
    T = h.shape[1]
    if not 0 <= t < T:
        raise ValueError(f"t must be in [0, {T}); got {t}")
    if t - delta < 0:
        raise ValueError(f"t - delta = {t - delta} < 0: position {t} has no partner {delta} steps back")
    with torch.no_grad():
        x = layer.norm(h) if layer.norm_kind == "pre" else h
        z, g = layer.mixing_signal(x)
        alpha = layer.gate_value(x, g)[0, t]
    z = z[0].double()
    u, w = z[t], z[t - delta]
    p = plucker(u, w)
    p = p / p.norm().clamp_min(layer.norm_floor)
    r = z.shape[1]
    if r == 3:
        u3, w3 = u.numpy(), w.numpy()
    else:
        basis = torch.linalg.svd(z - z.mean(0), full_matrices=False).Vh[:3]           # [3, r]
        u3, w3 = (basis @ u).numpy(), (basis @ w).numpy()
    i, j = pair_indices(r)
    return PairPlane(t, delta, r, r != 3, u3, w3, tuple(zip(i.tolist(), j.tolist())), p.numpy(),
                     alpha.double().numpy(), alpha.mean().item())


__all__ = ["CORPUS_FILES", "PUBLISHED", "stdlib_corpus", "GrassmannLM", "TransformerLM", "LMConfig", "QUICK",
           "FULL", "build", "matched_sizes", "train_lm", "compare", "summarise", "mixer_flops",
           "grassmann_mixing_paper_order", "crossover", "reachable_lags", "dependence_lags", "n_params",
           "pair_terms", "pairing_pattern", "PlaneR3", "planes_in_r3", "PluckerFeatureMap",
           "plucker_feature_maps", "PairPlane", "pair_plane"]
