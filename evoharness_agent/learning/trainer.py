"""The training loop: logs → transitions → offline RL → checkpoints → a policy directory.

The loop is deliberately lean: transitions live on the device as tensors, a batch is a
``randint`` plus ``index_select``, each network runs one differentiable forward pass per
step (next states go through ``no_grad`` passes, so backward touches B rows, not 2B), Adam is
fused, target networks move with one foreach op, matrix products run in bf16 (autocast)
on GPUs that multiply bf16 natively (``training.bf16``; on CPUs only when asked, see
:mod:`~evoharness_agent.learning.precision`), and losses reach the CPU only every ``log_every`` steps. A
checkpoint (weights, optimiser, generator state) is written atomically every
``checkpoint_every`` steps; ``resume=True`` continues from it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import STATE_LAYOUT_VERSION
from evoharness_agent.encoding.transitions import TransitionDataset, build_dataset
from evoharness_agent.learning.algorithms import Algorithm, Dims, ToolInputs, make_algorithm
from evoharness_agent.learning.algorithms.base import score_decisions
from evoharness_agent.learning.augment import compose_requests, thin_answer_only, tool_text_variants, with_distractors
from evoharness_agent.learning.calibration import fit_calibration
from evoharness_agent.learning.checkpoints import (
    initialise_from,
    load_checkpoint,
    read_policy_meta,
    save_checkpoint,
    save_policy,
)
from evoharness_agent.learning.config import TrainConfig
from evoharness_agent.learning.cross_fit import cross_fitted_decisions
from evoharness_agent.learning.distributed import Context, launch, start
from evoharness_agent.learning.networks import DECISION_RULE
from evoharness_agent.learning.precision import training_autocast
from evoharness_agent.logs.bundled import domain_group, training_set
from evoharness_agent.logs.importers import load_episodes
from evoharness_agent.runtime import atomic_write_bytes, pick_device
from evoharness_agent.schema import Episode, ToolSpec

__all__ = ["DATASET_DIR", "TrainResult", "as_trained", "calibration_fold_ids", "domain_folds", "set_threads",
           "split_episodes", "task_folds", "task_group", "task_groups", "train", "train_on_episodes",
           "validation_episodes"]

DATASET_DIR = "dataset"
"""The folder of a run's output directory that holds its memory-mapped embedding table (``data.mmap_embeddings``)."""

def set_threads(threads: int | None) -> None:
    """Use ``threads`` CPU threads (default: 1 on machines with ≤ 2 cores, else up to 8)."""
    cores = os.cpu_count() or 1
    torch.set_num_threads(threads or (1 if cores <= 2 else min(cores, 8)))


def task_group(episode: Episode, position: int) -> str:
    """Return the task an episode belongs to: runs of one task must not straddle train and validation.

    BFCL's four variants rewrite the same scenario and the gpt-4o logs hold four runs of each
    task; a validation split by episode would validate on tasks the policy trained on (and fit
    an over-confident temperature). Episodes without a task key in their metadata
    (``scenario``, ``task_index`` or ``task_id``) are their own group.
    """
    metadata = episode.metadata
    for key in ("scenario", "task_index", "task_id"):
        if key in metadata:
            return f"{metadata.get('domain', metadata.get('benchmark', ''))}:{key}={metadata[key]}"
    return f"#{position}"


def task_groups(episodes: Sequence[Episode]) -> list[str]:
    """Return each episode's task (:func:`task_group`), a composed request one task with its parts.

    A request composed of logged ones (:func:`~evoharness_agent.learning.augment.compose_requests`,
    metadata ``parts``: their ids) repeats their requests and calls: were it trained on while a
    part is validated on (or the other way round), the validation split would hold decisions
    the policy trained on, and fit an over-confident temperature.
    """
    own = [task_group(episode, position) for position, episode in enumerate(episodes)]
    by_id = {episode.id: group for episode, group in zip(episodes, own, strict=True)}
    linked: dict[str, str] = {}

    def root(group: str) -> str:
        while group in linked:
            group = linked[group]
        return group

    for episode, group in zip(episodes, own, strict=True):
        for part in episode.metadata.get("parts") or ():
            if part in by_id and root(by_id[part]) != root(group):
                linked[root(by_id[part])] = root(group)
    return [root(group) for group in own]


