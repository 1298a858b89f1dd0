"""Map a ``StrategyConfig`` + ``TrainerConfig`` onto the Lightning Trainer's strategy, accelerator, devices and precision.

One function, :func:`build_strategy`, is the only place that knows how ``cpu | ddp | fsdp2 | deepspeed`` translate to
Lightning objects, so the training entry point stays free of hardware branches and a config that runs on a CPU CI
machine runs unchanged on 8xA100 (only the hardware-dependent resolution differs: backend, precision, and the
CPU-only DeepSpeed subclass :class:`CPUDeepSpeedStrategy`, isolated at the end of this module).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, Strategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import nn

from omnimed.training.config import StrategyConfig, TrainerConfig

log = logging.getLogger(__name__)

STRATEGY_NAMES = ("cpu", "ddp", "fsdp2", "deepspeed")

# DeepSpeed keys whose "auto" (the HF Trainer convention) is resolved from the model's hidden size when known;
# without a hidden size they are dropped so DeepSpeed's own defaults apply.
_HIDDEN_SIZE_AUTO = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


@dataclass(frozen=True)
class StrategySpec:
    """What the Trainer needs from the strategy choice. Unpacks as ``strategy, accelerator, devices, precision``."""

    strategy: Strategy | str
    accelerator: str
    devices: Any
    precision: str
    num_nodes: int = 1
    gradient_clip_val: float | None = None  # the Trainer's; None under DeepSpeed, which clips from its own dict

    def __iter__(self) -> Iterator[Any]:
        return iter((self.strategy, self.accelerator, self.devices, self.precision))

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``lightning.Trainer`` (strategy, accelerator, devices, num_nodes, precision,
        gradient_clip_val)."""
        return {
            "strategy": self.strategy,
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "precision": self.precision,
            "gradient_clip_val": self.gradient_clip_val,
        }


def build_strategy(
    cfg: StrategyConfig,
    trainer_cfg: TrainerConfig,
    *,
    micro_batch_size: int | None = None,
    hidden_size: int | None = None,
) -> StrategySpec:
    """Resolve the strategy config into Lightning objects.

    - ``cpu``: one device, Lightning's ``"auto"`` strategy; accelerator ``cpu`` unless the trainer names one.
    - ``ddp``: :class:`DDPStrategy`; backend gloo on CPU, nccl on GPUs unless ``process_group_backend`` is set.
    - ``fsdp2``: :class:`ModelParallelStrategy` with a 1-D data-parallel mesh over all ranks (tensor-parallel size 1);
      the LightningModule shards itself in ``configure_model`` with :func:`apply_fsdp2`.
    - ``deepspeed``: :class:`DeepSpeedStrategy` with ``cfg.deepspeed`` as its config dict ("auto" values filled,
      see :func:`resolve_deepspeed_config`); without CUDA the subclass :class:`CPUDeepSpeedStrategy` runs the same
      Lightning code path on CPU processes (gloo, fp32).

    ``micro_batch_size`` and ``hidden_size`` only fill DeepSpeed "auto" values; both are optional.
    """
    if cfg.name not in STRATEGY_NAMES:
        raise ValueError(f"strategy.name={cfg.name!r}; expected one of {STRATEGY_NAMES}")
    if cfg.name != "deepspeed" and _to_plain(cfg.deepspeed):
        raise ValueError(
            f"strategy.deepspeed is set but strategy.name={cfg.name!r}; it only applies to deepspeed"
        )

    accelerator = resolve_accelerator(trainer_cfg.accelerator, default="cpu" if cfg.name == "cpu" else None)
    precision = resolve_precision(trainer_cfg.precision, accelerator)
    devices: Any = trainer_cfg.devices
    backend = cfg.process_group_backend or ("nccl" if accelerator == "cuda" else "gloo")

    if cfg.name == "cpu":
        return StrategySpec("auto", accelerator, 1, precision, num_nodes=1,
                            gradient_clip_val=trainer_cfg.gradient_clip_val)

    if cfg.name == "ddp":
        strategy: Strategy = DDPStrategy(process_group_backend=backend)
    elif cfg.name == "fsdp2":
        world = count_devices(devices, accelerator) * trainer_cfg.num_nodes
        strategy = ModelParallelStrategy(
            data_parallel_size=world, tensor_parallel_size=1, process_group_backend=backend
        )
    else:
        strategy, precision = _build_deepspeed(
            cfg, trainer_cfg, accelerator, precision, backend, micro_batch_size, hidden_size
        )
    clip = None if cfg.name == "deepspeed" else trainer_cfg.gradient_clip_val
    return StrategySpec(strategy, accelerator, devices, precision, num_nodes=trainer_cfg.num_nodes,
                        gradient_clip_val=clip)


