"""`report_to`: which Lightning logger each HF integration name becomes, checked when the arguments are built.

The names with a Lightning logger become that logger (`build_loggers`, imported lazily). The other integration
names of HF (`clearml`, `dvclive`, `trackio`...) raise one error: hf_lightning does not drive HF's integration
callbacks for them (untested here, and several need a server), and a silently missing logger is worse than an
error. `all` is every installed integration, as in HF, resolved when the arguments are built.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

__all__ = ["HF_CALLBACK_INTEGRATIONS", "LIGHTNING_LOGGERS", "NO_LIGHTNING_LOGGER", "build_loggers",
           "resolve_report_to"]

HF_CALLBACK_INTEGRATIONS = ("kubeflow",)
"""`report_to` names served by HF's own integration callback (a `TrainerCallback`, which our flow drives as HF's):
`kubeflow` is HF's `KubeflowCallback` (progress to the Kubeflow Trainer controller), added by HF itself when
`KUBEFLOW_TRAINER_SERVER_URL` is set (TA:1603-1607)."""

LIGHTNING_LOGGERS: dict[str, tuple[str | None, str | None]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "csv": (None, None),  # hf_lightning's own name: Lightning's CSVLogger (no package needed)
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"),
}
"""`report_to` name -> (module that must be importable, pip package that provides it)."""

NO_LIGHTNING_LOGGER: dict[str, tuple[str | None, str]] = {
    "azure_ml": ("azureml", "Lightning has no Azure ML logger"),
    "clearml": ("clearml", "Lightning has no ClearML logger"),
    "codecarbon": ("codecarbon", "Lightning has no CodeCarbon logger"),
    "dagshub": ("dagshub", "Lightning has no DagsHub logger (DagsHub speaks MLflow: use `mlflow` with "
                           "`MLFLOW_TRACKING_URI`)"),
    "dvclive": ("dvclive", "Lightning has no DVCLive logger (dvclive ships one: `dvclive.lightning.DVCLiveLogger`)"),
    "flyte": ("flytekit", "Lightning has no Flyte logger"),
    "neptune": ("neptune", "Lightning 2.6 dropped its Neptune logger (Neptune was sunset)"),
    "swanlab": (
        "swanlab", "Lightning has no SwanLab logger (swanlab ships one: `swanlab.integration.pytorch_lightning`)"
    ),
    "trackio": ("trackio", "Lightning has no trackio logger"),
}
"""HF integration names hf_lightning refuses, with the module HF checks for `all` and the reason."""


def _installed(module: str | None) -> bool:
    return module is None or importlib.util.find_spec(module) is not None


def resolve_report_to(value: Any) -> tuple[list[str], list[str]]:
    """HF's normalisation of `report_to` (`none` -> [], a name -> [name], `all` -> every installed integration),
    and the problems with the result.

    Returns:
        (names, problems): the list to store on the arguments, and one message per name that cannot be honoured.
    """
    names, problems = _resolve(value)
    if _in_kubeflow_trainjob() and "kubeflow" not in names:  # HF's rule, after `none` / `all` (TA:1603-1607)
        names = [*names, "kubeflow"]
    return names, problems


def _in_kubeflow_trainjob() -> bool:
    """HF's `is_kubeflow_available`: inside a Kubeflow TrainJob, unless `DISABLE_KUBEFLOW_INTEGRATION=TRUE`."""
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


def _resolve(value: Any) -> tuple[list[str], list[str]]:
    if value is None or value == "none" or value == ["none"]:
        return [], []
    names = [value] if isinstance(value, str) else list(value)
    if names == ["all"]:
        installed = [n for n, (module, _) in LIGHTNING_LOGGERS.items() if module is not None and _installed(module)]
        refused = [n for n, (module, _) in NO_LIGHTNING_LOGGER.items() if module is not None and _installed(module)]
        if refused:
            return installed, [
                f"`report_to`='all' includes {', '.join(refused)} (installed), which hf_lightning cannot report to "
                f"({'; '.join(NO_LIGHTNING_LOGGER[n][1] for n in refused)}); list the wanted ones instead, e.g. "
                f"report_to={installed!r}."
            ]
        return installed, []
    problems = []
    for name in names:
        if name in LIGHTNING_LOGGERS:
            module, package = LIGHTNING_LOGGERS[name]
            if not _installed(module):
                problems.append(f"`report_to` {name!r} needs the `{package}` package: pip install {package}.")
        elif name in HF_CALLBACK_INTEGRATIONS:
            continue
        elif name in NO_LIGHTNING_LOGGER:
            problems.append(f"`report_to` {name!r} is not supported: {NO_LIGHTNING_LOGGER[name][1]}; pass a "
                            "Lightning logger in `lightning_kwargs[\"logger\"]` (CLI: `trainer.logger`).")
        else:
            allowed = ", ".join([*LIGHTNING_LOGGERS, *HF_CALLBACK_INTEGRATIONS, "all", "none"])
            problems.append(f"`report_to` entry {name!r} is not valid; allowed: {allowed}.")
    return names, problems


def _logger(name: str, args: Any) -> Any:
    """The Lightning logger for one `report_to` name, configured the way HF's integration callback is."""
    from lightning.pytorch import loggers

    out = args.resolved_output_dir
    if name == "tensorboard":
        custom = os.getenv("TENSORBOARD_LOGGING_DIR")  # HF's TensorBoardCallback honours it too
        if custom:
            return loggers.TensorBoardLogger(save_dir=os.path.expanduser(custom), name="", version="",
                                             default_hp_metric=False)
        return loggers.TensorBoardLogger(save_dir=out, name="runs", version=args.run_name, default_hp_metric=False)
    if name == "csv":
        return loggers.CSVLogger(save_dir=out, name="csv", version=args.run_name)
    if name == "wandb":  # HF's WandbCallback: project from WANDB_PROJECT, run name from run_name
        return loggers.WandbLogger(name=args.run_name, project=os.getenv("WANDB_PROJECT", "huggingface"),
                                   save_dir=os.getenv("WANDB_DIR", "."))
    if name == "mlflow":  # HF's MLflowCallback: MLFLOW_TRACKING_URI else mlflow's default store, experiment, run name
        import mlflow

        return loggers.MLFlowLogger(experiment_name=os.getenv("MLFLOW_EXPERIMENT_NAME", "Default"),
                                    run_name=args.run_name, tracking_uri=mlflow.get_tracking_uri())
    if name == "comet_ml":  # HF's CometCallback: project from COMET_PROJECT_NAME, run name as the experiment name
        return loggers.CometLogger(project=os.getenv("COMET_PROJECT_NAME"), name=args.run_name)
    raise ValueError(f"no Lightning logger for report_to {name!r}")  # resolve_report_to refused it already


def build_loggers(args: Any) -> list[Any] | bool:
    """The Lightning loggers for `args.report_to` (already resolved), or False for none."""
    return [_logger(name, args) for name in args.report_to if name not in HF_CALLBACK_INTEGRATIONS] or False

