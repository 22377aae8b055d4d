"""examples/extractor.py, run as the README's "Try it" runs it (the tools interpreter, which
has pyarrow and requests but not this package), loads exactly 300 users and 100 orders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import PROJECT, TOKEN, Gateway, query

ROOT = Path(__file__).resolve().parents[3]


def test_example_extractor(gateway: Gateway) -> None:
    python = os.environ.get("FILAMENT_TOOLS_PYTHON") or sys.executable
    dataset = f"client_example_{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [python, str(ROOT / "examples" / "extractor.py"), "--gateway", gateway.url, "--token", TOKEN,
         "--dataset", dataset, "--run-id", f"example_{uuid.uuid4().hex[:8]}"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    committed = json.loads(result.stdout)
    assert committed["state"] == "committed"
    assert "users seq=2 rows=100" in result.stderr and "(gzip)" in result.stderr
    assert query(f"SELECT COUNT(*) AS n FROM `{PROJECT}.{dataset}.public_users`") == [{"n": "300"}]
    assert query(f"SELECT COUNT(*) AS n, SUM(order_id) AS s FROM `{PROJECT}.{dataset}.orders`") == [{"n": "100", "s": "4950"}]


def test_example_dlt_pipeline(gateway: Gateway, tmp_path: Path) -> None:
    """examples/dlt_pipeline.py with the client's interpreter (which has dlt), loaded twice:
    the merge and the replace converge, the append appends."""
    dataset = f"client_dlt_example_{uuid.uuid4().hex[:8]}"
    command = [sys.executable, str(ROOT / "examples" / "dlt_pipeline.py"), "--gateway", gateway.url, "--token", TOKEN,
               "--dataset", dataset, "--pipelines-dir", str(tmp_path)]
    for _ in range(2):
        result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "LOADED and contains no failed jobs" in result.stdout
    counts = {
        table: query(f"SELECT COUNT(*) AS n FROM `{PROJECT}.{dataset}.{table}`")[0]["n"]
        for table in ("issues", "issues__labels", "releases", "stargazers", "_dlt_loads")
    }
    assert counts == {"issues": "3", "issues__labels": "3", "releases": "2", "stargazers": "5", "_dlt_loads": "2"}
