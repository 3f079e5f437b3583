"""test_server_api.py - the REST API of trainyardd over loopback with a real
client (requests): errors, auth, limits, idempotency, pagination, events,
metrics and concurrent submissions."""
import concurrent.futures
import json
import os
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, Server, big_model, parse_sse  # noqa: E402

TOKEN = "s3cret-token"


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # No CPU slot is free for 2-rank jobs, so submitted jobs stay queued
        # and the API can be examined without workers.
        cls.srv = Server(tokens=TOKEN + ",other-token", extra=["--cpu-slots", "1"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def submit(self, spec, **kw):
        return self.srv.post("/v1/jobs", spec, **kw)

    def test_submit_get_and_queued_fifo(self):
        r = self.submit(self.srv.spec(world_size=1, name="queued-one", train={"steps": 5}))
        # world_size 1 fits the single slot, so the job starts.
        self.assertEqual(r.status_code, 201, r.text)
        job = r.json()
        self.assertEqual(r.headers["Location"], "/v1/jobs/" + job["id"])
        self.assertEqual(job["spec"]["world_size"], 1)
        self.assertTrue(job["spec"]["model_path"].startswith("/"))
        got = self.srv.get("/v1/jobs/" + job["id"]).json()
        self.assertEqual(got["id"], job["id"])
        self.srv.wait_state(job["id"], ["succeeded"])

    def test_reals_read_as_written(self):
        # jansson alone writes 3e-4 as 0.00029999999999999997: every answer
        # writes each real in its shortest form that reads back the same.
        spec = self.srv.spec(name="reals", world_size=1, lora_alpha=16,
                             train={"steps": 5, "lr": 3e-4, "weight_decay": 0.01})
        r = self.submit(spec)
        self.assertEqual(r.status_code, 201, r.text)
        job_id = r.json()["id"]
        for text in (r.text, self.srv.get("/v1/jobs/" + job_id).text,
                     self.srv.get("/v1/jobs?page_size=500").text):
            for want in ('"lr":0.0003,', '"weight_decay":0.01,', '"lora_alpha":16.0,',
                         '"eval_fraction":0.05'):
                self.assertIn(want, text)
            self.assertNotIn("0000000000", text)
        got = self.srv.get("/v1/jobs/" + job_id).json()["spec"]
        self.assertEqual(got["train"]["lr"], 3e-4)
        self.srv.wait_state(job_id, ["succeeded"])

    def test_job_that_can_never_fit_is_rejected(self):
        r = self.submit(self.srv.spec(world_size=2))
        self.assertEqual(r.status_code, 400, r.text)
        err = r.json()["error"]
        self.assertEqual(err["code"], "INVALID_ARGUMENT")
        fields = {d["field"]: d["message"] for d in err["details"]}
        self.assertIn("world_size", fields)
        self.assertIn("CPU rank slots", fields["world_size"])

    def test_invalid_specs_give_400_with_field_details(self):
        s = self.srv.spec(world_size=1)
        cases = [
            ({**s, "lora_rnak": 4}, "lora_rnak"),                                 # unknown field
            ({**s, "world_size": 0}, "world_size"),                               # range
            ({**s, "train": {"lr": -1}}, "train.lr"),                             # range
            ({**s, "init_from_scratch": True, "model_path": ""}, "model"),       # scratch needs model
            ({**s, "fsdp": {"memory_efficient_load": True}, "init_from_scratch": True,
              "model_path": ""}, "fsdp.memory_efficient_load"),                   # contradiction
            ({**s, "allocation_mode": "fsdp:d1t2"}, "allocation_mode"),           # unsupported
            ({**s, "model_path": "/etc"}, "model_path"),                          # outside roots
            ({**s, "output_dir": "/tmp/elsewhere-out"}, "output_dir"),            # outside roots
            ({**s, "model_path": "models/missing"}, "model_path"),                # missing path
            ({**s, "device": "cuda"}, "device"),                                  # no GPUs here
            ({**s, "world_size": "two"}, "world_size"),                           # wrong type
        ]
        for spec, field in cases:
            r = self.submit(spec)
            self.assertEqual(r.status_code, 400, (field, r.text))
            err = r.json()["error"]
            self.assertEqual(err["code"], "INVALID_ARGUMENT")
            self.assertIn(field, [d["field"] for d in err["details"]], (field, err))
            for d in err["details"]:
                self.assertTrue(d["message"])
        # Not JSON at all.
        r = requests.post(self.srv.url + "/v1/jobs", data="{nope", headers=self.srv.headers())
        self.assertEqual(r.status_code, 400)
        self.assertTrue(r.json()["error"]["details"])
        # Validate answers the same without storing anything.
        before = len(self.srv.get("/v1/jobs?page_size=500").json()["jobs"])
        r = self.srv.post("/v1/jobs:validate", {**s, "world_size": 0})
        self.assertEqual(r.status_code, 400)
        r = self.srv.post("/v1/jobs:validate", s)
        self.assertEqual(r.status_code, 200, r.text)
        self.assertTrue(r.json()["valid"])
        self.assertEqual(len(self.srv.get("/v1/jobs?page_size=500").json()["jobs"]), before)

    def test_auth(self):
        r = requests.get(self.srv.url + "/v1/jobs")
        self.assertEqual(r.status_code, 401)
        self.assertEqual(r.json()["error"]["code"], "UNAUTHENTICATED")
        self.assertIn("Bearer", r.headers["WWW-Authenticate"])
        self.assertEqual(self.srv.get("/v1/jobs", token="wrong").status_code, 401)
        self.assertEqual(self.srv.get("/v1/jobs", token="other-token").status_code, 200)
        # A cookie is no credential.
        r = requests.get(self.srv.url + "/v1/jobs", cookies={"token": TOKEN})
        self.assertEqual(r.status_code, 401)
        self.assertEqual(requests.get(self.srv.url + "/healthz").status_code, 200)

    def test_404_405_413(self):
        r = self.srv.get("/v1/nothing")
        self.assertEqual(r.status_code, 404)
        self.assertEqual(r.json()["error"]["code"], "NOT_FOUND")
        r = self.srv.get("/v1/jobs/j-doesnotexist")
        self.assertEqual(r.status_code, 404)
        self.assertIn("j-doesnotexist", r.json()["error"]["message"])
        r = requests.delete(self.srv.url + "/v1/jobs", headers=self.srv.headers())
        self.assertEqual(r.status_code, 405)
        self.assertEqual(r.headers["Allow"], "POST, GET, HEAD")
        r = requests.put(self.srv.url + "/healthz")
        self.assertEqual(r.status_code, 405)
        big = {"name": "x" * (2 << 20)}
        r = self.submit(big)
        self.assertEqual(r.status_code, 413)
        self.assertEqual(r.json()["error"]["code"], "RESOURCE_EXHAUSTED")
        # Chunked, so no Content-Length announces it.
        r = requests.post(self.srv.url + "/v1/jobs", headers=self.srv.headers(),
                          data=iter([b"{\"name\": \"" + b"x" * (1 << 20), b"y" * (1 << 20), b"\"}"]))
        self.assertEqual(r.status_code, 413)
        r = requests.get(self.srv.url + "/healthz", headers={"X-Big": "h" * 40000})
        self.assertIn(r.status_code, (413, 431))

    def test_idempotency_key(self):
        spec = self.srv.spec(world_size=1, name="idem", train={"steps": 3})
        h = {"Idempotency-Key": "key-1"}
        a = self.submit(spec, headers=h)
        b = self.submit(spec, headers=h)
        self.assertEqual(a.status_code, 201, a.text)
        self.assertEqual(b.status_code, 200, b.text)
        self.assertEqual(a.json()["id"], b.json()["id"])
        c = self.submit({**spec, "train": {"steps": 4}}, headers=h)
        self.assertEqual(c.status_code, 409, c.text)
        self.assertEqual(c.json()["error"]["code"], "ALREADY_EXISTS")
        self.assertIn(a.json()["id"], c.json()["error"]["message"])

    def test_pagination_and_filters(self):
        ids = set()
        for i in range(7):
            ids.add(self.submit(self.srv.spec(world_size=1, name="page%d" % i,
                                              train={"steps": 2})).json()["id"])
        seen, token, pages = [], None, 0
        while True:
            q = "/v1/jobs?page_size=3" + ("&page_token=" + token if token else "")
            body = self.srv.get(q).json()
            self.assertLessEqual(len(body["jobs"]), 3)
            seen += [j["id"] for j in body["jobs"]]
            pages += 1
            token = body["next_page_token"]
            if not token:
                break
        self.assertEqual(len(seen), len(set(seen)))
        self.assertTrue(ids <= set(seen))
        self.assertGreaterEqual(pages, 3)
        for j in self.srv.get("/v1/jobs?state=queued,starting").json()["jobs"]:
            self.assertIn(j["state"], ("queued", "starting"))
        r = self.srv.get("/v1/jobs?state=bogus")
        self.assertEqual(r.status_code, 400)
        self.assertEqual(r.json()["error"]["details"][0]["field"], "state")
        self.assertEqual(self.srv.get("/v1/jobs?page_token=zz").status_code, 400)
        self.assertEqual(self.srv.get("/v1/jobs?page_size=-1").status_code, 400)
        # 0 is the default page, as over gRPC: the same jobs (their states
        # move on between the two requests) and the same next page.
        page = lambda q: (lambda b: ([j["id"] for j in b["jobs"]], b["next_page_token"]))(
            self.srv.get(q).json())
        self.assertEqual(page("/v1/jobs?page_size=0"), page("/v1/jobs"))
        self.assertEqual(self.srv.get("/v1/jobs?page_size=100000").status_code, 400)

    def test_concurrent_submissions_stored_once(self):
        spec = self.srv.spec(world_size=1, name="conc", train={"steps": 1})

        def client(c):
            s = requests.Session()
            out = []
            for i in range(25):
                body = {**spec, "output_dir": "runs/conc-%d-%d" % (c, i)}
                r = s.post(self.srv.url + "/v1/jobs", json=body, timeout=30,
                           headers={**self.srv.headers(), "Idempotency-Key": "c%d-%d" % (c, i)})
                out.append((r.status_code, r.json()["id"]))
            return out

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            results = [x for f in [ex.submit(client, c) for c in range(8)] for x in f.result()]
        self.assertEqual(len(results), 200)
        self.assertTrue(all(code == 201 for code, _ in results))
        ids = {i for _, i in results}
        self.assertEqual(len(ids), 200)
        listed = set()
        token = None
        while True:
            body = self.srv.get("/v1/jobs?page_size=500" + ("&page_token=" + token if token else "")).json()
            listed |= {j["id"] for j in body["jobs"] if j["name"] == "conc"}
            token = body["next_page_token"]
            if not token:
                break
        self.assertEqual(listed, ids)
        # Cancelling the queue behind the single slot frees it for the rest.
        for i in ids:
            r = self.srv.post("/v1/jobs/%s:cancel" % i)
            # Those that already ran cannot be cancelled any more.
            self.assertIn(r.status_code, (200, 412), r.text)

    def test_output_dir_of_an_unfinished_job_is_refused(self):
        spec = self.srv.spec(world_size=1, name="folder", train={"steps": 100000},
                             output_dir="runs/shared-folder")
        os.makedirs(os.path.join(self.srv.dir, "runs"), exist_ok=True)
        first = self.submit(spec, headers={"Idempotency-Key": "folder-1"})
        self.assertEqual(first.status_code, 201, first.text)
        first = first.json()
        self.addCleanup(self.srv.post, "/v1/jobs/%s:cancel" % first["id"])
        before = len(self.srv.get("/v1/jobs?page_size=500").json()["jobs"])
        # The same folder, however it is spelled, while the first job is
        # queued or running: refused by submit and by validate alike.
        for out in ["runs/shared-folder", "./runs//shared-folder/", "runs/../runs/shared-folder",
                    os.path.join(self.srv.dir, "runs", "shared-folder")]:
            for path in ["/v1/jobs", "/v1/jobs:validate"]:
                r = self.srv.post(path, {**spec, "name": "second", "output_dir": out})
                self.assertEqual(r.status_code, 400, (out, path, r.text))
                err = r.json()["error"]
                self.assertEqual(err["code"], "INVALID_ARGUMENT")
                msg = {d["field"]: d["message"] for d in err["details"]}["output_dir"]
                self.assertIn("is the output folder of job %s ('folder', " % first["id"], msg)
                self.assertIn("has not finished", msg)
                self.assertIn("give this job another output_dir", msg)
        self.assertEqual(len(self.srv.get("/v1/jobs?page_size=500").json()["jobs"]), before)
        # A replay of the first submit is no conflict: the same job again.
        r = self.submit(spec, headers={"Idempotency-Key": "folder-1"})
        self.assertEqual((r.status_code, r.json()["id"]), (200, first["id"]), r.text)
        # Another folder beside it, or inside it, is another job's.
        for out in ["runs/shared-folder-2", "runs/shared-folder/inner"]:
            r = self.submit({**spec, "name": "beside", "train": {"steps": 1}, "output_dir": out})
            self.assertEqual(r.status_code, 201, r.text)
            self.srv.post("/v1/jobs/%s:cancel" % r.json()["id"])
        # Once the first job has ended, its folder takes a new job.
        self.srv.post("/v1/jobs/%s:cancel" % first["id"])
        self.srv.wait_state(first["id"], ["cancelled"])
        r = self.submit({**spec, "name": "second", "train": {"steps": 1}})
        self.assertEqual(r.status_code, 201, r.text)
        self.srv.post("/v1/jobs/%s:cancel" % r.json()["id"])

    def test_racing_submits_of_one_folder_store_one_job(self):
        spec = self.srv.spec(world_size=1, name="race", train={"steps": 100000},
                             output_dir="runs/race")

        def client(c):
            r = requests.post(self.srv.url + "/v1/jobs", json=spec, timeout=30,
                              headers=self.srv.headers())
            return r.status_code, r.json()

        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(client, range(16)))
        stored = [body["id"] for code, body in results if code == 201]
        for i in stored:
            self.addCleanup(self.srv.post, "/v1/jobs/%s:cancel" % i)
        self.assertEqual(len(stored), 1, results)
        for code, body in results:
            if code != 201:
                self.assertEqual(code, 400)
                self.assertIn(stored[0], body["error"]["details"][0]["message"])

    def test_cancel_queued_and_events_resume(self):
        # Two ranks never fit one slot... but such a job is rejected; so fill
        # the slot with a slow job and queue one behind it.
        slow = self.submit(self.srv.spec(world_size=1, name="slow-blocker",
                                         train={"steps": 40})).json()
        queued = self.submit(self.srv.spec(world_size=1, name="behind", train={"steps": 2})).json()
        # A malformed cancel body is refused by its field and cancels nothing.
        for body, field, part in [({"reason": 5}, "reason", "must be a string"),
                                  ({"reason": "x", "why": 1}, "why", "unknown field"),
                                  ({"reason": "x" * 1025}, "reason", "at most 1024 bytes, got 1025"),
                                  ([], "", "the body, when given, is")]:
            r = self.srv.post("/v1/jobs/%s:cancel" % queued["id"], body)
            self.assertEqual(r.status_code, 400, (body, r.text))
            msgs = {d["field"]: d["message"] for d in r.json()["error"]["details"]}
            self.assertIn(part, msgs[field], msgs)
            self.assertEqual(self.srv.get("/v1/jobs/" + queued["id"]).json()["state"], "queued")
        r = self.srv.post("/v1/jobs/%s:cancel" % queued["id"], {"reason": "not needed"})
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["state"], "cancelled")
        self.assertIn("not needed", r.json()["reason"])
        # Cancelling again is a no-op; an unknown job is 404.
        self.assertEqual(self.srv.post("/v1/jobs/%s:cancel" % queued["id"]).status_code, 200)
        self.assertEqual(self.srv.post("/v1/jobs/j-nope:cancel").status_code, 404)
        done = self.srv.wait_state(slow["id"], ["succeeded"], timeout=30)
        r = self.srv.post("/v1/jobs/%s:cancel" % done["id"])
        self.assertEqual(r.status_code, 412)
        self.assertEqual(r.json()["error"]["code"], "FAILED_PRECONDITION")

        # The whole stream of the finished job, then a resume from the middle.
        r = self.srv.get("/v1/jobs/%s/events" % slow["id"], stream=True, timeout=20)
        self.assertEqual(r.headers["Content-Type"], "text/event-stream")
        events = parse_sse(r.text)
        seqs = [int(e["id"]) for e in events]
        self.assertEqual(seqs, sorted(seqs))
        states = [e["data"]["data"]["to"] for e in events if e["event"] == "state"]
        self.assertEqual(states, ["queued", "starting", "running", "succeeded"])
        steps = [e["data"]["data"]["step"] for e in events
                 if e["event"] == "progress" and e["data"]["data"]["phase"] == "training"]
        self.assertEqual(steps, list(range(1, 41)))
        mid = events[len(events) // 2]["id"]
        r = requests.get(self.srv.url + "/v1/jobs/%s/events" % slow["id"], timeout=20,
                         headers={**self.srv.headers(), "Last-Event-ID": mid})
        rest = parse_sse(r.text)
        self.assertEqual([e["id"] for e in rest], [e["id"] for e in events if int(e["id"]) > int(mid)])

        ranks = self.srv.get("/v1/jobs/%s/ranks" % slow["id"]).json()
        self.assertEqual(ranks["ranks"][0]["state"], "exited")
        self.assertEqual(ranks["ranks"][0]["step"], 40)
        m = self.srv.get("/v1/jobs/%s/metrics" % slow["id"]).json()
        self.assertEqual(m["ranks"][0]["steps"], list(range(1, 41)))
        self.assertGreater(m["ranks"][0]["loss"][0], m["ranks"][0]["loss"][-1])
        log = self.srv.get("/v1/jobs/%s/ranks/0/log" % slow["id"])
        self.assertEqual(log.status_code, 200)
        self.assertIn("[rank 0/1] train step 40/40", log.text)
        # A log, ranks table or metrics that do not exist say why: no such
        # rank, attempt or start.
        for job, path, why in [
                (slow, "ranks/5/log", "has 1 rank (0..0), so no rank 5"),
                (slow, "ranks/0/log?attempt=3", "has had 1 attempt, so no attempt 3"),
                (slow, "ranks?attempt=2", "has had 1 attempt, so no attempt 2"),
                (slow, "metrics?attempt=2", "has had 1 attempt, so no attempt 2"),
                (queued, "ranks/0/log", "has not started yet (cancelled): no rank has a log")]:
            r = self.srv.get("/v1/jobs/%s/%s" % (job["id"], path))
            self.assertEqual(r.status_code, 404, r.text)
            self.assertEqual(r.json()["error"]["message"], "job %s %s" % (job["id"], why))

    def test_live_events_follow_a_running_job(self):
        job = self.submit(self.srv.spec(world_size=1, name="live-slow",
                                        train={"steps": 10})).json()
        t0 = time.time()
        r = self.srv.get("/v1/jobs/%s/events" % job["id"], stream=True, timeout=30)
        events = []
        for ev in iter_sse(r):
            events.append(ev)
        self.assertEqual(events[-1]["data"]["data"]["to"], "succeeded")
        self.assertLess(time.time() - t0, 25)

    def test_internal_report_needs_the_job_token(self):
        job = self.submit(self.srv.spec(world_size=1, name="tok", train={"steps": 2})).json()
        rep = {"attempt": 1, "rank": 0, "world_size": 1, "phase": "training", "step": 1}
        path = "/v1/internal/jobs/%s/report" % job["id"]
        # The API token is not the job's token.
        self.assertEqual(self.srv.post(path, rep).status_code, 401)
        self.assertEqual(self.srv.post("/v1/internal/jobs/j-nope/report", rep).status_code, 401)

    def test_prometheus_and_healthz(self):
        self.srv.get("/v1/jobs")
        self.srv.get("/v1/jobs/j-missing")
        text = self.srv.get("/metrics").text
        self.assertIn('trainyard_jobs{state="queued"}', text)
        self.assertIn("trainyard_ranks_running", text)
        self.assertIn("trainyard_reports_ingested_total", text)
        self.assertIn('trainyard_http_requests_total{route="GET /v1/jobs/{id}",status="404"}', text)
        self.assertIn('route="GET /v1/jobs",status="200"', text)
        h = requests.get(self.srv.url + "/healthz").json()
        self.assertEqual(h["status"], "ok")


class MissingRoot(unittest.TestCase):
    def test_a_root_that_does_not_exist_is_named(self):
        missing = "/nonexistent-trainyard-root"
        srv = Server(extra=["--roots", missing + ":."]).start()
        try:
            self.assertIn("root %s does not exist" % missing, srv.read_log())
            r = srv.post("/v1/jobs", {**srv.spec(world_size=1), "model_path": "/usr"})
            self.assertEqual(r.status_code, 400, r.text)
            msg = {d["field"]: d["message"] for d in r.json()["error"]["details"]}["model_path"]
            self.assertIn("%s (does not exist)" % missing, msg)
        finally:
            srv.cleanup()


# Micro-batches of 1 x 32 tokens, whose activations weigh little beside
# big_model's weights.
SMALL_BATCH = {"train": {"steps": 20, "micro_batch_size": 1},
               "data": {"path": "train.txt", "seq_len": 32}}


class HostMemory(unittest.TestCase):
    def test_cpu_ranks_must_fit_the_host(self):
        # A 199.8M-parameter model (0.74 GiB in float32) on a host of 1 GiB
        # (--host_mem_mib): two standard-path ranks each place it whole
        # (2.23 GiB), two memory-efficient ones hold a shard each (0.74)
        # and the activations of 1 x 32 tokens (0.03 GiB a rank).
        srv = Server(extra=["--host-mem-mib", "1024"]).start()
        try:
            big_model(srv)
            spec = {**srv.spec(name="big", world_size=2), "model_path": "models/big",
                    "data": {"path": "train.txt", "seq_len": 32}}
            spec["train"]["micro_batch_size"] = 1
            for path in ("/v1/jobs:validate", "/v1/jobs"):
                r = srv.post(path, spec)
                self.assertEqual(r.status_code, 400, r.text)
                detail = r.json()["error"]["details"]
                self.assertEqual([d["field"] for d in detail], ["fsdp.memory_efficient_load"])
                self.assertIn("each of the 2 ranks places the whole model (199771136 parameters, "
                              "0.74 GiB in float32) before it keeps its shard, at least 2.23 GiB "
                              "in all on a host of 1.00 GiB (--host_mem_mib); set it true",
                              detail[0]["message"])
            self.assertEqual(srv.get("/v1/jobs").json()["jobs"], [])
            spec["fsdp"] = {"memory_efficient_load": True}
            r = srv.post("/v1/jobs", spec)
            self.assertEqual(r.status_code, 201, r.text)
            srv.wait_state(r.json()["id"], ["succeeded"])
        finally:
            srv.cleanup()


class DeviceMemory(unittest.TestCase):
    def test_gpu_ranks_must_fit_their_cap(self):
        # The same 199.8M-parameter model in bfloat16 (381.0 MiB) on GPUs
        # capped at 512 MiB each (--gpu_mem_limit_mib; --gpus needs no GPU
        # to validate against): a standard-path rank places it whole beside
        # its shard (571.5 MiB), a memory-efficient one its shard (190.5),
        # the activations of 1 x 32 tokens (32.6) and two slots for the
        # units it gathers (125.0). device auto is cuda on a server with
        # GPUs, and checked as such.
        srv = Server(extra=["--gpus", "2", "--gpu-mem-limit-mib", "512"]).start()
        try:
            big_model(srv)
            spec = {**srv.spec(name="big", world_size=2), "model_path": "models/big",
                    "dtype": "bfloat16", **SMALL_BATCH}
            for device in ("cuda", "auto"):
                for path in ("/v1/jobs:validate", "/v1/jobs"):
                    r = srv.post(path, {**spec, "device": device})
                    self.assertEqual(r.status_code, 400, r.text)
                    detail = r.json()["error"]["details"]
                    self.assertEqual([d["field"] for d in detail], ["fsdp.memory_efficient_load"])
                    self.assertIn("each GPU rank places the whole model (199771136 parameters, "
                                  "381.0 MiB in bfloat16) on its device beside its shard, at "
                                  "least 571.5 MiB, more than the 512.0 MiB that "
                                  "--gpu_mem_limit_mib allows each GPU rank; set it true: "
                                  "each rank then places only its shard, at least 348.2 MiB "
                                  "with its training buffers", detail[0]["message"])
            self.assertEqual(srv.get("/v1/jobs").json()["jobs"], [])
            # CPU ranks are not held to a GPU's cap (their 2 shards, 762.1
            # MiB in float32, are over it).
            r = srv.post("/v1/jobs:validate", {**spec, "device": "cpu",
                                               "fsdp": {"memory_efficient_load": True}})
            self.assertEqual(r.status_code, 200, r.text)
            r = srv.post("/v1/jobs:validate", {**spec, "device": "cuda",
                                               "fsdp": {"memory_efficient_load": True}})
            self.assertEqual(r.status_code, 200, r.text)
            # In float32 even the shards are over: the message names what
            # would fit (bfloat16 is half the bytes, more ranks smaller
            # shards).
            r = srv.post("/v1/jobs:validate", {**spec, "device": "cuda", "world_size": 1,
                                               "dtype": "float32",
                                               "fsdp": {"memory_efficient_load": True}})
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["model_path"])
            self.assertIn("needs at least 794.7 MiB on each GPU for its weights in float32 and "
                          "the activations of micro-batches of 1 x 32 tokens over 1 rank, more "
                          "than the 512.0 MiB that --gpu_mem_limit_mib allows each GPU rank: "
                          "load the base in bfloat16 (dtype), use more ranks",
                          detail[0]["message"])
            # Micro-batches of 2 x 128 tokens on one rank in bfloat16: every
            # layer's activations (232.6 MiB) are what is over;
            # gradient_checkpointing is named, and with it one layer's and
            # each layer's input (99.5 MiB) fit.
            longer = {**spec, "device": "cuda", "world_size": 1,
                      "fsdp": {"memory_efficient_load": True},
                      "train": {"steps": 20, "micro_batch_size": 2},
                      "data": {"path": "train.txt", "seq_len": 128}}
            r = srv.post("/v1/jobs:validate", longer)
            self.assertEqual(r.status_code, 400, r.text)
            detail = r.json()["error"]["details"]
            self.assertEqual([d["field"] for d in detail], ["gradient_checkpointing"])
            self.assertIn("is false: each GPU rank keeps every layer's activations for its "
                          "micro-batch of 2 x 128 tokens, 232.6 MiB, at least 613.6 MiB in "
                          "all, more than the 512.0 MiB that --gpu_mem_limit_mib allows each "
                          "GPU rank; set it true: a rank then keeps one layer's and each "
                          "layer's input, 99.5 MiB", detail[0]["message"])
            r = srv.post("/v1/jobs:validate", {**longer, "gradient_checkpointing": True})
            self.assertEqual(r.status_code, 200, r.text)
        finally:
            srv.cleanup()


