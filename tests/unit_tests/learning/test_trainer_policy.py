from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import evoharness_agent.learning.precision as precision
import evoharness_agent.learning.trainer as trainer_module
from evoharness_agent.encoding.embedder import StateEncoder
from evoharness_agent.encoding.state import request_part_texts
from evoharness_agent.encoding.transitions import build_dataset
from evoharness_agent.learning.config import FINE_TUNE_STEPS, SCRATCH_STEPS, TrainConfig, TrainingSection, load_config
from evoharness_agent.learning.trainer import train_on_episodes
from evoharness_agent.policy import PolicySession, ToolPolicy
from evoharness_agent.schema import FINISH, Episode, Step, ToolSpec
from tests.kit.synthetic_logs import synthetic_episodes

TOOL_NAMES = ["search_web", "read_file", "calculator"]


def make_config(steps: int = 30, algorithm: str = "iql", params: dict[str, Any] | None = None,
                **sections: dict[str, Any]) -> TrainConfig:
    """A fast CPU config; ``sections`` update the defaults below, section by section."""
    overrides: dict[str, dict[str, Any]] = {
        "training": {"steps": steps, "batch_size": 16, "device": "cpu", "threads": 1,
                     "checkpoint_every": 10, "eval_every": 10, "seed": 7,
                     "calibration_folds": 0},  # the run alone; cross-fitting is test_cross_fit's
        "logging": {"tensorboard": False, "log_every": 5},
        "algorithm": {"name": algorithm, "params": params or {}},
        "model": {"hidden": 16, "history_window": 2},
        "data": {"val_fraction": 0.2},
    }
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, overrides)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer-cache")


@pytest.fixture(scope="module")
def encoder(cache: Path) -> StateEncoder:  # a fresh cache: the first training must encode
    return StateEncoder(cache_dir=cache, device="cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, encoder: StateEncoder) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("policy")
    result = train_on_episodes(synthetic_episodes(), make_config(), out, encoder=encoder, show_progress=False)
    return out, result


@pytest.fixture(scope="module")
def policy(trained: tuple[Path, dict], encoder: StateEncoder) -> ToolPolicy:
    return ToolPolicy.load(trained[0], encoder=encoder, device="cpu")


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "policy.safetensors"))


# --------------------------------------------------------------------------- training outputs


def test_training_writes_policy_checkpoint_and_log(trained: tuple[Path, dict]) -> None:
    out, result = trained
    for name in ("policy.safetensors", "policy.json", "train_log.json", "checkpoint/model.safetensors",
                 "checkpoint/optimizer.pt", "checkpoint/state.json"):
        assert (out / name).is_file(), name
    assert not (out / "tensorboard").exists()
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 30
    meta = json.loads((out / "policy.json").read_text())
    assert meta["algorithm"] == "iql" and meta["acting"] == ["policy"]
    assert meta["known_tools"] == [FINISH, *TOOL_NAMES]
    assert meta["history_window"] == 2 and meta["network"]["hidden"] == 16
    assert meta["state_dim"] == 384 * (3 + 2) + 2
    assert all(key.startswith("policy.") for key in weights(out))
    assert result["n_episodes"] == 6 and result["n_transitions"] == 15
    assert result["n_encoded"] > 0
    assert 0.0 <= result["val/top1"] <= 1.0 and 0.0 <= result["val/finish_acc"] <= 1.0
    log = json.loads((out / "train_log.json").read_text())
    assert [entry["step"] for entry in log] == [5, 10, 15, 20, 25, 30]
    assert all(np.isfinite(entry["loss/policy"]) for entry in log)


def test_second_training_encodes_nothing(tmp_path: Path, trained: tuple[Path, dict], encoder: StateEncoder,
                                         cache: Path) -> None:
    again = train_on_episodes(synthetic_episodes(), make_config(steps=2), tmp_path / "same-encoder",
                              encoder=encoder, show_progress=False)
    assert again["n_encoded"] == 0, "n_encoded must count this run's encodings only"
    fresh = StateEncoder(cache_dir=cache, device="cpu")
    result = train_on_episodes(synthetic_episodes(), make_config(steps=2), tmp_path / "fresh-encoder",
                               encoder=fresh, show_progress=False)
    assert result["n_encoded"] == 0
    assert fresh._model is None  # everything came from the disk cache


