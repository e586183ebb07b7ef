"""A real input for chapter 1: a small byte-level Transformer trained on the book's own corpus, and the
attention it puts on a snippet of Python source, with the snippet's characters on the axes.

Model. Chapter 6's :class:`~attnbook.experiments.grassmann.TransformerLM` (byte embedding tied with the
read-out, learned positions, pre-norm blocks of multi-head causal attention through
:func:`attnlib.softmax_attention` and a GELU feed-forward), sized by :data:`CONFIG`: 2 layers of 4 heads,
``d_model = 64`` (head dim 16), a context of 64 bytes. It is trained by chapter 6's own loop,
:func:`~attnbook.experiments.grassmann.train_lm` (AdamW, warm-up then cosine decay, gradient clip 1.0, random
training windows from the seed), on chapter 6's corpus,
:func:`~attnbook.experiments.grassmann.stdlib_corpus` (53 modules of Python's standard library, the first
90% of each file for training, the last 10% for validation). ``scripts/train_byte_model.py`` runs it on a
CPU and commits the weights (float16, :data:`WEIGHTS`) and what it measured (:data:`RESULT`).

What is returned. :func:`snippet_attention` runs the model on a text and returns, per layer and head, the
queries and keys the model formed (``[layers, heads, T, 16]``) and the attention matrix computed from
them by :func:`attnbook.experiments.weights.softmax_weights` -- the library's softmax attention on one-hot
values, so the matrix is what the operator computes, its causal plan. :func:`head_roles` measures what each
head does -- the mass a query puts on the previous byte, on itself, on the first byte, on the newline that
starts its line, on the innermost bracket still open, on earlier copies of its own byte, on the byte after
such a copy -- on a snippet or averaged over validation windows, read against a uniform head's
(:func:`uniform_roles`). :func:`head_views` packs what :mod:`attnbook.widgets.real_input` draws, with linear
attention's weights (``elu + 1`` features, :func:`linear_weights`) on the same queries and keys.

The committed run (``benchmarks/results/byte_model.json``): 2.42 bits per byte on the validation windows
against 3.49 for the bigram baseline; the first layer's heads look at the last one or two bytes (0.24-0.28
of a row on the previous byte, a uniform head 0.06), and two of them (heads 1.3 and 1.4) also at the
newline that starts the query's line (0.31 and 0.36 of a row, a uniform head 0.03); the second layer's
heads are more diffuse.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlib import _validate

from ._committed import REPOSITORY_RAW, committed_file
from .grassmann import LMConfig, TransformerLM, fixed_windows, stdlib_corpus, train_lm
from .weights import linear_attention_weights, softmax_weights

WEIGHTS = "benchmarks/results/byte_model.pt"
RESULT = "benchmarks/results/byte_model.json"

# A snippet with a visible structure: a repeated identifier ("items"), two pairs of brackets, an
# indented block; 41 bytes, written for the book (not a line of the corpus).
SNIPPET = "def total(items):\n    return sum(items)\n"

# Whitespace drawn visibly on an axis.
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
BRACKETS = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class ByteModelConfig:
    """The model and its training run. ``norm``: ``"pre"`` (``x + f(LN(x))``, with a final LayerNorm)."""
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    norm: str = "pre"
    batch: int = 32
    steps: int = 2000
    lr: float = 3e-3
    val_windows: int = 512
    seed: int = 0

    def lm_config(self) -> LMConfig:
        """Chapter 6's training configuration with these sizes (its warm-up is ``steps // 10``)."""
        return LMConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                        seq_len=self.seq_len, batch=self.batch, steps=self.steps, lr=self.lr,
                        val_windows=self.val_windows)


CONFIG = ByteModelConfig()


# ---------------------------------------------------------------------------------------------
# Model, training, losses
# ---------------------------------------------------------------------------------------------

def build_model(cfg: ByteModelConfig = CONFIG) -> TransformerLM:
    """An untrained model of ``cfg``'s sizes (chapter 6's ``TransformerLM``)."""
    if not isinstance(cfg, ByteModelConfig):
        raise TypeError(f"cfg must be a ByteModelConfig; got {type(cfg).__name__}")
    return TransformerLM(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.norm, max_len=cfg.seq_len)


