"""test_server_dispatch.py - trainyardd's scheduler and dispatcher with real
rank processes (ty_test_worker following the worker contract): success,
rank failures and crashes with their reasons and no orphans, the watchdog,
cancel of queued and running jobs, max_restarts, FIFO slots, capped logs,
one run at a time in an output folder, deleting jobs that have ended."""
import fcntl
import json
import os
import re
import signal
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server, group_alive  # noqa: E402


class Dispatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server().start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def run_job(self, name, states, steps=10, world_size=2, **over):
        r = self.srv.post("/v1/jobs", self.srv.spec(name=name, steps=steps, world_size=world_size,
                                                    **over))
        self.assertEqual(r.status_code, 201, r.text)
        return self.srv.wait_state(r.json()["id"], states, timeout=30)

    def rank_pids(self, job_id):
        return [r["pid"] for r in self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
                if r["pid"]]

    def assert_no_orphans(self, job_id):
        pids = self.rank_pids(job_id)
        self.assertTrue(pids)
        deadline = time.time() + 5
        while time.time() < deadline and any(group_alive(p) for p in pids):
            time.sleep(0.05)
        self.assertFalse([p for p in pids if group_alive(p)], "rank process groups still alive")

    def test_local_dispatcher_refuses_nodes(self):
        # Rule nodes-dispatcher: this server runs every rank on its host.
        srv = self.srv
        r = srv.post("/v1/jobs", srv.spec(name="two-nodes", steps=3, world_size=2,
                                           resources={"nodes": 2, "ranks_per_node": 1}))
        self.assertEqual(r.status_code, 400, r.text)
        fields = {d["field"]: d["message"] for d in r.json()["error"]["details"]}
        self.assertIn("local dispatcher runs every rank on one host", fields["resources.nodes"])
        self.assertIn("--dispatcher slurm", fields["resources.nodes"])
        # One node of two ranks is this server's to run.
        job = self.run_job("one-node", ["succeeded", "failed"], steps=3, world_size=2,
                           resources={"nodes": 1})
        self.assertEqual(job["state"], "succeeded", job["reason"])
        spec = srv.get("/v1/jobs/" + job["id"]).json()["spec"]
        self.assertEqual(spec["resources"], {"nodes": 1, "ranks_per_node": 2})

    def test_success_two_ranks(self):
        job = self.run_job("ok", ["succeeded", "failed"], steps=12)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 1)
        for rank in (0, 1):
            with open(os.path.join(self.srv.dir, "runs", "ok", "rank%d.done" % rank)) as f:
                self.assertIn("rendezvous shm:ty-%s-1" % job["id"], f.read())
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]
        self.assertEqual([r["state"] for r in ranks], ["exited", "exited"])
        self.assertEqual([r["phase"] for r in ranks], ["done", "done"])
        self.assertEqual([r["exit_code"] for r in ranks], [0, 0])
        self.assertTrue(all(r["host_peak_bytes"] > 0 for r in ranks))
        log = self.srv.get("/v1/jobs/%s/ranks/1/log" % job["id"]).text
        self.assertIn("[rank 1/2] train step 12/12 loss", log)
        self.assertIn("[rank 1/2] load", log)

    def test_rank_failure_stops_the_others_with_the_reason(self):
        job = self.run_job("fail1at3-slow", ["failed"], steps=50)
        self.assertEqual(job["reason"], "rank 1 failed: injected failure at step 3")
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]
        self.assertEqual(ranks[1]["state"], "failed")
        self.assertEqual(ranks[1]["exit_code"], 3)
        self.assert_no_orphans(job["id"])
        # The job's state is written first; the stopped rank is recorded when
        # it has been reaped.
        deadline = time.time() + 5
        while time.time() < deadline:
            ranks = self.srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]
            if ranks[0]["state"] != "running":
                break
            time.sleep(0.05)
        self.assertEqual(ranks[0]["state"], "stopped")

    def test_failed_attempt_leaves_no_shared_memory(self):
        # A rank that dies before every rank has joined the rendezvous leaves
        # the job's segment behind; the server removes it when the attempt ends.
        r = self.srv.post("/v1/jobs", self.srv.spec(name="fail1at3-slow", steps=50))
        self.assertEqual(r.status_code, 201, r.text)
        job_id = r.json()["id"]
        seg = "/dev/shm/trainyard-ty-%s-1" % job_id
        with open(seg, "wb") as f:
            f.write(b"\0" * 4096)
        job = self.srv.wait_state(job_id, ["failed"], timeout=30)
        self.assertEqual(job["state"], "failed")
        deadline = time.time() + 5
        while time.time() < deadline and os.path.exists(seg):
            time.sleep(0.05)
        self.assertFalse(os.path.exists(seg), "the attempt's shm segment was left behind")

    def test_rank_crash(self):
        job = self.run_job("crash0at2-child-slow", ["failed"], steps=50)
        self.assertIn("rank 0 was killed by signal 6", job["reason"])
        # The crashed rank's child and the other rank (and its child) are gone.
        self.assert_no_orphans(job["id"])

    def test_watchdog_catches_a_stuck_step(self):
        job = self.run_job("hang1at2", ["failed"], steps=20)
        self.assertIn("rank 1 made no progress", job["reason"])
        self.assertIn("step 1", job["reason"])
        self.assert_no_orphans(job["id"])

    def test_heartbeat_timeout(self):
        job = self.run_job("silent0", ["failed"], steps=5, world_size=1)
        self.assertIn("rank 0 sent no report", job["reason"])
        self.assert_no_orphans(job["id"])

    def test_a_step_longer_than_the_heartbeat_timeout(self):
        # A 3 s step, silent but for the reporter's heartbeat, outlasts a
        # 1 s heartbeat_timeout (well within the progress timeout); before
        # the heartbeat the rank was failed as silent. Its reports count
        # the repeats.
        srv = Server(extra=["--heartbeat-timeout", "1", "--progress-timeout", "20"]).start()
        try:
            r = srv.post("/v1/jobs", srv.spec(name="step3000", steps=1, world_size=1))
            self.assertEqual(r.status_code, 201, r.text)
            job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=30)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            rank = srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"][0]
            # starting, 4 loading, 1 step, saving, done: 8 reports, and the
            # repeats (one each 0.25 s of the step).
            self.assertGreaterEqual(rank["reports"], 8 + 5, rank)
        finally:
            srv.cleanup()

    def test_a_rank_stuck_in_a_step_fails_by_progress(self):
        # The heartbeat says the rank lives, not that it moves: a step that
        # never ends fails at progress_timeout, naming where it stopped.
        job = self.run_job("step600000", ["failed"], steps=2, world_size=1)
        self.assertIn("rank 0 made no progress", job["reason"])
        self.assertIn("phase loading", job["reason"])
        self.assert_no_orphans(job["id"])

    def test_cancel_running_frees_slots_even_when_sigterm_is_ignored(self):
        r = self.srv.post("/v1/jobs", self.srv.spec(name="ignoreterm-child-slow", steps=200,
                                                    world_size=4))
        job_id = r.json()["id"]
        self.srv.wait_state(job_id, ["running"])
        behind = self.srv.post("/v1/jobs", self.srv.spec(name="behind", steps=2,
                                                         world_size=4)).json()
        time.sleep(0.3)
        self.assertEqual(self.srv.get("/v1/jobs/" + behind["id"]).json()["state"], "queued")
        t0 = time.time()
        r = self.srv.post("/v1/jobs/%s:cancel" % job_id)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["state"], "cancelled")
        self.assert_no_orphans(job_id)
        # SIGKILL came after the 0.5 s grace period, not at once.
        self.assertGreater(time.time() - t0, 0.4)
        done = self.srv.wait_state(behind["id"], ["succeeded"])
        self.assertEqual(done["attempt"], 1)
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
        self.assertEqual({r["state"] for r in ranks}, {"stopped"})
        self.assertEqual({r["exit_code"] for r in ranks}, {128 + 9})
        # The stream goes on past the final state until every rank's end is
        # recorded.
        text = self.srv.get("/v1/jobs/%s/events" % job_id, timeout=20).text
        tail = text[text.index('"to":"cancelled"'):]
        self.assertEqual(tail.count("event: rank"), 4)
        self.assertEqual(tail.count('"state":"stopped"'), 4)

    def test_max_restarts_retries(self):
        job = self.run_job("flaky", ["succeeded", "failed"], steps=5, max_restarts=1)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 2)
        events = self.srv.get("/v1/jobs/%s/events" % job["id"], timeout=20).text
        self.assertIn("attempt 1 failed: rank 0 failed: injected failure at step 1; retrying "
                      "(restart 1 of 1)", events)
        first = self.srv.get("/v1/jobs/%s/ranks?attempt=1" % job["id"]).json()
        self.assertEqual(first["ranks"][0]["state"], "failed")

    def test_max_restarts_used_up(self):
        job = self.run_job("fail0at1", ["failed"], steps=5, world_size=1, max_restarts=2)
        self.assertEqual(job["attempt"], 3)
        self.assertIn("max_restarts 2 used up", job["reason"])

    def test_fifo_order(self):
        a = self.srv.post("/v1/jobs", self.srv.spec(name="fifo-a-slow", steps=8,
                                                    world_size=3)).json()
        b = self.srv.post("/v1/jobs", self.srv.spec(name="fifo-b", steps=2, world_size=2)).json()
        c = self.srv.post("/v1/jobs", self.srv.spec(name="fifo-c", steps=2, world_size=1)).json()
        jobs = [self.srv.wait_state(j["id"], ["succeeded"]) for j in (a, b, c)]
        # c fits beside a, but never overtakes b, which waits for a.
        self.assertGreaterEqual(jobs[1]["started_at"], jobs[0]["finished_at"][:19])
        self.assertGreaterEqual(jobs[2]["started_at"], jobs[1]["started_at"])


