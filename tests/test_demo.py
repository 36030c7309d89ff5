from zephon_titan import demo


def test_demo_runs_and_checks_its_own_result(tmp_path, capsys):
    assert demo.main(["--out", str(tmp_path), "--steps", "5", "--save-at", "2"]) == 0
    out = capsys.readouterr().out
    assert "every resumed global batch is SHA-256-identical" in out
    assert out.count("same") == 6  # steps 2, 3, 4 on 4 ranks and on 1 rank
