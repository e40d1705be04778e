"""`auto_micro_batch` under FSDP2: an agreement on one flag before each of FSDP's collectives, so a process that
runs out of memory inside a forward or backward never leaves the others waiting in a collective it will not join.

FSDP2 all-gathers a layer's parameters in its pre-forward (and pre-backward, with the previous layer's prefetched)
and reduce-scatters its gradients in its post-backward. Each of these goes through the group's `AllGather` /
`ReduceScatter` communication object (`FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter`): here
`AgreeingAllGather` / `AgreeingReduceScatter`, which first run `FailureAgreement.check`, one all-reduce (max) of a
flag that is 0 on every process still running, and only then FSDP's own collective.

Why no process is left waiting: every one of FSDP's collectives is preceded by a flag all-reduce on the
agreement's group, and a process that fails (an out-of-memory error anywhere in its forward or backward, FSDP's own
buffer allocations included: they happen before the flag) goes straight from its error to the end of its try, where
it joins the next flag all-reduce with 1 (`FailureAgreement.any_failed`). Up to its failure it has entered each
collective the others entered; the next one the others enter is a flag all-reduce (before an FSDP collective, or at
the end of their own try), which it joins. Whoever reads 1 from a flag in a hook raises `PeerOutOfMemoryError` (an
out-of-memory error for the retry rule) and issues nothing more in this try; its `any_failed` then answers without
a collective, since the agreement has happened. After a failed try every process calls FSDP's `reset_iter_state`
(no collective) before the retry.

Not covered: an out-of-memory error raised inside the collective call itself (the communication library's own
buffers, after the flag said 0). It is re-raised as a `RuntimeError` that the retry rule does not catch, so the
failing process stops with it; the others stay in the collective until the process group's timeout (`ddp_timeout`,
1800 s by default) or until torchrun ends them once the failing process has exited: a loud failure, not a retry.
"""

from __future__ import annotations

import torch
from torch import distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

__all__ = ["AgreeingAllGather", "AgreeingReduceScatter", "FailureAgreement", "PeerOutOfMemoryError",
           "install_agreement"]


class PeerOutOfMemoryError(torch.OutOfMemoryError):
    """Raised on a process that did not run out of memory when another one did (the agreement said so): the try
    ends on every process, and the update is retried with smaller micro-batches."""


class FailureAgreement:
    """One flag all-reduce (max) per agreement point on `group` (module docstring).

    Args:
        group: the process group of the flags (FSDP's data-parallel group).
        device: where the flag lives (the device the group communicates on).
    """

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group = group
        self._flag = torch.zeros(1, dtype=torch.int32, device=device)  # allocated once: no allocation to fail later
        self.peer_failed = False
        """Whether a flag in a hook has read 1 in the try under way (the agreement has happened)."""
        self.checks = 0
        """Flag all-reduces run before FSDP's collectives (for the cost it adds)."""

    def _all_reduce(self, failed: bool) -> bool:
        self._flag.fill_(1 if failed else 0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(self._flag.item())

    def check(self) -> None:
        """Before one of FSDP's collectives: agree that no process has failed.

        Raises:
            PeerOutOfMemoryError: another process ran out of memory (it has ended its try).
        """
        self.checks += 1
        if self.peer_failed or self._all_reduce(False):
            self.peer_failed = True
            raise PeerOutOfMemoryError("auto_micro_batch: another process ran out of memory in this update")

    def any_failed(self, failed: bool) -> bool:
        """At the end of a try: whether any process failed (no collective when a hook already learnt it)."""
        if self.peer_failed:
            self.peer_failed = False
            return True
        return self._all_reduce(failed)


def _collective_error(name: str, error: Exception) -> RuntimeError:
    return RuntimeError(f"auto_micro_batch: FSDP's {name} failed inside the collective ({error}); this cannot be "
                        "retried (the other processes are in it): the run stops.")


class AgreeingAllGather(DefaultAllGather):
    """FSDP's default all-gather, after `FailureAgreement.check`."""

    def __init__(self, agreement: FailureAgreement) -> None:
        self.agreement = agreement

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        self.agreement.check()
        try:
            return super().__call__(output_tensor, input_tensor, group, async_op)
        except Exception as error:  # noqa: BLE001  # any error here leaves the others in the collective
            raise _collective_error("all-gather", error) from error


class AgreeingReduceScatter(DefaultReduceScatter):
    """FSDP's default reduce-scatter, after `FailureAgreement.check`."""

    def __init__(self, agreement: FailureAgreement) -> None:
        self.agreement = agreement

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: dist.ReduceOp | dist.ReduceOp.RedOpType, async_op: bool = False) -> dist.Work:
        self.agreement.check()
        try:
            return super().__call__(output_tensor, input_tensor, group, op, async_op)
        except Exception as error:  # noqa: BLE001  # any error here leaves the others in the collective
            raise _collective_error("reduce-scatter", error) from error


def install_agreement(model: torch.nn.Module, group: dist.ProcessGroup, device: torch.device) -> FailureAgreement:
    """Give every FSDP group of `model` the agreeing communication objects of one new `FailureAgreement`.

    Raises:
        ValueError: `model` has no FSDP module (not sharded with `fully_shard`).
    """
    agreement = FailureAgreement(group, device)
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise ValueError("auto_micro_batch under ModelParallelStrategy needs a model sharded with FSDP2 "
                         "(`fully_shard`); this one has no FSDP module.")
    for module in modules:
        # a communication object the user set (`set_custom_all_gather` / `set_custom_reduce_scatter`) would be
        # replaced: refused rather than silently dropped
        for group_ in module._get_fsdp_state()._fsdp_param_groups:
            for comm, default in ((group_._all_gather_comm, DefaultAllGather),
                                  (group_._reduce_scatter_comm, DefaultReduceScatter)):
                if not isinstance(comm, default | AgreeingAllGather | AgreeingReduceScatter):
                    raise ValueError(
                        f"auto_micro_batch=True under FSDP2 puts its out-of-memory agreement in FSDP's "
                        f"communication objects, but {type(module).__name__} already has a custom one "
                        f"({type(comm).__name__}); drop auto_micro_batch or the custom all-gather / reduce-scatter.")
        module.set_custom_all_gather(AgreeingAllGather(agreement))
        module.set_custom_reduce_scatter(AgreeingReduceScatter(agreement))
    return agreement

