/* comm_gloo.cc - the Gloo backend: CPU ranks on several hosts, over Gloo's
 * TCP transport (the library PyTorch uses for CPU collectives), behind the
 * comm interface. A C++ shim: Gloo is C++, so this file is the only one that
 * sees it, catches every exception at its edge and gives comm.c the C ops
 * table of comm_impl.h.
 *
 * Rendezvous "gloo:file:<dir>": the ranks exchange their TCP addresses
 * through Gloo's FileStore in <dir>, a folder every rank sees (a shared
 * file system across nodes). "gloo:http:<url>": through the control
 * server's rendezvous keys of the attempt (<url> is .../v1/jobs/<id>/
 * attempts/<n>/rendezvous; PUT to publish, a waiting GET to read, with the
 * job's token, RANKENV_TOKEN), no shared folder needed. Each rank listens
 * on RANKENV_GLOO_HOST (a name or address of this node; unset: this
 * machine's hostname).
 *
 * The collectives are written on Gloo's point-to-point transport (unbound
 * buffers), not on its algorithms, so that sums are made exactly as the shm
 * backend makes them: every element once, by one rank, in rank order
 * ((r0 + r1) + r2 ...). A job therefore gives bitwise the same results on
 * shm (ranks on one node) and on gloo (ranks on many), whatever the world
 * size:
 *   all_gather      every rank sends its block to every other rank
 *   reduce_scatter  rank p sends its block r to rank r; rank r adds the
 *                   world's blocks in rank order
 *   all_reduce      reduce_scatter of the buffer's dim-0 split, then an
 *                   all_gather of the sums
 *   broadcast       root sends to every rank
 *   barrier         a one-byte exchange between every pair
 * A failure (a peer's connection closed, the timeout passed) breaks the
 * communicator. A lost connection is blamed on the rank at its far end; Gloo
 * may surface one rank's death as the loss of a connection between two
 * others, so the blame is a lead, not a verdict (the launcher, which sees
 * exit statuses, names the rank that died). A timeout is blamed on the
 * first rank that had not delivered. */
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <signal.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include "common/errors.h"
#include "common/rankenv.h"
#include "worker/dist/comm_impl.h"
}

namespace {

/* Gloo's key-value store over trainyardd's rendezvous endpoints. Keys are
 * hex-encoded (the server takes [A-Za-z0-9._-]); a wait is a series of
 * waiting GETs of at most 60 s each, until its timeout. */
class HttpStore : public gloo::rendezvous::Store {
 public:
  HttpStore(std::string base, std::string token) : base_(std::move(base)) {
    curl_ = curl_easy_init();
    if (!curl_) throw std::runtime_error("curl_easy_init failed");
    auth_ = curl_slist_append(nullptr, ("Authorization: Bearer " + token).c_str());
    auth_ = curl_slist_append(auth_, "Content-Type: application/octet-stream");
  }
  ~HttpStore() override {
    curl_slist_free_all(auth_);
    curl_easy_cleanup(curl_);
  }

  void set(const std::string &key, const std::vector<char> &data) override {
    long status = request(key, "PUT", &data, 0, nullptr);
    if (status != 204)
      throw std::runtime_error("rendezvous PUT of " + key + " answered " + std::to_string(status) +
                               ": " + body_);
  }

  std::vector<char> get(const std::string &key) override {
    std::vector<char> out;
    if (!fetch(key, std::chrono::milliseconds(kDefaultTimeout), &out))
      throw std::runtime_error("Wait timeout for rendezvous key " + key);
    return out;
  }

  void wait(const std::vector<std::string> &keys) override { wait(keys, kDefaultTimeout); }

  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override {
    std::vector<char> out;
    for (const auto &k : keys)
      if (!fetch(k, timeout, &out))
        throw std::runtime_error("Wait timeout for rendezvous key " + k);
  }

 private:
  static size_t collect(char *p, size_t size, size_t n, void *ctx) {
    static_cast<std::string *>(ctx)->append(p, size * n);
    return size * n;
  }

