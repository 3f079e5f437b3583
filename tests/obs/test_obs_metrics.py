"""test_obs_metrics.py - GET /v1/jobs/{id}/metrics with from_step, to_step
and max_points against a real trainyardd (ranks played by
ty_test_worker): the range is honoured, each rank's curve is thinned to
at most max_points with its ends and extremes kept, and bad parameters are
400s naming the parameter."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from tyserver import Server  # noqa: E402

STEPS = 400


class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server().start()
        r = cls.srv.post("/v1/jobs", cls.srv.spec(name="curves", steps=STEPS, world_size=2))
        assert r.status_code == 201, r.text
        cls.job_id = r.json()["id"]
        job = cls.srv.wait_state(cls.job_id, ["succeeded", "failed"], timeout=120)
        assert job["state"] == "succeeded", job

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def metrics(self, query=""):
        return self.srv.get("/v1/jobs/%s/metrics%s" % (self.job_id, query))

    def test_every_point_by_default(self):
        m = self.metrics().json()
        self.assertEqual(len(m["ranks"]), 2)
        for r in m["ranks"]:
            self.assertEqual(r["steps"], list(range(1, STEPS + 1)))
            self.assertEqual(r["points"], STEPS)
        self.assertIsNone(m["max_points"])
        self.assertIsNone(m["to_step"])

    def test_thinned(self):
        full = {r["rank"]: r for r in self.metrics().json()["ranks"]}
        m = self.metrics("?max_points=40").json()
        self.assertEqual(m["max_points"], 40)
        for r in m["ranks"]:
            self.assertLessEqual(len(r["steps"]), 40)
            self.assertGreaterEqual(len(r["steps"]), 20)
            self.assertEqual(r["points"], STEPS)
            self.assertEqual(r["steps"][0], 1)
            self.assertEqual(r["steps"][-1], STEPS)
            self.assertEqual(r["steps"], sorted(set(r["steps"])))
            f = full[r["rank"]]
            self.assertIn(min(f["loss"]), r["loss"])
            self.assertIn(max(f["loss"]), r["loss"])
            # Each kept point is the full curve's point of that step.
            at = dict(zip(f["steps"], f["loss"]))
            for s, l in zip(r["steps"], r["loss"]):
                self.assertEqual(at[s], l)
            self.assertEqual(len(r["t"]), len(r["steps"]))
            self.assertEqual(len(r["tokens_per_s"]), len(r["steps"]))

    def test_range(self):
        m = self.metrics("?from_step=100&to_step=199").json()
        self.assertEqual((m["from_step"], m["to_step"]), (100, 199))
        for r in m["ranks"]:
            self.assertEqual(r["steps"], list(range(100, 200)))
            self.assertEqual(r["points"], 100)
        m = self.metrics("?from_step=350&max_points=8").json()
        for r in m["ranks"]:
            self.assertEqual(r["points"], STEPS - 349)
            self.assertEqual(r["steps"][0], 350)
            self.assertEqual(r["steps"][-1], STEPS)
            self.assertLessEqual(len(r["steps"]), 8)
        m = self.metrics("?from_step=5000").json()
        self.assertEqual(m["ranks"], [])

    def test_bad_parameters(self):
        for query, field in [("?max_points=3", "max_points"), ("?max_points=ten", "max_points"),
                             ("?max_points=0", "max_points"), ("?from_step=-1", "from_step"),
                             ("?to_step=x", "to_step"), ("?from_step=10&to_step=9", "to_step"),
                             ("?attempt=0", "attempt")]:
            r = self.metrics(query)
            self.assertEqual(r.status_code, 400, query)
            err = r.json()["error"]
            self.assertEqual(err["code"], "INVALID_ARGUMENT", query)
            self.assertIn(field, [d["field"] for d in err["details"]], (query, err))
        self.assertEqual(self.srv.get("/v1/jobs/nope/metrics?max_points=10").status_code, 404)
        self.assertEqual(self.metrics("?attempt=9").status_code, 404)


if __name__ == "__main__":
    unittest.main()
