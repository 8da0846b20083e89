#pragma once
// Temporary folders that an interrupted run (Ctrl-C, SIGTERM, SIGHUP) still removes. A signal
// handler could not walk and delete a folder safely, so `gmjit` blocks those signals in every
// thread and one thread waits for them: it removes the registered folders, then lets the signal
// end the process as it would have (exit status 128 + signal).
#include <filesystem>

namespace gmjit::bench {

// Call first in main, before any thread starts (threads inherit the blocked signals). Child
// processes inherit them too: a gmjit child handles them the same way, and other programs are
// started with them unblocked (plot.cpp).
void remove_folders_on_interrupt();

// The folders removed on an interrupt (TempDir registers its own; harmless when
// remove_folders_on_interrupt was never called, as in the tests).
void add_interrupt_folder(const std::filesystem::path& folder);
void remove_interrupt_folder(const std::filesystem::path& folder);

}  // namespace gmjit::bench
