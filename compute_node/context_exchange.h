// Context migration between compute replicas under rotational pipelining (rotation.h).
//
// When a replica has run one slice of a batch's layers (the layers between two
// attentions), the batch's execution context moves to the replica that runs the next
// slice while the attention is away: the residual-stream rows, f32 [rows][hidden]. That is
// all that crosses, because everything else a slice needs is rebuilt from the plan, which
// every replica of the rotation receives (positions, sampling state, grammar state).
//
// A context travels as a kContext frame on the data plane (common/transport/frame.h): the
// same 64-byte header, checksum and epoch as every frame; `layer` is the slice that
// continues and `minibatch` the batch slot. After the rows come the pools whose memory
// nodes have failed the step so far (`flags` of them, uint32 each): their rows go on with
// zero attention and fail alone, and the replicas after expect no answers from them. A replica that
// gives up a step sends a kError frame with the same fields in place of the context it owes
// (SendFailure). A replica's first frame on a connection it makes is a kHello carrying the address
// it listens at, so that the other side knows whose contexts will not come once that connection
// closes (Departed). Each replica listens on its own transport and connects to the others on first
// use.
//
// The receiver checks every frame before keeping it: header, kind, epoch, size against the
// rows it claims, checksum. A malformed frame, or a stale one (of a step this replica has
// already finished with, or from an older epoch), is dropped and counted; the slice that
// waits for it then misses its deadline and fails its batch with a clear error. Contexts
// that come before the replica has the plan are kept, up to kMaxHeld.
//
// Thread-safety: thread-safe; `on_arrival` runs on the transport thread.
#ifndef STRATA_COMPUTE_NODE_CONTEXT_EXCHANGE_H_
#define STRATA_COMPUTE_NODE_CONTEXT_EXCHANGE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/protocol/step_plan.h"
#include "common/transport/frame.h"
#include "common/transport/transport.h"

namespace strata {

struct ContextExchangeOptions {
  transport::TransportConfig transport;
  std::string listen_address = "127.0.0.1:0";
  int64_t hidden = 0;  // floats per row
  bool verify_checksums = true;
  std::function<void()> on_arrival;  // a context came (or a peer left); may be empty
};

struct ContextExchangeStats {
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rejected = 0;  // malformed: header, kind, size or checksum
  uint64_t stale = 0;     // another epoch, or a step already finished with
};

// A lane's endpoint id (remote_attention.h) for batch slot `batch` of the replica whose
// context exchange listens at `address`: the same on every node that computes it.
uint64_t RotationEndpoint(const std::string& address, int batch);

class ContextExchange : public transport::MessageHandler {
 public:
  static constexpr size_t kMaxHeld = 64;
  static constexpr size_t kMaxHelloBytes = 1024;   // a listen address
  static constexpr size_t kMaxFailedPools = 1024;  // pools a context names as failed
  static constexpr size_t kMaxDepartures = 64;     // replicas Depart remembers

  static absl::StatusOr<std::unique_ptr<ContextExchange>> Create(ContextExchangeOptions options);
  ~ContextExchange() override;

  const std::string& address() const { return address_; }
  void SetEpoch(uint64_t epoch);
  // Sends rows [0, m) of `x` to the replica listening at `to`, as the context of `slice` of
  // step `step_id` in batch slot `batch`, with the pools whose memory nodes have failed the
  // step (at most kMaxFailedPools). The rows are copied. Unavailable at once, without a
  // connection attempt, where the scheduler declared that replica dead for the step
  // (Depart): connecting to a hung replica would hold the caller until the connect
  // timeout.
  absl::Status Send(const std::string& to, uint64_t step_id, int slice, int batch, const float* x,
                    int64_t m, std::span<const PoolIndex> failed_pools = {});
  // Tells the replica at `to` that the context of `slice` of step `step_id` in batch slot
  // `batch` will not come, and why (`why`, not OK): a kError frame in place of the kContext
  // frame, so that the replica gives up at once rather than at its hand-off deadline. Refused
  // as Send is, to a replica declared dead.
  absl::Status SendFailure(const std::string& to, uint64_t step_id, int slice, int batch,
                           const absl::Status& why);
  // A context, or a failure in its place, has come.
  bool Arrived(int batch, uint64_t step_id, int slice) const;
  // A failure has come in place of that context.
  bool FailureArrived(int batch, uint64_t step_id, int slice) const;
  // That context has come and names pools whose memory nodes failed the step.
  bool ArrivedWithFailedPools(int batch, uint64_t step_id, int slice) const;
  // What the replica listening at `address` owes of step `step_id` will not come: it
  // connected to this one and has gone since (its connection closed: its process ended, or
  // it disconnected), or the scheduler declared it dead after it was sent that step (Depart).
  bool Departed(const std::string& address, uint64_t step_id) const;
  // The scheduler declared the replica at `address` dead (ComputeConfig::departed_replicas):
  // a hung replica keeps its connections open, so nothing else tells this one. The contexts
  // it owes of steps up to `through_step` will not come; later steps, should it come back at
  // the same address, are not affected. At most kMaxDepartures addresses are kept (the
  // oldest go first); a new epoch forgets them. Wakes the driver (on_arrival).
  void Depart(const std::string& address, uint64_t through_step);
  // What comes with a context besides its rows.
  struct Taken {
    std::vector<PoolIndex> failed_pools;  // whose memory nodes failed the step so far
    absl::Time arrived;                   // when it came
  };
  // Moves the context into x (m rows), and what came with it into `taken`: NotFound if it
  // has not come, DataLoss if it has another number of rows, and the sender's status where
  // a failure came in its place.
  absl::Status Take(int batch, uint64_t step_id, int slice, float* x, int64_t m, Taken* taken);
  // This replica is done with batch slot `batch` up to `step_id`: what is held of those
  // steps goes, and what comes of them later is stale.
  void Retire(int batch, uint64_t step_id);
  ContextExchangeStats stats() const;