def resolve_accelerator(requested: str, *, default: str | None = None) -> str:
    """``auto`` becomes ``default`` when given, else ``cuda`` where CUDA is available and ``cpu`` otherwise."""
    requested = "cuda" if requested == "gpu" else requested
    if requested != "auto":
        return requested
    if default is not None:
        return default
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_precision(requested: str, accelerator: str) -> str:
    """``auto``: ``bf16-mixed`` on a CUDA device with bf16 support, else ``32-true``; anything else passes through."""
    if requested != "auto":
        return requested
    if accelerator == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def count_devices(devices: Any, accelerator: str) -> int:
    """How many local devices Lightning will use for a ``devices`` value (int, "N", list, -1 or "auto")."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    if devices in (-1, "auto"):
        return torch.cuda.device_count() if accelerator == "cuda" else 1
    raise ValueError(f"cannot count devices={devices!r}")


def _build_deepspeed(
    cfg: StrategyConfig,
    trainer_cfg: TrainerConfig,
    accelerator: str,
    precision: str,
    backend: str,
    micro_batch_size: int | None,
    hidden_size: int | None,
) -> tuple[DeepSpeedStrategy, str]:
    """DeepSpeedStrategy on GPUs; the CPU subclass (fp32 only) where no CUDA is available."""
    on_cpu = not torch.cuda.is_available()
    if accelerator == "cpu" and not on_cpu:
        raise ValueError(
            "DeepSpeed on CPU is only supported where no CUDA device is visible (DeepSpeed picks its accelerator "
            "per process); set CUDA_VISIBLE_DEVICES='' or use accelerator=cuda"
        )
    if on_cpu and accelerator != "cpu":
        raise ValueError(f"accelerator={accelerator!r} but no CUDA device is available")
    if on_cpu:
        rank_zero_warn(
            f"DeepSpeed on CPU (no CUDA): running in fp32. Precision {trainer_cfg.precision!r} -> '32-true', "
            "bf16/fp16 disabled in the DeepSpeed config.",
            category=UserWarning,
        )
        precision = "32-true"
    elif trainer_cfg.precision == "auto":
        precision = _precision_from_deepspeed_dict(_to_plain(cfg.deepspeed), precision)
    ds_config = resolve_deepspeed_config(
        cfg.deepspeed,
        precision=precision,
        trainer_cfg=trainer_cfg,
        micro_batch_size=micro_batch_size,
        hidden_size=hidden_size,
    )
    if on_cpu:
        return CPUDeepSpeedStrategy(config=ds_config, process_group_backend=backend), precision
    return DeepSpeedStrategy(config=ds_config, process_group_backend=backend), precision


def _precision_from_deepspeed_dict(ds: Mapping[str, Any], hardware_default: str) -> str:
    """With trainer precision ``auto`` on GPUs, a dict that explicitly enables bf16/fp16 decides the precision."""
    if _enabled(ds.get("bf16")) is True:
        return "bf16-mixed"
    if _enabled(ds.get("fp16")) is True:
        return "16-mixed"
    return hardware_default


def resolve_deepspeed_config(
    ds: Mapping[str, Any],
    *,
    precision: str,
    trainer_cfg: TrainerConfig,
    micro_batch_size: int | None = None,
    hidden_size: int | None = None,
) -> dict[str, Any]:
    """A copy of the DeepSpeed dict that DeepSpeed and Lightning accept, with every "auto" value resolved.

    - ``gradient_accumulation_steps``: removed (Lightning sets it from ``accumulate_grad_batches`` and refuses a
      preset value); a number different from the trainer's is an error.
    - ``train_micro_batch_size_per_gpu``: ``micro_batch_size`` when given, else removed (Lightning reads the train
      dataloader's batch size). ``train_batch_size: auto`` is removed (DeepSpeed derives it).
    - ``gradient_clipping: auto``: the trainer's ``gradient_clip_val`` (0 = off).
    - ``bf16`` / ``fp16`` ``enabled``: set to match ``precision`` (the Lightning precision plugin casts inputs to it,
      so the dict must agree); a contradicting explicit value is overridden with a warning.
    - ZeRO bucket sizes: "auto" from ``hidden_size`` (hidden^2, 0.9 hidden^2, 10 hidden), else DeepSpeed defaults.
    Any other "auto" raises, naming its key, rather than reaching DeepSpeed's config parser.
    """
    out = copy.deepcopy(_to_plain(ds))
    if not out:
        raise ValueError(
            "strategy.name=deepspeed needs a strategy.deepspeed config dict (see conf/strategy/)"
        )

    gas = out.pop("gradient_accumulation_steps", "auto")
    if gas != "auto" and int(gas) != trainer_cfg.accumulate_grad_batches:
        raise ValueError(
            f"deepspeed.gradient_accumulation_steps={gas} differs from trainer.accumulate_grad_batches="
            f"{trainer_cfg.accumulate_grad_batches}; set it on the trainer only"
        )
    if out.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        out.pop("train_micro_batch_size_per_gpu", None)
        if micro_batch_size is not None:
            out["train_micro_batch_size_per_gpu"] = int(micro_batch_size)
    if out.get("train_batch_size") == "auto":
        del out["train_batch_size"]

    clip = out.get("gradient_clipping")
    trainer_clip = trainer_cfg.gradient_clip_val or 0.0
    if clip == "auto":
        out["gradient_clipping"] = trainer_clip
    elif clip is not None and float(clip) != float(trainer_clip):
        rank_zero_warn(
            f"deepspeed.gradient_clipping={clip} differs from trainer.gradient_clip_val={trainer_clip};"
            " DeepSpeed clips, so the DeepSpeed value is the one used.",
            category=UserWarning,
        )

    _align_half_precision(out, precision)

    zero = out.get("zero_optimization")
    if isinstance(zero, dict):
        for key, from_hidden in _HIDDEN_SIZE_AUTO.items():
            if zero.get(key) == "auto":
                if hidden_size is None:
                    del zero[key]
                    log.info(
                        "deepspeed.zero_optimization.%s=auto: no hidden size given, DeepSpeed default used",
                        key,
                    )
                else:
                    zero[key] = from_hidden(int(hidden_size))

    leftover = [path for path, value in _walk(out) if value == "auto"]
    if leftover:
        raise ValueError(f"DeepSpeed config values left at 'auto' that omnimed cannot fill: {leftover}")
    return out


def _align_half_precision(ds: dict[str, Any], precision: str) -> None:
    """Make ``bf16.enabled`` / ``fp16.enabled`` match the Lightning precision, warning on overridden choices."""
    wanted = {"bf16": precision.startswith("bf16"), "fp16": precision.startswith("16")}
    for key, on in wanted.items():
        section = ds.get(key)
        if section is None:
            continue  # Lightning adds the section itself for half precisions
        if not isinstance(section, dict):
            raise TypeError(f"deepspeed.{key} must be a mapping with an 'enabled' key, got {section!r}")
        current = _enabled(section)
        if current is True and not on:
            rank_zero_warn(
                f"deepspeed.{key}.enabled=true overridden to false: the run's precision is {precision!r}.",
                category=UserWarning,
            )
        section["enabled"] = on


def _enabled(section: Any) -> bool | str | None:
    """``True``/``False``/``"auto"`` of a ``{"enabled": ...}`` section; ``None`` when absent."""
    if not isinstance(section, Mapping):
        return None
    value = section.get("enabled")
    return value if value == "auto" else (None if value is None else bool(value))


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _to_plain(ds: Any) -> dict[str, Any]:
    """A plain ``dict`` from a dict or an OmegaConf ``DictConfig`` (Hydra hands the latter)."""
    if ds is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(ds, DictConfig):
            return OmegaConf.to_container(ds, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return dict(ds)


@contextmanager
def hf_zero3_context(strategy: Any) -> Generator[None, None, None]:
    """Wrap model creation in ``LightningModule.configure_model`` so transformers knows ZeRO-3 is on.

    Under ZeRO-3, Lightning runs ``configure_model`` inside ``deepspeed.zero.Init``: parameters are partitioned as
    modules are built. transformers only cooperates when an ``HfDeepSpeedConfig`` is alive: without it
    ``from_pretrained`` fails on the empty partitions (size-mismatch error). This keeps one alive for the block
    (a no-op for other strategies)::

        def configure_model(self):
            with hf_zero3_context(self.trainer.strategy):
                self.model = AutoModelForCausalLM.from_pretrained(...)  # or .from_config(config)

    Build random-init models with ``AutoModelForCausalLM.from_config``: it gathers each partition to apply the HF
    init; the class constructor (``LlamaForCausalLM(config)``) leaves torch's default init under ZeRO-3 (measured:
    initial loss 61 instead of 4.9 on a 128-token vocabulary).
    """
    if not (isinstance(strategy, DeepSpeedStrategy) and strategy.zero_stage_3):
        yield
        return
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    hf_config = HfDeepSpeedConfig(strategy.config)
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del hf_config


def apply_fsdp2(
    model: nn.Module,
    device_mesh: Any,
    *,
    mp_policy: Any = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard ``model`` with FSDP2: ``fully_shard`` on every decoder layer, then on the root (embeddings, norm, head).

    Per-layer units mean only one layer's full parameters exist at a time during forward/backward. Decoder layers
    are found through the HF model's ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``), which also works through a
    PEFT wrapper. ``device_mesh`` may be Lightning's 2-D ``(data_parallel, tensor_parallel)`` mesh; its
    data-parallel dimension is used. Call it from ``LightningModule.configure_model`` when ``self.device_mesh`` is set.
    """
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if "data_parallel" in names and len(names) > 1:
        if "tensor_parallel" in names and mesh["tensor_parallel"].size() != 1:
            raise ValueError("apply_fsdp2 shards over data parallelism only; tensor_parallel_size must be 1")
        mesh = mesh["data_parallel"]
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy

    layer_classes = _decoder_layer_classes(model)
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(
            f"apply_fsdp2 found no decoder layers ({sorted(layer_classes)}) in {type(model).__name__}"
        )
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _decoder_layer_classes(model: nn.Module) -> set[str]:
    """Names of the transformer block classes of an HF model (possibly PEFT-wrapped)."""
    candidates = [model]
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        candidates.append(get_base())
    candidates.extend(m for m in model.modules() if getattr(m, "_no_split_modules", None))
    for module in candidates:
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")


