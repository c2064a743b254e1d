"""The ``evoharness-agent`` command line: train, evaluate, collect and demo."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from enum import Enum, EnumMeta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import typer
from rich.console import Console

from evoharness_agent.envs.registry import ENVIRONMENTS, SPLITS
from evoharness_agent.evaluation.choosers import BEHAVIOURS
from evoharness_agent.logs.importers import FORMATS, LogFormatError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Learn which tool an agent should call next, from its logs, with offline RL.")
console = Console()


def _choices(name: str, values: Sequence[str], doc: str) -> type[Enum]:
    """Return a str Enum of ``values`` (members named with ``_`` for ``-``): typer offers them as choices."""
    # The functional API with a runtime name is intended: the members come from the registries.
    choices = Enum(name, {value.replace("-", "_"): value for value in values}, type=str)  # type: ignore[misc]
    choices.__doc__ = doc
    return choices


if TYPE_CHECKING:
    # What mypy sees of the Enums built below at runtime: str-valued Enums whose members
    # (``Format.auto``, ``Split.test``, ...) are known only once the registries are read.
    class _ChoiceMeta(EnumMeta):
        def __getattr__(cls, name: str) -> _Choice: ...

    class _Choice(str, Enum, metaclass=_ChoiceMeta):
        _value_: str

    Algo: TypeAlias = _Choice
    Format: TypeAlias = _Choice
    EnvName: TypeAlias = _Choice
    Split: TypeAlias = _Choice
    Behaviour: TypeAlias = _Choice
else:
    # The algorithm registry (learning.algorithms.ALGORITHMS) imports torch, so its names are
    # repeated here; tests/unit_tests/test_cli.py checks that they match.
    Algo = _choices("Algo", ("bc", "cql", "iql", "bcq"), "Offline RL algorithms.")
    Format = _choices("Format", ("auto", *FORMATS), "Log formats.")
    EnvName = _choices("EnvName", ENVIRONMENTS, "Executable environments.")
    Split = _choices("Split", SPLITS, "Which tasks of an environment to run (BFCL: test = scenario % 5 == 0; "
                                      "tau-airline: tasks 40-49).")
    Behaviour = _choices("Behaviour", BEHAVIOURS, "Behaviour policies for data collection.")


class Arguments(str, Enum):
    """Where the arguments of a chosen tool come from."""

    gold = "gold"
    llm = "llm"


class _ManyValuesCommand(typer.core.TyperCommand):
    """A command whose path options take several values after one flag, as well as the flag repeated.

    Click gives an option one value per flag, so ``--data a.jsonl b.jsonl`` is rewritten to
    ``--data a.jsonl --data b.jsonl`` before parsing: every token after such a flag, up to the
    next one that starts with ``-``, is another value.
    """

    many_values = frozenset({"--data", "--baseline-data", "--calibration-data"})

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Repeat a many-valued flag before each of its values, then parse as usual.

        ``ctx`` is the context of Typer's own (private) copy of click, which it does not export.
        """
        rewritten: list[str] = []
        flag: str | None = None
        for position, token in enumerate(args):
            if token == "--":
                rewritten += args[position:]
                break
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                flag = name if name in self.many_values else None
                rewritten.append(token)
            elif flag is not None and rewritten[-1] != flag:
                rewritten += [flag, token]
            else:
                rewritten.append(token)
        return super().parse_args(ctx, rewritten)


