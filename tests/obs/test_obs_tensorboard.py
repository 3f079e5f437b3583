"""test_obs_tensorboard.py - a LoRA job run by trainyardd with the real
worker leaves TensorBoard event files and metrics.jsonl in its output_dir:
an independent reader (tfevents.py: its own CRC-32C, the Python protobuf
package) decodes per-step losses equal to those the API reports, and the
other figures (held-out loss, learning rate, gradient norm, tokens/s, host
peak) are there for every step."""
import json
import math
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from tyserver import Server  # noqa: E402
import tfevents  # noqa: E402


class TensorBoard(unittest.TestCase):
    def test_job_curves_match_the_api(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/small")
            steps = 12
            spec = srv.spec(name="tb-lora", model_path="models/small", lora_rank=4,
                            data={"path": "train.txt", "seq_len": 16, "eval_fraction": 0.2},
                            train={"steps": steps, "micro_batch_size": 2, "lr": 0.01,
                                   "warmup_steps": 3})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=120)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            m = srv.get("/v1/jobs/%s/metrics" % job["id"]).json()
            rank0 = [x for x in m["ranks"] if x["rank"] == 0][0]
            api_loss = dict(zip(rank0["steps"], rank0["loss"]))
            self.assertEqual(sorted(api_loss), list(range(1, steps + 1)))

            out = os.path.join(srv.dir, "runs", "tb-lora")
            tb = tfevents.scalars(os.path.join(out, "tensorboard"))
            # float32 in the event file: the API's double to 1 part in 1e6.
            self.assertEqual(sorted(tb["train/loss"]), list(range(1, steps + 1)))
            for step, loss in api_loss.items():
                self.assertTrue(math.isclose(tb["train/loss"][step], loss, rel_tol=1e-6),
                                (step, tb["train/loss"][step], loss))
            for tag in ("train/learning_rate", "train/grad_norm", "train/tokens_per_s",
                        "memory/host_peak_bytes"):
                self.assertEqual(sorted(tb[tag]), list(range(1, steps + 1)), tag)
                self.assertTrue(all(v > 0 for v in tb[tag].values()), (tag, tb[tag]))
            # Warm-up: the learning rate rises over the first 3 steps.
            lr = tb["train/learning_rate"]
            self.assertLess(lr[1], lr[2])
            self.assertLess(lr[2], lr[3])
            # The held-out loss before the first step and after the last.
            self.assertEqual(sorted(tb["eval/loss"]), [0, steps])

            # metrics.jsonl: the same losses, exactly (shortest reals).
            with open(os.path.join(out, "metrics.jsonl")) as f:
                lines = [json.loads(x) for x in f]
            train = {x["step"]: x for x in lines if "loss" in x}
            self.assertEqual({s: x["loss"] for s, x in train.items()}, api_loss)
            evals = [x for x in lines if "eval_loss" in x]
            self.assertEqual([x["step"] for x in evals], [0, steps])
            self.assertTrue(math.isclose(evals[-1]["eval_loss"], tb["eval/loss"][steps],
                                         rel_tol=1e-6))
            # The job's tokens/s is over both ranks: each step is 2 ranks x
            # micro_batch_size 2 x seq_len 16 tokens.
            x = train[steps]
            self.assertTrue(math.isclose(tb["train/tokens_per_s"][steps], x["tokens_per_s"],
                                         rel_tol=1e-6))
            self.assertIsInstance(x["host_peak_bytes"], int)
        finally:
            srv.cleanup()

    def test_cancel_leaves_whole_records(self):
        """A job cancelled mid-training (its ranks get SIGTERM) leaves event
        files and metrics.jsonl that read back whole: every CRC right, no
        torn record or line, the steps 1..N in order."""
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/small")
            spec = srv.spec(name="tb-cancel", model_path="models/small", lora_rank=4,
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 1000000, "micro_batch_size": 2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            job_id = r.json()["id"]
            out = os.path.join(srv.dir, "runs", "tb-cancel")
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    with open(os.path.join(out, "metrics.jsonl")) as f:
                        if sum(1 for _ in f) >= 20:
                            break
                except FileNotFoundError:
                    pass
                time.sleep(0.05)
            else:
                self.fail("no 20 steps in metrics.jsonl within 60 s")
            self.assertEqual(srv.post("/v1/jobs/%s:cancel" % job_id).status_code, 200)
            srv.wait_state(job_id, ["cancelled"], timeout=30)
            deadline = time.time() + 30
            while srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"][0]["finished_at"] is None:
                self.assertLess(time.time(), deadline, "rank 0 did not stop")
                time.sleep(0.05)
            tb = tfevents.scalars(os.path.join(out, "tensorboard"))
            steps = sorted(tb["train/loss"])
            self.assertGreaterEqual(len(steps), 20)
            self.assertEqual(steps, list(range(1, len(steps) + 1)))
            with open(os.path.join(out, "metrics.jsonl")) as f:
                text = f.read()
            self.assertTrue(text.endswith("\n"))
            lines = [json.loads(x) for x in text.splitlines()]
            self.assertEqual([x["step"] for x in lines if "loss" in x], steps)
        finally:
            srv.cleanup()

    def test_reader_refuses_a_bad_crc(self):
        """The reader is not a rubber stamp: one flipped bit is caught."""
        import tempfile
        d = tempfile.mkdtemp(prefix="ty-tbbad-")
        data = b"\x1a\x0dbrain.Event:2"
        head = len(data).to_bytes(8, "little")
        rec = head + tfevents.masked_crc(head).to_bytes(4, "little") + data + \
            tfevents.masked_crc(data).to_bytes(4, "little")
        path = os.path.join(d, "events.out.tfevents.1.h.1.0")
        with open(path, "wb") as f:
            f.write(rec)
        self.assertEqual(tfevents.events(path)[0].file_version, "brain.Event:2")
        bad = bytearray(rec)
        bad[14] ^= 1
        with open(path, "wb") as f:
            f.write(bytes(bad))
        with self.assertRaises(ValueError):
            tfevents.records(path)
        with open(path, "wb") as f:
            f.write(rec[:-3])
        with self.assertRaises(ValueError):
            tfevents.records(path)


if __name__ == "__main__":
    unittest.main()
