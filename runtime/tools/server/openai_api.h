// minfer-server's OpenAI-compatible request and response bodies: /v1/completions and /v1/chat/completions.
//
// Requests are JSON objects (OpenAI's API reference, "Completions" and "Chat"); a field that is present
// with the wrong type or out of range is refused with a 4xx ApiError naming it in `param`. Unknown fields
// are ignored (clients send extras), except those whose meaning minfer cannot honour (n > 1, echo,
// logprobs, non-zero presence/frequency penalties), which are refused rather than silently dropped.
// Sampling fields and their defaults are llama-server's (temperature 0.8, top_k 40, top_p 0.95,
// min_p 0.05, repeat_penalty 1, repeat_last_n 64, seed random), as is ignore_eos.
// Responses follow OpenAI's shapes: text_completion / chat.completion objects with choices and usage,
// and, with "stream": true, server-sent events of chunks, the last one carrying finish_reason, then
// usage when stream_options.include_usage, then "data: [DONE]".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "minfer/chat_template.h"
#include "minfer/scheduler.h"

namespace minfer::server {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;                            // the request field at fault ("" → null)
  std::string type = "invalid_request_error";   // or authentication_error, not_found_error, server_error
  std::string code;                             // "" → null
};
std::string errorBody(const ApiError& error);

enum class Endpoint { kCompletions, kChat };

struct ApiLimits {
  int max_stop_strings = 16;
  int max_stop_length = 256;  // bytes
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // kCompletions: the prompt as text, or as token ids (prompt_is_ids).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  // kChat: the messages, content normalised to a string (text parts concatenated), other keys kept.
  chat::Value messages;
  RequestParams params;               // everything but the prompt
  std::optional<int> max_tokens;      // absent: until end of generation or a full context
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
};

// Arrays and objects nested deeper than this in a request body are refused (400).
constexpr int kMaxJsonDepth = 128;

// Parses a request body. `model_id`: the served model (a different "model" is refused, 404).
// Returns the error, or nothing with `out` filled.
std::optional<ApiError> parseRequest(std::string_view body, Endpoint endpoint, const std::string& model_id,
                                     const ApiLimits& limits, ParsedRequest& out);

// The fields every response and chunk carries.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The whole response of a request that was not streamed.
nlohmann::json completionResponse(const ResponseMeta& meta, const std::string& text, FinishReason reason,
                                  int prompt_tokens, int completion_tokens);
// One streamed chunk: `text` (chat: delta.content; with `first`, delta.role too), finish_reason when
// `reason` is set (null otherwise).
nlohmann::json streamChunk(const ResponseMeta& meta, std::string_view text, std::optional<FinishReason> reason,
                           bool first);
// The usage chunk of stream_options.include_usage: empty choices.
nlohmann::json usageChunk(const ResponseMeta& meta, int prompt_tokens, int completion_tokens);

}  // namespace minfer::server