def _fail(message: str) -> typer.Exit:
    """Print an error and return the exit to raise."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code=2)


@app.command(cls=_ManyValuesCommand)
def train(
    data: Annotated[list[Path], typer.Option("--data", help="Log files or directories: --data a.jsonl b.jsonl, "
                                                            "or --data a.jsonl --data b.jsonl.")],
    out: Annotated[Path, typer.Option(help="Where the policy, checkpoints and logs go.")],
    algo: Annotated[Algo | None, typer.Option(help="Algorithm (default: config, else cql).")] = None,
    log_format: Annotated[Format, typer.Option("--format", help="Log format.")] = Format.auto,
    config: Annotated[Path | None, typer.Option(help="YAML config (sections: data, algorithm, "
                                                     "model, rewards, training, logging).")] = None,
    init: Annotated[Path | None, typer.Option(help="Fine-tune from this policy directory.")] = None,
    steps: Annotated[int | None, typer.Option(help="Gradient steps (default: 1500; with --init, about 100 passes "
                                                   "over the training decisions, 500-1500).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for training.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    compile_training: Annotated[bool, typer.Option(
        "--compile", help="Compile the training passes with torch.compile: for long runs on a GPU (tens of "
                          "seconds to compile; ~1.9x faster steps on an H200).")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    skip_invalid: Annotated[bool, typer.Option(help="Skip bad log lines (and report them).")] = False,
    default_reward: Annotated[float | None, typer.Option(help="Reward of episodes that have none.")] = None,
    calibration_folds: Annotated[str | None, typer.Option(
        help="Fit the confidence temperature on K out-of-fold models' decisions (K more trainings; the run then "
             "trains on the validation split's tasks too: for logs of a few tasks, where the split is a task or "
             "two). 'auto' (default): 5 when the validation split holds fewer than 200 decisions, else 0. "
             "'domain': one model without each domain of the logs, plus the validation split, for a policy meant "
             "for new tools. 0: the validation split alone.")
    ] = None,
    nproc_per_node: Annotated[int, typer.Option(
        min=1, help="Data-parallel processes on this machine (gloo on CPU, nccl on GPU); the batch size is the "
                    "global batch, split evenly. Or run this command under torchrun.")] = 1,
) -> None:
    """Train a tool-ranking policy on logged trajectories."""
    from evoharness_agent.learning.config import load_config
    from evoharness_agent.learning.trainer import train as run_training

    overrides: dict[str, dict[str, Any]] = {
        "data": {"paths": [str(p) for p in data], "format": log_format.value,
                 "skip_invalid": skip_invalid or None, "default_reward": default_reward},
        "algorithm": {"name": algo.value if algo else None},
        "training": {"steps": steps, "batch_size": batch_size, "device": device, "threads": threads,
                     "seed": seed, "calibration_folds": calibration_folds, "compile": compile_training or None},
    }
    try:
        cfg = load_config(config, overrides)
        result = run_training(cfg, out, init=init, resume=resume, nproc_per_node=nproc_per_node)
    except (LogFormatError, ValueError, FileNotFoundError) as error:
        raise _fail(str(error)) from error
    if int(os.environ.get("RANK", "0")):
        return  # under torchrun every rank runs this command; rank 0 reports
    console.print(f"policy written to [bold]{out}[/]  ({result['n_transitions']} transitions, "
                  f"{result['n_encoded']} texts encoded, the rest from cache)")
    console.print({k: round(v, 4) for k, v in result.items() if isinstance(v, float)})
    from evoharness_agent.learning.calibration import FEW_DECISIONS, cross_fitted

    fit_on = result.get("n_calibration_decisions", 0)
    if cross_fitted(result) and result["n_out_of_fold"] == fit_on:
        console.print(f"the confidence temperature was fit on {fit_on} decisions, all scored out of fold (by a "
                      "model that had not trained on their task); the policy trained on every task")
    elif cross_fitted(result):
        console.print(f"the confidence temperature was fit on {fit_on} decisions, {result['n_out_of_fold']} of "
                      "them scored out of fold (by a model that had not trained on them)")
    elif 0 < fit_on < FEW_DECISIONS:
        console.print(f"[yellow]the confidence temperature was fit on {fit_on} validation decisions "
                      "only: --calibration-folds auto (the default) fits it on every decision scored out of fold "
                      "and trains on the validation tasks too, where the logs have two tasks or more and one "
                      "process trains[/]")


def _load(paths: Sequence[Path | str], log_format: str, skip_invalid: bool) -> list:
    """Load logs for evaluation, reporting skipped lines."""
    from evoharness_agent.logs.importers import load_episodes

    loaded = load_episodes(list(paths), log_format, skip_invalid=skip_invalid)
    if loaded.skipped:
        console.print(loaded.summary())
    return loaded.episodes


EnvOption = Annotated[EnvName | None, typer.Option("--env", help="Executable environment (online mode).")]
VariantOption = Annotated[str, typer.Option(help="BFCL variant: base, miss_func, miss_param, long_context.")]
LimitOption = Annotated[int | None, typer.Option(help="Run only the first N tasks of the split.")]
ArgsOption = Annotated[Arguments, typer.Option("--args", help="Arguments of chosen tools: the env's gold "
                                                              "calls (isolates tool choice) or the --llm.")]
LLMOption = Annotated[str | None, typer.Option(help="LangChain chat model, 'module:attribute' (a model or a "
                                                    "factory) or a local model name.")]


@app.command(cls=_ManyValuesCommand)
def evaluate(
    policy: Annotated[Path, typer.Option(help="Policy directory.")],
    data: Annotated[list[Path] | None, typer.Option(
        "--data", help="Logs to evaluate on (required without --env): --data a.jsonl b.jsonl, or "
                       "--data a.jsonl --data b.jsonl.")] = None,
    log_format: Annotated[Format, typer.Option("--format", help="Log format.")] = Format.auto,
    baseline_data: Annotated[list[Path] | None, typer.Option(
        help="Logs the count baselines are fit on (default: the bundled data the policy was trained on, "
             "by name; logs it records by path are read only when given here; with --env, the "
             "environment's train split).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write metrics as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Write a PNG plot here (offline: the calibration plot too, as STEM_calibration.png).")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="Skip bad log lines (and report them).")] = False,
    env: EnvOption = None,
    variant: VariantOption = "base",
    split: Annotated[Split, typer.Option(help="Tasks to run with --env.")] = Split.test,
    limit: LimitOption = None,
    args: ArgsOption = Arguments.gold,
    llm: Annotated[str | None, typer.Option(
        help="LangChain chat model ('module:attribute', a model or a factory, or a local model name): adds "
             "the 'LLM chooses' baseline, and fills arguments with --args llm.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="With --env: write a markdown table here.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random baseline (with --env).")] = 0,
    results: Annotated[Path | None, typer.Option(
        help="With --env: append each task's result to this JSONL file as it finishes, so an interrupted "
             "run keeps what it measured (default with --json: STEM.tasks.jsonl beside it).")] = None,
) -> None:
    """Next-tool prediction of a policy against four baselines, in one run; with --env, task success online."""
    from evoharness_agent.evaluation.offline import evaluate_offline
    from evoharness_agent.evaluation.reports import plot_calibration, plot_report, print_report
    from evoharness_agent.policy import ToolPolicy

    if env is not None:
        _evaluate_online(policy, env, variant, split, limit, args, llm, baseline_data, log_format,
                         skip_invalid, json_out, markdown, plot, seed, results)
        return
    if not data:
        raise _fail("give --data (offline evaluation) or --env (online evaluation)")
    try:
        loaded_policy = ToolPolicy.load(policy)
        episodes = _load(data, log_format.value, skip_invalid)
        if not episodes:
            raise ValueError(f"no episodes to evaluate in {' '.join(map(str, data))}")
        trained_on = (loaded_policy.meta.get("config") or {}).get("data") or {}
        if baseline_data:
            baseline = _load(baseline_data, log_format.value, skip_invalid)
        elif trained_on.get("bundled"):
            # Bundled data is recorded by name (the shipped default), so it is found wherever the package is.
            from evoharness_agent.logs.bundled import training_set

            baseline = training_set(trained_on["bundled"])
        else:
            # Paths recorded in a policy file are never read unasked: the file may come from anyone.
            recorded = " ".join(str(path) for path in trained_on.get("paths") or [])
            raise ValueError("pass --baseline-data (the logs the count baselines are fit on)"
                             + (f"; the policy records its training logs as: {recorded}" if recorded else ""))
        report = evaluate_offline(loaded_policy, episodes, baseline)  # refuses logs with no decision
    except (LogFormatError, ValueError, FileNotFoundError) as error:
        raise _fail(str(error)) from error
    print_report(report, f"{policy}", console)
    fit = loaded_policy.meta.get("calibration") or {}
    if fit.get("n_decisions"):
        held_out, unseen = fit.get("n_out_of_fold"), fit.get("out_of_fold_by", "task")
        folds = (" (all out of fold)" if held_out == fit["n_decisions"] else
                 f" ({held_out} out of fold, the rest its validation split)" if held_out else " (its validation split)")
        console.print(f"its temperature {loaded_policy.temperature:.3f} was fit on {fit['n_decisions']} decisions, "
                      f"each scored by a model that had not trained on its {unseen}{folds}", highlight=False)
    if json_out:
        report.write_json(json_out)
        console.print(f"metrics written to {json_out}")
    if plot:
        plot_report(report, plot)
        calibration_plot = plot.with_name(f"{plot.stem}_calibration{plot.suffix}")
        plot_calibration(report.calibration, calibration_plot)
        console.print(f"plots written to {plot} and {calibration_plot}")


def _load_llm(spec: str) -> Any:
    """Build a LangChain chat model from ``module:attribute`` (a model or a factory) or a local model name."""
    if ":" in spec:
        module, _, attribute = spec.partition(":")
        target = getattr(importlib.import_module(module), attribute)
        return target() if isinstance(target, type) or not hasattr(target, "bind_tools") else target
    from evoharness_agent.local_llm.chat_model import LocalChatModel

    return LocalChatModel.from_pretrained(spec)


def _arguments_fn(args: Arguments, llm: Any) -> Any:
    """Return the online arguments function for ``--args``."""
    from evoharness_agent.evaluation.online import gold_arguments, llm_arguments

    if args is Arguments.gold:
        return gold_arguments
    if llm is None:
        raise ValueError("--args llm needs --llm")
    return llm_arguments(llm)


def _evaluate_online(policy_dir: Path, env: EnvName, variant: str, split: Split, limit: int | None,
                     args: Arguments, llm_spec: str | None, baseline_data: list[Path] | None, log_format: Format,
                     skip_invalid: bool, json_out: Path | None, markdown: Path | None, plot: Path | None,
                     seed: int, results: Path | None = None) -> None:
    """Run the policy and the baselines in an environment; print and write the report."""
    from evoharness_agent.envs.registry import load_environment
    from evoharness_agent.evaluation.baselines import CountBaselines
    from evoharness_agent.evaluation.choosers import (
        BigramChooser,
        EmbeddingChooser,
        LLMChooser,
        PolicyChooser,
        RandomChooser,
    )
    from evoharness_agent.evaluation.online import evaluate_online
    from evoharness_agent.evaluation.reports import print_online_report
    from evoharness_agent.policy import ToolPolicy

    try:
        loaded_policy = ToolPolicy.load(policy_dir)
        setup = load_environment(env.value, variant=variant, split=split.value, limit=limit)
        baseline = (_load(baseline_data, log_format.value, skip_invalid) if baseline_data
                    else setup.train_episodes)
        llm = _load_llm(llm_spec) if llm_spec else None
        arguments = _arguments_fn(args, llm)
    except (LogFormatError, ValueError, FileNotFoundError, ImportError, AttributeError) as error:
        raise _fail(str(error)) from error
    counts = CountBaselines(baseline)
    choosers: list[Any] = [
        PolicyChooser(loaded_policy), RandomChooser(seed), BigramChooser(counts),
        EmbeddingChooser(loaded_policy.encoder, max(1, round(counts.calls_per_turn)))]
    if llm is not None:
        choosers.append(LLMChooser(llm))
    console.print(f"{setup.name}: {len(setup.tasks)} tasks x {len(choosers)} choosers, {args.value} arguments")
    results = results or (json_out.with_suffix(".tasks.jsonl") if json_out else None)
    if results:
        console.print(f"each task's result is appended to {results} as it finishes")
    report = evaluate_online(setup.env, setup.tasks, choosers, arguments=arguments, env_name=setup.name,
                             arguments_name=args.value, results_path=results, show_progress=True, console=console)
    print_online_report(report, console)
    for name, runs in report.results.items():
        if failed := [run for run in runs if run.llm_failures]:
            ended = sum(run.error is not None for run in failed)
            console.print(f"[yellow]{name}: {sum(r.llm_failures for r in failed)} LLM calls failed in {len(failed)} "
                          f"tasks ({ended} ended there, counted as failures); first: "
                          f"{next((r.error for r in failed if r.error), None) or getattr(arguments, 'last_error', '')}")
    for path, write, what in ((json_out, report.write_json, "results"), (markdown, report.write_markdown, "table"),
                              (plot, report.plot, "plot")):
        if path:
            write(path)
            console.print(f"{what} written to {path}")


@app.command()
def collect(
    env: Annotated[EnvName, typer.Option("--env", help="Executable environment.")],
    out: Annotated[Path, typer.Option(help="Native JSONL file to write (.gz compresses).")],
    behaviour: Annotated[Behaviour, typer.Option(help="Behaviour policy.")] = Behaviour.epsilon_policy,
    policy: Annotated[Path | None, typer.Option(help="Policy directory (for policy behaviours).")] = None,
    epsilon: Annotated[float, typer.Option(help="Probability of a random action (epsilon-policy).")] = 0.3,
    variant: VariantOption = "base",
    split: Annotated[Split, typer.Option(help="Tasks to roll out (collect on train, evaluate on test).")] = Split.train,
    limit: LimitOption = None,
    repeats: Annotated[int, typer.Option(help="Rollouts per task.")] = 1,
    args: ArgsOption = Arguments.gold,
    llm: LLMOption = None,
    seed: Annotated[int, typer.Option(help="Random seed of the behaviour.")] = 0,
    turn_reward: Annotated[float, typer.Option(help="Step reward of each successful turn's FINISH "
                                                    "(credits partial progress).")] = 0.0,
    until_failure: Annotated[bool, typer.Option(help="Cut each run after its first failed turn (env state "
                                                     "carries over, so later turns would fail anyway).")] = False,
) -> None:
    """Roll out a behaviour policy in an environment: mixed-quality logs with env rewards, for offline RL."""
    from evoharness_agent.envs.registry import load_environment
    from evoharness_agent.evaluation.choosers import behaviour_chooser
    from evoharness_agent.evaluation.online import collect as run_collect
    from evoharness_agent.logs.importers import write_episodes
    from evoharness_agent.policy import ToolPolicy

    try:
        loaded_policy = ToolPolicy.load(policy) if policy else None
        chooser = behaviour_chooser(behaviour.value, loaded_policy, epsilon=epsilon, seed=seed)
        setup = load_environment(env.value, variant=variant, split=split.value, limit=limit)
        arguments = _arguments_fn(args, _load_llm(llm) if llm else None)
    except (ValueError, FileNotFoundError, ImportError, AttributeError) as error:
        raise _fail(str(error)) from error
    episodes = run_collect(setup.env, setup.tasks, chooser, arguments=arguments, repeats=repeats,
                           turn_reward=turn_reward, until_failure=until_failure)
    write_episodes(out, episodes)
    rewards = [episode.reward or 0.0 for episode in episodes]
    returns = [episode.metadata["rollout"]["return"] for episode in episodes]
    console.print(f"{len(episodes)} episodes from {setup.name} ({chooser.name}) written to [bold]{out}[/]: "
                  f"success rate {sum(rewards) / len(rewards):.3f}, mean return {sum(returns) / len(returns):.2f}")


@app.command()
def serve(
    policy: Annotated[str, typer.Option(help="Policy directory, or 'default' (the shipped general policy).")
                      ] = "default",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes, each with its own policy and sessions "
                                                     "(clients reopen a session another worker does not hold).")] = 1,
    defer_threshold: Annotated[float, typer.Option(min=0.0, max=1.0, help="defer_to_llm is true when the best "
                                                   "action's calibrated probability is under this.")] = 0.5,
    backend: Annotated[str, typer.Option(help="'torch', or 'onnx' for a directory `evoharness-agent export` "
                                              "wrote (onnxruntime: scorer and sentence encoder).")] = "torch",
    threads: Annotated[int | None, typer.Option(min=1, help="onnxruntime intra-op threads per worker "
                                                            "(backend onnx; default: onnxruntime's).")] = None,
) -> None:
    """Serve the policy over HTTP (FastAPI on uvicorn): /predict, /predict/batch, /sessions, /healthz, /metrics."""
    try:
        import uvicorn

        from evoharness_agent.policy import ToolPolicy
        from evoharness_agent.server.app import ENV_BACKEND, ENV_DEFER_THRESHOLD, ENV_POLICY, ENV_THREADS, create_app
    except ImportError as error:
        raise _fail(f"{error}: serve needs the server extra: pip install 'evoharness-agent[server]'") from error
    try:
        loaded = ToolPolicy.load(policy, backend=backend, threads=threads)  # a bad directory fails here, once
    except (ValueError, FileNotFoundError, OSError, ImportError) as error:
        raise _fail(str(error)) from error
    if workers == 1:
        uvicorn.run(create_app(loaded, defer_threshold=defer_threshold), host=host, port=port)
        return
    # Each worker process builds its own app from these settings.
    os.environ[ENV_POLICY], os.environ[ENV_DEFER_THRESHOLD] = policy, str(defer_threshold)
    os.environ[ENV_BACKEND], os.environ[ENV_THREADS] = backend, str(threads or "")
    del loaded
    uvicorn.run("evoharness_agent.server.app:create_app_from_env", factory=True, host=host, port=port,
                workers=workers)


@app.command(cls=_ManyValuesCommand)
def export(
    policy: Annotated[str, typer.Option(help="Policy directory, or 'default' (the shipped general policy).")],
    out: Annotated[Path, typer.Option(help="Where the export goes: the policy's files plus scorer.onnx, "
                                           "encoder.onnx and tokenizer.json.")],
    int8: Annotated[bool, typer.Option("--int8", help="Quantise the sentence encoder's weights to INT8 "
                                                      "(dynamic, per channel).")] = False,
    data: Annotated[list[Path] | None, typer.Option(
        "--data", help="Held-out logs the parity with torch is measured on (default: the bundled BFCL "
                       "held-out scenarios).")] = None,
    calibration_data: Annotated[list[Path] | None, typer.Option(
        "--calibration-data", help="With --int8: logs the temperature is fit again on, with the INT8 encoder's "
                                   "own embeddings (default: the policy's validation split, when it was trained "
                                   "on a bundled training set).")] = None,
    log_format: Annotated[Format, typer.Option("--format", help="Log format of --data and --calibration-data.")
                          ] = Format.auto,
    threads: Annotated[int | None, typer.Option(help="onnxruntime threads for the parity check.")] = None,
) -> None:
    """Export the scorer and the sentence encoder as ONNX (optionally INT8); measure and record parity with torch."""
    try:
        from evoharness_agent.evaluation.parity import backend_calibration, backend_parity
        from evoharness_agent.inference.onnx_export import export_policy, record_calibration, record_parity
        from evoharness_agent.learning.calibration import cross_fitted
        from evoharness_agent.policy import ToolPolicy
    except ImportError as error:
        raise _fail(f"{error}: export needs the onnx extra: pip install 'evoharness-agent[onnx]'") from error
    from evoharness_agent.logs.bundled import bfcl_paths, read_native, split_bfcl

    try:
        reference = ToolPolicy.load(policy, device="cpu")  # a bad directory fails here, with its reason
        episodes = (_load(data, log_format.value, False) if data
                    else split_bfcl(read_native(bfcl_paths(["base"])[0]))[1])
        calibration_episodes = _calibration_episodes(reference.meta, calibration_data, log_format.value) if int8 else []
    except (ValueError, FileNotFoundError, OSError, LogFormatError) as error:
        raise _fail(str(error)) from error
    section = export_policy(policy, out, int8=int8)
    if calibration_episodes:
        # INT8 moves the embeddings: the reported probabilities keep their meaning only with a
        # temperature fit on the scores this export computes.
        calibration = backend_calibration(ToolPolicy.load(out, backend="onnx", threads=threads), calibration_episodes)
        record_calibration(out, calibration)
        console.print(f"temperature fit on the INT8 encoder's scores of {calibration['n_decisions']} decisions: "
                      f"{reference.temperature:.3f} -> {calibration['temperature']:.3f} (ECE "
                      f"{calibration['ece_before']:.3f} -> {calibration['ece_after']:.3f})", highlight=False)
    elif int8:
        why = (" (it was cross-fitted, and validation decisions alone would undo that)"
               if cross_fitted(reference.meta.get("calibration")) else "")
        console.print(f"[yellow]the temperature stays the torch fp32 one{why}: give --calibration-data to fit it on "
                      "the INT8 encoder's scores[/]")
    parity = backend_parity(reference, ToolPolicy.load(out, backend="onnx", threads=threads), episodes)
    source = [str(path) for path in data] if data else "bundled BFCL base, held-out scenarios"
    record_parity(out, {**parity.as_dict(), "data": source})
    console.print(f"exported {policy} to [bold]{out}[/] (encoder {section['precision']}, scorer fp32). "
                  f"Parity with torch on {parity.n_decisions} held-out decisions: top-1 agreement "
                  f"{parity.top1_agreement:.4f} (accuracy {parity.reference_accuracy:.4f} torch, "
                  f"{parity.candidate_accuracy:.4f} onnx); embedding cosine mean {parity.embedding_cosine_mean:.4f}, "
                  f"min {parity.embedding_cosine_min:.4f} over {parity.n_texts} texts. Recorded in policy.json.",
                  highlight=False)


def _calibration_episodes(meta: dict[str, Any], paths: Sequence[Path] | None, log_format: str) -> list:
    """Return the episodes an INT8 export fits its temperature on: ``paths``, else the policy's validation split.

    Not the validation split of a policy whose temperature was cross-fitted: fit on it alone, the
    shipped default's (cross-fitted by domain, for new tools) would be an in-domain one again.
    """
    if paths:
        return _load(paths, log_format, False)
    from evoharness_agent.learning.calibration import cross_fitted

    config = meta.get("config") or {}
    bundled = (config.get("data") or {}).get("bundled")
    if bundled is None or cross_fitted(meta.get("calibration")):
        return []
    from evoharness_agent.learning.config import TrainConfig
    from evoharness_agent.learning.trainer import validation_episodes
    from evoharness_agent.logs.bundled import training_set

    return validation_episodes(training_set(bundled), TrainConfig.model_validate(config))


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where to write the demo's policies and plots.")] = Path("runs/demo"),
    steps: Annotated[int, typer.Option(help="Gradient steps per algorithm.")] = 1500,
    agent: Annotated[bool, typer.Option(help="Then run the shipped policy as an agent with the local LLM "
                                             "on held-out BFCL scenarios.")] = True,
    policy: Annotated[Path | None, typer.Option(help="Policy the agent runs (default: the shipped one).")] = None,
) -> None:
    """Train on bundled BFCL logs (scenarios ≢ 0 mod 5), evaluate on the rest vs baselines, run the shipped policy."""
    from evoharness_agent.demo import SHIPPED_POLICY, run_demo

    run_demo(out, steps=steps, agent=agent, policy_dir=policy or SHIPPED_POLICY, console=console)


def main() -> None:
    """Entry point for ``python -m evoharness_agent.cli``."""
    sys.exit(app())


if __name__ == "__main__":
    main()
