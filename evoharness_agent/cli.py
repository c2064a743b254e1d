"""The ``evoharness-agent`` command line: train, evaluate and demo."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from evoharness_agent.importers import LogFormatError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Learn which tool an agent should call next, from its logs, with offline RL.")
console = Console()


class Algo(str, Enum):
    """Offline RL algorithms."""

    bc = "bc"
    cql = "cql"
    iql = "iql"
    bcq = "bcq"


class Format(str, Enum):
    """Log formats."""

    auto = "auto"
    native = "native"
    openai = "openai"
    langchain = "langchain"


def _fail(message: str) -> typer.Exit:
    """Print an error and return the exit to raise."""
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code=2)


@app.command()
def train(
    data: Annotated[list[Path], typer.Option("--data", help="Log files or directories (repeatable).")],
    out: Annotated[Path, typer.Option(help="Where the policy, checkpoints and logs go.")],
    algo: Annotated[Algo | None, typer.Option(help="Algorithm (default: config, else iql).")] = None,
    log_format: Annotated[Format, typer.Option("--format", help="Log format.")] = Format.auto,
    config: Annotated[Path | None, typer.Option(help="YAML config (sections: data, algorithm, "
                                                     "model, rewards, training, logging).")] = None,
    init: Annotated[Path | None, typer.Option(help="Fine-tune from this policy directory.")] = None,
    steps: Annotated[int | None, typer.Option(help="Gradient steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Batch size.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for training.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoint in --out.")] = False,
    skip_invalid: Annotated[bool, typer.Option(help="Skip bad log lines (and report them).")] = False,
    default_reward: Annotated[float | None, typer.Option(help="Reward of episodes that have none.")] = None,
) -> None:
    """Train a tool-ranking policy on logged trajectories."""
    from evoharness_agent.config import load_config
    from evoharness_agent.trainer import train as run_training

    overrides = {
        "data": {"paths": [str(p) for p in data], "format": log_format.value,
                 "skip_invalid": skip_invalid or None, "default_reward": default_reward},
        "algorithm": {"name": algo.value if algo else None},
        "training": {"steps": steps, "batch_size": batch_size, "device": device, "threads": threads,
                     "seed": seed},
    }
    try:
        cfg = load_config(config, overrides)
        result = run_training(cfg, out, init=init, resume=resume)
    except (LogFormatError, ValueError, FileNotFoundError) as error:
        raise _fail(str(error)) from error
    console.print(f"policy written to [bold]{out}[/]  ({result['n_transitions']} transitions, "
                  f"{result['n_encoded']} texts encoded, the rest from cache)")
    console.print({k: round(v, 4) for k, v in result.items() if isinstance(v, float)})


def _load(paths: Sequence[Path | str], log_format: str, skip_invalid: bool) -> list:
    """Load logs for evaluation, reporting skipped lines."""
    from evoharness_agent.importers import load_episodes

    loaded = load_episodes(list(paths), log_format, skip_invalid=skip_invalid)
    if loaded.skipped:
        console.print(loaded.summary())
    return loaded.episodes


@app.command()
def evaluate(
    policy: Annotated[Path, typer.Option(help="Policy directory.")],
    data: Annotated[list[Path], typer.Option("--data", help="Logs to evaluate on (repeatable).")],
    log_format: Annotated[Format, typer.Option("--format", help="Log format.")] = Format.auto,
    baseline_data: Annotated[list[Path] | None, typer.Option(
        help="Logs the count baselines are fit on (default: the policy's training logs).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write metrics as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="Skip bad log lines (and report them).")] = False,
) -> None:
    """Next-tool prediction of a policy against four baselines, in one run."""
    from evoharness_agent.evaluation import evaluate_offline, plot_report, print_report
    from evoharness_agent.policy import ToolPolicy

    try:
        loaded_policy = ToolPolicy.load(policy)
        episodes = _load(data, log_format.value, skip_invalid)
        baseline_paths = baseline_data or loaded_policy.meta["config"]["data"]["paths"]
        if not baseline_paths:
            raise ValueError("the policy does not record its training logs: pass --baseline-data")
        baseline_format = log_format.value if baseline_data else loaded_policy.meta["config"]["data"]["format"]
        baseline = _load(baseline_paths, baseline_format, skip_invalid)
    except (LogFormatError, ValueError, FileNotFoundError) as error:
        raise _fail(str(error)) from error
    report = evaluate_offline(loaded_policy, episodes, baseline)
    print_report(report, f"{policy}", console)
    if json_out:
        report.write_json(json_out)
        console.print(f"metrics written to {json_out}")
    if plot:
        plot_report(report, plot)
        console.print(f"plot written to {plot}")


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Where to write the demo's policies and plots.")] = Path("runs/demo"),
    steps: Annotated[int, typer.Option(help="Gradient steps per algorithm.")] = 1500,
) -> None:
    """Train on bundled BFCL logs (scenarios ≢ 0 mod 5), evaluate on the rest vs baselines."""
    from evoharness_agent.demo import run_demo

    run_demo(out, steps=steps, console=console)


def main() -> None:
    """Entry point for ``python -m evoharness_agent.cli``."""
    sys.exit(app())


if __name__ == "__main__":
    main()
