#include "tokenizer/bpe_model.h"

#include <bit>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace fern {
namespace {

// Raw bytes of a byte-level token text; false when a code point is outside the byte-level alphabet.
bool text_to_bytes(std::string_view text, std::string& out) {
  out.clear();
  auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    utf8::Seq q = utf8::next(p + i, n - i);
    if (q.status != utf8::SeqStatus::Valid) return false;
    const int b = byte_level::byte_of(q.cp);
    if (b < 0) return false;
    out.push_back(char(b));
    i += q.len;
  }
  return true;
}

}  // namespace

BpeModel::BpeModel(const TokenizerSpec& spec) : source_(spec.source), ignore_merges_(spec.ignore_merges) {
  const std::string where = spec.source + ": model";
  if (spec.vocab.empty()) fail("{}.vocab: empty", where);
  for (auto& [t, id] : spec.vocab) max_id_ = std::max(max_id_, id);
  // Ids may have gaps, but a few huge ids must not make us allocate a table of 16M entries.
  if (size_t(max_id_) >= 2 * spec.vocab.size() + 1024)
    fail("{}.vocab: ids up to {} for only {} tokens", where, max_id_, spec.vocab.size());
  id_bytes_.resize(size_t(max_id_) + 1);
  bytes_id_.reserve(spec.vocab.size());
  std::unordered_map<std::string_view, int32_t> text_id;
  text_id.reserve(spec.vocab.size());
  std::string raw;
  for (auto& [text, id] : spec.vocab) {
    // A token outside the byte-level alphabet can never come out of merging bytes; it keeps its text as bytes so
    // that decoding it still gives something readable.
    if (!text_to_bytes(text, raw)) raw = text;
    id_bytes_[size_t(id)] = raw;
    bytes_id_.emplace(raw, id);
    text_id.emplace(text, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, byte_level::kTables.byte_to_cp[size_t(b)]);
    auto it = text_id.find(s);
    if (it == text_id.end()) fail("{}.vocab: no token for byte 0x{:02X} (\"{}\")", where, b, s);
    byte_id_[size_t(b)] = it->second;
  }
  size_t cap = 16;
  while (cap < 2 * spec.merges.size() + 16) cap *= 2;
  keys_.assign(cap, kEmpty);
  vals_.resize(cap);
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  std::string joined;
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    auto& [a, b] = spec.merges[r];
    auto ia = text_id.find(a), ib = text_id.find(b);
    if (ia == text_id.end()) fail("{}.merges[{}]: token \"{}\" is not in the vocab", where, r, a);
    if (ib == text_id.end()) fail("{}.merges[{}]: token \"{}\" is not in the vocab", where, r, b);
    joined = a;
    joined += b;
    auto ij = text_id.find(joined);
    if (ij == text_id.end()) fail("{}.merges[{}]: merged token \"{}\" is not in the vocab", where, r, joined);
    // A repeated pair takes its last rank, as HF's merge map (built by inserting in order) does.
    put_merge(pair_key(ia->second, ib->second), MergeInfo{int32_t(r), ij->second});
  }
}

void BpeModel::put_merge(uint64_t key, MergeInfo v) {
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == key || keys_[i] == kEmpty) {
      keys_[i] = key;
      vals_[i] = v;
      return;
    }
  }
}

const std::string& BpeModel::bytes_of(int32_t id) const {
  static const std::string empty;
  return id >= 0 && id <= max_id_ ? id_bytes_[size_t(id)] : empty;
}

int32_t BpeModel::id_of_text(std::string_view text) const {
  std::string raw;
  if (!text_to_bytes(text, raw)) return -1;
  auto it = bytes_id_.find(raw);
  return it == bytes_id_.end() ? -1 : it->second;
}

// Repeatedly merges the lowest-ranked adjacent pair (leftmost on ties). Quadratic, but pieces are short.
void BpeModel::merge_small(std::vector<int32_t>& s) const {
  while (s.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const MergeInfo* m = find_merge(s[i], s[i + 1]);
      if (m && m->rank < best_rank) {
        best_rank = m->rank;
        best_id = m->id;
        best = i;
      }
    }
    if (best_id < 0) break;
    s[best] = best_id;
    s.erase(s.begin() + std::ptrdiff_t(best) + 1);
  }
}

// The same result for long pieces in O(n log n): a heap of candidate pairs over a linked list of symbols.
void BpeModel::merge_large(std::vector<int32_t>& s) const {
  const int32_t n = int32_t(s.size());
  std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[size_t(i)] = i - 1;
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    if (i < 0) return;
    const int32_t j = next[size_t(i)];
    if (j < 0) return;
    if (const MergeInfo* m = find_merge(s[size_t(i)], s[size_t(j)])) heap.push({m->rank, i, s[size_t(i)], s[size_t(j)]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    const size_t i = size_t(c.pos);
    if (!alive[i] || s[i] != c.left) continue;
    const int32_t j = next[i];
    if (j < 0 || s[size_t(j)] != c.right) continue;
    s[i] = find_merge(c.left, c.right)->id;
    alive[size_t(j)] = 0;
    next[i] = next[size_t(j)];
    if (next[i] >= 0) prev[size_t(next[i])] = int32_t(i);
    push(prev[i]);
    push(int32_t(i));
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[size_t(i)]) s[w++] = s[size_t(i)];
  s.resize(w);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_id_.find(std::string(piece));
    if (it != bytes_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  Shard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[std::hash<std::string_view>{}(piece) % kShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->map.find(std::string(piece));
    if (it != shard->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) syms[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  if (syms.size() <= 48)
    merge_small(syms);
  else
    merge_large(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->map.size() < kMaxCachedPerShard) shard->map.emplace(std::string(piece), std::move(syms));
  }
}

}  // namespace fern
