// Signal handlers that remove temporary output files, installed the POSIX way: a signal that was
// ignored when the process started stays ignored.
//
// LLVM's llvm::sys::RemoveFileOnSignal installs handlers for SIGHUP, SIGINT, SIGTERM and SIGUSR2 (and
// the crash signals) that unlink the registered files and re-raise. A shell starts a background job
// (`minfer-compile … &` in a script) with SIGINT ignored; installing a handler there anyway means a
// Ctrl-C meant for the foreground deletes the job's temporary file and its final rename fails. POSIX
// (and GNU's coding standards) say: a signal ignored at start is not given a handler.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <iterator>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Signals.h"

namespace minfer::artifact {

// Interrupt signals LLVM's remove-on-signal handler takes over (llvm/lib/Support/Unix/Signals.inc).
inline constexpr int kTempFileInterruptSignals[] = {SIGHUP, SIGINT, SIGTERM, SIGUSR2};

// Which of kTempFileInterruptSignals were SIG_IGN on the first call (bit i for signal i). Tools call
// armTempFileSignals() first thing in main, so the first call sees the dispositions the process
// started with.
inline unsigned ignoredAtStart() {
  static const unsigned mask = [] {
    unsigned m = 0;
    for (unsigned i = 0; i < std::size(kTempFileInterruptSignals); ++i) {
      struct sigaction old {};
      if (::sigaction(kTempFileInterruptSignals[i], nullptr, &old) == 0 && old.sa_handler == SIG_IGN) m |= 1u << i;
    }
    return m;
  }();
  return mask;
}

// Installs LLVM's remove-on-signal handlers now (RemoveFileOnSignal would on its first use; this
// registers and unregisters an empty name), then puts SIG_IGN back on every signal that was ignored
// at start, before any temporary file exists. LLVM registers its handlers once per process, so later
// RemoveFileOnSignal calls leave the restored SIG_IGN alone. Idempotent; call before creating
// temporary files (ArtifactWriter::create does, and so do the tools, first thing in main).
inline void armTempFileSignals() {
  const unsigned ignored = ignoredAtStart();
  llvm::sys::RemoveFileOnSignal("");
  llvm::sys::DontRemoveFileOnSignal("");
  for (unsigned i = 0; i < std::size(kTempFileInterruptSignals); ++i)
    if (ignored & (1u << i)) ::signal(kTempFileInterruptSignals[i], SIG_IGN);
}

// Holds kTempFileInterruptSignals back on this thread for its lifetime (pthread_sigmask), so a
// temporary file can be created and registered with RemoveFileOnSignal as one step: a signal between
// the two would leave the file behind. A blocked signal is delivered when the mask is restored.
class TempFileSignalBlock {
 public:
  TempFileSignalBlock() {
    sigset_t block;
    sigemptyset(&block);
    for (const int sig : kTempFileInterruptSignals) sigaddset(&block, sig);
    ::pthread_sigmask(SIG_BLOCK, &block, &old_);
  }
  ~TempFileSignalBlock() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  TempFileSignalBlock(const TempFileSignalBlock&) = delete;
  TempFileSignalBlock& operator=(const TempFileSignalBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace minfer::artifact
