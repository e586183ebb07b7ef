"""The compile runs behind ``tests/test_kernel_registers.py``: ``scripts/kernel_resources.py``'s arguments for
each, by name. ``kernel_resources.py --checked-runs`` compiles them into
``benchmarks/results/kernel_registers_cache.json``; the test reads their rows from there. A module of its
own, free of side effects, so that the test can read the list without importing the compile machinery
(``benchmarks.kernel_report`` switches Triton's interpreter off for the process that imports it).
"""

FLASH = ("_flash_fwd_kernel", "_flash_bwd_dkdv_kernel", "_flash_bwd_dq_kernel")
BLOCK_SPARSE = ("_block_sparse_fwd_kernel", "_block_sparse_bwd_dkdv_kernel", "_block_sparse_bwd_dq_kernel")
# The sliding-window kernels run flash's candidates under flash's pruning hooks: compiled in the flash runs.
WINDOW = ("_window_fwd_kernel", "_window_bwd_dkdv_kernel", "_window_bwd_dq_kernel")
TOPK = ("_index_scores_fwd_kernel", "_index_scores_bwd_dq_kernel", "_index_scores_bwd_dk_kernel",
        "_topk_attn_fwd_kernel", "_topk_attn_bwd_kernel")
CHUNKED_WORKLOADS = "linear,linear non-causal,delta,gated delta,gated delta dq only"
_FLASH_CAUSAL = "flash,flash fused,block-sparse,window"
_FLASH_NON_CAUSAL = "flash non-causal,flash fused non-causal,block-sparse non-causal,window non-causal"


def _flash_run(sm: int, dtype: str, workloads: str, *extra: str) -> list[str]:
    # A candidate kept at several widths is compiled at the widest only, one causality and dtype per run:
    # bf16 and fp16 give the same registers, causal and non-causal within a few and the same spills.
    return ["--kernels", ",".join(FLASH + BLOCK_SPARSE + WINDOW), "--dims", "64", "128", "256", "--dtypes", dtype,
            "--widest-only", "--workloads", workloads, "--sm", str(sm), *extra]


# The runs, by name: kernel_resources.py's arguments for each. Compiled together by --checked-runs (about
# 12 CPU-minutes), never by the tests.
CHECKED_RUNS = {
    **{f"chunked D256 sm_{sm}": ["--dims", "256", "--dtypes", "bf16", "--workloads", CHUNKED_WORKLOADS,
                                 "--sm", str(sm)] for sm in (80, 89, 90)},
    "flash sm_80 bf16 causal": _flash_run(80, "bf16", _FLASH_CAUSAL),
    "flash sm_89 fp16 non-causal": _flash_run(89, "fp16", _FLASH_NON_CAUSAL),
    "flash sm_90 bf16 causal": _flash_run(90, "bf16", _FLASH_CAUSAL),
    "flash sm_90 fp16 non-causal pointers": _flash_run(90, "fp16", _FLASH_NON_CAUSAL, "--no-tma"),
    **{f"topk sm_{sm}": ["--kernels", ",".join(TOPK), "--dims", "64", "128", "256", "--dtypes", "bf16", "fp16",
                         "--workloads", "topk", "--sm", str(sm)] for sm in (80, 89, 90)},
}
