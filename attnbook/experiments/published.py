"""Chapter 7's published designs, as cited: each config number with the source it was read from.

:data:`DESIGNS` holds, per model, its layers by kind, the full-attention layers' cache per token and
layer, and the recurrent layers' state -- every number a :class:`Cited` with its source and a flag where
only a copy or summary of the source could be read. The functions compute from them: cache, state, the
quadratic share ``f`` and ``T_mem`` (:func:`design_row`, :func:`design_table`), every number with its
source (:func:`design_sources`), a full layer's shape in MLA's two forms (:func:`attention_dims`,
:func:`pair_flops`) and what a lightning indexer costs inside it (:func:`indexer_hosts`).

Kept apart from :mod:`attnbook.experiments.landscape`'s cost models on purpose: those are formulas of the
book's mechanisms; these are facts about other people's models, each traceable to where it was read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Cited:
    """A config number with where it was read (URL / arXiv id and field) and whether the source itself
    was read (``verified``) or only a copy or summary of it."""
    value: object
    source: str
    verified: bool = True


_TF = "https://github.com/huggingface/transformers/blob/main/src/transformers/models"
_QWEN = f"{_TF}/qwen3_next/configuration_qwen3_next.py (defaults, documented as Qwen3-Next-80B-A3B's)"
_JAMBA = f"{_TF}/jamba/configuration_jamba.py (defaults, documented as Jamba-v0.1's)"
_MIXTRAL = f"{_TF}/mixtral/configuration_mixtral.py (defaults, checkpoint mistralai/Mixtral-8x7B-v0.1)"
_DSV3 = f"{_TF}/deepseek_v3/configuration_deepseek_v3.py (defaults, DeepSeek-V3)"
_DSV32 = "https://github.com/deepseek-ai/DeepSeek-V3.2-Exp inference/config_671B_v3.2.json"
_KIMI = ("huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, as reproduced in several public "
         "repositories (the file itself not read); arXiv 2510.26692")
_MINIMAX = "huggingface.co/MiniMaxAI/MiniMax-Text-01 model card (Model Architecture); arXiv 2501.08313"

# Each design: its layers by kind, the full-attention layers' cache per token and layer (numbers), and
# the recurrent layers' state (numbers). Fields carry their sources.
DESIGNS: dict[str, dict[str, Cited | str]] = {
    "Qwen3-Next-80B-A3B": dict(
        linear_kind="Gated DeltaNet", full_kind="gated attention (GQA)",
        n_layers=Cited(48, f"{_QWEN}: num_hidden_layers"),
        full_every=Cited(4, f"{_QWEN}: full_attention_interval (layer i is full when (i+1) % 4 == 0)"),
        q_heads=Cited(16, f"{_QWEN}: num_attention_heads"),
        kv_heads=Cited(2, f"{_QWEN}: num_key_value_heads"), head_dim=Cited(256, f"{_QWEN}: head_dim"),
        lin_v_heads=Cited(32, f"{_QWEN}: linear_num_value_heads"),
        lin_k_heads=Cited(16, f"{_QWEN}: linear_num_key_heads"),
        lin_dk=Cited(128, f"{_QWEN}: linear_key_head_dim"), lin_dv=Cited(128, f"{_QWEN}: linear_value_head_dim"),
        conv=Cited(4, f"{_QWEN}: linear_conv_kernel_dim"),
    ),
    "Kimi Linear 48B-A3B": dict(
        linear_kind="KDA (gated delta rule, channel-wise decay)", full_kind="MLA (NoPE)",
        n_layers=Cited(27, f"{_KIMI}: num_hidden_layers", verified=False),
        full_layers=Cited((4, 8, 12, 16, 20, 24, 27), f"{_KIMI}: linear_attn_config.full_attn_layers (1-based)",
                          verified=False),
        mla_heads=Cited(32, f"{_KIMI}: num_attention_heads", verified=False),
        mla_latent=Cited(512, f"{_KIMI}: kv_lora_rank", verified=False),
        mla_rope=Cited(64, f"{_KIMI}: qk_rope_head_dim (cached beside the latent, as in DeepSeek's MLA; with "
                           "mla_use_nope the 64 dims may not be rotated, but they are still keys)", verified=False),
        mla_nope=Cited(128, f"{_KIMI}: qk_nope_head_dim", verified=False),
        mla_v=Cited(128, f"{_KIMI}: v_head_dim", verified=False),
        lin_v_heads=Cited(32, f"{_KIMI}: linear_attn_config.num_heads", verified=False),
        lin_k_heads=Cited(32, f"{_KIMI}: linear_attn_config.num_heads", verified=False),
        lin_dk=Cited(128, f"{_KIMI}: linear_attn_config.head_dim", verified=False),
        lin_dv=Cited(128, f"{_KIMI}: linear_attn_config.head_dim (d_v = d_k)", verified=False),
        conv=Cited(4, f"{_KIMI}: linear_attn_config.short_conv_kernel_size", verified=False),
    ),
    "MiniMax-Text-01": dict(
        linear_kind="lightning attention (linear)", full_kind="softmax attention (GQA)",
        n_layers=Cited(80, f"{_MINIMAX}: Number Layers"),
        full_every=Cited(8, f"{_MINIMAX}: 'a softmax attention is positioned after every 7 lightning attention'"),
        q_heads=Cited(64, f"{_MINIMAX}: Number of attention heads"),
        head_dim=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        kv_heads=Cited(8, "num_key_value_heads = 8: only in third-party copies of the config (GQA group 8); "
                          "not in the model card", verified=False),
        lin_v_heads=Cited(64, f"{_MINIMAX}: Number of attention heads (lightning layers alike)"),
        lin_k_heads=Cited(64, f"{_MINIMAX}: Number of attention heads"),
        lin_dk=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        lin_dv=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        conv=Cited(0, "lightning attention has no short convolution"),
    ),
    "Jamba-v0.1": dict(
        linear_kind="Mamba (selective SSM)", full_kind="attention (GQA)",
        n_layers=Cited(32, f"{_JAMBA}: num_hidden_layers"),
        full_every=Cited(8, f"{_JAMBA}: attn_layer_period (offset 4)"),
        q_heads=Cited(32, f"{_JAMBA}: num_attention_heads"),
        kv_heads=Cited(8, f"{_JAMBA}: num_key_value_heads"),
        head_dim=Cited(128, f"{_JAMBA}: hidden_size 4096 / num_attention_heads 32"),
        mamba_inner=Cited(8192, f"{_JAMBA}: mamba_expand 2 x hidden_size 4096"),
        mamba_state=Cited(16, f"{_JAMBA}: mamba_d_state"),
        conv=Cited(4, f"{_JAMBA}: mamba_d_conv"),
    ),
    "DeepSeek-V3.2-Exp": dict(
        linear_kind="(none)", full_kind="MLA + lightning indexer, top-k 2048",
        n_layers=Cited(61, f"{_DSV32}: n_layers"),
        full_every=Cited(1, "every layer is an MLA layer"),
        mla_heads=Cited(128, f"{_DSV32}: n_heads"),
        mla_latent=Cited(512, f"{_DSV32}: kv_lora_rank"), mla_rope=Cited(64, f"{_DSV32}: qk_rope_head_dim"),
        mla_nope=Cited(128, f"{_DSV32}: qk_nope_head_dim"), mla_v=Cited(128, f"{_DSV32}: v_head_dim"),
        index_dim=Cited(128, f"{_DSV32}: index_head_dim"), index_heads=Cited(64, f"{_DSV32}: index_n_heads"),
        index_key_bytes=Cited(132, "https://github.com/deepseek-ai/DeepSeek-V3.2-Exp inference/model.py, Indexer: "
                                   "k_cache float8_e4m3fn [.., 128] (128 B) and k_scale_cache float32 "
                                   "[.., 128 // block_size 128] (4 B) per token"),
        top_k=Cited(2048, f"{_DSV32}: index_topk"),
    ),
    "DeepSeek-V3 (full MLA)": dict(
        linear_kind="(none)", full_kind="MLA",
        n_layers=Cited(61, f"{_DSV3}: num_hidden_layers"), full_every=Cited(1, "every layer"),
        mla_heads=Cited(128, f"{_DSV3}: num_attention_heads"),
        mla_latent=Cited(512, f"{_DSV3}: kv_lora_rank"), mla_rope=Cited(64, f"{_DSV3}: qk_rope_head_dim"),
        mla_nope=Cited(128, f"{_DSV3}: qk_nope_head_dim"), mla_v=Cited(128, f"{_DSV3}: v_head_dim"),
    ),
    "Mixtral-8x7B (full GQA)": dict(
        linear_kind="(none)", full_kind="attention (GQA)",
        n_layers=Cited(32, f"{_MIXTRAL}: num_hidden_layers"), full_every=Cited(1, "every layer"),
        q_heads=Cited(32, f"{_MIXTRAL}: num_attention_heads"),
        kv_heads=Cited(8, f"{_MIXTRAL}: num_key_value_heads"),
        head_dim=Cited(128, f"{_MIXTRAL}: hidden_size 4096 / num_attention_heads 32"),
    ),
}


def _v(design: Mapping, key: str):
    return design[key].value


def design_row(name: str, design: Mapping, *, bytes_per_elem: int = 2) -> dict:
    """One published design, computed from its cited config: layer counts and ratio, KV cache bytes per
    token (all full layers; an index key at the precision it is stored in), recurrent state bytes (all
    linear layers; constant in T; convolution states included), the quadratic share ``f`` (full layers /
    all layers), ``T_mem`` per layer (one linear
    layer's state against one full layer's cache per token) and for the whole model (all state against
    all cache per token), and which of the numbers used were not verified at their source."""
    n = _v(design, "n_layers")
    if "full_layers" in design:
        n_full = len(_v(design, "full_layers"))
    else:
        n_full = n // _v(design, "full_every")
    n_lin = n - n_full
    if "mla_latent" in design:
        cache = _v(design, "mla_latent") + _v(design, "mla_rope")
    else:
        cache = 2 * _v(design, "kv_heads") * _v(design, "head_dim")
    # the index key is stored at its own precision (FP8 and a float32 scale), not at bytes_per_elem
    index_bytes = _v(design, "index_key_bytes") if "index_key_bytes" in design else 0
    if "mamba_inner" in design:
        inner = _v(design, "mamba_inner")
        state = inner * _v(design, "mamba_state") + inner * (_v(design, "conv") - 1)
        core_state = inner * _v(design, "mamba_state")
    elif n_lin:
        hv, hk, dk, dv = (_v(design, k) for k in ("lin_v_heads", "lin_k_heads", "lin_dk", "lin_dv"))
        core_state = hv * dk * dv
        conv = _v(design, "conv")
        state = core_state + max(conv - 1, 0) * (2 * hk * dk + hv * dv)
    else:
        state = core_state = 0
    unverified = sorted(k for k, c in design.items() if isinstance(c, Cited) and not c.verified)
    b = bytes_per_elem
    return {
        "model": name, "layers": n, "full": n_full, "linear": n_lin,
        "ratio": ("all full" if not n_lin else f"{n_lin // n_full}:1" if n_lin % n_full == 0 else f"{n_lin}:{n_full}"),
        "types": f"{design['linear_kind']} / {design['full_kind']}",
        "kv_bytes_per_token": n_full * (cache * b + index_bytes),
        "state_bytes": n_lin * state * b,
        "f": n_full / n,
        "T_mem_layer": core_state / cache if n_lin else None,
        "T_mem_model": n_lin * state / (n_full * cache) if n_lin else None,
        "unverified": unverified,
    }


def design_table(designs: Mapping[str, Mapping] = DESIGNS, *, bytes_per_elem: int = 2) -> list[dict]:
    """:func:`design_row` for every design."""
    return [design_row(name, d, bytes_per_elem=bytes_per_elem) for name, d in designs.items()]


def design_sources(designs: Mapping[str, Mapping] = DESIGNS) -> list[dict]:
    """Every config number used, with its source and whether it was verified there."""
    return [{"model": name, "field": k, "value": c.value, "source": c.source, "verified": c.verified}
            for name, d in designs.items() for k, c in d.items() if isinstance(c, Cited)]


def attention_dims(design: Mapping, mode: str) -> tuple[int, int, int]:
    """A design's full attention layer as ``(query heads, D_qk, D_v)``. MLA has two forms: ``mode="mha"``
    (training and prefill in DeepSeek's code: per-head keys of ``nope + rope`` and values of ``v``) and
    ``mode="mqa"`` (decoding: queries absorbed into the latent, so every head scores the shared
    ``latent + rope`` key and reads the ``latent`` value). For other attention layers the two coincide."""
    if mode not in ("mha", "mqa"):
        raise ValueError(f"mode must be 'mha' (MLA's prefill form) or 'mqa' (its decode form); got {mode!r}")
    if "mla_latent" in design:
        H, latent, rope = _v(design, "mla_heads"), _v(design, "mla_latent"), _v(design, "mla_rope")
        if mode == "mha":
            return H, _v(design, "mla_nope") + rope, _v(design, "mla_v")
        return H, latent + rope, latent
    return _v(design, "q_heads"), _v(design, "head_dim"), _v(design, "head_dim")


def pair_flops(design: Mapping, mode: str) -> int:
    """FLOPs per (query, key) pair of a design's full attention layer in ``mode`` (:func:`attention_dims`),
    ``2 H (D_qk + D_v)`` summed over its query heads (grouped-query attention shares keys between heads,
    not the products)."""
    H, d_qk, d_v = attention_dims(design, mode)
    return 2 * H * (d_qk + d_v)


def indexer_hosts(designs: Mapping[str, Mapping] = DESIGNS, *, index_heads: int = 64,
                  index_dim: int = 128) -> list[dict]:
    """What a lightning indexer of ``index_heads`` heads of ``index_dim`` (DeepSeek-V3.2's: 64 x 128,
    ``2 * 64 * 128 = 16,384`` FLOPs per pair) costs relative to the full layer it would sit in:
    ``r_I = indexer FLOPs per pair / the layer's FLOPs per pair`` (:func:`pair_flops`), in both of MLA's
    forms, and the quadratic term a model keeps with top-k layers in place of its full ones,
    ``f * r_I`` (``f`` its share of full layers). One row per design with a full attention layer."""
    index_pair = 2 * index_heads * index_dim
    rows = []
    for name, d in designs.items():
        row = design_row(name, d)
        mha, mqa = pair_flops(d, "mha"), pair_flops(d, "mqa")
        rows.append({"model": name, "layer": d["full_kind"], "f": row["f"], "pair_prefill": mha, "pair_decode": mqa,
                     "r_I_prefill": index_pair / mha, "r_I_decode": index_pair / mqa,
                     "f_r_I_prefill": row["f"] * index_pair / mha, "f_r_I_decode": row["f"] * index_pair / mqa,
                     "mla": "mla_latent" in d})
    return rows


def quadratic_share(ratio: int) -> float:
    """``f = 1 / (n_lin + 1)``: the share of layers that stay quadratic with one full layer in every
    ``n_lin + 1`` (``ratio`` is n_lin, the linear:full ratio's first term)."""
    return 1.0 / (ratio + 1)


__all__ = ["Cited", "DESIGNS", "attention_dims", "design_row", "design_sources", "design_table", "indexer_hosts",
           "pair_flops", "quadratic_share"]
