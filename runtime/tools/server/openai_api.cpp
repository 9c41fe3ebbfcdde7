// minfer-server's OpenAI-compatible request parsing and response bodies (openai_api.h).
#include "runtime/tools/server/openai_api.h"

#include <cmath>
#include <random>

namespace minfer::server {

using nlohmann::json;

std::string errorBody(const ApiError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

ApiError badField(const std::string& field, const std::string& what) { return {400, field + ": " + what, field}; }

const char* typeName(const json& v) { return v.type_name(); }

// Optional number field in [lo, hi]; writes `out` when present.
std::optional<ApiError> number(const json& body, const char* field, double lo, double hi, float& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return badField(field, std::string("must be a number, not ") + typeName(*it));
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    return badField(field, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], not " + it->dump());
  out = static_cast<float>(v);
  return std::nullopt;
}

// Optional integer field in [lo, hi].
std::optional<ApiError> integer(const json& body, const char* field, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return badField(field, std::string("must be an integer, not ") + typeName(*it));
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : it->get<int64_t>();
  if (v < lo || v > hi) return badField(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " + it->dump());
  out = v;
  return std::nullopt;
}

std::optional<ApiError> boolean(const json& body, const char* field, bool& out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return badField(field, std::string("must be a boolean, not ") + typeName(*it));
  out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> parseStop(const json& body, const ApiLimits& limits, std::vector<std::string>& stop) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    stop = {it->get<std::string>()};
  } else if (it->is_array()) {
    if (it->size() > static_cast<size_t>(limits.max_stop_strings))
      return badField("stop", std::to_string(it->size()) + " strings, at most " + std::to_string(limits.max_stop_strings));
    for (const json& s : *it) {
      if (!s.is_string()) return badField("stop", std::string("must hold strings, not ") + typeName(s));
      stop.push_back(s.get<std::string>());
    }
  } else {
    return badField("stop", std::string("must be a string or an array of strings, not ") + typeName(*it));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) return badField("stop", "string " + std::to_string(i) + " is empty");
    if (stop[i].size() > static_cast<size_t>(limits.max_stop_length))
      return badField("stop", "string " + std::to_string(i) + " has " + std::to_string(stop[i].size()) +
                                  " bytes, at most " + std::to_string(limits.max_stop_length));
  }
  return std::nullopt;
}

// OpenAI fields minfer does not implement, refused rather than ignored when they would change the answer: a
// non-empty logit_bias, best_of other than 1, tools / functions and a tool_choice other than "none", a
// response_format other than text.
std::optional<ApiError> unsupportedFields(const json& body) {
  const auto given = [&](const char* field) -> const json* {
    auto it = body.find(field);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = given("logit_bias"); v && !(v->is_object() && v->empty()))
    return badField("logit_bias", "not supported");
  if (const json* v = given("best_of"); v && *v != 1) return badField("best_of", "not supported (only 1)");
  for (const char* field : {"tools", "functions"})
    if (const json* v = given(field); v && !(v->is_array() && v->empty()))
      return badField(field, "not supported: tool and function calls are not implemented");
  for (const char* field : {"tool_choice", "function_call"})
    if (const json* v = given(field); v && *v != "none")
      return badField(field, "not supported: tool and function calls are not implemented (only \"none\")");
  if (const json* v = given("response_format"); v && !(v->is_object() && v->value("type", json()) == "text"))
    return badField("response_format", "not supported (only {\"type\": \"text\"}): constrained output is not implemented");
  return std::nullopt;
}

// Fields both endpoints share: sampling, max_tokens, stop, stream.
std::optional<ApiError> parseCommon(const json& body, const ApiLimits& limits, ParsedRequest& out) {
  SamplerParams& s = out.params.sampling;
  s = SamplerParams{};  // llama-server's defaults (sampler.h)
  s.seed = std::random_device{}();
  if (auto e = number(body, "temperature", 0, 100, s.temperature)) return e;
  if (auto e = number(body, "top_p", 0, 1, s.top_p)) return e;
  if (auto e = number(body, "min_p", 0, 1, s.min_p)) return e;
  if (auto e = number(body, "repeat_penalty", 1e-6, 1e6, s.repeat_penalty)) return e;
  std::optional<int64_t> v;
  if (auto e = integer(body, "top_k", INT32_MIN, INT32_MAX, v)) return e;
  if (v) s.top_k = static_cast<int32_t>(*v);
  v.reset();
  if (auto e = integer(body, "repeat_last_n", 0, INT32_MAX, v)) return e;
  if (v) s.repeat_last_n = static_cast<int32_t>(*v);
  v.reset();
  if (auto e = integer(body, "seed", INT64_MIN, INT64_MAX, v)) return e;
  if (v && *v >= 0) s.seed = static_cast<uint64_t>(*v);  // negative: random, as llama-server's -1
  for (const char* field : {"presence_penalty", "frequency_penalty"}) {
    float p = 0;
    if (auto e = number(body, field, -2, 2, p)) return e;
    if (p != 0) return badField(field, "not supported (only 0); use repeat_penalty");
  }
  v.reset();  // choices per request: the type first, then the value minfer supports
  if (auto e = integer(body, "n", INT64_MIN, INT64_MAX, v)) return e;
  if (v && *v != 1)
    return badField("n", "is " + std::to_string(*v) + "; only n = 1 (one choice per request) is supported: n > 1 is not "
                         "implemented, send separate requests instead");

  // max_completion_tokens (OpenAI's newer name) wins over max_tokens, on both endpoints; each is checked.
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    v.reset();
    if (auto e = integer(body, field, INT64_MIN, INT64_MAX, v)) return e;
    if (v && *v <= 0) return badField(field, "must be ≥ 1, not " + std::to_string(*v));
    if (v) out.max_tokens = static_cast<int>(std::min<int64_t>(*v, INT32_MAX));
  }