class RealWorker(unittest.TestCase):
    """The default rank program (trainyard-worker beside trainyardd in the
    build tree) trains a LoRA job to completion with its adapter on disk."""

    def test_lora_job_writes_the_adapter(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/small")
            spec = srv.spec(name="real-lora", steps=8, model_path="models/small",
                            fsdp={"memory_efficient_load": True}, lora_rank=4,
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 8, "micro_batch_size": 2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=120)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            out = os.path.join(srv.dir, "runs", "real-lora")
            self.assertTrue(os.path.exists(os.path.join(out, "adapter_config.json")))
            self.assertTrue(os.path.exists(os.path.join(out, "adapter_model.safetensors")))
            log = srv.get("/v1/jobs/%s/ranks/1/log" % job["id"]).text
            self.assertIn("[rank 1/2] train step 8/8", log)
            # Its reports reached the server (posted, or printed as JSON
            # lines that the log pump passes on): progress and the loss.
            ranks = srv.get("/v1/jobs/%s/ranks" % job["id"]).json()["ranks"]
            self.assertEqual([r["step"] for r in ranks], [8, 8])
            self.assertTrue(all(r["reports"] > 0 and r["host_peak_bytes"] > 0 for r in ranks))
            m = srv.get("/v1/jobs/%s/metrics" % job["id"]).json()
            self.assertEqual(m["ranks"][0]["steps"], list(range(1, 9)))
            self.assertIsNotNone(job["started_at"])
        finally:
            srv.cleanup()


    def test_gloo_job_meets_in_its_attempt_folder(self):
        # dist.backend gloo through trainyardd: the ranks meet over TCP,
        # exchanging addresses through files in the attempt's gloo folder.
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/small")
            spec = srv.spec(name="gloo", model_path="models/small", device="cpu",
                            lora_rank=4, dist={"backend": "gloo"},
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 4, "micro_batch_size": 2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=120)
            log = srv.get("/v1/jobs/%s/ranks/0/log" % job["id"]).text
            if job["state"] == "failed" and "built without" in job["reason"] + log:
                self.skipTest("this trainyard-worker was built without Gloo")
            self.assertEqual(job["state"], "succeeded", job["reason"])
            gloo = os.path.join(srv.dir, "var", "jobs", job["id"], "attempt-1", "gloo")
            self.assertTrue(os.path.isdir(gloo), os.listdir(os.path.dirname(gloo)))
        finally:
            srv.cleanup()

    def test_sigterm_preempts_and_resumes(self):
        # SIGTERM to one local rank: the ranks stop together at the step
        # boundary after a checkpoint (exit 75); the job is queued again and
        # its next attempt resumes there, which max_restarts 0 allows: a
        # preemption is no restart.
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"]).start()
        try:
            srv.mkmodel("models/small")
            spec = srv.spec(name="preempt", model_path="models/small", device="cpu",
                            lora_rank=4, max_restarts=0,
                            data={"path": "train.txt", "seq_len": 16},
                            train={"steps": 400, "micro_batch_size": 2})
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            job_id = r.json()["id"]
            deadline = time.time() + 60
            while time.time() < deadline:
                ranks = srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
                if all((k["step"] or 0) >= 3 for k in ranks):
                    break
                time.sleep(0.02)
            os.kill(ranks[1]["pid"], signal.SIGTERM)
            job = srv.wait_state(job_id, ["succeeded", "failed"], timeout=120)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            self.assertEqual(job["attempt"], 2)
            first = srv.get("/v1/jobs/%s/ranks?attempt=1" % job_id).json()["ranks"]
            self.assertEqual([k["state"] for k in first], ["stopped", "stopped"], first)
            self.assertEqual([k["exit_code"] for k in first], [75, 75])
            log = srv.get("/v1/jobs/%s/ranks/0/log" % job_id).text
            m = re.search(r"resumed from the checkpoint of step (\d+)", log)
            self.assertTrue(m, log[-2000:])
            self.assertGreaterEqual(int(m.group(1)), 3)
            self.assertLess(int(m.group(1)), 400)
        finally:
            srv.cleanup()


class Gpus(unittest.TestCase):
    """cuda jobs hold one GPU per rank (CUDA_VISIBLE_DEVICES) and meet
    through nccl:file:; no GPU is needed, the test worker only records."""

    def done(self, srv, name, rank):
        with open(os.path.join(srv.dir, "runs", name, "rank%d.done" % rank)) as f:
            return dict(line.split(" ", 1) for line in f.read().splitlines())

    def test_gpus_are_handed_out_one_per_rank(self):
        srv = Server(extra=["--gpus", "2"]).start()
        try:
            a = srv.post("/v1/jobs", srv.spec(name="gpu-a-slow", steps=8, world_size=1,
                                              device="cuda")).json()
            b = srv.post("/v1/jobs", srv.spec(name="gpu-b-slow", steps=8, world_size=1,
                                              device="cuda")).json()
            c = srv.post("/v1/jobs", srv.spec(name="gpu-c", steps=2, world_size=2,
                                              device="cuda")).json()
            self.assertEqual(a["device"], "cuda")
            for j in (a, b, c):
                self.assertIn("id", j, j)
                self.assertEqual(srv.wait_state(j["id"], ["succeeded", "failed"])["state"],
                                 "succeeded")
            self.assertEqual({self.done(srv, "gpu-a-slow", 0)["gpu"],
                              self.done(srv, "gpu-b-slow", 0)["gpu"]}, {"0", "1"})
            self.assertEqual([self.done(srv, "gpu-c", r)["gpu"] for r in (0, 1)], ["0", "1"])
            self.assertTrue(self.done(srv, "gpu-c", 0)["rendezvous"].startswith("nccl:file:"))
            r = srv.post("/v1/jobs", srv.spec(name="gpu-d", world_size=3, device="cuda"))
            self.assertEqual(r.status_code, 400)
        finally:
            srv.cleanup()


class OutputFolder(unittest.TestCase):
    """An attempt holds its output folder (flock) while its ranks run; a
    folder another run holds (a `trainyard train`) fails the attempt; a
    retry waits for the failed attempt's ranks to be gone."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(extra=["--cpu-slots", "4", "--grace", "1"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def test_folder_held_by_another_run_fails_the_attempt(self):
        out = os.path.join(self.srv.dir, "runs", "held")
        os.makedirs(out)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `trainyard train` does
        try:
            r = self.srv.post("/v1/jobs", self.srv.spec(name="held", steps=2, world_size=1))
            job = self.srv.wait_state(r.json()["id"], ["failed", "succeeded"])
            self.assertEqual(job["state"], "failed")
            self.assertIn("output_dir %s is in use by another trainyard run on this host" % out,
                          job["reason"])
            self.assertFalse(os.path.exists(os.path.join(out, "rank0.done")))
        finally:
            os.close(fd)
        r = self.srv.post("/v1/jobs", self.srv.spec(name="held", steps=2, world_size=1))
        job = self.srv.wait_state(r.json()["id"], ["failed", "succeeded"])
        self.assertEqual(job["state"], "succeeded", job["reason"])

    def test_a_running_job_holds_its_folder(self):
        r = self.srv.post("/v1/jobs", self.srv.spec(name="holds-slow", steps=100, world_size=1))
        job = self.srv.wait_state(r.json()["id"], ["running"])
        fd = os.open(os.path.join(self.srv.dir, "runs", "holds-slow"),
                     os.O_RDONLY | os.O_DIRECTORY)
        try:
            with self.assertRaises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.srv.post("/v1/jobs/%s:cancel" % job["id"])
            self.srv.wait_state(job["id"], ["cancelled"])
            deadline = time.time() + 10  # released once its ranks are reaped
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self.assertLess(time.time(), deadline, "the folder stayed locked")
                    time.sleep(0.05)
        finally:
            os.close(fd)

    def test_a_job_waits_for_a_cancelled_jobs_ranks_in_its_folder(self):
        # The cancelled job's rank ignores SIGTERM until SIGKILL (grace 1 s):
        # its attempt holds the folder meanwhile. A job submitted into that
        # folder at once (the cancelled job is final, so the folder is free
        # to take) waits queued until those ranks are gone, then runs; it
        # used to start at once and fail, the folder "in use by another
        # trainyard run".
        old = self.srv.post("/v1/jobs", {**self.srv.spec(name="old-ignoreterm", steps=100000,
                                                         world_size=1),
                                         "output_dir": "runs/shared"}).json()["id"]
        self.srv.wait_state(old, ["running"])
        self.srv.post("/v1/jobs/%s:cancel" % old)
        self.srv.wait_state(old, ["cancelled"])
        r = self.srv.post("/v1/jobs", {**self.srv.spec(name="after", steps=2, world_size=1),
                                       "output_dir": "runs/shared"})
        self.assertEqual(r.status_code, 201, r.text)
        job = self.srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=30)
        self.assertEqual(job["state"], "succeeded", job["reason"])

    def test_retry_waits_for_the_failed_attempts_ranks(self):
        # Rank 0 fails in attempt 1; rank 1 ignores SIGTERM until SIGKILL
        # (grace 1 s). Slots for both attempts are free, yet attempt 2 starts
        # only once attempt 1's ranks are gone, and so gets the folder.
        r = self.srv.post("/v1/jobs", self.srv.spec(name="flaky-ignoreterm", steps=200,
                                                    world_size=2, max_restarts=1))
        job = self.srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=40)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 2)
        text = self.srv.get("/v1/jobs/%s/events" % job["id"], timeout=20).text
        events = [json.loads(line[5:]) for line in text.splitlines()
                  if line.startswith("data:")]
        gone = max(e["t"] for e in events if e["type"] == "rank"
                   and e["data"].get("attempt") == 1)
        started = [e["t"] for e in events if e["type"] == "state"
                   and e["data"]["to"] == "starting" and e["data"]["attempt"] == 2]
        self.assertEqual(len(started), 1, events)
        self.assertGreaterEqual(started[0], gone)


class Delete(unittest.TestCase):
    """DELETE /v1/jobs/{id}: only a job that has ended, and only once its
    ranks are gone; then its rows and rank logs go, its output_dir and every
    other job stay, and its Idempotency-Key is free."""

    @classmethod
    def setUpClass(cls):
        # Ranks that ignore SIGTERM take the whole 3 s grace to stop.
        cls.srv = Server(extra=["--cpu-slots", "4", "--grace", "3"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def delete(self, job_id):
        return requests.delete(self.srv.url + "/v1/jobs/" + job_id, headers=self.srv.headers(),
                               timeout=10)

    def test_delete_only_what_has_ended(self):
        srv = self.srv
        keep = srv.post("/v1/jobs", srv.spec(name="keep", steps=3, world_size=1)).json()
        keep = srv.wait_state(keep["id"], ["succeeded"])
        key = {"Idempotency-Key": "del-key"}
        spec = srv.spec(name="del-slow-ignoreterm", steps=1000, world_size=2)
        r = srv.post("/v1/jobs", spec, headers=key)
        self.assertEqual(r.status_code, 201, r.text)
        job = srv.wait_state(r.json()["id"], ["running"])
        state_dir = os.path.join(srv.dir, "var", "jobs", job["id"])
        out = job["spec"]["output_dir"]
        self.assertTrue(os.path.isdir(state_dir))

        r = self.delete(job["id"])
        self.assertEqual(r.status_code, 412, r.text)
        self.assertEqual(r.json()["error"]["message"],
                         "job %s is running; only a job that has ended (succeeded, failed or "
                         "cancelled) can be deleted: cancel it first" % job["id"])
        self.assertEqual(srv.get("/v1/jobs/" + job["id"]).json()["state"], "running")

        self.assertEqual(srv.post("/v1/jobs/%s:cancel" % job["id"]).status_code, 200)
        r = self.delete(job["id"])  # its ranks ignore SIGTERM: 3 s until SIGKILL
        self.assertEqual(r.status_code, 503, r.text)
        self.assertIn("its ranks are still being stopped", r.json()["error"]["message"])
        self.assertEqual(srv.get("/v1/jobs/%s/ranks/0/log" % job["id"]).status_code, 200)

        deadline = time.time() + 20
        while r.status_code == 503 and time.time() < deadline:
            time.sleep(0.1)
            r = self.delete(job["id"])
        self.assertEqual(r.status_code, 200, r.text)
        gone = r.json()
        self.assertEqual((gone["id"], gone["state"]), (job["id"], "cancelled"))
        self.assertEqual(gone["idempotency_key"], "del-key")

        for path in ["", "/ranks", "/metrics", "/events", "/ranks/0/log"]:
            r = srv.get("/v1/jobs/" + job["id"] + path)
            self.assertEqual(r.status_code, 404, (path, r.text))
        self.assertNotIn(job["id"], [j["id"] for j in srv.get("/v1/jobs").json()["jobs"]])
        self.assertEqual(self.delete(job["id"]).status_code, 404)
        self.assertEqual(self.delete("j-nope").status_code, 404)
        self.assertFalse(os.path.exists(state_dir))
        self.assertTrue(os.path.isdir(out))  # the user's outputs stay
        # Every other job keeps its rows and logs.
        self.assertEqual(srv.get("/v1/jobs/" + keep["id"]).json()["state"], "succeeded")
        self.assertIn("train step 3/3", srv.get("/v1/jobs/%s/ranks/0/log" % keep["id"]).text)
        # The key names no job any more: the same submit makes a new one.
        again = srv.post("/v1/jobs", {**spec, "name": "del-again", "output_dir": "runs/again"},
                         headers=key)
        self.assertEqual(again.status_code, 201, again.text)
        self.assertNotEqual(again.json()["id"], job["id"])
        srv.wait_state(again.json()["id"], ["running"])
        srv.post("/v1/jobs/%s:cancel" % again.json()["id"])
        srv.wait_state(again.json()["id"], ["cancelled"])

    def test_delete_of_a_queued_job_is_refused(self):
        srv = self.srv
        r = srv.post("/v1/jobs", srv.spec(name="wide", steps=3, world_size=5))
        self.assertEqual(r.status_code, 400, r.text)  # 5 ranks never fit 4 slots
        holder = srv.post("/v1/jobs", srv.spec(name="hold-slow", steps=1000, world_size=4)).json()
        srv.wait_state(holder["id"], ["running"])
        queued = srv.post("/v1/jobs", srv.spec(name="waits", steps=3, world_size=1)).json()
        r = self.delete(queued["id"])
        self.assertEqual(r.status_code, 412, r.text)
        self.assertIn("is queued", r.json()["error"]["message"])
        self.assertEqual(srv.get("/v1/jobs/" + queued["id"]).json()["state"], "queued")
        srv.post("/v1/jobs/%s:cancel" % holder["id"])
        srv.wait_state(queued["id"], ["succeeded"])
        self.assertEqual(self.delete(queued["id"]).status_code, 200)


class LogCap(unittest.TestCase):
    def test_log_is_capped(self):
        srv = Server(extra=["--log-max", "8192"]).start()
        try:
            r = srv.post("/v1/jobs", srv.spec(name="chatty", steps=30, world_size=1))
            job = srv.wait_state(r.json()["id"], ["succeeded", "failed"])
            self.assertEqual(job["state"], "succeeded", job["reason"])
            log = srv.get("/v1/jobs/%s/ranks/0/log" % job["id"]).text
            self.assertLess(len(log), 8192 + 200)
            self.assertIn("log capped at 8192 bytes", log)
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
