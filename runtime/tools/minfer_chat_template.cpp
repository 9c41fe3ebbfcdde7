// minfer-chat-template: renders a chat template (a GGUF tokenizer.chat_template, as a file) for a
// conversation, as transformers' apply_chat_template(messages, tokenize=False) does.
//
// MESSAGES.json is a JSON array of {"role", "content", ...} objects, or an object with "messages" and
// optionally "add_generation_prompt", "bos_token", "eos_token" and further variables (tools,
// documents, enable_thinking, ...). Flags override the file. The prompt goes to stdout byte for byte
// (no newline added); errors go to stderr with the template's line and column.
#include <fstream>
#include <sstream>
#include <string>

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"
#include "minfer/chat_template.h"
#include "minfer/version.h"
#include "runtime/util/terminal_text.h"

namespace {

llvm::cl::OptionCategory kCategory("minfer-chat-template options");
llvm::cl::opt<std::string> kTemplate(llvm::cl::Positional, llvm::cl::desc("<template.jinja>"), llvm::cl::Required,
                                     llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kMessages(llvm::cl::Positional, llvm::cl::desc("<messages.json>"), llvm::cl::Required,
                                     llvm::cl::cat(kCategory));
llvm::cl::opt<bool> kAddGenerationPrompt("add-generation-prompt",
                                         llvm::cl::desc("End with the assistant's turn header"),
                                         llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kBos("bos", llvm::cl::desc("bos_token text (default: the file's, else empty)"),
                                llvm::cl::value_desc("text"), llvm::cl::cat(kCategory));
llvm::cl::opt<std::string> kEos("eos", llvm::cl::desc("eos_token text (default: the file's, else empty)"),
                                llvm::cl::value_desc("text"), llvm::cl::cat(kCategory));

int fail(const std::string& message) {
  llvm::errs() << "minfer-chat-template: "
               << minfer::util::escapeForTerminal(message, std::string::npos, /*keep_newlines=*/true) << "\n";
  return 1;
}

bool readFile(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return static_cast<bool>(in) || in.eof();
}

}  // namespace

int main(int argc, char** argv) {
  llvm::cl::HideUnrelatedOptions(kCategory);
  llvm::cl::SetVersionPrinter(
      [](llvm::raw_ostream& os) { os << "minfer-chat-template (minfer) " << minfer::kVersion << "\n"; });
  llvm::cl::ParseCommandLineOptions(argc, argv, "minfer-chat-template: render a chat template for a conversation\n");

  std::string source, json;
  if (!readFile(kTemplate, source)) return fail(kTemplate + ": cannot read the template");
  if (!readFile(kMessages, json)) return fail(kMessages + ": cannot read the messages");
  auto tmpl = minfer::chat::ChatTemplate::parse(source);
  if (!tmpl) return fail(kTemplate + ": " + tmpl.status().message());
  auto doc = minfer::chat::Value::fromJson(json);
  if (!doc) return fail(kMessages + ": " + doc.status().message());

  minfer::chat::ChatInputs in;
  if (doc->isList()) {
    in.messages = *doc;
  } else if (doc->isDict() && doc->find("messages") && doc->find("messages")->isList()) {
    for (const auto& [key, value] : doc->asDict()) {
      if (key == "messages")
        in.messages = value;
      else if (key == "add_generation_prompt")
        in.add_generation_prompt = value.truthy();
      else if (key == "bos_token" && value.isString())
        in.bos_token = value.asString();
      else if (key == "eos_token" && value.isString())
        in.eos_token = value.asString();
      else
        in.extra.emplace_back(key, value);
    }
  } else {
    return fail(kMessages + ": expected a JSON array of messages or an object with a \"messages\" array");
  }
  if (kAddGenerationPrompt) in.add_generation_prompt = true;
  if (kBos.getNumOccurrences()) in.bos_token = kBos;
  if (kEos.getNumOccurrences()) in.eos_token = kEos;

  auto prompt = tmpl->render(in);
  if (!prompt) return fail(kTemplate + ": " + prompt.status().message());
  llvm::outs() << *prompt;
  return 0;
}
