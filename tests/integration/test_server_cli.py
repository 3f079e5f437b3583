"""test_server_cli.py - the trainyard client commands (submit, list, get,
watch, cancel, delete, logs and logs --follow) against a real trainyardd, with
--server/--token and their environment variables; the log endpoint's
offset and tail."""
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
        got = self.ty("get", job_id).stdout
        job = json.loads(got)
        self.assertEqual(job["state"], "succeeded")
        # Reals as written: 0.0003, not 0.00029999999999999997.
        self.assertIn('"lr": 0.0003,', got)
        self.assertIn('"eval_fraction": 0.05,', got)
        self.assertEqual(job["spec"]["train"]["steps"], 6)
        log = self.ty("logs", job_id, "--rank", "1").stdout
        self.assertIn("[rank 1/2] train step 6/6", log)
        self.ty("logs", job_id, "--rank", "7", expect=1)
        lst = self.ty("list", "--state", "succeeded").stdout
        self.assertIn(job_id, lst)
        self.assertIn("ID", lst.splitlines()[0])

    def test_logs_follow(self):
        # A job queued behind another is waited for, then followed to its
        # end: what --follow printed is the whole log, and it exits 0.
        first = self.ty("submit", self.srv.write_spec("follow-first-slow", steps=15,
                                                      world_size=4)).stdout.strip()
        job = self.ty("submit", self.srv.write_spec("follow-slow", steps=20)).stdout.strip()
        p = self.ty("logs", job, "--rank", "1", "--follow")
        whole = self.ty("logs", job, "--rank", "1").stdout
        self.assertEqual(p.stdout, whole)
        self.assertIn("[rank 1/2] train step 20/20", p.stdout)
        self.assertEqual(self.srv.get("/v1/jobs/" + first, token=TOKEN).json()["state"],
                         "succeeded")
        # A retried job (queued behind another, so that --follow sees it
        # from the start): the failed attempt's log, then the next one's.
        self.ty("submit", self.srv.write_spec("follow-ahead-slow", steps=10, world_size=4))
        flaky = self.ty("submit", self.srv.write_spec("flaky-follow", steps=5,
                                                      max_restarts=1)).stdout.strip()
        p = self.ty("logs", flaky, "-f")
        self.assertIn("attempt 1 is over; attempt 2 follows", p.stderr)
        one = self.ty("logs", flaky, "--attempt", "1").stdout
        two = self.ty("logs", flaky, "--attempt", "2").stdout
        self.assertEqual(p.stdout, one + two)
        self.assertIn("injected failure", one)
        # A rank the job does not have, or a job that never started, ends at
        # once with the server's reason.
        p = self.ty("logs", job, "--rank", "5", "--follow", expect=1)
        self.assertIn("has 2 ranks (0..1), so no rank 5", p.stderr)
        blocker = self.ty("submit", self.srv.write_spec("follow-block-slow", steps=100,
                                                        world_size=4)).stdout.strip()
        queued = self.ty("submit", self.srv.write_spec("follow-never", steps=1,
                                                       world_size=4)).stdout.strip()
        self.assertIn("cancelled", self.ty("cancel", queued).stdout)
        self.ty("cancel", blocker)
        p = self.ty("logs", queued, "--follow", expect=1)
        self.assertIn("has not started yet (cancelled)", p.stderr)

    def test_log_offset_and_tail(self):
        job = self.ty("submit", self.srv.write_spec("log-parts", steps=6)).stdout.strip()
        self.ty("watch", job)
        path = "/v1/jobs/%s/ranks/0/log" % job
        whole = self.srv.get(path, token=TOKEN)
        size = len(whole.content)
        self.assertEqual(whole.headers["X-Log-Start"], "0")
        self.assertEqual(whole.headers["X-Log-End"], str(size))
        for query, start in [("offset=10", 10), ("tail=25", size - 25), ("offset=%d" % size, size),
                             ("offset=%d" % (size + 99), size), ("tail=%d" % (size + 99), 0)]:
            r = self.srv.get(path + "?" + query, token=TOKEN)
            self.assertEqual(r.status_code, 200, (query, r.text))
            self.assertEqual(r.content, whole.content[start:], query)
            self.assertEqual((r.headers["X-Log-Start"], r.headers["X-Log-End"]),
                             (str(start), str(size)), query)
        for query, field in [("offset=-1", "offset"), ("tail=0", "tail"), ("offset=1&tail=1", "tail"),
                             ("offset=%2B5", "offset")]:
            r = self.srv.get(path + "?" + query, token=TOKEN)
            self.assertEqual(r.status_code, 400, (query, r.text))
            self.assertIn(field, [d["field"] for d in r.json()["error"]["details"]])
        r = self.srv.get("/v1/jobs/%s/ranks/%%2B0/log" % job, token=TOKEN)  # "+0"
        self.assertEqual(r.status_code, 400, r.text)
        self.assertEqual(r.json()["error"]["details"][0]["field"], "rank")

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

    def test_delete(self):
        done_id = self.ty("submit", self.srv.write_spec("cli-del", steps=3)).stdout.strip()
        self.ty("watch", done_id)
        running = self.ty("submit", self.srv.write_spec("cli-del-slow", steps=400)).stdout.strip()
        p = self.ty("delete", done_id, running, "j-nope", expect=1)
        out = os.path.join(self.srv.dir, "runs", "cli-del")
        self.assertEqual(p.stdout, "deleted %s (cli-del, succeeded); its output_dir %s is left "
                         "as it is\n" % (done_id, out))
        # Just submitted: queued, starting or running, as the scheduler has got.
        self.assertRegex(p.stderr, "job %s is (queued|starting|running); only a job that has "
                         "ended" % running)
        self.assertIn("NOT_FOUND (HTTP 404): no job with id 'j-nope'", p.stderr)
        self.assertTrue(os.path.isdir(out))
        self.assertIn("NOT_FOUND", self.ty("get", done_id, expect=1).stderr)
        self.assertEqual(self.ty("get", running).returncode, 0)
        self.ty("cancel", running)
        self.assertIn("usage: trainyard delete JOB_ID...", self.ty("delete", expect=2).stderr)
        self.assertIn("unknown option --force", self.ty("delete", "--force", expect=2).stderr)

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


