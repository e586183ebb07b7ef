"""DeepSeek-V3.2-Exp's configuration: the layer shapes the needle and the cost model default to."""

# DeepSeek-V3.2-Exp's configuration (``inference/config_671B_v3.2.json`` of deepseek-ai/DeepSeek-V3.2-Exp):
# 128 attention heads; MLA with a 512-dim latent (kv_lora_rank), a 64-dim rotary part and, in its per-head
# (MHA) form, keys of 128 + 64 and values of 128; the indexer's 64 heads of dim 128 and k = 2048.
DEEPSEEK_V32 = dict(n_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                    index_n_heads=64, index_head_dim=128, index_topk=2048)
