"""test_server_openapi.py - the API reference trainyardd serves, held
against the routes it serves, over loopback with a real client.

GET /v1/openapi.json (no token) is api/openapi.yaml; GET /docs is the
explorer page. Every documented operation, called on the real server,
reaches the route of that very method and path: /metrics counts each
request under the route that took it, so a 404, a 405 or a neighbouring
route does not pass. Every route of the server's table (server/rest.c) is
documented, and on a documented path every undocumented method answers 405
with an Allow that lists exactly the documented ones."""
import json
import os
import re
import sys
import unittest

import requests
import yaml  # Debian: python3-yaml (deploy/install-deps.sh test)

sys.path.insert(0, os.path.dirname(__file__))
from tyserver import Server  # noqa: E402

TOKEN = "openapi-token"
SRC = os.environ.get("TRAINYARD_SRC_DIR", os.path.join(os.path.dirname(__file__), "../.."))
METHODS = ["get", "post", "put", "delete", "patch"]


def documented(doc):
    """Every (METHOD, path) of the document."""
    return {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in METHODS}


def route_table():
    """Every (METHOD, pattern) of THE route table in server/rest.c."""
    with open(os.path.join(SRC, "server", "rest.c")) as f:
        text = f.read()
    table = re.search(r"g_routes\[\] = \{(.*?)\n\};", text, re.S)
    assert table, "server/rest.c: no route table g_routes"
    return set(re.findall(r'\{"(GET|POST|PUT|DELETE|PATCH)", "([^"]+)"', table.group(1)))


def request_counts(srv):
    """/metrics' request counters: {"METHOD /pattern": requests}."""
    text = srv.get("/metrics").text
    counts = {}
    for route, n in re.findall(r'^trainyard_http_requests_total\{route="([^"]*)",status="\d+"\} (\d+)$',
                               text, re.M):
        counts[route] = counts.get(route, 0) + int(n)
    return counts


class OpenApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(tokens=TOKEN).start()
        with open(os.path.join(SRC, "api", "openapi.yaml")) as f:
            cls.doc = yaml.safe_load(f)

    @classmethod
    def tearDownClass(cls):
        cls.srv.cleanup()

    def test_document_served_without_token(self):
        r = requests.get(self.srv.url + "/v1/openapi.json", timeout=10)
        self.assertEqual(r.status_code, 200, r.text[:300])
        self.assertEqual(r.headers["Content-Type"], "application/json")
        # YAML keys such as '200' and 200 are the same JSON key.
        source = json.loads(json.dumps(self.doc))
        self.assertEqual(r.json(), source, "GET /v1/openapi.json is api/openapi.yaml as built")
        page = requests.get(self.srv.url + "/docs", timeout=10)
        self.assertEqual(page.status_code, 200)
        self.assertTrue(page.headers["Content-Type"].startswith("text/html"))
        self.assertIn("/assets/swagger-ui-bundle.js", page.text)
        self.assertIn("default-src 'self'", page.headers["Content-Security-Policy"])

    def test_routes_are_documented(self):
        routes, ops = route_table(), documented(self.doc)
        self.assertEqual(sorted(routes - ops), [], "routes of server/rest.c missing in openapi.yaml")
        self.assertEqual(sorted(ops - routes), [], "operations of openapi.yaml the server lacks")

    def test_each_operation_reaches_its_route(self):
        # An ended job for the {id} paths; DELETE goes last, as it removes it.
        r = self.srv.post("/v1/jobs", self.srv.spec(name="openapi", world_size=1, steps=3))
        self.assertEqual(r.status_code, 201, r.text)
        job_id = r.json()["id"]
        self.srv.wait_state(job_id, ["succeeded"])
        values = {"id": job_id, "rank": "0", "n": "1", "key": "openapi-key", "file": "docs.js"}
        ops = sorted(documented(self.doc), key=lambda op: (op[0] == "DELETE", op))
        before = request_counts(self.srv)
        for method, pattern in ops:
            url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], pattern)
            body = {} if method in ("POST", "PUT") else None
            r = requests.request(method, self.srv.url + url, json=body, timeout=10,
                                 headers=self.srv.headers())
            self.assertNotEqual(r.status_code, 405, f"{method} {url}: {r.text[:300]}")
            self.assertFalse(r.status_code == 404 and "no such resource" in r.text,
                             f"{method} {url}: {r.text[:300]}")
        after = request_counts(self.srv)
        for method, pattern in ops:
            route = f"{method} {pattern}"
            self.assertGreater(after.get(route, 0), before.get(route, 0),
                               f"{route} was not counted under its own route; /metrics has "
                               f"{sorted(after)}")

    def test_undocumented_methods_answer_405(self):
        values = {"id": "j-none", "rank": "0", "n": "1", "key": "k", "file": "docs.js"}
        for path, item in self.doc["paths"].items():
            allowed = [m.upper() for m in METHODS if m in item]
            url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
            for method in METHODS:
                if method in item:
                    continue
                r = requests.request(method.upper(), self.srv.url + url, timeout=10,
                                     headers=self.srv.headers())
                self.assertEqual(r.status_code, 405, f"{method.upper()} {url}: {r.text[:300]}")
                allow = [a.strip() for a in r.headers["Allow"].split(",") if a.strip() != "HEAD"]
                self.assertEqual(sorted(allow), sorted(allowed),
                                 f"{method.upper()} {url}: Allow is {r.headers['Allow']}")


if __name__ == "__main__":
    unittest.main()
