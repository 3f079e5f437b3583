"""test_grpc_api.py - trainyardd's gRPC API (trainyard.v1.Trainyard) over
loopback with a client this project did not write: Debian's python3-grpcio
with protoc-generated message classes. Every RPC; errors with their field
details; auth; deadlines; cancelled watches freeing the server's streams;
resume by sequence number; 50 concurrent watches; REST and gRPC agreeing;
message size bounds; shutdown with open streams. Ranks are played by the
test worker of the server's suites (ty_test_worker)."""
import concurrent.futures
import json
import os
import re
import signal
import sys
import threading
import time
import unittest

import grpc
from google.protobuf import json_format

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from tygrpc import Client, error_details, spec_message  # noqa: E402
from tyserver import Server, free_port  # noqa: E402

TOKEN = "grpc-test-token"


def start(tokens="", extra=None):
    """A trainyardd with the gRPC API on a free loopback port."""
    port = free_port()
    srv = Server(tokens=tokens, extra=["--grpc-listen", "127.0.0.1:%d" % port] + (extra or []))
    srv.start()
    srv.grpc_target = "127.0.0.1:%d" % port
    return srv


def streams_open(srv):
    """The server's count of open WatchJob streams, from its last log line
    about one closing (None when none closed yet)."""
    found = re.findall(r"WatchJob stream .* (\d+) open", srv.read_log())
    return int(found[-1]) if found else None


class GrpcApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = start()
        cls.c = Client(cls.srv.grpc_target)
        cls.pb = cls.c.pb

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        # A clean exit (under the sanitizers: no leak, no error) or a failure.
        rc = cls.srv.stop()
        log = cls.srv.read_log()
        cls.srv.cleanup()
        if rc != 0:
            raise AssertionError("trainyardd exited with %s; log:\n%s" % (rc, log))

    def spec(self, **kw):
        return spec_message(self.pb, self.srv.spec(**kw))

    def submit(self, **kw):
        return self.c.SubmitJob(spec=self.spec(**kw)).job

    def watch_all(self, job_id, after_seq=0, timeout=30):
        return list(self.c.WatchJob(job_id=job_id, after_seq=after_seq, timeout=timeout))

    def assert_error(self, code, fn, *args, **kw):
        with self.assertRaises(grpc.RpcError) as cm:
            r = fn(*args, **kw)
            if not hasattr(r, "SerializeToString"):
                list(r)
        name, message, fields = error_details(cm.exception)
        self.assertEqual(name, code, message)
        self.assertTrue(message)
        return message, fields

    # ---- every RPC ----

    def test_validate_returns_the_normalized_spec(self):
        resp = self.c.ValidateJob(spec=self.spec(name="v1", world_size=1))
        self.assertTrue(resp.valid)
        out = resp.spec
        self.assertEqual(out.name, "v1")
        self.assertEqual(out.world_size, 1)
        self.assertTrue(out.model_path.startswith("/"), out.model_path)
        self.assertEqual(out.output_dir, os.path.join(self.srv.dir, "runs", "v1"))
        self.assertEqual(list(out.target_modules), ["q_proj", "k_proj", "v_proj", "o_proj"])
        self.assertEqual(out.train.lr, 3e-4)  # a default, filled in

    def test_submit_get_list_watch_to_success(self):
        resp = self.c.SubmitJob(spec=self.spec(name="grpc-ok", steps=8), idempotency_key="k-ok")
        job = resp.job
        self.assertFalse(resp.existing)
        self.assertEqual(job.state, self.pb.JOB_STATE_QUEUED)
        self.assertEqual(job.spec.name, "grpc-ok")
        self.assertEqual(job.idempotency_key, "k-ok")
        again = self.c.SubmitJob(spec=self.spec(name="grpc-ok", steps=8), idempotency_key="k-ok")
        self.assertTrue(again.existing)
        self.assertEqual(again.job.id, job.id)
        self.assert_error("ALREADY_EXISTS", self.c.SubmitJob,
                          spec=self.spec(name="grpc-other"), idempotency_key="k-ok")

        events = self.watch_all(job.id)
        seqs = [e.seq for e in events]
        self.assertEqual(seqs, sorted(seqs))
        self.assertEqual(len(seqs), len(set(seqs)))
        states = [e.data.to for e in events if e.type == "state"]
        self.assertEqual(states[-1], self.pb.JOB_STATE_SUCCEEDED)
        self.assertIn(self.pb.JOB_STATE_RUNNING, states)
        progress = [e.data for e in events if e.type == "progress"]
        self.assertEqual({p.rank for p in progress}, {0, 1})
        self.assertTrue(any(p.phase == self.pb.PHASE_TRAINING and p.step == 8 and p.loss > 0
                            for p in progress), progress[-4:])
        for e in events:
            self.assertEqual(e.job_id, job.id)
            self.assertGreater(e.t, 1e9)

        got = self.c.GetJob(job_id=job.id)
        self.assertEqual(got.state, self.pb.JOB_STATE_SUCCEEDED)
        self.assertEqual((got.attempt, got.world_size, got.device), (1, 2, "cpu"))
        self.assertGreater(got.finished_at, got.created_at)  # RFC 3339 sorts as text

        listed = self.c.ListJobs(states=[self.pb.JOB_STATE_SUCCEEDED], page_size=500)
        self.assertIn(job.id, [j.id for j in listed.jobs])
        self.assertTrue(all(j.state == self.pb.JOB_STATE_SUCCEEDED for j in listed.jobs))

    def test_list_pages(self):
        ids = [self.submit(name="page-%d" % i, world_size=1, steps=1).id for i in range(5)]
        seen, token = [], ""
        for _ in range(20):
            page = self.c.ListJobs(page_size=2, page_token=token)
            self.assertLessEqual(len(page.jobs), 2)
            seen += [j.id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        self.assertEqual(len(seen), len(set(seen)))
        self.assertTrue(set(ids) <= set(seen))
        _, fields = self.assert_error("INVALID_ARGUMENT", self.c.ListJobs, page_token="bogus")
        self.assertTrue(fields)
        # 0 (proto3's unset) takes the default page; the message says so.
        self.assertTrue(self.c.ListJobs(page_size=0).jobs)
        for bad in (501, -1):
            _, fields = self.assert_error("INVALID_ARGUMENT", self.c.ListJobs, page_size=bad)
            self.assertIn("between 1 and 500 (0 or unset: the default, 50), got %d" % bad,
                          fields["page_size"])

    def test_cancel(self):
        job = self.submit(name="cancel-me-slow", steps=200)
        _, fields = self.assert_error("INVALID_ARGUMENT", self.c.CancelJob, job_id=job.id,
                                      reason="x" * 1025)
        self.assertIn("at most 1024 bytes, got 1025", fields["reason"])
        self.assertNotEqual(self.c.GetJob(job_id=job.id).state, self.pb.JOB_STATE_CANCELLED)
        why = "changed my mind " + "z" * (1024 - 16)  # the longest reason, kept whole
        out = self.c.CancelJob(job_id=job.id, reason=why)
        self.assertEqual(out.state, self.pb.JOB_STATE_CANCELLED)
        self.assertEqual(out.reason, "cancelled by a client: " + why)
        events = self.watch_all(job.id)
        # Ranks stopped by the cancel may be recorded after the state.
        states = [e.data.to for e in events if e.type == "state"]
        self.assertEqual(states[-1], self.pb.JOB_STATE_CANCELLED)
        self.assertEqual(self.c.CancelJob(job_id=job.id).state, self.pb.JOB_STATE_CANCELLED)

    def test_delete(self):
        job = self.submit(name="delete-me-slow", steps=200)
        message, _ = self.assert_error("FAILED_PRECONDITION", self.c.DeleteJob, job_id=job.id)
        self.assertIn("cancel it first", message)
        self.c.CancelJob(job_id=job.id)
        self.watch_all(job.id)  # ends once every rank's end is recorded
        deadline = time.time() + 10
        while True:  # the scheduler lets go of the attempt just after
            try:
                out = self.c.DeleteJob(job_id=job.id)
                break
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
        self.assertEqual((out.id, out.state), (job.id, self.pb.JOB_STATE_CANCELLED))
        for fn in (self.c.GetJob, self.c.DeleteJob, self.c.WatchJob):
            self.assert_error("NOT_FOUND", fn, job_id=job.id)
        _, fields = self.assert_error("INVALID_ARGUMENT", self.c.DeleteJob)
        self.assertIn("job_id", fields)

    def test_watch_resumes_after_a_sequence_number(self):
        job = self.submit(name="resume", steps=5)
        full = self.watch_all(job.id)
        self.assertGreater(len(full), 3)
        k = full[2].seq
        tail = self.watch_all(job.id, after_seq=k)
        self.assertEqual([e.SerializeToString() for e in tail],
                         [e.SerializeToString() for e in full if e.seq > k])
        self.assertEqual(self.watch_all(job.id, after_seq=full[-1].seq), [])

    # ---- errors ----

    def test_invalid_specs_give_invalid_argument_with_field_details(self):
        s = self.srv.spec(world_size=1)
        cases = [
            ({**s, "world_size": 0}, "world_size"),
            ({**s, "train": {"lr": -1.0}}, "train.lr"),
            ({**s, "init_from_scratch": True, "model_path": ""}, "model"),
            ({**s, "fsdp": {"memory_efficient_load": True}, "init_from_scratch": True,
              "model_path": ""}, "fsdp.memory_efficient_load"),
            ({**s, "allocation_mode": "fsdp:d1t2"}, "allocation_mode"),
            ({**s, "model_path": "/etc"}, "model_path"),
            ({**s, "dtype": "float64"}, "dtype"),
            ({**s, "device": "cuda"}, "device"),
            ({**s, "data": {"path": "train.txt", "seq_len": 0}}, "data.seq_len"),
        ]
        for spec, field in cases:
            for method in (self.c.SubmitJob, self.c.ValidateJob):
                message, fields = self.assert_error("INVALID_ARGUMENT", method,
                                                    spec=spec_message(self.pb, spec))
                self.assertIn(field, fields, (field, message, fields))
                self.assertTrue(all(fields.values()), fields)
        # The same error in trainyard.v1.Error form.
        with self.assertRaises(grpc.RpcError) as cm:
            self.c.SubmitJob(spec=spec_message(self.pb, cases[0][0]))
        raw = dict(cm.exception.trailing_metadata())["trainyard-error-bin"]
        err = self.pb.Error.FromString(raw)
        self.assertEqual(err.code, "INVALID_ARGUMENT")
        self.assertIn("world_size", [d.field for d in err.details])
        # No spec at all.
        _, fields = self.assert_error("INVALID_ARGUMENT", self.c.SubmitJob)
        self.assertIn("spec", fields)

    def test_output_dir_of_an_unfinished_job_is_invalid(self):
        job = self.submit(name="holder", steps=100000, output_dir="runs/held")
        try:
            other = {**self.srv.spec(name="other", steps=1), "output_dir": "runs/held/"}
            for method in (self.c.SubmitJob, self.c.ValidateJob):
                _, fields = self.assert_error("INVALID_ARGUMENT", method,
                                              spec=spec_message(self.pb, other))
                self.assertIn("is the output folder of job %s ('holder', " % job.id,
                              fields["output_dir"])
            # REST says the same of the same spec (the holder's state may
            # have moved on from queued meanwhile).
            rest = self.srv.post("/v1/jobs", other).json()["error"]
            same = lambda m: re.sub(r"'holder', [a-z]+\)", "'holder', STATE)", m)
            self.assertEqual({d["field"]: same(d["message"]) for d in rest["details"]},
                             {k: same(v) for k, v in fields.items()})
        finally:
            self.c.CancelJob(job_id=job.id)
        self.c.CancelJob(job_id=self.c.SubmitJob(spec=spec_message(self.pb, other)).job.id)

    def test_rest_and_grpc_give_the_same_errors(self):
        spec = {**self.srv.spec(world_size=1), "lora_rank": 0, "train": {"steps": 0}}
        rest = self.srv.post("/v1/jobs", spec).json()["error"]
        message, fields = self.assert_error("INVALID_ARGUMENT", self.c.SubmitJob,
                                            spec=spec_message(self.pb, spec))
        self.assertEqual(rest["code"], "INVALID_ARGUMENT")
        self.assertEqual(rest["message"], message)
        self.assertEqual({d["field"]: d["message"] for d in rest["details"]}, fields)

    def test_unknown_job_is_not_found(self):
        for fn in (self.c.GetJob, self.c.CancelJob, self.c.DeleteJob, self.c.WatchJob):
            message, _ = self.assert_error("NOT_FOUND", fn, job_id="no-such-job")
            self.assertIn("no-such-job", message)
        _, fields = self.assert_error("INVALID_ARGUMENT", self.c.GetJob)
        self.assertIn("job_id", fields)

    def test_unknown_method_is_unimplemented(self):
        call = self.c.channel.unary_unary("/trainyard.v1.Trainyard/Nope",
                                          request_serializer=lambda m: m.SerializeToString(),
                                          response_deserializer=self.pb.Job.FromString)
        with self.assertRaises(grpc.RpcError) as cm:
            call(self.pb.GetJobRequest(job_id="x"), timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("Nope", cm.exception.details())
        self.assertIn("has SubmitJob, ValidateJob, GetJob, ListJobs, CancelJob, DeleteJob and "
                      "WatchJob", cm.exception.details())

    def test_malformed_request_is_invalid_argument(self):
        call = self.c.channel.unary_unary("/trainyard.v1.Trainyard/GetJob",
                                          request_serializer=lambda b: b,
                                          response_deserializer=self.pb.Job.FromString)
        with self.assertRaises(grpc.RpcError) as cm:
            call(b"\xff\xff\xff", timeout=5)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("GetJobRequest", cm.exception.details())

    def test_message_size_is_bounded(self):
        spec = spec_message(self.pb, {**self.srv.spec(world_size=1), "name": "x" * (2 << 20)})
        with self.assertRaises(grpc.RpcError) as cm:
            self.c.SubmitJob(spec=spec)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # The server keeps serving.
        self.c.ValidateJob(spec=self.spec(world_size=1))

    # ---- deadlines, cancellation, fan-out ----

    def test_deadline_ends_a_watch_and_frees_it(self):
        job = self.submit(name="deadline-slow", steps=100)
        with self.assertRaises(grpc.RpcError) as cm:
            list(self.c.WatchJob(job_id=job.id, timeout=0.7))
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.c.CancelJob(job_id=job.id)

    def test_cancelled_watch_frees_the_servers_stream(self):
        job = self.submit(name="watch-cancel-slow", steps=100)
        calls = [self.c.WatchJob(job_id=job.id, timeout=60) for _ in range(5)]
        for call in calls:
            next(call)  # the stream is open and has sent an event
        for call in calls:
            call.cancel()
        deadline = time.time() + 5
        while time.time() < deadline and streams_open(self.srv) != 0:
            time.sleep(0.05)
        self.assertEqual(streams_open(self.srv), 0, self.srv.read_log())
        self.assertGreaterEqual(self.srv.read_log().count("cancelled by the client"), 5)
        self.c.CancelJob(job_id=job.id)

    def test_50_concurrent_watches_all_see_the_job_finish(self):
        job = self.submit(name="fanout-slow", steps=15, world_size=1)
        barrier = threading.Barrier(50)

        def watch(_):
            client = Client(self.srv.grpc_target)
            try:
                barrier.wait(timeout=20)
                return [e.SerializeToString() for e in
                        client.WatchJob(job_id=job.id, timeout=60)]
            finally:
                client.close()
        with concurrent.futures.ThreadPoolExecutor(50) as ex:
            results = list(ex.map(watch, range(50)))
        self.assertEqual(len(results), 50)
        upto_final = []
        for events in results:
            decoded = [self.pb.JobEvent.FromString(e) for e in events]
            final = max(i for i, e in enumerate(decoded) if e.type == "state")
            self.assertEqual(decoded[final].data.to, self.pb.JOB_STATE_SUCCEEDED)
            upto_final.append(events[:final + 1])
        # Every watcher saw the same events, in the same order.
        self.assertEqual(upto_final, [upto_final[0]] * 50)

    def test_rest_and_grpc_return_the_same_job(self):
        job = self.submit(name="same", steps=3)
        self.watch_all(job.id)
        rest = self.srv.get("/v1/jobs/" + job.id).json()
        got = self.c.GetJob(job_id=job.id)
        self.assertEqual(self.proto_json(got), drop_nulls(rest))
        # And the same events as the SSE stream's data.
        events = self.srv.get("/v1/jobs/%s/events" % job.id, stream=True, timeout=10)
        sse = [json.loads(line[5:]) for line in events.text.splitlines()
               if line.startswith("data:")]
        grpc_events = [self.proto_json(e) for e in self.watch_all(job.id)]
        self.assertEqual(grpc_events, [drop_nulls(e) for e in sse])

    def proto_json(self, msg):
        """A message as the REST API's JSON: field names as in the proto,
        enum values in lower case without their prefix, 64-bit integers as
        numbers."""
        d = json_format.MessageToDict(msg, preserving_proto_field_name=True)

        def fix(v, key=""):
            if isinstance(v, dict):
                return {k: fix(x, k) for k, x in v.items()}
            if isinstance(v, list):
                return [fix(x) for x in v]
            if isinstance(v, str) and re.match(r"^(JOB_STATE|PHASE)_", v):
                return v.split("_", 2)[-1].lower() if v.startswith("JOB_STATE") else \
                    v.split("_", 1)[1].lower()
            if isinstance(v, str) and re.match(r"^-?\d+$", v) and key in INT64_FIELDS:
                return int(v)
            if isinstance(v, float) and v.is_integer() and key in INT_AS_REAL:
                return v
            return v
        return fix(d)


# 64-bit integer fields (proto3 JSON writes them as strings).
INT64_FIELDS = {"seed", "seq", "step", "total_steps", "bytes_loaded", "bytes_total",
                "host_peak_bytes", "device_peak_bytes", "pid", "reports"}
INT_AS_REAL = set()


def drop_nulls(v):
    if isinstance(v, dict):
        # null, and an empty list (train.sample_prompts), are absent on the wire
        return {k: drop_nulls(x) for k, x in v.items() if x is not None and x != []}
    if isinstance(v, list):
        return [drop_nulls(x) for x in v]
    return v


class GrpcAuth(unittest.TestCase):
    def test_token_required(self):
        srv = start(tokens=TOKEN + ",second")
        try:
            c = Client(srv.grpc_target)
            pb = c.pb
            for token in ("", "wrong", TOKEN + "x"):
                with self.assertRaises(grpc.RpcError) as cm:
                    c.ListJobs(token=token)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED, token)
                self.assertIn("token", cm.exception.details())
            with self.assertRaises(grpc.RpcError) as cm:
                list(c.WatchJob(job_id="x"))
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(len(c.ListJobs(token=TOKEN).jobs), 0)
            self.assertEqual(len(c.ListJobs(token="second").jobs), 0)
            job = c.SubmitJob(spec=spec_message(pb, srv.spec(world_size=1, steps=2)),
                              token=TOKEN).job
            self.assertEqual(c.GetJob(job_id=job.id, token="second").id, job.id)
            c.close()
        finally:
            srv.cleanup()


class GrpcShutdown(unittest.TestCase):
    def test_sigterm_with_open_streams(self):
        srv = start()
        try:
            c = Client(srv.grpc_target)
            job = c.SubmitJob(spec=spec_message(c.pb, srv.spec(name="long-slow",
                                                               steps=1000))).job
            calls = [c.WatchJob(job_id=job.id, timeout=60) for _ in range(10)]
            firsts = [next(call) for call in calls]
            t0 = time.time()
            self.assertEqual(srv.stop(signal.SIGTERM, timeout=15), 0, srv.read_log())
            self.assertLess(time.time() - t0, 10)
            for call, first in zip(calls, firsts):
                with self.assertRaises(grpc.RpcError) as cm:
                    list(call)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertIn("after_seq", cm.exception.details())
            c.close()
        finally:
            srv.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)
