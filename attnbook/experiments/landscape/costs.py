"""The cost formulas, per layer and token, as the chapters write them: one layer's shape
(:class:`HeadConfig`), FLOPs split into what ``FlopCounterMode`` sees and what it does not (:class:`Flops`),
and each mechanism's prefill FLOPs, decode FLOPs and memory (the hybrid's, which compose other mechanisms'
records, are :mod:`.registry`'s). Conventions: the package's (:mod:`attnbook.experiments.landscape`)."""

from __future__ import annotations

from dataclasses import dataclass

from attnlib.grassmann import n_pairs


@dataclass(frozen=True)
class HeadConfig:
    """One layer's shape. ``heads`` query heads (= value heads of a linear layer) of width ``d_head``
    (``d_k = d_v``), ``kv_heads`` cached key/value heads, ``bytes_per_elem`` for cache *and* state (bf16:
    2; a float32 state doubles the state's bytes). The other fields size one mechanism each:
    ``chunk`` (linear / delta chunk length), ``block_size`` and ``band_blocks`` (block-sparse: each query
    block visits its own and the ``band_blocks - 1`` blocks before it), ``top_k``, ``index_heads``,
    ``index_dim`` (the top-k layer's indexer: about 1/16 of an attention pair's FLOPs, DSA's proportion),
    ``lsh_tables``, ``lsh_bits`` (ANNA, SimHash), ``grassmann_rank`` and ``grassmann_offsets`` (a
    Grassmann layer mixing a ``heads * d_head`` wide stream), ``hybrid_ratio`` (``r`` Gated DeltaNet
    layers per full softmax layer)."""
    heads: int = 16
    kv_heads: int = 4
    d_head: int = 128
    bytes_per_elem: int = 2
    chunk: int = 64
    block_size: int = 64
    band_blocks: int = 8
    top_k: int = 2048
    index_heads: int = 4
    index_dim: int = 64
    lsh_tables: int = 4
    lsh_bits: int = 8
    grassmann_rank: int = 32
    grassmann_offsets: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    hybrid_ratio: int = 3

    @property
    def d_model(self) -> int:
        return self.heads * self.d_head


@dataclass(frozen=True)
class Flops:
    """FLOPs split into what ``FlopCounterMode`` sees (matrix products) and what it does not."""
    matmul: float
    elementwise: float = 0.0

    @property
    def total(self) -> float:
        return self.matmul + self.elementwise

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.matmul + other.matmul, self.elementwise + other.elementwise)

    def scaled(self, c: float) -> Flops:
        return Flops(c * self.matmul, c * self.elementwise)


# ---------------------------------------------------------------------------------------------
# The cost models' shared pieces
# ---------------------------------------------------------------------------------------------

def _pair(cfg: HeadConfig) -> int:
    """FLOPs of one (query, key) pair over all heads: a score and a weighted value, ``2 H (d_k + d_v)``."""
    d = cfg.d_head
    return 2 * cfg.heads * (d + d)


def _cache_per_token(cfg: HeadConfig) -> int:
    """Bytes of one token's keys and values in the KV cache, all key/value heads."""
    return 2 * cfg.kv_heads * cfg.d_head * cfg.bytes_per_elem


def band_keys(t: int, cfg: HeadConfig) -> int:
    """Keys a query at position ``t`` (1-based) reads in the block-sparse local band: its own block up
    to itself and the ``band_blocks - 1`` full blocks before it (the kernel computes its diagonal block
    whole; the decode step reads only the keys that exist)."""
    B = cfg.block_size
    return min(t, (cfg.band_blocks - 1) * B + (t - 1) % B + 1)


