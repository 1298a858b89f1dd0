"""Which runs of a reproduced table are already done: the composed config of an ``omnimed-evaluate`` run as text
(what it computes, names aside), and the finished runs, of this table or another, whose saved config is that text,
so a stopped table resumes and tables that share runs compute them once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def evaluate_configs() -> Iterator[None]:
    """A Hydra context in which ``compose("evaluate", ...)`` composes what ``omnimed-evaluate`` would run."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from omnimed.conf import conf_dir
    from omnimed.evaluation.config import register_evaluate_configs

    register_evaluate_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        yield


def compose_run(overrides: list[str], failure: str):
    """The config ``omnimed-evaluate`` runs under ``overrides``, Hydra's own settings included (inside
    :func:`evaluate_configs`). A run that does not compose is a :class:`ManifestError`: ``failure``, then Hydra's
    reason (it raises several kinds; all mean the run cannot start)."""
    from hydra import compose

    from omnimed.tables.manifest import ManifestError

    try:
        return compose("evaluate", overrides=overrides, return_hydra_config=True)
    except Exception as exc:
        raise ManifestError(f"{failure}: {exc}") from exc


def _plain(cfg) -> dict:
    """A composed or saved config as plain data, less what only names, groups or places the run (Hydra's own
    settings, ``run_name``, ``experiment``, ``logger.group``: each table's W&B group; ``paths``: where the project
    root, checkpoints and caches are, so ``paths.root=/abs/checkout`` reads the runs made with the default ``.``)."""
    from omegaconf import OmegaConf

    return _unplaced(OmegaConf.to_container(cfg, resolve=False, enum_to_str=True))


def _unplaced(plain: dict) -> dict:
    """``plain`` less what :func:`_plain` leaves out: also applied to a config stored before a key joined them."""
    out = {key: value for key, value in plain.items() if key not in ("hydra", "run_name", "experiment", "paths")}
    if isinstance(out.get("logger"), dict):
        out["logger"] = {key: value for key, value in out["logger"].items() if key != "group"}
    return out


def run_config_text(cfg) -> str:
    """A composed ``omnimed-evaluate`` config as YAML (:func:`_plain`): two runs with the same text compute the same
    thing, in one table or two."""
    import yaml

    return yaml.safe_dump(_plain(cfg), sort_keys=True)


def saved_config(run_dir: Path) -> dict | None:
    """:func:`_plain` of the config a finished run saved (``.hydra/config.yaml``), None without one."""
    from omegaconf import OmegaConf

    path = run_dir / ".hydra" / "config.yaml"
    return _plain(OmegaConf.load(path)) if path.is_file() else None


def _field_defaults(node) -> dict:
    """The defaults of the config class behind a composed node (empty for a node that is no dataclass)."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    cls = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if cls is None or not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: _plain_value(f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def _plain_value(value):
    """A field default as a composed config holds it in plain form (a nested config class as a dict, an Enum as
    its name), so it compares equal to today's value where that is the default."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.create({"v": value}), enum_to_str=True)["v"]
    except Exception:  # a default OmegaConf cannot hold: compared as it is
        return value


def computes_the_same(saved: object, wanted: object, node: object = None) -> bool:
    """Whether a finished run's ``saved`` config computes what ``wanted`` (today's plain config, ``node`` its composed
    form) does: equal, except for fields added to a config class since the run, which it lacks and which count as
    equal where today's value is the field's default (a knob added later defaults to what the code did before it;
    one a row sets otherwise runs again). A removed field, or any other difference, runs again."""
    from omegaconf import DictConfig

    if not (isinstance(saved, dict) and isinstance(wanted, dict)):
        return saved == wanted
    if set(saved) - set(wanted):
        return False
    added = set(wanted) - set(saved)
    defaults = _field_defaults(node) if added else {}  # read only where the saved run lacks a field
    if any(key not in defaults or defaults[key] != wanted[key] for key in added):
        return False
    return all(computes_the_same(saved[key], value, node._get_node(key) if isinstance(node, DictConfig) else None)
               for key, value in wanted.items() if key in saved)


def finished_runs(own: Path, runs_root: Path, keys: Iterable[str], overrides: Callable[[str], list[str]],
                  not_before: float) -> dict[str, tuple[Path, float]]:
    """The dataset keys whose run already finished as it would run now (key -> its folder, when): a folder holding
    ``metrics.json`` written after ``not_before`` (the newest prepared artifact the row reads) by a run whose saved
    config computes what ``overrides(key)`` composes to today. The run's own folder (``own / key``) is looked at first,
    then the other tables' runs under ``runs_root`` (``<results>/runs``: tables 12 and 13 run the same plans), so a
    table stopped part way resumes after its finished runs and a run another table made is read, not repeated; a
    changed row, preset or config file, or a retrained model, runs again."""
    finished_dirs = sorted(d.parent for d in runs_root.glob("*/**/metrics.json"))  # one walk for every key
    found = {key: sorted((d for d in finished_dirs if d.name == key), key=lambda d: d != own / key)  # own first
             for key in keys}
    done: dict[str, tuple[Path, float]] = {}
    if not any(found.values()):
        return done
    with evaluate_configs():
        for key, run_dirs in found.items():
            wanted = None
            for run_dir in run_dirs:
                finished = (run_dir / "metrics.json").stat().st_mtime
                if finished < not_before or (saved := saved_config(run_dir)) is None:
                    continue
                if wanted is None:  # validation composed it: a failure now means the configs changed since
                    wanted = compose_run(
                        overrides(key), f"the run {own / key} composed when the table started and no longer does "
                        "(was conf/ or a config class edited while the table ran? the same command resumes)")
                    wanted_plain = _plain(wanted)
                if computes_the_same(saved, wanted_plain, wanted):
                    done[key] = (run_dir, finished)
                    break
    return done


def stored_runs_today(entries: dict[str, dict], overrides: Callable[[str], list[str]]) -> dict[str, dict]:
    """The stored runs (dataset key -> run kept in a table's stored cells, :mod:`omnimed.tables.stored`) whose saved
    config computes what ``overrides(key)`` composes to today: a changed row, preset or config file does not read
    them."""
    if not entries:
        return {}
    out = {}
    with evaluate_configs():
        for key, entry in entries.items():
            wanted = compose_run(overrides(key), f"the stored run of {key} no longer composes")
            if computes_the_same(_unplaced(entry["config"]), _plain(wanted), wanted):
                out[key] = entry
    return out
