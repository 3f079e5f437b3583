"""test_server_recovery.py - kill -9 of trainyardd while jobs run, then a
restart: no acknowledged job is lost, none stays in a non-final state it
cannot leave, surviving ranks are stopped, each change an event with its
reason. Also a clean shutdown (SIGTERM) with a running job, and a second
trainyardd on the same database (by any name of the file), which is refused
rather than taking the first one's ranks for leftovers of a crash; a
database file replaced under a running server, and a damaged one at
start."""
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server, free_port, group_alive  # noqa: E402


class Recovery(unittest.TestCase):
    def test_kill_9_and_restart(self):
        srv = Server()
        try:
            srv.start()
            # Ranks that outlive the server (they ignore SIGPIPE on their log).
            once = srv.post("/v1/jobs", srv.spec(name="nopipe-slow-once", steps=300)).json()
            retry = srv.post("/v1/jobs", srv.spec(name="nopipe-slow-retry", steps=20,
                                                  max_restarts=1)).json()
            queued = srv.post("/v1/jobs", srv.spec(name="waiting", steps=3,
                                                   world_size=4)).json()
            for j in (once, retry):
                srv.wait_state(j["id"], ["running"])
            pids = [r["pid"] for j in (once, retry)
                    for r in srv.get("/v1/jobs/%s/ranks" % j["id"]).json()["ranks"]]
            self.assertEqual(len(pids), 4)
            srv.stop(signal.SIGKILL)
            time.sleep(0.3)
            self.assertTrue(all(group_alive(p) for p in pids), "ranks should outlive the kill")

            srv.start()
            self.assertFalse([p for p in pids if group_alive(p)], "old ranks still running")
            j1 = srv.get("/v1/jobs/" + once["id"]).json()
            self.assertEqual(j1["state"], "failed")
            self.assertIn("trainyardd restarted while attempt 1 ran", j1["reason"])
            ranks = srv.get("/v1/jobs/%s/ranks" % once["id"]).json()["ranks"]
            self.assertEqual({r["state"] for r in ranks}, {"stopped"})
            self.assertTrue(all("trainyardd restarted" in r["message"] for r in ranks))
            # The job with a restart left runs again and finishes; the queued
            # one was never lost and runs after it.
            j2 = srv.wait_state(retry["id"], ["succeeded"], timeout=30)
            self.assertEqual(j2["attempt"], 2)
            srv.wait_state(queued["id"], ["succeeded"], timeout=30)
            events = srv.get("/v1/jobs/%s/events" % retry["id"], timeout=20).text
            self.assertIn("trainyardd restarted while attempt 1 ran; its ranks were stopped; "
                          "retrying (restart 1 of 1)", events)
            listed = {j["id"] for j in srv.get("/v1/jobs").json()["jobs"]}
            self.assertEqual(listed, {once["id"], retry["id"], queued["id"]})
        finally:
            srv.cleanup()

    def check_wedge_free(self, srv, job_id, pids):
        """After a restart: no rank of the job runs, every rank row has its
        end, the event stream and `trainyard watch` end, DELETE works."""
        self.assertFalse([p for p in pids if group_alive(p)], "old ranks still running")
        for attempt in range(1, srv.get("/v1/jobs/" + job_id).json()["attempt"] + 1):
            ranks = srv.get("/v1/jobs/%s/ranks?attempt=%d" % (job_id, attempt)).json()["ranks"]
            self.assertFalse([r for r in ranks if r["state"] in ("starting", "running")], ranks)
        events = srv.get("/v1/jobs/%s/events" % job_id, timeout=10).text
        self.assertIn("trainyardd restarted: the rank was stopped", events)
        env = dict(os.environ, TRAINYARD_SERVER=srv.url)
        env.pop("TRAINYARD_TOKEN", None)
        w = subprocess.run([os.path.join(BIN, "cli", "trainyard"), "watch", job_id], env=env,
                           capture_output=True, text=True, timeout=20)
        self.assertNotIn("Traceback", w.stderr)
        r = requests.delete(srv.url + "/v1/jobs/" + job_id, timeout=10)
        self.assertEqual(r.status_code, 200, r.text)

    def test_cancel_and_kill_9_at_once(self):
        srv = Server(extra=["--grace", "3"])
        stray = "/dev/shm/trainyard-ty-j-00000000deadbeef-1"
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="ignoreterm-nopipe-slow", steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            pids = [r["pid"] for r in srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]]
            self.assertEqual(srv.post("/v1/jobs/%s:cancel" % job["id"]).status_code, 200)
            srv.stop(signal.SIGKILL)
            self.assertTrue(all(group_alive(p) for p in pids), "ranks should still be stopping")
            # What a crash during the ranks' rendezvous leaves: the attempt's
            # segment (and one of a job this database does not know), and a
            # checkpoint being written.
            ours = "/dev/shm/trainyard-ty-%s-1" % job["id"]
            for path in (ours, stray):
                with open(path, "wb") as f:
                    f.write(b"\0" * 64)
            tmp = os.path.join(srv.dir, "runs", "ignoreterm-nopipe-slow", "checkpoints",
                               "step-00000003.tmp")
            os.makedirs(tmp)
            with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
                f.write(b"x")
            srv.start()
            self.assertFalse(os.path.exists(ours), "the attempt's shm segment is left")
            self.assertTrue(os.path.exists(stray), "another database's segment was removed")
            self.assertFalse(os.path.exists(tmp), "the unfinished checkpoint is left")
            self.assertEqual(srv.get("/v1/jobs/" + job["id"]).json()["state"], "cancelled")
            self.check_wedge_free(srv, job["id"], pids)
        finally:
            if os.path.exists(stray):
                os.unlink(stray)
            srv.cleanup()

    def test_kill_9_while_a_failed_attempt_stops(self):
        srv = Server(extra=["--grace", "3"])
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="fail0at3-ignoreterm-nopipe-slow",
                                                steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            pids = [r["pid"] for r in srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]]
            srv.wait_state(job["id"], ["failed"])
            srv.stop(signal.SIGKILL)
            self.assertTrue(group_alive(pids[1]), "rank 1 should still be stopping")
            srv.start()
            j = srv.get("/v1/jobs/" + job["id"]).json()
            self.assertEqual(j["state"], "failed")
            self.assertIn("rank 0 failed", j["reason"])
            self.check_wedge_free(srv, job["id"], pids)
        finally:
            srv.cleanup()

    def test_second_server_on_one_database_is_refused(self):
        srv = Server()
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="slow-owned", steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            pids = [r["pid"] for r in srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]]
            args = srv.args()
            args[args.index("--listen") + 1] = "127.0.0.1:%d" % free_port()
            p = subprocess.run(args, cwd=srv.dir, capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("is in use by another trainyardd (pid %d, " % srv.proc.pid, p.stderr)
            self.assertIn("give this one another --db", p.stderr)
            # The first server's job ran on, untouched.
            self.assertTrue(all(group_alive(pid) for pid in pids))
            got = srv.get("/v1/jobs/" + job["id"]).json()
            self.assertEqual(got["state"], "running", got["reason"])
            srv.post("/v1/jobs/%s:cancel" % job["id"])
            # Once the first has stopped, the database takes a new server.
            srv.stop()
            srv.start()
            self.assertEqual(srv.get("/v1/jobs/" + job["id"]).json()["state"], "cancelled")
        finally:
            srv.cleanup()

    def test_second_server_by_another_name_is_refused(self):
        """The lock is the file's: a symlink or a hard link to the database
        reaches the same lock, and the first server's ranks run on."""
        srv = Server()
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="slow-linked", steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            pids = [r["pid"] for r in srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]]
            db = os.path.join(srv.dir, "var", "ty.db")
            os.symlink(db, os.path.join(srv.dir, "sym.db"))
            os.link(db, os.path.join(srv.dir, "hard.db"))
            for name in ("sym.db", "hard.db", "./var/../var/ty.db"):
                args = srv.args()
                args[args.index("--listen") + 1] = "127.0.0.1:%d" % free_port()
                args[args.index("--db") + 1] = name
                p = subprocess.run(args, cwd=srv.dir, capture_output=True, text=True, timeout=30)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("in use by another trainyardd (pid %d, " % srv.proc.pid, p.stderr)
            self.assertTrue(all(group_alive(pid) for pid in pids))
            self.assertEqual(srv.get("/v1/jobs/" + job["id"]).json()["state"], "running")
            srv.post("/v1/jobs/%s:cancel" % job["id"])
        finally:
            srv.cleanup()

    def test_database_replaced_under_the_server(self):
        srv = Server()
        try:
            srv.start()
            db = os.path.join(srv.dir, "var", "ty.db")
            os.rename(db, db + ".moved")
            deadline = time.time() + 10
            r = None
            while time.time() < deadline:
                r = srv.get("/healthz")
                if r.status_code == 503:
                    break
                time.sleep(0.1)
            self.assertEqual(r.status_code, 503, r.text)
            self.assertIn("was deleted while this server ran", r.json()["error"]["message"])
            r = srv.post("/v1/jobs", srv.spec(name="refused"))
            self.assertEqual(r.status_code, 503, r.text)
            self.assertIn("deleted", r.json()["error"]["message"])
            # Put back, the server is healthy again.
            os.rename(db + ".moved", db)
            deadline = time.time() + 10
            while time.time() < deadline and srv.get("/healthz").status_code != 200:
                time.sleep(0.1)
            self.assertEqual(srv.get("/healthz").status_code, 200)
            self.assertEqual(srv.post("/v1/jobs", srv.spec(name="taken", steps=2)).status_code,
                             201)
        finally:
            srv.cleanup()

    def test_damaged_database_is_refused_at_start(self):
        srv = Server()
        try:
            srv.start()
            for i in range(40):
                srv.post("/v1/jobs", srv.spec(name="fill%d" % i, steps=1, world_size=1,
                                              model_path="models/tiny" + "/." * 200))
            srv.stop()
            db = os.path.join(srv.dir, "var", "ty.db")
            self.assertGreater(os.path.getsize(db), 4 * 4096)
            with open(db, "r+b") as f:
                f.seek(2 * 4096)
                f.write(bytes((i * 7 + 13) % 256 for i in range(4096)))
            p = subprocess.run(srv.args(), cwd=srv.dir, capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("is damaged (PRAGMA quick_check: ", p.stderr)
            self.assertIn("restore it from a backup", p.stderr)
        finally:
            srv.log.close()
            shutil.rmtree(srv.dir, ignore_errors=True)

    def test_logs_follow_rides_out_a_restart(self):
        srv = Server()
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="slow-followed", steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            env = dict(os.environ, TRAINYARD_SERVER=srv.url)
            env.pop("TRAINYARD_TOKEN", None)
            follow = subprocess.Popen([os.path.join(BIN, "cli", "trainyard"), "logs", job["id"],
                                       "--follow"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            time.sleep(1)
            srv.stop()  # a clean shutdown: the ranks are stopped, the job fails
            time.sleep(1.5)
            srv.start()
            out, err = follow.communicate(timeout=60)
            self.assertEqual(follow.returncode, 0, err)
            self.assertIn("trying again", err)
            whole = srv.get("/v1/jobs/%s/ranks/0/log" % job["id"]).text
            self.assertEqual(out, whole)
            self.assertIn("trainyardd shut down", srv.get("/v1/jobs/" + job["id"]).json()["reason"])
        finally:
            srv.cleanup()

    def test_clean_shutdown_stops_ranks(self):
        srv = Server()
        try:
            srv.start()
            job = srv.post("/v1/jobs", srv.spec(name="slow-shutdown", steps=300)).json()
            srv.wait_state(job["id"], ["running"])
            pids = [r["pid"] for r in srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]]
            self.assertEqual(srv.stop(signal.SIGTERM), 0)
            self.assertFalse([p for p in pids if group_alive(p)])
            srv.start()
            j = srv.get("/v1/jobs/" + job["id"]).json()
            self.assertEqual(j["state"], "failed")
            self.assertIn("trainyardd shut down while attempt 1 ran", j["reason"])
        finally:
            srv.cleanup()



class UnfinishedCheckpoint(unittest.TestCase):
    def test_last_attempt_killed_leaves_no_partial(self):
        # A rank killed while writing a checkpoint leaves checkpoints/
        # step-N.tmp (a .partial inside). A next attempt's ranks remove it;
        # after the last attempt trainyardd does, when the attempt ends
        # (found by the chaos soak: only a restart of trainyardd did).
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/base", 2)
            spec = srv.spec(name="tmpck", model_path="models/base", world_size=2, steps=100000,
                            max_restarts=0, data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 100000, "micro_batch_size": 1,
                                   "checkpoint_every": 100000})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            jid = r.json()["id"]
            srv.wait_state(jid, ["running"], timeout=60)
            deadline = time.time() + 60
            while time.time() < deadline:  # the ranks are past their start-up
                ranks = srv.get("/v1/jobs/%s/ranks" % jid).json()["ranks"]
                if all(k.get("phase") == "training" for k in ranks):
                    break
                time.sleep(0.1)
            half = os.path.join(srv.dir, "runs", "tmpck", "checkpoints", "step-00000099.tmp")
            os.makedirs(half)
            with open(os.path.join(half, "state-rank0.safetensors.partial"), "wb") as f:
                f.write(b"half")
            os.kill(ranks[0]["pid"], signal.SIGKILL)
            job = srv.wait_state(jid, ["failed"], timeout=60)
            self.assertIn("killed by signal 9", job["reason"])
            # The job is failed at once; the attempt ends once rank 1 has
            # stopped too (SIGTERM, SIGKILL after --grace).
            deadline = time.time() + 20
            while os.path.exists(half) and time.time() < deadline:
                time.sleep(0.1)
            self.assertFalse(os.path.exists(half), os.listdir(os.path.dirname(half)))
        finally:
            srv.cleanup()

if __name__ == "__main__":
    unittest.main(verbosity=2)