def _grouped(ids: Sequence[int], key: Callable[[int], str]) -> dict[str, list[int]]:
    """Return the positions ``ids`` grouped by ``key(position)``, groups and members in first-seen order."""
    groups: dict[str, list[int]] = {}
    for position in ids:
        groups.setdefault(key(position), []).append(position)
    return groups


def split_episodes(episodes: Sequence[Episode], val_fraction: float, seed: int) -> tuple[
        list[int], list[int]]:
    """Split episode indices into train and validation by task (:func:`task_groups`), reproducibly."""
    tasks = task_groups(episodes)
    order = list(_grouped(range(len(episodes)), tasks.__getitem__).values())
    random.Random(seed).shuffle(order)
    wanted = int(round(len(episodes) * val_fraction)) if len(order) > 1 else 0
    val: list[int] = []
    for members in order:
        if len(val) >= wanted:
            break
        val += members
    taken = set(val)
    return [i for i in range(len(episodes)) if i not in taken], sorted(val)


def task_folds(episodes: Sequence[Episode], ids: Sequence[int], folds: int, seed: int) -> list[list[int]]:
    """Deal the episodes ``ids`` into ``folds`` folds of whole tasks (:func:`task_groups`), reproducibly.

    Raises:
        ValueError: fewer tasks than folds (a fold would hold no task out).

    """
    groups = _grouped(ids, task_groups(episodes).__getitem__)
    if len(groups) < folds:
        raise ValueError(f"training.calibration_folds is {folds}, but the training split has {len(groups)} "
                         f"task(s): use at most {len(groups)} folds, or 0 (the validation split alone)")
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    return [sorted(i for members in order[k::folds] for i in members) for k in range(folds)]


def domain_folds(episodes: Sequence[Episode], ids: Sequence[int]) -> list[list[int]]:
    """Deal the episodes ``ids`` into one fold per domain (metadata ``domain``; siblings together).

    Raises:
        ValueError: the episodes come from fewer than two domains (a fold would hold every one out).

    """
    groups = _grouped(ids, lambda position: domain_group(str(episodes[position].metadata.get("domain", ""))))
    if len(groups) < 2:
        raise ValueError(f"training.calibration_folds is 'domain', but the training split has "
                         f"{len(groups)} domain(s) (episode metadata 'domain'): use a number of folds, or 0")
    return [groups[name] for name in sorted(groups)]


def calibration_fold_ids(episodes: Sequence[Episode], ids: Sequence[int], folds: int | str,
                         seed: int) -> list[list[int]]:
    """Return the cross-fitting folds ``training.calibration_folds`` asks for: none, K of tasks, or domains.

    ``auto`` gives none: it is resolved to a number once the validation split's decisions are counted.
    """
    if folds == "domain":
        return domain_folds(episodes, ids)
    return task_folds(episodes, ids, int(folds), seed) if folds and folds != "auto" else []


def _folds_by_task(folds: int | str) -> bool:
    """Return whether ``training.calibration_folds`` (resolved) cross-fits by task: a number of folds, not 0."""
    return isinstance(folds, int) and folds > 0


