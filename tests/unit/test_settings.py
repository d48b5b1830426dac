"""Each engine setting is defined once, as a field of EngineConfig; the flags, variables, keyword arguments and docs follow."""
from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass

import pytest

from helios.cli import add_engine_args, build_parser, engine_settings
from helios.config import EngineConfig, setting, settings, settings_table


@dataclass(frozen=True)
class WithOneMore(EngineConfig):
    "EngineConfig with one setting added, the way a new one is added: one field."
    lookahead_ticks: int = setting(3, "ticks the scheduler plans ahead", at_least=1)


def parser_for(cls) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x")
    add_engine_args(parser, cls)
    return parser


def test_a_new_field_is_a_flag_with_its_default_and_variable_in_the_help():
    text = " ".join(parser_for(WithOneMore).format_help().split())
    assert "--lookahead-ticks LOOKAHEAD_TICKS ticks the scheduler plans ahead (default: 3) [HELIOS_LOOKAHEAD_TICKS]" in text
    args = parser_for(WithOneMore).parse_args(["--lookahead-ticks", "5", "--max-batch-size", "4"])
    assert WithOneMore.from_env({}, **engine_settings(args, WithOneMore)) == WithOneMore(max_batch_size=4, lookahead_ticks=5)
    assert parser_for(WithOneMore).parse_args([]).lookahead_ticks is None  # not given: the variable, then the default
    with pytest.raises(SystemExit):  # its range is checked where the flag is parsed
        parser_for(WithOneMore).parse_args(["--lookahead-ticks", "0"])


def test_a_new_field_reads_its_environment_variable():
    assert WithOneMore.from_env({"HELIOS_LOOKAHEAD_TICKS": "7"}).lookahead_ticks == 7
    assert WithOneMore.from_env({"HELIOS_LOOKAHEAD_TICKS": "7"}, lookahead_ticks=2).lookahead_ticks == 2  # explicit wins
    assert WithOneMore.from_env({}).lookahead_ticks == 3
    with pytest.raises(ValueError, match="HELIOS_LOOKAHEAD_TICKS='soon' is not a valid int"):
        WithOneMore.from_env({"HELIOS_LOOKAHEAD_TICKS": "soon"})
    with pytest.raises(ValueError, match="lookahead_ticks must be >= 1, got 0"):
        WithOneMore.from_env({"HELIOS_LOOKAHEAD_TICKS": "0"})


def test_a_new_field_is_a_keyword_argument():
    "What LLM(**kwargs) does with its keyword arguments, without loading a model."
    assert WithOneMore.from_env({}, lookahead_ticks=9, page_size=16) == WithOneMore(lookahead_ticks=9, page_size=16)
    with pytest.raises(TypeError, match="'lookahead_tick' is not an engine setting; did you mean 'lookahead_ticks'"):
        WithOneMore.from_env({}, lookahead_tick=9)


def test_a_new_field_is_a_row_of_the_settings_table():
    rows = settings_table(WithOneMore).splitlines()
    assert rows[-1] == "| `lookahead_ticks` | `--lookahead-ticks` | `HELIOS_LOOKAHEAD_TICKS` | 3 | ticks the scheduler plans ahead |"
    assert len(rows) == 2 + len(settings(EngineConfig)) + 1


def test_an_unknown_keyword_is_refused_by_name():
    with pytest.raises(TypeError, match="'max_batch' is not an engine setting; did you mean 'max_batch_size'"):
        EngineConfig.from_env({}, max_batch=8)
    with pytest.raises(TypeError, match="'colour' is not an engine setting; the settings are max_batch_size, "):
        EngineConfig.from_env({}, colour="blue")


def test_llm_shows_every_setting_in_its_signature():
    from helios import LLM
    params = inspect.signature(LLM).parameters
    for s in settings(EngineConfig):
        assert params[s.name].kind is inspect.Parameter.KEYWORD_ONLY and params[s.name].default == s.default, s.name
    with pytest.raises(TypeError, match="did you mean 'kv_cache_bytes'"):
        LLM(kv_cache_byte=10**9)  # refused before any model loads


def test_every_setting_is_a_flag_of_the_commands_with_its_default():
    for command in (["serve"], ["generate", "hi"], ["chat"]):
        args = build_parser().parse_args(command)
        assert engine_settings(args) == {s.name: None for s in settings(EngineConfig)}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["serve"].format_help().split())
    for s in settings(EngineConfig):
        assert f"(default: {s.default_text}) [{s.env}]" in text, s.name
    assert "(default: 127.0.0.1)" in text and "(default: 8000)" in text  # the server's own flags show theirs too
