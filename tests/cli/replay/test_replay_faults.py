"""``krex replay`` counts GPU-wide fault culprits, casualties and re-runs apart."""

from __future__ import annotations

from krex_cli.replay import faults


def test_counts_and_section() -> None:
    records = [
        {"exit_code": 0},
        {"exit_code": 1, "gpu_fault": {"role": "culprit", "reruns": 0}},
        {"exit_code": 0, "gpu_fault": {"role": "casualty", "reruns": 1}},
        {"exit_code": 0, "gpu_fault": {"role": "casualty", "reruns": 2}},
        {"exit_code": 76, "gpu_fault": {"role": "casualty", "reruns": 2}},
    ]
    c = faults.count(records)
    assert c == {"culprits": 1, "casualties": 3, "reruns": 5, "casualties_lost": 1}
    text = "\n".join(faults.markdown({"krex-mps": c}))
    assert "| krex-mps | 1 | 3 | 5 | 1 |" in text
    assert faults.markdown({"krex": faults.count([{"exit_code": 0}])}) == []
