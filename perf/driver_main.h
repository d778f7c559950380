// RunPerfDriver: the main() every perf driver shares: `--help`, flag parsing (a bad flag
// prints the message and the usage and exits 2), the directory of the running binary as the
// default `bin` (where the other Baton binaries are), `--out` created and made absolute, then
// the driver's Run. `Flags` has std::string members `bin` and `out`; `parse` returns "" or
// the error; `run` returns the exit status. Used from main() only.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace baton::perf {

template <class Flags, class Parse, class Run>
int RunPerfDriver(int argc, char** argv, const char* name, const char* usage, Parse parse,
                  Run run) {
  Flags flags;
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (const std::string error = parse(argc, argv, &flags); !error.empty()) {
    std::fprintf(stderr, "%s: %s\n%s", name, error.c_str(), usage);
    return 2;
  }
  if (flags.bin.empty()) {
    flags.bin = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  }
  if (!flags.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flags.out, ec);
    flags.out = std::filesystem::absolute(flags.out).string();
  }
  return run(flags);
}

}  // namespace baton::perf
