"""test_server_disk_faults.py - real full filesystems under a running job
(no injected faults): a small tmpfs that the test mounts (as root; where
mounting is not permitted every test here skips, saying so) holds, in turn,
the database's folder, the job's output_dir and the state folder (rank
logs), while a two-rank LoRA job of the real worker trains and reports; dd
fills it, rm frees it.

- Database folder: while full, /healthz and submissions answer 503 naming
  the cause, the ranks keep training, trainyardd does not spin; within
  seconds of the space coming back every kept report and state change is
  written in order (each step's metrics, no gap), the job ends in the state
  its ranks reached, submissions work; a trainyardd started on the file
  afterwards comes up with every acknowledged job.
- output_dir: the rank's checkpoint or output write fails naming "No space
  left on device", no `.partial` is left, the job follows max_restarts.
- State folder: the ranks train on and the job succeeds; the server stays up.
- The database's other real faults: a file whose schema version is current
  but which lacks a table is refused at start, naming it (it used to hang);
  a submission right after the file is deleted is refused, not acknowledged
  into the deleted file.
- A job's reason says what its ranks do now ("all 2 ranks training")."""
import glob
import os
import signal
import sqlite3
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server, TRAINYARDD  # noqa: E402

FINAL = ("succeeded", "failed", "cancelled")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mount_tmpfs(path, size):
    """Mounts a tmpfs of size at path; the reason it cannot, or None."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        return "not root: a real full filesystem needs a tmpfs mounted by root"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                       capture_output=True, text=True)
    if r.returncode:
        return "mounting a tmpfs is not permitted here (%s)" % r.stderr.strip()
    return None


def umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def fill(path):
    """Fills the filesystem holding path with a file; its name."""
    name = os.path.join(path, "filler")
    subprocess.run("dd if=/dev/zero of=%s bs=4k 2>/dev/null; sync" % name, shell=True)
    return name


def free_kib(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 1024


class RealDisk(unittest.TestCase):
    def setUp(self):
        self.mounts = []
        self.srv = None

    def tearDown(self):
        if self.srv:
            if self.srv.proc and self.srv.proc.poll() is None:
                self.srv.stop()
            self.srv.log.close()
        for m in reversed(self.mounts):
            umount(m)
        if self.srv:
            subprocess.run(["rm", "-rf", self.srv.dir])

    def server(self, mount_at, size, **kw):
        srv = Server(worker=None, **kw)
        self.srv = srv
        where = os.path.join(srv.dir, mount_at)
        why = mount_tmpfs(where, size)
        if why:
            self.skipTest(why)
        self.mounts.append(where)
        return srv, where

    def lora(self, srv, name, steps, **over):
        spec = srv.spec(name=name, model_path="models/m", lora_rank=4,
                        data={"path": "train.txt", "seq_len": 16},
                        train=dict({"steps": steps, "micro_batch_size": 2}, **over.pop("train", {})),
                        **over)
        r = srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 201, r.text)
        return r.json()["id"]

    def test_database_folder_full(self):
        srv, dbdir = self.server("dbfs", "4m", extra=["--heartbeat-timeout", "20",
                                                      "--progress-timeout", "60"])
        dbpath = os.path.join(dbdir, "ty.db")
        base = srv.args
        srv.args = lambda: [dbpath if a == os.path.join(srv.dir, "var", "ty.db") else a
                            for a in base()]
        srv.start()
        srv.mkmodel("models/m", 2)
        steps = 500
        jid = self.lora(srv, "full-db", steps)
        srv.wait_state(jid, ["running"], timeout=60)
        deadline = time.time() + 60
        while time.time() < deadline:
            ranks = srv.get("/v1/jobs/%s/ranks" % jid).json()["ranks"]
            if all(r["phase"] == "training" and r["step"] >= 20 for r in ranks):
                break
            time.sleep(0.1)
        filler = fill(dbdir)
        # The first failed write turns the server unhealthy, naming the cause.
        deadline = time.time() + 10
        status = None
        while time.time() < deadline:
            h = srv.get("/healthz")
            status = h.status_code
            if status == 503:
                break
            time.sleep(0.1)
        self.assertEqual(status, 503, "healthz stayed 200 on a full disk; log:\n" + srv.read_log())
        self.assertIn("database or disk is full", h.json()["error"]["message"])
        r = srv.post("/v1/jobs", srv.spec(name="refused", steps=2))
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("database or disk is full", r.json()["error"]["message"])
        # The ranks train on (their logs grow), trainyardd does not spin.
        logs = glob.glob(os.path.join(srv.dir, "var", "jobs", jid, "attempt-1", "rank-*.log"))
        sizes = [os.path.getsize(p) for p in logs]
        c0 = cpu_seconds(srv.proc.pid)
        time.sleep(3)
        self.assertLess(cpu_seconds(srv.proc.pid) - c0, 1.5, "trainyardd spins on a full disk")
        self.assertTrue(any(os.path.getsize(p) > s for p, s in zip(logs, sizes)),
                        "the ranks stopped training while the database was full")
        self.assertEqual(srv.get("/v1/jobs/" + jid).json()["state"], "running")
        log = srv.read_log()
        self.assertLess(log.count("unhealthy ("), 4, log)
        # Space comes back: within seconds, healthy, the job ends as its
        # ranks did, every report written in order.
        os.unlink(filler)
        t0 = time.time()
        job = srv.wait_state(jid, FINAL, timeout=90)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        deadline = time.time() + 15
        while srv.get("/healthz").status_code != 200 and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(srv.get("/healthz").status_code, 200, srv.read_log())
        healthy_after = time.time() - t0
        metrics = srv.get("/v1/jobs/%s/metrics" % jid).json()["ranks"]
        self.assertEqual(len(metrics), 2)
        for rk in metrics:
            self.assertEqual(rk["steps"], list(range(1, steps + 1)),
                             "rank %d's steps have gaps or repeats" % rk["rank"])
        events = srv.get("/v1/jobs/%s/events" % jid, timeout=10).text
        self.assertLess(events.index('"to":"running"'), events.index('"to":"succeeded"'))
        r = srv.post("/v1/jobs", srv.spec(name="after", steps=2, world_size=1))
        self.assertEqual(r.status_code, 201, r.text)
        acked = {j["id"] for j in srv.get("/v1/jobs?page_size=500").json()["jobs"]}
        self.assertEqual(srv.stop(), 0, srv.read_log())
        self.assertNotIn("could not be written before shutdown", srv.read_log())
        # A trainyardd started on that file comes up with every job.
        srv.proc = None
        srv.start()
        self.assertTrue(acked <= {j["id"] for j in srv.get("/v1/jobs?page_size=500")
                                  .json()["jobs"]})
        print("# database folder full: healthy and the job ended %.1f s after space came back"
              % healthy_after)

    def test_output_dir_full(self):
        srv, runs = self.server("runs", "2m", extra=["--heartbeat-timeout", "20",
                                                     "--progress-timeout", "60"])
        srv.start()
        srv.mkmodel("models/m", 2)
        filler = fill(runs)
        jid = self.lora(srv, "full-out", 6, max_restarts=1, train={"checkpoint_every": 2})
        job = srv.wait_state(jid, FINAL, timeout=120)
        self.assertEqual(job["state"], "failed", job)
        self.assertEqual(job["attempt"], 2, "max_restarts 1: two attempts")
        logs = "".join(srv.get("/v1/jobs/%s/ranks/%d/log" % (jid, r)).text for r in (0, 1))
        self.assertTrue("No space left on device" in job["reason"] or
                        "No space left on device" in logs, (job["reason"], logs[-2000:]))
        self.assertEqual(glob.glob(os.path.join(runs, "**", "*.partial"), recursive=True), [])
        self.assertEqual(srv.get("/healthz").status_code, 200)
        os.unlink(filler)
        jid = self.lora(srv, "full-out-again", 6, output_dir="runs/full-out",
                        train={"checkpoint_every": 2})
        self.assertEqual(srv.wait_state(jid, FINAL, timeout=120)["state"], "succeeded")

    def test_state_folder_full(self):
        srv, state = self.server("var", "4m", extra=["--heartbeat-timeout", "20",
                                                     "--progress-timeout", "60"])
        dbpath = os.path.join(srv.dir, "db", "ty.db")
        base = srv.args
        srv.args = lambda: [dbpath if a == os.path.join(srv.dir, "var", "ty.db") else a
                            for a in base()]
        srv.start()
        srv.mkmodel("models/m", 2)
        jid = self.lora(srv, "full-state", 300)
        srv.wait_state(jid, ["running"], timeout=60)
        filler = fill(state)
        time.sleep(2)
        self.assertNotEqual(srv.get("/v1/jobs/" + jid).json()["state"], "failed")
        os.unlink(filler)
        job = srv.wait_state(jid, FINAL, timeout=120)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(srv.get("/healthz").status_code, 200)
        jid = self.lora(srv, "after-state", 4)
        self.assertEqual(srv.wait_state(jid, FINAL, timeout=60)["state"], "succeeded")


class DatabaseFile(unittest.TestCase):
    def test_missing_table_refused_at_start(self):
        srv = Server()
        try:
            srv.start()
            self.assertEqual(srv.post("/v1/jobs", srv.spec(steps=2)).status_code, 201)
            srv.stop()
            db = sqlite3.connect(os.path.join(srv.dir, "var", "ty.db"))
            db.execute("DROP TABLE ranks")
            db.commit()
            db.close()
            p = subprocess.run(srv.args(), cwd=srv.dir, capture_output=True, text=True,
                               timeout=15)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("table 'ranks'", p.stderr)
            self.assertRegex(p.stderr, r"schema version is \d+ \(current\)")
            srv.proc = None
        finally:
            srv.cleanup()

    def test_submit_into_deleted_file_is_refused(self):
        srv = Server()
        try:
            srv.start()
            self.assertEqual(srv.post("/v1/jobs", srv.spec(name="a", steps=2)).status_code, 201)
            os.unlink(os.path.join(srv.dir, "var", "ty.db"))
            r = srv.post("/v1/jobs", srv.spec(name="b", steps=2))
            self.assertEqual(r.status_code, 503, r.text)
            self.assertIn("deleted", r.json()["error"]["message"])
            time.sleep(1.2)
            h = srv.get("/healthz")
            self.assertEqual(h.status_code, 503)
            self.assertIn("deleted", h.json()["error"]["message"])
        finally:
            srv.cleanup()


class Reason(unittest.TestCase):
    def test_reason_follows_the_ranks(self):
        srv = Server()
        try:
            srv.start()
            jid = srv.post("/v1/jobs", srv.spec(name="slow", steps=60)).json()["id"]
            deadline = time.time() + 20
            job = None
            while time.time() < deadline:
                job = srv.get("/v1/jobs/" + jid).json()
                if job["reason"] == "all 2 ranks training":
                    break
                time.sleep(0.05)
            self.assertEqual(job["reason"], "all 2 ranks training", job)
            srv.wait_state(jid, FINAL, timeout=30)
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
