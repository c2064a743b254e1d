"""From episodes to tensors: tool tables, masks and transitions for offline RL.

Each decision of an episode becomes one transition whose state follows the one layout of
:mod:`evoharness_agent.encoding.state`. Transitions store row indices into one shared
embedding table, not vectors, so a data set of many episodes stays small and a batch is
gathered with one ``index_select``. The table may be stored as float16 and memory-mapped from
a ``.npy`` file (:func:`build_dataset`'s ``embedding_dtype`` and ``mmap_dir``); a batch's states
are float32 either way.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.ray_encoding import RayEncoding
from evoharness_agent.encoding.state import (
    N_PAIR_FEATURES,
    N_STATE_FEATURES,
    SlotRows,
    decisions,
    gather_states,
    matched_part_texts,
    n_slots,
    request_part_texts,
    state_dim,
    state_rows,
    tool_coverage,
)
from evoharness_agent.rewards import RewardConfig, shape_rewards
from evoharness_agent.runtime import atomic_write_with
from evoharness_agent.schema import FINISH, Episode, ToolSpec, finish_spec

__all__ = ["EMBEDDINGS_FILE", "Batch", "EmbeddingDtype", "ToolTable", "TransitionDataset", "build_dataset"]

@dataclass
class ToolTable:
    """All tools of a data set: their keys, names and embedding rows (FINISH is row 0)."""

    specs: list[ToolSpec]
    embeddings: torch.Tensor
    index: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_specs(cls, specs: Iterable[ToolSpec], encoder: StateEncoder) -> ToolTable:
        """Embed each distinct tool once; a name seen twice keeps its first description.

        The tools' token vectors (what :func:`~evoharness_agent.encoding.state.tool_coverage` matches)
        come from the same encoder pass as their embeddings.
        """
        unique: dict[str, ToolSpec] = {FINISH: finish_spec()}
        for spec in specs:
            unique.setdefault(spec.name, spec)
        ordered = list(unique.values())
        texts = [spec.text() for spec in ordered]
        encoder.embed_tokens(texts)
        vectors = encoder.embed(texts)
        return cls(ordered, torch.from_numpy(vectors), {s.name: i for i, s in enumerate(ordered)})

    @property
    def names(self) -> list[str]:
        """Tool names in row order."""
        return [spec.name for spec in self.specs]


@dataclass
class Batch:
    """A minibatch of transitions, states already gathered into feature vectors."""

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_states: torch.Tensor
    dones: torch.Tensor
    masks: torch.Tensor
    next_masks: torch.Tensor
    pairs: torch.Tensor | None = None
    """``(B, N, F)`` per-tool features (:data:`~evoharness_agent.encoding.state.PAIR_FEATURES`)."""
    next_pairs: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    """``(B, K)`` tool-table rows that a state's columns (actions, masks, pairs) refer to, padded
    with masked entries; ``None``: column ``j`` is row ``j`` of the tool table, for every state."""
    next_candidates: torch.Tensor | None = None


class TransitionDataset:
    """Transitions as tensors: texts are rows of one embedding table, gathered per batch."""

    def __init__(self, text_embeddings: torch.Tensor, tools: ToolTable, tensors: dict[str, torch.Tensor],
                 history_window: int) -> None:
        """Hold the tables; ``tensors`` has one row per transition."""
        self.text_embeddings = text_embeddings
        self.tools = tools
        self.tensors = tensors
        self.history_window = history_window

    def __len__(self) -> int:
        """Return the number of transitions."""
        return int(self.tensors["actions"].shape[0])

    @property
    def state_dim(self) -> int:
        """Size of one gathered state vector."""
        return state_dim(int(self.text_embeddings.shape[1]), self.history_window)

    def to(self, device: torch.device | str) -> TransitionDataset:
        """Move every table to ``device``."""
        tools = ToolTable(self.tools.specs, self.tools.embeddings.to(device), self.tools.index)
        moved = {k: v.to(device) for k, v in self.tensors.items()}
        return TransitionDataset(self.text_embeddings.to(device), tools, moved, self.history_window)

    def batch(self, index: torch.Tensor, *, candidates_only: bool = False) -> Batch:
        """Gather the transitions at ``index`` into a :class:`Batch`.

        With ``candidates_only`` each state keeps only the tools available at it (tens, where
        the logs have thousands): the scores, losses and greedy choices are the same, at a
        fraction of the cost, because an unavailable tool is masked out of every one of them.
        """
        t = self.tensors
        take = lambda name: t[name].index_select(0, index)  # noqa: E731
        # A float16 table's rows become float32 when gather_states joins them to the float32
        # features (type promotion): only the B gathered rows are converted, never the table.
        states = gather_states(self.text_embeddings, take("rows"), take("features"))
        next_states = gather_states(self.text_embeddings, take("next_rows"), take("next_features"))
        following = take("following")
        if candidates_only:
            candidates, masks, pairs = self.candidates(index)
            next_candidates, next_masks, next_pairs = self.candidates(following)
            actions = (candidates == take("actions")[:, None]).float().argmax(1)
            return Batch(states=states, actions=actions, rewards=take("rewards"), next_states=next_states,
                         dones=take("dones"), masks=masks, next_masks=next_masks, pairs=pairs,
                         next_pairs=next_pairs, candidates=candidates, next_candidates=next_candidates)
        return Batch(states=states, actions=take("actions"), rewards=take("rewards"), next_states=next_states,
                     dones=take("dones"), masks=self.masks(index), next_masks=self.masks(following),
                     pairs=self.pairs(index), next_pairs=self.pairs(following))

    def _entries(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Locate the stored pair rows of the transitions at ``index``: owner, slot, entry, counts."""
        offsets = self.tensors["pair_offsets"]
        starts, counts = offsets.index_select(0, index), (offsets[1:] - offsets[:-1]).index_select(0, index)
        total = int(counts.sum())
        owner = torch.repeat_interleave(torch.arange(index.shape[0], device=index.device), counts, output_size=total)
        first = torch.cumsum(counts, 0) - counts
        slot = torch.arange(total, device=index.device) - torch.repeat_interleave(first, counts, output_size=total)
        entry = torch.repeat_interleave(starts, counts, output_size=total) + slot
        return owner, slot, entry, counts

    def action_counts(self, index: torch.Tensor) -> torch.Tensor:
        """Return how often the transitions at ``index`` log each tool-table row (row 0: FINISH)."""
        return torch.bincount(self.tensors["actions"].index_select(0, index), minlength=len(self.tools.specs))

    def candidates(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return each state's available tools: ``(B, K)`` table rows, their mask, their ``(B, K, F)`` pair features.

        Padding entries are masked, point at row 0 and have all-zero features.
        """
        t = self.tensors
        offsets, tools, values = t["pair_offsets"], t["pair_tools"], t["pair_values"]
        starts = offsets.index_select(0, index)
        counts = offsets.index_select(0, index + 1) - starts
        width = max(int(counts.max()) if counts.numel() else 0, 1)
        slot = torch.arange(width, device=index.device)
        mask = slot[None, :] < counts[:, None]
        if tools.numel() == 0:  # no stored rows at all: every entry is padding
            zeros = torch.zeros((index.shape[0], width), dtype=torch.long, device=index.device)
            return zeros, mask, torch.zeros((*zeros.shape, N_PAIR_FEATURES), device=values.device)
        # One gather of B x width entries (padding reads entry 0, then is cleared), not a scatter
        # of a ragged list: the sampler's hot path.
        entry = torch.where(mask, starts[:, None] + slot[None, :], 0).reshape(-1)
        rows = torch.where(mask, tools.index_select(0, entry).view_as(mask), 0)
        pairs = values.index_select(0, entry).view(*mask.shape, N_PAIR_FEATURES)
        return rows, mask, pairs.mul_(mask[..., None])  # stored features are finite: x * 0 == 0

    def masks(self, index: torch.Tensor) -> torch.Tensor:
        """Return the dense ``(len(index), N)`` masks of the tools available at the transitions at ``index``.

        Built from the sparse pair storage (its rows are exactly the available tools), so a data
        set does not keep transitions x tools booleans.
        """
        owner, _, entry, _ = self._entries(index)
        dense = torch.zeros((index.shape[0], len(self.tools.specs)), dtype=torch.bool, device=index.device)
        dense[owner, self.tensors["pair_tools"].index_select(0, entry)] = True
        return dense

    def pairs(self, index: torch.Tensor) -> torch.Tensor:
        """Return the dense ``(len(index), N, F)`` pair features of the transitions at ``index``.

        They are stored sparsely (one row per tool available at the decision; the others are all
        zero): dense, they would take transitions x tools x features, and the general data has
        thousands of tools.
        """
        t = self.tensors
        owner, _, entry, _ = self._entries(index)
        dense = torch.zeros((index.shape[0], len(self.tools.specs), N_PAIR_FEATURES), device=t["pair_values"].device)
        dense[owner, t["pair_tools"].index_select(0, entry)] = t["pair_values"].index_select(0, entry)
        return dense

    def sample(self, batch_size: int, generator: torch.Generator | None = None,
               subset: torch.Tensor | None = None, part: slice | None = None) -> Batch:
        """Sample a batch uniformly (from ``subset`` transition ids when given), each state with its own candidates.

        ``part`` keeps only those rows of the drawn batch: data-parallel ranks draw the same
        global batch from one seed and each trains on its own slice.
        """
        device = self.tensors["actions"].device
        pool = len(self) if subset is None else subset.shape[0]
        picks = torch.randint(pool, (batch_size,), device=device, generator=generator)
        if part is not None:
            picks = picks[part]
        return self.batch(picks if subset is None else subset.index_select(0, picks), candidates_only=True)


EMBEDDINGS_FILE = "text_embeddings.npy"
"""The name of a memory-mapped text-embedding table in its ``mmap_dir``."""

EmbeddingDtype = Literal["float32", "float16"]


def _tensor(values: array, dtype: torch.dtype) -> torch.Tensor:
    """Return a typed array's values as a tensor of ``dtype`` (the array's own storage when it matches)."""
    return torch.from_numpy(np.asarray(values)).to(dtype)


def _mapped_table(path: Path, shape: tuple[int, int], dtype: EmbeddingDtype) -> torch.Tensor:
    """Map the table another process wrote at ``path``, checking it is the one these texts need."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no shared embedding table (the process that writes it has not)")
    table = np.load(path, mmap_mode="c")
    if table.shape != shape or table.dtype != np.dtype(dtype):
        raise ValueError(f"{path}: shared embedding table is {table.dtype} {table.shape}, "
                         f"this data set needs {dtype} {shape} (written for other logs or settings)")
    return torch.from_numpy(table)