  bool ignore_eos = false;  // llama-server's: generate through end-of-generation tokens
  if (auto e = boolean(body, "ignore_eos", ignore_eos)) return e;
  out.params.stop_at_eog = !ignore_eos;
  if (auto e = parseStop(body, limits, out.params.stop)) return e;
  if (auto e = boolean(body, "stream", out.stream)) return e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return badField("stream_options", std::string("must be an object, not ") + typeName(*it));
    if (auto e = boolean(*it, "include_usage", out.include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "stream_options." + e->message;
      return e;
    }
  }
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null() && *it != false)
    return badField("logprobs", "not supported");
  return unsupportedFields(body);
}

std::optional<ApiError> parsePrompt(const json& body, ParsedRequest& out) {
  auto it = body.find("prompt");
  if (it == body.end()) return badField("prompt", "missing");
  if (it->is_string()) {
    out.prompt_text = it->get<std::string>();
    return std::nullopt;
  }
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    out.prompt_text = (*it)[0].get<std::string>();
    return std::nullopt;
  }
  if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    for (const json& id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return badField("prompt", "token ids must be non-negative integers, not " + id.dump());
      out.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    out.prompt_is_ids = true;
    return std::nullopt;
  }
  return badField("prompt", std::string("must be a string, an array of one string or an array of token ids, not ") +
                                (it->is_array() ? "that array" : typeName(*it)));
}

std::optional<ApiError> parseMessages(const json& body, ParsedRequest& out) {
  auto it = body.find("messages");
  if (it == body.end()) return badField("messages", "missing");
  if (!it->is_array() || it->empty()) return badField("messages", "must be a non-empty array of message objects");
  json messages = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return badField(where, std::string("must be an object, not ") + typeName(m));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return badField(where + ".role", "must be a string");
    json copy = m;
    auto content = m.find("content");
    const bool assistant = *role == "assistant";
    if (content == m.end() || content->is_null()) {  // OpenAI: only an assistant message may leave it out
      if (!assistant) return badField(where + ".content", "missing (only an assistant message may omit it)");
      copy["content"] = "";
    } else if (content->is_array()) {  // content parts: the text ones, concatenated
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.find("type") == part.end() || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return badField(where + ".content", "only parts of type \"text\" with a string \"text\" are supported");
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (!content->is_string()) {
      return badField(where + ".content", std::string("must be a string or an array of text parts (or, in an assistant "
                                                      "message, null), not ") + typeName(*content));
    }
    messages.push_back(std::move(copy));
  }
  auto value = chat::Value::fromJson(messages.dump());
  if (!value) return badField("messages", value.status().message());
  out.messages = *value;
  return std::nullopt;
}

}  // namespace

namespace {

struct TooDeep {};

}  // namespace

std::optional<ApiError> parseRequest(std::string_view body, Endpoint endpoint, const std::string& model_id,
                                     const ApiLimits& limits, ParsedRequest& out) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return ApiError{400, "the request body is empty: send a JSON object (Content-Type: application/json)"};
  json j;
  try {
    // nlohmann's parser and destructor are iterative, but copying and dump() recurse once per level: a
    // 1 MB body of '[' would overflow the handler thread's stack there. Refused while parsing.
    j = json::parse(body, [](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
          depth >= kMaxJsonDepth)
        throw TooDeep{};
      return true;
    });
  } catch (const json::exception& e) {
    return ApiError{400, std::string("the body is not valid JSON: ") + e.what()};
  } catch (const TooDeep&) {
    return ApiError{400, "the body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
  }
  if (!j.is_object()) return ApiError{400, std::string("the body must be a JSON object, not ") + typeName(j)};
  out.endpoint = endpoint;
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return badField("model", std::string("must be a string, not ") + typeName(*it));
    if (it->get<std::string>() != model_id)
      return ApiError{404, "model: \"" + it->get<std::string>() + "\" does not exist; this server serves \"" + model_id + "\"",
                      "model", "invalid_request_error", "model_not_found"};
  }
  if (auto e = endpoint == Endpoint::kCompletions ? parsePrompt(j, out) : parseMessages(j, out)) return e;
  if (endpoint == Endpoint::kCompletions) {
    bool echo = false;
    if (auto e = boolean(j, "echo", echo)) return e;
    if (echo) return badField("echo", "not supported");
    if (auto it = j.find("suffix"); it != j.end() && !it->is_null()) return badField("suffix", "not supported");
  }
  return parseCommon(j, limits, out);
}

namespace {

json usageJson(int prompt_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json head(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

json completionResponse(const ResponseMeta& meta, const std::string& text, FinishReason reason, int prompt_tokens,
                        int completion_tokens) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json r = head(meta, chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", finishReasonName(reason)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  r["choices"] = json::array({choice});
  r["usage"] = usageJson(prompt_tokens, completion_tokens);
  return r;
}

json streamChunk(const ResponseMeta& meta, std::string_view text, std::optional<FinishReason> reason, bool first) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json r = head(meta, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", reason ? json(finishReasonName(*reason)) : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = std::string(text);
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
  }
  r["choices"] = json::array({choice});
  return r;
}

json usageChunk(const ResponseMeta& meta, int prompt_tokens, int completion_tokens) {
  json r = head(meta, meta.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  r["choices"] = json::array();
  r["usage"] = usageJson(prompt_tokens, completion_tokens);
  return r;
}

}  // namespace minfer::server
