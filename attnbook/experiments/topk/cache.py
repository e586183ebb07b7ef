"""Cost on bytes: what DeepSeek-V3.2-Exp keeps per token and layer (:data:`CACHE_BYTES`,
:data:`CACHE_BYTES_FP8`, :func:`cache_bytes_per_token`) and the cache one decoding query reads
(:func:`decode_bytes`)."""

from __future__ import annotations

from .deepseek import DEEPSEEK_V32

# What DeepSeek-V3.2-Exp's reference code keeps per token and layer (``inference/model.py``): the latent and
# its rotary key at the default dtype, which ``generate.py`` sets to bfloat16 (``kv_cache``, ``pe_cache``),
# and the index key in FP8 (e4m3, ``k_cache``) with one float32 scale per 128 values (``k_scale_cache``).
CACHE_BYTES = dict(latent=(512 + 64) * 2, index_key=128 * 1 + 4)
# The layout DeepSeek's serving kernels read (FlashMLA's README, "FP8 with scale"): the 512 latent values in
# FP8 e4m3 with one float32 scale per 128 of them, and the 64 rotary values in bf16 -- 656 bytes per token.
CACHE_BYTES_FP8 = dict(latent=512 * 1 + 4 * 4 + 64 * 2, index_key=CACHE_BYTES["index_key"])


def cache_bytes_per_token(cache: dict = CACHE_BYTES) -> dict[str, int]:
    """Bytes one token leaves in one layer's cache at the precision each part is stored in: MLA's latent
    and rotary key (``dense``), and with the indexer its index key too (``topk``). Every token stays a
    candidate for every later query, so nothing is evicted: the cache grows by the index key."""
    return dict(dense=cache["latent"], topk=cache["latent"] + cache["index_key"])


def decode_bytes(T: int, *, top_k: int = DEEPSEEK_V32["index_topk"], latent: int = CACHE_BYTES["latent"],
                 index_key: int = CACHE_BYTES["index_key"], sparse_latent: int | None = None) -> dict[str, int]:
    """Bytes of cache one decoding query reads in one layer at context ``T``: dense MLA reads every latent
    row (``T * latent``); the top-k layer reads every index key and the ``min(k, T)`` selected latent rows
    (``T * index_key + min(k, T) * sparse_latent``; ``sparse_latent`` defaults to ``latent``, e.g. 656 B for
    FlashMLA's FP8 layout). Every row is read once per query: the bytes a memory-bound step moves."""
    sparse_latent = latent if sparse_latent is None else sparse_latent
    return dict(dense=T * latent, sparse=T * index_key + min(top_k, T) * sparse_latent)
