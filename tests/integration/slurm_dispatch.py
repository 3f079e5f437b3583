"""slurm_dispatch.py - trainyardd --dispatcher slurm on the two-node test
cluster of deploy/slurm-cluster.sh (started here, and stopped whatever
happens), with the real trainyard-worker:
  - a 2-node x 1-rank LoRA job succeeds; squeue shows it on both nodes
    while it runs, the job completion log has it COMPLETED afterwards, and
    its losses are bit for bit those of the same job as 2 local ranks
    (`trainyard train`, shm);
  - the attempt's batch script is kept in its folder;
  - its ranks meet over Gloo through trainyardd's rendezvous keys
    (gloo:http:...); a cancel ends it in Slurm with no rank left;
  - a rank killed with SIGKILL fails the attempt; the restart resumes from
    the checkpoint;
  - trainyardd killed with SIGKILL and started again watches the batch job
    it left running to its end (no new attempt);
  - SIGTERM to a rank: the ranks checkpoint together and stop, the attempt
    is resubmitted and resumes, not counted against max_restarts;
  - each rank's log is capped at trainyardd's --log_max, as locally.
Skips (77), saying why, when not root or when Slurm is not installed."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "..", "..", "deploy", "slurm-cluster.sh")
TY = os.path.join(BIN, "cli", "trainyard")


def skip_reason():
    if os.geteuid() != 0:
        return "the test cluster needs root (slurmd starts job steps as their user)"
    for b in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel"):
        if not shutil.which(b):
            return "%s not installed (deploy/install-deps.sh test installs Slurm and munge)" % b
    return None


def rank_pids(job_id):
    """Processes on this machine whose environment names the job (its ranks,
    not the process each runs for its log, named trainyard-log)."""
    found = []
    mark = ("TRAINYARD_JOB_ID=%s" % job_id).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
            with open("/proc/%s/comm" % pid, "rb") as f:
                if f.read().strip() == b"trainyard-log":
                    continue
        except OSError:
            continue
        if mark in env and cmd.split(b"\0")[0].endswith(b"trainyard-worker"):
            procid = [e for e in env if e.startswith(b"SLURM_PROCID=")]
            found.append((int(pid), int(procid[0].split(b"=")[1]) if procid else -1))
    return found


class SlurmDispatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ty-slurm-")
        cls.cluster = os.path.join(cls.tmp, "cluster")
        cls.srv = None
        try:
            subprocess.run(["bash", CLUSTER, "start", cls.cluster], check=True,
                           capture_output=True, timeout=120)
            cls.env = dict(os.environ, SLURM_CONF=os.path.join(cls.cluster, "slurm.conf"))
            os.environ["SLURM_CONF"] = cls.env["SLURM_CONF"]
            cls.srv = Server(worker=None, env={"SLURM_CONF": cls.env["SLURM_CONF"]},
                             extra=["--dispatcher", "slurm", "--slurm_poll", "0.2",
                                    "--slurm_time", "10", "--grace", "5",
                                    "--heartbeat-timeout", "120",
                                    "--progress-timeout", "120"]).start()
            d = cls.srv.dir
            subprocess.run([TY, "mkmodel", "--out", "models/small", "--hidden-size", "48",
                            "--intermediate-size", "80", "--layers", "2", "--heads", "4",
                            "--kv-heads", "2", "--vocab-size", "256", "--seed", "3"],
                           cwd=d, check=True, capture_output=True)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            if cls.srv:
                cls.srv.cleanup()
        finally:
            subprocess.run(["bash", CLUSTER, "stop", cls.cluster], capture_output=True,
                           timeout=120)
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def spec(self, name, steps, **over):
        s = {"name": name, "model_path": "models/small", "device": "cpu",
             "world_size": 2, "resources": {"nodes": 2, "ranks_per_node": 1},
             "use_lora": True, "lora_rank": 4, "target_modules": "all-linear",
             "fsdp": {"memory_efficient_load": True},
             "data": {"path": "train.txt", "seq_len": 16},
             "train": {"steps": steps, "micro_batch_size": 2, "lr": 1e-2, "warmup_steps": 2},
             "output_dir": "runs/" + name}
        s.update(over)
        return s

    def submit(self, spec):
        r = self.srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 201, r.text)
        return r.json()["id"]

    def slurm_job(self, job_id, attempt):
        """The Slurm job id of an attempt, from the ranks' recorded pid."""
        with open(os.path.join(self.srv.dir, "var", "jobs", job_id, "attempt-%d" % attempt,
                               "sbatch.sh")) as f:
            text = f.read()
        self.assertIn("srun --kill-on-bad-exit=1", text)
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
        return ranks[0]["pid"]

    def wait_step(self, job_id, step, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
            if ranks and all((r["step"] or 0) >= step for r in ranks):
                return ranks
            job = self.srv.get("/v1/jobs/" + job_id).json()
            self.assertNotIn(job["state"], ["failed", "cancelled", "succeeded"], job["reason"])
            time.sleep(0.1)
        self.fail("job %s did not reach step %d; log:\n%s" % (job_id, step, self.srv.read_log()))

    def test_two_nodes_lora_equals_local(self):
        job_id = self.submit(self.spec("two-nodes", 6))
        # While it runs, Slurm has it on both nodes.
        deadline, nodes = time.time() + 120, ""
        while time.time() < deadline:
            out = subprocess.run(["squeue", "-h", "-o", "%j %T %N"], capture_output=True,
                                 text=True, env=self.env).stdout
            m = re.search(r"trainyard-two-nodes-%s RUNNING (\S+)" % job_id, out)
            if m:
                nodes = m.group(1)
                break
            if self.srv.get("/v1/jobs/" + job_id).json()["state"] in ("succeeded", "failed"):
                break
            time.sleep(0.05)
        self.assertEqual(nodes, "n[1-2]")
        job = self.srv.wait_state(job_id, ["succeeded", "failed"], timeout=180)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        slurm_id = self.slurm_job(job_id, 1)
        with open(os.path.join(self.cluster, "log", "jobcomp.log")) as f:
            comp = [l for l in f if "JobId=%d " % slurm_id in l]
        self.assertTrue(comp, "Slurm job %d not in the completion log" % slurm_id)
        self.assertIn("JobState=COMPLETED", comp[0])
        self.assertIn("NodeList=n[1-2]", comp[0])
        # Each rank said which node it ran on (its log) and the rank's
        # output is where trainyard serves it.
        log1 = self.srv.get("/v1/jobs/%s/ranks/1/log" % job_id).text
        self.assertIn("[rank 1/2] train step 6/6", log1)
        # Memory-efficient loading on each node: each rank read only its
        # shard's byte ranges of the shared checkpoint, together the file's
        # tensor data once, and placed only its shard.
        st = os.path.join(self.srv.dir, "models", "small", "model.safetensors")
        with open(st, "rb") as f:
            header = struct.unpack("<Q", f.read(8))[0]
        data = os.path.getsize(st) - 8 - header
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
        self.assertEqual(len(ranks), 2)
        self.assertEqual(sum(r["bytes_loaded"] for r in ranks), data, ranks)
        for r in ranks:
            self.assertEqual(r["bytes_loaded"], r["bytes_total"], r)
            self.assertLess(r["bytes_loaded"], data, r)
            self.assertLess(r["device_peak_bytes"], data, r)
        losses = self.srv.get("/v1/jobs/%s/metrics" % job_id).json()["ranks"][0]["loss"]
        self.assertEqual(len(losses), 6)
        # The same job as 2 local ranks over shm: the same losses, bit for bit.
        spec = self.spec("local", 6, resources={"nodes": 1}, output_dir="runs/local-cli")
        path = os.path.join(self.srv.dir, "local.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        out = subprocess.run([TY, "train", path, "--json"], cwd=self.srv.dir,
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        local = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        local = [r["loss"] for r in local
                 if r["rank"] == 0 and r["phase"] == "training" and r["loss"] is not None]
        self.assertEqual(local, losses)

    def test_cancel_leaves_no_rank(self):
        job_id = self.submit(self.spec("cancel-me", 100000))
        self.wait_step(job_id, 1)
        self.assertEqual(sorted(p for _, p in rank_pids(job_id)), [0, 1])
        # They met through this server's rendezvous keys, no shared folder.
        with open("/proc/%d/environ" % rank_pids(job_id)[0][0], "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        self.assertEqual(env[b"TRAINYARD_RENDEZVOUS"].decode(),
                         "gloo:http:%s/v1/jobs/%s/attempts/1/rendezvous" % (self.srv.url, job_id))
        slurm_id = self.slurm_job(job_id, 1)
        r = self.srv.post("/v1/jobs/%s:cancel" % job_id)
        self.assertEqual(r.status_code, 200, r.text)
        self.srv.wait_state(job_id, ["cancelled"])
        self.wait_gone(job_id, slurm_id)
        # trainyardd saw the batch job end: its ranks stopped.
        deadline = time.time() + 30
        while time.time() < deadline:
            ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
            if all(r["state"] != "running" for r in ranks):
                break
            time.sleep(0.1)
        self.assertEqual([r["state"] for r in ranks], ["stopped", "stopped"], ranks)

    def wait_gone(self, job_id, slurm_id):
        """Waits (60 s) until no rank of the job runs here and Slurm no
        longer queues its batch job; asserts no rank is left."""
        deadline = time.time() + 60
        while time.time() < deadline and (rank_pids(job_id) or subprocess.run(
                ["squeue", "-h", "-j", str(slurm_id)], capture_output=True, text=True,
                env=self.env).stdout.strip()):
            time.sleep(0.2)
        self.assertEqual(rank_pids(job_id), [])

    def signal_rank(self, job_id, rank, sig):
        """sig to the job's rank `rank` (its process on this machine)."""
        victims = [pid for pid, procid in rank_pids(job_id) if procid == rank]
        self.assertEqual(len(victims), 1)
        os.kill(victims[0], sig)

    def resumed_step(self, job_id):
        """The checkpoint step rank 0 of the job's last attempt resumed from."""
        log = self.srv.get("/v1/jobs/%s/ranks/0/log" % job_id).text
        m = re.search(r"resumed from the checkpoint of step (\d+)", log)
        self.assertTrue(m, log[-2000:])
        return int(m.group(1))

    def test_killed_rank_restarts_from_checkpoint(self):
        job_id = self.submit(self.spec("kill-rank", 60, max_restarts=1,
                                       train={"steps": 60, "micro_batch_size": 2, "lr": 1e-2,
                                              "checkpoint_every": 2}))
        self.wait_step(job_id, 5)
        self.signal_rank(job_id, 1, signal.SIGKILL)
        job = self.srv.wait_state(job_id, ["succeeded", "failed"], timeout=300)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 2)
        self.assertGreaterEqual(self.resumed_step(job_id), 2)

    def test_sigterm_preempts_and_resumes(self):
        # SIGTERM to one rank (as a preemption or Slurm's --signal sends
        # it): the ranks agree at the step boundary, write a checkpoint
        # together and stop; the attempt is resubmitted and resumes from it,
        # and with max_restarts 0 that is no restart.
        job_id = self.submit(self.spec("preempt", 60, max_restarts=0))
        self.wait_step(job_id, 4)
        self.signal_rank(job_id, 1, signal.SIGTERM)
        job = self.srv.wait_state(job_id, ["succeeded", "failed"], timeout=300)
        self.assertEqual(job["state"], "succeeded", job["reason"])
        self.assertEqual(job["attempt"], 2)
        first = self.srv.get("/v1/jobs/%s/ranks?attempt=1" % job_id).json()["ranks"]
        self.assertEqual([r["state"] for r in first], ["stopped", "stopped"], first)
        stopped_at = min(r["step"] for r in first)
        resumed = self.resumed_step(job_id)
        self.assertGreaterEqual(resumed, 4)
        self.assertGreaterEqual(resumed, stopped_at)

    def test_rank_logs_are_capped(self):
        # A trainyardd whose ranks may keep 4 KiB of output each: under
        # Slurm each rank appends its own output to its log (srun's file
        # would grow without bound), keeping the first 4 KiB and a note,
        # as the local dispatcher's logs do; the job is unharmed.
        srv = Server(worker=None, env={"SLURM_CONF": self.env["SLURM_CONF"]},
                     extra=["--dispatcher", "slurm", "--slurm_poll", "0.2", "--slurm_time", "10",
                            "--log-max", "4096", "--heartbeat-timeout", "120",
                            "--progress-timeout", "120"]).start()
        try:
            shutil.copytree(os.path.join(self.srv.dir, "models"), os.path.join(srv.dir, "models"),
                            dirs_exist_ok=True)
            r = srv.post("/v1/jobs", self.spec("capped", 120))
            self.assertEqual(r.status_code, 201, r.text)
            job_id = r.json()["id"]
            job = srv.wait_state(job_id, ["succeeded", "failed"], timeout=240)
            self.assertEqual(job["state"], "succeeded", job["reason"])
            for rank in (0, 1):
                log = srv.get("/v1/jobs/%s/ranks/%d/log" % (job_id, rank)).content
                note = b"\n[trainyard-worker: log capped at 4096 bytes; later output dropped]\n"
                self.assertTrue(log.endswith(note), log[-300:])
                self.assertLessEqual(len(log), 4096 + len(note))
                self.assertIn(b"[rank %d/2] train step 1/120" % rank, log)
                self.assertNotIn(b"train step 120/120", log)
        finally:
            srv.cleanup()

    def test_restart_reattaches(self):
        # trainyardd killed with SIGKILL while the batch job runs: the
        # ranks keep running in the cluster, and the next trainyardd
        # watches them again (same attempt): it hears their steps move on
        # and controls them (a cancel ends the batch job). The job is long
        # enough that it cannot end while no server listens, however fast
        # the machine.
        job_id = self.submit(self.spec("reattach", 1000000))
        self.wait_step(job_id, 2)
        pids = sorted(rank_pids(job_id))
        self.srv.proc.send_signal(signal.SIGKILL)
        self.srv.proc.wait(timeout=20)
        time.sleep(1)
        self.assertEqual(sorted(rank_pids(job_id)), pids)  # untouched
        port = self.srv.port
        self.srv.start()
        self.assertEqual(self.srv.port, port)  # where the ranks report
        self.assertIn("still runs (slurm", self.srv.read_log())
        job = self.srv.get("/v1/jobs/" + job_id).json()
        self.assertEqual(job["state"], "running", job["reason"])
        self.assertEqual(job["attempt"], 1)
        # Reports reach the new server: the steps move on past the kill.
        ranks = self.srv.get("/v1/jobs/%s/ranks" % job_id).json()["ranks"]
        seen = max(r["step"] or 0 for r in ranks)
        self.wait_step(job_id, seen + 3)
        self.assertEqual(sorted(rank_pids(job_id)), pids)  # the same ranks
        slurm_id = self.slurm_job(job_id, 1)
        r = self.srv.post("/v1/jobs/%s:cancel" % job_id)
        self.assertEqual(r.status_code, 200, r.text)
        job = self.srv.wait_state(job_id, ["cancelled"], timeout=120)
        self.assertEqual(job["attempt"], 1)
        self.wait_gone(job_id, slurm_id)


if __name__ == "__main__":
    why = skip_reason()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
    unittest.main(verbosity=2)
