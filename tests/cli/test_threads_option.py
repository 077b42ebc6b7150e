"""Every compute command offers ``--threads`` (one thread policy: osprey_data.cpu_threads), and the
value reaches the config its run gets."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from osprey_cli.main import cli

COMPUTE_COMMANDS = [
    ["data", "build"], ["train", "pretrain"], ["train", "convert"], ["train", "distill"],
    ["eval", "acceptance"], ["eval", "matrix"], ["eval", "sweep"], ["eval", "live"], ["export"], ["demo"],
]


@pytest.mark.parametrize("path", COMPUTE_COMMANDS, ids=" ".join)
def test_every_compute_command_has_threads(path):
    res = CliRunner().invoke(cli, [*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "--threads" in res.output
    assert "1.5x" in res.output or "busy" in res.output or "shared machine" in res.output, res.output


def test_threads_reach_the_configs():
    from osprey_data.builder import BuildConfig
    from osprey_train.evaluation.matrix import MatrixConfig
    from osprey_train.evaluation.options import AcceptanceConfig
    from osprey_train.stages.configs import ConvertConfig, DistillConfig, PretrainConfig
    from osprey_train.trainer import LoopConfig

    assert BuildConfig(target="t", inputs=("i",), out="o", threads=2).threads == 2
    assert AcceptanceConfig(drafter="d", store="s", threads=2).threads == 2
    assert MatrixConfig(drafters=[("a", "d")], stores=[("a", "s")], out="o", threads=2).threads == 2
    assert ConvertConfig(out="/nonexistent/x", backbone="b", store="s", threads=2).threads == 2
    loop = LoopConfig(out_dir="o")
    assert DistillConfig(drafter="d", store="s", loop=loop, threads=2).threads == 2
    assert PretrainConfig(model="m", corpus="c", loop=loop, threads=2).threads == 2
