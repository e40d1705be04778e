"""Write the result of `predict` to the output directory in formats numpy and pandas read directly.

Files (in `output_dir`, `name` = "predictions" by default):

- `predictions.npz` (always): a numpy archive, read with `np.load(path)`:
    - `predictions`: the predictions array, row i = sample i of the dataset (dataset order, every sample once, also
      under DDP). Sequences of different lengths are padded with -100, as HF pads them. When the model returns
      several outputs (a tuple), they are stored as `predictions_0`, `predictions_1`, ... instead.
    - `label_ids`: the labels, when the dataset has them (same row order; -100 padding); absent otherwise.
- `predictions.parquet` (with `per_sample=True`, the default; needs pyarrow, which `datasets` already requires): one
  row per sample, read with `pandas.read_parquet(path)`: column `prediction` (a number, or a list for a row that is
  an array; first output only), `label` when labels exist, and `predicted_class` = argmax of the last axis when the
  predictions are floating-point scores of one row per sample (classification).
- `predict_results.json`: the metrics dict of `PredictionOutput` (`test_loss`, `test_runtime`, ...), as HF's
  `save_metrics("predict", ...)` names it.

Only the global-zero process writes (every process holds the same full predictions).

Example::

    output = trainer.predict(test_dataset)
    path = write_predictions(output, trainer.args.output_dir)
    arrays = np.load(path)                                  # arrays["predictions"], arrays["label_ids"]
    rows = pandas.read_parquet(path.with_suffix(".parquet"))
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_predictions"]


def _arrays(predictions: Any, label_ids: Any) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    if isinstance(predictions, (tuple, list)):
        for i, value in enumerate(predictions):
            arrays[f"predictions_{i}"] = np.asarray(value)
    elif predictions is not None:
        arrays["predictions"] = np.asarray(predictions)
    if isinstance(label_ids, (tuple, list)):
        for i, value in enumerate(label_ids):
            arrays[f"label_ids_{i}"] = np.asarray(value)
    elif label_ids is not None:
        arrays["label_ids"] = np.asarray(label_ids)
    return arrays


def _rows(predictions: Any, label_ids: Any) -> dict[str, list]:
    first = np.asarray(predictions[0] if isinstance(predictions, (tuple, list)) else predictions)
    rows: dict[str, list] = {"prediction": [r.tolist() if isinstance(r, np.ndarray) else r for r in first.tolist()]}
    if first.ndim == 2 and np.issubdtype(first.dtype, np.floating):
        rows["predicted_class"] = first.argmax(-1).tolist()
    if label_ids is not None and not isinstance(label_ids, (tuple, list)):
        rows["label"] = np.asarray(label_ids).tolist()
    return rows


def write_predictions(
    output: Any, output_dir: str | os.PathLike, name: str = "predictions", per_sample: bool = True,
    is_global_zero: bool = True,
) -> Path:
    """Write a `PredictionOutput` (or anything with `predictions`, `label_ids`, `metrics`) to `output_dir`.

    Args:
        output: what `Trainer.predict` returned.
        output_dir: the directory (created if needed).
        name: the file stem.
        per_sample: also write the per-sample `.parquet` table.
        is_global_zero: False on the other DDP processes, which write nothing but return the same path.

    Returns:
        The path of the `.npz` file (the other files sit next to it, see the module docstring).

    Raises:
        ValueError: `output` has no predictions (`prediction_loss_only=True`).
    """
    predictions, label_ids = getattr(output, "predictions", None), getattr(output, "label_ids", None)
    if predictions is None:
        raise ValueError("No predictions to write: `predict` ran with `prediction_loss_only=True` (predictions=None).")
    directory = Path(output_dir)
    path = directory / f"{name}.npz"
    if not is_global_zero:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    # Write to temporary names, then rename: a crash never leaves a truncated file under the final name.
    tmp = directory / f".{name}.tmp.npz"
    arrays: dict[str, Any] = _arrays(predictions, label_ids)  # (numpy's stub would read a key as `allow_pickle`)
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    if per_sample:
        import pyarrow as pa  # only for the per-sample table: importing the writer stays light
        import pyarrow.parquet as pq

        tmp_parquet = directory / f".{name}.tmp.parquet"
        pq.write_table(pa.table(_rows(predictions, label_ids)), tmp_parquet)
        os.replace(tmp_parquet, directory / f"{name}.parquet")
    metrics = getattr(output, "metrics", None)
    if metrics is not None:
        with open(directory / "predict_results.json", "w") as f:
            json.dump(metrics, f, indent=4, sort_keys=True)
    return path
