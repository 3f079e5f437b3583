"""bench_grpc.py - throughput of trainyardd's gRPC API, measured with
Debian's python3-grpcio over loopback:

  unary    GetJob calls per second: P client processes, each keeping D calls
           in flight on its own channel, for T seconds.
  fan-out  W concurrent WatchJob streams on one running job: events
           delivered per second in total, and how long after the server
           stored an event the watchers had it (median, p99, max).

  python3 tests/bench/grpc/bench_grpc.py [--procs P] [--depth D] [--seconds T]
                                         [--watchers W] [--steps S]

Binaries come from TRAINYARD_BIN_DIR (default build/). The client runs on the
same machine as the server and competes with it for the CPUs, so the
figures are a floor for the server alone."""
import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "grpc"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
from tygrpc import Client, spec_message  # noqa: E402
from tyserver import Server, free_port  # noqa: E402


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def unary_worker(target, job_id, depth, seconds, out):
    try:
        out.put(unary_calls(target, job_id, depth, seconds))
    except Exception as ex:  # noqa: BLE001 - the parent reports it
        out.put(repr(ex))


def unary_calls(target, job_id, depth, seconds):
    """Calls completed in seconds with depth GetJob calls in flight."""
    c = Client(target)
    req = c.pb.GetJobRequest(job_id=job_id)
    call = c.calls["GetJob"][1]
    done = 0
    lock = threading.Lock()
    stop_at = time.time() + seconds
    finished = threading.Event()
    inflight = [0]

    def issue():
        with lock:
            inflight[0] += 1
        f = call.future(req, timeout=30)
        f.add_done_callback(on_done)

    errors = []

    def on_done(f):
        nonlocal done
        if f.exception() is not None:
            errors.append(f.exception())
            finished.set()
            return
        with lock:
            done += 1
            inflight[0] -= 1
        if time.time() < stop_at:
            issue()
        elif inflight[0] == 0:
            finished.set()

    for _ in range(depth):
        issue()
    finished.wait(seconds + 30)
    c.close()
    if errors:
        raise RuntimeError("GetJob failed: %r" % errors[0])
    return done


def bench_unary(srv, job_id, procs, depth, seconds):
    # spawn, not fork: a forked grpcio client inherits the parent's sockets.
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=unary_worker,
                                  args=(srv.grpc_target, job_id, depth, seconds, q))
          for _ in range(procs)]
    t0, cpu0 = time.time(), cpu_seconds(srv.proc.pid)
    for p in ps:
        p.start()
    results = [q.get(timeout=seconds + 60) for _ in ps]
    bad = [r for r in results if not isinstance(r, int)]
    if bad:
        raise RuntimeError("a client process failed: %s" % bad[0])
    total = sum(results)
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    for p in ps:
        p.join()
    elapsed = time.time() - t0
    # Sequential latency: one call at a time.
    c = Client(srv.grpc_target)
    lat = []
    for _ in range(300):
        t = time.perf_counter()
        c.GetJob(job_id=job_id)
        lat.append((time.perf_counter() - t) * 1e3)
    c.close()
    lat.sort()
    return total / seconds, cpu * 1e6 / max(total, 1), lat[len(lat) // 2], lat[int(len(lat) * 0.99)]


def bench_fanout(srv, watchers, steps):
    c = Client(srv.grpc_target)
    job = c.SubmitJob(spec=spec_message(c.pb, srv.spec(name="bench-fanout-slow", steps=steps,
                                                       world_size=1))).job
    delays, counts, errors = [], [], []
    lock = threading.Lock()
    barrier = threading.Barrier(watchers + 1)

    def watch():
        cl = Client(srv.grpc_target)
        mine, n = [], 0
        try:
            barrier.wait()
            for e in cl.WatchJob(job_id=job.id, timeout=600):
                mine.append((time.time() - e.t) * 1000)
                n += 1
        except Exception as ex:  # noqa: BLE001 - reported below
            errors.append(repr(ex))
        finally:
            cl.close()
        with lock:
            delays.extend(mine[1:])  # the first events predate the watch
            counts.append(n)

    threads = [threading.Thread(target=watch) for _ in range(watchers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.time()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    c.close()
    if errors:
        raise RuntimeError("%d watches failed: %s" % (len(errors), errors[0]))
    delays.sort()
    return (sum(counts), min(counts), max(counts), sum(counts) / elapsed, elapsed,
            statistics.median(delays), delays[int(len(delays) * 0.99)], delays[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--watchers", type=int, default=200)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()

    port = free_port()
    srv = Server(extra=["--grpc-listen", "127.0.0.1:%d" % port]).start()
    srv.grpc_target = "127.0.0.1:%d" % port
    try:
        c = Client(srv.grpc_target)
        job = c.SubmitJob(spec=spec_message(c.pb, srv.spec(name="bench", steps=3,
                                                           world_size=2))).job
        list(c.WatchJob(job_id=job.id, timeout=60))  # a finished job with 2 ranks
        c.close()
        rate, cpu_us, p50, p99 = bench_unary(srv, job.id, a.procs, a.depth, a.seconds)
        print("unary GetJob: %.0f calls/s (%d procs x %d in flight, %.1f s), server CPU "
              "%.0f us/call (= %.0f calls per server CPU-second); one at a time: p50 %.2f ms, "
              "p99 %.2f ms" % (rate, a.procs, a.depth, a.seconds, cpu_us, 1e6 / cpu_us, p50, p99))
        total, lo, hi, per_s, el, med, p99d, mx = bench_fanout(srv, a.watchers, a.steps)
        print("fan-out: %d WatchJob streams, %d events each (%d..%d), %d delivered in %.1f s "
              "= %.0f events/s; delivery after store: median %.1f ms, p99 %.1f ms, max %.1f ms"
              % (a.watchers, total // a.watchers, lo, hi, total, el, per_s, med, p99d, mx))
    finally:
        srv.cleanup()


if __name__ == "__main__":
    main()
