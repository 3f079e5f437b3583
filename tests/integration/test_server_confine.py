"""test_server_confine.py - a job's files stay inside trainyardd's roots
even when a symbolic link is swapped in after the job was accepted.

A real trainyardd runs the real trainyard-worker. Jobs are submitted (and
accepted) while a long job holds every slot; then, before any of their
ranks starts, a link that leads outside the roots replaces the model
folder, one model file, the data file, the output folder, a parent of the
output folder, or output_dir/checkpoints. Each job must fail with a
reason naming the path and the root, and the folder outside must hold
exactly what it held before (nothing written, nothing deleted). Links
that stay inside the root keep working, and a link out that already
exists at submit is refused there. The suite runs twice: with openat2
and with the O_NOFOLLOW walk (TRAINYARD_BENEATH_WALK=1)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

TRAINYARD = os.path.join(BIN, "cli", "trainyard")


def mkmodel(out, cwd):
    subprocess.run([TRAINYARD, "mkmodel", "--out", out, "--hidden-size", "32",
                    "--intermediate-size", "64", "--layers", "1", "--heads", "2",
                    "--kv-heads", "1", "--vocab-size", "256"], cwd=cwd, check=True,
                   capture_output=True)


def snapshot(top):
    """Every entry under top (links not followed): path -> (kind, size, mtime)."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            seen[os.path.relpath(p, top)] = (st.st_mode >> 12, st.st_size, st.st_mtime_ns)
    return seen


