"""What a new user meets first, without a server: the request models refuse unknown fields with a suggestion,
`helios bench` needs only the runtime dependencies, every `--help` option shows its default, a missing local
path is said to be missing, and `helios --help` loads neither torch nor the engine."""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def runtime_distributions() -> set[str]:
    "The distributions pyproject.toml's [project] dependencies name, normalised."
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def imports_of(module: str) -> set[str]:
    "Absolute names of the modules a helios module imports, anywhere in its source (functions included)."
    path = Path(importlib.util.find_spec(module).origin)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import): names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names.add(target)
            names |= {f"{target}.{a.name}" for a in node.names}
    return names


def third_party_of(entry: str, skip: frozenset[str]) -> dict[str, str]:
    "Every top-level non-helios module the helios modules reachable from entry import: {module: importer}."
    seen, todo, found = set(), [entry], {}
    while todo:
        module = todo.pop()
        if module in seen or module in skip: continue
        seen.add(module)
        for name in imports_of(module):
            top = name.split(".")[0]
            if top == "helios":
                if importlib.util.find_spec(name.rsplit(".", 1)[0] if name.count(".") > 1 else name) is None: continue
                try:
                    is_module = importlib.util.find_spec(name) is not None
                except ModuleNotFoundError:
                    is_module = False
                todo.append(name if is_module else name.rsplit(".", 1)[0])
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, module)
    return found


def test_bench_needs_only_the_runtime_dependencies():
    """`pip install -e .` then `helios bench` (issue 46: httpx was only in [dev]). matplotlib is the one optional
    import: `--plot` without it is a one-line error before the run (tested below)."""
    runtime, dists = runtime_distributions(), packages_distributions()
    # helios.cli imports helios.bench.main only for `bench`; generate/serve/chat load the engine, not bench
    found = third_party_of("helios.bench.main", skip=frozenset({"helios.viz"}))
    assert "httpx" in found, "the bench client should be among what is checked"
    missing = {mod: by for mod, by in found.items() if mod != "matplotlib"
               and not {d.lower().replace("_", "-") for d in dists.get(mod, [mod])} & runtime}
    assert not missing, f"imported by helios bench but not a runtime dependency in pyproject.toml: {missing}"
    assert found.get("matplotlib") == "helios.bench.report"