  std::span<uint8_t> Place(transport::PeerId from, std::span<const uint8_t> header,
                           size_t payload_bytes) override;
  void Deliver(transport::PeerId from, std::span<const uint8_t> header,
               std::span<const uint8_t> payload, absl::Status status) override;

 private:
  explicit ContextExchange(ContextExchangeOptions options) : options_(std::move(options)) {}
  // Depart's part of Departed (mu_ held).
  bool DeclaredDeadLocked(const std::string& address, uint64_t step_id) const;
  // Unavailable if the scheduler declared the replica at `to` dead for step `step_id`.
  absl::Status CheckNotDeclaredDead(const std::string& to, uint64_t step_id) const;
  // The connection to the replica at `address`, made now if there is none, for a frame of
  // step `step_id`. The attempt runs on a thread of its own, and the caller stops waiting
  // for it (Unavailable) once the scheduler declares that replica dead for the step: a hung
  // replica holds an attempt until the connect timeout.
  absl::StatusOr<transport::PeerId> PeerFor(const std::string& address, uint64_t step_id);
  struct Attempt {
    bool done = false;  // guarded by mu_, as is status
    absl::Status status;
  };
  // On a connecting thread: connects to `address` and says hello, then ends `attempt`.
  void ConnectTo(const std::string& address, std::shared_ptr<Attempt> attempt);
  // Sends `h` with `text` as its payload (its size and checksum set from it), kept until
  // the transport is done with it.
  void SendText(transport::PeerId peer, transport::FrameHeader h,
                std::shared_ptr<const std::string> text);
  // The kContext header of `body` (`rows` rows of floats, then `failed_pools` pool ids),
  // counted as sent.
  transport::FrameHeader HeaderOf(uint64_t step_id, int slice, int batch, int64_t rows,
                                  size_t failed_pools, std::span<const uint8_t> body);

  using Key = std::tuple<int, uint64_t, int>;  // batch, step, slice
  struct Held {
    uint32_t rows = 0;
    std::vector<float> x;
    std::vector<PoolIndex> failed_pools;
    absl::Time arrived;
    absl::Status failed;   // a failure came in place of the context
    uint64_t arrival = 0;  // order of arrival, for dropping the oldest
  };

  ContextExchangeOptions options_;
  std::unique_ptr<transport::Transport> transport_;
  std::string address_;

  mutable std::mutex mu_;
  uint64_t epoch_ = 0;
  std::unordered_map<std::string, transport::PeerId> peers_;  // connections made here
  // Connection attempts in progress, by address (one at a time per address), their threads
  // (joined once their attempt is done, when the next one starts, or by the destructor), and
  // what wakes their callers: an attempt ended, or a replica was declared dead.
  std::unordered_map<std::string, std::shared_ptr<Attempt>> connecting_;
  struct ConnectThread {
    std::thread thread;
    std::shared_ptr<const Attempt> attempt;
  };
  std::list<ConnectThread> connect_threads_;
  std::condition_variable connect_cv_;
  bool stopping_ = false;
  // Connections made to here, by the address their replica listens at (its kHello).
  std::unordered_map<transport::PeerId, std::string> inbound_;
  std::set<std::string> departed_;
  // Depart's: the last step each departed replica was sent, and the order they came in.
  std::unordered_map<std::string, uint64_t> departed_through_;
  std::deque<std::string> departure_order_;
  std::map<Key, Held> held_;
  std::unordered_map<int, uint64_t> retired_;  // batch -> last step finished with
  ContextExchangeStats stats_;
  uint64_t arrivals_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMPUTE_NODE_CONTEXT_EXCHANGE_H_
