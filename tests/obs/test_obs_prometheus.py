"""test_obs_prometheus.py - a running job's per-rank series on trainyardd's
/metrics, parsed by prometheus_client's own parser (HELP, TYPE, labels,
values), gone once the job ends; the job's progress, eta_seconds and
tokens_per_s in GET /v1/jobs/{id}, the list and the SSE "progress"
events, moving as the job trains. Ranks are played by ty_test_worker."""
import json
import os
import subprocess
import sys
import time
import unittest

import requests
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from tyserver import BIN, Server  # noqa: E402

FAMILIES = ["trainyard_job_rank_step", "trainyard_job_rank_total_steps",
            "trainyard_job_rank_loss", "trainyard_job_rank_tokens_per_second",
            "trainyard_job_rank_host_peak_bytes", "trainyard_job_rank_device_peak_bytes",
            "trainyard_job_rank_seconds_since_report"]


def families(srv):
    r = srv.get("/metrics")
    assert r.status_code == 200, r.text
    return {f.name: f for f in text_string_to_metric_families(r.text)}


class Prometheus(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server().start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def test_series_per_rank_while_running_then_gone(self):
        srv = self.srv
        r = srv.post("/v1/jobs", srv.spec(name="prom-slow", steps=60, world_size=2))
        self.assertEqual(r.status_code, 201, r.text)
        job_id = r.json()["id"]
        deadline = time.time() + 30
        fams = None
        while time.time() < deadline:
            fams = families(srv)
            steps = [s for s in fams["trainyard_job_rank_step"].samples
                     if s.labels.get("job_id") == job_id]
            if len(steps) == 2 and all(s.value >= 3 for s in steps):
                break
            time.sleep(0.1)
        else:
            self.fail("no step series for both ranks: %s" % fams)
        for name in FAMILIES:
            self.assertIn(name, fams)
            self.assertEqual(fams[name].type, "gauge", name)
            self.assertTrue(fams[name].documentation, name)
        for name in FAMILIES:
            if name == "trainyard_job_rank_device_peak_bytes":
                continue
            mine = [s for s in fams[name].samples if s.labels.get("job_id") == job_id]
            self.assertEqual(sorted(s.labels["rank"] for s in mine), ["0", "1"], name)
            for s in mine:
                self.assertEqual(s.labels["name"], "prom-slow")
        by = lambda n: {s.labels["rank"]: s.value for s in fams[n].samples  # noqa: E731
                        if s.labels.get("job_id") == job_id}
        self.assertEqual(by("trainyard_job_rank_total_steps"), {"0": 60, "1": 60})
        self.assertEqual(by("trainyard_job_rank_tokens_per_second"), {"0": 1000, "1": 1000})
        self.assertEqual(by("trainyard_job_rank_host_peak_bytes"), {"0": 8 << 20, "1": 8 << 20})
        self.assertTrue(all(0 < v < 3 for v in by("trainyard_job_rank_loss").values()))
        self.assertTrue(all(0 <= v < 2 for v in
                            by("trainyard_job_rank_seconds_since_report").values()))

        # The job's view while it trains.
        job = srv.get("/v1/jobs/" + job_id).json()
        self.assertEqual(job["progress_phase"], "training")
        self.assertGreater(job["progress"], 0)
        self.assertLess(job["progress"], 1)
        self.assertEqual(job["tokens_per_s"], 2000)
        self.assertIsNotNone(job["eta_seconds"])
        self.assertGreater(job["eta_seconds"], 0)
        listed = [j for j in srv.get("/v1/jobs").json()["jobs"] if j["id"] == job_id][0]
        self.assertIn("progress", listed)
        self.assertIn("eta_seconds", listed)

        srv.wait_state(job_id, ["succeeded"], timeout=60)
        fams = families(srv)
        for name in FAMILIES:
            self.assertFalse([s for s in fams[name].samples if s.labels.get("job_id") == job_id],
                             name)
        job = srv.get("/v1/jobs/" + job_id).json()
        self.assertEqual((job["progress"], job["progress_phase"], job["eta_seconds"],
                          job["tokens_per_s"]), (1, "done", 0, 0))

        # Every progress event carries the job's figures; training ones
        # rise with the steps.
        ev = requests.get(srv.url + "/v1/jobs/%s/events" % job_id, stream=True, timeout=10)
        seen = []
        for line in ev.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                e = json.loads(line[5:])
                if e["type"] == "progress":
                    seen.append(e["data"])
        ev.close()
        self.assertTrue(seen)
        for d in seen:
            for k in ("job_progress", "job_progress_phase", "job_eta_seconds",
                      "job_tokens_per_s"):
                self.assertIn(k, d)
        loading = [d for d in seen if d["job_progress_phase"] == "loading"]
        self.assertTrue(loading)
        self.assertTrue(all(0 < d["job_progress"] <= 1 for d in loading))
        train = [d["job_progress"] for d in seen if d["job_progress_phase"] == "training"]
        self.assertEqual(train, sorted(train))
        self.assertGreater(train[-1], 0.9)

        # The CLI shows the same figures: list's PROGRESS column, watch's
        # job lines (no terminal: one per change), get's JSON.
        def ty(*args):
            p = subprocess.run([os.path.join(BIN, "cli", "trainyard")] + list(args) +
                               ["--server", srv.url], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            return p.stdout
        rows = [line for line in ty("list").splitlines() if line.startswith(job_id)]
        self.assertEqual(len(rows), 1)
        self.assertIn("done 100%", rows[0])
        self.assertIn("PROGRESS", ty("list").splitlines()[0])
        watched = [line for line in ty("watch", job_id).splitlines() if line.startswith("job ")]
        self.assertTrue(any(line.startswith("job loading ") for line in watched), watched)
        self.assertTrue(any(" tok/s" in line and line.startswith("job training ")
                            for line in watched), watched)
        got = json.loads(ty("get", job_id))
        self.assertEqual((got["progress"], got["progress_phase"]), (1, "done"))


if __name__ == "__main__":
    unittest.main()
