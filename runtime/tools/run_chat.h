// minfer-run's conversation mode (-cnv): a chat in the terminal over one session; each turn renders the
// chat template and evaluates only the part of the rendering the KV cache does not hold yet.
#pragma once

#include <atomic>
#include <string>

#include "minfer/runtime.h"

namespace minfer::tools {

struct ChatOptions {
  std::string template_source;  // Jinja text (tokenizer.chat_template or --chat-template's file)
  std::string template_origin;  // names it in errors: "FILE" or "model.mfb: tokenizer.chat_template"
  std::string system_prompt;    // -sys; "" = no system message
  std::string first_user;       // -p / -f: the first user message; "" = read it from stdin
  bool escape = true;           // llama.cpp's --escape on each line read from stdin
  bool verbose = false;         // stderr, per turn: tokens kept, tokens fed and their text; the reply's tokens
  GenerateParams params;        // per reply; n_predict < 0: until end of generation or a full context
};

// Runs the conversation until EOF on stdin (llama-cli -cnv): a "> " prompt on stderr when stdin is a
// terminal, one user message per line, each reply printed to stdout and ended by a newline. Returns an
// error (nothing printed for it) when the template fails to parse or render, or the runtime fails; a
// full context ends the conversation with llama.cpp's warning and no error. `interrupted` (SIGINT)
// stops the reply being generated and ends the conversation; a read from stdin that a signal
// interrupts (a handler without SA_RESTART) ends it like EOF.
Status runChat(const Model& model, Session& session, const ChatOptions& options,
               const std::atomic<bool>& interrupted);

}  // namespace minfer::tools
