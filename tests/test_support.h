// Helpers shared by the test suites: fixture location and the skip-or-fail rule for missing fixtures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace minfer::test {

// Directory of the shared fixtures (MINFER_FIXTURES, else ../shared/fixtures beside the checkout);
// empty when it does not exist.
std::string fixturesDir();

// True when fixtures are present. When absent: under CI (CI=true) the current test fails; elsewhere
// it prints a skip message and the caller returns early.
bool haveFixtures();

// Whole file as bytes; fails the current test (and returns empty) when it cannot be read.
std::vector<uint8_t> readFile(const std::string& path);
// Raw little-endian float32 file (goldens, dequant); fails the test on a size not divisible by 4.
std::vector<float> readF32File(const std::string& path);

// A directory for this test's scratch files (created; under TMPDIR or /tmp).
std::string scratchDir();

// kB from a "Key:   123 kB" line of /proc/self/status (VmRSS, VmHWM, …); -1 when absent.
long procStatusKb(const char* key);
// Resets the peak RSS (VmHWM) to the current RSS by writing 5 to /proc/self/clear_refs (Linux ≥ 4.0);
// false where not permitted. Peak growth of a region = VmHWM after it − VmRSS after this call.
bool resetPeakRss();

}  // namespace minfer::test
