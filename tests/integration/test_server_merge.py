"""test_server_merge.py - merge_adapter through trainyardd with the real
worker: a LoRA job over 2 ranks with merge_adapter true leaves
output_dir/merged/ (config.json, model.safetensors, the base's tokenizer
files) beside the adapter, and the merged checkpoint loads: `trainyard
eval` of it gives the loss of the base with the adapter applied unmerged.
merge_adapter on a job that trains every weight is refused at submit,
naming the field (rule merge-needs-lora)."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")


class MergeAdapter(unittest.TestCase):
    def test_merge_adapter(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            subprocess.run([TY, "mkmodel", "--out", "models/base", "--hidden-size", "32",
                            "--intermediate-size", "64", "--layers", "2", "--heads", "4",
                            "--kv-heads", "2", "--vocab-size", "256"], cwd=srv.dir, check=True,
                           capture_output=True)
            with open(os.path.join(srv.dir, "models", "base", "tokenizer_config.json"), "w") as f:
                f.write('{"model_max_length": 128}')
            spec = srv.spec(name="merged-lora", model_path="models/base", merge_adapter=True,
                            lora_rank=4, target_modules="all-linear",
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 6, "micro_batch_size": 2, "lr": 3e-2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            jid = r.json()["id"]
            job = srv.wait_state(jid, ["succeeded", "failed"], timeout=240)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            self.assertTrue(srv.get("/v1/jobs/%s" % jid).json()["spec"]["merge_adapter"])
            run = os.path.join(srv.dir, "runs", "merged-lora")
            merged = os.path.join(run, "merged")
            self.assertEqual(sorted(os.listdir(merged)),
                             ["config.json", "model.safetensors", "tokenizer_config.json"])
            self.assertTrue(os.path.exists(os.path.join(run, "adapter_model.safetensors")))
            self.assertFalse(os.path.exists(merged + ".partial"))

            def loss(*args):
                out = subprocess.run([TY, "eval", *args, "--data", "train.txt", "--seq_len",
                                      "16", "--batches", "4"], cwd=srv.dir, check=True,
                                     capture_output=True, text=True).stdout
                return json.loads(out)["loss"]
            unmerged = loss("--model_path", "models/base", "--adapter", run)
            merged_loss = loss("--model_path", merged)
            base = loss("--model_path", "models/base")
            self.assertAlmostEqual(merged_loss, unmerged, delta=1e-5 * abs(unmerged))
            self.assertGreater(abs(base - unmerged), 1e-3)  # the adapter learned something

            # Training every weight has no adapter to merge.
            r = srv.post("/v1/jobs", srv.spec(name="full", model_path="models/base",
                                              use_lora=False, merge_adapter=True))
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["merge_adapter"], detail)
            self.assertIn("use_lora is false", detail[0]["message"])
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
