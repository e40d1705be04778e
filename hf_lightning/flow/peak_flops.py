"""Peak FLOP/s of common GPUs, the denominator of `mfu` (model FLOPs utilisation), as a pure lookup.

Dense (no 2:4 sparsity) tensor-core peaks from NVIDIA's data sheets, per precision: `bf16` and `fp16` (tensor cores,
FP32 accumulation), `tf32` (FP32 matmuls run as TF32: `torch.backends.cuda.matmul.allow_tf32` or a float32 matmul
precision other than "highest") and `fp32` (plain FP32, no tensor cores). A device or precision that is not here has no
`mfu` unless `peak_flops_per_device` gives its peak. The name is matched against `torch.cuda.get_device_name()`, e.g.
"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "Tesla T4", "NVIDIA GeForce RTX 4090".
"""

from __future__ import annotations

import re

__all__ = ["PEAK_FLOPS", "peak_flops", "precision_kind"]

_T = 1e12

PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    # (regular expression on the device name, peak FLOP/s per precision); the first match wins, so variants first
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756 * _T, "fp16": 756 * _T, "tf32": 378 * _T, "fp32": 51.2 * _T}),
    (r"\bH100 NVL\b", {"bf16": 835 * _T, "fp16": 835 * _T, "tf32": 418 * _T, "fp32": 60 * _T}),
    (r"\bH100\b", {"bf16": 989.4 * _T, "fp16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T}),  # SXM
    (r"\bH200\b", {"bf16": 989.4 * _T, "fp16": 989.4 * _T, "tf32": 494.7 * _T, "fp32": 66.9 * _T}),
    (r"\bA100\b", {"bf16": 312 * _T, "fp16": 312 * _T, "tf32": 156 * _T, "fp32": 19.5 * _T}),
    (r"\bL40S\b", {"bf16": 362.05 * _T, "fp16": 362.05 * _T, "tf32": 183 * _T, "fp32": 91.6 * _T}),
    (r"\bL4\b", {"bf16": 121 * _T, "fp16": 121 * _T, "tf32": 60 * _T, "fp32": 30.3 * _T}),
    # A10G (AWS): the A10's GA102 with 80 SMs at a lower clock; same per-precision peaks as the A10's data sheet
    (r"\bA10G?\b", {"bf16": 125 * _T, "fp16": 125 * _T, "tf32": 62.5 * _T, "fp32": 31.2 * _T}),
    (r"\bV100\b", {"fp16": 125 * _T, "fp32": 15.7 * _T}),  # SXM2; no bf16 / tf32 tensor cores
    (r"\bT4\b", {"fp16": 65 * _T, "fp32": 8.1 * _T}),  # no bf16 / tf32 tensor cores
    (r"\bRTX 4090\b", {"bf16": 165.2 * _T, "fp16": 165.2 * _T, "tf32": 82.6 * _T, "fp32": 82.6 * _T}),
    (r"\bRTX 3090\b", {"bf16": 71 * _T, "fp16": 71 * _T, "tf32": 35.6 * _T, "fp32": 35.6 * _T}),
]
"""Device-name patterns and their dense peak FLOP/s per precision (`bf16`, `fp16`, `tf32`, `fp32`)."""


def precision_kind(lightning_precision: str, tf32_matmuls: bool = False) -> str:
    """The table column for a Lightning precision string (`"bf16-mixed"`, `"16-mixed"`, `"32-true"`, ...)."""
    if lightning_precision.startswith("bf16"):
        return "bf16"
    if lightning_precision.startswith("16"):
        return "fp16"
    return "tf32" if tf32_matmuls else "fp32"


def peak_flops(device_name: str, kind: str) -> float | None:
    """The dense peak FLOP/s of one device named `device_name` in precision `kind`, or None if unknown."""
    for pattern, peaks in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return peaks.get(kind)
    return None
