"""Experiment tracking: W&B by default (never a login prompt), CSV or TensorBoard as alternatives, and the lineage
every run records: resolved config, package versions, git commit, dataset fingerprints, and on W&B as artifacts
(the dashboard's lineage graph and model registry) the data a run trained on and the model it exported, the trained
models an evaluation used and the predictions and metrics it wrote; beside those, the code that computed them
(``code.json``: a digest of the package's source with its commit).

W&B mode: ``WANDB_MODE`` wins when set; otherwise online when credentials exist (``WANDB_API_KEY`` or a netrc entry
for the W&B host), offline when they do not. Offline runs land in ``<save_dir>/wandb/offline-run-*/`` and can be
read back with ``wandb leet inspect --json RUN.wandb`` or synced later with ``wandb sync``.
"""

from __future__ import annotations

import netrc
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from omnimed.data.artifacts import files_digest, package_versions

# a key that holds a secret: api_key, hf_token, access_token, password, ... but not special_tokens, pad_token or
# max_new_tokens, which are configuration the run must record
_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|password|passwd|credential|^token$|(auth|access|api|hf|bearer|refresh|session|wandb)[_-]?token)",
    re.IGNORECASE,
)
LOGGERS = ("wandb", "csv", "tensorboard", "none")


@dataclass
class LoggerConfig:
    """Experiment tracking: wandb (default; offline without credentials) | csv | tensorboard | none."""

    name: str = "wandb"
    project: str = "omnimed"
    entity: Optional[str] = None
    group: Optional[str] = None
    job_type: Optional[str] = None
    tags: list[str] = field(default_factory=list)


def git_state(path: str | Path = ".") -> dict[str, Any]:
    """Commit of the checkout holding ``path`` and whether it has uncommitted changes (None outside git)."""
    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


#: what an evaluation run writes beside ``metrics.json``: the code that computed it (:func:`code_version`), so a
#: reproduced table that keeps a finished run can say when today's code differs (:func:`other_code`): a change to a
#: metric or a pipeline otherwise passes unseen, since the run's config is still the same
CODE_FILE = "code.json"
PACKAGE = Path(__file__).resolve().parent


def source_digest() -> str:
    """sha256 over the package's Python files (their paths and bytes): equal digests, the same code. Taken once
    per process, with :func:`code_version`, so it names the code the process started with."""
    return _code_version()["source"]


def code_version() -> dict[str, Any]:
    """What :data:`CODE_FILE` holds: the source digest, the commit and whether the checkout had uncommitted
    changes (commit and dirty are None outside git). Taken once per process, at first call (an evaluation's
    ``start_run``), so an edit made while a run computes is not credited to it."""
    return dict(_code_version())


@lru_cache(maxsize=1)
def _code_version() -> dict[str, Any]:
    return {"source": files_digest(PACKAGE, PACKAGE.rglob("*.py")), **git_state(PACKAGE)}


def scrub_secrets(obj: Any) -> Any:
    """Drop values whose key looks like a secret, at any depth, so they never reach a config log or W&B."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if _SECRET_KEY.search(str(k)) else scrub_secrets(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_secrets(v) for v in obj]
    return obj


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = re.sub(r"^https?://", "", os.environ.get("WANDB_BASE_URL", "api.wandb.ai")).rstrip("/")
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode() -> str:
    """online | offline | disabled: ``WANDB_MODE`` if set, else online only with credentials."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode
    if mode is not None:  # set but empty (`WANDB_MODE= cmd`): W&B itself would reject it, so read it as unset
        os.environ.pop("WANDB_MODE")
    return "online" if wandb_has_credentials() else "offline"


