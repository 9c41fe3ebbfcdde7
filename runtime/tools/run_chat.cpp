// minfer-run's conversation mode (-cnv): renders the chat template each turn, evaluates what is new.
//
// What the KV cache holds is kept as a list of segments, each a piece of rendered text and the number
// of tokens it was evaluated as: the text fed for a user turn, then the reply generated for it. A new
// turn renders the whole conversation (add_generation_prompt), keeps the leading segments that the
// rendering still starts with and feeds the rest. In the usual case every segment matches and what is
// fed is llama.cpp's common_chat_format_single suffix (the previous reply's end-of-turn text, the new
// user message, the assistant header). Where the template rewrites earlier turns (trims a reply, drops
// its reasoning), the cache is rewound to the last segment that still matches, so the model always
// sees what the template renders, where llama.cpp keeps the stale text.
#include "runtime/tools/run_chat.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/chat_template.h"
#include "runtime/util/terminal_text.h"

namespace minfer::tools {
namespace {

struct Segment {
  std::string text;  // rendered text (a user turn's feed, or a reply as it was printed)
  int n_tokens = 0;  // tokens it occupies in the KV cache
};

chat::Value message(const char* role, const std::string& content) {
  return chat::Value::dict({{"role", chat::Value(role)}, {"content", chat::Value(content)}});
}

// The next user line from stdin (without its newline; escapes processed); false at EOF. Empty lines
// are skipped (llama.cpp hands control back to the model on one; here there is nothing to continue).
bool readUserLine(bool escape, std::string& line) {
  const bool tty = isatty(STDIN_FILENO);
  for (;;) {
    if (tty) {
      std::fputs("> ", stderr);
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) {
      if (tty) std::fputs("\n", stderr);
      return false;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (escape) line = processEscapes(line);
    return true;
  }
}

// `text` for --verbose: control characters escaped (util::escapeForTerminal) and backslashes doubled
// first, so that a tab ("\t") and a backslash followed by "t" ("\\t") read apart.
std::string quoted(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c == '\\') s += '\\';
    s += c;
  }
  return util::escapeForTerminal(s, std::string::npos, /*keep_newlines=*/false);
}

// Keeps the leading segments `rendered` still starts with (rewinding the session past the others) and
// returns how many bytes of `rendered` they cover.
Result<size_t> keepMatchingPrefix(const std::string& rendered, std::vector<Segment>& fed, Session& session) {
  size_t bytes = 0;
  int tokens = 0;
  size_t k = 0;
  for (; k < fed.size(); ++k) {
    const std::string& text = fed[k].text;
    if (rendered.size() - bytes < text.size() || rendered.compare(bytes, text.size(), text) != 0) break;
    bytes += text.size();
    tokens += fed[k].n_tokens;
  }
  fed.resize(k);
  if (tokens < session.position()) MINFER_RETURN_IF_ERROR(session.rewind(tokens));
  return bytes;
}

}  // namespace

Status runChat(const Model& model, Session& session, const ChatOptions& options, const std::atomic<bool>& interrupted) {
  auto tmpl = chat::ChatTemplate::parse(options.template_source);
  if (!tmpl) return Status::error(options.template_origin + ": " + tmpl.status().message());
  const Tokenizer& tok = model.tokenizer();
  const Vocabulary& vocab = tok.vocabulary();
  chat::ChatInputs in;
  in.add_generation_prompt = true;
  in.bos_token = vocab.bos_id >= 0 ? tok.tokenToPiece(vocab.bos_id, /*render_special=*/true) : "";
  in.eos_token = vocab.eos_id >= 0 ? tok.tokenToPiece(vocab.eos_id, /*render_special=*/true) : "";
  if (!options.system_prompt.empty()) in.messages.push(message("system", options.system_prompt));

  std::vector<Segment> fed;  // what the KV cache holds, in order
  for (int turn = 1; !interrupted; ++turn) {
    std::string user = turn == 1 ? options.first_user : "";
    if (user.empty() && !readUserLine(options.escape, user)) break;
    in.messages.push(message("user", user));
    Result<std::string> rendered = tmpl->render(in);
    if (!rendered) return Status::error(options.template_origin + ": " + rendered.status().message());
    Result<size_t> kept = keepMatchingPrefix(*rendered, fed, session);
    if (!kept) return kept.takeStatus();
    const std::string delta = rendered->substr(*kept);

    // At position 0 the tokenizer adds BOS itself when the vocabulary says so: a BOS the template
    // rendered is dropped then (llama.cpp's common_chat_templates_apply does the same).
    GenerateParams params = options.params;
    params.add_special = session.position() == 0;
    params.parse_special = true;  // the template's control-token texts are those tokens
    std::string_view text = delta;
    if (params.add_special && vocab.add_bos && !in.bos_token.empty() && text.starts_with(in.bos_token))
      text.remove_prefix(in.bos_token.size());
    auto ids = model.tokenize(text, params.add_special, params.parse_special);
    if (!ids) return ids.takeStatus();
    if (ids->empty())
      return Status::error(options.template_origin + ": the chat template rendered nothing new for turn " +
                           std::to_string(turn));
    if (session.position() + static_cast<int64_t>(ids->size()) >= session.contextLength()) {
      llvm::errs() << "minfer-run: context full and context shift is disabled => stopping\n";
      return Status::ok();
    }
    if (options.verbose)
      llvm::errs() << llvm::formatv("minfer-run: turn {0}: {1} tokens kept in the KV cache, {2} fed: \"{3}\"\n", turn,
                                    session.position(), ids->size(),
                                    quoted(text));

    std::string reply;
    auto result = session.generate(text, params, [&](std::string_view piece, int32_t) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      reply += piece;
      return !interrupted.load();
    });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (!result) return result.takeStatus();
    if (options.verbose)
      llvm::errs() << llvm::formatv("minfer-run: turn {0}: reply of {1} tokens, stop: {2}\n", turn, result->n_generated,
                                    stopReasonName(result->stop));
    fed.push_back({delta, result->n_prompt});
    // The last token sampled is not evaluated when generation stopped without an end-of-generation
    // token; evaluate it, so that the cache holds the whole reply.
    int n_reply = result->n_generated;
    if (result->stop != StopReason::kEndOfGeneration && n_reply > 0) {
      if (session.position() >= session.contextLength()) {
        llvm::errs() << "minfer-run: context full and context shift is disabled => stopping\n";
        return Status::ok();
      }
      MINFER_RETURN_IF_ERROR(session.decode(result->tokens.back()));
    }
    fed.push_back({reply, n_reply});
    in.messages.push(message("assistant", reply));
  }
  return Status::ok();
}

}  // namespace minfer::tools
