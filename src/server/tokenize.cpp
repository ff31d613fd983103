// POST /tokenize and /detokenize (also under /v1): the token ids the model would see for a prompt or a chat, and
// the text of token ids, in vLLM's shape (`prompt` or `messages` in, `count` / `max_model_len` / `tokens` out;
// `tokens` in, `prompt` out). llama.cpp's `content` is accepted for `prompt`. Clients use them to count and budget
// context before sending a request.
#include "server/server_impl.h"

namespace fern::server {

using nlohmann::json;

void Server::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res, bool detokenize) {
  try {
    nlohmann::ordered_json j = parse_json_object(req.body, limits);
    const Tokenizer& tok = *rt.tokenizer;
    if (detokenize) {
      if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad_request("'tokens' must be a list of ids", "tokens");
      std::vector<int32_t> ids;
      for (const auto& t : j["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= rt.engine->config().vocab_size)
          throw bad_request("'tokens' must be ids of the model's vocabulary", "tokens");
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      send_json(res, 200, {{"prompt", tok.decode(ids)}});
      metrics.request_done(200);
      return;
    }
    const bool chat = j.contains("messages");
    if (!chat && j.contains("content") && !j.contains("prompt")) j["prompt"] = j["content"];
    if (!chat && !j.contains("prompt")) throw bad_request("send 'prompt' (text or ids) or 'messages'", "prompt");
    j.erase("model");  // any name: the one served model's tokenizer answers
    const std::string body = j.dump();
    const Prepared p = prepare(parse_request(body, chat, limits), body, chat);
    send_json(res, 200,
              {{"count", int64_t(p.gen.prompt.size())},
               {"max_model_len", rt.engine->max_context()},
               {"tokens", p.gen.prompt}});
    metrics.request_done(200);
  } catch (...) {
    answer_exception(res);
  }
}

}  // namespace fern::server
