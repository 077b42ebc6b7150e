"""The README's commands work as written: CI runs them from README.md itself, the install line
installs what the test line needs, and the defaults the README shows are the commands' defaults."""

from __future__ import annotations

import importlib.util
import re
import shlex

from pathlib import Path

import click
import pytest

from osprey_cli.main import COMMANDS, cli

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The command walk-through and the input example moved from the README to this page (issue 35).
WALKTHROUGH = (ROOT / "docs" / "walkthrough.md").read_text(encoding="utf-8")


def _readme_commands() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_commands(README)


def test_ci_runs_the_readme_commands_as_written():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # CI takes both commands out of README.md and runs them: nothing to keep in sync by hand
    assert '"$(python .ci/readme_commands.py install)"' in ci and 'eval "$install_cmd"' in ci
    assert '"$(python .ci/readme_commands.py test)"' in ci and 'eval "$test_cmd"' in ci
    main_env = ci.split("deactivate")[0]  # the interop environment after it has its own installs
    # The docs extra (mkdocs, issue 35) is installed only once every test of this environment has run,
    # so the tests still see exactly what the README's install line installs.
    tests_part, _, docs_part = main_env.partition("# The documentation site in strict mode")
    assert '".[docs]"' in docs_part and "pytest" not in docs_part, "the docs build must come after the test steps"
    assert "pip install" not in tests_part.replace("pip install -q --upgrade pip", "")  # none of its own


def test_ci_refuses_a_base_interpreter_with_torch_before_making_its_venv():
    """CI's base interpreter lacks torch, as a new user's: a test that starts it by mistake (a
    link to sys.executable outside a venv) fails in CI, not only on the user's machine."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    guard = ci.find('for m in ("torch", "transformers")')
    assert 0 < guard < ci.find("python3 -m venv .venv"), "the base-interpreter check must come first"
    assert "_base_executable" in ci[:guard] and "exit 2" in ci[guard:ci.find("python3 -m venv .venv")]


def test_readme_install_line_installs_what_the_test_line_needs():
    commands = _readme_commands()
    install, test = commands["install"], commands["test"]
    assert install.endswith("osprey demo --quick")
    extras: set[str] = set()
    for part in install.split("&&"):
        argv = shlex.split(part)
        if argv[:2] == ["pip", "install"] and "-e" in argv:
            target = argv[argv.index("-e") + 1]
            assert target.startswith("."), target
            extras |= set(re.findall(r"\[(.*)\]", target)[0].split(",")) if "[" in target else set()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = list(project["dependencies"])
    for extra in extras:
        installed += project["optional-dependencies"][extra]
    names = {re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower() for req in installed}
    argv = shlex.split(test)
    assert argv[:3] == ["python", "-m", "pytest"]
    assert "pytest" in names, f"the README install line ({install!r}) does not install pytest"
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)  # `-m "not slow"` selects a registered marker


def _command(path: list[str]) -> click.Command:
    ctx = click.Context(cli)
    cmd: click.Command = cli
    for name in path:
        cmd = cmd.get_command(ctx, name)  # type: ignore[union-attr]
    return cmd


def _readme_invocations() -> list[tuple[list[str], str]]:
    """(command path, the rest of the line) of every ``osprey ...`` line in README and walk-through code blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README + WALKTHROUGH, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            m = re.search(r"\bosprey ((?:data|train|eval|study) [\w-]+|export|demo|fetch-model)(?![\w-])(.*)", line)
            if m:
                out.append((m.group(1).split(), m.group(2)))
    return out


def test_readme_shows_every_command_and_their_defaults():
    shown = {tuple(path) for path, _ in _readme_invocations()}
    every = {((group, name) if group else (name,)) for group, names in COMMANDS.items() for name in names}
    assert every <= shown, f"commands missing from the README: {sorted(every - shown)}"
    checked = 0
    for path, rest in _readme_invocations():
        params = {opt: p for p in _command(path).params for opt in p.opts}
        for opt, value in re.findall(r"\[(--[\w-]+) (\d+(?:\.\d+)?)\]", rest):
            assert opt in params, f"README shows {opt} for osprey {' '.join(path)}, which has no such option"
            if params[opt].default is None:
                continue  # an option without a default: the value shown is an example
            assert float(value) == float(params[opt].default), (
                f"README shows [{opt} {value}] for osprey {' '.join(path)}; the default is {params[opt].default}")
            checked += 1
    assert checked >= 5


@pytest.mark.parametrize("path", [[g, n] if g else [n] for g, names in COMMANDS.items() for n in names],
                         ids=lambda p: " ".join(p))
def test_every_option_has_help_and_every_command_an_example(path):
    cmd = _command(path)
    for p in cmd.params:
        if isinstance(p, click.Option):
            assert p.help, f"osprey {' '.join(path)} {p.opts[0]} has no help text"
    assert "Example:" in (cmd.help or ""), f"osprey {' '.join(path)} --help shows no example"
    assert f"osprey {' '.join(path)}" in cmd.help.split("Example:")[1]


def test_device_options_default_alike():
    defaults = {}
    for group, names in COMMANDS.items():
        for name in names:
            for p in _command([group, name] if group else [name]).params:
                if "--device" in getattr(p, "opts", ()):
                    defaults[f"{group} {name}".strip()] = p.default
    assert len(defaults) >= 6 and set(defaults.values()) == {"auto"}, defaults


def test_the_readme_input_example_parses_with_the_real_reader(tmp_path):
    """The README's example input lines are what ``osprey data build --input`` reads: both shapes,
    normalized to role/content turns, the optional keys kept and a missing id derived."""
    from osprey_data.conversation.inputs import iter_inputs

    blocks = re.findall(r"```jsonl\n(.*?)```", WALKTHROUGH, flags=re.S)
    assert len(blocks) == 1, "docs/walkthrough.md shows one input example (```jsonl)"
    path = tmp_path / "example.jsonl"
    path.write_text(blocks[0], encoding="utf-8")
    samples = list(iter_inputs([str(path)]))
    assert len(samples) == len(blocks[0].strip().splitlines()) == 2
    chat, math = samples
    assert chat.sample_id == "chat-1" and chat.domain == "chat"
    assert [t["role"] for t in chat.conversation] == ["user", "assistant"]
    assert math.domain == "math" and math.conversation == [{"role": "user", "content": "What is 12 * 7?"}]
    assert math.sample_id and math.sample_id != chat.sample_id