  /* One request; its HTTP status (0: no answer), the body in body_. */
  long request(const std::string &key, const char *method, const std::vector<char> *data,
               long wait_s, std::string *url_out) {
    static const char hex[] = "0123456789abcdef";
    std::string k;
    for (unsigned char ch : key) {
      k += hex[ch >> 4];
      k += hex[ch & 15];
    }
    std::string url = base_ + "/" + k;
    if (!data) url += "?timeout_s=" + std::to_string(wait_s);
    if (url_out) *url_out = url;
    body_.clear();
    curl_easy_reset(curl_);
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, auth_);
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &body_);
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT, (long)(wait_s + 30));
    if (data) {
      curl_easy_setopt(curl_, CURLOPT_CUSTOMREQUEST, method);
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, data->empty() ? "" : data->data());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, (long)data->size());
    }
    if (curl_easy_perform(curl_) != CURLE_OK) return 0;
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    return status;
  }

  /* The key's value into *out once published, waiting up to timeout;
   * false when it was not. A refusal (another job's token, an ended
   * attempt) is thrown at once. */
  bool fetch(const std::string &key, std::chrono::milliseconds timeout, std::vector<char> *out) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left =
          std::chrono::duration_cast<std::chrono::seconds>(until - std::chrono::steady_clock::now())
              .count();
      long wait_s = left < 0 ? 0 : left > 60 ? 60 : left;
      long status = request(key, "GET", nullptr, wait_s, nullptr);
      if (status == 200) {
        out->assign(body_.begin(), body_.end());
        return true;
      }
      if (status != 404 && status != 0)
        throw std::runtime_error("rendezvous GET of " + key + " answered " +
                                 std::to_string(status) + ": " + body_);
      if (std::chrono::steady_clock::now() >= until) return false;
      if (status == 0) usleep(100000); /* no answer: the server restarts? ask again */
    }
  }

  std::string base_, body_;
  CURL *curl_ = nullptr;
  struct curl_slist *auth_ = nullptr;
};

struct gloo_state {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::vector<float> scratch; /* reduce_scatter's received blocks; grows only */
  std::vector<bool> done;     /* per peer: delivered in the current call */
  std::vector<bool> sent;     /* per peer: took what this rank sent it */
  /* Per peer p: the address of p's end of our connection, as Gloo names it
   * in the errors of that connection ("[10.0.0.2]:41023"). */
  std::vector<std::string> peer_addr;
};

gloo_state *state(comm_t *c) {
  return static_cast<gloo_state *>(c->impl);
}

std::chrono::milliseconds timeout(const comm_t *c) {
  return std::chrono::milliseconds(c->timeout_ms);
}

/* The first peer whose part of the current call had not arrived: the rank
 * a failure is blamed on (-1 when every peer had delivered). */
int first_missing(comm_t *c) {
  gloo_state *s = state(c);
  for (int r = 0; r < c->world; r++)
    if (r != c->rank && !s->done[(size_t)r]) return r;
  /* Every receive was in: a send was left, to a peer that stopped taking. */
  for (int r = 0; r < c->world; r++)
    if (r != c->rank && !s->sent[(size_t)r]) return r;
  return -1;
}

/* The peer whose connection an error names, or -1. */
int named_peer(comm_t *c, const char *what) {
  gloo_state *s = state(c);
  for (int r = 0; r < c->world; r++) {
    const std::string &a = s->peer_addr[(size_t)r];
    if (r != c->rank && !a.empty() && std::strstr(what, a.c_str())) return r;
  }
  return -1;
}

/* Turns the exception of a failed call into the communicator's sticky
 * error: TY_EDEADLINE when Gloo's wait timed out, else TY_EABORTED (a peer
 * closed its connection: it died or left). A lost connection is blamed on
 * the peer at its other end, a timeout on the first peer that had not
 * delivered. */
