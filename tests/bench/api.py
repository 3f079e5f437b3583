"""api.py - trainyardd's REST throughput with wrk, beside nginx serving the
same JSON as a static file on the same machine in the same run:
  1. GET /v1/jobs/{id} against nginx's copy of that response (ratio);
  2. submissions per second (POST /v1/jobs, every one a new stored job);
  3. progress reports ingested per second (POST /v1/internal/jobs/{id}/report
     with the job's token, each report a new step: rank row + metric + event).
Not run by CI (label bench). Needs wrk and nginx (deploy/install-deps.sh bench).
  TRAINYARD_BIN_DIR=$PWD/build python3 tests/bench/api.py [--seconds 5] [--connections 16]
      [--rounds 5]"""
import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from tyserver import Server, free_port  # noqa: E402


def stat_fields(pid):
    """/proc/PID/stat after the command name: fields[0] is the state,
    fields[1] the parent, fields[11] and [12] utime and stime in ticks."""
    with open("/proc/%s/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pids):
    """User + system CPU seconds used so far by the processes pids (all
    their threads)."""
    ticks = sum(int(f[11]) + int(f[12]) for f in map(stat_fields, pids))
    return ticks / os.sysconf("SC_CLK_TCK")


def wrk(url, seconds, conns, threads, script=None, pids=()):
    """(requests/s, p99, non-2xx answers, server CPU microseconds per
    request: the CPU time of pids over the run divided by its requests)."""
    cmd = ["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % seconds, "--latency"]
    if script:
        cmd += ["-s", script]
    cpu0 = cpu_seconds(pids)
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pids) - cpu0
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    n = int(re.search(r"(\d+) requests in", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+\w+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (rps, p99.group(1) if p99 else "?", int(non2xx.group(1)) if non2xx else 0,
            cpu * 1e6 / max(n, 1))


def children(pid):
    """The pids whose parent is pid (nginx's workers)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if int(stat_fields(d)[1]) == pid:
                    out.append(int(d))
            except OSError:
                pass
    return out


def median(xs):
    return sorted(xs)[len(xs) // 2]


def lua(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="GET rounds, each server once")
    a = ap.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            sys.exit("api.py: %s is missing (bash deploy/install-deps.sh bench)" % tool)
    tmp = tempfile.mkdtemp(prefix="ty-bench-api-")
    srv = Server(extra=["--cpu-slots", "1", "--heartbeat-timeout", "3600",
                        "--progress-timeout", "3600", "--page-max", "500"]).start()
    nginx = None
    try:
        print("# host: %d cores, load average %s" % (os.cpu_count(),
                                                     open("/proc/loadavg").read().split()[:3]))
        print("# wrk -t%d -c%d -d%ds; trainyardd and nginx on this machine, one after the other"
              % (a.threads, a.connections, a.seconds))
        # A job that holds the only slot: its one rank never reports, so it
        # stays running and accepts the reports of part 3.
        job = srv.post("/v1/jobs", srv.spec(name="silent0", world_size=1)).json()
        srv.wait_state(job["id"], ["starting", "running"])
        body = srv.get("/v1/jobs/" + job["id"]).content

        # 1. GET beside nginx.
        root = os.path.join(tmp, "www")
        os.makedirs(os.path.join(root, "v1", "jobs"))
        with open(os.path.join(root, "v1", "jobs", job["id"]), "wb") as f:
            f.write(body)
        nport = free_port()
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""worker_processes auto; daemon off; pid %(t)s/nginx.pid;
error_log %(t)s/error.log; events { worker_connections 1024; }
http { access_log off; default_type application/json; keepalive_requests 1000000;
  client_body_temp_path %(t)s; proxy_temp_path %(t)s; fastcgi_temp_path %(t)s;
  uwsgi_temp_path %(t)s; scgi_temp_path %(t)s;
  server { listen 127.0.0.1:%(p)d; root %(r)s; } }
""" % {"t": tmp, "p": nport, "r": root})
        nginx = subprocess.Popen(["nginx", "-c", conf, "-p", tmp], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        path = "/v1/jobs/" + job["id"]
        ng_pids = children(nginx.pid)
        # Rounds alternate the two servers, so a burst of load from
        # elsewhere on the machine lands on both; the medians are the
        # figures. Server CPU per request (all of trainyardd's threads, all
        # of nginx's workers) is the steadier measure on a shared machine.
        ratios, ty_cpus, ng_cpus = [], [], []
        for k in range(a.rounds):
            ty_rps, ty_p99, bad, ty_cpu = wrk(srv.url + path, a.seconds, a.connections,
                                              a.threads, pids=[srv.proc.pid])
            ng_rps, ng_p99, _, ng_cpu = wrk("http://127.0.0.1:%d%s" % (nport, path), a.seconds,
                                            a.connections, a.threads, pids=ng_pids)
            ratios.append(ty_rps / ng_rps)
            ty_cpus.append(ty_cpu)
            ng_cpus.append(ng_cpu)
            print("| GET /v1/jobs/{id} (%d B), round %d | trainyardd %.0f req/s (p99 %s, "
                  "%.1f us CPU/req) | nginx %.0f req/s (p99 %s, %.1f us CPU/req) | ratio %.2fx |"
                  % (len(body), k + 1, ty_rps, ty_p99, ty_cpu, ng_rps, ng_p99, ng_cpu,
                     ratios[-1]))
            assert bad == 0, "non-2xx answers from trainyardd"
        print("| GET /v1/jobs/{id}, median of %d rounds | %.1f us CPU/req | %.1f us CPU/req | "
              "ratio %.2fx nginx |" % (a.rounds, median(ty_cpus), median(ng_cpus), median(ratios)))

        # 2. Submissions, each with an output folder of its own (a folder
        # that an unfinished job writes is refused).
        spec = json.dumps(srv.spec(name="bench", world_size=1, steps=1,
                                   output_dir="runs/bench-@N@"))
        script = lua(os.path.join(tmp, "submit.lua"), """
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local n = 0
local body = [[%s]]
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, (body:gsub("@N@", tid .. "-" .. n)))
end
""" % spec)
        before = len(srv.get("/v1/jobs?page_size=500&state=queued").json()["jobs"])
        rps, p99, bad, cpu = wrk(srv.url + "/v1/jobs", a.seconds, a.connections, a.threads,
                                 script, pids=[srv.proc.pid])
        print("| POST /v1/jobs | %.0f submissions/s (p99 %s, %.1f us CPU each) | %d errors |"
              % (rps, p99, cpu, bad))
        assert bad == 0 and before == 0

        # 3. Reports of the silent rank, a new step each.
        db = sqlite3.connect(os.path.join(srv.dir, "var", "ty.db"))
        token = db.execute("SELECT token FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0]
        db.close()
        script = lua(os.path.join(tmp, "report.lua"), """
local step = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
request = function()
  step = step + 1
  return wrk.format(nil, nil, nil, string.format(
    '{"attempt":1,"rank":0,"world_size":1,"phase":"training","step":%%d,"total_steps":1000000000,'
    .. '"loss":2.5,"tokens_per_s":1000,"host_peak_bytes":1048576}', step))
end
""" % token)
        rps, p99, bad, cpu = wrk(srv.url + "/v1/internal/jobs/%s/report" % job["id"], a.seconds,
                                 a.connections, 1, script, pids=[srv.proc.pid])
        print("| POST .../report | %.0f reports/s (p99 %s, %.1f us CPU each) | %d errors |"
              % (rps, p99, cpu, bad))
        assert bad < rps * 0.01, "reports refused"
    finally:
        if nginx:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=10)
        srv.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
