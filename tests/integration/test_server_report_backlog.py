"""test_server_report_backlog.py - a rank's reports while its server cannot
be reached (trainyardd restarting): the real worker trains with
TRAINYARD_REPORT_URL at a port where nothing listens; once a server answers
there, every report it kept arrives, in order, before any newer one, so the
server sees each step once and no gap; a report the server refuses (400)
is not sent again and holds up none after it."""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import BIN, free_port  # noqa: E402

TY = os.path.join(BIN, "cli", "trainyard")
WORKER = os.path.join(BIN, "worker", "trainyard-worker")


class Recorder(http.server.BaseHTTPRequestHandler):
    got = []
    refuse_step = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        refused = body.get("step") == Recorder.refuse_step and body["phase"] == "training"
        if not refused:
            Recorder.got.append(body)
        self.send_response(400 if refused else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class ReportBacklog(unittest.TestCase):
    def test_kept_reports_arrive_in_order(self):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([TY, "mkmodel", "--out", "m", "--hidden-size", "32",
                            "--intermediate-size", "64", "--layers", "1", "--heads", "2",
                            "--kv-heads", "1", "--vocab-size", "256"], cwd=d, check=True,
                           capture_output=True)
            with open(os.path.join(d, "train.txt"), "w") as f:
                f.write("the cat sat on the mat and the dog ran to the red door " * 400)
            steps = 300
            spec = {"name": "backlog", "model_path": os.path.join(d, "m"), "use_lora": True,
                    "lora_rank": 4, "data": {"path": os.path.join(d, "train.txt"), "seq_len": 16},
                    "train": {"steps": steps, "micro_batch_size": 2},
                    "output_dir": os.path.join(d, "out")}
            with open(os.path.join(d, "spec.json"), "w") as f:
                json.dump(spec, f)
            port = free_port()
            env = dict(os.environ, TRAINYARD_SPEC=os.path.join(d, "spec.json"),
                       TRAINYARD_REPORT_URL="http://127.0.0.1:%d/report" % port,
                       TRAINYARD_JOB_TOKEN="t", TRAINYARD_HEARTBEAT_MS="200")
            err = open(os.path.join(d, "stderr"), "w+")
            p = subprocess.Popen([WORKER], env=env, stdout=subprocess.DEVNULL, stderr=err)
            try:
                # Nothing listens until the rank has trained 20 steps.
                deadline = time.time() + 60
                while time.time() < deadline:
                    with open(os.path.join(d, "stderr")) as f:
                        if "train step 20/" in f.read():
                            break
                    time.sleep(0.01)
                Recorder.got = []
                Recorder.refuse_step = 40
                srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Recorder)
                threading.Thread(target=srv.serve_forever, daemon=True).start()
                self.assertEqual(p.wait(timeout=120), 0)
                srv.shutdown()
            finally:
                if p.poll() is None:
                    p.kill()
            train = [r["step"] for r in Recorder.got if r["phase"] == "training"
                     and r.get("loss") is not None]
            # Each step once, in order, but the refused one; then done.
            first = train[0]
            self.assertLessEqual(first, 1, train[:5])
            want = [s for s in range(max(first, 1), steps + 1) if s != 40]
            self.assertEqual([s for i, s in enumerate(train) if i == 0 or s != train[i - 1]],
                             want)
            self.assertEqual(train, sorted(train))
            self.assertEqual(Recorder.got[-1]["phase"], "done")
            print("# %d reports kept while nothing listened, then %d in all, in order"
                  % (sum(1 for s in train if s <= 20), len(Recorder.got)))


if __name__ == "__main__":
    unittest.main()