def test_plot_without_matplotlib_is_one_line_before_the_run(tmp_path):
    code = ("import importlib.util as u; "
            "u.find_spec = lambda name, *a, f=u.find_spec: None if name == 'matplotlib' else f(name, *a); "
            "from helios.cli import main; main(['bench', '--base-url', 'http://127.0.0.1:9/v1', '--plot', 'x.png'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "helios: error: --plot needs matplotlib, which is not installed: pip install matplotlib"


def test_help_loads_neither_torch_nor_the_engine():
    code = ("import sys; from helios.cli import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'helios.engine', 'helios.llm', 'fastapi') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def help_options(text: str) -> dict[str, str]:
    "Each option of an argparse --help that takes a value, with its help text (lines joined)."
    options, current = {}, None
    for line in text.split("options:", 1)[1].splitlines():
        m = re.match(r"^  (?:-\w+, )?(--[\w-]+)((?: [^\s\[]\S*| \[[^\]]*\])*)(?:\s{2,}(.*))?$", line)
        if m:
            current = m.group(1) if m.group(2) else None  # flags without a value have no default to show
            if current: options[current] = m.group(3) or ""
        elif current and line.startswith("     "):
            options[current] += " " + line.strip()
        elif not line.strip(): current = None
    return options


@pytest.mark.parametrize("command", ["serve", "generate", "chat", "bench"])
def test_help_shows_every_default(command):
    r = subprocess.run(["helios", command, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    options = help_options(r.stdout)
    assert len(options) >= (20 if command != "bench" else 16)
    for must in {"serve": ["--host", "--port", "--max-batch-size", "--page-size", "--shutdown-grace-s", "--log-level"],
                 "generate": ["--max-tokens"], "chat": ["--max-tokens"], "bench": ["--workload"]}[command]:
        assert must in options, must
    without = [name for name, text in options.items() if "(default:" not in text]
    assert not without, f"helios {command} --help shows no default for {without}"
    if command == "serve":
        assert "(default: 127.0.0.1)" in options["--host"] and "(default: 8000)" in options["--port"]
        assert "{critical,error,warning,info,debug,trace}" in r.stdout
    if command == "bench":  # each workload with its one-line description
        from helios.bench.workloads import WORKLOADS
        listed = r.stdout.split("workloads:", 1)[1]
        for name in WORKLOADS:
            assert re.search(rf"^  {re.escape(name)}\s+\S", listed, re.M), name


@pytest.mark.parametrize("missing", ["/nonexistent", "./missing-folder", "../missing/model.gguf", "~/no-such-model"])
def test_a_missing_local_path_is_said_to_be_missing(missing):
    from helios.formats.hf import ModelNotFoundError
    from helios.weights import find_checkpoint, looks_like_path
    assert looks_like_path(missing)
    with pytest.raises(ModelNotFoundError, match="does not exist") as e:
        find_checkpoint(missing)
    assert repr(missing) in str(e.value) and "hub" not in str(e.value).lower()


def test_repo_ids_are_not_paths():
    from helios.weights import looks_like_path
    for repo in ("Qwen/Qwen3-0.6B", "HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.2-1B"):
        assert not looks_like_path(repo)
    assert looks_like_path("models/qwen/latest")  # two separators: no repo id has them


def test_llm_with_a_missing_path():
    from helios.formats.hf import ModelNotFoundError
    from helios.llm import LLM
    for missing in ("/nonexistent", "./missing-folder"):
        with pytest.raises(ModelNotFoundError, match=f"the path '{re.escape(missing)}' does not exist"):
            LLM(missing)


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"]])
def test_cli_with_a_missing_path(command):
    r = subprocess.run(["helios", *command, "--model", "/nonexistent"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("helios: error: the path '/nonexistent' does not exist")
    assert len(r.stderr.strip().splitlines()) == 1


# --- unknown request fields: a 400 naming the field, with the closest known one ---

def refusal(model, body: dict):
    from helios.server.errors import APIError
    from helios.server.protocol import parse_body
    with pytest.raises(APIError) as e:
        parse_body(model, json.dumps(body).encode())
    return e.value


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("endpoint, body, param, suggestion", [
    ("chat", {**CHAT, "max_token": 8}, "max_token", "max_tokens"),
    ("completions", {"prompt": "hi", "max_token": 8}, "max_token", "max_tokens"),
    ("chat", {**CHAT, "temprature": 0.5}, "temprature", "temperature"),
    ("completions", {"prompt": "hi", "temprature": 0.5}, "temprature", "temperature"),
    ("chat", {**CHAT, "response_fromat": {"type": "json_object"}}, "response_fromat", "response_format"),
    ("chat", {"messages": [{"role": "user", "content": "hi", "rol": "x"}]}, "messages[0].rol", "role"),
    ("chat", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {},
                                                                                "stirct": True}}},
     "response_format.json_schema.stirct", "strict"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "descripton": "d"}}]},
     "tools[0].function.descripton", "description"),
    ("chat", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "f", "nmae": "f"}},
              "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice.function.nmae", "name"),
    ("chat", {**CHAT, "stream": True, "stream_options": {"include_usgae": True}}, "stream_options.include_usgae",
     "include_usage"),
    ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                                  "function": {"name": "f", "argument": "{}"}}]}]},
     "messages[0].tool_calls[0].function.argument", "arguments"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "txt": "hi", "text": "hi"}]}]},
     "messages[0].content[0].txt", "text"),
    ("tokenize", {"prompt": "hi", "add_special_token": True}, "add_special_token", "add_special_tokens"),
    ("detokenize", {"tokens": [1], "modle": "x"}, "modle", "model"),
])
def test_an_unknown_field_is_a_400_that_names_it(endpoint, body, param, suggestion):
    from helios.server import protocol
    model = {"chat": protocol.ChatCompletionRequest, "completions": protocol.CompletionRequest,
             "tokenize": protocol.TokenizeRequest, "detokenize": protocol.DetokenizeRequest}[endpoint]
    e = refusal(model, body)
    assert (e.status, e.param, e.type) == (400, param, "invalid_request_error")
    assert e.message == f"{param}: unknown field; did you mean {suggestion!r}?"


