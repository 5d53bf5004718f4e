#include "server/api/api_error.h"

#include "nlohmann/json.hpp"

namespace strata::api {

std::string ApiError::ToJson() const {
  nlohmann::json error = {
      {"message", message},
      {"type", type},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
      {"code", status}};
  return nlohmann::json({{"error", error}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param) {
  return {400, "invalid_request_error", std::move(message), std::move(param)};
}

ApiError NotFound(std::string message) { return {404, "not_found_error", std::move(message), ""}; }

ApiError Unauthorized(std::string message) {
  return {401, "authentication_error", std::move(message), ""};
}

ApiError Overloaded(std::string message) {
  return {503, "server_overloaded", std::move(message), ""};
}

ApiError UnknownModel(const std::string& model) {
  return NotFound("The model `" + model + "` does not exist.");
}

ApiError FromStatus(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return BadRequest(message);
    case absl::StatusCode::kResourceExhausted:
      return {429, "rate_limit_error", message, ""};
    case absl::StatusCode::kUnavailable:
      return Overloaded(message);
    case absl::StatusCode::kNotFound:
      return NotFound(message);
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "timeout_error", message, ""};
    case absl::StatusCode::kCancelled:
      return {499, "cancelled", message, ""};
    default:
      return {500, "internal_error", message, ""};
  }
}

}  // namespace strata::api
