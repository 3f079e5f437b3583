"""test_server_cli.py - the trainyard client commands (submit, list, get,
watch, cancel, logs) against a real trainyardd, with --server/--token and
their environment variables."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server  # noqa: E402

TRAINYARD = os.path.join(BIN, "cli", "trainyard")
TOKEN = "cli-token"


class Cli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(tokens=TOKEN).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def ty(self, *args, env_token=True, expect=0):
        env = dict(os.environ)
        env["TRAINYARD_SERVER"] = self.srv.url
        if env_token:
            env["TRAINYARD_TOKEN"] = TOKEN
        else:
            env.pop("TRAINYARD_TOKEN", None)
        p = subprocess.run([TRAINYARD] + list(args), cwd=self.srv.dir, env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, expect, (args, p.stdout, p.stderr))
        return p

    def test_submit_watch_get_logs(self):
        spec = self.srv.write_spec("cli-ok", steps=8)
        job_id = self.ty("submit", spec, "--train.steps", "6").stdout.strip()
        self.assertTrue(job_id.startswith("j-"))
        w = self.ty("watch", job_id)
        self.assertIn("[rank 1/2] training", w.stdout)
        self.assertIn("6/6", w.stdout)
        self.assertIn("job %s succeeded" % job_id, w.stdout)
        job = json.loads(self.ty("get", job_id).stdout)
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["spec"]["train"]["steps"], 6)
        log = self.ty("logs", job_id, "--rank", "1").stdout
        self.assertIn("[rank 1/2] train step 6/6", log)
        self.ty("logs", job_id, "--rank", "7", expect=1)
        lst = self.ty("list", "--state", "succeeded").stdout
        self.assertIn(job_id, lst)
        self.assertIn("ID", lst.splitlines()[0])

    def test_watch_a_failing_job_exits_1(self):
        spec = self.srv.write_spec("fail0at2", steps=5)
        p = self.ty("submit", spec, "--watch", expect=1)
        self.assertIn("rank 0 failed: injected failure at step 2", p.stdout)

    def test_cancel_and_idempotency(self):
        spec = self.srv.write_spec("cli-slow-cancel", steps=400)
        a = self.ty("submit", spec, "--idempotency-key", "k1").stdout.strip()
        b = self.ty("submit", spec, "--idempotency-key", "k1").stdout.strip()
        self.assertEqual(a, b)
        c = self.ty("cancel", a, "--reason", "changed my mind").stdout
        self.assertIn("cancelled", c)
        self.assertIn("changed my mind", c)
        self.ty("cancel", a)
        self.ty("cancel", "j-nope", expect=1)

    def test_errors(self):
        p = self.ty("submit", "--world_size", "0", "--model_path", "models/tiny", expect=1)
        self.assertIn("INVALID_ARGUMENT", p.stderr)
        self.assertIn("world_size", p.stderr)
        p = self.ty("list", env_token=False, expect=1)
        self.assertIn("UNAUTHENTICATED", p.stderr)
        p = self.ty("list", "--token", TOKEN, env_token=False)
        p = self.ty("get", "j-missing", expect=1)
        self.assertIn("NOT_FOUND", p.stderr)
        p = self.ty("list", "--server", "http://127.0.0.1:1", expect=1)
        self.assertIn("cannot reach", p.stderr)
        self.ty("get", expect=2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