def _without_validation_split(config: TrainConfig, train_ids: list[int],
                              val_ids: list[int]) -> tuple[TrainConfig, list[int], list[int]]:
    """Return the config, train and validation ids of a run that cross-fits by task: every task trained on.

    Task folds score every training decision with a model that did not see its task, so the
    temperature needs no tasks kept from training: a validation split would only withhold a tenth
    of a user's few logs. Trained on too, they gained fine-tunes' top-1 on the validation tasks of
    ``benchmarks/fine_tune_steps.py`` (eight seeds, from a policy that never saw the domain): BFCL
    10 / 25 / all scenarios 0.493 / 0.563 / 0.649 -> 0.513 / 0.561 / 0.664, tau2-bench retail 0.550 /
    0.633 / 0.656 -> 0.567 / 0.652 / 0.677 (docs/experiments.md, fifty-third stop). The config
    records ``data.val_fraction`` 0, so :func:`validation_episodes` of the policy's config is empty.
    """
    config = config.model_copy(update={"data": config.data.model_copy(update={"val_fraction": 0.0})})
    return config, sorted([*train_ids, *val_ids]), []


def as_trained(episodes: Sequence[Episode], config: TrainConfig) -> list[Episode]:
    """Return ``episodes`` as a run of ``config`` trains on them: answer-only thinned, composed, distractors."""
    seed = config.training.seed
    episodes = thin_answer_only(episodes, config.data.answer_only_share, seed=seed)
    episodes = compose_requests(episodes, config.data.composed_share, seed=seed)
    return with_distractors(episodes, config.data.distractors, seed=seed)


def _variant_embeddings(tools: Sequence[ToolSpec], encoder: StateEncoder, show_progress: bool = False) -> torch.Tensor:
    """Return ``(V, N, E)``: each of ``tools`` embedded by each of the ``V`` texts of :func:`tool_text_variants`."""
    columns = zip(*(tool_text_variants(tool) for tool in tools), strict=True)
    return torch.stack([torch.from_numpy(encoder.embed(list(texts), show_progress=show_progress)) for texts in columns])


def validation_episodes(episodes: Sequence[Episode], config: TrainConfig) -> list[Episode]:
    """Return the episodes a run of ``config`` on ``episodes`` holds out for validation and its temperature."""
    trained = as_trained(episodes, config)
    return [trained[i] for i in split_episodes(trained, config.data.val_fraction, config.training.seed)[1]]


class TrainResult(dict):
    """Final metrics of a run (a dict), with the output directory."""


def _subset(dataset: TransitionDataset, episode_ids: list[int]) -> torch.Tensor:
    """Transition indices belonging to ``episode_ids``."""
    wanted = torch.zeros(int(dataset.tensors["episode_ids"].max().item()) + 1 if len(dataset) else 1,
                         dtype=torch.bool)
    wanted[episode_ids] = True
    return torch.nonzero(wanted[dataset.tensors["episode_ids"].cpu()]).squeeze(1)


def _build_in_turn(context: Context, build: Callable[[bool], TransitionDataset]) -> TransitionDataset:
    """Build the data set on every rank in three turns, each rank passing the same two barriers.

    Rank 0 first: it fills this machine's embedding cache and writes the memory-mapped table.
    Then the first rank of every other machine (its own cache and table, unless the output
    folder is shared). Then the rest, which read their machine's cache and map its table
    (``build(True)``) instead of embedding and writing it again.
    """
    if context.is_main:
        dataset = build(False)
        context.barrier()
        context.barrier()
    elif context.local_rank == 0:
        context.barrier()
        dataset = build(False)
        context.barrier()
    else:
        context.barrier()
        context.barrier()
        dataset = build(True)
    return dataset


@torch.no_grad()
def next_tool_accuracy(algorithm: Algorithm, dataset: TransitionDataset, index: torch.Tensor) -> dict[str, float]:
    """Top-1 next-tool accuracy (among tools) and FINISH accuracy on transitions ``index``."""
    if index.numel() == 0:
        return {}
    decided = score_decisions(algorithm, dataset, index)
    scores, actions = decided.scores, decided.actions
    rows = torch.arange(len(actions))
    is_tool = ~decided.is_finish[rows, actions]
    # Ties count against the gold tool, as in evaluate (evaluation.offline.pessimistic_rank):
    # a hit needs the gold tool to score above every other available tool.
    gold = scores[rows, actions]
    others = scores.scatter(1, actions[:, None], -float("inf")).masked_fill(decided.is_finish, -float("inf"))
    top1 = (gold > others.max(1).values)[is_tool].float().mean()
    finish_acc = (decided.is_finish[rows, scores.argmax(1)] == ~is_tool).float().mean()
    return {"val/top1": float(top1), "val/finish_acc": float(finish_acc)}