class DeviceMemoryFromNvml(unittest.TestCase):
    """Without --gpu_mem_limit_mib, GPU ranks are held to the largest GPU
    NVML reports (here a libnvidia-ml.so.1 whose GPUs TY_FAKE_NVML_MIB
    sizes); a smaller cap wins; where NVML cannot tell, the server says so
    and holds cuda jobs to nothing."""
    NVML = os.path.join(BIN, "tests", "nvml")

    def server(self, mib, cap=None):
        env = {"LD_LIBRARY_PATH": self.NVML}
        if mib:
            env["TY_FAKE_NVML_MIB"] = mib
        extra = ["--gpus", "2"] + (["--gpu-mem-limit-mib", str(cap)] if cap else [])
        srv = Server(extra=extra, env=env).start()
        big_model(srv)
        # 381.0 MiB in bfloat16: 571.5 MiB a standard-path rank, 348.2 a
        # memory-efficient one (its shard, activations and unit slots).
        spec = {**srv.spec(name="big", world_size=2), "model_path": "models/big",
                "dtype": "bfloat16", "device": "cuda", **SMALL_BATCH}
        return srv, spec

    def refused(self, srv, spec):
        r = srv.post("/v1/jobs:validate", spec)
        self.assertEqual(r.status_code, 400, r.text)
        detail = r.json()["error"]["details"]
        self.assertEqual([d["field"] for d in detail], ["fsdp.memory_efficient_load"])
        return detail[0]["message"]

    def test_the_largest_gpu_nvml_reports(self):
        srv, spec = self.server("256,512")
        try:
            self.assertIn("NVML: 2 GPUs, the largest with 512.0 MiB", srv.read_log())
            self.assertIn("at least 571.5 MiB, more than the 512.0 MiB of this host's largest "
                          "GPU (NVML); set it true", self.refused(srv, spec))
            r = srv.post("/v1/jobs:validate", {**spec, "fsdp": {"memory_efficient_load": True}})
            self.assertEqual(r.status_code, 200, r.text)
        finally:
            srv.cleanup()
        # A cap over the GPU's size is no larger GPU.
        srv, spec = self.server("512", cap=4096)
        try:
            self.assertIn("--gpus 2, but NVML reports 1 GPU", srv.read_log())
            self.assertIn("more than the 512.0 MiB of this host's largest GPU (NVML)",
                          self.refused(srv, spec))
        finally:
            srv.cleanup()
        # A smaller cap is what a rank may hold.
        srv, spec = self.server("4096", cap=512)
        try:
            self.assertIn("more than the 512.0 MiB that --gpu_mem_limit_mib allows each GPU rank",
                          self.refused(srv, spec))
        finally:
            srv.cleanup()

    def test_no_driver_no_check(self):
        srv, spec = self.server(None)
        try:
            self.assertIn("NVML did not start (nvmlInit_v2 returned 9: no driver or no GPU): cuda "
                          "jobs are held to a GPU's memory only where --gpu_mem_limit_mib is set",
                          srv.read_log())
            r = srv.post("/v1/jobs:validate", spec)
            self.assertEqual(r.status_code, 200, r.text)
        finally:
            srv.cleanup()


