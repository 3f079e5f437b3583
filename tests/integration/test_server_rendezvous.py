"""test_server_rendezvous.py - PUT and GET /v1/jobs/{id}/attempts/{n}/
rendezvous/{key}: under the job's own token (read from a running rank's
environment, where ranks get it), confined to that job and its current
attempt; values published once and read back byte for byte; a GET waits
for a key published later (its connection suspended: with one REST thread
the server still answers while readers wait), times out with 404, and ends
at shutdown; bounds on keys, values and attempts; an ended attempt's keys
are refused."""
import os
import sys
import threading
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server  # noqa: E402


def env_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)


class Rendezvous(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One REST thread: a reader that blocked it would stop the server.
        cls.srv = Server(extra=["--http-threads", "1"]).start()
        cls.job, cls.token = cls.running_job("rdv-hold")
        cls.other, cls.other_token = cls.running_job("rdv-other")

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    @classmethod
    def running_job(cls, name):
        srv = cls.srv
        r = srv.post("/v1/jobs", srv.spec(name=name, steps=100000, world_size=1))
        assert r.status_code == 201, r.text
        job = srv.wait_state(r.json()["id"], ["running"])
        pid = srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"][0]["pid"]
        return job["id"], env_of(pid)[b"TRAINYARD_JOB_TOKEN"].decode()

    def url(self, key, attempt=1, job=None):
        return "%s/v1/jobs/%s/attempts/%s/rendezvous/%s" % (self.srv.url, job or self.job,
                                                             attempt, key)

    def put(self, key, data, token=None, **kw):
        return requests.put(self.url(key, **kw), data=data, timeout=10,
                            headers={"Authorization": "Bearer " + (token or self.token)})

    def get(self, key, token=None, timeout_s=None, **kw):
        q = "" if timeout_s is None else "?timeout_s=%d" % timeout_s
        return requests.get(self.url(key, **kw) + q, timeout=90,
                            headers={"Authorization": "Bearer " + (token or self.token)})

    def test_publish_and_read_back(self):
        value = bytes(range(256)) * 3  # NUL bytes and all
        self.assertEqual(self.put("nccl-id", value).status_code, 204)
        r = self.get("nccl-id", timeout_s=0)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.content, value)
        # Once an attempt: the same value again is fine, another is refused.
        self.assertEqual(self.put("nccl-id", value).status_code, 204)
        r = self.put("nccl-id", b"other")
        self.assertEqual(r.status_code, 409, r.text)
        self.assertIn("published already", r.json()["error"]["message"])
        # An empty value is a value.
        self.assertEqual(self.put("empty", b"").status_code, 204)
        self.assertEqual(self.get("empty", timeout_s=0).content, b"")

    def test_a_reader_waits_for_a_later_key(self):
        got = {}

        def read():
            t0 = time.time()
            got["r"] = self.get("store-addr", timeout_s=20)
            got["t"] = time.time() - t0

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        time.sleep(0.5)
        # Readers wait without holding the server's one REST thread.
        t0 = time.time()
        self.assertEqual(self.srv.get("/healthz").status_code, 200)
        self.assertLess(time.time() - t0, 2)
        self.assertEqual(self.put("store-addr", b"10.0.0.1:29500").status_code, 204)
        for t in readers:
            t.join(30)
        self.assertEqual(got["r"].status_code, 200, got["r"].text)
        self.assertEqual(got["r"].content, b"10.0.0.1:29500")
        self.assertLess(got["t"], 5)

    def test_a_wait_ends_with_404(self):
        t0 = time.time()
        r = self.get("never", timeout_s=1)
        self.assertEqual(r.status_code, 404, r.text)
        self.assertIn("was not published within the wait", r.json()["error"]["message"])
        self.assertGreaterEqual(time.time() - t0, 0.9)
        self.assertLess(time.time() - t0, 10)

    def test_confined_to_the_job_and_its_attempt(self):
        self.assertEqual(self.put("mine", b"x").status_code, 204)
        # The API token, another job's token, no token, an unknown job: 401.
        for tok in ["", "nope", self.other_token]:
            self.assertEqual(self.put("mine", b"y", token=tok or "x").status_code, 401)
            self.assertEqual(self.get("mine", token=tok or "x", timeout_s=0).status_code, 401)
        r = requests.get(self.url("mine"), timeout=10)
        self.assertEqual(r.status_code, 401)
        self.assertEqual(self.put("mine", b"y", job="j-nope").status_code, 401)
        # The other job's token reads only its own job's keys.
        self.assertEqual(self.get("mine", token=self.other_token, job=self.other,
                                  timeout_s=0).status_code, 404)
        # An attempt that does not exist, or is not a number.
        r = self.get("mine", attempt=2, timeout_s=0)
        self.assertEqual(r.status_code, 404, r.text)
        self.assertIn("has no attempt 2", r.json()["error"]["message"])
        self.assertEqual(self.put("mine", b"y", attempt="x").status_code, 400)
        self.assertEqual(self.put("mine", b"y", attempt=0).status_code, 400)

    def test_bounds(self):
        r = self.put("bad$key", b"v")
        self.assertEqual(r.status_code, 400, r.text)
        self.assertIn("letters, digits", r.json()["error"]["message"])
        self.assertEqual(self.put("k" * 65, b"v").status_code, 400)
        self.assertEqual(self.put("k" * 64, b"v").status_code, 204)
        self.assertEqual(self.put("big", b"v" * 65537).status_code, 413)
        self.assertEqual(self.put("big", b"v" * 65536).status_code, 204)
        self.assertEqual(self.get("big", timeout_s=61).status_code, 400)

    def test_zz_an_ended_attempt_is_refused(self):
        job, token = self.running_job("rdv-ends")
        self.assertEqual(self.put("k", b"v", token=token, job=job).status_code, 204)
        self.srv.post("/v1/jobs/%s:cancel" % job)
        self.srv.wait_state(job, ["cancelled"])
        r = self.get("k", token=token, job=job, timeout_s=0)
        self.assertEqual(r.status_code, 412, r.text)
        self.assertIn("has ended", r.json()["error"]["message"])

    def test_zz_shutdown_ends_waiting_readers(self):
        srv = Server(extra=["--http-threads", "1"])
        Rendezvous.srv, saved = srv, Rendezvous.srv
        try:
            srv.start()
            job, token = self.running_job("rdv-stop")
            got = {}
            t = threading.Thread(target=lambda: got.update(
                r=self.get("late", token=token, job=job, timeout_s=60)))
            t.start()
            time.sleep(0.5)
            t0 = time.time()
            srv.cleanup()  # a clean exit (0) with a reader waiting
            t.join(30)
            self.assertLess(time.time() - t0, 20)
            self.assertIn(got["r"].status_code, (404, 503))
        finally:
            Rendezvous.srv = saved


if __name__ == "__main__":
    unittest.main(verbosity=2)
