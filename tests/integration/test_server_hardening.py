"""test_server_hardening.py - what an attacker tried on the front ends:
values that overflow or hide a NUL byte, an over-long Idempotency-Key,
slow clients that would hold every connection, and a listen name that
looks like loopback but is not. Each is refused with a clear error, or
served around, over loopback only."""
import os
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
