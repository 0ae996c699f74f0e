"""reinforge.usercode: one syntax for reward functions, tools and environments; the old forms
load with one deprecation line each; `python:<name>` only ever names what was handed over in Python."""
from __future__ import annotations

import pytest

from reinforge.agents.envs import load_env
from reinforge.agents.tools import load_tool
from reinforge.config.load import ConfigError
from reinforge.rewards.registry import load_reward_fn
from reinforge.usercode import is_in_process_name, load_user_object

CODE = """from reinforge.agents.base import Environment, EnvStep
def score(prompt, response, ground_truth, **extra):
    return 1.0
def shout(text: str) -> str:
    '''Upper-case a text.'''
    return text.upper()
class Once(Environment):
    def reset(self, row):
        return ""
    def step(self, action):
        return EnvStep(None, done=True)
"""


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(CODE)
    return tmp_path / "mine.py"


def test_one_syntax_for_all_three(user_file, capsys):
    fn = load_reward_fn("mine.py:score")
    assert fn("p", "r", "g") == 1.0 and load_tool("mine.py:shout").fn(text="a") == "A"
    assert load_env(f"{user_file}:Once")().step("x").done  # an absolute path too
    # one module per file and process, whichever kind named it
    assert load_user_object("mine.py:score", "reward") is fn
    assert load_reward_fn("reinforge.rewards.builtin:exact_match") is load_reward_fn("exact_match")
    assert load_tool("tests.test_usercode:documented").name == "documented"
    assert capsys.readouterr().err == ""  # no deprecation line for the documented syntax


def documented(x: str) -> str:
    """A tool in an importable module."""
    return x


@pytest.mark.parametrize("load, old, new", [
    (load_tool, "python:mine.py:shout", "mine.py:shout"),
    (load_env, "python:mine.py:Once", "mine.py:Once"),
    (load_reward_fn, "python:mine.py:score", "mine.py:score"),
    (load_reward_fn, "reinforge.rewards.builtin.format_reward", "reinforge.rewards.builtin:format_reward"),
])
def test_old_forms_load_with_one_deprecation_line(user_file, capsys, load, old, new):
    import reinforge.usercode as usercode

    usercode._warned.discard(old)
    first, again = load(old), load(old)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [lines[0]] and lines[0].startswith("[reinforge] deprecated: ") and f"write '{new}'" in lines[0]
    assert type(first) is type(again)


def test_python_prefix_means_handed_over_in_python(user_file):
    from reinforge.rewards.registry import register_python_reward

    def mine(prompt, response, ground_truth, **extra):
        return 0.0

    name = register_python_reward(mine)
    assert name == "python:mine" and is_in_process_name(name) and load_reward_fn(name) is mine
    assert is_in_process_name("python:train_dataset") and not is_in_process_name("python:mine.py:score")
    with pytest.raises(ConfigError, match="handed to RLTrainer"):
        load_reward_fn("python:not_handed_over")


@pytest.mark.parametrize("spec, message", [
    ("mine.py:nothing", "reward 'mine.py:nothing': .*mine.py has no attribute 'nothing' \\(not a callable\\)"),
    ("absent.py:f", "reward file not found: .*absent.py"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz' \\(importing no_such_module_xyz raised "
                             "ModuleNotFoundError"),
    ("mine.py:", "expected 'module:attr' or 'path/file.py:attr'"),
])
def test_errors_name_the_kind_and_spec(user_file, spec, message):
    with pytest.raises(ConfigError, match=message):
        load_reward_fn(spec)
