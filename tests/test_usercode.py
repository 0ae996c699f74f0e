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


@pytest.fixture
def clean_imports(monkeypatch):
    """sys.path and sys.modules as they were, after the test (it imports throw-away modules)."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _folder(root, name: str, files: dict[str, str]):
    folder = root / name
    folder.mkdir()
    for file, text in files.items():
        (folder / file).write_text(text)
    return folder


def test_a_file_imports_modules_beside_it_from_any_directory(tmp_path, monkeypatch, clean_imports):
    """`from helpers import ...` beside the reward file, at import and inside the function, with
    the working directory elsewhere; while the file runs its folder leads sys.path, afterwards
    it is only at the end (it shadows no installed module)."""
    import os
    import sys

    rewards = _folder(tmp_path, "rewards", {
        "helpers_u1.py": "def double(x):\n    return 2 * x\n",
        "late_u1.py": "BONUS = 0.5\n",
        "reward.py": "import sys\nfrom helpers_u1 import double\nAT_IMPORT = sys.path[0]\n"
                     "def score(prompt, response, ground_truth, **extra):\n"
                     "    import late_u1\n    return double(len(response)) + late_u1.BONUS\n"})
    elsewhere = _folder(tmp_path, "elsewhere", {})
    monkeypatch.chdir(elsewhere)
    before = [p for p in sys.path if p and os.path.abspath(p) != str(elsewhere)]  # as the console script has it
    sys.path[:] = before
    fn = load_reward_fn("../rewards/reward.py:score")
    assert fn("p", "abc", None) == 6.5
    assert sys.modules[fn.__module__].AT_IMPORT == str(rewards)
    assert sys.path == [*before, str(rewards), str(elsewhere)]
    assert load_reward_fn(f"{rewards}/reward.py:score") is fn  # one module per file and process


def test_a_module_beside_the_file_already_loaded_from_elsewhere_is_an_error(tmp_path, clean_imports):
    """Two reward folders that each hold helpers_u2.py: the second file would silently get the
    first folder's module (Python's one namespace of module names), so it fails naming both."""
    helper = "VALUE = {}\n"
    reward = "from helpers_u2 import VALUE\ndef score(prompt, response, ground_truth, **extra):\n    return VALUE\n"
    a = _folder(tmp_path, "a", {"helpers_u2.py": helper.format(1), "reward.py": reward})
    b = _folder(tmp_path, "b", {"helpers_u2.py": helper.format(2), "reward.py": reward})
    assert load_reward_fn(f"{a}/reward.py:score")("p", "r", None) == 1
    with pytest.raises(ConfigError, match=rf"^reward file {b}/reward.py imports 'helpers_u2', which is "
                                          rf"{b}/helpers_u2.py, but a module 'helpers_u2' is already loaded from "
                                          rf"{a}/helpers_u2.py; rename {b}/helpers_u2.py"):
        load_reward_fn(f"{b}/reward.py:score")


def test_a_module_spec_is_found_in_the_working_directory(tmp_path, monkeypatch, clean_imports):
    """`module:fn` for a module in the working directory, which the console script's sys.path lacks."""
    import os
    import sys

    here = _folder(tmp_path, "here", {"cwd_rewards_u3.py": "def score(prompt, response, ground_truth, **extra):\n"
                                                           "    return 3.0\n"})
    monkeypatch.chdir(here)
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != str(here)]
    assert load_reward_fn("cwd_rewards_u3:score")("p", "r", None) == 3.0
    assert sys.path[-1] == str(here)