def build_logger(
    name: str,
    *,
    save_dir: str | Path,
    project: str,
    run_name: str,
    group: str | None = None,
    job_type: str | None = None,
    tags: list[str] | None = None,
    entity: str | None = None,
    trainer: bool = True,
):
    """A Lightning logger for ``name`` (wandb | csv | tensorboard | none); None for ``none``. A job that does not
    train (``trainer=False``: an evaluation, a build) gets a :class:`WandbRun` for ``wandb`` instead of Lightning's
    ``WandbLogger``, which would import Lightning only to log."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    if name == "none":
        return None
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(save_dir), name="csv", version=run_name)
    if name == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(save_dir), name="tensorboard", version=run_name)
    if name == "wandb":
        os.environ.setdefault("WANDB_SILENT", "true")
        init = dict(project=project, entity=entity, name=run_name, group=group, job_type=job_type,
                    tags=list(tags or []), mode=wandb_mode())
        if not trainer:
            return WandbRun(dir=str(save_dir), resume="allow", **init)
        from lightning.pytorch.loggers import WandbLogger

        logger = WandbLogger(save_dir=str(save_dir), **init)
        # Lightning passes anonymous=None to wandb.init, which W&B now warns about on every run; not setting it
        # is the same run without the warning
        logger._wandb_init.pop("anonymous", None)
        return logger
    raise ValueError(f"unknown logger {name!r}; expected one of {', '.join(LOGGERS)}")


def log_lineage(logger, config: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the resolved config (secrets scrubbed), package versions, the code's version and ``extra`` (e.g. dataset
    fingerprints) with the logger; returns what was logged."""
    lineage = {
        "config": scrub_secrets(config),
        "versions": package_versions(),
        "git": code_version(),
        **(extra or {}),
    }
    if logger is None:
        return lineage
    logger.log_hyperparams(lineage)
    return lineage


class WandbRun:
    """A W&B run with the part of Lightning's ``WandbLogger`` interface that jobs which do not train use
    (``log_hyperparams``, ``log_metrics``, ``log_table``, ``finalize``, ``experiment``): importing Lightning for its
    logger took 6 of a BM25 evaluation's 13 s. The run starts at first use, as Lightning's does."""

    def __init__(self, **init: Any):
        self._init = init
        self._run = None

    @property
    def experiment(self):
        if self._run is None:
            import wandb

            self._run = wandb.init(**self._init)
        return self._run

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.experiment.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self.experiment.log(dict(metrics))

    def log_table(self, key: str, columns: list[str], data: list[list[Any]]) -> None:
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data)})

    def finalize(self, status: str) -> None:
        """Nothing to flush before :func:`close_logger` finishes the run."""


def is_wandb(logger) -> bool:
    """Whether ``logger`` writes to W&B (a :class:`WandbRun`, or Lightning's ``WandbLogger`` where Lightning is
    loaded: a process that has not imported it cannot hold one)."""
    if isinstance(logger, WandbRun):
        return True
    loggers = sys.modules.get("lightning.pytorch.loggers")
    return loggers is not None and isinstance(logger, loggers.WandbLogger)


def _wandb_run(logger):
    """The W&B run behind a logger, None for other loggers."""
    return logger.experiment if is_wandb(logger) else None


def artifact_name(text: str) -> str:
    """``text`` with what W&B refuses in an artifact name (anything but letters, digits, ``-``, ``_``, ``.``) as
    ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "artifact"


def records_artifact_name(jsonl: Path) -> str:
    """The W&B dataset artifact a records file is a version of: its folder's name (``records-critic_data``) for
    a stage's or omnimed-data's ``records.jsonl``, else the file's stem."""
    return artifact_name(f"records-{jsonl.parent.name if jsonl.name == 'records.jsonl' else jsonl.stem}")


def _records_artifact(name: str, jsonl: Path, metadata: dict[str, Any]):
    """A dataset artifact holding ``jsonl`` by reference (checksummed, not copied): the stage that wrote it and a
    run that trains on it make the same version."""
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type="dataset", metadata=scrub_secrets(metadata))
    artifact.add_reference(jsonl.resolve().as_uri(), name=jsonl.name)
    return artifact


def log_records(logger, jsonl: Path, metadata: dict[str, Any]) -> None:
    """Log a built stage's records as the run's output artifact (alias ``latest``)."""
    run = _wandb_run(logger)
    if run is not None:
        run.log_artifact(_records_artifact(records_artifact_name(jsonl), jsonl, metadata), aliases=["latest"])