class ConnectionLimit(unittest.TestCase):
    def test_429_past_max_connections(self):
        import socket
        srv = Server(extra=["--max-connections", "4"]).start()
        socks = []
        try:
            for _ in range(5):
                socks.append(socket.create_connection(("127.0.0.1", srv.port)))
            time.sleep(0.2)
            r = requests.get(srv.url + "/healthz")
            self.assertEqual(r.status_code, 429)
            self.assertEqual(r.json()["error"]["code"], "RESOURCE_EXHAUSTED")
            self.assertEqual(r.headers["Retry-After"], "1")
            for s in socks:
                s.close()
            socks = []
            deadline = time.time() + 5
            while requests.get(srv.url + "/healthz").status_code != 200:
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
        finally:
            for s in socks:
                s.close()
            srv.cleanup()


class StreamsOnFewThreads(unittest.TestCase):
    """Event streams share REST's few threads with every other request: an
    idle stream holds no thread, every stream still gets every event, and
    shutdown ends the streams that are open."""

    def test_many_idle_streams_block_nothing(self):
        import threading
        srv = Server(extra=["--http-threads", "2", "--cpu-slots", "1"]).start()
        try:
            blocker, job = queued_behind_silent(srv, "silent0", "behind", train={"steps": 20})
            n = 24
            got = [None] * n
            opened = threading.Barrier(n + 1)

            def watch(i):
                r = srv.get("/v1/jobs/%s/events" % job["id"], stream=True, timeout=60)
                opened.wait()
                got[i] = list(iter_sse(r))

            threads = [threading.Thread(target=watch, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            opened.wait(timeout=20)
            # 24 idle streams on 2 threads; other requests still get answers.
            t0 = time.time()
            for _ in range(50):
                self.assertEqual(srv.get("/v1/jobs/" + job["id"], timeout=2).status_code, 200)
            self.assertLess(time.time() - t0, 5)
            srv.post("/v1/jobs/%s:cancel" % blocker["id"])
            for t in threads:
                t.join(timeout=60)
            want = srv.get("/v1/jobs/%s/events" % job["id"], timeout=20).text
            want = [e["id"] for e in parse_sse(want)]
            states = ["queued", "starting", "running", "succeeded"]
            for events in got:
                self.assertEqual([e["id"] for e in events], want)
                self.assertEqual([e["data"]["data"]["to"] for e in events
                                  if e["event"] == "state"], states)

            # Streams open at shutdown end at once, and the server exits 0.
            _, other = queued_behind_silent(srv, "silent0-again", "stays-queued")
            streams = [srv.get("/v1/jobs/%s/events" % other["id"], stream=True, timeout=30)
                       for _ in range(8)]
            time.sleep(0.3)
            t0 = time.time()
            self.assertEqual(srv.stop(), 0)
            for r in streams:
                events = list(iter_sse(r))
                self.assertEqual([e["data"]["data"]["to"] for e in events], ["queued"])
            # The ranks' grace is 0.5 s; the rest is room for a loaded machine.
            self.assertLess(time.time() - t0, 8)
        finally:
            srv.cleanup()

class StreamKeepalive(unittest.TestCase):
    def test_quiet_stream_sends_keepalives_then_events(self):
        import threading
        srv = Server(extra=["--sse-keepalive", "0.3", "--cpu-slots", "1"]).start()
        try:
            _, job = queued_behind_silent(srv, "silent0", "waits")
            r = srv.get("/v1/jobs/%s/events" % job["id"], stream=True, timeout=30)
            text = []
            reader = threading.Thread(target=lambda: text.extend(
                r.iter_content(chunk_size=None, decode_unicode=True)))
            reader.start()
            time.sleep(1.6)
            quiet = "".join(text)
            # A quiet stream: its one event, then a comment every ~0.3 s.
            self.assertEqual([e["data"]["data"]["to"] for e in parse_sse(quiet)], ["queued"])
            self.assertGreaterEqual(quiet.count(": keepalive\n\n"), 3, quiet)
            self.assertLessEqual(quiet.count(": keepalive\n\n"), 6, quiet)
            # ... that still carries the job's events when they come, to its end.
            srv.post("/v1/jobs/%s:cancel" % job["id"])
            reader.join(timeout=20)
            self.assertFalse(reader.is_alive())
            states = [e["data"]["data"]["to"] for e in parse_sse("".join(text))
                      if e["event"] == "state"]
            self.assertEqual(states, ["queued", "cancelled"])
        finally:
            srv.cleanup()

    def test_abandoned_streams_are_reclaimed(self):
        # A client that goes away while its stream is idle (connection
        # suspended) is noticed at the next keepalive write.
        srv = Server(extra=["--sse-keepalive", "0.3", "--cpu-slots", "1"]).start()
        try:
            _, job = queued_behind_silent(srv, "silent0", "waits")
            streams = [srv.get("/v1/jobs/%s/events" % job["id"], stream=True, timeout=10)
                       for _ in range(20)]
            self.assertEqual(gauge(srv, "trainyard_event_streams"), 20)
            self.assertGreaterEqual(gauge(srv, "trainyard_http_connections"), 20)
            for r in streams:
                r.close()
            deadline = time.time() + 10
            while gauge(srv, "trainyard_event_streams") != 0:
                self.assertLess(time.time(), deadline, "abandoned streams still open")
                time.sleep(0.1)
            self.assertLess(gauge(srv, "trainyard_http_connections"), 5)
        finally:
            srv.cleanup()


def queued_behind_silent(srv, holder_name, name, **over):
    """On a one-slot server: a job whose rank never reports (its name says
    so to the test worker) takes the slot, and job `name` queues behind it.
    Both jobs, as the API returned them."""
    holder = srv.post("/v1/jobs", srv.spec(world_size=1, name=holder_name)).json()
    srv.wait_state(holder["id"], ["starting", "running"])
    return holder, srv.post("/v1/jobs", srv.spec(world_size=1, name=name, **over)).json()


def gauge(srv, name):
    """A gauge's value from /metrics."""
    for line in srv.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    raise AssertionError("no %s in /metrics" % name)


def iter_sse(resp):
    buf = ""
    for chunk in resp.iter_content(chunk_size=None, decode_unicode=True):
        buf += chunk
        while "\n\n" in buf:
            block, buf = buf.split("\n\n", 1)
            for ev in parse_sse(block + "\n\n"):
                yield ev


if __name__ == "__main__":
    unittest.main(verbosity=2)
