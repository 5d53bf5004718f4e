// Errors of the HTTP API, in OpenAI's shape:
//   {"error": {"message": "...", "type": "...", "param": "...", "code": 400}}
#ifndef STRATA_SERVER_API_API_ERROR_H_
#define STRATA_SERVER_API_API_ERROR_H_

#include <string>

#include "absl/status/status.h"

namespace strata::api {

struct ApiError {
  int status = 400;
  std::string type;  // "invalid_request_error", "authentication_error", ...
  std::string message;
  std::string param;  // empty: null

  std::string ToJson() const;
};

ApiError BadRequest(std::string message, std::string param = "");
ApiError NotFound(std::string message);
ApiError Unauthorized(std::string message);
ApiError Overloaded(std::string message);
// 404 for a model name the server does not serve.
ApiError UnknownModel(const std::string& model);
// Maps a scheduler Status to the API error a client should see.
ApiError FromStatus(const absl::Status& status);

}  // namespace strata::api

#endif  // STRATA_SERVER_API_API_ERROR_H_
