"""Writing the prediction file of `hf-lightning predict` (isolated so the evaluation issue's writer can replace it)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["write_predictions"]


def write_predictions(result: Any, output_dir: str) -> str:
    """Save `result.predictions` and `result.label_ids` to `<output_dir>/predictions.npz`; returns the path.

    A tuple of prediction arrays is stored as `predictions`, `predictions_1`, ...; missing labels as an empty array.
    """
    import numpy as np

    os.makedirs(output_dir, exist_ok=True)
    predictions = result.predictions if isinstance(result.predictions, tuple) else (result.predictions,)
    arrays = {("predictions" if i == 0 else f"predictions_{i}"): np.asarray(p) for i, p in enumerate(predictions)}
    arrays["label_ids"] = np.asarray(result.label_ids if result.label_ids is not None else [])
    path = os.path.join(output_dir, "predictions.npz")
    np.savez(path, **arrays)
    return path
