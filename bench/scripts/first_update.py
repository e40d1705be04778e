"""A Lightning callback for `hf-lightning fit --trainer.callbacks+=first_update.FirstUpdateExit`
(bench/bench_startup.py): prints `FIRST_UPDATE <time.time()>` at the end of the first optimizer update and ends
the process at once."""

import os
import time

import lightning.pytorch as pl


class FirstUpdateExit(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print(f"FIRST_UPDATE {time.time():.6f}", flush=True)
        os._exit(0)