def test_an_unknown_field_far_from_any_is_named_without_a_guess():
    from helios.server.protocol import ChatCompletionRequest
    e = refusal(ChatCompletionRequest, {**CHAT, "xyzzy": 1})
    assert (e.param, e.message) == ("xyzzy", "xyzzy: unknown field")


# Every request field OpenAI's API reference documents for these endpoints (chat completions, completions)
OPENAI_CHAT_FIELDS = {
    "messages": CHAT["messages"], "model": "m", "audio": None, "frequency_penalty": 0.0, "function_call": None,
    "functions": None, "logit_bias": {"1": 0}, "logprobs": True, "max_completion_tokens": 8, "max_tokens": 8,
    "metadata": {"k": "v"}, "modalities": ["text"], "n": 1, "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.0, "prompt_cache_key": "k",
    "prompt_cache_retention": "24h", "reasoning_effort": "low", "response_format": {"type": "text"},
    "safety_identifier": "s", "seed": 1, "service_tier": "auto", "stop": ["x"], "store": False, "stream": True,
    "stream_options": {"include_usage": True, "include_obfuscation": False}, "temperature": 0.5,
    "tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                                      "parameters": {}, "strict": True}}],
    "top_logprobs": 2, "top_p": 0.9, "user": "u", "verbosity": "low", "web_search_options": None}
OPENAI_COMPLETION_FIELDS = {
    "model": "m", "prompt": "hi", "best_of": 1, "echo": False, "frequency_penalty": 0.0, "logit_bias": {"1": 0},
    "logprobs": 1, "max_tokens": 8, "n": 1, "presence_penalty": 0.0, "seed": 1, "stop": "x", "stream": True,
    "stream_options": {"include_usage": True}, "suffix": None, "temperature": 0.5, "top_p": 0.9, "user": "u"}
# vLLM's extras the models accepted before unknown fields were refused
VLLM_EXTRAS = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True, "stop_token_ids": [1]}


def test_every_field_openais_reference_documents_is_accepted():
    from helios.server.protocol import ChatCompletionRequest, CompletionRequest, parse_body
    parse_body(ChatCompletionRequest, json.dumps({**OPENAI_CHAT_FIELDS, **VLLM_EXTRAS,
                                                  "chat_template_kwargs": {"enable_thinking": False}}).encode())
    parse_body(CompletionRequest, json.dumps({**OPENAI_COMPLETION_FIELDS, **VLLM_EXTRAS}).encode())
    # message fields: a named user, an assistant's refusal and the reasoning this server returned, replayed
    parse_body(ChatCompletionRequest, json.dumps({"messages": [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "no", "refusal": None, "reasoning_content": "think", "audio": None},
        {"role": "user", "content": "ok"}]}).encode())


@pytest.mark.parametrize("body, param, words", [
    ({**CHAT, "audio": {"voice": "alloy", "format": "mp3"}}, "audio", "audio output"),
    ({**CHAT, "modalities": ["text", "audio"]}, "modalities[1]", "'text'"),
    ({**CHAT, "functions": [{"name": "f"}]}, "functions", "tools"),
    ({**CHAT, "web_search_options": {}}, "web_search_options", "web search"),
])
def test_openai_fields_that_ask_for_more_are_refused_with_the_reason(body, param, words):
    from helios.server.protocol import ChatCompletionRequest
    e = refusal(ChatCompletionRequest, body)
    assert e.status == 400 and e.param == param and words in e.message, e.message


def test_completions_best_of_and_suffix():
    from helios.server.protocol import CompletionRequest
    assert "best_of" in refusal(CompletionRequest, {"prompt": "hi", "best_of": 3}).message
    assert "suffix" in refusal(CompletionRequest, {"prompt": "hi", "suffix": "end"}).message