def test_tensorboard_event_files(tmp_path: Path, encoder: StateEncoder) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = make_config(steps=10, algorithm="bc", logging={"tensorboard": True, "log_every": 5})
    train_on_episodes(synthetic_episodes(), config, tmp_path, encoder=encoder, show_progress=False)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents*"))
    assert events and events[0].stat().st_size > 0
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "loss/bc" in tags and "val/top1" in tags
    assert [event.step for event in accumulator.Scalars("loss/bc")] == [5, 10]


def test_empty_logs_are_rejected(tmp_path: Path, encoder: StateEncoder) -> None:
    only_user = Episode(task="t", steps=[Step(kind="user", content="hi")])
    with pytest.raises(ValueError, match="no decisions"):
        train_on_episodes([only_user], make_config(steps=1), tmp_path, encoder=encoder, show_progress=False)


# --------------------------------------------------------------------------- ToolPolicy


def test_rank_returns_every_tool_and_finish_sorted(policy: ToolPolicy) -> None:
    history = [Step(tool="search_web", arguments={"query": "population of city 2"}, observation="2000")]
    ranked = policy.rank("How many people live in city 2, doubled?", history, synthetic_episodes()[0].tools)
    assert sorted(r.tool for r in ranked) == sorted([*TOOL_NAMES, FINISH])
    scores = [r.score for r in ranked]
    assert scores == sorted(scores, reverse=True)
    probabilities = [r.probability for r in ranked]
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-6)
    assert probabilities == sorted(probabilities, reverse=True)
    # probabilities are the softmax of the scores at the policy's calibrated temperature
    expected = np.exp((np.array(scores) - max(scores)) / policy.temperature)
    np.testing.assert_allclose(probabilities, expected / expected.sum(), rtol=1e-5)
    without_finish = policy.rank("How many people live in city 2, doubled?", history, synthetic_episodes()[0].tools,
                                 include_finish=False)
    assert FINISH not in {r.tool for r in without_finish} and len(without_finish) == 3


def test_rank_masks_unavailable_tools(policy: ToolPolicy) -> None:
    tools = synthetic_episodes()[0].tools
    full = {r.tool: r for r in policy.rank("What is written in notes1.txt?", (), tools)}
    masked = policy.rank("What is written in notes1.txt?", (), tools, available={"calculator"})
    assert {r.tool for r in masked} == {"calculator", FINISH}
    assert sum(r.probability for r in masked) == pytest.approx(1.0, abs=1e-6)
    assert set(full) == {*(t.name for t in tools), FINISH}
    # Availability is part of the state (a tool is compared with the others available), so the
    # scores are those of the score matrix for that availability, as in training.
    names, matrix = policy.score_matrix([("What is written in notes1.txt?", ())], tools, available=[{"calculator"}])
    for r in masked:
        assert r.score == pytest.approx(float(matrix[0][names.index(r.tool)]), abs=1e-5)


