"""The command table: every subcommand is reachable, and only the one that runs is loaded."""

from __future__ import annotations

import subprocess
import sys

from stager.cli import COMMAND_MODULES, COMMAND_SUMMARIES, cli
from tests.cli.runner import run, run_here


def test_the_table_names_exactly_the_commands_the_modules_define():
    assert set(cli.all_commands()) == set(COMMAND_MODULES)


def test_the_summaries_help_lists_are_each_commands_own():
    for name, command in cli.all_commands().items():
        assert COMMAND_SUMMARIES[name] == command.help.split("\n\n")[0].strip(), name


def test_help_loads_no_commands_module_and_lists_what_the_commands_would(capsys):
    code = ("import sys; from stager.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('stager.cli.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = result.stdout.strip().splitlines()[-1]
    for module in set(COMMAND_MODULES.values()):
        assert f"stager.cli.{module}'" not in loaded, module
    cli.all_commands()  # loaded in this process: its list is made from the commands themselves
    listed = run_here(["--help"], capsys).stdout
    assert "Commands:" in listed and listed in result.stdout


def test_help_lists_every_command():
    result = run(["--help"], check=True)
    for name in COMMAND_MODULES:
        assert f"  {name} " in result.stdout


def test_a_command_loads_its_own_module_only():
    code = ("import sys; from stager.cli import main\n"
            "try:\n    main(['status', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('stager.cli.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = result.stdout.strip().splitlines()[-1]
    assert "stager.cli.status" in loaded
    for other in ("stager.cli.replicate", "stager.cli.mount", "stager.cli.serve", "stager.cli.demo"):
        assert other not in loaded


def test_the_stager_process_stages_without_importing_pandas_or_pyarrow_compute(tmp_path):
    """pyarrow imports pandas on its first array conversion (0.3 s of CPU), and pyarrow.compute (30 to 60 ms
    building its wrappers) on the first ``fill_null`` or ``cast``; the command's process does neither."""
    from stager.write import generate_corpus

    generate_corpus(tmp_path / "corpus", shards=2, tokens_per_shard=1 << 12, seed=1)
    code = ("import sys; from stager.cli import main\n"
            f"sys.argv = ['stager', 'stage', {str(tmp_path / 'corpus')!r}, '--cache', {str(tmp_path / 'cache')!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('pyarrow' in sys.modules, 'pandas' in sys.modules, 'pyarrow.compute' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True False False", result.stdout