def use_dataset(logger, name: str, lineage: dict[str, Any]) -> None:
    """Declare the training data as the run's input artifact (type ``dataset``, the lineage in its metadata): a
    records file by reference (checksummed, not copied), a world built in-process by its recipe. Online this is
    ``run.use_artifact`` (offline, see :func:`_use`)."""
    run = _wandb_run(logger)
    if run is None:
        return
    import json

    import wandb

    if lineage.get("path"):
        artifact = _records_artifact(name, Path(lineage["path"]), lineage)
    else:
        artifact = wandb.Artifact(artifact_name(name), type="dataset", metadata=scrub_secrets(lineage))
        with artifact.new_file("lineage.json") as fh:
            json.dump(lineage, fh, sort_keys=True)
    _use(run, artifact)


def _use(run, artifact) -> None:
    """Declare ``artifact`` as the run's input. Online this is ``run.use_artifact``; offline W&B refuses
    ``use_artifact``, so the artifact is logged the way ``use_artifact`` logs a new one (``use_after_commit``),
    and ``wandb sync`` records it as the run's input."""
    if run.offline:
        run._log_artifact(artifact, use_after_commit=True)
    else:
        run.use_artifact(artifact)


def trained_models(config: Any) -> dict[str, Path]:
    """The omnimed exports a config points at (``checkpoints/<task>/<run>/hf`` and its ``adapter/``: a folder
    whose training run wrote ``versions.json``), by the model artifact name their training run logged
    (``<task>-<run>``), so an evaluation's inputs join the training runs' outputs in the lineage graph."""
    found: dict[str, Path] = {}
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, str) and item and len(item) < 4096:
            folder = Path(item).expanduser()
            export = folder.parent if folder.name == "adapter" else folder
            if export.name == "hf" and (export.parent / "versions.json").is_file() and folder.is_dir():
                run = export.parent
                found[artifact_name(f"{run.parent.name}-{run.name}")] = export.resolve()
    return found


def use_models(logger, config: dict[str, Any]) -> list[str]:
    """Declare the trained models ``config`` points at as the run's inputs (type ``model``, by reference to their
    folder, unchecksummed as :func:`log_model` logs them: the same folder gives the same version as the training
    run's output); returns their artifact names."""
    run = _wandb_run(logger)
    if run is None:
        return []
    import wandb

    models = trained_models(config)
    for name, folder in models.items():
        artifact = wandb.Artifact(name, type="model")
        artifact.add_reference(folder.as_uri(), checksum=False)
        _use(run, artifact)
    return sorted(models)


def log_evaluation(logger, name: str, files: list[Path], metadata: dict[str, Any]) -> None:
    """Log an evaluation's outputs (predictions and metrics, copied: they are small) as the run's output
    artifact of type ``evaluation``."""
    run = _wandb_run(logger)
    if run is None:
        return
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type="evaluation", metadata=scrub_secrets(metadata))
    for path in files:
        artifact.add_file(str(path), name=path.name)
    run.log_artifact(artifact, aliases=["latest"])


def log_model(logger, folder: Path, name: str, metadata: dict[str, Any]) -> None:
    """Log an exported model folder as the run's output artifact (type ``model``, alias ``latest``), by reference to
    the folder and without W&B's checksum: W&B hashes a file by mapping all of it into memory, which made the
    default job's memory peak (540 MB of weights on top of the training's; a run's folder is its own, and its
    ``versions.json`` says what made it)."""
    run = _wandb_run(logger)
    if run is None:
        return
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type="model", metadata=scrub_secrets(metadata))
    artifact.add_reference(Path(folder).resolve().as_uri(), checksum=False)
    run.log_artifact(artifact, aliases=["latest"])


def close_logger(logger) -> str | None:
    """End an evaluation's logging and return where its run lives (the W&B run folder, or the logger's folder).

    A W&B run is finished here: Lightning's ``finalize`` leaves it open, and the next job of a sweep in the same
    process (Hydra's basic launcher) would otherwise be logged into, or next to, this job's run."""
    if logger is None:
        return None
    logger.finalize("success")
    run_dir = wandb_run_dir(logger)
    if run_dir is None:
        return getattr(logger, "log_dir", None)
    logger.experiment.finish()
    return run_dir


def wandb_run_dir(logger) -> str | None:
    """Directory of the W&B run behind ``logger`` (offline or online), if it is a W&B logger."""
    return str(Path(logger.experiment.dir).parent) if is_wandb(logger) else None
