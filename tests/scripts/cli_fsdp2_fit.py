"""`hf-lightning fit` under FSDP2 (`ModelParallelStrategy`, 2 CPU processes, gloo), for tests/test_final_save.py.

Usage: python cli_fsdp2_fit.py fit --config ... (the arguments of `hf-lightning`)

Registers the task `causal_lm_fsdp2`: the `causal_lm` preset whose module shards every GPT-2 block, then the root,
with `fully_shard` in `configure_model`. Lightning starts rank 1 by running this script again.
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `cli_fsdp2_fit.FSDP2CausalLM` resolves on both ranks

import torch  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from hf_lightning import TransformerModule  # noqa: E402
from hf_lightning.tasks.registry import get_task, register_task  # noqa: E402


class FSDP2CausalLM(TransformerModule):
    """Shards every GPT-2 block, then the root, with FSDP2."""

    def configure_model(self) -> None:
        if any(isinstance(p, DTensor) for p in self.model.parameters()):
            return
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def on_train_end(self) -> None:
        """Record that the weights were sharded during training (rank 0), next to the final model."""
        super().on_train_end()
        if self.trainer.is_global_zero:
            sharded = any(isinstance(p, DTensor) for p in self.model.parameters())
            os.makedirs(self.args.resolved_output_dir, exist_ok=True)
            with open(os.path.join(self.args.resolved_output_dir, "sharded.txt"), "w") as f:
                f.write(str(sharded))


register_task(dataclasses.replace(get_task("causal_lm"), name="causal_lm_fsdp2",
                                  module_class="cli_fsdp2_fit.FSDP2CausalLM"))

if __name__ == "__main__":
    torch.set_num_threads(1)
    from hf_lightning.cli import main

    main(sys.argv[1:])
