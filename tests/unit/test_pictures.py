"""`plan --plot` and pictures.py (issue 46): each source's share of every step and cumulative, against its target
weight, as SVG. Checked as a reader of the file would check it: well-formed XML, one line per source per panel,
the targets at the heights of their weights (a 2-phase schedule: the step where they change), labelled ticks."""

import xml.etree.ElementTree as ET

import pytest
from helpers import write_job

from zephon_titan.cli import main
from zephon_titan.engine.ledger import read_ledger
from zephon_titan.pictures import nice_ticks, shares_svg

SVG = "{http://www.w3.org/2000/svg}"


def _panels(text: str) -> dict[str, ET.Element]:
    root = ET.fromstring(text)  # well-formed, or this raises
    assert root.tag == f"{SVG}svg"
    return {g.get("data-panel"): g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"}


def _share_at(panel: ET.Element):
    """The panel's y axis as its 0 and 1 ticks place it: a y coordinate -> the share it stands for."""
    ticks = {
        float(t.get("data-value")): float(t.get("y1")) for t in panel.iter(f"{SVG}line") if t.get("class") == "ytick"
    }
    return lambda y: (ticks[0] - y) / (ticks[0] - ticks[1])


def _points(line: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in line.get("points").split()]


def _lines(panel: ET.Element, kind: str) -> dict[str, ET.Element]:
    found = [e for e in panel.iter(f"{SVG}polyline") if e.get("class") == kind]
    named = {e.get("data-source"): e for e in found}
    assert len(named) == len(found)  # one per source
    return named


def test_two_phase_targets_are_drawn_at_their_weights():
    steps = list(range(1, 21))
    targets = [[0.2, 0.8] if s < 11 else [0.8, 0.2] for s in steps]
    shares = [[t[0] + 0.01, t[1] - 0.01] for t in targets]
    text = shares_svg(["code", "prose"], steps, shares, shares, targets, "a <schedule> & its shares")
    panels = _panels(text)
    assert set(panels) == {"step", "cumulative"}
    # The cumulative panel's target is the targets' running mean: what the cumulative share follows.
    running = [[sum(t[s] for t in targets[:i]) / i for s in range(2)] for i in range(1, 21)]
    for panel_name, panel in panels.items():
        goals = targets if panel_name == "step" else running
        share = _share_at(panel)
        assert set(_lines(panel, "share")) == {"code", "prose"}
        drawn = _lines(panel, "target")
        step_of = {x: step for (x, _), step in zip(_points(drawn["code"]), steps)}  # each step its own x
        assert len(step_of) == len(steps)
        for name, s in (("code", 0), ("prose", 1)):
            heights = [(step_of[x], share(y)) for x, y in _points(drawn[name])]
            assert [step for step, _ in heights] == steps
            assert [h for _, h in heights] == pytest.approx([g[s] for g in goals], abs=1e-3)  # step: 0.2, then 0.8
        labels = [t.text for t in panel.iter(f"{SVG}text")]
        assert {"0", "0.5", "1", "step", "share"} <= set(labels)
        assert [t.get("data-value") for t in panel.iter(f"{SVG}line") if t.get("class") == "xtick"]
    root = ET.fromstring(text)
    assert any("a <schedule> & its shares" == (t.text or "") for t in root.iter(f"{SVG}text"))  # escaped, read back
    assert {"code", "prose"} <= {t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend-source"}


@pytest.mark.parametrize(
    "first, last, expected",
    [(1, 20, [5, 10, 15, 20]), (1, 1000, [200, 400, 600, 800, 1000]), (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1])],
)
def test_nice_ticks(first, last, expected):
    assert nice_ticks(first, last) == pytest.approx(expected)


PHASES = """
[[dataloader.phases]]
start_step = 1
weights = { code = 0.2, prose = 0.8 }
[[dataloader.phases]]
start_step = 5
weights = { code = 0.8, prose = 0.2 }
"""


def test_plan_plot_draws_the_schedule(tmp_path, corpus_dir, tokenizer_dir, capsys):
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, training="steps = 8")
    text = open(job).read().replace("weight = 0.4\n", "").replace("weight = 0.6\n", "")
    with open(job, "w") as f:
        f.write(text.replace("[dataloader.sources.code]", PHASES + "[dataloader.sources.code]"))
    svg, ledger = tmp_path / "shares.svg", tmp_path / "plan.jsonl"
    assert main(["plan", job, "--steps", "8", "--plot", str(svg), "-o", str(ledger)]) == 0
    assert f"wrote {svg}" in capsys.readouterr().out
    panels = _panels(svg.read_text())
    steps = [e.step for e in read_ledger(str(ledger))]
    per_step = [0.2] * 4 + [0.8] * 4  # phase 2 from step 5
    expected = {"step": per_step, "cumulative": [sum(per_step[:i]) / i for i in range(1, 9)]}
    for name, panel in panels.items():
        share = _share_at(panel)
        code = _points(_lines(panel, "target")["code"])
        assert len(_lines(panel, "share")) == 2
        assert [share(y) for _, y in code] == pytest.approx(expected[name], abs=1e-3)
    assert steps == list(range(1, 9))
    # To standard output the ledger stays alone there: the picture's line goes to standard error.
    assert main(["plan", job, "--steps", "3", "--plot", str(svg)]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3 and f"wrote {svg}" in err


def test_pictures_need_nothing_heavy():
    import subprocess
    import sys

    code = "import sys, zephon_titan.pictures; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not loaded & {"torch", "torchtitan", "numpy"}, loaded & {"torch", "torchtitan", "numpy"}


def _draws(out: str) -> dict[str, tuple[float, float]]:
    """validate's "the run's draw" section: source -> (tokens drawn, tokens per epoch)."""
    section = out.split("the run's draw", 1)[1].splitlines()[1:]
    found = {}
    for line in section:
        if not line.startswith("  ") or "epochs of its" not in line:
            break
        name, rest = line.split(maxsplit=1)
        drawn, epoch = rest.split(" tokens: ")[0].lstrip("~"), rest.split("epochs of its ")[1].split(";")[0]
        found[name] = (float(drawn.replace(",", "")), float(epoch.replace(",", "")))
    return found


def test_validate_says_and_draws_what_the_run_reads(tmp_path, corpus_dir, tokenizer_dir, capsys):
    """Under a 2-phase schedule, with prose partly held out: the draws add up to every token of every step, each is
    what `plan` finds the run drawing (within the mixing's rounding), the held-out part is not counted as
    trainable, and the picture's bars stand for the same numbers."""
    job = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, training="steps = 30", source="")
    text = open(job).read().replace("weight = 0.4\n", "").replace("weight = 0.6\n", "")
    with open(job, "w") as f:
        f.write(text.replace("[dataloader.sources.code]", PHASES + "[dataloader.sources.code]"))
    held = tmp_path / "held.toml"
    held.write_text(open(job).read().replace("block_bytes = 16384", "block_bytes = 16384\neval_fraction = 0.3"))
    svg = tmp_path / "draws.svg"
    assert main(["validate", job, "--plot", str(svg)]) == 0
    draws = _draws(capsys.readouterr().out)
    assert sum(d for d, _ in draws.values()) == pytest.approx(30 * 16 * 64, abs=2)
    assert main(["plan", job, "--steps", "30", "-o", str(tmp_path / "plan.jsonl")]) == 0
    planned = {name: 0 for name in draws}
    for entry in read_ledger(str(tmp_path / "plan.jsonl")):
        for name, tokens in entry.tokens.items():
            planned[name] += tokens
    for name, (drawn, _) in draws.items():
        assert planned[name] == pytest.approx(drawn, rel=0.05), (name, planned, draws)
    assert main(["validate", str(held)]) == 0
    held_draws = _draws(capsys.readouterr().out)
    assert held_draws["prose"][1] < 0.8 * draws["prose"][1] and held_draws["code"] == draws["code"]
    bars = {(r.get("class"), r.get("data-source")): r for r in ET.parse(svg).getroot().iter(f"{SVG}rect")}
    for name, (drawn, epoch) in draws.items():
        d, e = bars["drawn", name], bars["epoch", name]
        assert float(d.get("data-tokens")) == pytest.approx(drawn, abs=1)
        assert float(d.get("width")) / float(e.get("width")) == pytest.approx(drawn / epoch, rel=1e-3)
    assert main(["validate", job, "--plot", str(svg), "--no-count"]) != 0
    assert "drop --no-count" in capsys.readouterr().err
