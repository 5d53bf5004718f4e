// The UCX backend (ucx_internal.h): sending and receiving active messages, delivered to
// their handlers in arrival order.
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/transport/handshake.h"
#include "common/transport/ucx_internal.h"

namespace strata::transport::ucx_internal {

ucs_status_t UcxTransport::OnMessage(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* tag_arg = static_cast<TagArg*>(arg);
  UcxTransport* self = tag_arg->self;
  const Tag tag = tag_arg->tag;
  PeerId id = 0;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
    auto it = self->by_endpoint_.find(param->reply_ep);
    if (it != self->by_endpoint_.end()) id = it->second;
  }
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  Peer* peer = id == 0 ? nullptr : self->FindPeer(id);
  if (peer == nullptr || peer->closed) {
    LOG_FIRST_N(WARNING, 10) << "dropped a data-plane message from an unknown endpoint";
    return UCS_OK;  // a rendezvous descriptor is dropped with it
  }
  const std::span<const uint8_t> header_bytes(static_cast<const uint8_t*>(header), header_length);
  if (tag == 0) {
    self->HandleHandshake(id, header_bytes);
    return UCS_OK;
  }
  MessageHandler* handler = self->HandlerFor(tag);
  if (handler == nullptr || !peer->ready) {
    LOG_FIRST_N(WARNING, 10) << "dropped a data-plane message with tag " << tag
                             << (handler == nullptr ? " (no handler)" : " (before handshake)");
    return UCS_OK;
  }
  const uint64_t sequence = peer->next_arrival++;
  std::span<uint8_t> dest = handler->Place(id, header_bytes, length);
  const bool bad_place = !dest.empty() && dest.size() != length;
  const bool too_large = dest.empty() && length > self->config_.max_held_bytes;
  if (!rendezvous && !bad_place && !too_large && sequence == peer->next_delivery) {
    // Nothing earlier is outstanding: deliver now, from UCX's buffer if nothing was placed.
    ++peer->next_delivery;
    if (dest.empty()) {
      handler->Deliver(id, header_bytes, {static_cast<const uint8_t*>(data), length},
                       absl::OkStatus());
    } else {
      std::memcpy(dest.data(), data, length);
      handler->Deliver(id, header_bytes, dest, absl::OkStatus());
    }
    self->Flush(id);
    return UCS_OK;
  }
  auto owned_ctx = std::make_unique<RecvContext>();
  RecvContext* ctx = owned_ctx.get();
  ctx->self = self;
  ctx->peer = id;
  ctx->tag = tag;
  ctx->sequence = sequence;
  ctx->header.assign(header_bytes.begin(), header_bytes.end());
  ctx->dest = dest;
  peer->pending[sequence] = std::move(owned_ctx);
  if (bad_place || too_large) {
    ctx->dest = {};
    ctx->complete = true;
    ctx->status = bad_place ? absl::InternalError("the receiver placed a payload at a wrong size")
                            : absl::InvalidArgumentError(absl::StrCat(
                                  "a message of ", length, " bytes, past the ",
                                  self->config_.max_held_bytes, " this receiver holds"));
    self->Flush(id);
    return UCS_OK;  // a rendezvous payload is dropped unread
  }
  if (ctx->dest.empty()) {
    ctx->owned.resize(length);
    ctx->dest = {ctx->owned.data(), length};
  }
  if (!rendezvous) {
    // Held behind an earlier message: keep a copy.
    std::memcpy(ctx->dest.data(), data, length);
    ctx->complete = true;
    self->Flush(id);
    return UCS_OK;
  }
  ucp_request_param_t recv{};
  recv.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  recv.cb.recv_am = &UcxTransport::OnRecvDone;
  recv.user_data = ctx;
  recv.datatype = ucp_dt_make_contig(1);
  void* request = ucp_am_recv_data_nbx(self->worker_, data, ctx->dest.data(), length, &recv);
  if (request == nullptr) {
    OnRecvDone(nullptr, UCS_OK, length, ctx);
  } else if (UCS_PTR_IS_ERR(request)) {
    OnRecvDone(nullptr, UCS_PTR_STATUS(request), 0, ctx);
  }
  return UCS_INPROGRESS;
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<RecvContext*>(user_data);
  if (request != nullptr) ucp_request_free(request);
  ctx->complete = true;
  ctx->status = status == UCS_OK ? absl::OkStatus() : UcxError("receive failed", status);
  ctx->self->Flush(ctx->peer);
}

MessageHandler* UcxTransport::HandlerFor(Tag tag) {
  std::lock_guard<std::mutex> lock(mu_);
  return handlers_[tag];
}

