"""``krex replay``: run a benchmarking-command trace in one mode and report fidelity.

Modules: ``trace`` (the JSONL command trace), ``modes`` (native, serial, krex,
ungated; krexd config and process for the krexd-backed modes), ``runner``
(runs commands, writes ``results.jsonl`` and ``meta.json``), ``metrics``
(paper §6.3-6.4: throughput, P = p95 timing inflation, bands, flip rate by
native gap, Kendall tau-b), ``report`` (markdown and PNG plots) and ``cli``
(``krex replay`` arguments).  File formats: docs/design/replay.md.
"""
