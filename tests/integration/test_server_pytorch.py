"""test_server_pytorch.py - trainyardd trains LoRA adapters with
fsdp.memory_efficient_load over a PyTorch state dict that torch.save wrote
(one .pt file named by model_path, config.json beside it), with the real
worker, to the same losses and adapter as over its safetensors twin; a
model_path naming a file that is no checkpoint is refused at submit."""
import json
import os
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server  # noqa: E402

TORCH_PY = "/usr/bin/python3"  # the interpreter with python3-torch
PT_MAKE = os.path.join(os.path.dirname(__file__), "pt_make.py")


def tensors(path):
    """name -> raw bytes of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in hdr.items()}


class PyTorchCheckpoint(unittest.TestCase):
    def test_lora_over_a_torch_save_state_dict(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/st", 2, "--dtype", "bf16")
            # {"state_dict": ...} of views into one storage, in one file.
            subprocess.run([TORCH_PY, PT_MAKE, "twin", "models/st", "models/pt", "packed"],
                           cwd=srv.dir, check=True)
            jobs = {}
            for name, path in (("over-st", "models/st"), ("over-pt", "models/pt/model.pt")):
                spec = srv.spec(name=name, steps=6, model_path=path,
                                fsdp={"memory_efficient_load": True}, lora_rank=4,
                                data={"path": "train.txt", "seq_len": 16},
                                train={"steps": 6, "micro_batch_size": 2})
                r = srv.post("/v1/jobs", spec)
                self.assertEqual(r.status_code, 201, r.text)
                jobs[name] = r.json()["id"]
            for name, jid in jobs.items():
                job = srv.wait_state(jid, ["succeeded", "failed"], timeout=240)
                self.assertEqual(job["state"], "succeeded", job["reason"])
            m = {n: srv.get("/v1/jobs/%s/metrics" % j).json() for n, j in jobs.items()}
            self.assertEqual(m["over-pt"]["ranks"][0]["steps"], list(range(1, 7)))
            self.assertEqual(m["over-pt"]["ranks"][0]["loss"], m["over-st"]["ranks"][0]["loss"])
            a = tensors(os.path.join(srv.dir, "runs", "over-st", "adapter_model.safetensors"))
            b = tensors(os.path.join(srv.dir, "runs", "over-pt", "adapter_model.safetensors"))
            self.assertEqual(sorted(a), sorted(b))
            self.assertTrue(all(a[k] == b[k] for k in a))
            cfg = json.load(open(os.path.join(srv.dir, "runs", "over-pt", "adapter_config.json")))
            self.assertTrue(cfg["base_model_name_or_path"].endswith("model.pt"), cfg)
            log = srv.get("/v1/jobs/%s/ranks/1/log" % jobs["over-pt"]).text
            self.assertIn("[rank 1/2] train step 6/6", log)

            # A file model_path that is no checkpoint file is named at submit.
            with open(os.path.join(srv.dir, "models", "notes.txt"), "w") as f:
                f.write("not a checkpoint")
            r = srv.post("/v1/jobs", srv.spec(name="bad", model_path="models/notes.txt"))
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["model_path"], detail)
            self.assertIn("neither a directory nor a checkpoint file", detail[0]["message"])
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