def relink(path, target):
    """Replaces path (a file, folder or link) with a symbolic link to target."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.symlink(target, path)


class Swaps(unittest.TestCase):
    ENV = {}

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(worker=None, env=cls.ENV,
                         extra=["--cpu-slots", "2", "--heartbeat-timeout", "120",
                                "--progress-timeout", "120"]).start()
        cls.root = os.path.realpath(cls.srv.dir)
        cls.out = tempfile.mkdtemp(prefix="ty-outside-")  # beside the roots, never in them
        d = cls.srv.dir
        for m in ("small", "m-folder", "m-file"):
            mkmodel("models/" + m, d)
        # Outside: a model, a data file, folders with an older checkpoint,
        # which a job following the links would load, read, write or delete.
        mkmodel(os.path.join(cls.out, "model"), d)
        with open(os.path.join(cls.out, "data.txt"), "w") as f:
            f.write("outside data\n" * 2048)
        for sub in ("out-d", "parent-e", "ck-f/step-00000001"):
            os.makedirs(os.path.join(cls.out, sub))
        with open(os.path.join(cls.out, "ck-f", "step-00000001", "state.json"), "w") as f:
            f.write("{}")
        shutil.copy(os.path.join(d, "train.txt"), os.path.join(d, "data-c.txt"))

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()
        shutil.rmtree(cls.out, ignore_errors=True)

    def spec(self, name, **over):
        base = dict(name=name, steps=8, world_size=1, model_path="models/small",
                    fsdp={"memory_efficient_load": True}, lora_rank=4,
                    data={"path": "train.txt", "seq_len": 16},
                    train={"steps": 8, "micro_batch_size": 2, "checkpoint_every": 4})
        base.update(over)
        return self.srv.spec(**base)

    def submit(self, spec):
        r = self.srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 201, r.text)
        return r.json()["id"]

    def refused(self, spec, field):
        r = self.srv.post("/v1/jobs", spec)
        self.assertEqual(r.status_code, 400, r.text)
        return {e["field"]: e["message"] for e in r.json()["error"]["details"]}[field]

    def test_swaps_after_submit_fail_the_job_and_touch_nothing_outside(self):
        srv, d, out = self.srv, self.srv.dir, self.out
        # The long job holds both slots, so the others wait, accepted.
        blocker = self.submit(self.spec("blocker", world_size=2,
                                        train={"steps": 100000, "micro_batch_size": 2,
                                               "checkpoint_every": 0}))
        srv.wait_state(blocker, ["running"], timeout=60)
        jobs = {
            "model folder": self.submit(self.spec("a", model_path="models/m-folder")),
            "model file": self.submit(self.spec("b", model_path="models/m-file")),
            "data file": self.submit(self.spec("c", data={"path": "data-c.txt", "seq_len": 16})),
            "output folder": self.submit(self.spec("d", output_dir="runs/d")),
            "output parent": self.submit(self.spec("e", output_dir="runs/e-parent/e")),
            "checkpoints": self.submit(self.spec("f", output_dir="runs/f")),
        }
        for name, job in jobs.items():
            self.assertEqual(srv.get("/v1/jobs/" + job).json()["state"], "queued", name)
        # Stored resolved: the ranks are handed no path that a link could redirect.
        spec = srv.get("/v1/jobs/" + jobs["output parent"]).json()["spec"]
        self.assertEqual(spec["output_dir"], os.path.join(self.root, "runs", "e-parent", "e"))
        self.assertEqual(spec["model_path"], os.path.join(self.root, "models", "small"))

        relink(os.path.join(d, "models", "m-folder"), os.path.join(out, "model"))
        relink(os.path.join(d, "models", "m-file", "model.safetensors"),
               os.path.join(out, "model", "model.safetensors"))
        relink(os.path.join(d, "data-c.txt"), os.path.join(out, "data.txt"))
        os.makedirs(os.path.join(d, "runs"), exist_ok=True)
        relink(os.path.join(d, "runs", "d"), os.path.join(out, "out-d"))
        relink(os.path.join(d, "runs", "e-parent"), os.path.join(out, "parent-e"))
        os.makedirs(os.path.join(d, "runs", "f"))
        # Relative, climbing out with '..' (an absolute link is refused the same way).
        os.symlink(os.path.relpath(os.path.join(out, "ck-f"), os.path.join(d, "runs", "f")),
                   os.path.join(d, "runs", "f", "checkpoints"))
        before = snapshot(out)

        self.assertEqual(srv.post("/v1/jobs/%s:cancel" % blocker).status_code, 200)
        where = {"model folder": "models/m-folder", "model file": "models/m-file/model.safetensors",
                 "data file": "data-c.txt", "output folder": "runs/d",
                 "output parent": "runs/e-parent", "checkpoints": "runs/f/checkpoints"}
        for name, job in jobs.items():
            j = srv.wait_state(job, ["succeeded", "failed"], timeout=120)
            self.assertEqual(j["state"], "failed", "%s: %s" % (name, j["reason"]))
            self.assertIn(os.path.join(self.root, where[name]), j["reason"], name)
            self.assertIn("leads outside the root %s" % self.root, j["reason"], name)
            link = os.path.join(self.root, where[name])
            self.assertIn("%s is a symbolic link to %s" % (link, os.readlink(link)), j["reason"])
        self.assertEqual(snapshot(out), before)
        self.assertFalse(os.path.exists(os.path.join(out, "out-d", "adapter_config.json")))

    def test_links_inside_the_root_keep_working(self):
        d = self.srv.dir
        linked = os.path.join(d, "models", "linked")
        os.makedirs(linked)
        for f in ("config.json", "model.safetensors"):
            os.symlink(os.path.join("..", "small", f), os.path.join(linked, f))
        os.symlink("train.txt", os.path.join(d, "data-alias.txt"))
        os.makedirs(os.path.join(d, "runs", "in"))
        os.makedirs(os.path.join(d, "runs", "in-ck"))
        os.symlink("../in-ck", os.path.join(d, "runs", "in", "checkpoints"))
        job = self.submit(self.spec("in", model_path="models/linked", output_dir="runs/in",
                                    data={"path": "data-alias.txt", "seq_len": 16}))
        j = self.srv.wait_state(job, ["succeeded", "failed"], timeout=120)
        self.assertEqual(j["state"], "succeeded", j["reason"])
        self.assertTrue(os.path.exists(os.path.join(d, "runs", "in", "adapter_model.safetensors")))
        self.assertTrue(os.listdir(os.path.join(d, "runs", "in-ck")))  # the checkpoint went there

    def test_links_out_that_exist_at_submit_are_refused(self):
        d, out = self.srv.dir, self.out
        bad = os.path.join(d, "models", "bad-file")
        os.makedirs(bad)
        shutil.copy(os.path.join(d, "models", "small", "config.json"), bad)
        os.symlink(os.path.join(out, "model", "model.safetensors"),
                   os.path.join(bad, "model.safetensors"))
        msg = self.refused(self.spec("g", model_path="models/bad-file"), "model_path")
        self.assertIn(os.path.join(os.path.realpath(bad), "model.safetensors"), msg)
        self.assertIn("leads outside the root %s" % self.root, msg)
        os.makedirs(os.path.join(d, "runs", "h"))
        os.symlink(os.path.join(out, "ck-f"), os.path.join(d, "runs", "h", "checkpoints"))
        msg = self.refused(self.spec("h", output_dir="runs/h"), "output_dir")
        self.assertIn(os.path.join(self.root, "runs", "h", "checkpoints"), msg)
        # A link to a whole folder outside: refused as before, naming where it leads.
        os.symlink(os.path.join(out, "model"), os.path.join(d, "models", "out-link"))
        msg = self.refused(self.spec("k", model_path="models/out-link"), "model_path")
        self.assertIn("outside the server's allowed roots", msg)


class SwapsWalk(Swaps):
    """The same, with the O_NOFOLLOW walk that stands in where the kernel has
    no openat2, in trainyardd and (passed on) in its ranks."""
    ENV = {"TRAINYARD_BENEATH_WALK": "1"}


if __name__ == "__main__":
    unittest.main()