def train_on_episodes(
    episodes: Sequence[Episode],
    config: TrainConfig,
    out: str | Path,
    *,
    encoder: StateEncoder | None = None,
    init: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
) -> TrainResult:
    """Train a policy on ``episodes`` and write it to ``out``; returns final metrics.

    Under ``torchrun`` (or :func:`train`'s ``nproc_per_node``) every process runs this; each
    trains on its slice of the global batch and only rank 0 writes (see
    :mod:`~evoharness_agent.learning.distributed`).
    """
    context, device = start(pick_device(config.training.device))
    try:
        return _train(episodes, config, Path(out), context, device, encoder=encoder, init=init,
                      resume=resume, show_progress=show_progress and context.is_main)
    finally:
        context.close()


def _train(episodes: Sequence[Episode], config: TrainConfig, out: Path, context: Context, device: str, *,
           encoder: StateEncoder | None, init: str | Path | None, resume: bool,
           show_progress: bool) -> TrainResult:
    """Run :func:`train_on_episodes` as one rank of ``context``."""
    out.mkdir(parents=True, exist_ok=True)
    if init is not None:
        init_meta = read_policy_meta(init)
        for key in ("encoder", "step_encoder"):  # the weights were trained on the init's embeddings
            if key in config.model.model_fields_set and getattr(config.model, key) != init_meta.get(key):
                raise ValueError(f"model.{key} is {getattr(config.model, key)!r}, but the policy to start from "
                                 f"({init}) embeds with {init_meta.get(key)!r}: a fine-tuned policy keeps its "
                                 f"start's encoders; drop model.{key}, or train from scratch")
        # The networks' sizes come with the weights; how the policy acts (DECISION_RULE) is this run's own.
        init_network = {key: value for key, value in init_meta["network"].items() if key not in DECISION_RULE}
        config = config.model_copy(update={"model": config.model.model_copy(update={
            "encoder": init_meta["encoder"], "step_encoder": init_meta.get("step_encoder"),
            "max_seq_length": init_meta["max_seq_length"],
            "history_window": init_meta["history_window"], **init_network})})
    torch.manual_seed(config.training.seed)
    model = config.model
    if encoder is not None and ((encoder.model_name, encoder.step_model, encoder.max_seq_length)
                                != (model.encoder, model.step_encoder, model.max_seq_length)):
        # The policy records the config's encoder: trained on another's embeddings it would be served skewed.
        raise ValueError(f"the encoder given embeds with {encoder.model_name!r} (steps: {encoder.step_model!r}) at "
                         f"{encoder.max_seq_length} tokens, but model.encoder is {model.encoder!r} (step_encoder: "
                         f"{model.step_encoder!r}) at {model.max_seq_length} (the policy would record one and be "
                         "trained on the other): pass a matching encoder")
    encoder = encoder or model.state_encoder()
    encoded_before = encoder.n_encoded  # a caller's encoder may have encoded texts already
    rewards = config.rewards.reward_config()
    episodes = as_trained(episodes, config)
    train_ids, val_ids = split_episodes(episodes, config.data.val_fraction, config.training.seed)
    folds = config.training.calibration_folds  # checked before the embedding work: too many folds is an error
    config.training.check_folds(context.world_size)
    if _folds_by_task(folds):
        config, train_ids, val_ids = _without_validation_split(config, train_ids, val_ids)
    fold_ids = calibration_fold_ids(episodes, train_ids, folds, config.training.seed)
    part = context.shard(config.training.batch_size) if context.world_size > 1 else None

    def build(mmap_shared: bool) -> TransitionDataset:
        return build_dataset(episodes, encoder, history_window=config.model.history_window,
                             reward_config=rewards, show_progress=show_progress,
                             embedding_dtype=config.data.embedding_dtype,
                             mmap_dir=out / DATASET_DIR if config.data.mmap_embeddings else None,
                             mmap_shared=mmap_shared, encode_processes=config.data.encode_processes,
                             encode_ray=config.data.ray_encoding())

    dataset = _build_in_turn(context, build)
    if len(dataset) == 0:
        raise ValueError("the logs contain no decisions (no tool calls or replies) to learn from")
    set_threads(config.training.threads)
    dataset = dataset.to(device)
    # "auto" folds follow the validation split's size, and unset steps the training decisions' when
    # fine-tuning; the policy records the numbers used.
    if folds == "auto":
        training = config.training.with_folds(int(_subset(dataset, val_ids).numel()),
                                              len(set(task_groups(episodes))), context.world_size)
        config = config.model_copy(update={"training": training})
        folds = training.calibration_folds
        if _folds_by_task(folds):
            config, train_ids, val_ids = _without_validation_split(config, train_ids, val_ids)
        fold_ids = calibration_fold_ids(episodes, train_ids, folds, training.seed)
    train_index = _subset(dataset, train_ids).to(device)
    val_index = _subset(dataset, val_ids)
    training = config.training.resolved(int(train_index.numel()), fine_tuning=init is not None)
    config = config.model_copy(update={"training": training})

    network = config.model.network()
    dims = Dims(dataset.state_dim, int(dataset.tools.embeddings.shape[1]), len(dataset.tools.specs))
    share = config.data.text_variant_share
    variants = _variant_embeddings(dataset.tools.specs, encoder, show_progress).to(device) if share else None

    def new_algorithm(index: torch.Tensor) -> Algorithm:  # trained on the transitions at index
        tools = ToolInputs(dataset.tools.embeddings, torch.arange(len(dataset.tools.specs), device=device),
                           dataset.action_counts(index), variants, share)
        algorithm = make_algorithm(config.algorithm.name, config.algorithm.params, dims, network, tools).to(device)
        if config.training.compile:
            algorithm.compile_training()
        return algorithm

    algorithm = new_algorithm(train_index)
    meta = {
        "algorithm": config.algorithm.name, "params": config.algorithm.params,
        "network": asdict(network), "encoder": config.model.encoder, "step_encoder": config.model.step_encoder,
        "max_seq_length": config.model.max_seq_length, "history_window": config.model.history_window,
        "state_layout": STATE_LAYOUT_VERSION, "state_dim": dims.state_dim, "tool_dim": dims.tool_dim,
        "known_tools": dataset.tools.names,
        "config": config.model_dump(),
    }
    generator = torch.Generator(device=device).manual_seed(config.training.seed)
    start = load_checkpoint(out, algorithm, generator, meta) if resume else 0
    if init is not None and start == 0:
        initialise_from(algorithm, init, dataset.tools.names)
    if context.world_size > 1:
        context.broadcast(list(algorithm.modules.values()))
        if algorithm.optimizer is not None:
            algorithm.optimizer.register_step_pre_hook(context.all_reduce_gradients)

    writer = None
    if config.logging.tensorboard and context.is_main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tensorboard"), purge_step=start or None)
    steps, log_every = config.training.n_steps, config.logging.log_every
    log_file = out / "train_log.json"
    # After a resume the log continues the interrupted run's, minus steps that will be redone.
    history: list[dict[str, float]] = ([row for row in json.loads(log_file.read_text()) if row["step"] <= start]
                                       if start and log_file.exists() else [])
    metrics: dict[str, float] = {}
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        TextColumn("{task.fields[losses]}"), disable=not show_progress)
    with progress:
        bar = progress.add_task(f"train {config.algorithm.name}", total=steps, completed=start, losses="")
        for step in range(start + 1, steps + 1):
            batch = dataset.sample(config.training.batch_size, generator, train_index, part)
            with training_autocast(device, config.training.bf16):
                logs = algorithm.update(batch)
            if step % log_every == 0 or step == steps:
                metrics = {k: float(v) for k, v in context.mean(logs).items()}
                history.append({"step": step, **metrics})
                if writer is not None:
                    for key, value in metrics.items():
                        writer.add_scalar(key, value, step)
                shown = "  ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in metrics.items())
                progress.update(bar, losses=shown)
            if not context.is_main:
                continue
            if step % config.training.eval_every == 0 or step == steps:
                algorithm.set_training(False)
                val = next_tool_accuracy(algorithm, dataset, val_index)
                algorithm.set_training(True)
                metrics.update(val)
                if writer is not None:
                    for key, value in val.items():
                        writer.add_scalar(key, value, step)
            if step % config.training.checkpoint_every == 0 or step == steps:
                save_checkpoint(out, step, algorithm, generator, meta)
                atomic_write_bytes(log_file, json.dumps(history).encode())
            progress.update(bar, advance=1)
    if writer is not None:
        writer.close()
    result = TrainResult(metrics, n_episodes=len(episodes), n_transitions=len(dataset),
                         n_encoded=encoder.n_encoded - encoded_before, out=str(out))
    if context.is_main:
        out_of_fold = None
        if fold_ids:
            def new_fold(index: torch.Tensor) -> Algorithm:
                fold = new_algorithm(index)
                if init is not None:
                    initialise_from(fold, init, dataset.tools.names)
                return fold

            out_of_fold = cross_fitted_decisions(new_fold, dataset, train_index,
                                                 [_subset(dataset, ids).to(device) for ids in fold_ids],
                                                 config.training, out, device, resume=resume,
                                                 show_progress=show_progress)
        calibration = fit_calibration(algorithm, dataset, val_index, out_of_fold)  # T for ToolPolicy's probabilities
        if out_of_fold is not None:  # what each out-of-fold decision's scorer had not seen
            calibration["out_of_fold_by"] = "domain" if folds == "domain" else "task"
        result.update(n_calibration_decisions=calibration["n_decisions"],
                      n_out_of_fold=calibration.get("n_out_of_fold", 0))
        save_policy(out, algorithm, {**meta, "metrics": dict(result), "calibration": calibration})
        atomic_write_bytes(log_file, json.dumps(history).encode())
    context.barrier()  # no rank leaves (and tears the group down) before rank 0 has written
    return result


