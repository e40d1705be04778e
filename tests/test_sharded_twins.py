"""The CPU twins of tests/test_gpu.py's sharded scenarios: what one GPU cannot show (collectives and sharding across
ranks: tests/test_gpu.py runs on min(2, GPUs) ranks, 1 on a one-GPU machine), on 2 CPU processes (gloo).

ONE torchrun launch of tests/scripts/sharded_twins.py runs every scenario (see its docstring); each test reads its
scenario's JSON. The same launch runs the parity scenarios (no dropout), which are compared with the same run in ONE
process (in this pytest process) and with HF's Trainer in one process: losses, grad norms, final weights.

The FSDP2 32-true resume is tests/test_checkpoint_processes.py's "fsdp2", FSDP1 32-true
tests/test_fsdp1.py's, uneven evaluation tests/test_sharded_eval.py's. DeepSpeed has no CPU twin (Lightning refuses
DeepSpeed without CUDA); its optimizers are checked on the CPU in tests/test_deepspeed_cpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]

EXPECTED = {
    "fsdp2-bf16": ("HFFSDP2Strategy", "bf16-mixed", ["torch.bfloat16"]),
    "fsdp2-fp16": ("HFFSDP2Strategy", "16-mixed", ["torch.float16"]),
    "fsdp1-bf16": ("HFFSDPStrategy", "bf16-mixed", ["torch.bfloat16"]),
}
"""Per scenario: the strategy, the Lightning precision, the dtype of a layer's weight inside its forward."""


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twins")
    env = {**os.environ, "HF_DATASETS_CACHE": str(out / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*LAUNCH, str(REPO / "tests" / "scripts" / "sharded_twins.py"), str(out)], cwd=out, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _losses(history: list[dict], after: int = 0) -> list[tuple]:
    return [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"]) for e in history
            if "loss" in e and e["step"] > after]


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_sharded_mixed_precision_on_two_ranks_resumes_exactly(twins: Path, scenario: str) -> None:
    """Sharded over 2 ranks, gathering in the policy's dtype, and the run resumed from checkpoint-4 replays updates
    5 and 6 of the uninterrupted one exactly (same processes, same kernels: bit for bit on the CPU)."""
    data = json.loads((twins / f"{scenario}.json").read_text())
    strategy, precision, dtypes = EXPECTED[scenario]
    assert (data["strategy"], data["precision"], data["seen_dtypes"]) == (strategy, precision, dtypes)
    assert data["world_size"] == 2 and data["sharded"] is True
    assert data["scaler"] is (precision == "16-mixed")
    full, resumed = _losses(data["full"]), _losses(data["resumed"], after=4)
    assert [e[0] for e in full] == [1, 2, 3, 4, 5, 6] and resumed == full[4:]
    files = set(os.listdir(twins / scenario / "full" / "checkpoint-4"))
    assert "optimizer_sharded" in files and ("scaler.pt" in files) is (precision == "16-mixed")  # the scaler's state
    for step in (4, 6):
        saved = load_file(str(twins / scenario / "full" / f"checkpoint-{step}" / "model.safetensors"))
        assert {str(t.dtype) for t in saved.values()} == {"torch.float32"}  # the fp32 masters, gathered
    final = load_file(str(twins / scenario / "resumed" / "checkpoint-6" / "model.safetensors"))
    for name, tensor in load_file(str(twins / scenario / "full" / "checkpoint-6" / "model.safetensors")).items():
        assert final[name].equal(tensor), name


@pytest.mark.distributed
def test_fp16_under_fsdp2_skips_overflowing_updates_on_every_rank_alike(twins: Path) -> None:
    """The fp16 loss times the grad scaler's 2^16 overflows float16 in the backward: the first updates are skipped
    (grad norm not finite, as HF logs it), counted as updates, and the learning rate waits for the first real step."""
    entries = [e for e in json.loads((twins / "fsdp2-fp16.json").read_text())["full"] if "loss" in e]
    skipped = [e["step"] for e in entries if e["grad_norm"] != e["grad_norm"]]
    assert skipped and skipped == list(range(1, len(skipped) + 1)) and len(skipped) < 6
    rates = [e["learning_rate"] for e in entries]
    assert rates[: len(skipped) + 1] == [rates[0]] * (len(skipped) + 1)  # the scheduler was not stepped


@pytest.mark.distributed
def test_fsdp2_bf16_on_two_ranks_trains_as_hfs_cpu_run(twins: Path) -> None:
    """HF's `fsdp` on CPU processes is DDP (accelerate's MULTI_CPU) with bf16 autocast: our DDP bf16 twin. FSDP2's
    policy gathers bf16 weights and casts the root's outputs (the loss) to bf16 (accelerate's `output_dtype`), so the
    values agree to bf16's resolution (2^-7 relative), not bit for bit; FSDP1 (no output cast) agrees closer."""
    reference = _losses(json.loads((twins / "ddp-bf16.json").read_text())["full"])
    fsdp2 = _losses(json.loads((twins / "fsdp2-bf16.json").read_text())["full"])
    fsdp1 = _losses(json.loads((twins / "fsdp1-bf16.json").read_text())["full"])
    assert [e[0] for e in fsdp2] == [e[0] for e in reference] == [1, 2, 3, 4, 5, 6]
    for ours, ref in zip(fsdp2, reference):
        assert ours[1:3] == pytest.approx(ref[1:3], rel=2.0 ** -7), ours[0]
        assert ours[3] == ref[3]
    for ours, ref in zip(fsdp1, reference):
        assert ours[1:3] == pytest.approx(ref[1:3], rel=2.0 ** -9), ours[0]


UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
"""The largest relative error of one rounding to the format (8 and 11 significand bits)."""

PARITY = {"parity-fsdp2-bf16": ("torch.bfloat16", [16, 128]), "parity-fsdp2-fp16": ("torch.float16", [16, 128]),
          "parity-fsdp1-bf16": ("torch.bfloat16", None)}
"""Per parity scenario: the policy's dtype, the local shard of the watched (32, 128) weight (FSDP1: flat shards)."""


def _in_this_process(run):
    """`run()` in this process, which is then left as before: no process group (a 1-device FSDP run makes one),
    accelerate's state reset, the environment (Lightning's MASTER_PORT, WORLD_SIZE...) restored. Returns what `run`
    returns, or the exception it raised (the test of that scenario raises it; the other scenarios still run)."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    environ, threads = dict(os.environ), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run()
    except Exception as error:  # noqa: BLE001 - handed to the scenario's test
        return error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict], dict]]:
    """Each parity scenario in one process: ours ("<scenario>", with the dtypes a layer's weight had in its forwards
    as a third item) and HF's ("hf-<scenario>"): log history and final weights."""
    import sys

    sys.path.insert(0, str(SCRIPTS))
    import sharded_twins as script

    out = tmp_path_factory.mktemp("one_process")
    runs: dict = {}
    for name in PARITY:
        def ours(name: str = name) -> tuple:
            trainer = script.parity_trainer(name, str(out / name), processes=1)
            seen = script._watch(trainer)
            trainer.train()
            trainer.save_model(str(out / name / "final"))
            return trainer.state.log_history, load_file(str(out / name / "final" / "model.safetensors")), seen

        def hf(name: str = name) -> tuple:
            trainer = script.hf_parity_trainer(name, str(out / f"hf-{name}"))
            trainer.train()
            trainer.save_model(str(out / f"hf-{name}" / "final"))
            return trainer.state.log_history, load_file(str(out / f"hf-{name}" / "final" / "model.safetensors"))

        runs[name] = _in_this_process(ours)
        if name.endswith("fsdp1-bf16"):  # HF's one-process bf16 run is that of parity-fsdp2-bf16
            runs[f"hf-{name}"] = runs["hf-parity-fsdp2-bf16"]
        else:
            runs[f"hf-{name}"] = _in_this_process(hf)
    return runs


def _same_training(got: tuple, want: tuple, u: float, what: str) -> None:
    """Two runs of the same 6 AdamW updates on the same data at unit roundoff `u`, from the same initial weights.

    - Losses and grad norms within 4u (relative). A logged loss is a token-weighted mean of micro-batch means, each
      rounded to the format once (FSDP2 casts the root's output, the loss, to the policy's dtype: accelerate's
      `output_dtype`): within u of its exact value, so two runs are within 2u; the other 2u cover the weights'
      drift after the first update (below). A grad norm is float32 over gradients whose upstream scale (the loss's
      share of the window) passed the same cast in the backward: the same bound. Measured on this CPU: 1.9u
      (losses, FSDP2 bf16 on 2 processes vs 1), 2.1u (grad norms, against HF's bf16).
    - Final weights: per tensor, |got - want| within 16u of |want - initial| (what training moved). The gradients
      differ by the rounding of their low-precision reduction (2 ranks' bf16 halves summed in bf16, or one
      process's bf16 gradient) and AdamW divides each by its own running magnitude, so elements with small
      gradients move by noise-sized steps of the learning rate's size. Measured: up to 8.6u for bf16, 6u for fp16
      (the same multiple of each format's rounding: the differences are rounding, not a fault of sharding; a rank's
      gradient left unreduced, or a shard not updated, moves a tensor by the order of its whole change).
    - The key third of each `attn.c_attn.bias`: its true gradient is exactly 0 (a constant added to every key
      shifts all of a query's scores equally, which softmax ignores), so its computed gradient is rounding noise
      that AdamW turns into full learning-rate steps of either sign. AdamW moves an element by at most the
      learning rate times |m_hat| / sqrt(v_hat), which Cauchy-Schwarz bounds by 1.016 over 6 updates with betas
      (0.9, 0.999) (eps only lowers it; weight decay is 0): that slice is held to 2 x 1.02 x the learning rates' sum
      (the two runs moving it apart as far as they can), which also rejects a NaN.
    """
    a, b = _losses(got[0]), _losses(want[0])
    assert [e[0] for e in a] == [e[0] for e in b] == [1, 2, 3, 4, 5, 6], what
    for x, y in zip(a, b):
        assert x[1:3] == pytest.approx(y[1:3], rel=4 * u), (what, x, y)
        assert x[3] == pytest.approx(y[3], rel=1e-12), what  # the same schedule: no update skipped in either
    initial = _initial_weights()
    steps = sum(e[3] for e in a)  # learning rates of the 6 updates
    assert sorted(got[1]) == sorted(want[1]), what
    for name, value in want[1].items():
        x, y, start = got[1][name].double(), value.double(), initial[name].double()
        assert got[1][name].dtype == torch.float32, (what, name)  # the float32 masters, gathered
        if name.endswith("attn.c_attn.bias"):
            keys = slice(x.numel() // 3, 2 * x.numel() // 3)
            assert bool((x[keys] - y[keys]).abs().max() <= 2 * 1.02 * steps), (what, name)
            x, y, start = x.clone(), y.clone(), start.clone()
            x[keys] = y[keys] = start[keys] = 0.0
        ratio = float((x - y).norm() / (y - start).norm())
        assert ratio <= 16 * u, f"{what}: {name} differs by {ratio / u:.1f}u of its change"


def _initial_weights() -> dict:
    from helpers import tiny_gpt2

    return tiny_gpt2(dropout=0.0, seed=0).state_dict()


def _parity_twin(twins: Path, name: str) -> tuple[list[dict], dict]:
    data = json.loads((twins / f"{name}.json").read_text())
    expected_dtype, local_shape = PARITY[name]
    assert data["world_size"] == 2
    # every forward on 2 ranks saw the whole (32, 128) weight in the policy's dtype: gathered, of a (16, 128) shard
    assert data["seen"] == [[expected_dtype, [32, 128]]] and data["local_shape"] == local_shape
    return data["full"], load_file(str(twins / name / "final" / "model.safetensors"))


def _hf_refuses_fsdp_in_one_cpu_process(tmp_path: Path) -> None:
    """Why the HF reference is its one-process run without `fsdp` (`hf_parity_trainer`)."""
    import transformers
    from helpers import lm_dataset, tiny_gpt2

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf-fsdp"), use_cpu=True, bf16=True,
                                          fsdp="full_shard auto_wrap", report_to="none")
    with pytest.raises(ValueError, match="Using fsdp only works in distributed training"):
        transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=4))


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", list(PARITY))
def test_sharded_mixed_precision_on_two_ranks_trains_as_one_process_and_as_hf(
        twins: Path, one_process: dict, scenario: str, tmp_path: Path) -> None:
    """FSDP2 bf16 / fp16 and FSDP1 bf16 on 2 CPU processes against the same run in one process (same precision,
    same 8 samples per update) and against HF's Trainer in one process (HF's `fsdp` cannot run on one CPU process
    and is DDP on several: `hf_parity_trainer`), bf16 runs against HF's bf16; fp16 against HF's `fp16=True` on the
    CPU, which trains in float32 (so the bound is fp16's rounding against exact float32)."""
    _hf_refuses_fsdp_in_one_cpu_process(tmp_path)
    u = UNIT_ROUNDOFF[scenario[-4:]]
    two = _parity_twin(twins, scenario)
    for run in (one_process[scenario], one_process[f"hf-{scenario}"]):
        if isinstance(run, Exception):
            raise run
    history, weights, seen = one_process[scenario]
    assert set(seen) == {PARITY[scenario][0]}  # one process gathers in the policy's dtype too
    _same_training(two, (history, weights), u, f"{scenario}: 2 processes vs 1")
    _same_training(two, one_process[f"hf-{scenario}"], u, f"{scenario}: 2 processes vs HF in one")
