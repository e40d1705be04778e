"""accelerate's process-wide `AcceleratorState`, as HF's `Trainer.__init__` leaves it, for library trainers.

HF's constructor builds an accelerate `Accelerator`, which initialises accelerate's process-wide state; library code
that runs after `super().__init__()` reads it through accelerate's free functions. TRL's `GRPOTrainer` / `RLOOTrainer`
call `accelerate.utils.set_seed(args.seed, device_specific=True)`, which adds `AcceleratorState().process_index` to
the seed (and raises when no `Accelerator` was ever built). hf_lightning builds no `Accelerator` (Lightning owns
devices and precision), so while `use_as_transformers_trainer()` is active the facade gives accelerate the state an
`Accelerator` of this process would: the process layout of the launcher (one process: no process group; several
started by torchrun / srun: the process group, initialised as `main_process_first` does, which Lightning's strategy
then joins), and the arguments' mixed precision.
"""

from __future__ import annotations

from hf_lightning.args import TrainingArguments
from hf_lightning.args.process import _init_process_group, current_layout

__all__ = ["provide_accelerate_state"]


def provide_accelerate_state(args: TrainingArguments) -> None:
    """Initialise accelerate's `AcceleratorState` for this process unless something (an `Accelerator`, a previous
    trainer) already did; processes started by Lightning's own launcher are left alone (their group does not exist
    until the strategy starts).

    Args:
        args: the run's arguments (`use_cpu`, `mixed_precision`).
    """
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state:
        return
    layout = current_layout()
    if layout.world_size > 1:
        if layout.source == "lightning":
            return
        if layout.source != "torch.distributed":
            _init_process_group(layout, args.use_cpu)
    # `_from_accelerator`: the state an `Accelerator()` builds (accelerate refuses a bare `AcceleratorState()`)
    from accelerate.utils import TorchDynamoPlugin

    AcceleratorState(mixed_precision=args.mixed_precision, cpu=args.use_cpu, dynamo_plugin=TorchDynamoPlugin(),
                     _from_accelerator=True)
