"""Generate the README's CLI and configuration references, or check that they are in sync.

The CLI reference comes from the typer app (every command, every option: its flags, choices,
default and help); the configuration reference from the config models of
``evoharness_agent/learning/config.py`` and the dataclasses they take their defaults from
(every key, its default and meaning, from the attribute docstrings), plus each algorithm's
``params``. Each is written between its marker comments in README.md.

Usage: python scripts/readme_reference.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

import typer.main

from evoharness_agent.cli import app
from evoharness_agent.learning.algorithms import ALGORITHMS
from evoharness_agent.learning.config import ModelSection, RewardSection, TrainConfig
from evoharness_agent.learning.networks import NetworkConfig
from evoharness_agent.rewards import RewardConfig

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = ("cli-reference", "config-reference")

# Sections whose keys repeat a dataclass's fields: their meanings are documented there, once.
_DOCUMENTED_IN: dict[type, type] = {RewardSection: RewardConfig, ModelSection: NetworkConfig}


def attribute_docs(cls: type) -> dict[str, str]:
    """Return the docstrings written under the attributes of ``cls`` (its source), first paragraph each."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for statement, following in zip(body, body[1:], strict=False):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            first = inspect.cleandoc(following.value.value).split("\n\n")[0]
            docs[statement.target.id] = " ".join(first.split())
    return docs


def _cell(text: str) -> str:
    """Return ``text`` (a docstring's reST or plain help) as markdown safe inside a table cell."""
    text = re.sub(r":\w+:`~?([\w.]+)`", lambda match: f"`{match.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


def _shown_default(value: Any) -> str:
    """Return a default as the README shows it."""
    if value is None or value == [] or value == ():
        return "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(getattr(value, "value", value))


def _values(annotation: Any, is_flag: bool) -> str:
    """Return what an option takes, from its annotation: its choices, ``flag``, or the value's kind."""
    if is_flag:
        return "flag"
    kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)] or [annotation]
    kind = kinds[0]
    if typing.get_origin(kind) is list:
        kind = typing.get_args(kind)[0]
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in kind)
    return {Path: "PATH", int: "INTEGER", float: "FLOAT", str: "TEXT"}.get(kind, str(kind).upper())


def cli_reference() -> str:
    """Return the CLI reference: one table of options per command, from the typer app itself."""
    # Typer builds the commands with its own copy of click: read them by their attributes.
    group: Any = typer.main.get_command(app)
    lines = [f"`evoharness-agent COMMAND [OPTIONS]`: {group.help}", ""]
    for name, command in group.commands.items():
        lines += [f"#### `evoharness-agent {name}`", "", (command.help or "").strip(), "",
                  "| option | values | default | meaning |", "|---|---|---|---|"]
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            flags = " / ".join(f"`{flag}`" for flag in [*param.opts, *param.secondary_opts])
            values = _values(param.type_descriptor.annotation, param.is_flag) + (" ..." if param.multiple else "")
            default = "required" if param.required else _shown_default(param.default)
            lines.append(f"| {flags} | {values} | {_cell(default)} | {_cell(param.help or '')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def config_reference() -> str:
    """Return the configuration reference: every key of every section, its default and meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, info in TrainConfig.model_fields.items():
        model = info.annotation
        assert isinstance(model, type)
        docs = {**attribute_docs(_DOCUMENTED_IN[model]), **attribute_docs(model)} if model in _DOCUMENTED_IN \
            else attribute_docs(model)
        for key, field in model.model_fields.items():  # type: ignore[attr-defined]
            default = field.get_default(call_default_factory=True)
            lines.append(f"| `{section}.{key}` | `{_shown_default(default)}` | {_cell(docs.get(key, ''))} |")
    lines += ["", "`algorithm.params`, per algorithm (`params: {alpha: 1.0}`):", "",
              "| algorithm | key | default | meaning |", "|---|---|---|---|"]
    for name, (_, config_class) in ALGORITHMS.items():
        docs = attribute_docs(config_class)
        for field in dataclasses.fields(config_class):
            lines.append(f"| `{name}` | `{field.name}` | `{field.default}` | {_cell(docs.get(field.name, ''))} |")
    return "\n".join(lines) + "\n"


def _pattern(block: str) -> re.Pattern[str]:
    """Return the regex of a marked block, the markers kept as groups."""
    return re.compile(rf"(<!-- {block}:start[^>]*-->\n)(.*?)(<!-- {block}:end -->)", re.S)


def render(text: str) -> str:
    """Return README text with every marked block regenerated."""
    contents = {"cli-reference": cli_reference(), "config-reference": config_reference()}
    for block in BLOCKS:
        pattern = _pattern(block)
        if not pattern.search(text):
            raise SystemExit(f"{README}: no '<!-- {block}:start -->' ... '<!-- {block}:end -->' block")
        text = pattern.sub(lambda match, body=contents[block]: match.group(1) + body + match.group(3), text)
    return text


def main() -> None:
    """Rewrite the README's generated blocks, or with ``--check`` fail when they are stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args()
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{README} is out of date: run python scripts/readme_reference.py", file=sys.stderr)
            raise SystemExit(1)
        return
    if wanted != current:
        README.write_text(wanted)
        print(f"{README} updated")


if __name__ == "__main__":
    main()
