"""The real trainer moving its data from local disk to a GCS bucket, an Azure container or a Hugging Face Hub
dataset (gcp-storage-emulator, Azurite, tests/hubserver.py on loopback) at a resume: one run saved on 2 ranks
reading local files, resumed on 4 reading only the cloud (told with `resume_allow`), every global batch equal
to the offline plan of the local documents."""

import os
import shutil

import pytest
from conftest import CPU_CONFIG, check, copy_checkpoint, ledger, torchrun

from zephon_titan.engine.sources.clouds import HUB_BLOCK_BYTES
from zephon_titan.engine.sources.jsonl import TAIL_READ_BYTES

# Slow tier (torchrun jobs; the reads themselves: unit/test_cloud_storage.py, unit/test_hub_datasets.py).
pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 4
BLOCK_BYTES = 32768  # prose block_bytes in configs/debug_cpu.toml


def _job(job, name, text):
    with open(os.path.join(job, name), "w") as f:
        f.write(text)
    return name


def train(job, config, run, nproc):
    args = ["--job.config_file", config, "--dump_folder", run, "--training.steps", str(STEPS)]
    output = check(torchrun(job, "zephon_titan.train_cpu", nproc, [*args, "--metrics.disable_color_printing"]))
    return ledger(os.path.join(job, run, "checkpoint", "ledger.jsonl")), output.stdout + output.stderr


@pytest.fixture(scope="module")
def local_run(workdir, tmp_path_factory):
    """A job directory with the demo data on local disk, its run saved on 2 ranks (runs/local_w2), and
    the offline plan of the same documents: (job, that run's ledger, the plan)."""
    job = str(tmp_path_factory.mktemp("cloud_job"))
    shutil.copytree(os.path.join(workdir, "demo_out"), os.path.join(job, "demo_out"))
    saved, _ = train(job, _job(job, "local.toml", open(CPU_CONFIG).read()), "runs/local_w2", 2)
    from zephon_titan.plan import plan_ledger

    here = os.getcwd()
    os.chdir(workdir)
    try:
        planned = {e.step: e.sha256 for e in plan_ledger(CPU_CONFIG, STEPS)}
        other_seed = os.path.join(job, "other_seed.toml")
        with open(other_seed, "w") as f:
            f.write(open(CPU_CONFIG).read().replace("seed = 2026", "seed = 2027"))
        assert {e.step: e.sha256 for e in plan_ledger(other_seed, 1)}[1] != planned[1]  # the comparison can fail
    finally:
        os.chdir(here)
    assert saved == planned
    return job, planned


@pytest.mark.parametrize("cloud", ["gcs", "azure", "hub"])
def test_save_on_local_disk_resume_on_4_ranks_from_the_cloud(request, cloud, local_run, tmp_path):
    job, planned = local_run
    server = request.getfixturevalue(cloud)
    staged = tmp_path / "staged"
    for name in ("code", "prose"):
        shutil.copytree(os.path.join(job, "demo_out", name), staged / name)
    moved = server.upload(str(staged), "moved")
    text = open(CPU_CONFIG).read()
    for name, ext in (("code", "parquet"), ("prose", "jsonl")):
        here = f'paths = ["demo_out/{name}/*.{ext}"]'
        assert here in text
        text = text.replace(here, f'paths = ["{moved}/{name}/*.{ext}"]')
    if cloud == "gcs":  # the trainer's refusal, once (per cloud: the fingerprint checks of the unit tests)
        refused = _job(job, "gcs_refused.toml", text)
        copy_checkpoint(job, "runs/local_w2", 2, "runs/gcs_refused")
        args = ["--job.config_file", refused, "--dump_folder", "runs/gcs_refused", "--training.steps", str(STEPS)]
        out = torchrun(job, "zephon_titan.train_cpu", 4, args)
        assert out.returncode != 0 and "locations" in out.stdout + out.stderr  # a move is refused unless allowed
    # Uploaded objects have the same names, sizes and blocks, and new modification times.
    allowed = _job(
        job, f"{cloud}.toml", text.replace("seed = 2026", 'seed = 2026\nresume_allow = ["locations", "mtimes"]')
    )
    copy_checkpoint(job, "runs/local_w2", 2, f"runs/{cloud}_w4")
    server.clear_requests()
    resumed, log = train(job, allowed, f"runs/{cloud}_w4", 4)
    assert resumed == planned  # steps 1-2 from local disk on 2 ranks, 3-4 from the cloud on 4

    secrets = [v.partition("AccountKey=")[2].split(";")[0] for v in server.env.values() if "AccountKey=" in v]
    secrets += [server.env["HF_TOKEN"]] if "HF_TOKEN" in server.env else []
    assert not any(secret in log for secret in secrets)  # Azurite's key, the Hub token: in no log line
    ranged = [r for r in server.requests() if r["method"] == "GET" and r["range"]]
    assert ranged, "the resumed run did not read the cloud"
    read_ahead = HUB_BLOCK_BYTES if cloud == "hub" else 0  # HfFileSystem reads this much past a request
    assert max(r["bytes"] for r in ranged) <= BLOCK_BYTES + 1 + TAIL_READ_BYTES + read_ahead  # about one block
