"""server_check.py - cuda jobs through trainyardd end to end (ctest
gpu/server): a real trainyardd with --gpus hands each rank of a cuda job
its own GPU (CUDA_VISIBLE_DEVICES) and a nccl:file: rendezvous, and runs
the real trainyard-worker. LoRA with fsdp.memory_efficient_load, and every
weight from scratch, each on up to 2 GPUs, give the per-step losses of the
same job on CPU ranks through the same server (float32: 1e-3 relative, as
gpu/train); with gradient_checkpointing the LoRA job's losses stay (1e-6)
and its device peak falls; the GPU ranks report device peaks; the
adapter and the model land in output_dir. A GPU that holds a rank's
shard and its training buffers but not the standard load's whole model
beside the shard trains the job with fsdp.memory_efficient_load; without
it, the job is refused at submit where trainyardd's --gpu-mem-limit-mib
makes the GPU that small (rule device-memory: nothing stored, the message
names fsdp.memory_efficient_load and the cap), and fails at load where the
device itself is that small (the simulated device's TY_SIM_MEM_MIB,
which no NVML reports to the server), with a reason that names
fsdp.memory_efficient_load. The job stored before it is kept.

Exits 77 (a ctest skip), saying why, where no GPU is visible."""
import os
import random
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from tyserver import BIN, Server  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
SIM = os.path.exists(os.path.join(BIN, "cudasim", "libty_cudasim.so"))
STEPS = 6
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}


def visible_gpus():
    """The GPUs this host shows, and where that count came from."""
    if SIM:
        return int(os.environ.get("TY_SIM_GPUS") or 2), "the simulated device's TY_SIM_GPUS"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return 0, "nvidia-smi not found"
    return sum(line.startswith("GPU") for line in out.splitlines()), "nvidia-smi -L"


NGPU, WHERE = visible_gpus()
WORLD = min(NGPU, 2)


def start(srv_env=None, hidden=64, layers=2, extra=()):
    srv = Server(worker=None, extra=["--gpus", str(WORLD), "--heartbeat-timeout", "300",
                                     "--progress-timeout", "300", *extra], env=srv_env).start()
    r = random.Random(1)
    words = "the cat sat on a mat and dog ran to house with red door".split()
    with open(os.path.join(srv.dir, "words.txt"), "w") as f:
        f.write(" ".join(r.choice(words) for _ in range(6000)))
    subprocess.run([TY, "mkmodel", "--out", "models/base", "--hidden-size", str(hidden),
                    "--intermediate-size", str(2 * hidden), "--layers", str(layers), "--heads", "4",
                    "--kv-heads", "2", "--vocab-size", "256", "--seed", "3"],
                   cwd=srv.dir, check=True, capture_output=True)
    return srv


def spec(name, device, lora, efficient=True, seq_len=32, micro=None, ckpt=False):
    s = {"name": name, "device": device, "dtype": "float32", "world_size": WORLD,
         "allocation_mode": "static",
         "data": {"path": "words.txt", "format": "text", "seq_len": seq_len},
         "train": {"steps": STEPS, "micro_batch_size": micro or 4 // WORLD, "grad_accum": 1,
                   "lr": 3e-3, "warmup_steps": 2, "checkpoint_every": 0},
         "output_dir": "runs/" + name, "gradient_checkpointing": ckpt}
    if lora:
        s.update(model_path="models/base", use_lora=True, lora_rank=4,
                 target_modules="all-linear", fsdp={"memory_efficient_load": efficient})
    else:
        s.update(init_from_scratch=True, model=SHAPE, fsdp={"memory_efficient_load": False})
    return s


