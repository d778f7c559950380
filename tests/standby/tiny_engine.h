// TinyEngine: a standalone baton-refengine on a generated tiny model, in a fresh temporary
// directory, for a test suite that needs a real engine to talk to. Create it in
// SetUpTestSuite and delete it in TearDownTestSuite: the destructor stops the engine
// (expecting exit status 0, with its log on failure) and removes the directory.
// Header-only test support; used from the test's main thread.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "standby/mkmodel/model_presets.h"
#include "standby/mkmodel/model_writer.h"
#include "tests/standby/refengine_testutil.h"

namespace baton {

class TinyEngine {
 public:
  // `tag` names the directory; `args` are added to the engine's command line.
  explicit TinyEngine(const std::string& tag, std::vector<std::string> args = {},
                      ModelSpec spec = PresetSpec("tiny")) {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    dir_ = ::mkdtemp(pattern.data());
    Result<ModelSummary> written = WriteModel(spec, dir_ + "/model");
    EXPECT_TRUE(written.ok()) << written.status().ToString();
    std::vector<std::string> argv = {"--model", dir_ + "/model", "--served-model-name", "tiny"};
    argv.insert(argv.end(), args.begin(), args.end());
    process_ = std::make_unique<EngineProcess>(dir_, argv);
  }
  ~TinyEngine() {
    EXPECT_EQ(process_->Stop(), 0) << process_->log();
    process_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TinyEngine(const TinyEngine&) = delete;
  TinyEngine& operator=(const TinyEngine&) = delete;

  uint16_t port() const { return process_->port(); }
  std::string log() const { return process_->log(); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::unique_ptr<EngineProcess> process_;
};

}  // namespace baton