def test_rank_scores_an_unseen_tool(policy: ToolPolicy) -> None:
    tools = [*synthetic_episodes()[0].tools,
             ToolSpec(name="translate_text", description="Translate text into another language."),
             {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    ranked = policy.rank("Translate 'hello' into French", (), tools)
    names = [r.tool for r in ranked]
    assert sorted(names) == sorted([*TOOL_NAMES, "translate_text", "get_weather", FINISH])
    assert all(np.isfinite(r.score) for r in ranked)
    assert sum(r.probability for r in ranked) == pytest.approx(1.0, abs=1e-6)


def test_rank_batch_equals_per_state_rank(policy: ToolPolicy) -> None:
    episode = synthetic_episodes()[0]
    states = [(episode.task, episode.steps[:i]) for i in range(len(episode.steps))]
    states.append(("What is written in notes5.txt?", []))
    available = [None, {"calculator"}, None, {"read_file", "search_web"}]
    batched = policy.rank_batch(states, episode.tools, available=available)
    assert len(batched) == 4
    for (task, history), allowed, together in zip(states, available, batched, strict=True):
        alone = policy.rank(task, history, episode.tools, available=allowed)
        assert [r.tool for r in alone] == [r.tool for r in together]
        np.testing.assert_allclose([r.score for r in alone], [r.score for r in together], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose([r.probability for r in alone], [r.probability for r in together],
                                   rtol=1e-4, atol=1e-6)


def test_session_matches_full_rank_and_embeds_each_step_once(policy: ToolPolicy) -> None:
    episode = synthetic_episodes(4)[2]
    steps = [*episode.steps[:2], Step(kind="user", content="Now halve it instead."),
             Step(tool="calculator", arguments={"expression": "4 / 2"}, observation="2")]
    session = policy.session(episode.task, episode.tools)
    assert isinstance(session, PolicySession)
    session.rank()  # tools and the task are embedded now
    for index, step in enumerate(steps):
        before = policy.encoder.n_encoded
        session.observe(step)
        # One text a step; a new request's clauses are encoded token by token too (request-part coverage).
        clauses = len(request_part_texts([step.content])) if step.kind == "user" else 0
        assert policy.encoder.n_encoded - before <= 1 + clauses
        before = policy.encoder.n_encoded
        incremental = session.rank()
        assert policy.encoder.n_encoded == before, "ranking after observe() must not embed anything new"
        full = policy.rank(episode.task, steps[: index + 1], episode.tools)
        assert [r.tool for r in incremental] == [r.tool for r in full]
        np.testing.assert_allclose([r.score for r in incremental], [r.score for r in full], rtol=1e-5)
    assert session.rank(available={"read_file"})[0].tool in {"read_file", FINISH}


def test_policy_scores_match_training_states(policy: ToolPolicy, encoder: StateEncoder) -> None:
    """What the policy builds from (task, history) at inference equals what it trained on."""
    episodes = synthetic_episodes()
    data = build_dataset(episodes, encoder, history_window=2)
    episode = episodes[0]
    prefixes = [i for i, step in enumerate(episode.steps) if step.is_decision]
    names, matrix = policy.score_matrix([(episode.task, episode.steps[:i]) for i in prefixes], episode.tools)
    assert names == [*TOOL_NAMES, FINISH]
    batch = data.batch(torch.arange(len(prefixes)))  # episode 0's transitions come first
    columns = [data.tools.index[name] for name in names]
    pairs = None if batch.pairs is None else batch.pairs[:, columns]
    with torch.no_grad():
        expected = policy.algorithm.scores(batch.states, pairs).numpy()
    np.testing.assert_allclose(matrix, expected, rtol=1e-4, atol=1e-4)


def test_save_load_roundtrip_and_bad_directory(policy: ToolPolicy, encoder: StateEncoder, tmp_path: Path) -> None:
    policy.save(tmp_path / "copy")
    copy = ToolPolicy.load(tmp_path / "copy", encoder=encoder, device="cpu")
    tools = synthetic_episodes()[0].tools
    a, b = policy.rank("Read notes3.txt", (), tools), copy.rank("Read notes3.txt", (), tools)
    assert [(r.tool, round(r.score, 5)) for r in a] == [(r.tool, round(r.score, 5)) for r in b]
    with pytest.raises(FileNotFoundError, match="not a policy directory"):
        ToolPolicy.load(tmp_path, encoder=encoder)


def test_a_policy_with_a_pair_head_trains_saves_and_loads_it(tmp_path: Path, encoder: StateEncoder) -> None:
    out = tmp_path / "pair_head"
    train_on_episodes(synthetic_episodes(), make_config(steps=20, algorithm="cql", model={"pair_hidden": 8}), out,
                      encoder=encoder, show_progress=False)
    assert json.loads((out / "policy.json").read_text())["network"]["pair_hidden"] == 8
    head = weights(out)["q.pair_head.2.weight"]
    assert head.shape == (1, 8) and head.abs().sum() > 0  # trained away from its zero start
    loaded = ToolPolicy.load(out, encoder=encoder, device="cpu")
    copy = tmp_path / "copy"
    loaded.save(copy)
    torch.testing.assert_close(weights(copy)["q.pair_head.2.weight"], head)
    tools = synthetic_episodes()[0].tools
    assert {score.tool for score in loaded.rank("Read notes3.txt", (), tools)} == {FINISH, *TOOL_NAMES}


def test_text_variant_share_trains_on_the_variants_and_is_recorded(tmp_path: Path, encoder: StateEncoder) -> None:
    trained = {}
    for share in (0.0, 0.5):
        out = tmp_path / f"share_{share}"
        # No dropout: the variants are then the only difference between the two runs.
        config = make_config(steps=10, algorithm="cql", model={"dropout": 0.0}, data={"text_variant_share": share})
        train_on_episodes(synthetic_episodes(), config, out, encoder=encoder, show_progress=False)
        trained[share] = weights(out)
    assert json.loads((out / "policy.json").read_text())["config"]["data"]["text_variant_share"] == 0.5
    assert any(not torch.equal(trained[0.0][key], trained[0.5][key]) for key in trained[0.0])


# --------------------------------------------------------------------------- resume and --init


class _Crash(RuntimeError):
    pass


def _counting_make_algorithm(monkeypatch: pytest.MonkeyPatch, calls: list[int], crash_at: int | None = None) -> None:
    real = trainer_module.make_algorithm

    def make(*args: Any, **kwargs: Any) -> Any:
        algorithm = real(*args, **kwargs)
        update = algorithm.update

        def counted(batch: Any) -> Any:
            calls.append(1)
            if crash_at is not None and len(calls) == crash_at:
                raise _Crash("simulated crash")
            return update(batch)

        algorithm.update = counted
        return algorithm

    monkeypatch.setattr(trainer_module, "make_algorithm", make)


def test_resume_after_crash_continues_and_matches_uninterrupted_run(
        tmp_path: Path, encoder: StateEncoder, monkeypatch: pytest.MonkeyPatch) -> None:
    episodes = synthetic_episodes()
    config = make_config(steps=40, algorithm="iql")  # dropout on: the global RNG must be restored too
    assert config.model.dropout > 0
    train_on_episodes(episodes, config, tmp_path / "straight", encoder=encoder, show_progress=False)

    crashed: list[int] = []
    _counting_make_algorithm(monkeypatch, crashed, crash_at=25)
    with pytest.raises(_Crash):
        train_on_episodes(episodes, config, tmp_path / "resumed", encoder=encoder, show_progress=False)
    assert json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())["step"] == 20
    assert not (tmp_path / "resumed" / "policy.safetensors").exists()

    resumed: list[int] = []
    _counting_make_algorithm(monkeypatch, resumed)
    torch.manual_seed(12345)  # whatever the global RNG holds now must not matter
    train_on_episodes(episodes, config, tmp_path / "resumed", encoder=encoder, show_progress=False, resume=True)
    assert len(resumed) == 20, "resume must continue from step 20, not restart"
    assert json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())["step"] == 40

    straight, again = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert straight.keys() == again.keys()
    for key in straight:
        assert torch.equal(straight[key], again[key]), f"{key} differs after resume"


def test_resume_from_shorter_run_and_without_checkpoint(tmp_path: Path, encoder: StateEncoder,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    episodes = synthetic_episodes()
    train_on_episodes(episodes, make_config(steps=10, algorithm="bc"), tmp_path / "a", encoder=encoder,
                      show_progress=False)
    calls: list[int] = []
    _counting_make_algorithm(monkeypatch, calls)
    train_on_episodes(episodes, make_config(steps=15, algorithm="bc"), tmp_path / "a", encoder=encoder,
                      show_progress=False, resume=True)
    assert len(calls) == 5
    calls.clear()
    train_on_episodes(episodes, make_config(steps=5, algorithm="bc"), tmp_path / "b", encoder=encoder,
                      show_progress=False, resume=True)  # nothing to resume from: start at 0
    assert len(calls) == 5


def test_init_fine_tunes_from_policy_matching_bias_rows_by_name(
        trained: tuple[Path, dict], tmp_path: Path, encoder: StateEncoder) -> None:
    base_dir, _ = trained
    base = weights(base_dir)
    base_meta = json.loads((base_dir / "policy.json").read_text())
    old_bias = {name: base["policy.bias.weight"][i, 0].item() for i, name in enumerate(base_meta["known_tools"])}
    assert len({round(v, 6) for v in old_bias.values()}) == len(old_bias), "precondition: distinct biases"

    new_tool = ToolSpec(name="send_email", description="Send an email to someone.")
    tools = [new_tool, synthetic_episodes()[0].tools[2], synthetic_episodes()[0].tools[0]]  # calculator, search
    episodes = [Episode(id=f"n{i}", task=f"Email the result of {i} + {i}", tools=tools,
                        steps=[Step(tool="calculator", arguments={"expression": f"{i}+{i}"}, observation=str(2 * i)),
                               Step(tool="send_email", arguments={"body": str(2 * i)}, observation="sent"),
                               Step(kind="assistant", content="Sent.")]) for i in range(3)]
    # The base acts with the prerequisite rule (as the shipped default does); fine-tuning keeps its
    # weights and sizes, not how it acts.
    ruled = tmp_path / "ruled"
    shutil.copytree(base_dir, ruled)
    ruled_meta = {**base_meta, "network": {**base_meta["network"], "prerequisite_penalty": 3.0,
                                           "prerequisite_finish_penalty": 3.0, "open_part_finish_penalty": 2.0}}
    (ruled / "policy.json").write_text(json.dumps(ruled_meta))
    # a different width and window in the config: --init must take the base policy's
    config = make_config(steps=1, params={"lr": 1e-12}, model={"hidden": 64, "history_window": 4,
                                                               "prerequisite_finish_penalty": 1.0})
    out = tmp_path / "tuned"
    train_on_episodes(episodes, config, out, encoder=encoder, init=ruled, show_progress=False)
    meta = json.loads((out / "policy.json").read_text())
    assert meta["network"]["hidden"] == 16 and meta["history_window"] == 2
    network = meta["network"]
    assert (network["prerequisite_penalty"], network["prerequisite_finish_penalty"]) == (0.0, 1.0)
    assert network["open_part_finish_penalty"] == 0.0
    assert meta["known_tools"] == [FINISH, "send_email", "calculator", "search_web"]
    tuned = weights(out)
    new_bias = tuned["policy.bias.weight"][:, 0].tolist()
    assert new_bias[0] == pytest.approx(old_bias[FINISH], abs=1e-6)
    assert new_bias[2] == pytest.approx(old_bias["calculator"], abs=1e-6)
    assert new_bias[3] == pytest.approx(old_bias["search_web"], abs=1e-6)
    assert new_bias[1] == pytest.approx(0.0, abs=1e-6)  # unseen before: fresh
    for key, value in base.items():
        if key != "policy.bias.weight":
            torch.testing.assert_close(tuned[key], value, atol=1e-6, rtol=0)
    # Its weights were trained on the base's embeddings: asking for other encoders is an error, not ignored.
    for model in ({"step_encoder": "runs/static_encoder"}, {"encoder": "another-model"}):
        with pytest.raises(ValueError, match=f"model.{next(iter(model))} is .*a fine-tuned policy keeps"):
            train_on_episodes(episodes, make_config(steps=1, model=model), tmp_path / "refused", encoder=encoder,
                              init=ruled, show_progress=False)
    assert not (tmp_path / "refused" / "policy.json").exists()


def test_unset_steps_are_1500_from_scratch_and_about_100_passes_when_fine_tuning() -> None:
    unset = TrainingSection()  # batch 256
    assert unset.resolved(300, fine_tuning=False).n_steps == SCRATCH_STEPS == 1500
    assert unset.resolved(300, fine_tuning=True).n_steps == FINE_TUNE_STEPS[0] == 500  # 117 passes' worth: floored
    assert unset.resolved(2_560, fine_tuning=True).n_steps == 1000  # 100 passes of 2,560 decisions, 256 at a time
    assert unset.resolved(40_000, fine_tuning=True).n_steps == FINE_TUNE_STEPS[1] == 1500
    assert TrainingSection(steps=7).resolved(40_000, fine_tuning=True).n_steps == 7  # a number given is kept
    with pytest.raises(ValueError, match="unset until a run resolves it"):
        _ = unset.n_steps


def test_a_fine_tune_with_unset_steps_records_the_steps_it_took(
        trained: tuple[Path, dict], tmp_path: Path, encoder: StateEncoder) -> None:
    base_dir, _ = trained
    config = make_config()
    config = config.model_copy(update={"training": config.training.model_copy(update={"steps": None})})
    out = tmp_path / "tuned"
    train_on_episodes(synthetic_episodes()[:6], config, out, encoder=encoder, init=base_dir, show_progress=False)
    meta = json.loads((out / "policy.json").read_text())
    assert meta["config"]["training"]["steps"] == FINE_TUNE_STEPS[0]  # a few decisions: the floor
    assert json.loads((out / "train_log.json").read_text())[-1]["step"] == FINE_TUNE_STEPS[0]


def test_bf16_autocast_only_where_native_and_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = torch.randn(4, 4)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    with precision.training_autocast("cpu", True):
        assert (weights @ weights).dtype == torch.bfloat16
    for bf16 in (False, "auto"):  # auto: a CPU updates the package's narrow scorers faster in fp32
        with precision.training_autocast("cpu", bf16):
            assert (weights @ weights).dtype == torch.float32
    assert TrainConfig().training.bf16 == "auto"
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    with precision.training_autocast("cpu", True):  # emulated bf16 would be slower than fp32
        assert (weights @ weights).dtype == torch.float32


def test_validation_split_keeps_the_runs_of_one_task_together() -> None:
    from evoharness_agent.learning.trainer import split_episodes

    runs = [Episode(id=f"s{s}v{v}", task="t", metadata={"domain": "bfcl", "scenario": s})
            for s in range(10) for v in range(4)]  # 10 scenarios x 4 variants
    train_ids, val_ids = split_episodes(runs, 0.2, seed=1)
    assert sorted(train_ids + val_ids) == list(range(40)) and len(val_ids) == 8
    val_scenarios = {runs[i].metadata["scenario"] for i in val_ids}
    assert not val_scenarios & {runs[i].metadata["scenario"] for i in train_ids}
    loose = [Episode(id="", task=f"t{i}") for i in range(10)]  # no task key: each its own group
    assert len(split_episodes(loose, 0.3, seed=0)[1]) == 3


def test_a_composed_request_and_its_parts_land_on_one_side_of_every_split() -> None:
    from evoharness_agent.learning.augment import compose_requests
    from evoharness_agent.learning.trainer import split_episodes, task_folds, task_groups

    tool = ToolSpec(name="lookup", description="Looks a thing up.")
    logs = [Episode(id=f"e{i}", task=f"Request {i}.", tools=[tool.model_copy(update={"name": f"tool_{i}"})],
                    reward=1.0, metadata={"domain": "single"},
                    steps=[Step(tool=f"tool_{i}", observation="ok"), Step(kind="assistant", content="done")])
            for i in range(40)]
    episodes = compose_requests(logs, 1.0, seed=0)  # 20 composed requests, each of two logged ones
    assert len(episodes) == 60
    tasks = task_groups(episodes)
    assert len(set(tasks)) == 20  # each composed request is one task with its two parts
    by_id = {episode.id: task for episode, task in zip(episodes, tasks, strict=True)}
    for episode in episodes[40:]:
        assert {by_id[part] for part in episode.metadata["parts"]} == {by_id[episode.id]}
    for seed in range(5):
        train_ids, val_ids = split_episodes(episodes, 0.25, seed)
        trained_on = {part for i in train_ids for part in episodes[i].id.split("+")}
        assert val_ids and not any(part in trained_on for i in val_ids for part in episodes[i].id.split("+"))
    for fold in task_folds(episodes, list(range(60)), 4, seed=0):
        held_out = {part for i in fold for part in episodes[i].id.split("+")}
        assert all(part not in held_out for i in range(60) if i not in fold for part in episodes[i].id.split("+"))
    assert task_groups(logs) == [f"#{i}" for i in range(40)]  # nothing composed: each its own task, as before


def test_default_names_the_shipped_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evoharness_agent.learning.checkpoints import read_policy_meta, resolve_policy_dir, shipped_policy_dir

    shipped = shipped_policy_dir()
    assert (shipped / "policy.json").is_file() and (shipped / "policy.safetensors").is_file()
    monkeypatch.chdir(tmp_path)
    assert resolve_policy_dir("default") == shipped
    assert read_policy_meta("default")["state_layout"] == read_policy_meta(shipped)["state_layout"]
    (tmp_path / "default").mkdir()  # a folder of that name here is the user's own
    assert resolve_policy_dir("default") == Path("default")


def test_an_encoder_other_than_the_configs_is_refused_before_anything_is_embedded(tmp_path: Path,
                                                                                  cache: Path) -> None:
    # The policy records model.encoder / max_seq_length: trained on another encoder's embeddings,
    # it would be served skewed without a word.
    shorter = StateEncoder(cache_dir=cache, device="cpu", max_seq_length=32)
    with pytest.raises(ValueError, match=r"max_seq_length|128") as error:
        train_on_episodes(synthetic_episodes(), make_config(steps=5), tmp_path, encoder=shorter, show_progress=False)
    assert "32" in str(error.value) and "all-MiniLM-L6-v2" in str(error.value)
    other = StateEncoder("another-model", cache_dir=cache, device="cpu")
    with pytest.raises(ValueError, match="another-model"):
        train_on_episodes(synthetic_episodes(), make_config(steps=5), tmp_path, encoder=other, show_progress=False)
    # The model of the history steps is part of the encoder: a policy records it too.
    with_steps = StateEncoder(cache_dir=cache, device="cpu", step_model="a-step-model")
    with pytest.raises(ValueError, match="steps: 'a-step-model'.*step_encoder: None"):
        train_on_episodes(synthetic_episodes(), make_config(steps=5), tmp_path, encoder=with_steps,
                          show_progress=False)
    assert shorter.n_encoded == other.n_encoded == with_steps.n_encoded == 0
    assert not (tmp_path / "policy.json").exists()
