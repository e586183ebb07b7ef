"""Chapter 7's landscape (attnbook.experiments.landscape, attnbook.widgets.landscape): the cost models
agree with FLOPs counted on the references, the crossovers agree with their closed forms, the published
designs are computed from their cited numbers, and the figure switches panels."""

import math

import pytest
import torch

from attnbook.experiments import landscape as L
from attnbook.experiments.recall import recall_vs_pairs
from attnbook.widgets.landscape import cell_texts, html_table, landscape_figure, text_table

# Small enough to count in a second; every size a mechanism has is different, so a formula that swaps
# two of them fails.
SMALL = L.HeadConfig(heads=2, kv_heads=1, d_head=16, chunk=8, block_size=8, band_blocks=2, top_k=12, index_heads=3,
                     index_dim=8, lsh_tables=2, lsh_bits=3, grassmann_rank=6, grassmann_offsets=(1, 2, 4))
LENGTHS = (16, 32, 48)


@pytest.fixture(scope="module")
def counted():
    return L.counted_flops(LENGTHS, SMALL, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mechanism", L.COUNTED_PREFILL)
def test_prefill_model_matches_counted_flops(counted, mechanism):
    got, model = counted["prefill"][mechanism], counted["prefill"][f"{mechanism}:model"]
    for T, c, m in zip(LENGTHS, got, model):
        tol = L.count_tolerance(mechanism, T, SMALL)
        assert m - tol - 1e-9 <= c <= m + 1e-9, (mechanism, T, c, m)


@pytest.mark.parametrize("mechanism", L.COUNTED_DECODE)
def test_decode_model_matches_counted_flops_exactly(counted, mechanism):
    assert counted["decode"][mechanism] == counted["decode"][f"{mechanism}:model"]


def test_elementwise_work_is_what_the_counter_misses():
    # Linear decode is all products; the delta rule adds its rank-one update, the gate a decay on top.
    d, H = SMALL.d_head, SMALL.heads
    assert L.decode_flops("linear", 5, SMALL).elementwise == 0
    assert L.decode_flops("delta", 5, SMALL).elementwise == H * (2 * d * d + 2 * d)
    assert L.decode_flops("gated_delta", 5, SMALL).total - L.decode_flops("delta", 5, SMALL).total == H * d * d


def test_softmax_prefill_is_the_mean_of_its_decode_steps():
    for T in (1, 7, 64):
        mean_decode = sum(L.decode_flops("softmax", t).total for t in range(1, T + 1)) / T
        assert L.prefill_flops("softmax", T).total == pytest.approx(mean_decode, rel=1e-12)


def test_recurrent_layers_cost_the_same_at_every_length_and_softmax_grows_linearly():
    for m in L.RECURRENT + ("anna", "grassmann"):
        assert L.decode_flops(m, 10).total == L.decode_flops(m, 10**6).total
    assert L.decode_flops("softmax", 2000).total == 2 * L.decode_flops("softmax", 1000).total


def test_topk_reads_k_keys_not_k_squared_and_keeps_the_whole_cache():
    cfg = L.HeadConfig()
    big, bigger = 1 << 16, 1 << 17
    attn = [L.decode_flops("topk", t, cfg).matmul - 2 * cfg.index_heads * cfg.index_dim * t for t in (big, bigger)]
    assert attn[0] == attn[1] == 2 * cfg.heads * 2 * cfg.d_head * cfg.top_k
    assert L.memory_bytes("topk", big, cfg) > L.memory_bytes("softmax", big, cfg)


def test_memory_crossover_closed_form_and_search_agree():
    for cfg in (L.HeadConfig(), L.HeadConfig(heads=32, kv_heads=2, d_head=128), SMALL):
        T_mem = L.memory_crossover(cfg)
        found = L.first_length_where(lambda T, c=cfg: L.memory_bytes("softmax", T, c),
                                     lambda T, c=cfg: L.memory_bytes("gated_delta", T, c))
        assert found == math.ceil(T_mem), (cfg, T_mem, found)


@pytest.mark.parametrize("mechanism", L.RECURRENT)
def test_decode_break_even_closed_form_and_search_agree(mechanism):
    t_star = L.decode_break_even(mechanism)
    found = L.first_length_where(lambda t: L.decode_flops("softmax", t).total,
                                 lambda t: L.decode_flops(mechanism, t).total)
    assert found == math.ceil(t_star)
    if mechanism == "linear":                                  # 4 H d^2 / (4 H d) = d
        assert t_star == L.HeadConfig().d_head


def test_first_length_where_edge_cases():
    assert L.first_length_where(lambda t: t, lambda t: 0) == 1
    assert L.first_length_where(lambda t: 0, lambda t: 1, stop=1 << 10) is None
    assert L.first_length_where(lambda t: t * t, lambda t: 1000 * t) == 1000


def test_published_designs_are_computed_from_their_cited_numbers():
    rows = {r["model"]: r for r in L.design_table()}
    qwen = rows["Qwen3-Next-80B-A3B"]
    assert (qwen["layers"], qwen["full"], qwen["ratio"], qwen["f"]) == (48, 12, "3:1", 0.25)
    assert qwen["T_mem_layer"] == 512                          # 32 * 128 * 128 / (2 * 2 * 256)
    assert qwen["kv_bytes_per_token"] == 12 * 2 * 2 * 256 * 2
    assert rows["MiniMax-Text-01"]["f"] == L.quadratic_share(7)
    assert rows["Jamba-v0.1"]["ratio"] == "7:1" and rows["Jamba-v0.1"]["T_mem_layer"] == 16 * 8192 / (2 * 8 * 128)
    # the index key at its stored precision: 128 FP8 bytes and a float32 scale beside 576 bf16 numbers
    assert rows["DeepSeek-V3.2-Exp"]["kv_bytes_per_token"] - rows["DeepSeek-V3 (full MLA)"]["kv_bytes_per_token"] \
        == 61 * 132
    assert rows["DeepSeek-V3 (full MLA)"]["kv_bytes_per_token"] == 61 * 576 * 2
    assert rows["MiniMax-Text-01"]["unverified"] == ["kv_heads"]
    for r in rows.values():
        assert (r["state_bytes"] == 0) == (r["linear"] == 0)
    for s in L.design_sources():
        assert s["source"], s


def test_indexer_cost_is_relative_to_the_layer_it_sits_in():
    hosts = {r["model"]: r for r in L.indexer_hosts()}
    ds = hosts["DeepSeek-V3.2-Exp"]
    assert (ds["pair_prefill"], ds["pair_decode"]) == (2 * 128 * (128 + 64 + 128), 2 * 128 * (512 + 64 + 512))
    assert ds["r_I_decode"] == pytest.approx(1 / 17) and ds["r_I_prefill"] == pytest.approx(1 / 5)
    qwen = hosts["Qwen3-Next-80B-A3B"]                  # 16 heads of 256: as many FLOPs per pair as the indexer
    assert qwen["pair_prefill"] == qwen["pair_decode"] == 2 * 16 * 512 and qwen["r_I_decode"] == 1.0
    assert qwen["f_r_I_decode"] == pytest.approx(0.25)      # a top-k layer there cuts nothing of the T^2 term
    kimi = hosts["Kimi Linear 48B-A3B"]
    assert kimi["r_I_decode"] == pytest.approx(16384 / (2 * 32 * 1088)) and kimi["r_I_prefill"] == pytest.approx(0.8)
    assert kimi["f_r_I_decode"] == pytest.approx(7 / 27 * 16384 / 69632)
    with pytest.raises(ValueError, match="mode"):
        L.pair_flops(L.DESIGNS["Jamba-v0.1"], "gqa")


def test_gpu_rows_keep_the_device_and_merge_repeats():
    doc = {"device": "GPU X", "date": "2026-01-01", "versions": {"torch": "9"},
           "rows": [dict(op="softmax_attention", impl="a", T=8, ms=1.0, tflops=1.0),
                    dict(op="softmax_attention", impl="a", T=8, ms=3.0, tflops=1.0),
                    dict(op="other", impl="a", T=8, ms=2.0)]}
    rows = L.gpu_rows({"f.json": doc, "missing.json": None}, ops={"softmax_attention"})
    assert rows == [dict(op="softmax_attention", impl="a", T=8, device="GPU X", date="2026-01-01",
                         versions={"torch": "9"}, file="f.json", ms=2.0, runs=2)]


def test_adversary_errors_softmax_exact_others_miss_the_needle():
    err = L.adversary_errors(T=64, d=16)
    assert err["softmax"] < 1e-6
    for m in ("block_sparse", "linear", "anna", "topk"):
        assert err[m] > 1.9, (m, err[m])
    for m in ("delta", "gated_delta", "grassmann", "hybrid"):
        assert err[m] is None


def test_exactness_table_and_delta_verdict():
    counts = [8, 16, 32, 64]
    recall = recall_vs_pairs(counts, 16, generator=torch.Generator().manual_seed(0), trials=2)
    verdict = L.delta_rule_verdict(counts, recall)
    assert verdict["distinct"] == []                           # distinct random keys: never the delta rule
    rows = L.exactness_table(L.adversary_errors(T=64), counts, recall, dim=16,
                             mqar={"fits": {"softmax": 1.0}, "exceeds": {"softmax": 0.5, "hybrid": 0.2}})
    by = {r["mechanism"]: r for r in rows}
    assert len(rows) == len(L.MECHANISMS) and by[L.LABELS["softmax"]]["mqar_fits"] == 1.0
    assert by[L.LABELS["hybrid"]]["mqar_exceeds"] == 0.2 and by[L.LABELS["hybrid"]]["mqar_fits"] is None
    assert by[L.LABELS["softmax"]]["recall_distinct_N64"] == 1.0
    assert by[L.LABELS["anna"]]["recall_distinct_N8"] is None and by[L.LABELS["linear"]]["mqar_fits"] is None


def test_unknown_mechanism_is_refused():
    for fn in (L.prefill_flops, L.decode_flops, L.memory_bytes):
        with pytest.raises(ValueError, match="unknown mechanism"):
            fn("mamba", 10)
    with pytest.raises(ValueError):
        L.decode_break_even("softmax")


def test_cpu_decode_times_shape():
    out = L.cpu_decode_times([8, 16], SMALL, reps=2, generator=torch.Generator().manual_seed(0))
    for m in ("softmax", "linear", "gated_delta"):
        assert out[m]["t"] == [8, 16] and all(a <= b <= c for a, b, c in zip(out[m]["q1"], out[m]["median"],
                                                                                  out[m]["q3"]))


def test_landscape_figure_switches_three_panels_with_buttons():
    Ts = [2**e for e in range(4, 12)]
    curves = L.landscape_curves(Ts, SMALL)
    fig = landscape_figure(Ts, curves, crossovers={"memory": [("state = cache", 64.0, 100.0, (-40, 60))],
                                                   "decode": [("linear", 32.0, 50.0)]})
    assert not fig.frames and not fig.layout.sliders                       # a mode switch, not a slider
    (menu,) = fig.layout.updatemenus
    assert menu.type == "buttons" and [b.label for b in menu.buttons] == ["prefill", "decode", "memory"]
    assert len(fig.data) == len(L.MECHANISMS) + 1
    n = len(fig.data)
    titles = set()
    for b in menu.buttons:
        data, layout = b.args
        assert b.method == "update" and len(data["y"]) == len(data["x"]) == n
        titles.add(layout["yaxis.title.text"])
        marks = [a for a in layout["annotations"]]
        assert [a["text"] for a in marks] == {"prefill": [], "decode": ["linear"],
                                              "memory": ["state = cache"]}[b.label]
    assert len(titles) == 3
    # every mechanism has a legible colour of its own line style, none the palette's pale yellow
    styles = [(t.line.color, t.line.dash) for t in fig.data[:-1]]
    assert len(set(styles)) == len(styles) and all(c != "#F0E442" for c, _ in styles)
    # no code names in the legend
    assert all("_" not in t.name for t in fig.data)
    assert fig.layout.title.subtitle.font.size >= 11
    with pytest.raises(ValueError):
        landscape_figure(Ts, curves, active="nope")


def test_text_table_fits_its_width():
    rows = [{"a": 1234.5, "b": None}, {"a": 2.0, "b": "x" * 200}]
    narrow = text_table(rows[:1], {"a": "A", "b": "B"}, {"a": ",.0f"})
    assert narrow.splitlines()[2].split() == ["1,234", "—"] or narrow.splitlines()[2].split() == ["1,235", "—"]
    wide = text_table(rows, {"a": "A", "b": "B"}, {"a": ",.0f"}, width=80)
    assert all(len(line) <= 80 for line in wide.splitlines()) and "x" * 60 in wide
    assert cell_texts(rows, ["a", "b"], {"a": ",.0f"})[0]["b"] == "—"


def test_tables_render():
    rows = [{"a": 1234.5, "b": None}, {"a": 2.0, "b": "x"}]
    html = html_table(rows, {"a": "A", "b": "B"}, {"a": ",.0f"})
    assert "<tr><td>1,234</td><td>—</td></tr>" in html or "<tr><td>1,235</td><td>—</td></tr>" in html


def test_the_html_table_holds_the_markdown_tables_cells_escaped():
    rows = [{"a": 1234.5, "b": "<x> & y"}, {"a": None, "b": "z"}]
    html = html_table(rows, {"a": "A", "b": "B"}, {"a": ",.0f"})
    assert html.count("<tr>") == 3 and "<th>A</th><th>B</th>" in html
    assert "<td>&lt;x&gt; &amp; y</td>" in html and "<td>—</td>" in html
