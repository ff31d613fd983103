// Stop strings over streamed text. Text is released only when it can no longer be the start of a stop string, so
// a stop string split across tokens is still found and never shown to the client.
#pragma once
#include <string>
#include <vector>

namespace fern {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;    // safe to emit now
    bool stopped = false;  // a stop string was found; `text` ends just before it
  };
  // Appends generated text. After a stop, further pushes return nothing.
  Result push(const std::string& text);
  // End of generation: whatever is still held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  // After a stop: the stop string found (the first listed, where several end at the same place).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace fern