def _band_prefill_pairs(T: int, cfg: HeadConfig) -> int:
    """Pairs the block-sparse kernel computes for a prompt of ``T`` tokens: query block ``i`` times the
    key blocks ``max(0, i - band_blocks + 1) .. i``, whole blocks (``T`` rounded up to blocks)."""
    B, nb = cfg.block_size, -(-T // cfg.block_size)
    return sum(B * B * min(i + 1, cfg.band_blocks) for i in range(nb))


def _delta_chunk_elementwise(cfg: HeadConfig, gated: bool) -> float:
    """Per token and head, the chunk form's work outside matrix products: the unit-triangular solve
    ``(I + A)^{-1} diag(beta)`` by forward substitution (``C (C - 1)`` per token) and ``beta * A``
    (``C``); gated, also ``A . Gamma`` and ``P . Gamma`` (``2 C``), the ``gamma`` scalings of ``Q``, ``K``
    and ``K_end`` (``3 d``) and the state's decay once per chunk (``d^2 / C``)."""
    C, d = cfg.chunk, cfg.d_head
    extra = C * (C - 1) + C
    if gated:
        extra += 2 * C + 3 * d + d * d / C
    return extra


def _grassmann_per_token(cfg: HeadConfig) -> Flops:
    """The mixing signal of the causal Grassmann layer in the kernel's order: per offset the partner's
    part orthogonal to ``z_t`` (two projections, ``~8 r``), its norm (``2 r``) and the running sum
    ``w_hat`` (``2 r``); then one Plücker vector (``3 C(r,2)``) and its projection to the model width,
    ``2 C(r,2) d_model`` -- the only matrix product. The reduction ``W_red`` and the gate are projections,
    like attention's ``W_Q, W_K, W_V, W_O``, and are left out of every mechanism here."""
    r, W = cfg.grassmann_rank, len(cfg.grassmann_offsets)
    return Flops(2 * n_pairs(r) * cfg.d_model, W * 12 * r + 3 * n_pairs(r))


# ---------------------------------------------------------------------------------------------
# One block per mechanism: its formulas (prefill FLOPs per token at prompt length T, decode FLOPs at t
# keys read, bytes kept after T tokens). The attnlib references that count it are .references'.
# ---------------------------------------------------------------------------------------------

# --- softmax -----------------------------------------------------------------------------------

def _softmax_prefill(T: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * (T + 1) / 2)


def _softmax_decode(t: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * t)


def _softmax_memory(T: int, cfg: HeadConfig) -> float:
    return _cache_per_token(cfg) * T


# --- block-sparse (local band) -----------------------------------------------------------------

def _block_sparse_prefill(T: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * _band_prefill_pairs(T, cfg) / T)


def _block_sparse_decode(t: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * band_keys(t, cfg))


def _block_sparse_memory(T: int, cfg: HeadConfig) -> float:
    return _cache_per_token(cfg) * min(T, cfg.band_blocks * cfg.block_size)


# --- linear attention --------------------------------------------------------------------------

def _linear_prefill(T: int, cfg: HeadConfig) -> Flops:
    H, d = cfg.heads, cfg.d_head
    return Flops(H * (2 * cfg.chunk * (d + d) + 4 * d * d))


def _linear_decode(t: int, cfg: HeadConfig) -> Flops:
    # The counter counts the outer product [d_v, 1] @ [1, d_k] as 2 d_k d_v: its multiplies plus, in
    # effect, the add into the state, which attnlib does elementwise.
    H, d = cfg.heads, cfg.d_head
    return Flops(H * 4 * d * d)


def _state_memory(T: int, cfg: HeadConfig) -> float:
    """A ``d_k x d_v`` state per head, whatever ``T`` (linear attention and both delta rules)."""
    H, d, b = cfg.heads, cfg.d_head, cfg.bytes_per_elem
    return H * d * d * b


# --- the delta rule, plain and gated -----------------------------------------------------------

def _delta_prefill(gated: bool, T: int, cfg: HeadConfig) -> Flops:
    H, d, C = cfg.heads, cfg.d_head, cfg.chunk
    return Flops(H * (6 * C * d + 4 * C * d + 6 * d * d), H * _delta_chunk_elementwise(cfg, gated))


def _delta_decode(gated: bool, t: int, cfg: HeadConfig) -> Flops:
    H, d = cfg.heads, cfg.d_head
    extra = 2 * d * d + 2 * d + (d * d if gated else 0)
    return Flops(H * 4 * d * d, H * extra)


# --- ANNA (LSH) --------------------------------------------------------------------------------

def _anna_per_token(T: int, cfg: HeadConfig) -> Flops:
    """Hash the query and the key, add ``v`` to one bucket and read one bucket per table: the same in
    prefill and decode."""
    H, d, l, z = cfg.heads, cfg.d_head, cfg.lsh_tables, cfg.lsh_bits
    return Flops(H * 4 * l * z * d, H * (2 * l * d + d))


def _anna_memory(T: int, cfg: HeadConfig) -> float:
    return cfg.heads * cfg.lsh_tables * min(T, 2 ** cfg.lsh_bits) * (cfg.d_head + 1) * cfg.bytes_per_elem


# --- Grassmann ---------------------------------------------------------------------------------

def _grassmann_cost(T: int, cfg: HeadConfig) -> Flops:
    # no quadratic part: the same per-token work in prefill and decode, whatever T
    return _grassmann_per_token(cfg)


def _grassmann_memory(T: int, cfg: HeadConfig) -> float:
    return max(cfg.grassmann_offsets) * cfg.grassmann_rank * cfg.bytes_per_elem


# --- top-k + indexer ---------------------------------------------------------------------------

def _topk_prefill(T: int, cfg: HeadConfig) -> Flops:
    HI, dI = cfg.index_heads, cfg.index_dim
    k = cfg.top_k                                            # mean of min(k, t) over t = 1..T
    mean_keys = (T + 1) / 2 if T <= k else (k * (k + 1) / 2 + (T - k) * k) / T
    return Flops(2 * HI * dI * (T + 1) / 2 + _pair(cfg) * mean_keys, 3 * HI * (T + 1) / 2)


def _topk_decode(t: int, cfg: HeadConfig) -> Flops:
    HI, dI = cfg.index_heads, cfg.index_dim
    return Flops(2 * HI * dI * t + _pair(cfg) * min(cfg.top_k, t), 3 * HI * t)


def _topk_memory(T: int, cfg: HeadConfig) -> float:
    # the KV cache does not shrink, and one index key per token is added to it
    return (_cache_per_token(cfg) + cfg.index_dim * cfg.bytes_per_elem) * T