def _embedding_table(slots: SlotRows, encoder: StateEncoder, dim: int, dtype: EmbeddingDtype,
                     mmap_dir: Path | None, show_progress: bool, processes: int, ray: RayEncoding | None,
                     mmap_shared: bool = False) -> torch.Tensor:
    """Embed the texts of ``slots`` into a ``(len(slots) + 1, dim)`` table (row 0 is PAD), in memory or on disk.

    With ``mmap_shared`` the table in ``mmap_dir`` is mapped as another process wrote it.
    """
    shape = (len(slots) + 1, dim)
    if mmap_dir is not None and mmap_shared:
        return _mapped_table(mmap_dir / EMBEDDINGS_FILE, shape, dtype)

    def fill(table: np.ndarray) -> None:
        slots.fill(table, lambda texts: encoder.embed(texts, show_progress=show_progress, processes=processes, ray=ray),
                   lambda texts: encoder.embed_steps(texts, show_progress=show_progress, processes=processes, ray=ray))

    if mmap_dir is None:
        table = np.zeros(shape, dtype=dtype)
        fill(table)
        return torch.from_numpy(table)
    mmap_dir.mkdir(parents=True, exist_ok=True)
    path = mmap_dir / EMBEDDINGS_FILE

    def write(tmp: str) -> None:
        # ``open_memmap`` writes the .npy header and the rows straight into the file (a new file is
        # zeros: row 0 is PAD already), with no second copy of the table in memory.
        mapped = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        fill(mapped)
        mapped.flush()
        del mapped  # unmap before the file is fsynced and renamed into place

    atomic_write_with(path, write)
    # Copy-on-write: pages are read from the file only when touched, and the array is writable,
    # which torch needs to share it without copying (a read-only one would make it warn).
    return torch.from_numpy(np.load(path, mmap_mode="c"))


