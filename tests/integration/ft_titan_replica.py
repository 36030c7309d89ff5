"""One replica group of TorchTitan's FT trainer with the zephon loader (titan/ft_trainer.py) on CPU, run by torchrun
for test_titan_ft_trainer.py: `zephon_titan.train_cpu` plus the harness's hooks, which only watch and wait.

ZEPHON_FT_HARNESS (JSON): {"barrier": path prefix, "groups": R, "kill_step": s, "victim": g}. Per attempt the
replica prints one line `ZEPHON_FT_EVENT {...}` (examples/ft_run.py's event format: step, attempt, participants,
rank, commit, the rows' ids, a weight, the loader's begin and finish seconds) and appends it to
attempts.group<G>.jsonl beside the group's ledger. The victim's attempt of kill_step is 2 s long (after its quorum,
before its all-reduce) so that the launcher's SIGKILL lands inside it; every group waits for all groups before its
first quorum, and the survivors for a restarted group to ask for its first quorum (`<barrier>.hold` until
`<barrier>.rejoined`): the harness's pauses, never the loader's.
"""

import hashlib
import json
import os
import time

from zephon_titan.cpu import install_cpu_device, prepare_cpu_config

install_cpu_device()

from zephon_titan.titan.ft_trainer import ZephonFtTrainer  # noqa: E402  (after the device shim, on purpose)
from zephon_titan.train import main  # noqa: E402


def row_id(row) -> str:  # examples/ft_run.py's
    return hashlib.sha256(row.to_bytes()).hexdigest()[:16]


def _install_harness(harness: dict) -> None:
    barrier, restarted = harness["barrier"], os.environ.get("ZEPHON_FT_RESTARTED") == "1"
    original_init, original_step = ZephonFtTrainer.__init__, ZephonFtTrainer.train_step
    original_forward = ZephonFtTrainer.forward_backward_step

    def init(self, config):
        original_init(self, config)
        self.group = config.fault_tolerance.replica_id
        folder = os.path.join(config.dump_folder, config.checkpoint.folder)  # beside the group's ledger
        os.makedirs(folder, exist_ok=True)
        self.events = open(os.path.join(folder, f"attempts.group{self.group}.jsonl"), "a")
        self.healed_seen, self.timings = 0, {}
        loader = self.dataloader
        begin, finish = loader.begin, loader.finish

        def timed(name, fn):
            def call(*args):
                t = time.perf_counter()
                try:
                    return fn(*args)
                finally:
                    self.timings[name] = time.perf_counter() - t

            return call

        loader.begin, loader.finish = timed("begin_s", begin), timed("finish_s", finish)
        if restarted:
            return
        everyone = [f"{barrier}.up.{g}" for g in range(harness["groups"])]
        open(everyone[self.group], "w").close()
        while not all(map(os.path.exists, everyone)):  # every group up before the first quorum
            time.sleep(0.05)

    def emit(self, line: dict) -> None:
        line["group"], line["dp"] = self.group, 0
        text = json.dumps(line)
        print(f"ZEPHON_FT_EVENT {text}", flush=True)
        self.events.write(text + "\n")
        self.events.flush()

    def forward_backward_step(self, **kwargs):
        attempt = self.attempt
        if attempt is not None and getattr(self, "_started", None) != (attempt.step, attempt.attempt):
            self._started = (attempt.step, attempt.attempt)
            emit(self, {"event": "start", "step": attempt.step})
            if self.group == harness["victim"] and attempt.step == harness["kill_step"] and not restarted:
                time.sleep(2.0)  # the launcher's SIGKILL lands here
        return original_forward(self, **kwargs)

    def train_step(self, data_iterator):
        if restarted and not getattr(self, "_asked", False):
            # Up and about to ask for its first quorum: the launcher lets the survivors ask for theirs, so the
            # lighthouse has this group waiting (written earlier, a loaded machine let the survivors finish first).
            self._asked = True
            open(f"{barrier}.ready.{self.group}.{os.getpid()}", "w").close()
        while os.path.exists(f"{barrier}.hold") and not os.path.exists(f"{barrier}.rejoined"):
            time.sleep(0.05)
        original_step(self, data_iterator)
        steps, attempt = self.dataloader.steps, self.attempt
        for was, now in steps.healed[self.healed_seen :]:
            emit(self, {"event": "healed", "from": was, "to": now})
        self.healed_seen = len(steps.healed)
        manager = self.ft_manager.manager
        weight = [p for p in self.model_parts[0].parameters()][-1]
        emit(
            self,
            {
                "event": "end",
                "step": attempt.step,
                "attempt": attempt.attempt,
                "participants": manager.num_participants(),
                "rank": manager.participating_rank(),
                "commit": self.committed,
                "rows": [row_id(r) for r in attempt.rows],
                "weight": round(float(weight.detach().flatten()[0]), 6),
                "begin_s": round(self.timings["begin_s"], 4),
                "finish_s": round(self.timings["finish_s"], 4),
            },
        )

    ZephonFtTrainer.__init__ = init
    ZephonFtTrainer.train_step = train_step
    ZephonFtTrainer.forward_backward_step = forward_backward_step


if __name__ == "__main__":
    _install_harness(json.loads(os.environ["ZEPHON_FT_HARNESS"]))
    main(prepare=prepare_cpu_config)
