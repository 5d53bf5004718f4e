// The UCX backend (ucx_internal.h): one-sided put of registered memory, with a flag word
// written after the data.
#include "absl/strings/str_cat.h"
#include "common/transport/ucx_internal.h"

namespace strata::transport::ucx_internal {

absl::StatusOr<RemoteRegion> UcxTransport::RegisterRegion(void* base, size_t bytes) {
  auto waiter = std::make_shared<Waiter<absl::StatusOr<RemoteRegion>>>();
  if (!Post([this, waiter, base, bytes] {
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = base;
        params.length = bytes;
        ucp_mem_h memh = nullptr;
        ucs_status_t status = ucp_mem_map(context_, &params, &memh);
        if (status != UCS_OK) {
          waiter->Set(UcxError("ucp_mem_map", status));
          return;
        }
        void* packed = nullptr;
        size_t packed_size = 0;
        status = ucp_rkey_pack(context_, memh, &packed, &packed_size);
        if (status != UCS_OK) {
          waiter->Set(UcxError("ucp_rkey_pack", status));
          return;
        }
        RemoteRegion region;
        region.address = reinterpret_cast<uint64_t>(base);
        region.key.assign(static_cast<const char*>(packed), packed_size);
        ucp_rkey_buffer_release(packed);
        mapped_.push_back(memh);  // the mapping lives as long as the transport
        waiter->Set(region);
      })) {
    waiter->Set(ShuttingDown());
  }
  auto result = waiter->Wait(absl::Seconds(30));
  if (!result) return absl::DeadlineExceededError("the transport thread did not answer");
  return *result;
}

void UcxTransport::PutWithFlag(PeerId peer_id, const RemoteRegion& region, uint64_t remote_address,
                               std::span<const uint8_t> data, uint64_t flag_address,
                               uint64_t flag_value, SendDone done) {
  // Kept here too, to answer a put refused at shutdown.
  auto done_box = std::make_shared<SendDone>(std::move(done));
  if (!Post([this, peer_id, region, remote_address, data, flag_address, flag_value,
             done_box]() mutable {
        SendDone done = std::move(*done_box);
        Peer* peer = FindPeer(peer_id);
        if (peer == nullptr || peer->closed || !peer->ready) {
          done(absl::UnavailableError("data-plane peer is not connected"));
          return;
        }
        ucp_rkey_h& rkey = peer->rkeys[region.key];
        if (rkey == nullptr) {
          const ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, region.key.data(), &rkey);
          if (status != UCS_OK) {
            peer->rkeys.erase(region.key);
            done(UcxError("ucp_ep_rkey_unpack", status));
            return;
          }
        }
        ucp_request_param_t plain{};
        void* request =
            ucp_put_nbx(peer->ep, data.data(), data.size(), remote_address, rkey, &plain);
        if (UCS_PTR_IS_ERR(request)) {
          done(UcxError("ucp_put_nbx", UCS_PTR_STATUS(request)));
          return;
        }
        if (request != nullptr) ucp_request_free(request);  // completes in order before the flag
        ucp_worker_fence(worker_);
        auto ctx = std::make_unique<SendContext>();
        ctx->self = this;
        ctx->peer = peer_id;
        ctx->flag = flag_value;
        ctx->done = std::move(done);
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = &UcxTransport::OnSendDone;
        SendContext* raw = ctx.release();
        param.user_data = raw;
        request = ucp_put_nbx(peer->ep, &raw->flag, sizeof(raw->flag), flag_address, rkey, &param);
        if (request == nullptr) {
          OnSendDone(nullptr, UCS_OK, raw);
        } else if (UCS_PTR_IS_ERR(request)) {
          OnSendDone(nullptr, UCS_PTR_STATUS(request), raw);
        }
      })) {
    (*done_box)(ShuttingDown());
  }
}

}  // namespace strata::transport::ucx_internal
