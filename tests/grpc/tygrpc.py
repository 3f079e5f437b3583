"""tygrpc.py - a gRPC client of trainyard.v1.Trainyard for the test suites,
built only from stock parts: Debian's python3-grpcio and message classes
that protoc generates from api/trainyard.proto and api/google_rpc.proto at
run time (into a temporary directory). Methods are called through grpcio's
generic multi-callables, by their full path, as generated stubs would."""
import os
import subprocess
import sys
import tempfile

import grpc

SRC = os.environ.get("TRAINYARD_SRC_DIR", os.path.join(os.path.dirname(__file__), "../.."))
_GEN = None


def protos():
    """Imports (generating on first use) the modules trainyard_pb2 and
    google_rpc_pb2."""
    global _GEN
    if _GEN is None:
        _GEN = tempfile.mkdtemp(prefix="ty-pb2-")
        api = os.path.join(SRC, "api")
        subprocess.run(["protoc", "-I", api, "--python_out", _GEN,
                        os.path.join(api, "trainyard.proto"),
                        os.path.join(api, "google_rpc.proto")], check=True)
        sys.path.insert(0, _GEN)
    import google_rpc_pb2  # noqa: E402
    import trainyard_pb2  # noqa: E402
    return trainyard_pb2, google_rpc_pb2


PATH = "/trainyard.v1.Trainyard/"
# method -> (request class name, response class name, streaming)
METHODS = {
    "SubmitJob": ("SubmitJobRequest", "SubmitJobResponse", False),
    "ValidateJob": ("ValidateJobRequest", "ValidateJobResponse", False),
    "GetJob": ("GetJobRequest", "Job", False),
    "ListJobs": ("ListJobsRequest", "ListJobsResponse", False),
    "CancelJob": ("CancelJobRequest", "Job", False),
    "DeleteJob": ("DeleteJobRequest", "Job", False),
    "WatchJob": ("WatchJobRequest", "JobEvent", True),
}


class Client:
    """One channel to a server; client.GetJob(job_id=...) calls the RPC with
    a request built from keyword arguments (or request=msg)."""

    def __init__(self, target, token=None, options=None):
        self.pb, self.rpc = protos()
        self.channel = grpc.insecure_channel(target, options=options or [])
        self.token = token
        self.calls = {}
        for name, (req, resp, stream) in METHODS.items():
            make = self.channel.unary_stream if stream else self.channel.unary_unary
            self.calls[name] = (getattr(self.pb, req),
                                make(PATH + name,
                                     request_serializer=getattr(self.pb, req).SerializeToString,
                                     response_deserializer=getattr(self.pb, resp).FromString))

    def metadata(self, token=None):
        tok = self.token if token is None else token
        return [("authorization", "Bearer " + tok)] if tok else []

    def __getattr__(self, name):
        if name not in METHODS:
            raise AttributeError(name)
        req_cls, call = self.calls[name]

        def invoke(request=None, token=None, timeout=10, **fields):
            if request is None:
                request = req_cls(**fields)
            return call(request, metadata=self.metadata(token), timeout=timeout)
        return invoke

    def close(self):
        self.channel.close()


def spec_message(pb, spec):
    """A JobSpec message from the JSON form of a spec (same names)."""
    msg = pb.JobSpec()
    for key, value in spec.items():
        if value is None:
            continue
        if isinstance(value, dict):
            getattr(msg, key).CopyFrom(_sub(getattr(msg, key), value))
        elif isinstance(value, list):
            getattr(msg, key).extend(value)
        else:
            setattr(msg, key, value)
    return msg


def _sub(msg, d):
    for key, value in d.items():
        if isinstance(value, list):
            getattr(msg, key).extend(value)
        elif value is not None:
            setattr(msg, key, value)
    return msg


def error_details(err):
    """(code name, message, {field: description}) of a failed call, from the
    google.rpc.Status in grpc-status-details-bin."""
    _, rpc = protos()
    raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
    fields = {}
    if raw:
        st = rpc.Status.FromString(raw)
        assert st.code == err.code().value[0], (st.code, err.code())
        assert st.message == err.details(), (st.message, err.details())
        for any_ in st.details:
            assert any_.type_url == "type.googleapis.com/google.rpc.BadRequest", any_.type_url
            for v in rpc.BadRequest.FromString(any_.value).field_violations:
                fields[v.field] = v.description
    return err.code().name, err.details(), fields