def train(cfg: ByteModelConfig = CONFIG, corpus=None) -> TransformerLM:
    """Train ``cfg``'s model with chapter 6's loop on chapter 6's corpus (``corpus``: an already loaded
    ``stdlib_corpus()``), deterministically from ``cfg.seed`` on the CPU."""
    train_bytes, val_bytes, _ = corpus if corpus is not None else stdlib_corpus()
    _, model = train_lm("transformer", cfg.norm, cfg.lm_config(), train_bytes, val_bytes, seed=cfg.seed,
                        device="cpu", return_model=True)
    return model.eval()


@torch.no_grad()
def bits_per_byte(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """The model's mean cross-entropy on the windows ``x -> y`` (``[n, T]`` bytes), in bits per byte."""
    x, y = _windows("x", x), _windows("y", y)
    if x.shape != y.shape:
        raise ValueError(f"y has shape {tuple(y.shape)}; expected {tuple(x.shape)} to match x")
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], batch):
        logits = model(x[i:i + batch]).double()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + batch].reshape(-1),
                                 reduction="sum").item()
    model.train(was_training)
    return total / y.numel() / math.log(2)


def baselines(train_bytes: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Bits per byte on the windows ``x -> y`` of the two models that need no training (as in chapter
    6's lab): add-one smoothed unigram and bigram byte frequencies of ``train_bytes``."""
    x, y = _windows("x", x), _windows("y", y)
    tr = train_bytes.long()
    uni = torch.bincount(tr, minlength=256).double() + 1
    pair = torch.ones(256, 256, dtype=torch.float64)
    pair.index_put_((tr[:-1], tr[1:]), torch.ones(tr.numel() - 1, dtype=torch.float64), accumulate=True)
    log2 = math.log(2)
    return dict(unigram=-(uni / uni.sum()).log()[y].mean().item() / log2,
                bigram=-(pair / pair.sum(1, keepdim=True)).log()[x, y].mean().item() / log2)


def validation_windows(cfg: ByteModelConfig = CONFIG, corpus=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed validation windows the committed numbers are measured on (``cfg.val_windows`` evenly
    spaced, non-overlapping windows of ``cfg.seq_len`` bytes of the validation text)."""
    _, val_bytes, _ = corpus if corpus is not None else stdlib_corpus()
    return fixed_windows(val_bytes, cfg.val_windows, cfg.seq_len)


def _windows(name: str, x) -> torch.Tensor:
    _validate.check_tensor(name, x, ndim=2, dtypes=(torch.int64, torch.int32, torch.uint8))
    return x.long()


# ---------------------------------------------------------------------------------------------
# The committed weights
# ---------------------------------------------------------------------------------------------

def save(model: torch.nn.Module, cfg: ByteModelConfig, path: str | Path) -> None:
    """Write ``{"config", "state_dict"}`` with the weights in float16 (what :func:`load` reads)."""
    state = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(cfg), "state_dict": state}, path)


def load(path: str | Path | None = None) -> TransformerLM:
    """The committed model (:data:`WEIGHTS`), in float32, in eval mode; ``model.config`` is its
    :class:`ByteModelConfig`."""
    if path is None:
        found = committed_file(WEIGHTS)
        if found is None:
            raise FileNotFoundError(f"{WEIGHTS} is neither in this clone nor downloadable from "
                                    f"{REPOSITORY_RAW}")
        path = found
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path; got {type(path).__name__}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    cfg = ByteModelConfig(**blob["config"])
    model = build_model(cfg)
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    model.config = cfg
    return model.eval()


def load_result(path: str | Path | None = None) -> dict:
    """The committed measurements (:data:`RESULT`) as a dict."""
    path = path or committed_file(RESULT)
    if path is None:
        raise FileNotFoundError(f"{RESULT} is neither in this clone nor downloadable")
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------------------------
# Attention on a snippet
# ---------------------------------------------------------------------------------------------

def visible(ch: str) -> str:
    """One character as an axis label: whitespace made visible (``'␣'`` space, ``'↵'`` newline)."""
    return VISIBLE.get(ch, ch)


@dataclass
class SnippetAttention:
    """What the model's attention does on ``text``. ``q, k: [layers, heads, T, head_dim]`` (float64),
    the queries and keys as the model formed them; ``weights: [layers, heads, T, T]``, row ``t`` the
    softmax attention of query ``t`` (zero on the masked keys ``j > t``); ``scale`` is the model's
    ``1 / sqrt(head_dim)``; ``labels[t]`` is byte ``t`` drawn visibly; ``v`` the values (for checks: the
    heads' outputs are ``weights @ v``)."""
    text: str
    tokens: torch.Tensor
    labels: list[str]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    weights: torch.Tensor
    scale: float

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]


def _encode(text: str, max_len: int) -> torch.Tensor:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str; got {type(text).__name__}")
    data = text.encode("utf-8")
    if not 2 <= len(data) <= max_len:
        raise ValueError(f"text is {len(data)} bytes; expected 2 to {max_len} (the model's context)")
    if len(data) != len(text):
        raise ValueError("text must be ASCII (one byte per character, so that each byte has its label)")
    return torch.tensor(list(data), dtype=torch.long)


@torch.no_grad()
def qkv_per_layer(model: TransformerLM, tokens: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """``[(q, k, v)]`` per layer, each ``[B, heads, T, head_dim]``: the attention layer's own projection
    of the input it receives (captured by a forward hook while the model runs on ``tokens [B, T]``)."""
    _windows("tokens", tokens)
    inputs = []
    hooks = [blk.attn.register_forward_hook(lambda m, args, out: inputs.append((m, args[0])))
             for blk in model.blocks]
    try:
        model(tokens.long())
    finally:
        for h in hooks:
            h.remove()
    out = []
    for m, x in inputs:
        B, T, d = x.shape
        out.append(tuple(t.reshape(B, T, m.h, d // m.h).transpose(1, 2) for t in m.qkv(x).chunk(3, -1)))
    return out


def snippet_attention(text: str = SNIPPET, model: TransformerLM | None = None) -> SnippetAttention:
    """Queries, keys and softmax attention of every layer and head of ``model`` (default: the committed
    one, :func:`load`) on ``text`` (ASCII, 2 to ``seq_len`` bytes)."""
    model = load() if model is None else model
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a TransformerLM (see load()); got {type(model).__name__}")
    tokens = _encode(text, model.pos.shape[0])
    per_layer = qkv_per_layer(model, tokens[None])
    q = torch.stack([qq[0] for qq, _, _ in per_layer]).double()        # [L, H, T, Dh]
    k = torch.stack([kk[0] for _, kk, _ in per_layer]).double()
    v = torch.stack([vv[0] for _, _, vv in per_layer]).double()
    scale = 1.0 / math.sqrt(q.shape[-1])
    W = torch.stack([torch.stack([softmax_weights(q[layer, h], k[layer, h], tau=1 / scale, causal=True)
                                  for h in range(q.shape[1])]) for layer in range(q.shape[0])])
    return SnippetAttention(text=text, tokens=tokens, labels=[visible(c) for c in text], q=q, k=k, v=v,
                            weights=W, scale=scale)


def linear_weights(att: SnippetAttention, layer: int, head: int) -> torch.Tensor:
    """Linear attention with ``elu + 1`` features on the SAME queries and keys as softmax's ``(layer,
    head)`` (scaled alike, ``q k / sqrt(head_dim)`` split as ``q / dim^(1/4)``, ``k / dim^(1/4)``):
    ``[T, T]``, causal, rows summing to 1 -- the weights :func:`attnlib.linear_attention` computes."""
    _check_head(att, layer, head)
    s = att.scale ** 0.5
    return linear_attention_weights(att.q[layer, head] * s, att.k[layer, head] * s, feature_map="elu1",
                                    causal=True)


def _check_head(att: SnippetAttention, layer: int, head: int) -> None:
    if not isinstance(att, SnippetAttention):
        raise TypeError(f"att must be a SnippetAttention; got {type(att).__name__}")
    _validate.check_int("layer", layer, lo=0, hi=att.n_layers - 1)
    _validate.check_int("head", head, lo=0, hi=att.n_heads - 1)


# ---------------------------------------------------------------------------------------------
# What each head does, measured
# ---------------------------------------------------------------------------------------------

ROLES = ("previous", "self", "first", "newline", "open_bracket", "same_byte", "after_same_byte")
ROLE_TEXT = {
    "previous": "the previous byte (t-1)",
    "self": "itself (t)",
    "first": "the first byte of the window",
    "newline": "the newline that starts its line",
    "open_bracket": "the innermost bracket still open before it",
    "same_byte": "earlier copies of its own byte",
    "after_same_byte": "the byte after an earlier copy of its own byte",
}
_NEWLINE, _OPEN, _CLOSE = ord("\n"), {ord(c) for c in "([{"}, {ord(c) for c in ")]}"}


def _structure_keys(seq: list[int]) -> tuple[list[int], list[int]]:
    """Per query ``t``: the position of the last newline before it, and of the innermost bracket
    opened before ``t`` and not closed before ``t`` (for a closing bracket: the one it closes); -1 if
    none."""
    newline, bracket, last, stack = [], [], -1, []
    for t, b in enumerate(seq):
        newline.append(last)
        bracket.append(stack[-1] if stack else -1)
        if b == _NEWLINE:
            last = t
        elif b in _OPEN:
            stack.append(t)
        elif b in _CLOSE and stack:
            stack.pop()
    return newline, bracket


def role_masks(tokens: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For a byte sequence ``tokens [..., T]``, per role (:data:`ROLES`): a boolean ``[..., T, T]`` mask
    of the keys it counts for query ``t`` (keys ``j <= t``) and a boolean ``[..., T]`` mask of the queries
    it is averaged over: ``t >= 1`` for the positional roles, the queries that have such a key for the
    others (a newline before them, an open bracket, an earlier copy of their byte)."""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() < 1 or tokens.shape[-1] < 2:
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}; expected [..., T] with T >= 2")
    T = tokens.shape[-1]
    ar = torch.arange(T)
    before = ar[None, :] < ar[:, None]                                     # j < t
    same = (tokens[..., :, None] == tokens[..., None, :]) & before          # x_j == x_t, j < t
    after = torch.zeros_like(same)
    after[..., :, 1:] = same[..., :, :-1]                                  # key j + 1 after a copy at j
    after &= ar[None, :] <= ar[:, None]
    flat = tokens.reshape(-1, T).tolist()
    newline = torch.zeros(len(flat), T, T, dtype=torch.bool)
    bracket = torch.zeros_like(newline)
    for n, seq in enumerate(flat):
        for target, keys in zip((newline, bracket), _structure_keys(seq)):
            keys = torch.tensor(keys)
            ok = keys >= 0
            target[n, ar[ok], keys[ok]] = True
    newline, bracket = newline.reshape(same.shape), bracket.reshape(same.shape)
    eye = torch.eye(T, dtype=torch.bool)
    not_first = (ar > 0).expand(same.shape[:-1])
    return dict(
        previous=(torch.diag(torch.ones(T - 1, dtype=torch.bool), -1).expand_as(same), not_first),
        self=(eye.expand_as(same), not_first),
        first=((ar[None, :] == 0).expand_as(same) & ~eye, not_first),
        newline=(newline, newline.any(-1)),
        open_bracket=(bracket, bracket.any(-1)),
        same_byte=(same, same.any(-1)),
        after_same_byte=(after, same.any(-1)),
    )


def head_roles(weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per role (:data:`ROLES`, masks from :func:`role_masks`), a ``[layers, heads]`` tensor: the attention
    mass a query puts on the keys of that role, averaged over the role's queries (NaN when the text has
    none). ``weights: [..., layers, heads, T, T]`` with ``tokens [..., T]``: a leading batch of windows is
    averaged over too."""
    _validate.check_tensor("weights", weights, min_ndim=4)
    tokens = torch.as_tensor(tokens)
    T = tokens.shape[-1]
    if weights.shape[-2:] != (T, T):
        raise ValueError(f"weights has shape {tuple(weights.shape)}; expected (..., T, T) with "
                         f"T = {T} to match tokens")
    extra = weights.dim() - 4                                              # leading batch dims
    if tuple(weights.shape[:extra]) != tuple(tokens.shape[:-1]):
        raise ValueError(f"weights has shape {tuple(weights.shape)}; expected leading dims "
                         f"{tuple(tokens.shape[:-1])} to match tokens")
    w = weights.double()
    dims = tuple(range(extra)) + (-1,)
    out = {}
    for role, (keys, queries) in role_masks(tokens).items():
        keys = keys.reshape(*keys.shape[:extra], 1, 1, T, T).double()
        queries = queries.reshape(*queries.shape[:extra], 1, 1, T).double()
        mass = (w * keys).sum(-1)                                          # [..., L, H, T]
        count = queries.expand_as(mass).sum(dims)
        out[role] = torch.where(count > 0, (mass * queries).sum(dims) / count.clamp_min(1), float("nan"))
    return out


@torch.no_grad()
def corpus_head_roles(model: TransformerLM, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`head_roles` averaged over the windows ``x [n, T]`` (e.g. :func:`validation_windows`), with
    the attention computed from each layer's queries and keys as in :func:`snippet_attention`."""
    x = _windows("x", x)
    per_layer = qkv_per_layer(model, x)
    q = torch.stack([qq for qq, _, _ in per_layer], 1).double()        # [n, L, H, T, Dh]
    k = torch.stack([kk for _, kk, _ in per_layer], 1).double()
    T = x.shape[1]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return head_roles(torch.softmax(s, -1), x)


def uniform_roles(tokens: torch.Tensor) -> dict[str, float]:
    """The mass per role of a head that spreads every row evenly over its keys ``j <= t`` (the yardstick
    a measured role is read against: ``same_byte`` is large even so, on text with many spaces)."""
    T = tokens.shape[-1]
    W = torch.ones(T, T, dtype=torch.float64).tril()
    W = (W / W.sum(-1, keepdim=True)).expand(*tokens.shape[:-1], 1, 1, T, T)
    return {r: float(m[0, 0]) for r, m in head_roles(W, tokens).items()}


def describe_heads(roles: dict[str, torch.Tensor], uniform: dict[str, float] | None = None) -> list[dict]:
    """One dict per head: ``layer``, ``head``, every role's mass and ``role``: the role whose mass most
    exceeds ``uniform``'s (a uniform head's, :func:`uniform_roles`; zero when not given)."""
    uniform = uniform or dict.fromkeys(ROLES, 0.0)
    L, H = roles["previous"].shape
    rows = []
    for layer in range(L):
        for h in range(H):
            row = dict(layer=layer, head=h, **{r: float(roles[r][layer, h]) for r in ROLES})
            row["role"] = max((r for r in ROLES if not math.isnan(row[r])), key=lambda r: row[r] - uniform[r])
            rows.append(row)
    return rows


@dataclass
class HeadView:
    """What the figure draws for one head: softmax's plan and linear attention's weights on the same
    queries and keys (``[T, T]`` float64, zero above the diagonal), and the head's measured roles."""
    layer: int
    head: int
    softmax: torch.Tensor
    linear: torch.Tensor
    roles: dict


def head_views(att: SnippetAttention, roles: list[dict] | None = None) -> list[HeadView]:
    """One :class:`HeadView` per (layer, head), layer by layer. ``roles``: :func:`describe_heads` rows to
    attach (e.g. the committed validation measurements); by default the snippet's own."""
    if not isinstance(att, SnippetAttention):
        raise TypeError(f"att must be a SnippetAttention; got {type(att).__name__}")
    if roles is None:
        roles = describe_heads(head_roles(att.weights, att.tokens), uniform_roles(att.tokens))
    by_head = {(r["layer"], r["head"]): r for r in roles}
    if set(by_head) != {(la, h) for la in range(att.n_layers) for h in range(att.n_heads)}:
        raise ValueError(f"roles must have one row per (layer, head) of a {att.n_layers}-layer, "
                         f"{att.n_heads}-head model")
    return [HeadView(la, h, att.weights[la, h], linear_weights(att, la, h), by_head[la, h])
            for la in range(att.n_layers) for h in range(att.n_heads)]


__all__ = ["CONFIG", "ByteModelConfig", "HeadView", "RESULT", "ROLES", "ROLE_TEXT", "SNIPPET",
           "SnippetAttention", "WEIGHTS", "baselines", "bits_per_byte", "build_model", "corpus_head_roles",
           "describe_heads", "head_roles", "head_views", "linear_weights", "load", "load_result",
           "qkv_per_layer", "role_masks", "save", "snippet_attention", "train", "uniform_roles",
           "validation_windows", "visible"]
