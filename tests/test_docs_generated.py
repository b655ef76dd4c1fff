"""docs/deploy-yaml.md and docs/commands.md are generated (docs/gen.py) from deploy.yaml's models and the typer app:
the checked-in pages equal a fresh render, a model field added without regenerating is caught, a key without a
description stops the generator, and every command's --help ends with one example."""
from __future__ import annotations

from pathlib import Path

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from support.docs_gen import gen

ROOT = Path(__file__).resolve().parent.parent


def test_checked_in_pages_equal_a_fresh_render():
    stale = gen.stale_pages()
    assert stale == [], f"stale generated pages {stale}: regenerate with `{gen.REGENERATE}` and commit them"


def _with_new_engine_field(description: str | None):
    """A copy of DeployConfig whose engine section has one more field (the models themselves stay untouched)."""
    from deployctl.config import DeployConfig, EngineConfig

    class Engine(EngineConfig):
        new_knob: int = Field(3, ge=1, description=description)

    class Deploy(DeployConfig):
        engine: Engine = Field(default_factory=Engine, description=DeployConfig.model_fields["engine"].description)

    return Deploy


def test_a_field_added_without_regenerating_makes_the_page_stale():
    model = _with_new_engine_field("A knob added after the page was generated.")
    page = gen.render_deploy_yaml(model)
    assert "**`engine.new_knob`**: A knob added after the page was generated. (int; default `3`; ≥ `1`)" in page
    stale = gen.stale_pages(**{"deploy-yaml.md": lambda: gen.render_deploy_yaml(model)})
    assert stale == ["deploy-yaml.md"]


def test_a_key_without_a_description_stops_the_generator():
    with pytest.raises(gen.MissingDescription, match=r"engine\.new_knob .*docs/gen\.py"):
        gen.render_deploy_yaml(_with_new_engine_field(None))


def test_every_deploy_yaml_key_of_the_models_is_on_the_page():
    from deployctl.config import DeployConfig

    page = (ROOT / "docs" / "deploy-yaml.md").read_text()
    for path in ("service.name", "hosts[].spare_port", "rollout.analysis.outputs.min_prefix_tokens",
                 "router.tls", "engine.server.command"):
        assert f"**`{path}`**" in page
    for name in DeployConfig.model_fields:
        assert f"**`{name}`**" in page


def test_a_command_added_without_regenerating_makes_the_page_stale():
    from deployctl.cli import app

    extra = typer.Typer()
    extra.add_typer(app)

    @extra.command("brand-new", epilog="Example: deployctl brand-new")
    def brand_new(flag: bool = typer.Option(False, "--flag", help="A new flag.")) -> None:
        """A command added after the page was generated."""

    page = gen.render_commands(extra)
    assert "## `deployctl brand-new`" in page and "- `--flag`: A new flag." in page


def _leaves_and_groups():
    return gen.command_names()


@pytest.mark.parametrize("command", _leaves_and_groups())
def test_every_command_help_ends_with_one_example(command):
    from deployctl.cli import app

    result = CliRunner().invoke(app, command.split()[1:] + ["--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # click wraps the epilog at the terminal's width
    assert text.count("Example: ") == 1, f"`{command} --help` has no example (add epilog=\"Example: ...\")"
    example = text[text.index("Example: "):]
    assert example.startswith(f"Example: {command}"), f"`{command} --help` ends with {example!r}, not an example"


@pytest.mark.parametrize("command", _leaves_and_groups())
def test_every_example_parses(command):
    """The example's options and arguments are the command's own: click parses them without running anything."""
    import shlex

    from deployctl.cli import app

    cmd = typer.main.get_command(app)
    for word in command.split()[1:]:
        cmd = cmd.commands[word]
    argv = shlex.split(cmd.epilog.removeprefix("Example: "))
    assert argv[0] == "deployctl"
    argv = argv[1:]
    target = typer.main.get_command(app)
    while hasattr(target, "commands") and argv and argv[0] in target.commands:
        target, argv = target.commands[argv[0]], argv[1:]
    assert not hasattr(target, "commands"), f"the example of `{command}` names no command: {cmd.epilog}"
    target.make_context(target.name, argv)  # raises click's UsageError on an unknown option or a missing argument
