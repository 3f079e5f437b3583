"""test_server_hardening.py - what an attacker tried on the front ends:
values that overflow or hide a NUL byte, an over-long Idempotency-Key,
slow clients that would hold every connection, and a listen name that
looks like loopback but is not. Each is refused with a clear error, or
served around, over loopback only."""
import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server, free_port  # noqa: E402


class Inputs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server().start()
        cls.job = cls.srv.post("/v1/jobs", cls.srv.spec(name="inputs", steps=2)).json()

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def error_field(self, r):
        self.assertEqual(r.status_code, 400, r.text)
        return [d["field"] for d in r.json()["error"]["details"]]

    def test_page_token_that_overflows(self):
        for tok in ("p" + "f" * 17, "p" + "7" * 40, "pffffffffffffffff", "p-1", "p 1", "p"):
            r = self.srv.get("/v1/jobs", params={"page_token": tok})
            self.assertEqual(self.error_field(r), ["page_token"], tok)
        self.assertEqual(self.srv.get("/v1/jobs", params={"page_token": "p7fffffff"})
                         .status_code, 200)

    def test_last_event_id_that_overflows(self):
        for v in ("9" * 40, "99999999999999999999", "-1", "1x", "0x10"):
            r = requests.get(self.srv.url + "/v1/jobs/%s/events" % self.job["id"],
                             headers={"Last-Event-ID": v}, timeout=10)
            self.assertEqual(self.error_field(r), ["Last-Event-ID"], v)

    def test_nul_in_query_values(self):
        for q in ("state=%00", "state=running%00x", "page_token=%00", "page_size=1%00"):
            r = requests.get(self.srv.url + "/v1/jobs?" + q, timeout=10)
            self.assertEqual(r.status_code, 400, q)
            self.assertIn("NUL", r.text)
        # In the path: not cut short to the job's id.
        for path in ("/v1/jobs/%s%%00x" % self.job["id"], "/v1/jobs/%s%%00" % self.job["id"],
                     "/v1/jobs/%s/ranks%%00" % self.job["id"]):
            r = requests.get(self.srv.url + path, timeout=10)
            self.assertEqual(r.status_code, 400, path)
            self.assertEqual(self.error_field(r), ["path"])
        # Other escapes still decode.
        self.assertEqual(requests.get(self.srv.url + "/v1/jobs/%s" % self.job["id"].replace(
            "j", "%6a"), timeout=10).status_code, 200)
        # A state that names nothing real is still an error, not every job.
        self.assertEqual(self.error_field(self.srv.get("/v1/jobs", params={"state": "x"})),
                         ["state"])

    def test_idempotency_key_length(self):
        spec = self.srv.spec(name="idem-len", steps=2)
        r = self.srv.post("/v1/jobs", spec, headers={"Idempotency-Key": "k" * 129})
        self.assertEqual(self.error_field(r), ["Idempotency-Key"])
        self.assertIn("at most 128", r.text)
        r = self.srv.post("/v1/jobs", spec, headers={"Idempotency-Key": "k" * 128})
        self.assertEqual(r.status_code, 201, r.text)


def get_from(srv, path, source, timeout=3):
    """GET path from a given loopback source address: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def closed_by_peer(sock):
    try:
        sock.setblocking(False)
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class SlowClients(unittest.TestCase):
    def test_slow_clients_do_not_lock_others_out(self):
        """300 connections from 127.0.0.1 trickle header bytes (more than
        --max-connections): a client from 127.0.0.2 is answered throughout,
        each address holds at most --max-connections-per-ip, and every slow
        connection is cut once its --request-timeout has passed."""
        srv = Server(extra=["--request-timeout", "2", "--max-connections", "256",
                            "--max-connections-per-ip", "32"]).start()
        socks = []
        try:
            for _ in range(300):
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(("127.0.0.1", srv.port))
                    s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    socks.append(s)
                except OSError:
                    s.close()
            start = time.time()
            worst = 0.0
            while time.time() - start < 4:
                for s in socks:
                    try:
                        s.send(b"a")
                    except OSError:
                        pass
                t0 = time.time()
                status, body = get_from(srv, "/healthz", "127.0.0.2")
                worst = max(worst, time.time() - t0)
                self.assertEqual(status, 200, body)
                time.sleep(0.2)
            self.assertLess(worst, 2.0)
            status, body = get_from(srv, "/metrics", "127.0.0.2")
            gauge = [l for l in body.decode().splitlines()
                     if l.startswith("trainyard_http_connections ")]
            self.assertLessEqual(int(gauge[0].split()[1]), 32 + 2, gauge)
            # Past the deadline (2 s, checked every 0.25 s), every one is cut.
            time.sleep(0.5)
            left = [s for s in socks if not closed_by_peer(s)]
            self.assertEqual(len(left), 0, "%d slow connections still open" % len(left))
            # A client that sends its request in time is answered, also from
            # the address that was cut off.
            self.assertEqual(get_from(srv, "/healthz", "127.0.0.1")[0], 200)
        finally:
            for s in socks:
                s.close()
            srv.cleanup()

    def test_slow_body_is_cut(self):
        srv = Server(extra=["--request-timeout", "1"]).start()
        try:
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"POST /v1/jobs:validate HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            t0 = time.time()
            cut = False
            while time.time() - t0 < 4 and not cut:
                try:
                    s.send(b" ")
                except OSError:
                    cut = True
                    break
                time.sleep(0.2)
                cut = closed_by_peer(s)
                s.setblocking(True)
            self.assertTrue(cut, "a body trickled past the deadline was not cut")
            self.assertLess(time.time() - t0, 3)
            s.close()
            # Idle keep-alive after an answer gets a new deadline, not a cut
            # in the middle of the next request.
            self.assertEqual(srv.get("/healthz").status_code, 200)
        finally:
            srv.cleanup()


class ListenNames(unittest.TestCase):
    """No token is allowed only where every address of the listen name is
    loopback: a name spelled like one ("127.lan.invalid", which resolves
    nowhere, as an unknown name may resolve anywhere) is not."""

    def run_server(self, *extra):
        srv = Server()
        try:
            args = srv.args() + list(extra)
            env = dict(os.environ)
            env.pop("TRAINYARD_TOKENS", None)
            return subprocess.run(args, cwd=srv.dir, env=env, capture_output=True, text=True,
                                  timeout=20)
        finally:
            srv.log.close()
            shutil.rmtree(srv.dir, ignore_errors=True)

    def test_rest_listen_name(self):
        p = self.run_server("--listen", "127.lan.invalid:%d" % free_port())
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("not every address it resolves to is a loopback one", p.stderr)

    def test_grpc_listen_name(self):
        p = self.run_server("--grpc-listen", "127.lan.invalid:%d" % free_port())
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("is not a loopback address", p.stderr)

    def test_loopback_names_still_run_without_token(self):
        srv = Server()
        args = srv.args()
        args[args.index("--listen") + 1] = "localhost:%d" % srv.port
        try:
            env = dict(os.environ)
            env.pop("TRAINYARD_TOKENS", None)
            p = subprocess.Popen(args, cwd=srv.dir, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 15
            ok = False
            while time.time() < deadline and not ok and p.poll() is None:
                try:
                    ok = requests.get("http://localhost:%d/healthz" % srv.port,
                                      timeout=1).status_code == 200
                except requests.ConnectionError:
                    time.sleep(0.05)
            p.terminate()
            _, err = p.communicate(timeout=20)
            self.assertTrue(ok, err)
        finally:
            srv.log.close()
            shutil.rmtree(srv.dir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
