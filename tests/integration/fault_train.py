"""`zephon_titan.train_cpu` with a fault injected (run as a script by torchrun, for the fault tests).

ZEPHON_TEST_KILL="RANK:STEP" makes that rank die (exit 9) at the start of that step, and
ZEPHON_TEST_KILL="save:RANK:STEP" in the middle of that step's checkpoint save.
"""

import os

from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

from zephon_titan.titan.trainer import ZephonTrainer  # noqa: E402  (after the device shim, on purpose)
from zephon_titan.train import main  # noqa: E402


def _install_fault(spec: str) -> None:
    import torch.distributed as dist

    parts = spec.split(":")
    during_save = parts[0] == "save"
    rank, step = int(parts[-2]), int(parts[-1])
    original_init = ZephonTrainer.__init__

    def init_with_fault(self, config):
        original_init(self, config)
        if dist.get_rank() != rank:
            return
        if during_save:
            save = self.checkpointer.save

            def dying_save(curr_step, *args, **kwargs):
                if curr_step == step:
                    os._exit(9)  # the other ranks are inside the collective save
                return save(curr_step, *args, **kwargs)

            self.checkpointer.save = dying_save
        else:
            train_step = self.train_step

            def dying_step(data_iterator):
                if self.step == step:
                    os._exit(9)
                return train_step(data_iterator)

            self.train_step = dying_step

    ZephonTrainer.__init__ = init_with_fault


if __name__ == "__main__":
    _install_fault(os.environ["ZEPHON_TEST_KILL"])
    main(prepare=prepare_cpu_config)