class ListPages(unittest.TestCase):
    """`trainyard list` against a server whose pages hold two jobs: --limit
    and --all page through them; bad flags are refused by the flag's name
    before any request, and a refused request prints no table."""

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(extra=["--page-max", "2"]).start()
        cls.ids = [cls.srv.post("/v1/jobs", cls.srv.spec("page-%d" % i, steps=1)).json()["id"]
                   for i in range(5)]

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def ty(self, *args, expect=0):
        env = dict(os.environ, TRAINYARD_SERVER=self.srv.url)
        p = subprocess.run([TRAINYARD, "list"] + list(args), cwd=self.srv.dir, env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, expect, (args, p.stdout, p.stderr))
        return p

    def rows(self, *args):
        lines = self.ty(*args).stdout.splitlines()
        self.assertTrue(lines[0].startswith("ID "), lines)
        return [l.split()[0] for l in lines[1:]]

    def test_limit_and_all_page_through(self):
        newest_first = self.ids[::-1]
        self.assertEqual(self.rows(), newest_first)
        self.assertEqual(self.rows("--limit", "3"), newest_first[:3])
        self.assertEqual(self.rows("--limit", "1"), newest_first[:1])
        self.assertEqual(self.rows("--limit", "100"), newest_first)
        self.assertEqual(self.rows("--all"), newest_first)
        got = json.loads(self.ty("--all", "--json").stdout)
        self.assertEqual([j["id"] for j in got], newest_first)
        got = json.loads(self.ty("--limit", "4", "--json").stdout)
        self.assertEqual([j["id"] for j in got], newest_first[:4])

    def test_bad_flags_and_requests(self):
        for bad in ("x", "0", "-3", "2.5", ""):
            p = self.ty("--limit", bad, expect=2)
            self.assertIn("--limit", p.stderr)
            self.assertIn("'%s'" % bad, p.stderr)
            self.assertEqual(p.stdout, "")
        p = self.ty("--all", "--limit", "3", expect=2)
        self.assertIn("--all", p.stderr)
        p = self.ty("--state", "bogus", expect=1)
        self.assertIn("unknown state 'bogus'", p.stderr)
        self.assertEqual(p.stdout, "")
        # The REST page size: one range whatever is wrong with it, 0 (as
        # over gRPC) the default page, here page_max's 2 jobs.
        for q in ("x", "3", "-1"):
            r = self.srv.get("/v1/jobs?page_size=" + q)
            self.assertEqual(r.status_code, 400, q)
            d = r.json()["error"]["details"][0]
            self.assertEqual(d["field"], "page_size")
            self.assertIn("between 0 and 2", d["message"])
        r = self.srv.get("/v1/jobs?page_size=0")
        self.assertEqual(r.status_code, 200, r.text)
        # The same jobs as the default page (their states may move on
        # between the two requests) and the same next page.
        ids = lambda b: ([j["id"] for j in b["jobs"]], b["next_page_token"])
        self.assertEqual(ids(r.json()), ids(self.srv.get("/v1/jobs").json()))
        self.assertEqual(len(r.json()["jobs"]), 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