class CudaJobs(unittest.TestCase):
    def test_cuda_jobs_match_the_cpu_through_the_server(self):
        srv = start()
        try:
            jobs = {}
            for name, device, lora, ckpt in (
                    ("lora-cuda", "cuda", True, False), ("lora-cpu", "cpu", True, False),
                    ("full-cuda", "cuda", False, False), ("full-cpu", "cpu", False, False),
                    ("lora-cuda-ckpt", "cuda", True, True)):
                r = srv.post("/v1/jobs", spec(name, device, lora, ckpt=ckpt))
                self.assertEqual(r.status_code, 201, r.text)
                self.assertEqual(r.json()["device"], device)
                jobs[name] = r.json()["id"]
            for name, jid in jobs.items():
                job = srv.wait_state(jid, ["succeeded", "failed", "cancelled"], timeout=600)
                self.assertEqual(job["state"], "succeeded",
                                 "%s: %s\nrank 0 log:\n%s" % (name, job["reason"], srv.get(
                                     "/v1/jobs/%s/ranks/0/log" % jid).text[-3000:]))
            for kind in ("lora", "full"):
                gpu, cpu = jobs[kind + "-cuda"], jobs[kind + "-cpu"]
                lg, lc = self.losses(srv, gpu), self.losses(srv, cpu)
                self.assertEqual(len(lg), STEPS, lg)
                self.assertEqual(len(lc), STEPS, lc)
                worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(lg, lc))
                print("# %s, %d GPU rank(s) vs %d CPU ranks through trainyardd: %d step losses, "
                      "worst relative difference %.2e" % (kind, WORLD, WORLD, STEPS, worst))
                self.assertLess(worst, 1e-3, list(zip(lg, lc)))
                self.assertLess(lg[-1], lg[0], lg)
                for r in self.ranks(srv, gpu):
                    self.assertEqual(r["step"], STEPS, r)
                    self.assertGreater(r["device_peak_bytes"] or 0, 0, r)
                    self.assertGreater(r["host_peak_bytes"] or 0, 0, r)
                peaks = [r["device_peak_bytes"] for r in self.ranks(srv, gpu)]
                print("# %s on cuda: device peaks %s MiB" %
                      (kind, ", ".join("%.2f" % (p / 2**20) for p in peaks)))
            # gradient_checkpointing: the same losses, one layer's
            # activations on the device instead of every layer's.
            la, lb = self.losses(srv, jobs["lora-cuda"]), self.losses(srv, jobs["lora-cuda-ckpt"])
            worst = max(abs(a - b) / abs(a) for a, b in zip(la, lb))
            pa = max(r["device_peak_bytes"] for r in self.ranks(srv, jobs["lora-cuda"]))
            pb = max(r["device_peak_bytes"] for r in self.ranks(srv, jobs["lora-cuda-ckpt"]))
            print("# lora on cuda with gradient_checkpointing: losses within %.2e of without, "
                  "device peak %.2f MiB (without: %.2f MiB)" % (worst, pb / 2**20, pa / 2**20))
            self.assertEqual(len(lb), STEPS, lb)
            self.assertLess(worst, 1e-6, list(zip(la, lb)))
            self.assertLess(pb, pa)
            out = os.path.join(srv.dir, "runs")
            self.assertTrue(os.path.exists(os.path.join(out, "lora-cuda",
                                                        "adapter_model.safetensors")))
            self.assertTrue(os.path.exists(os.path.join(out, "full-cuda", "model.safetensors")))
            # Each rank held its own GPU: the worker's rank log says which
            # device it trained on.
            for rank in range(WORLD):
                log = srv.get("/v1/jobs/%s/ranks/%d/log" % (jobs["lora-cuda"], rank)).text
                self.assertIn("[rank %d/%d] train step %d/%d" % (rank, WORLD, STEPS, STEPS), log)
        finally:
            srv.cleanup()

    # A 4.8 MiB float32 base (8 layers, hidden 128): its shard and the
    # buffers of 16-token micro-batches fit in MIB; the whole base beside
    # the shard does not. (WORLD is 0 where the suite skips.)
    MIB = {2: 6}.get(WORLD, 8)

    def too_small(self, srv, capped):
        try:
            small = {"seq_len": 16, "micro": 1}
            ok = srv.post("/v1/jobs", spec("efficient", "cuda", True, **small)).json()
            job = srv.wait_state(ok["id"], ["succeeded", "failed"], timeout=600)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            before = srv.get("/v1/jobs").json()["jobs"]
            r = srv.post("/v1/jobs", spec("standard", "cuda", True, efficient=False, **small))
            if capped:
                # The cap is known at submit: the job is refused there
                # (rule device-memory), with the fix, and nothing stored.
                self.assertEqual(r.status_code, 400, r.text)
                d = r.json()["error"]["details"][0]
                print("# %d MiB cap, standard load: refused at submit: %s" % (self.MIB, d["message"]))
                self.assertEqual(d["field"], "fsdp.memory_efficient_load")
                self.assertIn("that --gpu_mem_limit_mib allows each GPU rank", d["message"])
                self.assertIn("set it true", d["message"])
                self.assertEqual(srv.get("/v1/jobs").json()["jobs"], before)
            else:
                # The device's own size is not known to the server: the
                # rank fails at load, naming the fix.
                self.assertEqual(r.status_code, 201, r.text)
                job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=600)
                print("# %d MiB GPU, standard load: %s" % (self.MIB, job["reason"]))
                self.assertEqual(job["state"], "failed")
                self.assertIn("fsdp.memory_efficient_load", job["reason"])
                self.assertRegex(job["reason"], r"^rank \d failed: cannot allocate its")
            self.assertEqual(srv.get("/v1/jobs/" + ok["id"]).json()["state"], "succeeded")
        finally:
            srv.cleanup()

    def test_a_capped_device_refuses_the_job_with_the_fix(self):
        srv = start(hidden=128, layers=8, extra=["--gpu-mem-limit-mib", str(self.MIB)])
        self.too_small(srv, True)

    @unittest.skipUnless(SIM, "sets the device's memory, which only the simulated device can")
    def test_a_device_too_small_fails_the_job_with_the_fix(self):
        self.too_small(start({"TY_SIM_MEM_MIB": str(self.MIB)}, hidden=128, layers=8), False)

    @staticmethod
    def losses(srv, jid):
        m = srv.get("/v1/jobs/%s/metrics" % jid).json()
        r0 = [r for r in m["ranks"] if r["rank"] == 0][0]
        return [x for s, x in sorted(zip(r0["steps"], r0["loss"])) if x is not None]

    @staticmethod
    def ranks(srv, jid):
        return srv.get("/v1/jobs/%s/ranks" % jid).json()["ranks"]


if __name__ == "__main__":
    if NGPU == 0:
        print("SKIP gpu/server: no GPU visible (%s)" % WHERE)
        sys.exit(77)
    print("# %d GPU(s) visible (%s); cuda jobs of world size %d" % (NGPU, WHERE, WORLD))
    unittest.main(verbosity=2)
