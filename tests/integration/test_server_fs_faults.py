"""test_server_fs_faults.py - a rank whose disk fills or errs in the middle
of a job, swept over every file write, rename and folder creation of a
two-rank LoRA job with checkpoints (common/fsfault.h: the Nth operation of
each rank fails with ENOSPC, then EIO, alternating over N), through a real
trainyardd and the real worker. For every N until the job's operations are
all passed and it succeeds:
  - the job ends (failed, naming the error and the path; or succeeded),
    never stuck in a non-final state, and the server answers /healthz and
    lists the job all along;
  - no `.partial` file is left in its output folder, and nothing of it in
    /dev/shm;
then, with the disk healthy again, each failed job's output folder takes a
new job that resumes from the last complete checkpoint there (or starts
over where none was written) and succeeds."""
import glob
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server  # noqa: E402

MAX_N = 80  # a job of this size has fewer operations per rank (seen: about 40)


def shm_entries(job_id):
    """The job's segments in /dev/shm (named after its id; other servers on
    the machine have their own)."""
    return set(glob.glob("/dev/shm/trainyard-*%s*" % job_id))


class WorkerFsFaults(unittest.TestCase):
    def test_sweep_every_file_operation(self):
        srv = Server(worker=None, extra=["--heartbeat-timeout", "120",
                                         "--progress-timeout", "120"])
        ctl = os.path.join(srv.dir, "fsfault.ctl")
        with open(ctl, "w") as f:
            f.write("")
        srv.env["TY_TEST_FS_FAULTS"] = ctl
        srv.start()
        try:
            srv.mkmodel("models/m", 2)
            failed = []
            done_at = None
            for n in range(1, MAX_N + 1):
                kind = "ENOSPC" if n % 2 else "EIO"
                with open(ctl, "w") as f:
                    f.write("%d %s\n" % (n, kind))
                name = "f%02d" % n
                spec = srv.spec(name=name, model_path="models/m", lora_rank=4,
                                data={"path": "train.txt", "seq_len": 16},
                                train={"steps": 4, "micro_batch_size": 2,
                                       "checkpoint_every": 2})
                r = srv.post("/v1/jobs", spec)
                self.assertEqual(r.status_code, 201, r.text)
                jid = r.json()["id"]
                deadline = time.time() + 120
                job = None
                while time.time() < deadline:
                    self.assertEqual(srv.get("/healthz").status_code, 200)
                    job = srv.get("/v1/jobs/" + jid).json()
                    if job["state"] in ("succeeded", "failed"):
                        break
                    time.sleep(0.2)
                self.assertIn(job["state"], ("succeeded", "failed"),
                              "fault at operation %d: job stuck in %s" % (n, job["state"]))
                out = os.path.join(srv.dir, "runs", name)
                partial = glob.glob(os.path.join(out, "**", "*.partial"), recursive=True)
                self.assertEqual(partial, [], "fault at operation %d left %s" % (n, partial))
                self.assertEqual(shm_entries(jid), set(),
                                 "fault at operation %d left shared memory" % n)
                if job["state"] == "succeeded":
                    done_at = n
                    break
                # The job's reason is the first rank's to fail, which may be a
                # peer's "another rank failed"; the rank that met the fault
                # names it in its failure.
                why = job["reason"] or ""
                logs = [srv.get("/v1/jobs/%s/ranks/%d/log" % (jid, r)).text for r in (0, 1)]
                want = "No space left on device" if kind == "ENOSPC" else "Input/output error"
                failures = [l for t in logs for l in t.splitlines() if "failed" in l and want in l]
                self.assertTrue(want in why or failures,
                                "fault %d (%s): reason %r, logs %r" % (n, kind, why, logs))
                failed.append(name)
            self.assertIsNotNone(done_at, "the job still failed with a fault at operation %d"
                                 % MAX_N)
            self.assertGreater(len(failed), 5, "too few operations were swept: %d" % len(failed))
            ids = [j["id"] for j in srv.get("/v1/jobs?page_size=500").json()["jobs"]]
            self.assertEqual(len(ids), len(failed) + 1, "a job was lost")

            # The disk is healthy again: every failed job's folder takes a new
            # job, which resumes from the checkpoint there or starts over.
            with open(ctl, "w") as f:
                f.write("")
            resumed = 0
            for name in failed:
                spec = srv.spec(name=name + "-again", model_path="models/m", lora_rank=4,
                                data={"path": "train.txt", "seq_len": 16},
                                train={"steps": 4, "micro_batch_size": 2,
                                       "checkpoint_every": 2},
                                output_dir="runs/" + name)
                r = srv.post("/v1/jobs", spec)
                self.assertEqual(r.status_code, 201, r.text)
                job = srv.wait_state(r.json()["id"], ["succeeded", "failed"], timeout=120)
                self.assertEqual(job["state"], "succeeded", "%s again: %s" % (name, job["reason"]))
                out = os.path.join(srv.dir, "runs", name)
                self.assertTrue(os.path.exists(os.path.join(out, "adapter_model.safetensors")))
                log = srv.get("/v1/jobs/%s/ranks/0/log" % r.json()["id"]).text
                resumed += "resum" in log
            print("# %d operations swept before the job passed them all; %d of the failed "
                  "folders resumed from a checkpoint" % (done_at - 1, resumed))
            self.assertGreater(resumed, 0, "no job resumed from a checkpoint a failed one wrote")
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
