"""2-process DDP on CPU: generation evaluation gives exactly the single-process predictions and metrics, and with
`synced_gpus=True` (collective `generate`, as under FSDP / ZeRO-3) every rank makes the same number of `generate`
calls although the shards differ (5 samples = 2 + 1 batches of 2): no hang."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "ddp_generate.py"


def _run(tmp_path: Path, devices: int) -> list[dict]:
    prefix = tmp_path / f"out{devices}"
    subprocess.run([sys.executable, str(SCRIPT), str(prefix), str(devices)], check=True, cwd=tmp_path,
                   capture_output=True, timeout=300)
    return [json.loads((tmp_path / f"out{devices}.rank{r}.json").read_text()) for r in range(devices)]


@pytest.mark.distributed
def test_ddp_generation_matches_single_process(tmp_path: Path) -> None:
    (single,) = _run(tmp_path, 1)
    ddp = _run(tmp_path, 2)
    main = ddp[0]
    for key in ("t5_predictions", "t5_labels", "lm_predictions"):
        assert main[key] == single[key], key
    assert len(main["t5_predictions"]) == 5
    for key in ("t5_predict_metrics", "t5_eval_synced", "lm_metrics"):
        # uneven shards batch the samples differently: the mean of batch losses differs, nothing else
        no_loss = lambda d: {k: v for k, v in d.items() if not k.endswith("_loss")}  # noqa: E731
        assert no_loss(main[key]) == no_loss(single[key]), key
    assert main["t5_eval_even"] == pytest.approx(single["t5_eval_even"], rel=1e-6)
    # rank 0: 2 batches; rank 1: 1 batch and 1 dummy call
    assert [r["synced_calls"] for r in ddp] == [2, 2]
    assert single["synced_calls"] == 3