void UcxTransport::Flush(PeerId id) {
  Peer* peer = FindPeer(id);
  if (peer == nullptr) return;
  while (!peer->pending.empty()) {
    auto it = peer->pending.begin();
    if (it->first != peer->next_delivery || !it->second->complete) return;
    std::unique_ptr<RecvContext> ctx = std::move(it->second);
    peer->pending.erase(it);
    ++peer->next_delivery;
    MessageHandler* handler = HandlerFor(ctx->tag);
    handler->Deliver(id, ctx->header, ctx->dest, ctx->status);
  }
}

void UcxTransport::Send(PeerId peer, Tag tag, std::span<const uint8_t> header,
                        std::vector<std::span<const uint8_t>> payload, SendDone done) {
  auto ctx = std::make_unique<SendContext>();
  ctx->self = this;
  ctx->peer = peer;
  ctx->header.assign(header.begin(), header.end());
  for (const auto& part : payload) {
    if (part.empty()) continue;
    ctx->iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
  }
  ctx->done = std::move(done);
  // On the transport thread, or a handler answering on a thread in ProgressUntil: the
  // worker is already ours.
  if (WorkerIsOurs()) {
    const bool over = StartSend(std::move(ctx), tag);
    // A send left pending inside ProgressUntil: it wakes the loop on the way out.
    if (!over && progressing_ == this) sent_while_progressing_ = true;
    return;
  }
  // Start the send on this thread when the worker is free and nothing is queued before
  // it (which keeps the order), without waiting for the transport thread. That thread may
  // be asleep on an armed worker (Wait). A send that finds the peer's shared-memory FIFO
  // full stays pending and needs the worker progressed, which no event announces: it (and
  // the answer it waits for) sat until Wait's one-second bound, seen as one-second stalls
  // of compute nodes. So the transport thread is woken after a send left pending, to
  // progress and arm again. A send that is over at once (most are: a small message copied
  // out, or an error) leaves the worker nothing to progress, and the thread sleeps on: a
  // wake-up saved per message (docs/benchmarks.md, "No wake-up after a send that is over").
  {
    std::unique_lock<std::mutex> worker_lock(worker_mu_, std::try_to_lock);
    if (worker_lock.owns_lock() && loop_.NothingPosted()) {
      outside_uses_.fetch_add(1);
      const bool over = StartSend(std::move(ctx), tag);
      worker_lock.unlock();
      if (!over) Wake();
      return;
    }
  }
  SendContext* raw = ctx.release();
  if (!Post([this, raw, tag] { StartSend(std::unique_ptr<SendContext>(raw), tag); })) {
    std::unique_ptr<SendContext> refused(raw);
    refused->done(ShuttingDown());
  }
}

bool UcxTransport::StartSend(std::unique_ptr<SendContext> ctx, Tag tag) {
  Peer* peer = FindPeer(ctx->peer);
  if (peer == nullptr || peer->closed || peer->ep == nullptr || (tag != 0 && !peer->ready)) {
    ctx->done(
        absl::UnavailableError(absl::StrCat("data-plane peer ", ctx->peer, " is not connected")));
    return true;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxTransport::OnSendDone;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  size_t payload_bytes = 0;
  for (const ucp_dt_iov_t& part : ctx->iov) payload_bytes += part.length;
  if (payload_bytes <= eager_max_bytes_) param.flags |= UCP_AM_SEND_FLAG_EAGER;
  const void* buffer = nullptr;
  size_t count = 0;
  if (ctx->iov.size() == 1) {
    param.datatype = ucp_dt_make_contig(1);
    buffer = ctx->iov[0].buffer;
    count = ctx->iov[0].length;
  } else if (ctx->iov.size() > 1) {
    param.datatype = ucp_dt_make_iov();
    buffer = ctx->iov.data();
    count = ctx->iov.size();
  } else {
    param.datatype = ucp_dt_make_contig(1);
  }
  SendContext* raw = ctx.release();
  param.user_data = raw;
  void* request =
      ucp_am_send_nbx(peer->ep, tag, raw->header.data(), raw->header.size(), buffer, count, &param);
  if (request == nullptr) {
    OnSendDone(nullptr, UCS_OK, raw);
    return true;
  }
  if (UCS_PTR_IS_ERR(request)) {
    OnSendDone(nullptr, UCS_PTR_STATUS(request), raw);
    return true;
  }
  return false;
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendContext> ctx(static_cast<SendContext*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  ctx->done(status == UCS_OK ? absl::OkStatus() : UcxError("send failed", status));
}

}  // namespace strata::transport::ucx_internal