int fail_from(comm_t *c, const char *op, const std::exception &e) {
  const char *what = e.what();
  int late = std::strstr(what, "Timed out") || std::strstr(what, "timed out");
  int blame = late ? -1 : named_peer(c, what);
  if (blame < 0) blame = first_missing(c);
  if (late) {
    return comm_fail(c, TY_EDEADLINE, blame,
                     "gloo %s: rank %d did not arrive within %d ms (%s; %s)", op, blame,
                     c->timeout_ms, rankenv_name(RANKENV_COMM_TIMEOUT_MS), what);
  }
  return comm_fail(c, TY_EABORTED, blame, "gloo %s: rank %d is gone (%s)", op, blame, what);
}

/* Waits for n receives into rbuf, marking each peer whose part arrived.
 * Throws what Gloo throws (a closed connection, the timeout). */
void wait_recvs(comm_t *c, gloo::transport::UnboundBuffer *rbuf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int from = -1;
    if (!rbuf->waitRecv(&from, timeout(c))) throw std::runtime_error("receive aborted");
    if (from >= 0 && from < c->world) state(c)->done[(size_t)from] = true;
  }
}

/* Waits for n sends from sbuf, marking each peer that took its part. */
void wait_sends(comm_t *c, gloo::transport::UnboundBuffer *sbuf, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int to = -1;
    if (!sbuf->waitSend(&to, timeout(c))) throw std::runtime_error("send aborted");
    if (to >= 0 && to < c->world) state(c)->sent[(size_t)to] = true;
  }
}

/* Posts sbuf's send to peer p, as not yet taken. */
void post_send(comm_t *c, gloo::transport::UnboundBuffer *sbuf, int p, uint64_t slot) {
  state(c)->sent[(size_t)p] = false;
  sbuf->send(p, slot);
}

void reset_done(comm_t *c) {
  gloo_state *s = state(c);
  std::fill(s->done.begin(), s->done.end(), false);
  s->done[(size_t)c->rank] = true;
  std::fill(s->sent.begin(), s->sent.end(), true);
}

int gloo_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts, size_t total) {
  gloo_state *s = state(c);
  const int world = c->world, me = c->rank;
  const size_t mine = comm_displ(counts, me);
  if (counts[me] && recv + mine != send) std::memcpy(recv + mine, send, counts[me] * sizeof(float));
  reset_done(c);
  try {
    const uint64_t slot = s->ctx->nextSlot();
    std::unique_ptr<gloo::transport::UnboundBuffer> rbuf, sbuf;
    size_t n_recv = 0, n_send = 0;
    if (total) {
      rbuf = s->ctx->createUnboundBuffer(recv, total * sizeof(float));
      for (int p = 0; p < world; p++) {
        if (p == me) continue;
        if (counts[p]) {
          rbuf->recv(p, slot, comm_displ(counts, p) * sizeof(float), counts[p] * sizeof(float));
          n_recv++;
        } else {
          s->done[(size_t)p] = true;
        }
      }
    }
    if (counts[me]) {
      sbuf = s->ctx->createUnboundBuffer(recv + mine, counts[me] * sizeof(float));
      for (int p = 0; p < world; p++) {
        if (p == me) continue;
        post_send(c, sbuf.get(), p, slot);
        n_send++;
      }
    }
    if (n_recv) wait_recvs(c, rbuf.get(), n_recv);
    if (n_send) wait_sends(c, sbuf.get(), n_send);
  } catch (const std::exception &e) {
    return fail_from(c, "all_gather", e);
  }
  return 0;
}

