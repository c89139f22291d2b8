"""launch.bench's argument checks: a mistake is one line naming the flag, before anything loads."""

import pytest

from launch.bench import main


@pytest.mark.parametrize("flag", ["--repeats=0", "--batch=-1", "--length=0", "--prompt-len=0", "--capacity=0",
                                  "--requests=0", "--new-tokens=0", "--turns=0", "--group=0"])
def test_a_size_below_one_is_refused_by_name(flag, tmp_path):
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit, match=f"{flag} must be ≥ 1"):
        main([flag, f"--json={out}", "matmul"])
    assert not out.exists()


def test_an_unknown_benchmark_is_refused_with_the_list():
    with pytest.raises(SystemExit, match="name one benchmark of .*'train'"):
        main(["fastest"])
