"""Errors a newcomer meets in the first hour name what exists (issue #50, item 5): a typo of a
variable, a key or a value gets a "did you mean", bad YAML names the file, line and column, and a
selector past the GPUs an entry stands for lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.cli.main import main

H100 = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hosts" / "h100-live.tar.gz"
GPU = '    - {name: g, address: "0000:00:06.0", use: passthrough}\n'
HOST = "gpuprov_host:\n  version: 1\n  gpus:\n"
VMS = "  vms:\n    - {name: a, memory_mib: 1024, gpus: ['g[3]']}\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gpuprov_hots:\n  version: 1\n  gpus: []\n", "did you mean 'gpuprov_host'?"),
        (
            HOST + GPU.replace("passthrough", "passthru"),
            "did you mean 'passthrough'?",
        ),
        ("gpuprov_host:\n  version: 1\n  gpu:\n" + GPU, "gpuprov_host.gpu: is not a known key: did you mean 'gpus'?"),
        ("gpuprov_host:\n  version: 1\n  gpus: [\n", "line 4, column 1"),
        (
            "gpuprov_host:\n  version: 1\n  gpus:\n"
            + GPU
            + "  vms:\n    - {name: a, memory_mib: 1024, gpus: ['g[3]']}\n",
            "selects 1 GPU(s) on this host (g[0] = 0000:00:06.0)",
        ),
    ],
)
def test_an_error_names_what_exists(capsys, tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "node.yml"
    path.write_text(text)
    code = main(["plan", "--root", str(H100), str(path)])
    out, err = capsys.readouterr()
    assert code in (2, 3) and said in out + err, out + err
    if "line 4" in said:
        assert f'in "{path}", line 4, column 1' in err