def train(config: TrainConfig, out: str | Path, *, init: str | Path | None = None,
          resume: bool = False, show_progress: bool = True, nproc_per_node: int = 1) -> TrainResult:
    """Load the logs of ``config.data`` (its bundled set, then its paths) and train; see :func:`train_on_episodes`.

    ``nproc_per_node`` > 1 spawns that many data-parallel processes on this machine (as
    ``torchrun --nproc-per-node`` would) and returns the metrics rank 0 wrote. The logs are
    read and checked here, once, so a bad line is this process's error, not N children's.
    """
    if nproc_per_node > 1:
        Context(world_size=nproc_per_node).shard(config.training.batch_size)  # fail here, not in N children
        config.training.check_folds(nproc_per_node)
    episodes = training_set(config.data.bundled) if config.data.bundled else []
    if config.data.paths or not episodes:
        loaded = load_episodes(config.data.paths, config.data.format, skip_invalid=config.data.skip_invalid,
                               default_reward=config.data.default_reward)
        if loaded.skipped:
            print(loaded.summary())
        episodes += loaded.episodes
    if nproc_per_node > 1:
        launch(nproc_per_node, train_on_episodes, episodes, config, out, init=init, resume=resume,
               show_progress=show_progress)
        return TrainResult(read_policy_meta(out)["metrics"])
    return train_on_episodes(episodes, config, out, init=init, resume=resume,
                             show_progress=show_progress)

