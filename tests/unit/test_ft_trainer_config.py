"""TorchTitan's FT trainer with this loader (titan/ft_trainer.py) from a job file: `[fault_tolerance]` picks it, and
what it does not wire is one line naming the key, before anything is built. The run itself (3 replica groups, a
kill and a restart): tests/integration/test_titan_ft_trainer.py (slow)."""

import pytest

pytest.importorskip("torchft", reason="torchft is not installed (the test extra installs torchft==0.2.0)")

from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager  # noqa: E402
from torchtitan.experiments.torchft.manager import TorchFTManager  # noqa: E402

from zephon_titan.errors import ConfigError  # noqa: E402
from zephon_titan.titan.ft_dataloader import ZephonFtDataLoader  # noqa: E402
from zephon_titan.titan.ft_trainer import ZephonFtManager, ZephonFtTrainer  # noqa: E402
from zephon_titan.titan.job import load_job  # noqa: E402
from zephon_titan.titan.trainer import ZephonTrainer  # noqa: E402


def _job(tmp_path, corpus_dir, tokenizer_dir, fault_tolerance: str | None, checkpoint: str = "enable = false") -> str:
    table = "" if fault_tolerance is None else f"[fault_tolerance]\n{fault_tolerance}\n"
    path = tmp_path / "job.toml"
    path.write_text(f"""
hf_assets_path = "{tokenizer_dir}"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = 32
global_batch_size = 12
local_batch_size = 2
[checkpoint]
{checkpoint}
{table}
[dataloader]
num_lanes = 4
[dataloader.sources.code]
paths = ["{corpus_dir}/code/*.parquet"]
""")
    return str(path)


FT = "enable = true\ngroup_size = 3\nreplica_id = 1"


def test_the_fault_tolerance_table_picks_titan_ft_trainer(tmp_path, corpus_dir, tokenizer_dir):
    config = load_job(_job(tmp_path, corpus_dir, tokenizer_dir, FT), ["--fault_tolerance.replica_id", "2"]).config
    assert type(config) is ZephonFtTrainer.Config
    assert type(config.dataloader) is ZephonFtDataLoader.Config and config.dataloader.global_batch_size == 12
    assert config.fault_tolerance.replica_id == 2 and config.fault_tolerance.group_size == 3  # the override's
    assert isinstance(config.checkpoint, TorchFTCheckpointManager.Config)  # the FT trainer hands it the Manager
    assert config.checkpoint.enable_ft_dataloader_checkpoints is False  # the loader's state comes from a peer
    # Without the table, the plain trainer as before.
    plain = load_job(_job(tmp_path, corpus_dir, tokenizer_dir, None)).config
    assert type(plain) is ZephonTrainer.Config


def test_each_group_loads_its_own_dp_ranks_not_a_static_share():
    """TorchTitan's get_dp_info gives group g of R the share g of R x D every step; ours gives the group's own D and
    rank (FtSteps splits each step over the live groups)."""
    manager = object.__new__(ZephonFtManager)
    manager._manager, manager.group_size, manager.replica_id = object(), 3, 1
    assert manager.get_dp_info(2, 1) == (2, 1)
    assert TorchFTManager.get_dp_info(manager, 2, 1) == (6, 3)  # the stock split, on the same manager


@pytest.mark.parametrize(
    "fault_tolerance, checkpoint, message",
    [
        ("enable = false", "enable = false", r"needs \[fault_tolerance\] enable = true"),
        (FT + '\nsemi_sync_method = "diloco"', "enable = false", "semi_sync_method = 'diloco' is not supported"),
        (FT + '\nprocess_group = "nccl"', "enable = false", 'set process_group = "gloo"'),
        ("enable = true\ngroup_size = 2\nreplica_id = 2", "enable = false", r"replica_id = 2 must be in \[0, group"),
        (FT, "enable = true", r"disk checkpoints are not wired yet .* set \[checkpoint\] enable = false"),
        (FT + "\nreplicas = 3", "enable = false", r"\[fault_tolerance\]: unknown keys \['replicas'\]"),
    ],
)
def test_what_is_not_wired_is_one_line_before_anything_is_built(
    tmp_path, corpus_dir, tokenizer_dir, fault_tolerance, checkpoint, message
):
    path = _job(tmp_path, corpus_dir, tokenizer_dir, fault_tolerance, checkpoint)
    with pytest.raises(ConfigError, match=message) as caught:
        load_job(path)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(path)