int gloo_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts,
                        size_t total) {
  gloo_state *s = state(c);
  const int world = c->world, me = c->rank;
  const size_t n = counts[me];
  (void)total;
  reset_done(c);
  try {
    if (s->scratch.size() < n * (size_t)world) s->scratch.resize(n * (size_t)world);
    float *blocks = s->scratch.data(); /* block of rank p at p * n */
    const uint64_t slot = s->ctx->nextSlot();
    std::unique_ptr<gloo::transport::UnboundBuffer> rbuf;
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sbufs;
    size_t n_recv = 0;
    if (n) {
      std::memcpy(blocks + (size_t)me * n, send + comm_displ(counts, me), n * sizeof(float));
      rbuf = s->ctx->createUnboundBuffer(blocks, n * (size_t)world * sizeof(float));
      for (int p = 0; p < world; p++) {
        if (p == me) continue;
        rbuf->recv(p, slot, (size_t)p * n * sizeof(float), n * sizeof(float));
        n_recv++;
      }
    } else {
      std::fill(s->done.begin(), s->done.end(), true);
    }
    for (int r = 0; r < world; r++) {
      if (r == me || !counts[r]) continue;
      sbufs.push_back(s->ctx->createUnboundBuffer(const_cast<float *>(send) + comm_displ(counts, r),
                                                  counts[r] * sizeof(float)));
      post_send(c, sbufs.back().get(), r, slot);
    }
    if (n_recv) wait_recvs(c, rbuf.get(), n_recv);
    for (auto &b : sbufs) wait_sends(c, b.get(), 1);
    if (n) {
      /* ((b0 + b1) + b2) + ..., as comm_shm_coll.c's sum_ranks. */
      if (world == 1) {
        std::memcpy(recv, blocks, n * sizeof(float));
      } else {
        const float *b0 = blocks, *b1 = blocks + n;
        for (size_t i = 0; i < n; i++) recv[i] = b0[i] + b1[i];
        for (int p = 2; p < world; p++) {
          const float *bp = blocks + (size_t)p * n;
          for (size_t i = 0; i < n; i++) recv[i] += bp[i];
        }
      }
    }
  } catch (const std::exception &e) {
    return fail_from(c, "reduce_scatter", e);
  }
  return 0;
}

int gloo_all_reduce(comm_t *c, float *buf, size_t count) {
  std::vector<size_t> counts((size_t)c->world);
  comm_shard_counts(count, 1, c->world, counts.data());
  float *mine = buf + comm_displ(counts.data(), c->rank);
  int rc = gloo_reduce_scatter(c, buf, mine, counts.data(), count);
  if (rc) return rc;
  return gloo_all_gather(c, mine, buf, counts.data(), count);
}

int gloo_broadcast(comm_t *c, float *buf, size_t count, int root) {
  gloo_state *s = state(c);
  reset_done(c);
  if (!count) return 0;
  try {
    const uint64_t slot = s->ctx->nextSlot();
    auto b = s->ctx->createUnboundBuffer(buf, count * sizeof(float));
    if (c->rank == root) {
      for (int p = 0; p < c->world; p++) {
        if (p == root) continue;
        post_send(c, b.get(), p, slot);
      }
      wait_sends(c, b.get(), (size_t)c->world - 1);
    } else {
      /* Only the root is waited for. */
      std::fill(s->done.begin(), s->done.end(), true);
      s->done[(size_t)root] = false;
      b->recv(root, slot);
      wait_recvs(c, b.get(), 1);
    }
  } catch (const std::exception &e) {
    return fail_from(c, "broadcast", e);
  }
  return 0;
}

int gloo_barrier(comm_t *c) {
  gloo_state *s = state(c);
  const int world = c->world, me = c->rank;
  reset_done(c);
  if (world == 1) return 0;
  try {
    const uint64_t slot = s->ctx->nextSlot();
    char out = 1;
    std::vector<char> in((size_t)world);
    auto sbuf = s->ctx->createUnboundBuffer(&out, 1);
    auto rbuf = s->ctx->createUnboundBuffer(in.data(), in.size());
    for (int p = 0; p < world; p++) {
      if (p == me) continue;
      rbuf->recv(p, slot, (size_t)p, 1);
      post_send(c, sbuf.get(), p, slot);
    }
    wait_recvs(c, rbuf.get(), (size_t)world - 1);
    wait_sends(c, sbuf.get(), (size_t)world - 1);
  } catch (const std::exception &e) {
    return fail_from(c, "barrier", e);
  }
  return 0;
}

void gloo_close(comm_t *c) {
  gloo_state *s = state(c);
  if (!s) return;
  try {
    s->ctx.reset();
  } catch (...) {
    /* Closing a broken mesh may throw; the sockets are closed either way. */
  }
  delete s;
  c->impl = nullptr;
}

/* In comm_ops_t's order; the queued collectives and the stream waits are
 * left to the dispatcher (host buffers, done before returning). */
