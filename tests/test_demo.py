import demo
import pytest

pytestmark = pytest.mark.integration


def test_demo_trains_resumes_and_checks_itself(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the demo writes ./demo_out
    assert demo.main(["--steps", "4", "--save-at", "2"]) == 0
    out = capsys.readouterr().out
    assert "every global batch of every run is SHA-256-identical to the offline plan" in out
    assert out.count("same loss") == 4 + 2 + 2  # steps 1-4 on 2 ranks, 3-4 resumed on 4 and on 1
