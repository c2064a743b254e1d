"""The wheel, installed outside the checkout, has what a newcomer needs: the CLI, the default policy, the data.

The wheel is built from the checkout and installed with ``pip --python`` into a fresh venv
in a temporary folder. The venv reaches the dependencies (torch, transformers, ...) through
a ``.pth`` line naming the project venv's site-packages: a path line adds the folder without
running the ``.pth`` files in it, so the project's editable install (a ``.pth`` finder)
stays out, and ``evoharness_agent`` can only come from the wheel. Every command runs from
another directory, with no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_WHEEL_BYTES = 12_000_000  # 10.6 MB: the bundled data 5.4, the step model 4.4, the policy 1.4


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wheel")
    wheels = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, cwd=root)
    (wheel,) = wheels.glob("evoharness_agent-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, cwd=root)
    work = root / "elsewhere"
    work.mkdir()
    return {"wheel": wheel, "python": python, "bin": venv / "bin", "site": site, "work": work}


def _run(installed: dict[str, Path], *command: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run(list(command), cwd=installed["work"], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_wheel_is_small_and_has_the_policy_and_the_data(installed: dict[str, Path]) -> None:
    size = installed["wheel"].stat().st_size
    print(f"wheel: {installed['wheel'].name}, {size / 1e6:.1f} MB")
    assert size < MAX_WHEEL_BYTES
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert {"evoharness_agent/trained/default/policy.safetensors",
            "evoharness_agent/trained/all-MiniLM-L6-v2-static64/model.safetensors",
            "evoharness_agent/trained/all-MiniLM-L6-v2-static64/LICENSE.all-MiniLM-L6-v2.txt",
            "evoharness_agent/data/README.md",
            "evoharness_agent/data/bfcl/multi_turn_base.jsonl.gz",
            "evoharness_agent/data/tau_bench/db/airline/flights.json.gz",
            "evoharness_agent/data/metatool/LICENSE.MetaTool.txt"} <= names


def test_package_comes_from_the_wheel(installed: dict[str, Path]) -> None:
    where = _run(installed, str(installed["python"]), "-c", "import evoharness_agent; print(evoharness_agent.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(installed["site"])


def test_cli_help(installed: dict[str, Path]) -> None:
    result = _run(installed, str(installed["bin"] / "evoharness-agent"), "--help")
    assert "train" in result.stdout and "evaluate" in result.stdout


def test_default_policy_ranks_quietly(installed: dict[str, Path]) -> None:
    script = (
        "from langchain_core.tools import tool\n"
        "from evoharness_agent import ToolPolicy\n"
        "@tool\n"
        "def get_weather(city: str) -> str:\n"
        "    '''Current weather of a city.'''\n"
        "    return 'sunny'\n"
        "@tool\n"
        "def send_email(to: str, body: str) -> str:\n"
        "    '''Send an email.'''\n"
        "    return 'sent'\n"
        "policy = ToolPolicy.load('default')\n"
        "ranked = policy.rank('What is the weather in Lyon?', history=[], tools=[get_weather, send_email])\n"
        "print(ranked[0].tool)\n"
        "from evoharness_agent.encoding.embedder import model_path\n"
        "print(policy.encoder.embed_steps(['called get_weather -> sunny']).shape[1])\n"
        "print(model_path(policy.encoder.step_model))\n"
    )
    result = _run(installed, str(installed["python"]), "-c", script)
    top, width, step_model = result.stdout.split()
    assert (top, width) == ("get_weather", "384")  # the history steps on the step model in the wheel, padded
    assert Path(step_model).is_relative_to(installed["site"])
    assert "Loading weights" not in result.stderr


def test_evaluate_on_bundled_data(installed: dict[str, Path]) -> None:
    data = installed["site"] / "evoharness_agent" / "data" / "tau2_bench" / "airline.jsonl.gz"
    cli = str(installed["bin"] / "evoharness-agent")
    # Offline, no --baseline-data: the default records its training data by name.
    _run(installed, cli, "evaluate", "--policy", "default", "--data", str(data), "--json", "offline.json")
    offline = json.loads((installed["work"] / "offline.json").read_text())
    assert offline["n_decisions"] > 0 and set(offline["metrics"]) >= {"policy", "bigram"}
    # Online, in a bundled environment: one tau-airline task with gold arguments.
    _run(installed, cli, "evaluate", "--env", "tau-airline", "--policy", "default", "--limit", "1",
         "--json", "online.json")
    assert (installed["work"] / "online.json").is_file()
