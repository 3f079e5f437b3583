"""test_server_generate.py - the whole path a new user takes: `trainyard
mkmodel --like llama-3.2-1b --layers 2` (the published configuration, its
128256-token vocabulary) beside the real Llama 3 tokenizer files, a LoRA
job on it through trainyardd with the real worker, then `trainyard
generate` with the adapter the job wrote: text streamed from a prompt, and
the same greedy ids with the key/value cache as recomputing the whole
sequence each token."""
import json
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
TOKDIR = os.path.join(BIN, "tests", "text-npm", "node_modules", "@lenml", "tokenizer-llama3",
                      "models")


class GenerateAfterLora(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(os.path.join(TOKDIR, "tokenizer.json")):
            raise unittest.SkipTest("the Llama 3 tokenizer files are not installed (npm ci of "
                                    "tests/text/package-lock.json runs with the build)")
        self.srv = Server(worker=None, extra=["--heartbeat-timeout", "300",
                                              "--progress-timeout", "300"]).start()
        self.addCleanup(self.srv.cleanup)

    def test_mkmodel_train_generate(self):
        srv, d = self.srv, self.srv.dir
        subprocess.run([TY, "mkmodel", "--like", "llama-3.2-1b", "--layers", "2", "--out",
                        "models/l32"], cwd=d, check=True, capture_output=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOKDIR, f), os.path.join(d, "models", "l32", f))
        spec = srv.spec(name="l32", model_path="models/l32", world_size=1, lora_rank=4,
                        target_modules="all-linear",
                        data={"path": "train.txt", "seq_len": 16},
                        train={"steps": 2, "micro_batch_size": 1, "grad_accum": 1,
                               "lr": 1e-3, "warmup_steps": 1})
        r = srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 201, r.text)
        job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=540)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        adapter = os.path.join(d, "runs", "l32")
        with open(os.path.join(adapter, "adapter_config.json")) as f:
            self.assertEqual(json.load(f)["peft_type"], "LORA")

        def gen(*args):
            p = subprocess.run([TY, "generate", "--model_path", "models/l32", "--adapter",
                                adapter] + list(args), cwd=d, capture_output=True)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            return p.stdout, p.stderr.decode()

        out, err = gen("--prompt", "hello trainyard", "--max_new_tokens", "8")
        out.decode("utf-8")  # whole characters only
        self.assertRegex(err, r"prompt [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\); generated "
                              r"[1-8] tokens in [0-9.]+ s \([0-9.]+ tokens/s\)")
        print("# " + err.strip().splitlines()[-1])
        cached, _ = gen("--prompt", "hello trainyard", "--max_new_tokens", "4", "--output", "ids")
        uncached, _ = gen("--prompt", "hello trainyard", "--max_new_tokens", "4", "--output",
                          "ids", "--no_cache")
        self.assertEqual(json.loads(cached), json.loads(uncached))
        self.assertEqual(len(json.loads(cached)), 4)


if __name__ == "__main__":
    unittest.main()
