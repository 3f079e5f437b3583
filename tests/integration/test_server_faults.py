"""test_server_faults.py - a bad day for the database, with writes failed on
purpose by the fault-injecting VFS (TRAINYARD_TEST_DB_FAULTS names its
control file: "N full|ioerr [once]" fails the Nth write or sync and every
one after it until the file is gone).

- No lost state change: a job that ends while nothing can be written ends
  all the same once writes work again; meanwhile /healthz answers 503
  naming the cause, submissions get 503, the scheduler does not spin and
  the log says it once, not once per retry.
- The sweep (SQLite's ioerr tests): N over every write of a job's life,
  submit -> run -> end; after each, no acknowledged job is lost, none is
  left in a non-final state, and the server answered throughout."""
import os
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server  # noqa: E402

FINAL = ("succeeded", "failed", "cancelled")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Faults(unittest.TestCase):
    def setUp(self):
        self.srv = Server()
        self.ctl = os.path.join(self.srv.dir, "faults")
        self.srv.env = {"TRAINYARD_TEST_DB_FAULTS": self.ctl}
        self.srv.start()

    def tearDown(self):
        if os.path.exists(self.ctl):
            os.unlink(self.ctl)
        self.srv.cleanup()

    def fail_writes(self, text):
        """Arms the control file (a new inode: the count starts again)."""
        tmp = self.ctl + ".new"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.rename(tmp, self.ctl)
        for suffix in (".hits", ".seen"):
            if os.path.exists(self.ctl + suffix):
                os.unlink(self.ctl + suffix)

    def hit(self):
        """Whether a write failed since the control file was armed."""
        return os.path.exists(self.ctl + ".hits")

    def health(self):
        r = requests.get(self.srv.url + "/healthz", timeout=3)
        return r.status_code, r.json()

    def test_job_end_lands_once_writes_work_again(self):
        srv = self.srv
        c = srv.post("/v1/jobs", srv.spec(name="ended-before", steps=2)).json()
        srv.wait_state(c["id"], ["succeeded"])
        a = srv.post("/v1/jobs", srv.spec(name="step150-ends", steps=12, world_size=4)).json()
        b = srv.post("/v1/jobs", srv.spec(name="queued-behind", steps=2, world_size=2)).json()
        srv.wait_state(a["id"], ["running"])
        self.fail_writes("1 full")
        # The ranks finish (each writes its .done file) while nothing can
        # be written: the end and the next job's start are kept, not lost.
        done = [os.path.join(srv.dir, "runs", "step150-ends", "rank%d.done" % r) for r in range(4)]
        deadline = time.time() + 20
        while time.time() < deadline and not all(os.path.exists(p) for p in done):
            time.sleep(0.1)
        self.assertTrue(all(os.path.exists(p) for p in done), srv.read_log())
        time.sleep(0.5)
        status, body = self.health()
        self.assertEqual(status, 503, body)
        self.assertIn("database or disk is full", body["error"]["message"])
        self.assertIn("kept in memory and retried", body["error"]["message"])
        r = srv.post("/v1/jobs", srv.spec(name="refused", steps=2))
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("cannot take jobs now", r.json()["error"]["message"])
        r = requests.delete(srv.url + "/v1/jobs/" + c["id"], timeout=5)
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("cannot be deleted now: the database cannot be written", r.text)
        # No loop spins on the failed writes: little CPU, few log lines.
        c0 = cpu_seconds(srv.proc.pid)
        time.sleep(3)
        self.assertLess(cpu_seconds(srv.proc.pid) - c0, 1.0)
        log = srv.read_log()
        self.assertEqual(log.count("unhealthy (database writes)"), 1, log)
        self.assertLess(log.count("sqlite:"), 12, log)
        self.assertEqual(srv.get("/v1/jobs/" + a["id"]).json()["state"], "running")
        self.assertEqual(srv.get("/v1/jobs/" + b["id"]).json()["state"], "queued")

        os.unlink(self.ctl)
        self.assertEqual(srv.wait_state(a["id"], ["succeeded"], timeout=15)["state"], "succeeded")
        srv.wait_state(b["id"], ["succeeded"], timeout=20)
        ranks = srv.get("/v1/jobs/%s/ranks" % a["id"]).json()["ranks"]
        self.assertEqual({r["state"] for r in ranks}, {"exited"})
        # The event stream ends (final state, every rank recorded), in order.
        events = srv.get("/v1/jobs/%s/events" % a["id"], timeout=10).text
        self.assertLess(events.index('"to":"running"'), events.index('"to":"succeeded"'))
        status, body = self.health()
        self.assertEqual(status, 200, body)
        self.assertIn("healthy again (database writes)", srv.read_log())
        self.assertEqual(requests.delete(srv.url + "/v1/jobs/" + c["id"], timeout=5)
                         .status_code, 200)

    def test_sweep_every_write_of_a_job(self):
        srv = self.srv
        acked = []
        n = 1
        while True:
            kind = "full" if n % 2 else "ioerr"
            self.fail_writes("%d %s" % (n, kind))
            r = srv.post("/v1/jobs", srv.spec(name="sweep%d" % n, steps=2, world_size=1),
                         timeout=5)
            self.assertIn(r.status_code, (201, 503), r.text)
            if r.status_code == 201:
                acked.append(r.json()["id"])
            # Writes fail from the Nth on for a while: the server answers.
            until = time.time() + 0.4
            while time.time() < until:
                status, _ = self.health()
                self.assertIn(status, (200, 503))
                self.assertEqual(srv.get("/v1/jobs?page_size=1", timeout=3).status_code, 200)
                time.sleep(0.1)
            hit = self.hit()
            os.unlink(self.ctl)
            for jid in acked:
                srv.wait_state(jid, FINAL, timeout=20)
            if not hit:
                break  # N is past the last write of a job's life
            n += 1
            self.assertLess(n, 200, "a job's life should not take this many writes")
        self.assertGreater(n, 5)
        jobs = srv.get("/v1/jobs?page_size=500").json()["jobs"]
        self.assertTrue(set(acked) <= {j["id"] for j in jobs}, "an acknowledged job was lost")
        self.assertEqual([j for j in jobs if j["state"] not in FINAL], [])
        deadline = time.time() + 10
        while self.health()[0] != 200 and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(self.health()[0], 200)
        print("sweep: %d write positions, %d jobs acknowledged" % (n, len(acked)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