def build_dataset(
    episodes: Sequence[Episode],
    encoder: StateEncoder,
    *,
    history_window: int = 4,
    reward_config: RewardConfig | None = None,
    extra_tools: Iterable[ToolSpec] = (),
    show_progress: bool = False,
    embedding_dtype: EmbeddingDtype = "float32",
    mmap_dir: Path | None = None,
    mmap_shared: bool = False,
    encode_processes: int = 1,
    encode_ray: RayEncoding | None = None,
) -> TransitionDataset:
    """Encode episodes into a :class:`TransitionDataset` (one transition per decision).

    Args:
        episodes: the logged episodes.
        encoder: embeds the texts of the states and the tool descriptions (history steps with
            :meth:`~evoharness_agent.encoding.embedder.StateEncoder.embed_steps`).
        history_window: how many of the latest steps a state embeds.
        reward_config: reward shaping (default :class:`RewardConfig`).
        extra_tools: tools to add to the tool table besides the episodes' own.
        show_progress: draw the encoder's progress bar.
        embedding_dtype: storage type of the text-embedding table; ``float16`` halves it (its rows
            become float32 when a batch gathers them).
        mmap_dir: write the text-embedding table to ``mmap_dir/text_embeddings.npy`` and memory-map
            it, so the process holds only the pages batches touch.
        mmap_shared: another process built the same data set and wrote its table into
            ``mmap_dir`` (rank 0 of a data-parallel run): map that file instead of embedding the
            texts and writing it again (its shape and dtype are checked); no effect without ``mmap_dir``.
        encode_processes: processes that encode the texts not cached yet (see :meth:`StateEncoder.embed`).
        encode_ray: encode them on Ray Data actors instead (the ``ray`` extra).

    """
    reward_config = reward_config or RewardConfig()
    specs = [s for ep in episodes for s in ep.tools] + list(extra_tools)
    # Logs may call tools their tool list forgot; such a tool is known by its name alone.
    specs += [ToolSpec(name=step.tool) for ep in episodes for step in ep.steps if step.tool]
    tools = ToolTable.from_specs(specs, encoder)
    tool_vectors = tools.embeddings.numpy()
    # Every request's parts in batched encodings: those matched after a call with their token vectors
    # (one pass gives both), then the rest. The per-decision lookups below then hit the cache.
    requests = {ep.task for ep in episodes} | {s.content for ep in episodes for s in ep.steps if s.kind == "user"}
    encoder.embed_tokens(matched_part_texts(requests), show_progress=show_progress)
    encoder.embed(request_part_texts(requests), show_progress=show_progress, processes=encode_processes,
                  ray=encode_ray)
    slots = SlotRows()

    def tool_text(name: str) -> str:
        return tools.specs[tools.index[name]].text()

    # Typed arrays, not lists: a million transitions with tens of candidates each are tens of
    # millions of numbers, 4-8 bytes each here and ~30 as Python objects in lists.
    rows, pair_tools, actions, episode_ids, pair_counts = (array("q") for _ in range(5))
    features, rewards, pair_values = array("f"), array("f"), array("f")
    dones = array("b")
    for episode_id, episode in enumerate(episodes):
        points = decisions(episode, history_window)
        shaped = shape_rewards(episode, reward_config)
        for point, reward in zip(points, shaped, strict=True):
            rows.extend(state_rows(point, tool_text, slots, history_window))
            features.extend(point.features)
            actions.append(tools.index[point.action])
            rewards.append(reward)
            candidates = sorted(tools.index[name] for name in point.available if name in tools.index)
            candidate_specs = [tools.specs[i] for i in candidates]
            coverage = tool_coverage(point, candidate_specs, tool_vectors[candidates], encoder.embed,
                                     encoder.match_tokens, tool_text)
            values = point.pair_features(candidate_specs, coverage=coverage)
            pair_counts.append(len(candidates))
            pair_tools.extend(candidates)
            pair_values.frombytes(values.astype(np.float32).tobytes())
            episode_ids.append(episode_id)
        dones.extend([False] * (len(points) - 1) + [True] * bool(points))

    table = _embedding_table(slots, encoder, int(tools.embeddings.shape[1]), embedding_dtype, mmap_dir,
                             show_progress, encode_processes, encode_ray, mmap_shared)

    n = len(actions)
    row_tensor = _tensor(rows, torch.long).reshape(n, n_slots(history_window))
    feature_tensor = _tensor(features, torch.float32).reshape(n, N_STATE_FEATURES)
    done_tensor = _tensor(dones, torch.bool)
    # The next state of a transition is the following row; a terminal one points at itself
    # and is ignored through ``dones``.
    following = torch.arange(n) + 1
    following[done_tensor] = torch.arange(n)[done_tensor]
    tensors = {
        "rows": row_tensor,
        "features": feature_tensor,
        "actions": _tensor(actions, torch.long),
        "rewards": _tensor(rewards, torch.float32),
        "dones": done_tensor.float(),
        "next_rows": row_tensor[following],
        "next_features": feature_tensor[following],
        "following": following,
        "pair_offsets": torch.cat([torch.zeros(1, dtype=torch.long), _tensor(pair_counts, torch.long).cumsum(0)]),
        "pair_tools": _tensor(pair_tools, torch.long),
        "pair_values": _tensor(pair_values, torch.float32).reshape(-1, N_PAIR_FEATURES),
        "episode_ids": _tensor(episode_ids, torch.long),
    }
    return TransitionDataset(table, tools, tensors, history_window)
