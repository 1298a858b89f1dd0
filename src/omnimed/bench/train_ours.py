"""Our side of ``omnimed-bench train``, run in its own process by :mod:`omnimed.bench.train_child`.

Our side is the real thing: :class:`~omnimed.training.sft.SFTModule` fitted by a Lightning ``Trainer`` (fp32,
gradient clipping 1.0, cosine schedule with 3% warmup, no logger, no checkpointing, no progress bar) on batches of
:class:`~omnimed.training.data.SFTDataModule` (length-grouped per-batch padding, or packing). A Lightning Trainer
rather than calling ``training_step`` by hand, because that loop (hooks, logging, closure, clipping, scheduler) is
the overhead a user pays, and TRL's side (:mod:`omnimed.bench.train_trl`) pays its own ``transformers.Trainer``
loop.

``micro_batch_tokens`` sets ``task.micro_batch_tokens``: our step runs a long batch as chunks of rows (the same
gradient, a fraction of the activation memory).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from omnimed.bench.mfu import gpu_mfu
from omnimed.bench.train_config import TrainBenchConfig, strategy_config, task_config, trainer_config
from omnimed.bench.train_data import check_epoch, datamodule, sft_rows, side_setup
from omnimed.bench.train_measure import PeakRSS, peak_gpu_memory, step_log


def hardware_kwargs(cfg: TrainBenchConfig) -> dict[str, Any]:
    """The Lightning ``Trainer``'s strategy, accelerator, devices, precision and clipping for ``cfg``'s scenario,
    resolved by the engine's own :func:`~omnimed.training.strategies.build_strategy`."""
    from omnimed.training.strategies import build_strategy

    return build_strategy(strategy_config(cfg), trainer_config(cfg), micro_batch_size=cfg.batch_size).trainer_kwargs()


def run_ours(
    cfg: TrainBenchConfig,
    *,
    rows: Callable[[Any, Any], list[dict[str, Any]]] = sft_rows,
    module_cls: type | None = None,
    datamodule_cls: type | None = None,
) -> dict[str, Any]:
    """Our side: ``SFTModule`` + ``SFTDataModule`` under a Lightning ``Trainer`` (see the module docstring);
    returns this run's step log summary, peak RSS and set-up details as a JSON-ready dict.

    Another objective's bench passes its ``rows`` (``rows(tokenizer, cfg)``), Lightning module class and data
    module class (``omnimed-bench dpo``: ``DPOModule`` and ``DPODataModule``); the loop is the same."""
    import lightning as L
    import torch
    from lightning.pytorch import Callback

    from omnimed.training.sft import SFTModule

    with PeakRSS() as rss:
        t0 = time.perf_counter()
        from omnimed.training.data import SFTDataModule

        module_cls = module_cls or SFTModule
        datamodule_cls = datamodule_cls or SFTDataModule
        mcfg, tokenizer, data_rows = side_setup(cfg, rows)
        dm = datamodule(data_rows, tokenizer, cfg, packing=cfg.packing, module_cls=datamodule_cls)
        check_epoch(len(dm.train_dataloader()), cfg)
        log = step_log(cfg.accelerator, cfg.profile_step)

        class StepTimer(Callback):
            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                log.begin()

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
                log.step_end()
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                log.losses.append(float(loss.detach()))
                log.record_batch(batch)
                if log.threads_in_loop is None:
                    log.threads_in_loop = torch.get_num_threads()

        L.seed_everything(cfg.seed, workers=True, verbose=False)
        module = module_cls(mcfg, task_config(cfg), tokenizer)
        module.configure_model()  # load now, so setup_s covers it and the timed loop does not
        rss_model_mb = rss.current_mb()
        with tempfile.TemporaryDirectory(prefix="omnimed-bench-") as tmp:
            trainer = L.Trainer(
                **hardware_kwargs(cfg),
                max_steps=cfg.total_steps,
                max_epochs=1,
                accumulate_grad_batches=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                limit_val_batches=0,
                use_distributed_sampler=False,
                log_every_n_steps=1,
                callbacks=[StepTimer()],
                default_root_dir=tmp,
            )
            setup_s = time.perf_counter() - t0
            trainer.fit(module, datamodule=dm)
    result = log.summary(cfg.warmup, cfg.steps)
    result.update(rss.result())
    result.update(peak_gpu_memory(cfg.accelerator))
    result.update(gpu_mfu(cfg.accelerator, module.model, cfg.max_length, result["tokens_per_s_total"]))
    result.update(
        side="ours",
        strategy=type(trainer.strategy).__name__,
        precision=str(trainer.precision),
        loop=f"lightning.Trainer.fit({module_cls.__name__}, {datamodule_cls.__name__})",
        micro_batch_tokens=cfg.micro_batch_tokens,
        head_chunk_positions=cfg.head_chunk_positions,
        setup_s=round(setup_s, 2),
        rss_after_model_load_mb=round(rss_model_mb, 1),
        threads=log.threads_in_loop,
        trainable_params=sum(getattr(p, "ds_numel", p.numel()) for p in module.model.parameters() if p.requires_grad),
        batches_per_epoch=len(dm.train_dataloader()),
    )
    return result
