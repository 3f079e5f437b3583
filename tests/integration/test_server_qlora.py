"""test_server_qlora.py - QLoRA (quantization.load_in_4bit) through
trainyardd: a 2-rank job with the real worker quantizes its base as it
loads, trains and writes PEFT's adapter
(which `trainyard eval --adapter` loads); the host-memory rule counts the
4-bit sizes, so a model that fits a host only in 4 bits is accepted with
them and refused without, and one that does not fit even so is refused
with its figures; a 4-bit spec without LoRA is refused at submit naming
the field, and nothing is stored."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server, big_model  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
Q4 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}


class QLoRAJob(unittest.TestCase):
    def test_qlora_job(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/base", 2)
            spec = srv.spec(name="qlora", model_path="models/base", lora_rank=4,
                            target_modules="all-linear", quantization=Q4,
                            fsdp={"memory_efficient_load": True},
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 6, "micro_batch_size": 2, "lr": 3e-2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            jid = r.json()["id"]
            job = srv.wait_state(jid, ["succeeded", "failed"], timeout=240)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            stored = srv.get("/v1/jobs/%s" % jid).json()["spec"]["quantization"]
            self.assertEqual(stored, {**Q4, "bnb_4bit_compute_dtype": "float32"})
            run = os.path.join(srv.dir, "runs", "qlora")
            self.assertTrue(os.path.exists(os.path.join(run, "adapter_model.safetensors")))
            self.assertFalse(os.path.exists(os.path.join(run, "model.safetensors")))
            out = subprocess.run([TY, "eval", "--model_path", "models/base", "--adapter", run,
                                  "--data", "train.txt", "--seq_len", "16", "--batches", "2"],
                                 cwd=srv.dir, check=True, capture_output=True, text=True).stdout
            self.assertGreater(json.loads(out)["loss"], 0)

            # A 4-bit base is frozen: training every weight over it is refused.
            bad = srv.spec(name="bad", model_path="models/base", use_lora=False,
                           quantization={"load_in_4bit": True})
            r = srv.post("/v1/jobs", bad)
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["quantization.load_in_4bit"])
            self.assertIn("needs use_lora: true", detail[0]["message"])
            self.assertEqual([j["id"] for j in srv.get("/v1/jobs").json()["jobs"]], [jid])
        finally:
            srv.cleanup()


class HostMemory(unittest.TestCase):
    def test_fits_only_in_4_bits(self):
        srv = Server(extra=["--host-mem-mib", "512"]).start()
        try:
            big_model(srv)
            spec = {**srv.spec(name="big", world_size=1), "model_path": "models/big",
                    "fsdp": {"memory_efficient_load": True},
                    "data": {"path": "train.txt", "seq_len": 32}}
            spec["train"]["micro_batch_size"] = 1
            r = srv.post("/v1/jobs:validate", spec)
            self.assertEqual(r.status_code, 400, r.text)
            self.assertEqual([d["field"] for d in r.json()["error"]["details"]], ["model_path"])
            r = srv.post("/v1/jobs", {**spec, "quantization": Q4})
            self.assertEqual(r.status_code, 201, r.text)
            srv.wait_state(r.json()["id"], ["succeeded"])
        finally:
            srv.cleanup()
        srv = Server(extra=["--host-mem-mib", "256"]).start()
        try:
            big_model(srv)
            r = srv.post("/v1/jobs", {**spec, "quantization": Q4})
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["model_path"], detail)
            msg = detail[0]["message"]
            self.assertIn("for its weights in 4 bits (the linear projections) and float32 over "
                          "1 rank and their activations, more than the host's 0.25 GiB", msg)
            need = float(msg.split("needs at least ")[1].split(" GiB")[0])
            # 65.5M float32 embedding and head weights, 134.2M 4-bit ones at
            # 0.5 + 1/64 + 4/16384 bytes, the norms, one rank's activations.
            self.assertTrue(0.31 <= need <= 0.36, msg)
            self.assertEqual(srv.get("/v1/jobs").json()["jobs"], [])
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
