"""Cross-fitted calibration: out-of-fold decisions for the temperature, when the validation split is small.

A user's first logs are a few tasks; ``val_fraction`` of them is one or two, and a temperature
fit on a handful of decisions is noise (tau2-bench retail, 10 training tasks from the default: the
validation split's 2 decisions gave T = 0.48 and an ECE of 0.45 on the held-out tasks; from
scratch, T = 0.05). With
``training.calibration_folds`` K ≥ 2 the trainer also trains K models as the run itself is
trained (same config, start and steps), each without one K-th of the training tasks, and scores
that K-th with it: every decision is then scored by a model that never saw its task, and the
temperature is fit on all of them (scikit-learn's ``CalibratedClassifierCV(ensemble=False)`` does
the same for a classifier). So no task need be kept from training for the temperature: such a run
trains on the validation split's tasks too (``trainer._without_validation_split``). The run's own
policy is still the one trained on every task. Each fold's scores are written
atomically when it ends, so a resumed run trains only the folds it had not finished.

With ``training.calibration_folds: domain`` the folds are the logs' domains instead: each fold
model trains without one domain and scores it, so the temperature is fit on decisions about
tools the scorer never saw, as a general policy meets a new user's tools. Leaving one bundled
domain group out at a time, the best temperature on the left-out decisions was 0.57-2.1 (pooled
0.91) where the validation split's was 0.64-0.72: in-domain decisions make a policy look surer
than it is on new tools.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from evoharness_agent.encoding.transitions import TransitionDataset
from evoharness_agent.learning.algorithms import Algorithm
from evoharness_agent.learning.algorithms.base import ScoredDecisions, score_decisions
from evoharness_agent.learning.config import TrainingSection
from evoharness_agent.learning.precision import training_autocast
from evoharness_agent.runtime import atomic_write_bytes

__all__ = ["CROSS_FIT_DIR", "cross_fitted_decisions"]

CROSS_FIT_DIR = "cross_fit"
"""The folder of a run's output directory that holds each finished fold's scored decisions."""


def cross_fitted_decisions(new_algorithm: Callable[[torch.Tensor], Algorithm], dataset: TransitionDataset,
                           train_index: torch.Tensor, folds: Sequence[torch.Tensor], training: TrainingSection,
                           out: Path, device: str, *, resume: bool, show_progress: bool) -> ScoredDecisions:
    """Return every training decision scored by the fold model that did not train on its task.

    Args:
        new_algorithm: a fresh algorithm to train on the given transitions, initialised as the run's own
            was (from ``--init`` or not).
        dataset: the run's transitions.
        train_index: the run's training transitions.
        folds: the transitions of each fold (whole tasks; together, ``train_index``).
        training: the run's loop settings (steps, batch size, seed, bf16).
        out: the run's output directory (the folds' scores go in ``out / CROSS_FIT_DIR``).
        device: where the data set and the algorithms are.
        resume: keep the folds a previous run of ``out`` finished; else start them afresh.
        show_progress: show a progress bar.

    """
    store = out / CROSS_FIT_DIR
    if not resume:
        shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True, exist_ok=True)
    scored: list[ScoredDecisions] = []
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), disable=not show_progress)
    with progress:
        bar = progress.add_task(f"cross-fit {len(folds)} folds", total=len(folds) * training.n_steps)
        for k, held_out in enumerate(folds):
            path = store / f"fold_{k}.pt"
            if path.exists():
                scored.append(ScoredDecisions(**torch.load(path, weights_only=True)))
                progress.update(bar, advance=training.n_steps)
                continue
            keep = train_index[~torch.isin(train_index, held_out)]
            # Its own seed for the initial weights and dropout: a resumed run trains fold k as a fresh one did.
            torch.manual_seed(training.seed + 1 + k)
            algorithm = new_algorithm(keep)
            generator = torch.Generator(device=device).manual_seed(training.seed + 1 + k)
            for _ in range(training.n_steps):
                batch = dataset.sample(training.batch_size, generator, keep)
                with training_autocast(device, training.bf16):
                    algorithm.update(batch)
                progress.update(bar, advance=1)
            algorithm.set_training(False)
            decided = score_decisions(algorithm, dataset, held_out)
            buffer = io.BytesIO()
            torch.save(vars(decided), buffer)
            atomic_write_bytes(path, buffer.getvalue())
            scored.append(decided)
    return ScoredDecisions.concat(scored)
