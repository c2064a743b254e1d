"""Real LangChain tools the agent tests run: weather, calculator, search, delete, time, job polling."""

from __future__ import annotations

import ast
import operator

from langchain_core.tools import BaseTool, ToolException, tool

DELETED: list[str] = []

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ToolException(f"unsupported expression: {ast.dump(node)}")


@tool
def get_weather(city: str) -> str:
    """Get the current weather forecast for a city."""
    return f"Sunny, 21 C in {city}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as error:
        raise ToolException(f"not an arithmetic expression: {expression!r}") from error
    value = _evaluate(tree)
    return str(int(value) if float(value).is_integer() else value)


calculator.handle_tool_error = True


@tool
def search_web(query: str) -> str:
    """Search the web for facts about a topic."""
    city = query.rsplit(" ", 1)[-1]
    return f"{city} has 1000 people"


@tool
def delete_file(path: str) -> str:
    """Delete a file from disk permanently."""
    DELETED.append(path)
    return f"deleted {path}"


@tool
def get_time() -> str:
    """Return the current date and time."""
    return "2025-01-01 12:00"


@tool
def check_job(job_id: str) -> str:
    """Check whether a background job has finished."""
    return f"job {job_id} is still running"


TOOLS: list[BaseTool] = [get_weather, calculator, search_web, delete_file, get_time, check_job]