const comm_ops_t gloo_ops = {
    "gloo",
    gloo_all_gather,
    gloo_reduce_scatter,
    gloo_all_reduce,
    gloo_broadcast,
    gloo_barrier,
    nullptr /* all_gather_queue */,
    nullptr /* reduce_scatter_queue */,
    nullptr /* stream */,
    nullptr /* wait_event */,
    nullptr /* drain */,
    gloo_close,
};

}  // namespace

extern "C" int comm_gloo_open(comm_t *c, const char *arg, char *err, size_t errlen) {
  const bool http = std::strncmp(arg, "http:", 5) == 0 && arg[5];
  if (!http && (std::strncmp(arg, "file:", 5) != 0 || !arg[5])) {
    return ty_errf(err, errlen, TY_EINVAL,
                   "rendezvous 'gloo:%s': use gloo:file:<dir>, a folder every rank sees, or "
                   "gloo:http:<url> of trainyardd's rendezvous keys",
                   arg);
  }
  const std::string dir(arg + 5);
  struct stat st;
  if (http && !rankenv_str(RANKENV_TOKEN)) {
    return ty_errf(err, errlen, TY_EINVAL, "rendezvous 'gloo:%s' needs the job's token in %s", arg,
                   rankenv_name(RANKENV_TOKEN));
  }
  if (!http && (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    return ty_errf(err, errlen, TY_ENOTFOUND,
                   "gloo rendezvous folder '%s' does not exist (create it on a file system "
                   "every rank sees before starting the ranks)",
                   dir.c_str());
  }
  /* Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer
   * that died would kill this rank with SIGPIPE instead of failing the
   * collective. Ignored here unless the program handles it itself. */
  struct sigaction old;
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  const char *host = rankenv_str(RANKENV_GLOO_HOST);
  auto *s = new gloo_state();
  s->done.assign((size_t)c->world, false);
  s->sent.assign((size_t)c->world, true);
  try {
    gloo::transport::tcp::attr attr;
    if (host && *host) attr.hostname = host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (http)
      base.reset(new HttpStore(dir, rankenv_str(RANKENV_TOKEN)));
    else
      base.reset(new gloo::rendezvous::FileStore(dir));
    gloo::rendezvous::PrefixStore store("trainyard", *base);
    s->ctx = std::make_shared<gloo::rendezvous::Context>(c->rank, c->world);
    s->ctx->setTimeout(timeout(c));
    s->ctx->connectFullMesh(store, dev);
    /* Each rank publishes its end of every connection, so that an error
     * naming a connection's far end can be blamed on the rank there. */
    const std::string me = std::to_string(c->rank);
    for (int p = 0; p < c->world; p++) {
      if (p == c->rank) continue;
      std::string a = s->ctx->getPair(p)->address().str();
      store.set("end-" + me + "-" + std::to_string(p), std::vector<char>(a.begin(), a.end()));
    }
    s->peer_addr.assign((size_t)c->world, std::string());
    for (int p = 0; p < c->world; p++) {
      if (p == c->rank) continue;
      const std::string key = "end-" + std::to_string(p) + "-" + me;
      store.wait({key}, timeout(c));
      std::vector<char> v = store.get(key);
      s->peer_addr[(size_t)p].assign(v.begin(), v.end());
    }
  } catch (const std::exception &e) {
    delete s;
    const char *what = e.what();
    int late = std::strstr(what, "Timed out") || std::strstr(what, "timed out") ||
               std::strstr(what, "Wait timeout");
    return ty_errf(err, errlen, late ? TY_EDEADLINE : TY_EUNAVAILABLE,
                   "gloo rendezvous in '%s' as rank %d of %d%s%s: %s%s%s%s", dir.c_str(), c->rank,
                   c->world, host && *host ? " on " : "", host && *host ? host : "", what,
                   late ? " (not every rank joined within " : "",
                   late ? rankenv_name(RANKENV_COMM_TIMEOUT_MS) : "", late ? ")" : "");
  }
  c->impl = s;
  c->ops = &gloo_ops;
  return 0;
}
