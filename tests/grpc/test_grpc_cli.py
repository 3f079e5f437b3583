"""test_grpc_cli.py - trainyard submit, get, watch, list, cancel and delete with
--grpc (and TRAINYARD_GRPC) against a real trainyardd: the same output as
over REST, errors with their field details, the token, an unreachable
address; logs, which gRPC does not serve, refuses --grpc."""
import json
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from tyserver import BIN, Server, free_port  # noqa: E402

TRAINYARD = os.path.join(BIN, "cli", "trainyard")
TOKEN = "cli-grpc-token"


def drop_nulls(v):
    if isinstance(v, dict):
        # null, and an empty list (train.sample_prompts), are absent on the wire
        return {k: drop_nulls(x) for k, x in v.items() if x is not None and x != []}
    return v


LIVE = ("progress", "progress_phase", "eta_seconds", "tokens_per_s")


def steady(out):
    """A list's output without the figures that move while a job runs: the
    PROGRESS column of the table (characters 93..133 of a row), those
    fields of the JSON."""
    if out.startswith("["):
        return [{k: x for k, x in j.items() if k not in LIVE} for j in json.loads(out)]
    return "".join(line[:93] + line[133:] for line in out.splitlines(True))


class GrpcCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        port = free_port()
        cls.target = "127.0.0.1:%d" % port
        cls.srv = Server(tokens=TOKEN, extra=["--grpc-listen", cls.target]).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def ty(self, *args, expect=0, token=TOKEN, grpc_env=False):
        env = dict(os.environ)
        env["TRAINYARD_SERVER"] = self.srv.url
        env.pop("TRAINYARD_GRPC", None)
        env.pop("TRAINYARD_TOKEN", None)
        if token:
            env["TRAINYARD_TOKEN"] = token
        argv = list(args)
        if grpc_env:
            env["TRAINYARD_GRPC"] = self.target
        else:
            argv += ["--grpc", self.target]
        p = subprocess.run([TRAINYARD] + argv, cwd=self.srv.dir, env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, expect, (args, p.stdout, p.stderr))
        return p

    def test_submit_watch_get(self):
        spec = self.srv.write_spec("cli-grpc", steps=8)
        job_id = self.ty("submit", spec, "--train.steps", "6",
                         "--idempotency-key", "k1").stdout.strip()
        self.assertTrue(job_id.startswith("j-"), job_id)
        again = self.ty("submit", spec, "--train.steps", "6", "--idempotency-key", "k1")
        self.assertEqual(again.stdout.strip(), job_id)
        self.assertIn("earlier submit", again.stderr)
        w = self.ty("watch", job_id, grpc_env=True)
        self.assertIn("[rank 1/2] training", w.stdout)
        self.assertIn("6/6", w.stdout)
        self.assertIn("job %s succeeded" % job_id, w.stdout)
        job = json.loads(self.ty("get", job_id).stdout)
        self.assertEqual(job["state"], "succeeded")
        self.assertEqual(job["spec"]["train"]["steps"], 6)
        # The same JSON as the REST client prints (null fields are unset in
        # protobuf, so they are absent).
        rest = self.srv.get("/v1/jobs/" + job_id, token=TOKEN).json()
        self.assertEqual(job, drop_nulls(rest))
        # submit --watch follows the new job to its end.
        out = self.ty("submit", spec, "--name", "cli-grpc-2", "--watch").stdout
        self.assertIn("succeeded", out.splitlines()[-1])

    def rest(self, *args, expect=0):
        """The same command over REST (no --grpc, no TRAINYARD_GRPC)."""
        env = dict(os.environ, TRAINYARD_SERVER=self.srv.url, TRAINYARD_TOKEN=TOKEN)
        env.pop("TRAINYARD_GRPC", None)
        p = subprocess.run([TRAINYARD] + list(args), cwd=self.srv.dir, env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, expect, (args, p.stdout, p.stderr))
        return p

    def test_list_and_cancel(self):
        spec = self.srv.write_spec("cli-grpc-list", steps=100000, world_size=1)
        ids = [self.ty("submit", spec, "--name", "cli-grpc-list-%d" % i, "--output_dir",
                       "runs/cli-grpc-list-%d" % i).stdout.strip() for i in range(3)]
        out = self.ty("cancel", ids[0], "--reason", "over grpc").stdout
        self.assertEqual(out.strip(), "%s cancelled: cancelled by a client: over grpc" % ids[0])
        self.assertEqual(self.ty("cancel", "j-nope", expect=1).stderr.count("NOT_FOUND"), 1)
        # The same table and JSON as over REST, over the server's pages.
        for args in (["list"], ["list", "--limit", "2"], ["list", "--state", "cancelled"],
                     ["list", "--all", "--json"]):
            self.assertEqual(steady(self.ty(*args, grpc_env=True).stdout),
                             steady(self.rest(*args).stdout if "--json" not in args
                                    else self.ty(*args).stdout))
        listed = steady(self.ty("list", "--all", "--json").stdout)
        rest = steady(self.rest("list", "--all", "--json").stdout)
        self.assertEqual(listed, [drop_nulls(j) for j in rest])
        self.assertTrue(all("progress" in j for j in json.loads(
            self.ty("list", "--all", "--json").stdout)))
        self.assertEqual([j["id"] for j in listed[:3]], ids[::-1])
        p = self.ty("list", "--state", "running,bogus", expect=2)
        self.assertIn("unknown state 'bogus'", p.stderr)
        for i in ids[1:]:
            self.ty("cancel", i)
        # Logs are REST's alone.
        p = self.ty("logs", ids[0], expect=2)
        self.assertIn("served over REST only", p.stderr)
        # Deleted over gRPC once their ranks are gone, with REST's line.
        for i in ids:
            deadline = time.time() + 10
            while True:
                p = subprocess.run([TRAINYARD, "delete", i, "--grpc", self.target],
                                   env=dict(os.environ, TRAINYARD_TOKEN=TOKEN),
                                   capture_output=True, text=True, timeout=60)
                if p.returncode == 0 or time.time() > deadline:
                    break
                self.assertIn("UNAVAILABLE", p.stderr)  # ranks still stopping
                time.sleep(0.05)
            self.assertEqual(p.stdout, "deleted %s (%s, cancelled); its output_dir %s is left "
                             "as it is\n" % (i, "cli-grpc-list-%d" % ids.index(i),
                                              os.path.join(self.srv.dir, "runs",
                                                           "cli-grpc-list-%d" % ids.index(i))))
        self.assertFalse(set(ids) & {j["id"] for j in
                                     json.loads(self.ty("list", "--all", "--json").stdout)})
        self.assertIn("NOT_FOUND", self.ty("delete", ids[0], expect=1).stderr)

    def test_errors(self):
        spec = self.srv.write_spec("cli-grpc-bad", steps=8)
        p = self.ty("submit", spec, "--world_size", "9999", "--lora_rank", "0", expect=1)
        self.assertIn("INVALID_ARGUMENT", p.stderr)
        self.assertIn("lora_rank:", p.stderr)
        p = self.ty("get", "j-nope", expect=1)
        self.assertIn("NOT_FOUND", p.stderr)
        self.assertIn("j-nope", p.stderr)
        p = self.ty("get", "j-nope", token="", expect=1)
        self.assertIn("UNAUTHENTICATED", p.stderr)
        p = self.ty("watch", "j-nope", expect=1)
        self.assertIn("NOT_FOUND", p.stderr)

    def test_unreachable(self):
        env = dict(os.environ, TRAINYARD_TOKEN=TOKEN)
        p = subprocess.run([TRAINYARD, "get", "j-x", "--grpc", "127.0.0.1:%d" % free_port()],
                           env=env, capture_output=True, text=True, timeout=90)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("UNAVAILABLE", p.stderr)
        self.assertIn("--grpc-listen", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
