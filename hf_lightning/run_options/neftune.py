"""`neftune_noise_alpha`: NEFTune noise on the input embeddings while training, as HF adds it.

HF registers transformers' `neftune_post_forward_hook` on the input embeddings (of the base model inside a PEFT
model) when `train()` starts and removes it when training ends (T:1537-1538, 2045-2046; transformers
`integrations/neftune.py`). The hook adds uniform noise of magnitude `alpha / sqrt(seq_len * hidden)` only while
the embeddings are in training mode, so evaluations during training see clean embeddings. The noise comes from
torch's global generator, so a seeded run draws what HF's draws, and a resumed run what the uninterrupted one drew.
Unlike HF, the hook is also removed when training ends with an exception.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.integrations.neftune import activate_neftune, deactivate_neftune

__all__ = ["NEFTune"]


class NEFTune:
    """The NEFTune hook of one training run.

    Args:
        alpha: `neftune_noise_alpha`; None switches NEFTune off.
    """

    def __init__(self, alpha: float | None) -> None:
        self.alpha = alpha
        self._model: nn.Module | None = None
        self._handle: Any = None

    def start(self, model: nn.Module) -> None:
        """Add the noise hook to `model`'s input embeddings (once; a second start without `stop` is a no-op)."""
        if self.alpha is None or self._handle is not None:
            return
        self._model, self._handle = model, activate_neftune(model, self.alpha)

    def stop(self) -> None:
        """Remove the hook (and the embeddings' `neftune_noise_alpha`), if one was added."""
        if self._handle is None or self._model is None:
            return
        deactivate_neftune(self._model, self._handle)
        self._model, self._handle = None, None
