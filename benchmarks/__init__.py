"""The GPU benchmarks (one script per op, ``python benchmarks/<op>.py``), their shared plumbing
(``_common``) and the static kernel report (``kernel_report``). A package so that the scripts, the
report and the tools in ``scripts/`` import ``benchmarks._common`` by name, with no path tricks."""
