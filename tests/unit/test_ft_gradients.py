"""ZephonFtTrainer's sum of the gradients over the replica groups (one flat all-reduce a step): every parameter gets
the groups' sum, a plain tensor or a DTensor shard (FSDP inside a group), whether or not this group's rows gave it
a gradient, and the loss is summed with them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402

from zephon_titan.titan.ft_trainer import ZephonFtTrainer  # noqa: E402


class _OtherGroups:
    """torchft's Manager as the trainer uses it: allreduce(SUM) over the step's participants, here this group and
    one more whose flat contribution is `theirs`."""

    def __init__(self, theirs: torch.Tensor):
        self.theirs = theirs

    def allreduce(self, flat: torch.Tensor, reduce_op: object) -> SimpleNamespace:
        flat += self.theirs
        return SimpleNamespace(wait=lambda: None)


@pytest.fixture
def one_rank_mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "FSDP shards"])
def test_every_parameter_gets_the_groups_sum(one_rank_mesh, sharded):
    """Two parameters, one with a gradient from this group's rows and one its rows never reached."""

    def param(shape: tuple[int, ...]) -> torch.nn.Parameter:
        t = torch.zeros(shape)
        return torch.nn.Parameter(distribute_tensor(t, one_rank_mesh, [Shard(0)]) if sharded else t)

    model = torch.nn.Module()
    model.reached, model.unreached = param((4, 2)), param((3,))
    ours = torch.arange(8.0).reshape(4, 2)
    model.reached.grad = distribute_tensor(ours.clone(), one_rank_mesh, [Shard(0)]) if sharded else ours.clone()
    theirs = torch.arange(8.0 + 3.0 + 1.0) + 10  # reached's 8, unreached's 3, then the loss
    trainer = SimpleNamespace(
        model_parts=[model],
        ft_manager=SimpleNamespace(manager=_OtherGroups(theirs)),
        config=SimpleNamespace(training=SimpleNamespace(max_norm=1e9)),  # no clipping: the sums as they are
        parallel_dims=SimpleNamespace(get_optional_mesh=lambda name: None, ep_enabled=False),
        _local=ZephonFtTrainer._local,
        _like=ZephonFtTrainer._like,
    )
    loss = torch.tensor(0.5)
    ZephonFtTrainer._sum_gradients_over_groups(trainer, loss)  # type: ignore[arg-type]

    def whole(grad: torch.Tensor) -> torch.Tensor:
        assert isinstance(grad, DTensor) == sharded  # a shard's gradient is sharded as the parameter is
        return grad.full_tensor() if isinstance(grad, DTensor) else grad

    assert torch.equal(whole(model.reached.grad), ours + theirs[:8].reshape(4, 2))
    assert model.unreached.grad is not None and torch.equal(whole(model.unreached.grad), theirs[8:11])
    if sharded:
        assert model.unreached.grad.placements == model.unreached.placements
    assert float(loss) == 0.5 + float(theirs[-1])