# --------------------------------------------------------------------------------------------------------------------
# DeepSpeed on CPU (tests / CI only). Kept to the smallest override of Lightning's DeepSpeedStrategy so the code path a
# CPU run takes (config formatting, zero.Init around configure_model, deepspeed.initialize, engine-driven backward /
# step, sharded save_checkpoint) is the one GPU runs take.
#
# Version pin note: written against lightning==2.6.6 (pytorch/strategies/deepspeed.py). It relies on
#   - DeepSpeedStrategy.setup_environment: its only addition over DDPStrategy.setup_environment is the
#     ``isinstance(self.accelerator, CUDAAccelerator)`` refusal, which is what we skip;
#   - DeepSpeedStrategy.setup_distributed = reset_seed(); set_world_ranks(); _validate_device_index_selection();
#     _init_deepspeed_distributed() -- we repeat it without the index check (CPU devices carry no index, so the
#     check "[None, None] != [0, 1]" always fails) and call the private ``_init_deepspeed_distributed``;
#   - DeepSpeedStrategy._setup_model_and_optimizer / _initialize_deepspeed_inference passing
#     ``argparse.Namespace(device_rank=self.root_device.index)`` to deepspeed.initialize, whose engine needs an int:
#     ``root_device`` is ``cpu:0`` on every rank (the one CPU device; DeepSpeed's CPU accelerator ignores the index).
# If a Lightning upgrade changes either method, tests/test_strategies.py::test_deepspeed_zero3_cpu fails.
# --------------------------------------------------------------------------------------------------------------------


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's :class:`DeepSpeedStrategy`, permitted on CPU processes (DeepSpeed's CPU accelerator, gloo).

    Used by :func:`build_strategy` only where no CUDA device is available. Precision must be fp32 (``32-true``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # DeepSpeed picks its accelerator once per process, at first use; pin it before anything imports it.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        super().__init__(*args, **kwargs)

    @property
    def root_device(self) -> torch.device:
        """``cpu:0`` rather than ``cpu``: Lightning hands ``root_device.index`` to ``deepspeed.initialize`` as
        ``args.device_rank`` and DeepSpeed's engine compares it with 0 (``None`` raises). Index 0 is the CPU."""
        return torch.device("cpu", 0)

    def setup_environment(self) -> None:
        """DDPStrategy's environment setup (device + process group) without DeepSpeedStrategy's CUDA-only refusal."""
        if not isinstance(self.accelerator, CPUAccelerator):
            raise TypeError(f"{type(self).__name__} is for CPU runs; got {type(self.accelerator).__name__}")
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() != "cpu":
            raise RuntimeError(
                f"DeepSpeed selected accelerator {get_accelerator().device_name()!r}; set DS_ACCELERATOR=cpu before"
                " deepspeed is first imported"
            )
        super(DeepSpeedStrategy, self).setup_environment()

    def setup_distributed(self) -> None:
        """DeepSpeedStrategy.setup_distributed minus the CUDA device-index check (meaningless for CPU devices)."""
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()
