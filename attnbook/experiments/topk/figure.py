"""The cost models against DeepSeek's own: our reading of Figure 3 of the DeepSeek-V3.2-Exp report
(:data:`DSA_COST_FIGURE`), the counting models set beside it (:func:`cost_model_vs_figure`), and the decode
slope a roofline predicts (:func:`decode_slope_roofline`)."""

from __future__ import annotations

from .cache import CACHE_BYTES
from .deepseek import DEEPSEEK_V32
from .flops import per_pair_flops

# Our reading of Figure 3 of the DeepSeek-V3.2-Exp report ("Inference costs of DeepSeek-V3.1-Terminus and
# DeepSeek-V3.2-Exp on H800 clusters"; cost per million tokens in USD against the token position, from their
# deployed service at 2 USD per GPU hour): straight lines fitted to the plotted curves' pixels. Ours, not
# DeepSeek's numbers: each is good to about 2% of the panel's full scale. ``slope`` in USD per million tokens
# per 1K of position, ``at_0`` the line's value at position 0; for V3.2-Exp past its kink (positions >= 12K),
# and ``kink`` the position (K tokens) where its prefill line changes slope.
DSA_COST_FIGURE = {
    "prefill": {"V3.1-Terminus": dict(at_0=0.0557, slope=4.894e-3), "V3.2-Exp": dict(at_0=0.0985, slope=7.33e-4),
                "V3.2-Exp below the kink": dict(at_0=0.0645, slope=5.8e-3), "kink": 6.7},
    "decode": {"V3.1-Terminus": dict(at_0=0.0752, slope=1.669e-2), "V3.2-Exp": dict(at_0=0.1500, slope=8.42e-4)},
}


def cost_model_vs_figure(config: dict = DEEPSEEK_V32, figure: dict = DSA_COST_FIGURE,
                         cache: dict = CACHE_BYTES) -> dict[str, dict[str, float]]:
    """The counting models set beside our reading of DeepSeek's Figure 3 (:data:`DSA_COST_FIGURE`). Per
    quantity, ``predicted`` (from :func:`per_pair_flops` and :data:`CACHE_BYTES`; positions in tokens) and
    ``read`` (from the figure; its "K" is 1024 tokens):

    * ``prefill_kink``: the position where the sparse path (indexer over every key, MQA-form attention
      over ``k``) becomes cheaper than DeepSeek's "masked MHA mode" (dense MHA over every key, plus the
      indexer): ``mqa * k / mha``;
    * ``masked_mha_slope``: that mode's cost per key over V3.1's dense MHA: ``(mha + indexer) / mha``;
    * ``prefill_slope``: V3.1's cost per key over V3.2's past the kink, predicted ``mha / indexer`` with
      the indexer's FP8 FLOPs at the price of bf16 ones (``predicted``) or at half (``predicted_fp8``);
    * ``decode_slope``: the same for decoding, by FLOPs (``mqa / indexer``, and at half price) and by
      bytes read (``bytes``: a bf16 latent row against an FP8 index key and its scale);
    * ``decode_offset``: how far V3.2's decode line starts above V3.1's, against the cost of reading ``k``
      keys on V3.1's own line (``predicted``);
    * ``decode_roofline``: the decode slope a roofline predicts (:func:`decode_slope_roofline`) with one
      query per read of the cache (``one_query``) and with two (``two_queries``), and the arithmetic
      intensities and ridges behind it."""
    c = per_pair_flops(config)
    k = config["index_topk"]
    pre, dec = figure["prefill"], figure["decode"]
    per_token = 1 / 1024                                  # the figure's slopes are per 1K positions
    return {
        "prefill_kink": dict(predicted=c["mqa"] * k / c["mha"], read=figure["prefill"]["kink"] * 1024),
        "masked_mha_slope": dict(predicted=(c["mha"] + c["indexer"]) / c["mha"],
                                 read=pre["V3.2-Exp below the kink"]["slope"] / pre["V3.1-Terminus"]["slope"]),
        "prefill_slope": dict(predicted=c["mha"] / c["indexer"], predicted_fp8=2 * c["mha"] / c["indexer"],
                              read=pre["V3.1-Terminus"]["slope"] / pre["V3.2-Exp"]["slope"]),
        "decode_slope": dict(predicted=c["mqa"] / c["indexer"], predicted_fp8=2 * c["mqa"] / c["indexer"],
                             bytes=cache["latent"] / cache["index_key"],
                             read=dec["V3.1-Terminus"]["slope"] / dec["V3.2-Exp"]["slope"]),
        "decode_offset": dict(predicted=k * per_token * dec["V3.1-Terminus"]["slope"],
                              read=dec["V3.2-Exp"]["at_0"] - dec["V3.1-Terminus"]["at_0"]),
        "decode_roofline": decode_slope_roofline(config, cache),
    }


def decode_slope_roofline(config: dict = DEEPSEEK_V32, cache: dict = CACHE_BYTES, *,
                          roof=None) -> dict[str, float]:
    """Dense decoding's cost per key over the indexer's, by the roofline of appendix A1: each side's time
    per key is ``max(FLOPs / peak, bytes / (bandwidth x q))`` when ``q`` queries of one sequence share each
    read of the cache (``q = 1``: plain decoding; ``q = 2``: one token drafted ahead, as multi-token
    prediction does). Dense MLA runs at the bf16 peak on ``cache["latent"]`` bytes per key; the indexer at
    the FP8 peak, twice the bf16 one on Hopper, on ``cache["index_key"]`` bytes. ``roof``: an
    :class:`attnbook.experiments.roofline.Roof` (default the H100's datasheet ceilings)."""
    from ..roofline import PEAKS

    roof = PEAKS["NVIDIA H100"] if roof is None else roof
    c = per_pair_flops(config)
    bf16, fp8, bw = roof.tflops * 1e12, 2 * roof.tflops * 1e12, roof.tb_per_s * 1e12

    def ratio(q: int) -> float:
        dense = max(c["mqa"] / bf16, cache["latent"] / (bw * q))
        indexer = max(c["indexer"] / fp8, cache["index_key"] / (bw * q))
        return dense / indexer

    return dict(one_query=ratio(1), two_queries=ratio(2), device=roof.device,
                dense_intensity=c["mqa"] / cache["latent"], indexer_intensity=c["indexer"] / cache["index_key"],
                bf16_ridge=roof.ridge, fp8_ridge=2 * roof.ridge)
